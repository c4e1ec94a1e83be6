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
from fedprivacy.exit_codes import ExitCode, exit_code_for
from server.engine.sweep_cli import sweep_command

if TYPE_CHECKING:
    from server.engine.faults import FaultPlan

__all__ = ["ENGINES", "app", "main", "simulate", "summary_line"]

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
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Run the app on the chosen engine; return a JSON-ready summary (used by ``fedprivacy simulate``).

    Both engines read the same ``--run-config`` syntax, and the same :func:`server.engine.preflight.
    preflight` checks it before anything starts; a relative ``output-dir`` is made absolute so that
    the results land in this working directory with either engine. The summary's ``status`` and
    ``exit_code`` are the run's (:mod:`fedprivacy.exit_codes`). ``ray_address`` (flower engine only)
    runs the simulation on that running Ray cluster (:mod:`server.engine.ray_cluster`).

    Raises:
        fedprivacy.config.ConfigError: the configuration is refused, or nothing answers at
            ``ray_address`` (nothing was started).
        server.loop.NoClientsError: (in-process engine) no client answered.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if ray_address is not None and engine != "flower":
        raise ValueError(f"ray_address applies to the flower engine only, got engine {engine!r}")
    from server.engine.preflight import preflight

    pre = preflight(run_config, app_dir=app_dir, num_supernodes=num_supernodes)
    if ray_address is not None:
        _check_cluster(ray_address)
    summary: dict[str, Any] = {"engine": engine, "num_supernodes": num_supernodes}
    if engine == "inprocess":
        summary.update(_on_inprocess(pre.overrides, num_supernodes=num_supernodes, workers=workers,
                                     faults=faults, app_dir=app_dir,
                                     rounds=int(pre.config.num_server_rounds)))
    else:
        if faults is not None or workers != 1:
            raise ValueError("faults and workers apply to the inprocess engine only")
        summary.update(_on_flower(pre.overrides, pre.spec.default_config, num_supernodes=num_supernodes,
                                  app_dir=app_dir, timeout=timeout, ray_address=ray_address))
        if ray_address is not None:
            summary["ray_address"] = ray_address
    if summary.get("results_path"):
        summary.update(_final_round(Path(summary["results_path"])))
    summary.setdefault("status", "error")
    summary["exit_code"] = int(summary.get("exit_code", exit_code_for(summary["status"])))
    summary["num_server_rounds"] = int(pre.config.num_server_rounds)
    return summary


def _check_cluster(ray_address: str) -> None:
    from fedprivacy.config import ConfigError
    from server.engine.ray_cluster import check_reachable

    try:
        check_reachable(ray_address)
    except ValueError as exc:
        raise ConfigError(f"--ray-address: {exc}") from None


def _on_inprocess(overrides: Mapping[str, Any], *, num_supernodes: int, workers: int,
                  faults: FaultPlan | None, app_dir: str | Path, rounds: int) -> dict[str, Any]:
    from server.engine.console import round_progress
    from server.engine.run import run_inprocess

    with round_progress(rounds):  # a live bar on a terminal; plain lines otherwise
        res = run_inprocess(run_config=overrides, num_supernodes=num_supernodes, workers=workers,
                            faults=faults, app_dir=app_dir)
    summary: dict[str, Any] = {
        "workers": res.workers, "seconds": res.seconds, "startup_seconds": res.startup_seconds,
        "results_path": None if res.results_path is None else str(res.results_path)}
    # message, reply, error and drop counts sum the cohorts: only when the run publishes
    # participation; otherwise they stay in the run folder's private log like the per-round counts
    if str(overrides.get("publish-participation", "")).lower() in ("true", "1"):
        summary.update({"messages": res.stats.messages, "replies": res.stats.replies,
                        "errors": res.stats.errors, "dropped": res.stats.dropped})
    return summary


def _on_flower(overrides: Mapping[str, Any], defaults: Mapping[str, Any], *, num_supernodes: int,
               app_dir: str | Path, timeout: float | None, ray_address: str | None) -> dict[str, Any]:
    """``flwr run`` with a named run, so its ``results.json`` is known (never guessed from mtimes); the
    status is the ServerApp's (``flwr run`` itself returns 0 when the ServerApp fails)."""
    from server.engine._flwr_private import fuse_dicts
    from server.engine.appspec import config_string
    from server.engine.flower import run_flwr

    overrides = dict(overrides)
    if not fuse_dicts(dict(defaults), overrides).get("run-name"):
        overrides["run-name"] = time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
    final = fuse_dicts(dict(defaults), overrides)
    out = run_flwr(run_config=config_string(overrides), num_supernodes=num_supernodes, app_dir=app_dir,
                   timeout=timeout, ray_address=ray_address)
    path = Path(str(final["output-dir"])) / str(final["run-name"]) / "results.json"
    status = out.status or {}
    summary: dict[str, Any] = {
        "seconds": out.seconds, "results_path": str(path) if path.is_file() else None,
        "status": status.get("status", "error"), "exit_code": out.exit_code,
    }
    if out.status is None:  # the ServerApp wrote no status: it did not start, or crashed
        summary["message"] = (f"flwr run exited with code {out.returncode}" if out.returncode else
                              "the ServerApp reported no status (it crashed before starting, see the log above)")
    elif status.get("message"):
        summary["message"] = status["message"]
    return summary


def _final_round(results_path: Path) -> dict[str, Any]:
    results = json.loads(results_path.read_text(encoding="utf-8"))
    rows = results.get("rounds", [])
    out: dict[str, Any] = {"rounds": len(rows), "status": results.get("status", "error"),
                           "resumed": results.get("resumed", [])}
    if results.get("stopped"):
        out["message"] = results["stopped"]
    if rows:
        out["final"] = {k: rows[-1].get(k) for k in ("round", "test_accuracy", "epsilon", "delta")}
        # the run's own ε (what its "done:" line and report print): the larger of the audiences' figures
        # where the run says so; strict JSON writes an infinite ε as null
        privacy = results.get("privacy") or {}
        if privacy.get("mode", "none") != "none":
            eps = privacy.get("epsilon")
            out["final"]["epsilon"] = float("inf") if eps is None else eps
            out["final"]["delta"] = privacy.get("delta", out["final"]["delta"])
    return out


def summary_line(summary: Mapping[str, Any]) -> str:
    """One human line for a run summary: rounded figures, no raw floats, no ``epsilon None``."""
    final = summary.get("final") or {}
    parts = [f"engine {summary['engine']}: {summary.get('status')}, {summary.get('rounds', 0)}/"
             f"{summary.get('num_server_rounds', '?')} rounds on {summary['num_supernodes']} supernodes "
             f"in {float(summary.get('seconds') or 0.0):.1f} s"]
    if final.get("test_accuracy") is not None:
        parts.append(f"accuracy {final['test_accuracy']:.4f}")
    if final.get("epsilon") is not None:
        parts.append(f"ε {final['epsilon']:.3f} at δ={final.get('delta'):g}")
    elif summary.get("rounds"):
        parts.append("no DP (ε not accounted)")
    parts.append(f"results: {summary.get('results_path') or 'none'}")
    return "; ".join(parts)


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
            help="Fault plan (inprocess engine): rules 'action:key=value,...' joined by ';', e.g. "
                 "'raise:partitions=1' (docs/ENGINE.md).",
        ),
    ] = "",
    fault_seed: Annotated[int, typer.Option("--fault-seed", help="Seed of the fault plan.")] = 0,
    app_dir: Annotated[
        str, typer.Option("--app-dir", help="Directory holding the app's pyproject.toml.")
    ] = ".",
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="flower engine: run on this running Ray cluster, 'auto' or "
                                           "HOST:PORT of its head (docs/ENGINE.md); default: a private Ray."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the Flower apps on the in-process engine or on Flower's own simulation engine.

    Exit codes: 0 completed, 1 error, 2 bad configuration (nothing started), 3 budget stop,
    4 client failures, 5 no SuperNode answered, 130 interrupted (README "Exit codes").
    """
    plan = _checked_options(engine, num_supernodes=num_supernodes, workers=workers, faults=faults,
                            fault_seed=fault_seed, ray_address=ray_address)
    summary = _guarded_simulate(engine=engine.value, num_supernodes=num_supernodes,
                                run_config=run_config, workers=workers, app_dir=app_dir, faults=plan,
                                ray_address=ray_address)
    if as_json:
        from fedprivacy.fl.outputs import clean_json

        typer.echo(json.dumps(clean_json(summary), allow_nan=False, default=str))
    else:
        typer.echo(summary_line(summary))
    if summary["exit_code"] != 0:
        typer.echo(f"fedprivacy: {summary['status']}: {summary.get('message') or 'see the log above'}",
                   err=True)
        raise typer.Exit(code=summary["exit_code"])


def _guarded_simulate(**kwargs: Any) -> dict[str, Any]:
    """:func:`simulate`, every failure turned into one line on stderr and its exit code."""
    from fedprivacy.config import ConfigError
    from server.engine.processes import signals_interrupt

    try:
        with signals_interrupt():
            return simulate(**kwargs)
    except (ConfigError, FileNotFoundError) as exc:
        usage_error(str(exc))
    except KeyboardInterrupt as exc:
        what = str(exc) or "SIGINT"
        typer.echo(f"fedprivacy: interrupted ({what}): the run and the processes it started were stopped",
                   err=True)
        raise typer.Exit(code=ExitCode.INTERRUPTED) from None
    except Exception as exc:  # noqa: BLE001 - a command-line tool reports, it does not dump a traceback
        from server.loop import NoClientsError

        code = ExitCode.NO_CLIENTS if isinstance(exc, NoClientsError) else ExitCode.ERROR
        name = "no-clients" if code == ExitCode.NO_CLIENTS else f"error: {type(exc).__name__}"
        typer.echo(f"fedprivacy: {name}: {str(exc).splitlines()[0] if str(exc) else ''}", err=True)
        raise typer.Exit(code=code) from None


def _checked_options(engine: EngineName, *, num_supernodes: int, workers: int, faults: str,
                     fault_seed: int, ray_address: str | None = None) -> FaultPlan | None:
    """The options ``simulate`` checks itself (exit 2, one line); the parsed fault plan."""
    if ray_address is not None:
        from server.engine.ray_cluster import check_ray_address

        if engine is not EngineName.flower:
            usage_error(f"--ray-address applies only to --engine flower, got --engine {engine.value}")
        try:
            check_ray_address(ray_address)
        except ValueError as exc:
            usage_error(f"--ray-address: {exc}")
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


def _config_keys_epilog() -> str:
    """The run-config keys, for ``simulate --help`` (the flat fields of the one typed config)."""
    import dataclasses

    from fedprivacy.config import RunConfig

    keys = ", ".join(f.name.replace("_", "-") for f in dataclasses.fields(RunConfig))
    return ("Run-config keys for --run-config (defaults: pyproject.toml, table tool.flwr.app.config; meanings: "
            "README, "
            f"Configuration): {keys}.")


app = new_app(help="fedprivacy: federated learning with differential privacy. `epsilon` and `noise`: "
                   "privacy accounting from the shell; `simulate`: a federated run on the in-process "
                   "engine or on Flower's; `sweep`: a grid of runs x seeds in parallel, resumable.")
app.registered_commands.extend(accounting_app.registered_commands)
app.command(name="simulate", epilog=_config_keys_epilog())(simulate_command)
app.command(name="sweep")(sweep_command)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fedprivacy`` command; returns the exit code (usage errors: 2, one line)."""
    return _run(argv, command=app)
