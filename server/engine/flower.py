"""The same app on Flower's own engines: Ray simulation in this process, or ``flwr run`` as a subprocess.

``run_flwr`` is the one launcher of ``flwr run`` (the README's main command ``scripts/flwr_local.py``,
``fedprivacy simulate --engine flower`` and the end-to-end tests all use it). It

* points ``FLWR_HOME`` at a private folder (a fresh temporary one unless ``flwr_home`` is given), so the
  user's ``~/.flwr`` is untouched and the legacy ``[tool.flwr.federations]`` migration stays local;
* turns off runtime dependency installation (everything is in the venv) and telemetry;
* picks free ports for the local SuperLink, so parallel runs never talk to each other's SuperLink;
* runs ``flwr run <app> --federation-config "num-supernodes=N ..." --stream`` (without ``--stream``
  ``flwr run`` returns as soon as the run is submitted), forwarding its output line by line without
  Flower's "default simulated SuperNodes changed" warning, which it logs even though N is given
  (:mod:`server.engine.flwr_output`);
* afterwards stops what *this* run started and nothing else: the detached ``flower-superlink`` whose
  command line or environment names this ``FLWR_HOME``, its descendants, and the Flower/Ray processes
  that inherited this ``FLWR_HOME`` (Ray re-parents its actors to init). Processes of other users or
  other runs never carry our private ``FLWR_HOME``, so they are never touched (review defect D2).
  The same happens if the launcher is interrupted or killed, even by SIGKILL
  (:mod:`server.engine.processes`: a watchdog and the parent-death signal);
* reports the run's real outcome: ``flwr run`` returns 0 even when the ServerApp failed, so the
  ServerApp writes its status to ``$FEDPRIVACY_STATUS_FILE`` and :attr:`FlwrRunResult.exit_code`
  is read from it (:mod:`fedprivacy.exit_codes`).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import Context

from fedprivacy.exit_codes import STATUS_ENV, ExitCode, read_status
from fedprivacy.fl.client_policy import ENV_VAR
from server.engine._flwr_private import fuse_dicts, run_simulation_as_flwr_run
from server.engine.appspec import app_root, load_app_spec, parse_overrides
from server.engine.flwr_output import run_forwarding
from server.engine.processes import Watchdog, stop_processes, stop_started_by
from server.engine.ray_cluster import ray_env
from server.engine.run import forget_run_memory, make_run, server_context

__all__ = ["FlwrRunResult", "flwr_env", "free_port", "run_flower_simulation", "run_flwr", "status_path",
           "stop_processes", "stop_started_by"]


def run_flower_simulation(  # pylint: disable=too-many-arguments
    *,
    run_config: Mapping[str, Any] | str = "",
    num_supernodes: int,
    app_dir: str | Path = ".",
    backend_config: Mapping[str, Any] | None = None,
    server_app: str | None = None,
    client_app: str | None = None,
) -> Context:
    """Run the same app on Flower's Ray Simulation Engine, in this process.

    ``flwr.simulation.run_simulation`` has no run-config argument, so this calls the function
    ``flwr run`` itself uses inside its simulation process (see
    :func:`server.engine._flwr_private.run_simulation_as_flwr_run`): the ClientApps get the fused run
    config from ``app_dir`` plus the overrides carried by the ``Run``, and the ServerApp gets it in its
    Context. Returns the ServerApp's final Context. The clients' floor (``FEDPRIVACY_CLIENT_POLICY``) is
    the one the run asks for, as with ``flwr run``; Ray must not be initialised yet in this process
    (its workers take the environment of the first ``ray.init``).
    """
    from server.engine.appspec import simulation_node_config

    spec = load_app_spec(app_dir)
    overrides = parse_overrides(run_config)
    fused = fuse_dicts(spec.default_config, overrides)
    # The simulated clients' floor, as `flwr run` (run_flwr) and the in-process engine give it: without
    # it every client refused e.g. privacy 'none' (code defaults: distributed or local only) and a
    # "round" here was 100 refusals (the Ray figures). Ray's processes, started below, inherit
    # this process's environment.
    policy = dict(simulation_node_config(fused))
    saved = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = json.dumps(policy)
    try:
        return _run_on_ray(spec, overrides, fused, num_supernodes=num_supernodes,
                           backend_config=backend_config, server_app=server_app, client_app=client_app)
    finally:
        if saved is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = saved


def _run_on_ray(spec: Any, overrides: dict[str, Any], fused: dict[str, Any], *, num_supernodes: int,
                backend_config: Mapping[str, Any] | None, server_app: str | None,
                client_app: str | None) -> Context:
    from server.engine._flwr_private import TaskIdentityScope

    run_id = secrets.randbits(63) | 1
    run = make_run(spec, overrides, run_id)
    context = server_context(run_id, fused)
    config: dict[str, Any] = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
    config.update(dict(backend_config or {}))
    try:
        with TaskIdentityScope(run_id):
            result = run_simulation_as_flwr_run(
                server_app_attr=server_app or spec.server_app_ref,
                client_app_attr=client_app or spec.client_app_ref,
                num_supernodes=num_supernodes, backend_name="ray", backend_config=config,
                app_dir=str(spec.app_dir), run=run, server_app_context=context)
    finally:
        forget_run_memory(run_id)  # the simulated clients' memory of this run goes with it
    return result.context  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- flwr run


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flwr_env(flwr_home: Path) -> dict[str, str]:
    """Environment for an offline, isolated ``flwr`` invocation under ``flwr_home``."""
    env = dict(os.environ)
    env.update({
        "FLWR_HOME": str(flwr_home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
        # flwr spawns `flower-superlink` / `flwr-simulation` by name: find them beside this Python.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    })
    return env


def status_path(flwr_home: Path) -> Path:
    """Where the ServerApp of a run under ``flwr_home`` writes its status (``$FEDPRIVACY_STATUS_FILE``).

    A SuperLink started by hand (the Deployment Engine) must carry the variable too: its ServerApp
    process inherits the SuperLink's environment, not ``flwr run``'s.
    """
    return flwr_home / "fedprivacy-status.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class FlwrRunResult:
    """Exit code and (if captured) console output of ``flwr run``, and the ServerApp's own status.

    Attributes:
        returncode: the exit code of ``flwr run`` itself (0 even when the ServerApp failed).
        output: the merged stdout/stderr when captured, else None.
        seconds: wall time.
        stopped: pids of the processes the run left behind and we stopped.
        status: what the ServerApp wrote to its status file (:mod:`fedprivacy.exit_codes`), or None
            when it wrote nothing (it never started, or died without a word).
    """

    returncode: int
    output: str | None
    seconds: float
    stopped: tuple[int, ...] = ()
    status: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        """The run's exit code: the ServerApp's status if it wrote one, else an error (1) unless
        ``flwr run`` itself failed (then its code)."""
        if self.returncode != 0:
            return self.returncode
        if self.status is None:
            return int(ExitCode.ERROR)
        return int(self.status.get("exit_code", ExitCode.ERROR))


def flwr_command(*, app_dir: Path, num_supernodes: int, run_config: str, federation_config: str,
                 connection: str | None = None) -> list[str]:
    """``flwr run`` on the local simulation (``--federation-config``) or on a named ``connection``."""
    flwr = shutil.which("flwr", path=str(Path(sys.executable).parent)) or "flwr"
    if connection is not None:
        cmd = [flwr, "run", str(app_dir), connection, "--stream"]
    else:
        fed = f"num-supernodes={num_supernodes} {federation_config}".strip()
        cmd = [flwr, "run", str(app_dir), "--federation-config", fed, "--stream"]
    if run_config.strip():
        cmd += ["--run-config", run_config]
    return cmd


def _client_policy(app: Path, run_config: str) -> dict[str, Any]:
    """The simulated clients' floor: the run the user asked for (pyproject defaults + overrides)."""
    from server.engine.appspec import simulation_node_config

    try:
        fused = fuse_dicts(load_app_spec(app).default_config, parse_overrides(run_config))
        return dict(simulation_node_config(fused))
    except (ValueError, OSError):
        return {}


def run_flwr(  # pylint: disable=too-many-arguments
    *,
    num_supernodes: int,
    run_config: str = "",
    app_dir: str | Path = ".",
    federation_config: str = "client-resources-num-cpus=1",
    flwr_home: Path | None = None,
    timeout: float | None = None,
    capture: bool = False,
    echo: bool = False,
    connection: str | None = None,
    ray_address: str | None = None,
) -> FlwrRunResult:
    """``flwr run <app_dir> --stream`` on a local simulation; stops only what this run started.

    Args:
        num_supernodes: simulated SuperNodes.
        run_config: overrides in ``flwr run --run-config`` syntax.
        app_dir: the app (its ``pyproject.toml``); also the working directory of ``flwr``.
        federation_config: further ``--federation-config`` entries.
        flwr_home: the private ``FLWR_HOME`` (default: a fresh temporary folder, removed afterwards).
        timeout: seconds before ``flwr run`` is given up (then its processes are stopped too).
        capture: collect stdout and stderr (merged) into ``output`` instead of printing them. Either way
            the local simulation's output comes without Flower's default-SuperNodes warning.
        echo: print the command before running it.
        connection: a SuperLink connection named in ``flwr_home``'s ``config.toml`` (the Deployment
            Engine, see ``scripts/deployment_local.py``) instead of the local simulation.
        ray_address: the simulation joins this running Ray cluster (``auto`` or ``HOST:PORT``,
            :mod:`server.engine.ray_cluster`) and leaves it running; None: it starts its own Ray.
    """
    app = app_root(app_dir)
    temporary = flwr_home is None
    home = flwr_home or Path(tempfile.mkdtemp(prefix="fedprivacy-flwr-"))
    home.mkdir(parents=True, exist_ok=True)
    status_file = status_path(home)
    status_file.unlink(missing_ok=True)
    cmd = flwr_command(app_dir=app, num_supernodes=num_supernodes, run_config=run_config,
                       federation_config=federation_config, connection=connection)
    if echo:
        print("$ " + shlex.join(cmd), flush=True)
    start = time.monotonic()
    env = {**flwr_env(home), STATUS_ENV: str(status_file)}
    if not sys.stdout.isatty():  # the ServerApp's lines reach this stdout: no colour codes in a pipe/file
        env.setdefault("NO_COLOR", "1")
    policy = _client_policy(app, run_config)
    if policy:  # the simulation fixes node_config: the clients read their floor from the environment
        env[ENV_VAR] = json.dumps(policy)
    env.update(ray_env(ray_address, env))  # after the floor: a cluster's actors get it in the job's env
    watchdog = Watchdog(home, remove=[home] if temporary else [])
    try:
        # Flower logs its "default SuperNodes changed" warning on every simulation, whatever count it
        # was given (flwr_output): drop it where we passed the count, not on a named connection.
        returncode, output = run_forwarding(cmd, env=env, cwd=app, timeout=timeout, capture=capture,
                                            drop_warning=connection is None)
    finally:
        status = read_status(status_file)
        stopped = stop_started_by(home)
        if temporary:
            shutil.rmtree(home, ignore_errors=True)
        watchdog.close()
    return FlwrRunResult(returncode=returncode, output=output, seconds=time.monotonic() - start,
                         stopped=tuple(stopped), status=status)
