"""Accuracy against ε and against rounds, with the spread over seeds: the points, the plots, the table.

One code path draws the figures of a sweep (:mod:`fedprivacy.sweep.table`) and of docs/BENCHMARKS.md
(``fedprivacy_bench``). A *curve* is one (data set, setup label, rounds, framework, mode); a *point* is
one target ε of it, pooled over the seeds that ran: the mean test accuracy with its min and max (the
spread drawn), the mean ε the framework's own accountant reports, and what the claim needs: σ, q,
rounds, δ, accountant. Non-DP runs of the same setup give the reference line.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["adjacency", "curve_framework", "curve_points", "curves_markdown", "headline_setups",
           "is_curve_row", "plot_curves", "plot_rounds"]

Row = Mapping[str, Any]


def is_curve_row(row: Row) -> bool:
    """Rows of the Fashion-MNIST curves (every other row stays in the speed tables and plots)."""
    return row.get("dataset") == "fashion-mnist"


def _ok(row: Row) -> bool:
    return row.get("status") in ("ok", "partial") and row.get("test_accuracy") is not None


def curve_framework(row: Row) -> str:
    """A row's curve: its framework, and for Flower's server-side-clipping wrapper (spec option
    ``flower_clipping``) ``flower server-clip``, a curve apart from the client-side one."""
    extra = dict((row.get("spec") or {}).get("extra") or [])
    if row.get("framework") == "flower" and extra.get("flower_clipping") == "server":
        return "flower server-clip"
    return str(row["framework"])


def adjacency(point: Mapping[str, Any]) -> str:
    """The neighbouring relation a point's ε holds under, as each framework states it: Flower's
    RdpAccountant charges sensitivity C without amplification, a zero-out claim
    (server/flower_accountant.py); fedprivacy's central DP with Poisson sampling, add/remove; its local
    rows are calibrated under replace-one without amplification (the server sees who takes part);
    distributed DP claims zero-out for both audiences (docs/DISTRIBUTED_DP.md)."""
    if point["mode"] == "none":
        return "–"
    if str(point["framework"]).startswith("flower"):
        return "zero-out"
    return {"central": "add/remove", "local": "replace-one", "distributed": "zero-out"}.get(
        str(point["mode"]), "see the run's privacy report")


def curve_points(rows: Sequence[Row], *,
                 keep: Callable[[Row], bool] = is_curve_row) -> list[dict[str, Any]]:
    """One point per (dataset, label, rounds, framework, mode, target epsilon), pooled over seeds.

    Runs of the same setup with different numbers of rounds are different curves (their sigma is
    calibrated for their own T), never pooled. ``keep`` picks the rows (default: the Fashion-MNIST
    rows of the benchmark page); rows that did not finish or were not evaluated are left out.
    """
    groups: dict[tuple[Any, ...], list[Row]] = defaultdict(list)
    for r in rows:
        if keep(r) and _ok(r):
            key = (r["dataset"], r.get("label", ""), int(r.get("rounds", 0)), curve_framework(r),
                   r["mode"], r.get("target_epsilon"))
            groups[key].append(r)
    points = []
    for (dataset, label, _rounds, framework, mode, target), rs in sorted(
            groups.items(), key=lambda kv: tuple("" if v is None else str(v) for v in kv[0])):
        accs = [float(r["test_accuracy"]) for r in rs]
        eps = [float(r["epsilon"]) for r in rs if r.get("epsilon") is not None]
        observers = [float(a["observers"]) for r in rs
                     if (a := r.get("epsilon_audiences") or {}).get("observers") is not None]
        first = rs[0]
        points.append({
            "dataset": dataset, "label": label, "framework": framework, "mode": mode,
            "target_epsilon": target,
            "epsilon": sum(eps) / len(eps) if eps else None,
            # distributed: the ε against observers of the released models (the public's, with the
            # sampling's amplification); ``epsilon`` is the run's headline (against the server)
            "epsilon_observers": sum(observers) / len(observers) if observers else None,
            "accuracy": sum(accs) / len(accs), "accuracy_min": min(accs), "accuracy_max": max(accs),
            "seeds": sorted(int(r.get("seed", 0)) for r in rs),
            "noise_multiplier": first.get("noise_multiplier"),
            "sample_rate": first.get("sample_rate"),
            "rounds": max(int(r.get("rounds", 0)) for r in rs),
            "delta": first.get("delta"),
            "accountant": first.get("epsilon_note", ""),
            "num_clients": first.get("num_clients"),
            "clients_per_round": first.get("clients_per_round"),
        })
    return points


def _x(point: Mapping[str, Any]) -> float:
    """A point's ε on the curve: the public's (observers') for distributed rows, which is what central
    DP's amplified ε is against; the run's own headline otherwise."""
    observers = point.get("epsilon_observers")
    return float(point["epsilon"] if observers is None else observers)


def headline_setups(points: Sequence[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """The (label, rounds) setups a reader should see first: those with a DP point over >= 3 seeds (the
    curve the goals are judged on) and those that compare with Flower's own strategies."""
    return sorted({(p["label"], p["rounds"]) for p in points
                   if p["mode"] != "none" and (len(p["seeds"]) >= 3 or p["framework"] != "fedprivacy")})


def _focus(ax: Any, pts: Sequence[Mapping[str, Any]]) -> None:
    """Zoom the accuracy axis onto the points that learned (>= 0.3); a point below is drawn on the
    lower edge and labelled with its accuracy, so a diverged run is shown without flattening the rest."""
    learned = [v for p in pts for v in (p["accuracy_min"], p["accuracy_max"]) if v >= 0.3]
    if not learned:
        return
    low, high = min(learned) - 0.02, max(learned) + 0.01
    ax.set_ylim(low, high)
    for p in pts:
        if p["accuracy"] < low and p["epsilon"] is not None:
            ax.plot([_x(p)], [low], marker="v", color="red", ms=8, clip_on=False)
            ax.annotate(f"{p['framework']} {p['mode']}: {p['accuracy']:.3f}", (_x(p), low),
                        textcoords="offset points", xytext=(6, 6), fontsize=7, color="red")


def _plain_log_ticks(ax: Any) -> None:
    """Label a log ε axis at 1, 2, 4, 8, ... in plain numbers (not 2×10⁰)."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    low, high = ax.get_xlim()
    ticks = [2.0 ** k for k in range(-6, 16) if low <= 2.0 ** k <= high]
    if len(ticks) >= 2:
        ax.set_xticks(ticks)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())


_EPS_LABEL = "ε (δ = 1e-5), as each accountant reports it"
_ACC_LABEL = "test accuracy (10,000 test images)"


def _figure(panels: int) -> tuple[Any, Any, Any]:
    """pyplot, a figure and its axes: rows of up to three panels, the unused ones hidden."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = min(3, panels)
    nrows = -(-panels // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 4.5 * nrows), squeeze=False)
    for ax in axes.flat[panels:]:
        ax.set_visible(False)
    return plt, fig, axes


def _save(plt: Any, fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _reference_lines(ax: Any, here: Sequence[Mapping[str, Any]]) -> None:
    """The non-DP points of a panel: a horizontal line with its min-max band."""
    for p in here:
        if p["mode"] == "none":
            other = p["framework"] != "fedprivacy"
            ax.axhline(p["accuracy"], color="black", ls=":" if other else "--", lw=1,
                       label=f"non-DP{' ' + p['framework'] if other else ''} ({len(p['seeds'])} seeds)")
            ax.axhspan(p["accuracy_min"], p["accuracy_max"], color="gray", alpha=0.2)


def _curve(ax: Any, framework: str, mode: str, pts: Sequence[Mapping[str, Any]]) -> None:
    """One (framework, mode) curve: mean accuracy against ε with min-max error bars and band."""
    x = [_x(p) for p in pts]
    audience = ", ε against observers" if pts[0].get("epsilon_observers") is not None else ""
    if str(framework).startswith("flower"):
        audience = ", ε: Flower's RDP, zero-out, no amplification"
    counts = sorted({len(p["seeds"]) for p in pts})
    seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    ys = [p["accuracy"] for p in pts]
    line = ax.errorbar(x, ys, yerr=[[y - p["accuracy_min"] for y, p in zip(ys, pts, strict=True)],
                                    [p["accuracy_max"] - y for y, p in zip(ys, pts, strict=True)]],
                       marker="o" if framework == "fedprivacy" else "s", capsize=3,
                       label=f"{framework} {mode} ({seeds} seeds per point, min–max{audience})")[0]
    ax.fill_between(x, [p["accuracy_min"] for p in pts], [p["accuracy_max"] for p in pts],
                    color=line.get_color(), alpha=0.2)


def _epsilon_panel(ax: Any, here: Sequence[Mapping[str, Any]], *, focus: bool,
                   xlabel: str, ylabel: str) -> None:
    _reference_lines(ax, here)
    for framework, mode in sorted({(p["framework"], p["mode"]) for p in here if p["mode"] != "none"}):
        pts = sorted((p for p in here if (p["framework"], p["mode"]) == (framework, mode)
                      and p["epsilon"] is not None), key=lambda p: _x(p))
        if pts:
            _curve(ax, framework, mode, pts)
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    first = here[0]
    ax.set_title(f"{first['label']}: N={first['num_clients']}, {first['clients_per_round']}/round, "
                 f"T={first['rounds']}", fontsize=9)
    _plain_log_ticks(ax)
    if focus:
        _focus(ax, here)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.14))
    else:
        ax.legend(fontsize=7)


def plot_curves(points: Sequence[Mapping[str, Any]], outdir: Path, *,
                name: str = "bench_fashion_accuracy_vs_epsilon.png", focus: bool = False,
                xlabel: str = _EPS_LABEL, ylabel: str = _ACC_LABEL) -> Path | None:
    """Accuracy against epsilon, one panel per setup, mean line with a min-max band over seeds.

    ``focus`` zooms each panel onto the runs that learned (see ``_focus``)."""
    if not points:
        return None
    setups = sorted({(p["label"], p["rounds"]) for p in points})
    plt, fig, axes = _figure(len(setups))
    for ax, setup in zip(axes.flat, setups, strict=False):
        _epsilon_panel(ax, [p for p in points if (p["label"], p["rounds"]) == setup], focus=focus,
                       xlabel=xlabel, ylabel=ylabel)
    return _save(plt, fig, outdir / name)


def plot_rounds(series: Mapping[str, Sequence[Sequence[tuple[int, float]]]], path: Path, *,
                ylabel: str = "test accuracy") -> Path | None:
    """Accuracy against round: per label, the mean over its seeds' curves with the min-max band.

    ``series`` maps a label to one list of (round, accuracy) pairs per seed; a round that some seed
    did not evaluate is pooled over the seeds that did."""
    if not any(any(curves) for curves in series.values()):
        return None
    plt, fig, axes = _figure(1)
    ax = axes.flat[0]
    for label, curves in sorted(series.items()):
        by_round: dict[int, list[float]] = defaultdict(list)
        for curve in curves:
            for rnd, acc in curve:
                by_round[int(rnd)].append(float(acc))
        if not by_round:
            continue
        xs = sorted(by_round)
        line = ax.plot(xs, [sum(by_round[x]) / len(by_round[x]) for x in xs], marker=".",
                       label=f"{label} ({len(curves)} seeds, min–max)")[0]
        ax.fill_between(xs, [min(by_round[x]) for x in xs], [max(by_round[x]) for x in xs],
                        color=line.get_color(), alpha=0.2)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    return _save(plt, fig, path)


def _f(x: Any, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def curves_markdown(points: Sequence[Mapping[str, Any]]) -> str:
    """The table of every curve point: what ran (σ, q, T, δ, accountant) and what it reached."""
    if not points:
        return ""
    lines = [
        "| setup | framework | mode | target ε | ε reached | σ | q | T | δ | adjacency | accountant | "
        "test acc (mean) | min–max | seeds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        reached = _f(p["epsilon"])
        if p.get("epsilon_observers") is not None:
            reached = f"{reached} (server), {_f(p['epsilon_observers'])} (observers)"
        target, sampling = _f(p["target_epsilon"]), _f(p["sample_rate"], 3)
        if str(p["framework"]).startswith("flower"):
            # Flower targets no ε (its σ is fedprivacy's for that target) and draws a fixed cohort
            target = "–" if p["target_epsilon"] is None else f"σ of fedprivacy's ε={target}"
            sampling = f"cohort {p['clients_per_round']}/{p['num_clients']}"
        lines.append(
            f"| {p['label']} | {p['framework']} | {p['mode']} | {target} | "
            f"{reached} | {_f(p['noise_multiplier'], 4) if p['mode'] != 'none' else '–'} | "
            f"{sampling} | {p['rounds']} | {_f(p['delta'])} | {adjacency(p)} | {p['accountant']} | "
            f"{p['accuracy']:.3f} | {p['accuracy_min']:.3f}–{p['accuracy_max']:.3f} | "
            f"{','.join(map(str, p['seeds']))} |")
    return "\n".join(lines)
