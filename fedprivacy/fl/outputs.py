"""What a run leaves behind: results.json, rounds.csv, privacy_report.md and a PNG plot."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedprivacy._io import atomic_write_bytes, atomic_write_text

ROUND_FIELDS = (
    "round", "clients_sampled", "clients_aggregated", "train_loss", "test_loss", "test_accuracy",
    "epsilon", "delta", "seconds",
)


def clean_json(obj: Any) -> Any:
    """Replace NaN/Inf floats by None (strict JSON) recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): clean_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean_json(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        return clean_json(obj.item())
    return obj


def rounds_csv(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as CSV; a field no row carries (participation counts kept private) is left out."""
    fields = [k for k in ROUND_FIELDS if not rows or any(k in row for row in rows)]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in fields})
    return buf.getvalue()


def plot_png(rows: Sequence[dict[str, Any]], *, title: str) -> bytes:
    """Accuracy (left axis, 0 to 1) and ε (right axis, from 0) against round, with a legend, as PNG bytes."""
    buf = io.BytesIO()
    plot_figure(rows, title=title).savefig(buf, format="png")
    return buf.getvalue()


def plot_figure(rows: Sequence[dict[str, Any]], *, title: str) -> Any:
    """The matplotlib ``Figure`` behind :func:`plot_png` (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    rounds = [r["round"] for r in rows]
    evaluated = [r for r in rows if r.get("test_accuracy") is not None]  # eval-every
    ax.plot([r["round"] for r in evaluated], [r["test_accuracy"] for r in evaluated], "o-",
            color="tab:blue", label="test accuracy")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers: no 1.5 tick
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy", color="tab:blue")
    ax.set_ylim(0.0, 1.0)
    eps = [r.get("epsilon") for r in rows]
    if any(e is not None for e in eps):
        ax2 = ax.twinx()
        ax2.plot(rounds, [e if e is not None else float("nan") for e in eps], "s--", color="tab:red",
                 label="ε")
        ax2.set_ylabel("ε", color="tab:red")
        ax2.set_ylim(bottom=0.0)  # ε from 0: its growth reads as it is, not as a zoomed slope
    handles = [h for a in fig.axes for h in a.get_lines() if not str(h.get_label()).startswith("_")]
    if handles:
        ax.legend(handles=handles, labels=[str(h.get_label()) for h in handles], loc="center right")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def write_outputs(run_dir: Path, results: dict[str, Any], *, report_md: str) -> dict[str, Path]:
    """Write every output file atomically; returns their paths."""
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "results": run_dir / "results.json",
        "csv": run_dir / "rounds.csv",
        "report": run_dir / "privacy_report.md",
        "plot": run_dir / "accuracy_epsilon.png",
    }
    atomic_write_text(paths["results"], json.dumps(clean_json(results), indent=2, allow_nan=False))
    atomic_write_text(paths["csv"], rounds_csv(results["rounds"]))
    atomic_write_text(paths["report"], report_md)
    title = f"{results['config'].get('privacy')} / {results['config'].get('dataset')}"
    atomic_write_bytes(paths["plot"], plot_png(results["rounds"], title=title))
    return paths
