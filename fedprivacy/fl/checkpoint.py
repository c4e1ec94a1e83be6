"""Atomic per-round checkpoints: model weights, privacy ledger and per-round rows.

Layout in ``<run dir>/checkpoint/`` (owner-only: the rows hold what the outputs keep private): ``model-<r>.npz`` and ``ledger-<r>.json`` for the last finished round
``r``, then ``state.json`` (written last, atomically) naming ``r``. A run killed at any point resumes
from the last ``state.json``: its files were complete before it was written. Older round files are
removed only after the new ``state.json`` is in place.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedprivacy._io import atomic_write_text, user_file_mode

STATE = "state.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    round: int
    weights: list[np.ndarray]
    ledger_path: Path | None
    rows: list[dict[str, Any]]
    config: dict[str, Any]
    extra: dict[str, Any]


def save_checkpoint(
    folder: Path,
    *,
    round: int,
    weights: Sequence[np.ndarray],
    accountant: Any,
    rows: Sequence[dict[str, Any]],
    config: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> None:
    """Save round ``round`` atomically (see module docstring). The folder is owner-only (0700): its
    rows keep what the published outputs leave out (counts, survivors, un-noised losses) and its
    ``extra`` the per-client DP-SGD ledgers."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    model_name = f"model-{round:05d}.npz"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{model_name}.", suffix=".tmp")
    try:
        os.fchmod(fd, user_file_mode())
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, *[np.asarray(w) for w in weights])
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, folder / model_name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    ledger_name = None
    if accountant is not None:
        ledger_name = f"ledger-{round:05d}.json"
        accountant.save(folder / ledger_name)
    state = {"round": round, "model": model_name, "ledger": ledger_name, "rows": list(rows),
             "config": config, "extra": extra or {}}
    atomic_write_text(folder / STATE, json.dumps(state, indent=1, default=_json_default))
    keep = {model_name, ledger_name, STATE}
    for old in folder.iterdir():
        if old.name not in keep and old.name.startswith(("model-", "ledger-")):
            old.unlink(missing_ok=True)


def load_checkpoint(folder: Path) -> Checkpoint | None:
    """The last complete checkpoint in ``folder``, or None if there is none."""
    state_path = folder / STATE
    if not state_path.exists():
        return None
    state = json.loads(state_path.read_text(encoding="utf-8"))
    for key in ("round", "model", "rows", "config"):
        if key not in state:
            raise ValueError(f"checkpoint {state_path} is missing {key!r}")
    with np.load(folder / state["model"]) as npz:
        weights = [npz[f"arr_{i}"] for i in range(len(npz.files))]
    ledger = folder / state["ledger"] if state.get("ledger") else None
    return Checkpoint(round=int(state["round"]), weights=weights, ledger_path=ledger,
                      rows=list(state["rows"]), config=dict(state["config"]),
                      extra=dict(state.get("extra") or {}))


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.floating | np.integer):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
