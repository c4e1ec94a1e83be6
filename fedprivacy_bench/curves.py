"""The benchmark page's comparisons beyond the accuracy-against-ε curves: membership inference
against ε, distributed against central DP, fedprivacy against Flower's own strategies.

The curves themselves (points pooled over seeds, their plot and table) are
:mod:`fedprivacy.sweep.curves`, the code a sweep renders with too; they are re-exported here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedprivacy.sweep.curves import (
    _f,
    _ok,
    adjacency,
    curve_framework,
    curve_points,
    curves_markdown,
    headline_setups,
    is_curve_row,
    plot_curves,
)

__all__ = ["adjacency", "curve_points", "plot_curves", "headline_setups", "curves_markdown", "is_curve_row",
           "plot_membership", "plot_membership_tradeoff", "membership_tested_markdown",
           "membership_markdown", "membership_experiments", "experiment_title", "distributed_pairs",
           "distributed_markdown", "distributed_goal", "curve_framework", "flower_comparisons",
           "flower_markdown"]

Row = Mapping[str, Any]


# ------------------------------------------------------------------------- membership against epsilon
def _experiment_key(summary: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes two settings points of one curve: the pool, K and the recipe, ε aside."""
    config = {k: v for k, v in (summary.get("config") or {}).items() if k != "target_epsilon"}
    return (summary.get("clients"), summary.get("per_client"), summary.get("models"),
            summary.get("sample_rate"), summary.get("rounds"), tuple(sorted(config.items())))


def membership_experiments(settings: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """``scripts/user_membership.py`` settings grouped into experiments (same candidate pool, K and
    training recipe; only ε differs), in order of first appearance: one curve, table and verdict each."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for s in settings:
        groups.setdefault(_experiment_key(s["summary"]), []).append(s)
    return list(groups.values())


def experiment_title(settings: Sequence[Mapping[str, Any]]) -> str:
    """One line naming an experiment's pool and recipe."""
    m = settings[0]["summary"]
    c = m.get("config") or {}
    width = f"-{c['hidden_units']}" if c.get("hidden_units") else ""
    return (f"{m['clients']} candidate clients x {m['per_client']} Fashion-MNIST images, K={m['models']} "
            f"models each on a random half (q={m['sample_rate']:g}, T={m['rounds']}, "
            f"{c.get('local_epochs', '?')} local epochs, {c.get('model', '?')}{width})")


def _attack(rows: Sequence[Row], *, attack: str, level: str) -> Row | None:
    return next((r for r in rows if r["attack"] == attack and r["level"] == level), None)


def _mia_x(settings: Sequence[Mapping[str, Any]]) -> tuple[list[float], float | None]:
    """x positions: each setting's epsilon; the non-DP setting sits right of the largest one."""
    eps = [s["summary"]["epsilon"] for s in settings if s["summary"]["epsilon"] is not None]
    inf_x = max(eps) * 4 if eps else 1.0
    xs = [inf_x if s["summary"]["epsilon"] is None else s["summary"]["epsilon"] for s in settings]
    return xs, (inf_x if any(s["summary"]["epsilon"] is None for s in settings) else None)


def plot_membership(settings: Sequence[Mapping[str, Any]], path: Path) -> Path | None:
    """Attack success and utility against epsilon in one figure (``scripts/user_membership.py`` output).

    Left: AUC of every attack at user level (solid) and example level (dashed), chance at 0.5.
    Middle: TPR at 1% FPR (user and example level), chance at 0.01. Right: the attacked models' test
    accuracy (mean, min-max band over the K models). The non-DP setting is drawn at the far right
    ("no DP").
    """
    if not settings:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = sorted(settings, key=lambda s: (s["summary"]["epsilon"] is None,
                                            s["summary"]["epsilon"] or 0.0))
    xs, inf_x = _mia_x(order)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
    attacks = sorted({r["attack"] for s in order for r in s["rows"]})
    for metric, ax, chance in (("auc", axes[0], 0.5), ("tpr_at_fpr_1pct", axes[1], 0.01)):
        for i, attack in enumerate(attacks):
            for level, ls in (("user", "-"), ("example", "--")):
                ys = [(_attack(s["rows"], attack=attack, level=level) or {}).get(metric) for s in order]
                ax.plot(xs, [float("nan") if y is None else y for y in ys], ls=ls, marker="o",
                        color=f"C{i}", label=f"{attack}, {level} level")
        ax.axhline(chance, color="black", lw=0.8, ls=":", label="chance")
        ax.set_ylabel({"auc": "attack AUC", "tpr_at_fpr_1pct": "TPR at 1% FPR"}[metric])
    acc = [s["summary"]["test_accuracy"] for s in order]
    axes[2].plot(xs, acc, marker="o", color="tab:green", label="test accuracy (mean of K models)")
    axes[2].fill_between(xs, [s["summary"]["test_accuracy_min"] for s in order],
                         [s["summary"]["test_accuracy_max"] for s in order], color="tab:green", alpha=0.2)
    axes[2].axhline(0.1, color="black", lw=0.8, ls=":", label="chance (10 classes)")
    axes[2].set_ylabel("test accuracy (10,000 test images)")
    first = order[0]["summary"]
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel(f"ε (δ = {first.get('delta') or 1e-5:g}; rightmost point: no DP)")
        if inf_x is not None:
            ticks = [x for x in xs if x != inf_x]
            ax.set_xticks(ticks + [inf_x], [f"{t:.3g}" for t in ticks] + ["no DP"])
            ax.set_xticks([], minor=True)
        ax.legend(fontsize=7)
    fig.suptitle(f"User-level membership inference vs ε: {experiment_title(order)}", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def membership_markdown(settings: Sequence[Mapping[str, Any]]) -> str:
    """One line per (setting, attack, level): ε, σ, accuracy, AUC, TPR at 1% and 0.1% FPR, pairs."""
    if not settings:
        return ""
    lines = ["| ε (δ) | σ | q | T | test acc (min–max) | attack | level | AUC | TPR@1% FPR | "
             "TPR@0.1% FPR | members / non-members | FPR resolution |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in sorted(settings, key=lambda s: (s["summary"]["epsilon"] is None,
                                              s["summary"]["epsilon"] or 0.0)):
        m = s["summary"]
        eps = "no DP" if m["epsilon"] is None else f"{m['epsilon']:.3g} ({m['delta']:g})"
        sigma = "–" if m["epsilon"] is None else f"{m['noise_multiplier']:.3f}"
        for r in sorted(s["rows"], key=lambda r: (r["level"] != "user", r["attack"])):
            low = " (at FPR 0)" if r["fpr_resolution"] > 0.001 else ""
            lines.append(
                f"| {eps} | {sigma} | {m['sample_rate']:g} | {m['rounds']} | {m['test_accuracy']:.3f} "
                f"({m['test_accuracy_min']:.3f}–{m['test_accuracy_max']:.3f}) | {r['attack']} | "
                f"{r['level']} | {r['auc']:.3f} | {r['tpr_at_fpr_1pct']:.3f} | "
                f"{r['tpr_at_fpr_01pct']:.3f}{low} | {r['members']} / {r['nonmembers']} | "
                f"{r['fpr_resolution']:.2g} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ the Fashion-MNIST goals
def _iid_none(points: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [p for p in points if p["mode"] == "none" and "iid" in str(p["label"])]


def _chance_tpr(row: Mapping[str, Any], *, fpr: float = 0.01) -> bool:
    """TPR at ``fpr`` within 3 standard errors of ``fpr``, the value of an attack that knows nothing.

    Under the null (member and non-member scores from one distribution) the empirical TPR at the
    empirical ``fpr`` threshold varies with both samples: se = sqrt(fpr (1 - fpr) (1/members +
    1/non-members)).
    """
    members, nonmembers = max(int(row.get("members") or 0), 1), max(int(row.get("nonmembers") or 0), 1)
    se = (fpr * (1 - fpr) * (1 / members + 1 / nonmembers)) ** 0.5
    return float(row["tpr_at_fpr_1pct"]) <= fpr + 3 * se


def curve_goals(points: Sequence[Mapping[str, Any]],
                membership: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, str]]:
    """The goals against what ran: each entry ``goal``, ``verdict`` (met / missed / not
    measured) and ``figures`` (the numbers and the setup they come from)."""
    return [_accuracy_goal(points), _central_goal(points), _membership_goal(membership)]


def _accuracy_goal(points: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The non-DP accuracy goal on the IID setups."""
    goals: list[dict[str, str]] = []
    goal = "Non-DP CNN on Fashion-MNIST (IID) reaches ≥ 88% test accuracy, federated"
    none = _iid_none(points)
    if none:
        # the point that meets the goal on the most seeds (then the highest); else the highest
        best = max(none, key=lambda p: (p["accuracy"] >= 0.88, len(p["seeds"]), p["accuracy"]))
        goals.append({"goal": goal, "verdict": "met" if best["accuracy"] >= 0.88 else "missed",
                      "figures": f"{best['accuracy']:.3f} (mean of seeds {best['seeds']}, "
                                 f"{best['accuracy_min']:.3f}–{best['accuracy_max']:.3f}) after "
                                 f"T={best['rounds']} rounds, N={best['num_clients']}, "
                                 f"{best['clients_per_round']}/round"})
    else:
        goals.append({"goal": goal, "verdict": "not measured", "figures": "no non-DP IID point"})
    return goals[0]


def _central_goal(points: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Central DP at ε = 4 against non-DP on the same setup."""
    goals: list[dict[str, str]] = []
    goal = "Central DP at ε = 4 within 5 points of non-DP on the same setup"
    pairs = []
    for p in points:
        if p["mode"] == "central" and p["framework"] == "fedprivacy" and p["target_epsilon"] == 4.0:
            ref = next((r for r in points if r["mode"] == "none" and r["label"] == p["label"]
                        and r["rounds"] == p["rounds"] and r["framework"] == p["framework"]), None)
            if ref is not None:
                pairs.append((p, ref))
    if pairs:
        figs = "; ".join(f"{p['label']}, T={p['rounds']}: {p['accuracy']:.3f} vs {r['accuracy']:.3f} "
                         f"({100 * (p['accuracy'] - r['accuracy']):+.1f} points; ε={p['epsilon']:.2f}, "
                         f"σ={p['noise_multiplier']:.3f}, q={p['sample_rate']:.3g}, seeds {p['seeds']})"
                         for p, r in pairs)
        # judged on the IID setups (the first goal's); a non-IID pair is reported beside it
        iid = [(p, r) for p, r in pairs if "iid" in str(p["label"])]
        within = [p["accuracy"] - r["accuracy"] >= -0.05 - 1e-9 for p, r in pairs]  # 5 points is within
        ok = bool(iid) and all(w for w, (p, _) in zip(within, pairs, strict=True) if "iid" in str(p["label"]))
        verdict = "met" if ok else ("missed" if iid else "not measured")
        if len(iid) < len(pairs):
            figs += " (judged on the IID setups; the others are reported, not judged)"
            if ok and not all(within):  # say so in the verdict, not only in the figures
                verdict = "met (IID); missed (non-IID)"
        goals.append({"goal": goal, "verdict": verdict, "figures": figs})
    else:
        goals.append({"goal": goal, "verdict": "not measured", "figures": "no ε = 4 / non-DP pair"})
    return goals[0]


def _membership_goal(membership: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Membership inference with and without DP."""
    goals: list[dict[str, str]] = []
    goal = ("Membership inference: clearly succeeds without DP (TPR at 1% FPR well above 1%) and falls "
            "to chance with DP on models that are still useful")

    def strongest(s: Mapping[str, Any]) -> Mapping[str, Any]:  # the strongest user-level attack
        return max((r for r in s["rows"] if r["level"] == "user"),
                   key=lambda r: (r["tpr_at_fpr_1pct"], r["auc"]))

    judged = []
    for experiment in membership_experiments(membership):
        nodp = [s for s in experiment if s["summary"]["epsilon"] is None]
        dp = [s for s in experiment if s["summary"]["epsilon"] is not None]
        if not (nodp and dp):
            continue
        b0 = strongest(nodp[0])
        succeeds = b0["tpr_at_fpr_1pct"] > 0.05
        dp_figs = []
        chance_useful = False
        for s in sorted(dp, key=lambda s: s["summary"]["epsilon"]):
            b = strongest(s)
            m = s["summary"]
            top_auc = max(r["auc"] for r in s["rows"] if r["level"] == "user")
            useful_chance = (top_auc < 0.6 and m["test_accuracy"] >= 0.5
                             and all(_chance_tpr(r) for r in s["rows"] if r["level"] == "user"))
            chance_useful |= useful_chance
            dp_figs.append(f"ε={m['epsilon']:.3g} (σ={m['noise_multiplier']:.3f}): strongest user-level "
                           f"attack {b['attack']} AUC {b['auc']:.3f}, TPR@1% {b['tpr_at_fpr_1pct']:.3f}, "
                           f"highest user-level AUC {top_auc:.3f}, test acc {m['test_accuracy']:.3f}"
                           + (" [chance, useful]" if useful_chance else ""))
        judged.append((succeeds and chance_useful,
                       f"{experiment_title(experiment)}: no DP: user-level {b0['attack']} AUC "
                       f"{b0['auc']:.3f}, TPR@1% {b0['tpr_at_fpr_1pct']:.3f}, test acc "
                       f"{nodp[0]['summary']['test_accuracy']:.3f}; " + "; ".join(dp_figs)))
    if judged:
        goals.append({"goal": goal, "verdict": "met" if any(ok for ok, _ in judged) else "missed",
                      "figures": " — ".join(f"[{'met' if ok else 'missed'}] {text}" for ok, text in judged)
                                 + " (\"chance on a useful model\" read as every user-level attack at AUC "
                                   "< 0.6 and TPR at 1% FPR within 3 standard errors of 0.01 (member and "
                                   "non-member pairs both sampled), at test accuracy ≥ 0.5; \"clearly "
                                   "succeeds\" as TPR at 1% FPR > 0.05; met if one experiment has both)"})
    else:
        goals.append({"goal": goal, "verdict": "not measured",
                      "figures": "no membership run with and without DP"})
    return goals[0]


# ------------------------------------------------------- distributed against central, same σ
def _pair_key(row: Row) -> str:
    """Everything of a run but its mode: two rows with equal keys ran the same σ, sampling and seed."""
    import json

    spec = dict(row.get("spec") or {k: row.get(k) for k in (
        "dataset", "label", "num_clients", "clients_per_round", "rounds", "noise_multiplier",
        "target_epsilon", "seed", "params")})
    spec.pop("mode", None)
    return json.dumps(spec, sort_keys=True, default=str)


def distributed_pairs(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Distributed rows with the central row of the same spec (σ, q, T, seed, all else), grouped over
    seeds: per group the per-seed accuracies, their difference in points (distributed − central),
    central's ε (its PLD, Poisson) and the distributed run's ε per audience as it reported them."""
    central = {_pair_key(r): r for r in rows
               if r.get("framework") == "fedprivacy" and r.get("mode") == "central" and _ok(r)}
    groups: dict[tuple[Any, ...], list[tuple[Row, Row]]] = defaultdict(list)
    for d in rows:
        if d.get("framework") != "fedprivacy" or d.get("mode") != "distributed" or not _ok(d):
            continue
        c = central.get(_pair_key(d))
        if c is not None:
            recorded = (d.get("epsilon_audiences") or {}).get("observers") is not None
            groups[(d.get("dataset"), d.get("label", ""), int(d.get("rounds", 0)))
                   + (d.get("noise_multiplier"), d.get("target_epsilon"), not recorded)].append((d, c))
    out = []
    for (dataset, label, rounds, sigma, target, _older), pairs in sorted(
            groups.items(), key=lambda kv: tuple(str(v) for v in kv[0])):
        pairs.sort(key=lambda p: int(p[0].get("seed", 0)))
        diffs = [100 * (float(d["test_accuracy"]) - float(c["test_accuracy"])) for d, c in pairs]

        def mean(xs: Sequence[float | None]) -> float | None:
            vals = [float(x) for x in xs if x is not None]
            return sum(vals) / len(vals) if vals else None

        aud = [d.get("epsilon_audiences") or {} for d, _ in pairs]
        first = pairs[0][0]
        out.append({
            "dataset": dataset, "label": label, "rounds": rounds, "noise_multiplier": sigma,
            "target_epsilon": target,
            "sample_rate": first.get("sample_rate") or (
                float(first["clients_per_round"]) / float(first["num_clients"])
                if first.get("clients_per_round") and first.get("num_clients") else None),
            "delta": first.get("delta"), "num_clients": first.get("num_clients"),
            "clients_per_round": first.get("clients_per_round"),
            "seeds": [int(d.get("seed", 0)) for d, _ in pairs],
            "central_accuracy": [float(c["test_accuracy"]) for _, c in pairs],
            "distributed_accuracy": [float(d["test_accuracy"]) for d, _ in pairs],
            "points": diffs, "mean_points": sum(diffs) / len(diffs),
            "central_epsilon": mean([c.get("epsilon") for _, c in pairs]),
            "distributed_epsilon": mean([d.get("epsilon") for d, _ in pairs]),
            "epsilon_server": mean([a.get("server") for a in aud]),
            "epsilon_observers": mean([a.get("observers") for a in aud]),
            "central_epsilon_no_sampling": mean([a.get("central_same_sigma_no_sampling") for a in aud]),
            "noise": next((a["noise"] for a in aud if a.get("noise")), ""),
            # every distributed row says what its run reported (this code); an older saved row
            # without it ran an earlier noise scheme and accountant: shown, not judged
            "recorded": all(a.get("observers") is not None for a in aud),
            "wall_seconds": [(float(d.get("wall_seconds") or 0), float(c.get("wall_seconds") or 0))
                             for d, c in pairs],
        })
    return out


def _rel(a: float | None, b: float | None) -> str:
    return "–" if a is None or not b else f"{100 * (a / b - 1):+.1f}%"


def _per_seed(acc: Sequence[float]) -> str:
    """Accuracy per seed, then (several seeds) their mean and min–max: ``a / b / c → m (lo–hi)``."""
    cell = " / ".join(f"{a:.3f}" for a in acc)
    if len(acc) > 1:
        cell += f" → {sum(acc) / len(acc):.4f} ({min(acc):.3f}–{max(acc):.3f})"
    return cell


def distributed_markdown(pairs: Sequence[Mapping[str, Any]]) -> str:
    """One line per (setup, σ): accuracy per seed (with several seeds their mean and min–max), the
    difference, and both audiences' ε beside central's."""
    if not pairs:
        return ""
    lines = ["| setup | σ | q | T | seeds | central acc | distributed acc | Δ points (mean; per seed) | "
             "central ε (PLD, Poisson) | distributed ε observers (vs central) | distributed ε server "
             "(vs central PLD without sampling) | δ |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in pairs:
        if p["recorded"]:
            eps = (f"{_f(p['epsilon_observers'], 4)} ({_rel(p['epsilon_observers'], p['central_epsilon'])}) | "
                   f"{_f(p['epsilon_server'], 4)} ({_rel(p['epsilon_server'], p['central_epsilon_no_sampling'])}"
                   f" vs {_f(p['central_epsilon_no_sampling'], 4)})")
        else:
            eps = (f"not recorded (an older saved run, not judged) | {_f(p['distributed_epsilon'], 4)} "
                   "(its own accountant)")
        lines.append(
            f"| {p['label']} | {p['noise_multiplier']:.4f} | {_f(p['sample_rate'], 3)} | {p['rounds']} | "
            f"{','.join(map(str, p['seeds']))} | "
            f"{_per_seed(p['central_accuracy'])} | {_per_seed(p['distributed_accuracy'])} | "
            f"{p['mean_points']:+.2f}; {' / '.join(f'{x:+.1f}' for x in p['points'])} | "
            f"{_f(p['central_epsilon'], 4)} | {eps} | {_f(p['delta'])} |")
    return "\n".join(lines)


def distributed_goal(pairs: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The utility goal: distributed accuracy within 1 point of central at the same σ and
    sampling, on the benchmark setups, several seeds (met: every setup's mean difference ≥ −1 point;
    a setup with one seed is named as such: no spread)."""
    goal = ("Distributed accuracy within 1 point of central at the same σ and sampling "
            "(several seeds)")
    older = [p for p in pairs if not p["recorded"]]
    pairs = [p for p in pairs if p["recorded"]]
    left_out = (f" (not judged: {len(older)} older saved pair{'s' if len(older) > 1 else ''} whose "
                "distributed run recorded no audiences (an earlier version of the code): "
                + "; ".join(f"{p['label']}, T={p['rounds']}: {p['mean_points']:+.1f} points"
                            for p in older) + ")") if older else ""
    if not pairs:
        return {"goal": goal, "verdict": "not measured",
                "figures": "no distributed/central pair from this code" + left_out}
    ok = all(p["mean_points"] >= -1.0 - 1e-9 for p in pairs)
    several = all(len(p["seeds"]) >= 2 for p in pairs)
    figs = "; ".join(
        f"{p['label']}, T={p['rounds']}, σ={p['noise_multiplier']:.3f}, q={p['sample_rate']:.3g}: "
        f"{p['mean_points']:+.2f} points over seed{'s' if len(p['seeds']) > 1 else ''} "
        f"{','.join(map(str, p['seeds']))} (per seed {', '.join(f'{x:+.1f}' for x in p['points'])})"
        for p in pairs)
    if not several:
        figs += " (a setup with one seed has no spread)"
    figs += left_out
    return {"goal": goal, "verdict": "met" if ok else "missed", "figures": figs}


# ------------------------------------------------------------- the utility-privacy trade-off, one figure
_FPRS = (("auc", "auc", 0.5, "attack AUC"), ("tpr_at_fpr_0.01", "0.01", 0.01, "TPR at 1% FPR"),
         ("tpr_at_fpr_0.001", "0.001", 0.001, "TPR at 0.1% FPR"))
_ALIAS = {"tpr_at_fpr_0.01": "tpr_at_fpr_1pct", "tpr_at_fpr_0.001": "tpr_at_fpr_01pct"}  # rows without statistics


def _ceiling(summary: Mapping[str, Any], key: str) -> float:
    """The DP ceiling of one figure (``"auc"`` or an FPR as text), NaN without DP (no bound below 1)."""
    c = summary.get("dp_ceiling")
    if not c:
        return float("nan")
    return float(c["auc"] if key == "auc" else {str(k): v for k, v in c["tpr_at_fpr"].items()}[key])


def _tradeoff_panel(ax: Any, order: Sequence[Mapping[str, Any]], xs: Sequence[float], *, level: str,
                    metric: str, ceiling_key: str, chance: float, attacks: Sequence[str]) -> None:
    """One attack figure against ε at one level: every attack with its 95% interval, chance, DP ceiling."""
    floor = chance / 5 if metric != "auc" else 0.0  # TPR axes are logarithmic: 0 is drawn at the floor
    for i, attack in enumerate(attacks):
        shift = 1.06 ** (i - (len(attacks) - 1) / 2)  # spread the attacks' intervals apart
        rows = [_attack(s["rows"], attack=attack, level=level) or {} for s in order]
        ys = [max(r.get(metric, r.get(_ALIAS.get(metric, ""), float("nan"))), floor) for r in rows]
        lo = [max(y - max((r.get(f"{metric}_ci95") or [y])[0], floor), 0.0) for r, y in zip(rows, ys, strict=True)]
        hi = [max(max((r.get(f"{metric}_ci95") or [0, y])[1], floor) - y, 0.0) for r, y in zip(rows, ys, strict=True)]
        ax.errorbar([x * shift for x in xs], ys, yerr=[lo, hi], marker="o", ms=4, capsize=2, lw=1,
                    color=f"C{i}", label=attack)
    ceiling = [_ceiling(s["summary"], ceiling_key) for s in order]
    ax.plot(xs, ceiling, color="black", ls="--", lw=1.2, marker="_", label="DP ceiling (any attack)")
    ax.axhline(chance, color="black", lw=0.8, ls=":", label="chance")
    if metric != "auc":
        ax.set_yscale("log")
        ax.set_ylim(bottom=floor * 0.8)
    ax.set_title(f"{level} level: {dict((m, t) for m, _, _, t in _FPRS)[metric]}", fontsize=9)


def plot_membership_tradeoff(settings: Sequence[Mapping[str, Any]], path: Path,
                             attacks: Sequence[str] | None = None) -> Path | None:
    """Utility and privacy against ε side by side, from ``scripts/user_membership.py --statistics``.

    Left: the attacked models' test accuracy (mean, min-max band over the K models). Right, one row per
    level (user, example): AUC, TPR at 1% and at 0.1% FPR of every attack with its 95% interval (the
    rows' cluster bootstrap), chance (dotted) and the DP ceiling (dashed: the most any test can reach
    under the run's σ, q, T; in this design an example's membership is its client's, so the ceiling bounds
    both levels). TPR axes are logarithmic, a TPR of 0 is drawn at a fifth of chance. The non-DP setting
    sits at the far right ("no DP").
    """
    if not settings:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = sorted(settings, key=lambda s: (s["summary"]["epsilon"] is None, s["summary"]["epsilon"] or 0.0))
    xs, inf_x = _mia_x(order)
    names = list(attacks) if attacks is not None else list(dict.fromkeys(r["attack"] for r in order[0]["rows"]))
    fig = plt.figure(figsize=(19, 8))
    grid = fig.add_gridspec(2, 4)
    acc_ax = fig.add_subplot(grid[:, 0])
    acc_ax.plot(xs, [s["summary"]["test_accuracy"] for s in order], marker="o", color="tab:green",
                label="test accuracy (mean of K models)")
    acc_ax.fill_between(xs, [s["summary"]["test_accuracy_min"] for s in order],
                        [s["summary"]["test_accuracy_max"] for s in order], color="tab:green", alpha=0.2)
    acc_ax.axhline(0.1, color="black", lw=0.8, ls=":", label="chance (10 classes)")
    acc_ax.set_title("utility: test accuracy (10,000 test images)", fontsize=9)
    axes = [acc_ax]
    for r, level in enumerate(("user", "example")):
        for c, (metric, key, chance, _) in enumerate(_FPRS):
            ax = fig.add_subplot(grid[r, c + 1])
            _tradeoff_panel(ax, order, xs, level=level, metric=metric, ceiling_key=key, chance=chance,
                            attacks=names)
            axes.append(ax)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel(f"ε (δ = {order[0]['summary'].get('delta') or 1e-5:g}); right: no DP", fontsize=8)
        ticks = [x for x in xs if x != inf_x]
        ax.set_xticks(ticks + ([inf_x] if inf_x is not None else []),
                      [f"{t:.3g}" for t in ticks] + (["no DP"] if inf_x is not None else []))
        ax.set_xticks([], minor=True)
    handles, labels = axes[1].get_legend_handles_labels()  # the attack panels' key, in the free space
    acc_ax.add_artist(acc_ax.legend(fontsize=8, loc="upper left"))
    acc_ax.legend(handles, labels, fontsize=8, loc="lower right", title="right panels", title_fontsize=8)
    fig.suptitle(f"Utility vs membership inference against ε: {experiment_title(order)}", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _tested_cell(row: Mapping[str, Any], key: str) -> str:
    """``value [95% CI] p`` of one figure, with the false positives a TPR rests on and whether it is resolved."""
    value = row.get(key, row.get(_ALIAS.get(key, ""), float("nan")))
    d = 4 if key == "tpr_at_fpr_0.001" else 3  # a TPR near 0.1% needs the fourth decimal
    if f"{key}_ci95" not in row:
        return f"{value:.{d}f}"
    lo, hi = row[f"{key}_ci95"]
    cell = f"{value:.{d}f} [{lo:.{d}f}, {hi:.{d}f}] p {row[f'{key}_p_value']:.3f}"
    if key == "auc":
        return cell
    allowed = row[f"{key}_false_positives_allowed"]
    return cell + (f" ({allowed} FP)" if allowed >= 1 else " (not resolved: 0 FP)")


def membership_tested_markdown(settings: Sequence[Mapping[str, Any]]) -> str:
    """One table per setting (``scripts/user_membership.py --statistics``): its accuracy, σ, ε and DP ceiling
    on a line, then per attack and level AUC, TPR at 1% and 0.1% FPR with 95% intervals, permutation
    p-values and the false positives each TPR rests on ("not resolved" when the FPR is below
    1 / non-member pairs), the pairs, the FPR resolution and the verdict "at chance" (every resolved
    figure's p >= 0.05)."""
    out: list[str] = []
    for s in settings:
        m = s["summary"]
        eps = "no DP" if m["epsilon"] is None else f"ε = {m['epsilon']:.3f} (δ = {m['delta']:g}, σ = {m['noise_multiplier']:.4f})"
        ceiling = "" if not m.get("dp_ceiling") else (
            f"; DP ceiling (any test): TPR@1% ≤ {_ceiling(m, '0.01'):.4f}, TPR@0.1% ≤ {_ceiling(m, '0.001'):.4f}, "
            f"AUC ≤ {_ceiling(m, 'auc'):.3f}")
        seconds = f", {m['seconds']:.0f} s" if "seconds" in m else ""
        out += [f"**{eps}**: test accuracy {m['test_accuracy']:.3f} ({m['test_accuracy_min']:.3f}–"
                f"{m['test_accuracy_max']:.3f} over {m['models']} models), train {m['train_accuracy']:.3f}"
                f"{ceiling}{seconds}", "",
                "| attack | level | AUC [95% CI], p | TPR @ 1% FPR [95% CI], p | TPR @ 0.1% FPR [95% CI], p | "
                "pairs (m/n) | FPR resolution | at chance (5%) |", "|---|---|---|---|---|---|---|---|"]
        for r in sorted(s["rows"], key=lambda r: (r["level"] != "user", r["attack"])):
            chance = {True: "yes", False: "no"}.get(r.get("at_chance_5pct"), "–")
            out.append(f"| {r['attack']} | {r['level']} | {_tested_cell(r, 'auc')} | "
                       f"{_tested_cell(r, 'tpr_at_fpr_0.01')} | {_tested_cell(r, 'tpr_at_fpr_0.001')} | "
                       f"{r['members']}/{r['nonmembers']} | {r['fpr_resolution']:.2g} | {chance} |")
        out.append("")
    return "\n".join(out).rstrip("\n")


# ------------------------------------------- fedprivacy and Flower's DP strategies, same σ
def _run_key(row: Row) -> tuple[Any, ...]:
    return (row.get("dataset"), row.get("label", ""), int(row.get("rounds", 0)), row.get("seed"))


def flower_comparisons(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Per run (setup, T, seed) that has a Flower row on the Fashion-MNIST curves: fedprivacy's
    central rows and every Flower row of it, each with σ, sampling, accountant, ε as its own framework
    reports it, fedprivacy's PLD for Flower's releases (``fedprivacy_epsilon``), accuracy and s/round."""
    groups: dict[tuple[Any, ...], list[Row]] = defaultdict(list)
    for r in rows:
        if is_curve_row(r) and _ok(r) and (r.get("framework") == "flower" or
                                           (r.get("framework") == "fedprivacy" and r.get("mode") in ("central", "none"))):
            groups[_run_key(r)].append(r)
    out = []
    for key, rs in sorted(groups.items(), key=lambda kv: tuple(str(v) for v in kv[0])):
        if not any(r.get("framework") == "flower" for r in rs):
            continue
        rs = sorted(rs, key=lambda r: (r.get("framework") != "fedprivacy", r.get("mode") == "none",
                                       curve_framework(r)))
        out.append({"dataset": key[0], "label": key[1], "rounds": key[2], "seed": key[3], "rows": [{
            "row": f"{curve_framework(r)} {r['mode']}",
            "strategy": r.get("flower_strategy") or ("fedprivacy central DP" if r["mode"] == "central"
                                                     else "fedprivacy (no DP)"),
            "noise_multiplier": r.get("noise_multiplier") if r.get("mode") != "none" else None,
            "sampling": (f"fixed cohort {r.get('clients_per_round')} of {r.get('num_clients')} (Flower's "
                         "random.sample)" if r.get("framework") == "flower" else
                         f"Poisson q = {float(r.get('sample_rate') or 0):.3g}"),
            "accountant": r.get("epsilon_note", ""),
            "epsilon": r.get("epsilon"),
            "fedprivacy_epsilon": r.get("fedprivacy_epsilon") or {},
            "accuracy": float(r["test_accuracy"]),
            "seconds_per_round": r.get("seconds_per_round"),
        } for r in rs]})
    return out


def flower_markdown(groups: Sequence[Mapping[str, Any]]) -> str:
    """One table per run: fedprivacy's and Flower's rows at the same σ side by side."""
    if not groups:
        return ""
    lines = ["| setup | T | seed | row | strategy | σ | sampling | ε as its framework reports it (δ = 1e-5) | "
             "fedprivacy PLD for the same releases (zero-out; replace-one) | test acc | s/round |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for g in groups:
        for r in g["rows"]:
            fp = r["fedprivacy_epsilon"]
            fp_cell = (f"{_f(fp.get('zero-out'), 4)}; {_f(fp.get('replace-one'), 4)}"
                       if fp.get("zero-out") is not None else "–")
            eps = "no privacy" if r["epsilon"] is None else f"{_f(r['epsilon'], 4)} ({r['accountant']})"
            lines.append(f"| {g['label']} | {g['rounds']} | {g['seed']} | {r['row']} | {r['strategy']} | "
                         f"{'–' if r['noise_multiplier'] is None else format(r['noise_multiplier'], '.4f')} | {r['sampling']} | {eps} | {fp_cell} | "
                         f"{r['accuracy']:.4f} | {_f(r['seconds_per_round'], 3)} |")
    return "\n".join(lines)
