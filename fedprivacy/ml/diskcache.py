"""A small on-disk cache of derived index and array files (partitions, data splits).

Where: ``$FEDPRIVACY_CACHE_DIR`` (default ``$XDG_CACHE_HOME/fedprivacy``, else ``~/.cache/fedprivacy``);
an empty value turns it off. What: ``.npz`` files named by a caller's SHA-256 key, which must hash
everything the content depends on; the key is stored inside the file too, and a file is used only
when it loads whole and its stored key matches (callers validate the content further). Writes are
atomic (a temp file renamed into place), so concurrent worker processes never read a torn file; a
read-only or full disk only costs the cache, never the run. Nothing secret is ever written here.
"""

from __future__ import annotations

import importlib.metadata
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

__all__ = ["cache_dir", "package_version", "read", "write"]


def cache_dir() -> Path | None:
    """The cache directory, or None when ``FEDPRIVACY_CACHE_DIR`` is set to an empty value."""
    env = os.environ.get("FEDPRIVACY_CACHE_DIR")
    if env is not None:
        return Path(env) if env.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fedprivacy"


def package_version(dist: str) -> str:
    """An installed distribution's version without importing it ("none" if absent)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _path(kind: str, key: str) -> Path | None:
    root = cache_dir()
    return None if root is None else root / kind / f"{key}.npz"


def read(kind: str, key: str) -> dict[str, np.ndarray] | None:
    """The arrays stored under ``kind/key`` (None: caching off, no file, torn file or another key)."""
    path = _path(kind, key)
    if path is None:
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {name: f[name] for name in f.files}
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        return None
    stored = arrays.pop("key", None)
    if stored is None or stored.shape != () or str(stored) != key:
        return None
    return arrays


def write(kind: str, key: str, arrays: dict[str, np.ndarray]) -> None:
    """Store ``arrays`` under ``kind/key`` atomically (no-op when caching is off or the disk refuses)."""
    path = _path(kind, key)
    if path is None:
        return
    if "key" in arrays:
        raise ValueError("arrays must not use the name 'key' (the cache stores the key under it)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".npz")
        try:
            with os.fdopen(fd, "wb") as out:
                np.savez(out, key=np.array(key), **arrays)  # type: ignore[arg-type]
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:
        pass
