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

from fedprivacy.cli import JsonOpt, usage_error
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
    from server.engine.appspec import (
        absolute_output_dir,
        config_string,
        load_app_spec,
        parse_overrides,
    )
    from server.engine.flower import run_flwr
    from server.engine.run import run_inprocess

    spec = load_app_spec(app_dir)
    overrides = parse_overrides(run_config)
    fused = fuse_dicts(spec.default_config, overrides)  # refuses unknown keys up front
    overrides = absolute_output_dir(overrides, fused)
    summary: dict[str, Any] = {"engine": engine, "num_supernodes": num_supernodes}
    if engine == "inprocess":
        res = run_inprocess(
            run_config=overrides,
            num_supernodes=num_supernodes,
            workers=workers,
            faults=faults,
            app_dir=app_dir,
        )
        summary.update(
            workers=res.workers,
            seconds=res.seconds,
            startup_seconds=res.startup_seconds,
            messages=res.stats.messages,
            replies=res.stats.replies,
            errors=res.stats.errors,
            dropped=res.stats.dropped,
            results_path=None if res.results_path is None else str(res.results_path),
        )
    else:
        if faults is not None or workers != 1:
            raise ValueError("faults and workers apply to the inprocess engine only")
        if not fused.get("run-name"):  # name the run, so its results.json is known (no mtime scan: D9)
            overrides = {**overrides, "run-name": time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)}
        final = fuse_dicts(spec.default_config, overrides)
        out = run_flwr(run_config=config_string(overrides), num_supernodes=num_supernodes,
                       app_dir=app_dir, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"flwr run exited with code {out.returncode}")
        path = Path(str(final["output-dir"])) / str(final["run-name"]) / "results.json"
        summary.update(seconds=out.seconds, results_path=str(path) if path.is_file() else None)
    if summary.get("results_path"):
        results = json.loads(Path(summary["results_path"]).read_text(encoding="utf-8"))
        rows = results.get("rounds", [])
        summary["rounds"] = len(rows)
        if rows:
            summary["final"] = {
                k: rows[-1].get(k) for k in ("round", "test_accuracy", "epsilon", "delta")
            }
    return summary


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
    if num_supernodes < 1:
        usage_error(f"--num-supernodes must be >= 1, got {num_supernodes}")
    if workers < 1:
        usage_error(f"--workers must be >= 1, got {workers}")
    if engine is EngineName.flower and (workers != 1 or faults):
        usage_error("--workers and --faults apply only to --engine inprocess")
    from server.engine.faults import FaultPlan

    try:
        plan = FaultPlan.parse(faults, seed=fault_seed) if faults.strip() else None
    except (TypeError, ValueError) as exc:
        usage_error(f"--faults: {exc}")
    try:
        summary = simulate(
            engine=engine.value,
            num_supernodes=num_supernodes,
            run_config=run_config,
            workers=workers,
            app_dir=app_dir,
            faults=plan,
        )
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


app = typer.Typer(
    name="fedprivacy",
    help="fedprivacy: federated learning with differential privacy. Privacy accounting and simulation.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.registered_commands.extend(accounting_app.registered_commands)
app.command(name="simulate")(simulate_command)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fedprivacy`` command; returns the exit code (usage errors: 2, one line)."""
    return _run(argv, command=app)
