"""``fedprivacy sweep``: the runs of a sweep file, in parallel on the in-process engine, resumable.

Every run is checked (:func:`server.engine.preflight.preflight`) before the first one starts; a bad
one refuses the whole sweep with one line naming the run and the key. Each run is then one
``fedprivacy simulate`` process (its own workers, its own exit code), at most ``jobs`` at a time,
writing under ``<out>/runs/<config hash>/``; when it exits the sweep records its exit code in
``sweep-run.json`` there. A restarted sweep skips every run whose record says it finished (exit
code 0, or 3: stopped by its privacy budget) and runs the rest from scratch, so a killed sweep
resumes with nothing finished re-run. A failed run is reported with its exit code and log and does
not stop the others. At the end, :func:`fedprivacy.sweep.table.render_sweep` writes the table and
the figures. The run processes die with the sweep (``PR_SET_PDEATHSIG`` on Linux).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fedprivacy._io import atomic_write_text
from fedprivacy.config import ConfigError
from fedprivacy.sweep.spec import RunPlan, SweepSpec, config_hash, tracking_overrides
from fedprivacy.sweep.table import render_sweep, run_row

__all__ = ["FINISHED", "SweepOutcome", "SweepRun", "default_jobs", "prepare", "run_sweep"]

FINISHED = (0, 3)  # completed, or stopped by the budget: the run is over and is not run again
RECORD = "sweep-run.json"
_CHILD = "import sys; from server.engine.cli import main; sys.exit(main(sys.argv[1:]))"


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepRun:
    """One checked run: its plan, its hash, its folder and the overrides its process gets."""

    plan: RunPlan
    config_hash: str
    run_dir: Path
    overrides: dict[str, Any]

    @property
    def results_path(self) -> Path:
        return self.run_dir / "run" / "results.json"

    @property
    def log_path(self) -> Path:
        return self.run_dir / "log.txt"


@dataclass(slots=True, kw_only=True)
class SweepOutcome:
    """What a sweep did: one row per run (in plan order), the runs it skipped, ran and saw fail."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0
    ran: int = 0
    failed: int = 0
    seconds: float = 0.0
    written: list[Path] = field(default_factory=list)


def default_jobs(workers: int) -> int:
    """As many runs at a time as the cores allow, each with ``workers`` client processes."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, workers))


def prepare(spec: SweepSpec, *, out: Path, app_dir: str | Path) -> list[SweepRun]:
    """Check every run of ``spec`` (nothing starts); ConfigError names the run and the key."""
    from server.engine.preflight import preflight

    runs: list[SweepRun] = []
    seen: dict[str, str] = {}
    for plan in spec.plans():
        try:
            pre = preflight(dict(plan.overrides), app_dir=app_dir, num_supernodes=spec.num_supernodes)
        except ConfigError as exc:
            raise ConfigError(f"sweep run {plan.name}: {exc}") from None
        digest = config_hash(pre.fused, num_supernodes=spec.num_supernodes)
        if digest in seen:
            raise ConfigError(f"sweep runs {seen[digest]} and {plan.name} are the same run "
                              f"(config hash {digest}): drop one from the grid")
        seen[digest] = plan.name
        run_dir = (out / "runs" / digest).absolute()
        overrides = {**pre.overrides, "output-dir": str(run_dir), "run-name": "run",
                     **tracking_overrides(pre.fused, out=out, sweep=spec.name, digest=digest)}
        runs.append(SweepRun(plan=plan, config_hash=digest, run_dir=run_dir, overrides=overrides))
    return runs


def read_record(run: SweepRun) -> dict[str, Any] | None:
    """The run's record, when its process exited before (any exit code); None otherwise."""
    try:
        return dict(json.loads((run.run_dir / RECORD).read_text(encoding="utf-8")))
    except (FileNotFoundError, ValueError):
        return None


def _row(run: SweepRun, exit_code: int, num_supernodes: int) -> dict[str, Any]:
    try:
        results = json.loads(run.results_path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        results = None
    return run_row(name=run.plan.name, config_hash=run.config_hash, seed=run.plan.seed,
                   axes=run.plan.axes, exit_code=exit_code, results=results,
                   num_supernodes=num_supernodes)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the run process gets SIGKILL when the sweep dies, even by SIGKILL."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _start(run: SweepRun, *, spec: SweepSpec, app_dir: str | Path) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
    """Start the run's ``fedprivacy simulate`` process from a clean folder, its output to ``log.txt``."""
    from server.engine.appspec import config_string

    if run.run_dir.exists():
        shutil.rmtree(run.run_dir)  # an unfinished earlier attempt: run again from scratch
    events = run.overrides.get("tracking-dir")
    if events and (Path(events) / run.config_hash).exists():
        shutil.rmtree(Path(events) / run.config_hash)  # and its TensorBoard events
    run.run_dir.mkdir(parents=True)
    log = open(run.log_path, "wb")  # closed when the process is reaped
    argv = [sys.executable, "-c", _CHILD, "simulate", "--app-dir", str(Path(app_dir).absolute()),
            "--num-supernodes", str(spec.num_supernodes), "--workers", str(spec.workers),
            "--run-config", config_string(run.overrides)]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    return proc, log


Event = Callable[[str, SweepRun, dict[str, Any] | None], None]


def _reap(running: dict[int, tuple[SweepRun, subprocess.Popen[bytes], IO[bytes], float]],
          spec: SweepSpec, outcome: SweepOutcome, rows: dict[str, dict[str, Any]], on_event: Event) -> None:
    """Record every run process that exited: its record on disk, its row, one event."""
    for pid, (run, proc, log, started) in list(running.items()):
        code = proc.poll()
        if code is None:
            continue
        log.close()
        del running[pid]
        record = {"name": run.plan.name, "hash": run.config_hash, "seed": run.plan.seed,
                  "exit_code": code, "seconds": time.monotonic() - started,
                  "overrides": {k: v for k, v in run.overrides.items() if k != "output-dir"}}
        atomic_write_text(run.run_dir / RECORD, json.dumps(record, indent=1, default=str))
        rows[run.config_hash] = _row(run, code, spec.num_supernodes)
        outcome.ran += 1
        outcome.failed += code not in FINISHED
        on_event("done" if code in FINISHED else "failed", run, rows[run.config_hash])


def _stop(running: dict[int, tuple[SweepRun, subprocess.Popen[bytes], IO[bytes], float]]) -> None:
    """Stop every run process (SIGTERM, then SIGKILL after 10 s); no record is written for them."""
    for _run, proc, _log, _t in running.values():
        proc.terminate()
    deadline = time.monotonic() + 10.0
    for _run, proc, log, _t in running.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _prepare_stores(runs: Sequence[SweepRun]) -> None:
    """Each MLflow store and experiment the runs share, made once before they start in parallel."""
    stores = {(str(r.overrides["tracking-uri"]), str(r.overrides["tracking-experiment"]))
              for r in runs if "tracking-uri" in r.overrides}
    if stores:
        from fedprivacy.fl.tracking import prepare_mlflow

        for uri, experiment in sorted(stores):
            prepare_mlflow(uri, experiment)


def run_sweep(spec: SweepSpec, runs: Sequence[SweepRun], *, out: Path, app_dir: str | Path = ".",
              jobs: int = 0, on_event: Event | None = None) -> SweepOutcome:
    """Run what has not finished, ``jobs`` at a time (0: :func:`default_jobs`); render at the end.

    ``on_event(kind, run, row)`` is told ``"skipped"``, ``"started"``, ``"done"`` and ``"failed"``.
    An interrupt (Ctrl-C, SIGTERM) stops the running processes and re-raises; what finished stays.
    """
    from server.engine.processes import signals_interrupt

    on_event = on_event or (lambda kind, run, row: None)
    jobs = jobs or spec.jobs or default_jobs(spec.workers)
    outcome, rows, t0 = SweepOutcome(), {}, time.monotonic()
    pending: list[SweepRun] = []
    for run in runs:
        record = read_record(run)
        if record is not None and record.get("exit_code") in FINISHED:
            rows[run.config_hash] = _row(run, int(record["exit_code"]), spec.num_supernodes)
            outcome.skipped += 1
            on_event("skipped", run, rows[run.config_hash])
        else:
            pending.append(run)
    _prepare_stores(pending)
    running: dict[int, tuple[SweepRun, subprocess.Popen[bytes], IO[bytes], float]] = {}
    with signals_interrupt():
        try:
            while pending or running:
                while pending and len(running) < jobs:
                    run = pending.pop(0)
                    proc, log = _start(run, spec=spec, app_dir=app_dir)
                    running[proc.pid] = (run, proc, log, time.monotonic())
                    on_event("started", run, None)
                time.sleep(0.2)
                _reap(running, spec, outcome, rows, on_event)
        except BaseException:
            _stop(running)
            raise
    outcome.rows = [rows[r.config_hash] for r in runs]
    outcome.seconds = time.monotonic() - t0
    outcome.written = render_sweep(outcome.rows, out, title=spec.name)
    return outcome
