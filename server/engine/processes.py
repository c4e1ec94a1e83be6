"""The run command owns its processes: they die with it, on any signal, and only they do.

Flower's ``flwr run`` starts a *detached* ``flower-superlink`` (and Ray re-parents its workers to
init), so neither the process group nor the parent-death signal of ``flwr run`` reaches them. What
every process of one run shares is its private ``FLWR_HOME``: :func:`stop_started_by` stops exactly
the processes that carry it (review defect D2) and their descendants.

Three layers make the stop happen whatever ends the launcher:

1. normal end, an exception, Ctrl-C, SIGTERM or SIGHUP (:func:`signals_interrupt`): the launcher's
   ``finally`` calls :func:`stop_started_by` and removes its temporary folder;
2. SIGKILL of the launcher: a :class:`Watchdog` process in its own session holds the read end of a
   pipe whose only write end the launcher holds. The kernel closes that end when the launcher dies in
   any way; the watchdog reads EOF without the launcher's "done" and stops the run, removes the
   temporary folder, and exits;
3. direct children are started with :func:`die_with_parent` (Linux ``prctl(PR_SET_PDEATHSIG)``), so
   ``flwr run`` itself and the in-process engine's workers get SIGTERM from the kernel at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import FrameType

import psutil

__all__ = ["Watchdog", "die_with_parent", "signals_interrupt", "stop_processes", "stop_started_by"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux; no-op elsewhere).

    Usable as ``subprocess.Popen(preexec_fn=die_with_parent)`` or as a process-pool initializer.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:  # pragma: no cover - cannot fail on Linux
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def stop_processes(procs: Iterable[psutil.Process], *, grace: float = 5.0) -> list[int]:
    """SIGTERM each process, then SIGKILL what is still alive after ``grace`` seconds; their pids."""
    procs = list(procs)
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)
    return [p.pid for p in procs]


def _uses_home(proc: psutil.Process, marker: str) -> bool:
    """Whether ``proc`` belongs to the runs under ``marker`` (our private FLWR_HOME)."""
    try:
        cmd = " ".join(proc.cmdline())
        if "flower-superlink" in cmd and marker in cmd:
            return True
        flowerish = any(k in cmd for k in ("ray", "flower", "flwr"))
        return flowerish and proc.environ().get("FLWR_HOME") == marker
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def stop_started_by(flwr_home: Path) -> list[int]:
    """Stop every process a run under ``flwr_home`` left behind (see the module docstring), never this
    process or its ancestors; returns their pids."""
    marker = str(flwr_home)
    me = psutil.Process()
    mine = {me.pid, *(p.pid for p in me.parents())}
    victims: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter():
        if proc.pid in mine or not _uses_home(proc, marker):
            continue
        victims[proc.pid] = proc
        try:
            victims.update({c.pid: c for c in proc.children(recursive=True) if c.pid not in mine})
        except psutil.NoSuchProcess:
            pass
    return stop_processes(victims.values())


class Watchdog:
    """A process that stops the run under ``flwr_home`` if this process dies before :meth:`close`.

    Args:
        flwr_home: the run's private ``FLWR_HOME`` (its processes carry it).
        remove: folders to delete after stopping (the launcher's temporary folders).
    """

    def __init__(self, flwr_home: Path, *, remove: Iterable[Path] = ()) -> None:
        read, self._write = os.pipe()  # both ends non-inheritable: no other child holds the write end
        cmd = [sys.executable, "-m", "server.engine.processes", str(flwr_home), *map(str, remove)]
        try:
            self._proc = subprocess.Popen(cmd, stdin=read, start_new_session=True,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            os.close(read)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def close(self) -> None:
        """The launcher cleaned up itself: tell the watchdog to exit without doing anything."""
        if self._write < 0:
            return
        with contextlib.suppress(OSError):
            os.write(self._write, b"done")
        os.close(self._write)
        self._write = -1
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _watch(argv: list[str]) -> int:
    """The watchdog's body: wait for EOF on stdin; without "done", stop the run and remove folders."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the launcher's to handle
    home, remove = Path(argv[0]), [Path(a) for a in argv[1:]]
    said = b""
    while chunk := os.read(0, 64):
        said += chunk
    if said == b"done":
        return 0
    stop_started_by(home)
    for folder in remove:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


class Interrupted(KeyboardInterrupt):
    """SIGTERM/SIGHUP turned into a KeyboardInterrupt, so ``finally`` blocks stop the run's processes."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise :class:`Interrupted` (as Ctrl-C raises KeyboardInterrupt)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    if sys.platform == "win32":  # pragma: no cover
        yield
        return
    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


if __name__ == "__main__":
    raise SystemExit(_watch(sys.argv[1:]))
