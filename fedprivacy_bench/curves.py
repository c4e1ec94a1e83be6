"""Accuracy-against-epsilon curves over seeds (issue 13): the points, one plot, one table.

A *curve* is one (data set, setup label, framework, mode); a *point* is one target epsilon of it, pooled
over the seeds that ran: the mean test accuracy with its min and max (the spread shown in the plot), the
mean epsilon the framework's own accountant reports, and everything the claim needs: sigma, q, rounds,
delta, accountant. Non-DP runs of the same setup give the reference line.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["curve_points", "plot_curves", "curves_markdown", "is_curve_row"]

Row = Mapping[str, Any]


def is_curve_row(row: Row) -> bool:
    """Rows of the Fashion-MNIST curves (every other row stays in the speed tables and plots)."""
    return row.get("dataset") == "fashion-mnist"


def _ok(row: Row) -> bool:
    return row.get("status") in ("ok", "partial") and row.get("test_accuracy") is not None


def curve_points(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """One point per (dataset, label, framework, mode, target epsilon), pooled over seeds."""
    groups: dict[tuple[Any, ...], list[Row]] = defaultdict(list)
    for r in rows:
        if is_curve_row(r) and _ok(r):
            key = (r["dataset"], r.get("label", ""), r["framework"], r["mode"],
                   r.get("target_epsilon"))
            groups[key].append(r)
    points = []
    for (dataset, label, framework, mode, target), rs in sorted(
            groups.items(), key=lambda kv: tuple("" if v is None else str(v) for v in kv[0])):
        accs = [float(r["test_accuracy"]) for r in rs]
        eps = [float(r["epsilon"]) for r in rs if r.get("epsilon") is not None]
        first = rs[0]
        points.append({
            "dataset": dataset, "label": label, "framework": framework, "mode": mode,
            "target_epsilon": target,
            "epsilon": sum(eps) / len(eps) if eps else None,
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


def plot_curves(points: Sequence[Mapping[str, Any]], outdir: Path) -> Path | None:
    """Accuracy against epsilon, one panel per setup, mean line with a min-max band over seeds."""
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setups = sorted({p["label"] for p in points})
    fig, axes = plt.subplots(1, len(setups), figsize=(6.5 * len(setups), 4.5), squeeze=False)
    for ax, setup in zip(axes[0], setups, strict=True):
        here = [p for p in points if p["label"] == setup]
        for p in here:
            if p["mode"] == "none":
                ax.axhline(p["accuracy"], color="black", ls="--", lw=1,
                           label=f"non-DP ({len(p['seeds'])} seeds)")
                ax.axhspan(p["accuracy_min"], p["accuracy_max"], color="gray", alpha=0.2)
        curves = sorted({(p["framework"], p["mode"]) for p in here if p["mode"] != "none"})
        for framework, mode in curves:
            pts = sorted((p for p in here if (p["framework"], p["mode"]) == (framework, mode)
                          and p["epsilon"] is not None), key=lambda p: p["epsilon"])
            if not pts:
                continue
            x = [p["epsilon"] for p in pts]
            line = ax.plot(x, [p["accuracy"] for p in pts], marker="o" if framework == "fedprivacy"
                           else "s", label=f"{framework} {mode} ({len(pts[0]['seeds'])} seeds)")[0]
            ax.fill_between(x, [p["accuracy_min"] for p in pts], [p["accuracy_max"] for p in pts],
                            color=line.get_color(), alpha=0.2)
        ax.set_xscale("log")
        ax.set_xlabel("ε (δ = 1e-5), as each accountant reports it")
        ax.set_ylabel("test accuracy (10,000 test images)")
        first = here[0]
        ax.set_title(f"{setup}: N={first['num_clients']}, {first['clients_per_round']}/round, "
                     f"T={first['rounds']}", fontsize=9)
        ax.legend(fontsize=7)
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / "bench_fashion_accuracy_vs_epsilon.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _f(x: Any, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def curves_markdown(points: Sequence[Mapping[str, Any]]) -> str:
    """The table of every curve point: what ran (σ, q, T, δ, accountant) and what it reached."""
    if not points:
        return ""
    lines = [
        "| setup | framework | mode | target ε | ε reached | σ | q | T | δ | accountant | "
        "test acc (mean) | min–max | seeds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(
            f"| {p['label']} | {p['framework']} | {p['mode']} | {_f(p['target_epsilon'])} | "
            f"{_f(p['epsilon'])} | {_f(p['noise_multiplier'], 4) if p['mode'] != 'none' else '–'} | "
            f"{_f(p['sample_rate'], 3)} | {p['rounds']} | {_f(p['delta'])} | {p['accountant']} | "
            f"{p['accuracy']:.3f} | {p['accuracy_min']:.3f}–{p['accuracy_max']:.3f} | "
            f"{','.join(map(str, p['seeds']))} |")
    return "\n".join(lines)
