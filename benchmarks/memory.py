"""Peak memory of a process tree, sampled from /proc (Linux; psutil is not a dependency).

The figure is the peak over samples of the summed PSS (proportional set size: shared pages are
split between the processes that map them, so a tree's sum does not count torch's libraries once
per Ray worker) of the process and all its descendants. Where PSS is unreadable, RSS is used.
"""

from __future__ import annotations

import threading
from pathlib import Path

_PROC = Path("/proc")


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may contain spaces and parentheses
        ppid = int(stat[stat.rfind(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants currently alive."""
    children = _children_map()
    tree, stack = [], [pid]
    while stack:
        p = stack.pop()
        tree.append(p)
        stack.extend(children.get(p, []))
    return tree


def _memory_kb(pid: int) -> int:
    base = _PROC / str(pid)
    try:
        for line in (base / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    try:
        for line in (base / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def tree_memory_mb(pid: int) -> float:
    """Current summed PSS (MB) of ``pid``'s process tree."""
    return sum(_memory_kb(p) for p in process_tree(pid)) / 1024.0


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
            try:
                self.peak_mb = max(self.peak_mb, tree_memory_mb(self.pid))
            except OSError:
                pass
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
