"""File-system helpers shared by every package that writes a run's files (standard library only).

``tempfile.mkstemp`` creates files with mode 0600; a run's outputs written through a temporary file
and ``os.replace`` would then be readable by nobody but their owner, unlike every other file the user
writes. :func:`user_file_mode` is the mode ``open()`` would have given (0666 minus the umask).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_text", "user_file_mode"]


def user_file_mode() -> int:
    """0666 masked by the process umask (read from ``/proc`` where possible, never changed)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # no /proc: read the umask by setting it, then put it back at once
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and ``os.replace``.

    The file gets the mode a plain ``open(path, "w")`` would give (:func:`user_file_mode`).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, user_file_mode())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
