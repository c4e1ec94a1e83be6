"""Ratios, goal checks, the markdown table, plots and the machine description of a sweep.

Pure functions over the list of records the runners return, so the report can be regenerated from a
saved JSON (``scripts/benchmark.py --from-json PATH``) and tested without running anything.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedprivacy_bench.curves import (
    curve_goals,
    curve_points,
    curves_markdown,
    distributed_goal,
    distributed_markdown,
    distributed_pairs,
    experiment_title,
    flower_comparisons,
    flower_markdown,
    headline_setups,
    is_curve_row,
    membership_experiments,
    membership_markdown,
    plot_curves,
    plot_membership,
)

Row = dict[str, Any]

# The columns the sweep reports, then the ones that make the table readable.
TABLE_COLUMNS = (
    ("dataset", "dataset"), ("params", "params"), ("label", "setup"), ("framework", "framework"),
    ("engine", "engine"), ("mode", "mode"), ("noise_multiplier", "σ"), ("epsilon", "ε (δ=1e-5)"),
    ("test_accuracy", "test acc"), ("rounds", "rounds"), ("seconds_per_round", "s/round"),
    ("ratio_time", "time ÷ non-DP"), ("ratio_acc", "acc Δ vs non-DP (pts)"),
    ("ratio_loop", "time ÷ torch loop"), ("startup_seconds", "start→round 1 (s)"),
    ("peak_memory_mb", "peak MB"), ("status", "status"),
)


# The first figure of the page: the setups the goals are judged on (curves.headline_setups).
HEADLINE_PLOT = "bench_fashion_headline.png"


def _group_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    # Fashion-MNIST curve rows of different lengths are different setups (sigma is calibrated per T);
    # the speed rows compare capped runs with their full-length non-DP row (the `rounds` ratio).
    length = row.get("rounds") if is_curve_row(row) else None
    return (row["dataset"], row.get("num_clients"), row.get("clients_per_round"), row.get("hidden"),
            row.get("label", ""), row.get("seed"), length)


def _usable(row: Mapping[str, Any]) -> bool:
    return row.get("status") in ("ok", "partial") and row.get("seconds_per_round") is not None


def find_reference(rows: Sequence[Row], row: Mapping[str, Any], *, framework: str,
                   engine: str | None = None, mode: str = "none") -> Row | None:
    """The usable row of ``framework`` (and ``engine``) in ``mode`` on the same setup as ``row``."""
    for cand in rows:
        if (cand["framework"] == framework and cand["mode"] == mode
                and (engine is None or cand["engine"] == engine)
                and _group_key(cand) == _group_key(row) and _usable(cand)):
            return cand
    return None


def _ratio(a: Any, b: Any) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return float(a) / float(b)


def add_ratios(rows: Sequence[Row]) -> list[Row]:
    """Add ``ratio_vs_none`` (and ratios to the torch loop and Flower's FedAvg) to every row.

    ``ratio_vs_none`` compares a row with the non-DP row of the same framework and engine on the
    same data set, population, cohort and model (fedprivacy rows against fedprivacy ``none``,
    Flower rows against Flower's plain FedAvg): ``seconds_per_round`` and ``test_accuracy`` as
    ratios, ``rounds`` as a ratio, and ``accuracy_points`` as the difference in percentage points.
    """
    out = []
    for row in rows:
        new = dict(row)
        ref = find_reference(rows, row, framework=row["framework"], engine=row["engine"])
        if ref is None and row["framework"] == "fedprivacy":
            ref = find_reference(rows, row, framework="fedprivacy", engine="inprocess")
        ratio: dict[str, float | None] | None = None
        if ref is not None and _usable(row):
            acc, acc0 = row.get("test_accuracy"), ref.get("test_accuracy")
            ratio = {
                "seconds_per_round": _ratio(row["seconds_per_round"], ref["seconds_per_round"]),
                "test_accuracy": _ratio(acc, acc0),
                "accuracy_points": None if acc is None or acc0 is None else 100.0 * (acc - acc0),
                "rounds": _ratio(row.get("rounds"), ref.get("rounds")),
            }
        new["ratio_vs_none"] = ratio
        loop = find_reference(rows, row, framework="torch")
        fl = find_reference(rows, row, framework="flower")
        new["ratio_vs_torch_loop"] = (_ratio(row.get("seconds_per_round"), loop["seconds_per_round"])
                                      if loop and _usable(row) else None)
        new["ratio_vs_flower_fedavg"] = (_ratio(row.get("seconds_per_round"), fl["seconds_per_round"])
                                         if fl and _usable(row) else None)
        out.append(new)
    return out


# ------------------------------------------------------------------------------------------ goals
def _fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _pick(rows: Sequence[Row], **match: Any) -> list[Row]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items()) and _usable(r)]


def _largest(rows: Sequence[Row]) -> Row | None:
    return max(rows, key=lambda r: r.get("params") or 0) if rows else None


QUICK_VERDICT = "quick: not a result"


def quick_verdict(payload: Mapping[str, Any], verdict: str) -> str:
    """A goal's verdict, or :data:`QUICK_VERDICT` for the quick sweep (tiny models, few rounds)."""
    return QUICK_VERDICT if payload.get("sweep") == "quick" else verdict


def evaluate_goals(rows: Sequence[Row]) -> list[dict[str, str]]:
    """Check the goals against the measured rows; each entry: goal, verdict, figures."""
    goals: list[dict[str, str]] = []
    for goal in (_secagg_overhead_goal, _synthetic_utility_goal, _flower_fedavg_goal, _flower_secagg_goal,
                 _scale_goal):
        goal(rows, goals)
    return goals


def _secagg_overhead_goal(rows: Sequence[Row], goals: list[dict[str, str]]) -> None:
    """Append the goal: DP+SecAgg round within 1.3x of non-DP at 100 clients/round, ~100k params."""
    dist = [r for r in _pick(rows, framework="fedprivacy", mode="distributed", engine="inprocess")
            if (r.get("clients_per_round") or 0) >= 100 and r.get("ratio_vs_none")]  # a non-DP twin ran
    best = _largest(dist)
    if best is not None and best.get("ratio_vs_none"):
        ratio = best["ratio_vs_none"]["seconds_per_round"]
        goals.append({"goal": "DP+SecAgg round ≤ 1.3× non-DP (100 clients/round, ~100k params)",
                      "verdict": "met" if ratio is not None and ratio <= 1.3 else "missed",
                      "figures": f"{_fmt(ratio)}× at {best['params']} params, "
                                 f"{best['seconds_per_round']:.3f} s/round"})
    else:
        small = [r for r in _pick(rows, framework="fedprivacy", mode="distributed")
                 if r.get("ratio_vs_none")]
        figures = _why_missing(rows, framework="fedprivacy", mode="distributed")
        if small:
            figures = "; ".join(
                f"measured only at {r['clients_per_round']} clients/round: "
                f"{_fmt(r['ratio_vs_none']['seconds_per_round'])}× non-DP" for r in small)
        goals.append({"goal": "DP+SecAgg round ≤ 1.3× non-DP (100 clients/round, ~100k params)",
                      "verdict": "not measured", "figures": figures})


def _synthetic_utility_goal(rows: Sequence[Row], goals: list[dict[str, str]]) -> None:
    """Append the goal: Utility on Synthetic/1000 clients at eps=3 within 5 points of non-DP."""
    cands = [r for r in _pick(rows, framework="fedprivacy", mode="central", dataset="synthetic")
             if r.get("target_epsilon") == 3.0 and r.get("ratio_vs_none")]
    if cands:
        r = max(cands, key=lambda c: c.get("rounds") or 0)  # the longest run says the most
        pts = r["ratio_vs_none"]["accuracy_points"]
        acc0 = r["test_accuracy"] / r["ratio_vs_none"]["test_accuracy"] \
            if r["ratio_vs_none"].get("test_accuracy") else None
        caveat = ""
        if acc0 is not None and acc0 < 0.5:
            caveat = (f"; caveat: the non-DP model itself reaches only {acc0:.3f} here, far from "
                      "converged, so this comparison says little about utility")
        goals.append({"goal": "Synthetic, 1000 clients, ε=3, δ=1e-5: accuracy within 5 points of non-DP",
                      "verdict": "met" if pts is not None and pts >= -5.0 else "missed",
                      "figures": f"{_fmt(pts, 1)} points ({_fmt(r['test_accuracy'], 3)} vs "
                                 f"{_fmt(acc0, 3)} non-DP; ε={_fmt(r['epsilon'])}, "
                                 f"σ={_fmt(r['noise_multiplier'], 3)}, {r['rounds']} rounds)"
                                 + caveat})
    else:
        goals.append({"goal": "Synthetic, 1000 clients, ε=3, δ=1e-5: accuracy within 5 points of non-DP",
                      "verdict": "not measured", "figures": "no central ε=3 row on synthetic"})


def _flower_fedavg_goal(rows: Sequence[Row], goals: list[dict[str, str]]) -> None:
    """Append the goal: Steady-state round no slower than Flower plain FedAvg (same setup)."""
    pairs = []
    for r in _pick(rows, framework="fedprivacy", mode="none", engine="inprocess"):
        fl = find_reference(rows, r, framework="flower")
        if fl is not None:
            pairs.append((r, fl))
    if pairs:
        worst = max(pairs, key=lambda p: p[0]["seconds_per_round"] / p[1]["seconds_per_round"])
        ratio = worst[0]["seconds_per_round"] / worst[1]["seconds_per_round"]
        figs = "; ".join(f"{a['dataset']}/{a['params']}p: {a['seconds_per_round']:.3f} vs "
                         f"{b['seconds_per_round']:.3f} s" for a, b in pairs)
        goals.append({"goal": "fedprivacy non-DP round no slower than Flower's plain FedAvg",
                      "verdict": "met" if ratio <= 1.0 else "missed",
                      "figures": f"worst ratio {ratio:.2f}× ({figs})"})
    else:
        goals.append({"goal": "fedprivacy non-DP round no slower than Flower's plain FedAvg",
                      "verdict": "not measured", "figures": "no pair of rows on the same setup"})


def _flower_secagg_goal(rows: Sequence[Row], goals: list[dict[str, str]]) -> None:
    """Append the goal: Faster than Flower SecAgg+ + DP."""
    pairs = []
    for r in _pick(rows, framework="fedprivacy", mode="distributed", engine="inprocess"):
        fl = find_reference(rows, r, framework="flower", mode="secagg+central")
        if fl is not None:
            pairs.append((r, fl))
    if pairs:
        ratio = max(a["seconds_per_round"] / b["seconds_per_round"] for a, b in pairs)
        goals.append({"goal": "fedprivacy DP+SecAgg faster than Flower SecAgg+ + DP",
                      "verdict": "met" if ratio < 1.0 else "missed",
                      "figures": "; ".join(f"{a['dataset']}/{a['params']}p: "
                                           f"{a['seconds_per_round']:.3f} vs "
                                           f"{b['seconds_per_round']:.3f} s" for a, b in pairs)})
    else:
        flr = _pick(rows, framework="flower", mode="secagg+central")
        figs = _why_missing(rows, framework="fedprivacy", mode="distributed")
        if flr:
            figs += f"; Flower SecAgg+ + DP measured at {flr[0]['seconds_per_round']:.2f} s/round"
        goals.append({"goal": "fedprivacy DP+SecAgg faster than Flower SecAgg+ + DP",
                      "verdict": "not measured", "figures": figs})


def _scale_goal(rows: Sequence[Row], goals: list[dict[str, str]]) -> None:
    """Append the goal: Scale: 1000 clients, 100 per round completes, with peak memory."""
    big = [r for r in rows if r["framework"] == "fedprivacy" and r.get("num_clients", 0) >= 1000
           and (r.get("clients_per_round") or 0) >= 100]
    done = [r for r in big if r.get("status") == "ok"]
    if done:
        peaks = {eng: max((r.get("peak_memory_mb") or 0.0) for r in done if r["engine"] == eng)
                 for eng in sorted({r["engine"] for r in done})}
        goals.append({"goal": "1000 clients, 100 per round, runs to completion on 2 cores",
                      "verdict": "met",
                      "figures": f"{len(done)} configurations completed; peak memory (summed PSS "
                                 "of the process tree): " + ", ".join(
                                     f"{eng} engine ≤ {mb:.0f} MB" for eng, mb in peaks.items())})
    else:
        goals.append({"goal": "1000 clients, 100 per round, runs to completion on 2 cores",
                      "verdict": "not measured" if not big else "missed",
                      "figures": "no 1000-client fedprivacy configuration in this sweep"
                      if not big else "; ".join(f"{r['mode']}: {r['status']}" for r in big)})


def _why_missing(rows: Sequence[Row], *, framework: str, mode: str) -> str:
    tried = [r for r in rows if r["framework"] == framework and r["mode"] == mode]
    if not tried:
        return f"no {framework} {mode} row in this sweep"
    return "; ".join(f"{r['status']}: {r.get('note') or 'no detail'}" for r in tried)[:400]


# ----------------------------------------------------------------------------------------- table
def _cell(row: Mapping[str, Any], key: str) -> str:
    ratio = row.get("ratio_vs_none") or {}
    if key == "ratio_time":
        return _fmt(ratio.get("seconds_per_round"))
    if key == "ratio_acc":
        pts = ratio.get("accuracy_points")
        return "–" if pts is None else f"{pts:+.1f}"
    if key == "ratio_loop":
        return _fmt(row.get("ratio_vs_torch_loop"), 1)
    value = row.get(key)
    if key == "epsilon" and value is not None:
        return f"{value:.2f}"
    if key == "test_accuracy" and value is not None:
        return f"{value:.3f}"
    if key == "seconds_per_round" and value is not None:
        return f"{value:.3f}"
    if key == "noise_multiplier":
        return "–" if not value else f"{value:.3f}"
    if key in ("peak_memory_mb", "startup_seconds") and value is not None:
        return f"{value:.0f}" if key == "peak_memory_mb" else f"{value:.1f}"
    return _fmt(value)


def markdown_table(rows: Sequence[Row]) -> str:
    head = "| " + " | ".join(label for _, label in TABLE_COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|"
    lines = [head, sep]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row, key) for key, _ in TABLE_COLUMNS) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------- machine
def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    versions: dict[str, str] = {"python": platform.python_version()}
    from importlib import metadata

    for pkg in ("flwr", "torch", "numpy", "opacus", "dp-accounting", "ray"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = "absent"
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": mem_gb,
            "os": f"{platform.system()} {platform.release()}", "versions": versions}


# ------------------------------------------------------------------------------------------ plots
def _row_label(r: Mapping[str, Any]) -> str:
    eng = "" if r["engine"] in ("inprocess", "loop") or r["framework"] == "flower" else f"/{r['engine']}"
    target = f", ε target {r['target_epsilon']:g}" if r.get("target_epsilon") else ""
    return f"{r['framework']}{eng} {r['mode']} ({r.get('params')}p{target})"


def _accuracy_vs_epsilon(ax: Any, usable: Sequence[Row], ds: str) -> None:
    for r in usable:
        if r["dataset"] != ds or r.get("test_accuracy") is None:
            continue
        if r["mode"] == "none":
            ax.axhline(r["test_accuracy"], ls="--", lw=0.8, color="gray")
            continue
        if r.get("epsilon") is None:
            continue
        marker = "o" if r["framework"] == "fedprivacy" else "s"
        ax.scatter([r["epsilon"]], [r["test_accuracy"]], marker=marker, label=_row_label(r))
    ax.set_xscale("log")
    ax.set_xlabel("ε at δ=1e-5 (as each framework reports it)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{ds}: accuracy vs ε (dashed: non-DP)")
    ax.legend(fontsize=6)


def _accuracy_vs_round(ax: Any, usable: Sequence[Row], ds: str) -> None:
    for r in usable:
        acc = r.get("accuracy_by_round") or []
        if r["dataset"] == ds and acc:
            ax.plot(range(1, len(acc) + 1), acc, label=_row_label(r), lw=1)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{ds}: accuracy vs round")
    ax.legend(fontsize=6)


def _seconds_per_round(ax: Any, usable: Sequence[Row], ds: str) -> None:
    sel = [r for r in usable if r["dataset"] == ds]
    colors = ["tab:blue" if r["framework"] == "fedprivacy" else
              "tab:orange" if r["framework"] == "flower" else "tab:gray" for r in sel]
    ax.barh(range(len(sel)), [r["seconds_per_round"] for r in sel], color=colors)
    ax.set_yticks(range(len(sel)), [_row_label(r) for r in sel], fontsize=6)
    ax.set_xscale("log")
    ax.set_xlabel("median steady-state seconds per round (log)")
    ax.set_title(f"{ds}: seconds per round (blue fedprivacy, orange Flower, gray torch loop)", fontsize=8)


def _curve_and_membership_plots(rows: Sequence[Row], outdir: Path,
                                membership: Sequence[Mapping[str, Any]]) -> list[Path]:
    written: list[Path] = []
    points = curve_points(rows)
    main = headline_setups(points)
    headline = plot_curves([p for p in points if (p["label"], p["rounds"]) in main], outdir,
                           name=HEADLINE_PLOT, focus=True) if main else None
    curve = plot_curves(points, outdir)
    written += [path for path in (headline, curve) if path is not None]
    for i, experiment in enumerate(membership_experiments(membership)):  # one figure per experiment
        m = experiment[0]["summary"]
        name = ("bench_membership_vs_epsilon.png" if i == 0 else
                f"bench_membership_vs_epsilon_{m['clients']}x{m['per_client']}_{i}.png")
        mia = plot_membership(experiment, outdir / name)
        if mia is not None:
            written.append(mia)
    return written


def make_plots(rows: Sequence[Row], outdir: Path,
               membership: Sequence[Mapping[str, Any]] = ()) -> list[Path]:
    """Accuracy vs ε, accuracy vs round, seconds per round per mode, and (if given) membership
    inference vs ε; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    written = _curve_and_membership_plots(rows, outdir, membership)
    usable = [r for r in rows if _usable(r) and not is_curve_row(r)]  # curves: their own plot
    datasets = sorted({r["dataset"] for r in usable})
    if not datasets:
        return written
    for draw, name, size in ((_accuracy_vs_epsilon, "bench_accuracy_vs_epsilon.png", (6, 4)),
                             (_accuracy_vs_round, "bench_accuracy_vs_round.png", (6, 4)),
                             (_seconds_per_round, "bench_seconds_per_round.png", (7, 4.5))):
        fig, axes = plt.subplots(1, len(datasets), figsize=(size[0] * len(datasets), size[1]), squeeze=False)
        for ax, ds in zip(axes[0], datasets, strict=True):
            draw(ax, usable, ds)
        path = outdir / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


# --------------------------------------------------------------------------------------- markdown
def _markdown_header(payload: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The page's opening lines and the saved-runs section (empty for a single sweep)."""
    m = payload["machine"]
    rows = payload["rows"]
    lines = [
        "# Benchmarks: what privacy costs, side by side with Flower's own tools",
        "",
        "Generated by `scripts/benchmark.py`; do not edit by hand. Regenerate with:",
        "",
        "```bash run-by: tests/bench/test_bench_outputs.py",
        payload["command"],
        "```",
        "",
    ]
    parts = payload.get("parts") or []
    part_lines: list[str] = []
    if parts:
        hours = sum(float(part["runtime_seconds"]) for part in parts) / 3600
        lines += [f"That command renders this page from {len(parts)} saved runs; producing them took "
                  f"{hours:.1f} hours of wall time in all (each run's own command, time and load: "
                  "[The saved runs](#the-saved-runs-and-their-commands)).", ""]
        part_lines = ["", "## The saved runs and their commands", "",
                      "Each saved run was produced by its own command:", ""]
        for part in parts:
            load = part.get("load_average")
            part_lines.append(f"- **{part['sweep']}**: `{part['command']}` — {part['rows']} configurations, "
                              f"{part['runtime_seconds'] / 60:.1f} minutes wall time"
                              + (f", finished {part['finished']}" if part.get("finished") else "")
                              + (f", load average at the end {load}" if load else "")
                              + ".")
    else:
        lines += [
            f"Sweep: **{payload['sweep']}**, {len(rows)} configurations, "
            f"{payload['runtime_seconds'] / 60:.1f} minutes wall time, finished {payload['finished']}.",
            ""]
    lines += [
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB memory, {m['os']}; "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ". "
        "The machine was shared with other work while this ran: compare ratios measured in one run, "
        "not absolute times.",
    ]
    return lines, part_lines


def _markdown_headline(points: Sequence[Mapping[str, Any]], plot_list: list[str]) -> tuple[list[str], list[str]]:
    """The headline figure's paragraph (when it was drawn) and the plots left to list."""
    lines: list[str] = []
    if any(Path(q).name == HEADLINE_PLOT for q in plot_list):
        main = ", ".join(f"`{label}` T={t}" for label, t in headline_setups(points))
        lines += ["", f"Test accuracy against ε on the setups the goals are judged on ({main}): "
                  "the mean over seeds with its min–max, every mode and framework at the ε its own "
                  "accountant reports (distributed DP at the ε against observers of the released models; "
                  "its ε against the server is in the tables below). A run that did not learn sits on the "
                  "lower edge, labelled with its accuracy. Every σ, q, T and accountant is in the tables.",
                  "", f"![accuracy against ε](img/{HEADLINE_PLOT})", "",
                  "What membership inference finds against ε, beside the attacked models' accuracy: "
                  "[ATTACKS.md](ATTACKS.md) opens with that figure and its command."]
        plot_list = [q for q in plot_list if Path(q).name != HEADLINE_PLOT]
    return lines, plot_list


def _markdown_sections(rows: Sequence[Row], payload: Mapping[str, Any], pairs: Any,
                       points: Sequence[Mapping[str, Any]], membership: Sequence[Mapping[str, Any]]) -> list[str]:
    """The distributed, Fashion-MNIST, Flower and membership sections (each when it has rows)."""
    lines: list[str] = []
    if pairs:
        lines += ["", "## Distributed against central DP at the same σ and sampling", "",
                  "Each line pairs distributed rows with the central rows of the identical run (data, "
                  "model, σ, Poisson q, T, seed) and states both audiences' ε as the distributed run "
                  "reported them (results.json `privacy.distributed.audiences`): against the server "
                  "(it sees the cohorts: no amplification) and against observers of the released "
                  "models (the public: amplified by the sampling that ran). Central's ε is its PLD "
                  "with Poisson amplification; the server's reference is the PLD of the continuous "
                  "Gaussian of the same σ without sampling.", "", distributed_markdown(pairs)]
    if points:
        lines += ["", "## Fashion-MNIST: accuracy against ε", "",
                  "Each point pools the seeds that ran (mean, min–max); ε is what the framework's own "
                  "accountant reports for the σ, q and T that ran.", "", curves_markdown(points)]
    flower = flower_comparisons(rows)
    if flower:
        lines += ["", "## fedprivacy and Flower's DP strategies at the same σ", "",
                  "Rows of one invocation (same setup, seed and σ): fedprivacy's central DP (Poisson "
                  "sampling, PLD, add/remove) and Flower 1.42's own strategies on fedprivacy's in-process "
                  "engine (a fixed cohort drawn by Flower, its RdpAccountant without amplification at "
                  "sensitivity C: a zero-out claim, server/flower_accountant.py). Each ε is what its own "
                  "framework reports; the PLD column is fedprivacy's accountant for Flower's releases "
                  "(no amplification: Flower's draw earns none).", "", flower_markdown(flower)]
    if membership:
        lines += ["", "## Membership inference against ε", "",
                  "From `" + str(payload.get("membership_command", "scripts/user_membership.py")) + "`. "
                  "Each setting trains K federated models on random halves of the candidate clients "
                  "and attacks each with the others as shadows (pooled); user level = a client's "
                  "score is the mean of its examples'. `FPR resolution` is 1 / non-member pairs: a "
                  "TPR at a lower FPR is the TPR at FPR 0.",
                  "", "Membership inference against the curve's own models (example and user level, "
                  "every ε): docs/ATTACKS.md, section *The accuracy-ε curve's own models*."]
        for experiment in membership_experiments(membership):
            lines += ["", f"**{experiment_title(experiment)}**", "", membership_markdown(experiment)]
    return lines


def _markdown_tail(payload: Mapping[str, Any], rows: Sequence[Row], plot_list: list[str]) -> list[str]:
    """The sweep's goals, the results table, how each row ran, failures and plots."""
    lines: list[str] = []
    lines += ["", "## Goals of the digits and Synthetic sweep", "",
              "| goal | verdict | figures |", "|---|---|---|"]
    lines += [f"| {g['goal']} | **{g['verdict']}** | {g['figures']} |" for g in payload["goals"]]
    lines += ["", "## Results", "", markdown_table(rows), ""]
    lines += [
        "Columns: `s/round` is the median of the steady-state rounds (all rounds after the first); "
        "a round's time includes its central evaluation for every row. `time ÷ non-DP` and "
        "`acc Δ vs non-DP` compare a row with the non-DP row of the same framework on the same "
        "setup (JSON field `ratio_vs_none`); `time ÷ torch loop` compares with the single-process "
        "torch loop doing the same local training. `peak MB` is the peak summed PSS of the "
        "configuration's whole process tree (Ray's processes included), sampled every 0.25 s. "
        "`start→round 1` is the time from starting the run to the end of round 1.",
        "",
        "## How each row was run",
        "",
    ]
    lines += [f"- {n}" for n in payload.get("notes", [])]
    failed = [r for r in rows if r.get("status") not in ("ok",)]
    if failed:
        lines += ["", "## Rows that did not complete", ""]
        for r in failed:
            lines.append(f"- {r['dataset']} {r['framework']}/{r['engine']} {r['mode']}: "
                         f"{r['status']} — {r.get('note') or 'no detail'}")
    if plot_list:
        lines += ["", "## Plots", ""]
        lines += [f"![{Path(p).stem}](img/{Path(p).name})" for p in plot_list]
    return lines


def render_markdown(payload: Mapping[str, Any], *, plots: Iterable[str] = ()) -> str:
    """The text of ``docs/BENCHMARKS.md`` for a sweep payload (see ``scripts/benchmark.py``)."""
    rows = payload["rows"]
    lines, part_lines = _markdown_header(payload)
    plot_list = list(plots)
    points = curve_points(rows)
    membership = payload.get("membership") or []
    scope = payload.get("scope") or []
    pairs = distributed_pairs(rows)
    if points or membership:
        lines += ["", "## Goals", "", "| goal | verdict | figures |", "|---|---|---|"]
        lines += [f"| {g['goal']} | **{quick_verdict(payload, g['verdict'])}** | {g['figures']} |"
                  for g in curve_goals(points, membership) + ([distributed_goal(pairs)] if pairs else [])]
    headline, plot_list = _markdown_headline(points, plot_list)
    lines += headline
    lines += part_lines
    if scope:
        lines += ["", "## What was run and what was not", ""] + [f"- {n}" for n in scope]
    lines += _markdown_sections(rows, payload, pairs, points, membership)
    lines += _markdown_tail(payload, rows, plot_list)
    lines.append("")
    return "\n".join(lines)
