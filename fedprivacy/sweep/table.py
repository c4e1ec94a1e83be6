"""A sweep's results: one row per run (from its ``results.json``), a CSV, a Markdown table pooled
over seeds, and the figures of :mod:`fedprivacy.sweep.curves`.

A run's ε is its own accountant's (the headline, for distributed DP against the server) and, for
distributed DP, also against observers of the released models (``epsilon_observers``): the figure
draws the latter, as the benchmark page does. A run that failed has its exit code and no figures.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedprivacy.sweep.curves import curve_points, curves_markdown, plot_curves, plot_rounds

__all__ = ["CSV_COLUMNS", "render_sweep", "run_row", "sweep_csv", "sweep_markdown"]

CSV_COLUMNS = ("name", "hash", "seed", "status", "exit_code", "privacy", "target_epsilon", "rounds",
               "test_accuracy", "test_loss", "epsilon", "epsilon_observers", "delta",
               "noise_multiplier", "sample_rate", "seconds")


# what a curve's points differ in (the mode and its privacy target), not what tells curves apart
MODE_KEYS = ("privacy", "target-epsilon", "noise-multiplier", "secagg")


def _final(rows: Sequence[Mapping[str, Any]], key: str) -> Any:
    """The last round's value of ``key`` that is not None (rounds without evaluation skipped)."""
    return next((r[key] for r in reversed(rows) if r.get(key) is not None), None)


def run_row(*, name: str, config_hash: str, seed: int, axes: Mapping[str, Any], exit_code: int,
            results: Mapping[str, Any] | None, num_supernodes: int) -> dict[str, Any]:
    """One run's row: what it was, how it ended, what it reached (None where it wrote no results)."""
    res = results or {}
    privacy, config, rounds = res.get("privacy") or {}, res.get("config") or {}, res.get("rounds") or []
    audiences = (privacy.get("distributed") or {}).get("audiences") or {}
    observers = (audiences.get("observers") or {}).get("epsilon")
    status = res.get("status") or ("completed" if exit_code == 0 else "error")
    return {
        "name": name, "hash": config_hash, "seed": seed, "axes": dict(axes), "status": status,
        "exit_code": exit_code, "privacy": config.get("privacy"),
        "target_epsilon": config.get("target-epsilon"), "rounds": len(rounds),
        "test_accuracy": _final(rounds, "test_accuracy"), "test_loss": _final(rounds, "test_loss"),
        "epsilon": privacy.get("epsilon"), "epsilon_observers": observers,
        "delta": privacy.get("delta"), "noise_multiplier": privacy.get("noise_multiplier"),
        "sample_rate": privacy.get("sample_rate"), "seconds": res.get("seconds"),
        "dataset": config.get("dataset"), "num_clients": num_supernodes,
        "cohort_size": privacy.get("cohort_size"), "accountant": privacy.get("accountant"),
        "curve": [(int(r["round"]), float(r["test_accuracy"])) for r in rounds
                  if r.get("test_accuracy") is not None],
    }


def sweep_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """Every run, one line each, the grid's axes as extra columns after :data:`CSV_COLUMNS`."""
    axes = sorted({k for r in rows for k in r.get("axes", {})})
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([*CSV_COLUMNS, *axes])
    for r in rows:
        writer.writerow([("" if r.get(c) is None else r[c]) for c in CSV_COLUMNS]
                        + [r["axes"].get(k, "") for k in axes])
    return buf.getvalue()


def _setup_label(row: Mapping[str, Any]) -> str:
    """What a curve is: the run's axes other than the mode, the privacy target and the noise."""
    rest = {k: v for k, v in row["axes"].items() if k not in MODE_KEYS}
    return ",".join(f"{k}={v}" for k, v in sorted(rest.items())) or str(row.get("dataset") or "sweep")


def _curve_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A run's row as :func:`fedprivacy.sweep.curves.curve_points` reads it."""
    target = row.get("target_epsilon") or None
    if target is None and row.get("privacy") not in (None, "none"):
        target = f"σ={row['axes'].get('noise-multiplier', row.get('noise_multiplier'))}"
    status = "ok" if row["exit_code"] in (0, 3) else "failed"
    return {
        "dataset": row.get("dataset"), "label": _setup_label(row), "rounds": row["rounds"],
        "framework": "fedprivacy", "mode": row.get("privacy"), "target_epsilon": target,
        "status": status, "test_accuracy": row.get("test_accuracy"), "epsilon": row.get("epsilon"),
        "epsilon_audiences": {"observers": row.get("epsilon_observers")}, "seed": row["seed"],
        "noise_multiplier": row.get("noise_multiplier"), "sample_rate": row.get("sample_rate"),
        "delta": row.get("delta"), "epsilon_note": row.get("accountant") or "",
        "num_clients": row.get("num_clients"),
        "clients_per_round": row.get("cohort_size") or "q·N",
    }


def sweep_markdown(rows: Sequence[Mapping[str, Any]], *, title: str = "sweep") -> str:
    """The runs pooled over seeds (the curves' table), then every run that failed with its code."""
    points = curve_points([_curve_row(r) for r in rows], keep=lambda r: True)
    failed = [r for r in rows if r["exit_code"] not in (0, 3)]
    lines = [f"# {title}", "", f"{len(rows)} runs, {len(rows) - len(failed)} finished, "
             f"{len(failed)} failed.", "", curves_markdown(points) or "(no finished run)"]
    if failed:
        lines += ["", "| failed run | hash | exit code | status |", "|---|---|---|---|"]
        lines += [f"| {r['name']} | {r['hash']} | {r['exit_code']} | {r['status']} |" for r in failed]
    return "\n".join(lines) + "\n"


def render_sweep(rows: Sequence[Mapping[str, Any]], outdir: Path, *, title: str = "sweep") -> list[Path]:
    """Write ``sweep.csv``, ``sweep.md``, ``accuracy_vs_epsilon.png`` and ``accuracy_vs_round.png``."""
    outdir.mkdir(parents=True, exist_ok=True)
    written = [outdir / "sweep.csv", outdir / "sweep.md"]
    written[0].write_text(sweep_csv(rows), encoding="utf-8")
    written[1].write_text(sweep_markdown(rows, title=title), encoding="utf-8")
    done = [r for r in rows if r["exit_code"] in (0, 3)]
    points = curve_points([_curve_row(r) for r in done], keep=lambda r: True)
    eps = plot_curves([p for p in points if p["mode"] == "none" or p["epsilon"] is not None], outdir,
                      name="accuracy_vs_epsilon.png", xlabel="ε, as the run's accountant reports it",
                      ylabel="test accuracy")
    series: dict[str, list[list[tuple[int, float]]]] = defaultdict(list)
    for r in done:
        series[r["name"].rsplit(",seed=", 1)[0]].append(list(r["curve"]))
    rounds = plot_rounds(series, outdir / "accuracy_vs_round.png")
    return written + [p for p in (eps, rounds) if p is not None]
