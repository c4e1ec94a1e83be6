"""The run command owns its processes: a SIGKILLed launcher's run is stopped by its watchdog, direct
children get the kernel's parent-death signal, SIGTERM becomes a KeyboardInterrupt (so ``finally`` runs),
and a launcher that ends normally leaves the watchdog nothing to do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from server.engine.processes import Interrupted, Watchdog, signals_interrupt

REPO_DIR = Path(__file__).resolve().parents[2]

# A launcher: a watchdog over `home`, a detached "flower-superlink" decoy carrying FLWR_HOME=home (as
# flwr run's SuperLink does), a direct child with the parent-death signal; prints their pids, then waits.
_LAUNCHER = """
import json, os, subprocess, sys, time
from pathlib import Path
from server.engine.processes import Watchdog, die_with_parent
home, tmp, close = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "close"
env = {**os.environ, "FLWR_HOME": str(home)}
sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
dog = Watchdog(home, remove=[tmp])
decoy = subprocess.Popen([*sleep, "flower-superlink", str(home)], env=env, start_new_session=True)
child = subprocess.Popen(sleep, preexec_fn=die_with_parent)
print(json.dumps({"dog": dog.pid, "decoy": decoy.pid, "child": child.pid}), flush=True)
if close:
    decoy.kill(); decoy.wait(); child.kill(); child.wait(); dog.close(); print("closed", flush=True)
time.sleep(300)
"""


def _gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def _launch(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], dict[str, int], Path]:
    home, tmp = tmp_path / "home", tmp_path / "fedprivacy-flwr-x"
    home.mkdir()
    tmp.mkdir()
    (tmp / "junk").write_text("x")
    proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(home), str(tmp), mode], cwd=REPO_DIR,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pids = json.loads(proc.stdout.readline())
    return proc, pids, tmp


def test_sigkill_of_the_launcher_stops_its_run_and_removes_its_temporary_folder(tmp_path: Path) -> None:
    # Arrange
    proc, pids, tmp = _launch(tmp_path, "kill")
    try:
        assert psutil.pid_exists(pids["decoy"]) and psutil.pid_exists(pids["child"])
        # Act: SIGKILL, which no handler can catch
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        # Assert
        assert _gone(pids["child"]), "the direct child outlived its parent (PR_SET_PDEATHSIG)"
        assert _gone(pids["decoy"]), "the detached process of the run outlived the launcher"
        assert _gone(pids["dog"]) and not tmp.exists()
    finally:
        for pid in pids.values():
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass


def test_a_launcher_that_cleaned_up_itself_leaves_the_watchdog_nothing_to_do(tmp_path: Path) -> None:
    proc, pids, tmp = _launch(tmp_path, "close")
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "closed"
        assert _gone(pids["dog"], timeout=10)
        assert tmp.exists()  # the watchdog removed nothing: the launcher had finished normally
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_sigterm_raises_a_keyboard_interrupt_inside_and_handlers_come_back(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt) as info, signals_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert isinstance(info.value, Interrupted) and info.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before


def test_watchdog_close_is_idempotent(tmp_path: Path) -> None:
    dog = Watchdog(tmp_path)
    dog.close()
    dog.close()
    assert _gone(dog.pid, timeout=10)
