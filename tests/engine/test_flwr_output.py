"""The launcher's output filter drops only Flower's default-SuperNodes warning and forwards the rest of
a real child's output, live and byte for byte, with its exit code, timeout and Ctrl-C intact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from server.engine.flwr_output import (
    DEFAULT_SUPERNODES_WARNING,
    forward_lines,
    is_default_supernodes_warning,
    run_forwarding,
)

# As flwr run --stream relays it: coloured (a terminal), plain (NO_COLOR has no effect on the level
# name, but Flower's handler can be uncoloured), and with FLWR_LOG_LEVEL=DEBUG's timestamp.
_WARNING_LINES = (
    f"\x1b[93mWARNING \x1b[0m:   {DEFAULT_SUPERNODES_WARNING}\n",
    f"WARNING :   {DEFAULT_SUPERNODES_WARNING}\n",
    f"WARNING 2026-01-02 03:04:05,678:   {DEFAULT_SUPERNODES_WARNING}\r\n",
)
# Lines of a real run around it, and near misses: all must pass.
_OTHER_LINES = (
    "\x1b[93mWARNING \x1b[0m:   Manually terminating ClientAppActor\n",
    "\x1b[36m(ClientAppActor pid=15571)\x1b[0m \x1b[93mWARNING \x1b[0m:   Manually terminating ClientAppActor\n",
    "\x1b[92mINFO \x1b[0m:      Federation `@none/default` (2 simulated SuperNodes)\n",
    "INFO :      round   1/1  accuracy 0.2417  loss 2.2208  ε n/a (no DP)  clients 2/2  0.34s\n",
    f"INFO :      {DEFAULT_SUPERNODES_WARNING}\n",
    f"ERROR :     {DEFAULT_SUPERNODES_WARNING}\n",
    f"WARNING :   {DEFAULT_SUPERNODES_WARNING} Use --num-supernodes.\n",
    f"WARNING :   {DEFAULT_SUPERNODES_WARNING[:-1]}\n",
    f"a user's note: WARNING :   {DEFAULT_SUPERNODES_WARNING}\n",
    f"{DEFAULT_SUPERNODES_WARNING}\n",
)


@pytest.mark.parametrize("line", _WARNING_LINES)
def test_the_default_supernodes_warning_is_recognised(line: str) -> None:
    assert is_default_supernodes_warning(line)
    assert is_default_supernodes_warning(line.encode())


@pytest.mark.parametrize("line", _OTHER_LINES)
def test_other_lines_and_other_warnings_are_not_it(line: str) -> None:
    assert not is_default_supernodes_warning(line)
    assert not is_default_supernodes_warning(line.encode())


def _printer(chunks: list[bytes], *, exit_code: int = 0) -> list[str]:
    """A Python child that writes ``chunks`` to stdout (raw bytes, flushed) and exits with ``exit_code``."""
    code = ("import sys\n"
            f"for c in {chunks!r}:\n"
            "    sys.stdout.buffer.write(c); sys.stdout.buffer.flush()\n"
            f"sys.exit({exit_code})\n")
    return [sys.executable, "-c", code]


_MIXED = [line.encode() for line in (*_OTHER_LINES[:3], _WARNING_LINES[0], *_OTHER_LINES[3:])]
_MIXED += [b"not utf-8: \xff\xfe\n", b"last line without a newline"]


@pytest.mark.parametrize("drop", [True, False])
def test_every_other_line_of_a_real_child_comes_through_unchanged(drop: bool) -> None:
    # Arrange
    proc = subprocess.Popen(_printer(_MIXED), stdout=subprocess.PIPE)
    got: list[bytes] = []
    # Act
    assert proc.stdout is not None
    forward_lines(proc.stdout, got.append, drop_default_supernodes_warning=drop)
    proc.wait(timeout=30)
    proc.stdout.close()
    # Assert
    expected = [c for c in _MIXED if not (drop and c == _WARNING_LINES[0].encode())]
    assert got == expected and len(got) == len(_MIXED) - drop


def test_lines_are_forwarded_as_they_come_not_at_the_end() -> None:
    # Arrange: a child that prints one line and then waits for us before it ends
    code = "import sys; print('first', flush=True); sys.stdin.readline(); print('second')"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    got: list[bytes] = []
    arrived = threading.Event()

    def sink(line: bytes) -> None:
        got.append(line)
        arrived.set()

    assert proc.stdout is not None and proc.stdin is not None
    reader = threading.Thread(target=forward_lines, args=(proc.stdout, sink),
                              kwargs={"drop_default_supernodes_warning": True})
    # Act
    reader.start()
    try:
        assert arrived.wait(timeout=30)
        # Assert: the first line is here while the child still runs
        assert got == [b"first\n"] and proc.poll() is None
    finally:
        proc.stdin.close()  # EOF: the child goes on
        reader.join(timeout=30)
        proc.wait(timeout=30)
        proc.stdout.close()
    assert got == [b"first\n", b"second\n"]


def test_a_sink_that_fails_leaves_the_child_unblocked() -> None:
    # Arrange: far more than a pipe holds (64 KiB), into a sink that fails at once (our stdout closed)
    code = "import sys\nfor _ in range(1000):\n    sys.stdout.write('x' * 1000 + '\\n')\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)

    def broken(line: bytes) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    # Act
    assert proc.stdout is not None
    forward_lines(proc.stdout, broken, drop_default_supernodes_warning=True)
    # Assert: everything was drained, so the child could finish
    assert proc.wait(timeout=30) == 0
    proc.stdout.close()


def test_run_forwarding_captures_without_the_warning_and_keeps_the_exit_code(tmp_path: Path) -> None:
    code, text = run_forwarding(_printer(_MIXED, exit_code=3), env=os.environ, cwd=tmp_path, timeout=60,
                                capture=True, drop_warning=True)
    assert code == 3
    kept = b"".join(c for c in _MIXED if c != _WARNING_LINES[0].encode())
    assert text == kept.decode(errors="replace")  # only the warning is gone
    assert text.endswith("not utf-8: \ufffd\ufffd\nlast line without a newline")


def test_run_forwarding_prints_to_our_stdout_without_the_warning(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    print("before", flush=False)
    code, text = run_forwarding(_printer(_MIXED[:6]), env=os.environ, cwd=tmp_path, timeout=60,
                                capture=False, drop_warning=True)
    out = capsys.readouterr().out
    assert code == 0 and text is None
    assert out == "before\n" + "".join(_OTHER_LINES[:5])


def test_run_forwarding_reports_death_by_a_signal(tmp_path: Path) -> None:
    suicide = [sys.executable, "-c", "import os, signal; print('bye', flush=True); os.kill(os.getpid(), signal.SIGTERM)"]
    code, text = run_forwarding(suicide, env=os.environ, cwd=tmp_path, timeout=60, capture=True,
                                drop_warning=True)
    assert code == -signal.SIGTERM and text == "bye\n"


def _sleeper(pid_file: Path) -> list[str]:
    return [sys.executable, "-c",
            f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"]


def _child_pid(pid_file: Path) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if pid_file.exists() and pid_file.read_text():
            return int(pid_file.read_text())
        time.sleep(0.05)
    raise TimeoutError("the child did not start")


def test_run_forwarding_kills_the_child_on_timeout(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        run_forwarding(_sleeper(pid_file), env=os.environ, cwd=tmp_path, timeout=5, capture=False,
                       drop_warning=True)
    assert not psutil.pid_exists(_child_pid(pid_file))


def test_ctrl_c_reaches_the_launcher_which_kills_the_child(tmp_path: Path) -> None:
    # Arrange: SIGINT to this process (as a terminal's Ctrl-C to the launcher) once the child runs
    pid_file = tmp_path / "pid"
    timer = threading.Thread(target=lambda: (_child_pid(pid_file), os.kill(os.getpid(), signal.SIGINT)))
    # a terminal's Python turns SIGINT into KeyboardInterrupt; a pytest-xdist worker does not, so the
    # default handler is put back for this test
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer.start()
    # Act
    try:
        with pytest.raises(KeyboardInterrupt):
            run_forwarding(_sleeper(pid_file), env=os.environ, cwd=tmp_path, timeout=60, capture=False,
                           drop_warning=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    timer.join(timeout=30)
    # Assert: the launcher killed and reaped the child before the interrupt went on
    assert not psutil.pid_exists(_child_pid(pid_file))
