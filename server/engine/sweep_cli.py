"""The ``fedprivacy sweep`` command: options, progress (rich on a terminal, plain lines otherwise),
the closing summary and its exit code (0 when every run finished, 1 when one failed, 2 for a bad
sweep file or option, 130 when interrupted)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fedprivacy.cli import JsonOpt, usage_error
from fedprivacy.exit_codes import ExitCode

if TYPE_CHECKING:
    from fedprivacy.sweep.spec import SweepSpec
    from server.engine.sweep import SweepOutcome, SweepRun

__all__ = ["sweep_command"]


def _line(kind: str, run: SweepRun, row: dict[str, Any] | None) -> str:
    """One plain line per event of a run."""
    if kind == "started":
        return f"sweep: started {run.plan.name} ({run.config_hash})"
    if kind == "failed":
        return (f"sweep: FAILED {run.plan.name} ({run.config_hash}): exit code {row and row['exit_code']}, "
                f"log {run.log_path}")
    acc, eps = (row or {}).get("test_accuracy"), (row or {}).get("epsilon")
    figures = (f"accuracy {acc:.4f}" if acc is not None else "no accuracy") + (
        f", ε {eps:.3f}" if eps is not None else ", no DP")
    return f"sweep: {'finished before' if kind == 'skipped' else 'done'} {run.plan.name}: {figures}"


def _load(sweep_file: Path | None, *, sets: list[str], grid: list[str], seeds: str,
          num_supernodes: int | None) -> SweepSpec:
    from fedprivacy.sweep.spec import load_sweep, sweep_from_options

    spec = load_sweep(sweep_file) if sweep_file is not None else None
    return sweep_from_options(spec, sets=sets, grid=grid, seeds=seeds, num_supernodes=num_supernodes)


def _run_with_progress(spec: SweepSpec, runs: list[SweepRun], *, out: Path, app_dir: str,
                       jobs: int) -> SweepOutcome:
    """The sweep, with a rich bar of the runs on a terminal (stderr), plain lines otherwise."""
    from rich.console import Console

    from server.engine.sweep import run_sweep

    console = Console(stderr=True)
    if not console.is_terminal:
        return run_sweep(spec, runs, out=out, app_dir=app_dir, jobs=jobs,
                         on_event=lambda k, r, row: typer.echo(_line(k, r, row), err=True))
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[state]}"), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("runs", total=len(runs), state="")
        counts = {"started": 0, "done": 0, "failed": 0, "skipped": 0}

        def event(kind: str, run: SweepRun, row: dict[str, Any] | None) -> None:
            counts[kind] += 1
            if kind != "started":
                bar.advance(task)
                if kind == "failed":
                    bar.console.print(_line(kind, run, row))
            running = counts["started"] - counts["done"] - counts["failed"]
            bar.update(task, state=f"running {running}, failed {counts['failed']}, "
                                   f"resumed {counts['skipped']}")

        return run_sweep(spec, runs, out=out, app_dir=app_dir, jobs=jobs, on_event=event)


def _summary(outcome: SweepOutcome, out: Path) -> dict[str, Any]:
    return {"runs": len(outcome.rows), "ran": outcome.ran, "skipped": outcome.skipped,
            "failed": outcome.failed, "seconds": round(outcome.seconds, 3), "out": str(out),
            "written": [str(p) for p in outcome.written],
            "failures": [{"name": r["name"], "hash": r["hash"], "exit_code": r["exit_code"]}
                         for r in outcome.rows if r["exit_code"] not in (0, 3)]}


def sweep_command(
    sweep_file: Annotated[Path | None, typer.Argument(help="Sweep file (TOML: [sweep], [base], [grid]).")] = None,
    out: Annotated[str, typer.Option("--out", help="Folder of the sweep (default sweeps/<name>).")] = "",
    jobs: Annotated[int, typer.Option("--jobs", help="Runs at a time; 0 = as the cores allow.")] = -1,
    sets: Annotated[list[str] | None, typer.Option("--set", help="k=v into [base] (repeatable).")] = None,
    grid: Annotated[list[str] | None, typer.Option("--grid", help="k=v1,v2 axis (repeatable).")] = None,
    seeds: Annotated[str, typer.Option("--seeds", help="Seeds, e.g. 0,1,2 (replaces sweep.seeds).")] = "",
    num_supernodes: Annotated[int | None, typer.Option("--num-supernodes", help="Clients per run.")] = None,
    app_dir: Annotated[str, typer.Option("--app-dir", help="Directory holding the app's pyproject.toml.")] = ".",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check and list the runs; run nothing.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run a grid of run configs x seeds on the in-process engine, in parallel; resume after a kill.

    Writes <out>/sweep.csv, sweep.md, accuracy_vs_epsilon.png and accuracy_vs_round.png. A run that
    finished before (same config hash) is not run again.
    """
    from fedprivacy.config import ConfigError
    from server.engine.processes import Interrupted
    from server.engine.sweep import prepare

    try:
        spec = _load(sweep_file, sets=sets or [], grid=grid or [], seeds=seeds,
                     num_supernodes=num_supernodes)
        if jobs < -1:
            raise ConfigError(f"--jobs must be >= 0, got {jobs}")
        folder = Path(out or Path("sweeps") / spec.name)
        runs = prepare(spec, out=folder, app_dir=app_dir)
    except (ConfigError, FileNotFoundError) as exc:
        usage_error(str(exc))
    if dry_run:
        for run in runs:
            typer.echo(f"{run.config_hash}  {run.plan.name}")
        return
    try:
        outcome = _run_with_progress(spec, runs, out=folder, app_dir=app_dir,
                                     jobs=spec.jobs if jobs == -1 else jobs)
    except (KeyboardInterrupt, Interrupted):
        typer.echo("fedprivacy: sweep interrupted: finished runs are kept; run the same command to "
                   "resume", err=True)
        raise typer.Exit(code=ExitCode.INTERRUPTED) from None
    summary = _summary(outcome, folder)
    typer.echo(json.dumps(summary) if as_json else
               f"sweep {spec.name}: {summary['runs']} runs ({outcome.ran} ran, {outcome.skipped} finished "
               f"before, {outcome.failed} failed) in {outcome.seconds:.1f} s; table {folder / 'sweep.md'}")
    if outcome.failed:
        raise typer.Exit(code=ExitCode.ERROR)
