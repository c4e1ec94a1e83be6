"""The ``flwr run`` launcher stops only what its own run started, and the in-process engine
reports the results path the ServerApp wrote, not the newest file in ``output-dir``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from server.engine.flower import stop_started_by

REPO_DIR = Path(__file__).resolve().parents[2]
_SLEEP = "import time; time.sleep(120)"


def _spawn(*argv: str, home: Path, children: int = 0) -> subprocess.Popen[bytes]:
    """A sleeping Python whose command line carries ``argv`` and whose env has ``FLWR_HOME=home``."""
    code = _SLEEP if not children else (
        "import subprocess, sys, time\n"
        f"kids = [subprocess.Popen([sys.executable, '-c', {_SLEEP!r}]) for _ in range({children})]\n"
        "time.sleep(120)\n")
    env = {**os.environ, "FLWR_HOME": str(home)}
    return subprocess.Popen([sys.executable, "-c", code, *argv], env=env)


def _wait_children(proc: subprocess.Popen[bytes], n: int) -> list[psutil.Process]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        kids = psutil.Process(proc.pid).children(recursive=True)
        if len(kids) >= n:
            return kids
        time.sleep(0.05)
    raise TimeoutError("children did not start")


def test_stop_started_by_stops_this_homes_processes_and_nothing_else(tmp_path: Path) -> None:
    # Arrange: our SuperLink (with a child), a Ray-like worker that inherited our FLWR_HOME, and another
    # user's SuperLink under their own FLWR_HOME
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    link = _spawn("flower-superlink", "--database", str(ours / "state.db"), home=ours, children=1)
    worker = _spawn("ray::worker", home=ours)
    other = _spawn("flower-superlink", "--database", str(theirs / "state.db"), home=theirs)
    try:
        (kid,) = _wait_children(link, 1)
        # Act
        stopped = stop_started_by(ours)
        # Assert
        assert {link.pid, kid.pid, worker.pid} <= set(stopped)
        assert other.pid not in stopped and other.poll() is None  # someone else's: untouched
        assert link.wait(timeout=10) is not None and worker.wait(timeout=10) is not None
        assert not kid.is_running() or kid.status() == psutil.STATUS_ZOMBIE
    finally:
        for p in (link, worker, other):
            p.kill()
            p.wait(timeout=10)


def test_results_path_is_the_one_the_server_app_wrote(tmp_path: Path) -> None:
    # Arrange: a newer results.json of another run already sits in the shared output-dir
    from server.engine import run_inprocess

    decoy = tmp_path / "other-run" / "results.json"
    decoy.parent.mkdir()
    decoy.write_text("{}")
    future = time.time() + 3600
    os.utime(decoy, (future, future))
    # Act
    res = run_inprocess(run_config={"num-server-rounds": 1, "privacy": "none", "secagg": False,
                                    "local-epochs": 1, "seed": 0, "output-dir": str(tmp_path),
                                    "run-name": "mine"}, num_supernodes=3, app_dir=REPO_DIR)
    # Assert
    assert res.results_path == tmp_path / "mine" / "results.json" and res.results_path.is_file()


def test_ray_simulation_sets_the_runs_client_floor_for_its_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_flower_simulation`` puts the floor of the run asked for in ``FEDPRIVACY_CLIENT_POLICY`` while
    Ray starts (its processes inherit it) and restores the caller's value afterwards (without
    it every client refused privacy 'none' and bench_engine's Ray rows timed refusals)."""
    import json as _json

    from fedprivacy.fl.client_policy import ENV_VAR
    from server.engine import flower

    seen: list[dict[str, object]] = []
    monkeypatch.setenv(ENV_VAR, '{"client-privacy-modes": "distributed"}')
    monkeypatch.setattr(flower, "_run_on_ray", lambda *a, **k: seen.append(_json.loads(os.environ[ENV_VAR])))
    repo = Path(__file__).resolve().parents[2]
    flower.run_flower_simulation(run_config={"privacy": "none", "secagg": False}, num_supernodes=3,
                                 app_dir=repo)
    assert "none" in str(seen[0]["client-privacy-modes"]).split(",")
    assert os.environ[ENV_VAR] == '{"client-privacy-modes": "distributed"}'
