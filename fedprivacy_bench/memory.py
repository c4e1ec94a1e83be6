"""Peak memory of a process tree (psutil).

The figure is the peak over samples of the summed PSS (proportional set size: shared pages are
split between the processes that map them, so a tree's sum does not count torch's libraries once
per Ray worker) of the process and all its descendants. Where PSS is unreadable, RSS is used.
"""

from __future__ import annotations

import threading

import psutil


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants currently alive."""
    try:
        root = psutil.Process(pid)
        return [pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def _memory_bytes(pid: int) -> int:
    try:
        proc = psutil.Process(pid)
        try:
            return int(proc.memory_full_info().pss)
        except (psutil.AccessDenied, AttributeError):
            return int(proc.memory_info().rss)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return 0


def tree_memory_mb(pid: int) -> float:
    """Current summed PSS (MB) of ``pid``'s process tree."""
    return sum(_memory_bytes(p) for p in process_tree(pid)) / 2**20


class PeakMemorySampler:
    """Samples ``tree_memory_mb(pid)`` every ``interval`` seconds in a daemon thread."""

    def __init__(self, pid: int, *, interval: float = 0.25) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self.pid = pid
        self.interval = interval
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, tree_memory_mb(self.pid))
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
