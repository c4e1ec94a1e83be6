"""The scripts' side of ``flwr run``: check first, name the run, launch, report the run's real exit code.

``scripts/flwr_local.py`` (simulation) is a thin ``main()`` over :func:`launch_flwr`. Nothing is started for a configuration that
:func:`server.engine.preflight.preflight` refuses (one line, exit code 2); Ctrl-C, SIGTERM and SIGHUP
print one line and stop every process of the run (exit code 130).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedprivacy.config import ConfigError
from fedprivacy.exit_codes import ExitCode
from server.engine.appspec import config_string, load_app_spec, parse_overrides
from server.engine.flower import FlwrRunResult, run_flwr
from server.engine.preflight import Preflight, preflight
from server.engine.processes import signals_interrupt

__all__ = ["checked_run", "launch_flwr", "report"]


def _err(prog: str, line: str) -> None:
    print(f"{prog}: {line}", file=sys.stderr, flush=True)


def checked_run(run_config: str, *, app_dir: Path, num_supernodes: int, default_output_dir: Path,
                run_name: str) -> Preflight:
    """Preflight with the scripts' defaults: results under ``default_output_dir``, and a named run
    (``run_name`` when the config leaves ``run-name`` empty) so the results are known afterwards."""
    try:
        overrides = parse_overrides(run_config) if run_config else {}
    except ValueError as exc:
        raise ConfigError(f"--run-config: {exc}") from exc
    overrides.setdefault("output-dir", str(default_output_dir))
    defaults = load_app_spec(app_dir).default_config
    if not overrides.get("run-name", defaults.get("run-name")):
        overrides["run-name"] = run_name
    return preflight(overrides, app_dir=app_dir, num_supernodes=num_supernodes)


def report(prog: str, pre: Preflight, res: FlwrRunResult) -> int:
    """Print the run's outcome in one line (and its reason on stderr); return its exit code."""
    status = res.status or {}
    code = res.exit_code
    cfg = pre.config
    results = Path(cfg.output_dir) / cfg.run_name / "results.json"
    where = str(results) if results.is_file() else "none"
    print(f"{prog}: {status.get('status', 'error')} (exit code {code}) in {res.seconds:.1f} s; "
          f"results: {where}", flush=True)
    if code != 0:
        why = status.get("message") or (
            f"flwr run exited with code {res.returncode}" if res.returncode else
            "the ServerApp reported no status (it did not start or crashed; see the log above)")
        _err(prog, f"{status.get('status', 'error')}: {why}")
    return code


def launch_flwr(*, num_supernodes: int, run_config: str, app_dir: Path, default_output_dir: Path,
                run_name: str, prog: str, flwr_home: Path | None = None, timeout: float | None = None,
                runner: Callable[..., FlwrRunResult] = run_flwr, **runner_kwargs: Any) -> int:
    """Check, run (``runner``, default :func:`run_flwr`), report; returns the exit code."""
    try:
        pre = checked_run(run_config, app_dir=app_dir, num_supernodes=num_supernodes,
                          default_output_dir=default_output_dir, run_name=run_name)
    except (ConfigError, FileNotFoundError) as exc:
        _err(prog, f"error: {exc}")
        return int(ExitCode.CONFIG)
    try:
        with signals_interrupt():
            res = runner(num_supernodes=num_supernodes, run_config=config_string(pre.overrides),
                         app_dir=app_dir, flwr_home=flwr_home, timeout=timeout, echo=True,
                         **runner_kwargs)
    except KeyboardInterrupt as exc:
        _err(prog, f"interrupted ({str(exc) or 'SIGINT'}): the run and the processes it started were stopped")
        return int(ExitCode.INTERRUPTED)
    return report(prog, pre, res)
