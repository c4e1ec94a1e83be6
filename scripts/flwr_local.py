"""Run fedprivacy with ``flwr run .`` on a local Flower simulation, offline, and clean up afterwards.

This is the README's main command. It

* points ``FLWR_HOME`` at a private folder (a fresh temporary one unless ``--flwr-home`` is given), so
  the user's ``~/.flwr`` is untouched and the legacy ``[tool.flwr.federations]`` migration is local;
* turns off runtime dependency installation (everything is already in the venv) and telemetry;
* picks free ports for the local SuperLink, so parallel runs do not talk to each other's SuperLink;
* runs ``flwr run . --federation-config "num-supernodes=N client-resources-num-cpus=1" --stream``;
* stops the detached ``flower-superlink`` it started (and that process's children), by process id.

Usage: ``python scripts/flwr_local.py [--supernodes 10] [--run-config "num-server-rounds=5 seed=0"]``.
Results land in ``runs/<run-name or timestamp>/`` of the repository unless ``output-dir`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bin_dir() -> Path:
    return Path(sys.executable).parent


def flwr_env(flwr_home: Path) -> dict[str, str]:
    """Environment for an offline, isolated ``flwr`` invocation."""
    env = dict(os.environ)
    env.update({
        "FLWR_HOME": str(flwr_home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
        "PATH": f"{bin_dir()}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    })
    return env


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) from /proc."""
    table: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
        table[int(entry.name)] = (ppid, cmd)
    return table


def _descendants(pid: int, table: dict[int, tuple[int, str]]) -> list[int]:
    out, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, (pp, _) in table.items() if pp == parent]
        out.extend(kids)
        frontier.extend(kids)
    return out


def stop_processes(pids: list[int], *, grace: float = 5.0) -> None:
    """SIGTERM each pid, then SIGKILL what is still alive after ``grace`` seconds."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if Path(f"/proc/{p}").exists() and not _is_zombie(p)]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _is_zombie(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) == "Z"
    except (OSError, IndexError):
        return True


def _flwr_home_of(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"FLWR_HOME="):
            return item[len(b"FLWR_HOME="):].decode(errors="replace")
    return None


def _ancestors(pid: int, table: dict[int, tuple[int, str]]) -> set[int]:
    out = set()
    while pid in table and pid not in out:
        out.add(pid)
        pid = table[pid][0]
    return out


def stop_local_superlinks(flwr_home: Path) -> list[int]:
    """Stop what a run under ``flwr_home`` left behind, by process id.

    That is the detached ``flower-superlink`` using ``flwr_home``, all its descendants, and Flower/Ray
    processes that inherited ``FLWR_HOME=flwr_home`` (Ray actors are re-parented to init when the
    simulation ends). Never this process or its ancestors.
    """
    table = _proc_table()
    marker = str(flwr_home)
    mine = _ancestors(os.getpid(), table)
    links = [p for p, (_, cmd) in table.items() if "flower-superlink" in cmd and marker in cmd]
    victims: list[int] = []
    for pid in links:
        victims.extend(_descendants(pid, table))
        victims.append(pid)
    for pid, (_, cmd) in table.items():
        if pid in mine or pid in victims:
            continue
        if ("ray" in cmd or "flower" in cmd or "flwr" in cmd) and _flwr_home_of(pid) == marker:
            victims.append(pid)
    victims = [p for p in dict.fromkeys(victims) if p not in mine]
    stop_processes(victims)
    return victims


def run_local(
    *,
    app_dir: Path = REPO,
    supernodes: int = 10,
    run_config: str = "",
    flwr_home: Path | None = None,
    timeout: float | None = None,
    capture: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``flwr run --stream`` the app on a local simulation and stop the SuperLink afterwards.

    ``--stream`` is always on: without it ``flwr run`` returns as soon as the run is submitted.
    ``capture=True`` collects the output instead of printing it.
    """
    home = flwr_home or Path(tempfile.mkdtemp(prefix="fedprivacy-flwr-"))
    home.mkdir(parents=True, exist_ok=True)
    if "output-dir" not in run_config:
        run_config = f"{run_config} output-dir={json.dumps(str(app_dir / 'runs'))}".strip()
    cmd = [str(bin_dir() / "flwr"), "run", str(app_dir),
           "--federation-config", f"num-supernodes={supernodes} client-resources-num-cpus=1", "--stream"]
    if run_config:
        cmd += ["--run-config", run_config]
    print("$ " + shlex.join(cmd), flush=True)
    try:
        return subprocess.run(cmd, env=flwr_env(home), cwd=app_dir, timeout=timeout, text=True,
                              capture_output=capture, check=False)
    finally:
        stop_local_superlinks(home)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--supernodes", type=int, default=10, help="simulated clients (default 10)")
    parser.add_argument("--run-config", default="", help='overrides, e.g. "num-server-rounds=5 seed=0"')
    parser.add_argument("--flwr-home", type=Path, default=None, help="FLWR_HOME (default: a temp folder)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before giving up")
    args = parser.parse_args(argv)
    if args.supernodes < 1:
        print("error: --supernodes must be >= 1", file=sys.stderr)
        return 2
    started = time.perf_counter()
    proc = run_local(supernodes=args.supernodes, run_config=args.run_config, flwr_home=args.flwr_home,
                     timeout=args.timeout)
    print(f"flwr run finished with exit code {proc.returncode} in {time.perf_counter() - started:.1f} s")
    return int(proc.returncode)


if __name__ == "__main__":
    raise SystemExit(main())
