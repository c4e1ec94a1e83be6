"""``fedprivacy simulate``: the Flower app on the in-process engine or on Flower's own engine.

The installed ``fedprivacy`` command (``[project.scripts]``) is :func:`main` here: the library's
accounting commands (:mod:`fedprivacy.cli`, which never imports Flower) plus ``simulate``. Flower is
imported only when ``simulate`` runs, so ``fedprivacy epsilon`` stays fast.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fedprivacy.cli import JsonOpt, new_app, usage_error
from fedprivacy.cli import app as accounting_app
from fedprivacy.cli import main as _run

if TYPE_CHECKING:
    from server.engine.faults import FaultPlan

__all__ = ["ENGINES", "app", "main", "simulate"]

ENGINES = ("inprocess", "flower")


def simulate(  # pylint: disable=too-many-arguments
    *,
    engine: str,
    num_supernodes: int,
    run_config: Mapping[str, Any] | str = "",
    workers: int = 1,
    app_dir: str | Path = ".",
    faults: FaultPlan | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Run the app on the chosen engine; return a JSON-ready summary (used by ``fedprivacy simulate``).

    Both engines read the same ``--run-config`` syntax; a relative ``output-dir`` is made
    absolute so that the results land in this working directory with either engine.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    from server.engine._flwr_private import fuse_dicts
    from server.engine.appspec import absolute_output_dir, load_app_spec, parse_overrides

    spec = load_app_spec(app_dir)
    overrides = parse_overrides(run_config)
    fused = fuse_dicts(spec.default_config, overrides)  # refuses unknown keys up front
    overrides = absolute_output_dir(overrides, fused)
    summary: dict[str, Any] = {"engine": engine, "num_supernodes": num_supernodes}
    if engine == "inprocess":
        summary.update(_on_inprocess(overrides, num_supernodes=num_supernodes, workers=workers,
                                     faults=faults, app_dir=app_dir))
    else:
        if faults is not None or workers != 1:
            raise ValueError("faults and workers apply to the inprocess engine only")
        summary.update(_on_flower(overrides, spec.default_config, num_supernodes=num_supernodes,
                                  app_dir=app_dir, timeout=timeout))
    if summary.get("results_path"):
        summary.update(_final_round(Path(summary["results_path"])))
    return summary


def _on_inprocess(overrides: Mapping[str, Any], *, num_supernodes: int, workers: int,
                  faults: FaultPlan | None, app_dir: str | Path) -> dict[str, Any]:
    from server.engine.run import run_inprocess

    res = run_inprocess(run_config=overrides, num_supernodes=num_supernodes, workers=workers,
                        faults=faults, app_dir=app_dir)
    return {"workers": res.workers, "seconds": res.seconds, "startup_seconds": res.startup_seconds,
            "messages": res.stats.messages, "replies": res.stats.replies, "errors": res.stats.errors,
            "dropped": res.stats.dropped,
            "results_path": None if res.results_path is None else str(res.results_path)}


def _on_flower(overrides: Mapping[str, Any], defaults: Mapping[str, Any], *, num_supernodes: int,
               app_dir: str | Path, timeout: float | None) -> dict[str, Any]:
    """``flwr run`` with a named run, so its ``results.json`` is known (no mtime scan: review D9)."""
    from server.engine._flwr_private import fuse_dicts
    from server.engine.appspec import config_string
    from server.engine.flower import run_flwr

    overrides = dict(overrides)
    if not fuse_dicts(dict(defaults), overrides).get("run-name"):
        overrides["run-name"] = time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
    final = fuse_dicts(dict(defaults), overrides)
    out = run_flwr(run_config=config_string(overrides), num_supernodes=num_supernodes, app_dir=app_dir,
                   timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"flwr run exited with code {out.returncode}")
    path = Path(str(final["output-dir"])) / str(final["run-name"]) / "results.json"
    return {"seconds": out.seconds, "results_path": str(path) if path.is_file() else None}


def _final_round(results_path: Path) -> dict[str, Any]:
    rows = json.loads(results_path.read_text(encoding="utf-8")).get("rounds", [])
    out: dict[str, Any] = {"rounds": len(rows)}
    if rows:
        out["final"] = {k: rows[-1].get(k) for k in ("round", "test_accuracy", "epsilon", "delta")}
    return out


class EngineName(StrEnum):
    inprocess = "inprocess"
    flower = "flower"


def simulate_command(
    engine: Annotated[
        EngineName,
        typer.Option("--engine", help="inprocess (fast, one machine) or flower (flwr run, Ray)."),
    ] = EngineName.inprocess,
    num_supernodes: Annotated[
        int, typer.Option("--num-supernodes", help="Virtual SuperNodes (clients), >= 1.")
    ] = 10,
    run_config: Annotated[
        str,
        typer.Option(
            "--run-config", "-c", help="Overrides, same syntax as `flwr run`: 'k=v k2=\"s\"'."
        ),
    ] = "",
    workers: Annotated[
        int, typer.Option("--workers", help="Processes running clients (inprocess engine), >= 1.")
    ] = 1,
    faults: Annotated[
        str,
        typer.Option(
            "--faults",
            help="Fault plan (inprocess engine), e.g. 'drop:type=train,rounds=2,fraction=0.3;raise:partitions=1'.",
        ),
    ] = "",
    fault_seed: Annotated[int, typer.Option("--fault-seed", help="Seed of the fault plan.")] = 0,
    app_dir: Annotated[
        str, typer.Option("--app-dir", help="Directory holding the app's pyproject.toml.")
    ] = ".",
    as_json: JsonOpt = False,
) -> None:
    """Run the Flower apps on the in-process engine or on Flower's own simulation engine."""
    plan = _checked_options(engine, num_supernodes=num_supernodes, workers=workers, faults=faults,
                            fault_seed=fault_seed)
    try:
        summary = simulate(engine=engine.value, num_supernodes=num_supernodes, run_config=run_config,
                           workers=workers, app_dir=app_dir, faults=plan)
    except (FileNotFoundError, ValueError) as exc:
        usage_error(f"--run-config: {exc}" if "config" in str(exc).lower() else str(exc))
    except RuntimeError as exc:
        typer.echo(f"fedprivacy: error: {exc}", err=True)
        raise typer.Exit(code=1) from exc
    if as_json:
        typer.echo(json.dumps(summary, allow_nan=False, default=str))
        return
    final = summary.get("final") or {}
    typer.echo(
        f"engine {summary['engine']}: {summary.get('rounds', 0)} rounds on {num_supernodes} "
        f"supernodes in {summary.get('seconds', float('nan')):.1f} s; "
        f"final accuracy {final.get('test_accuracy')}, epsilon {final.get('epsilon')}; "
        f"results: {summary.get('results_path')}"
    )


def _checked_options(engine: EngineName, *, num_supernodes: int, workers: int, faults: str,
                     fault_seed: int) -> FaultPlan | None:
    """The options ``simulate`` checks itself (exit 2, one line); the parsed fault plan."""
    if num_supernodes < 1:
        usage_error(f"--num-supernodes must be >= 1, got {num_supernodes}")
    if workers < 1:
        usage_error(f"--workers must be >= 1, got {workers}")
    if engine is EngineName.flower and (workers != 1 or faults):
        usage_error("--workers and --faults apply only to --engine inprocess")
    from server.engine.faults import FaultPlan

    try:
        return FaultPlan.parse(faults, seed=fault_seed) if faults.strip() else None
    except (TypeError, ValueError) as exc:
        usage_error(f"--faults: {exc}")


app = new_app(help="fedprivacy: federated learning with differential privacy. Privacy accounting and simulation.")
app.registered_commands.extend(accounting_app.registered_commands)
app.command(name="simulate")(simulate_command)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fedprivacy`` command; returns the exit code (usage errors: 2, one line)."""
    return _run(argv, command=app)
