"""A run folder's layout and its append-only JSON-lines files.

``<output-dir>/<run-name>/`` holds what a run publishes (``results.json``, ``rounds.csv``, the report),
its checkpoint, the write-ahead journal of its charges (:data:`JOURNAL_NAME`) and an owner-only
``private/`` part (:data:`PRIVATE_DIR`) with what the published outputs leave out: the per-round
client counts (:data:`PARTICIPATION_LOG`) and the DP-SGD journal that names each round's cohort
(:data:`DPSGD_JOURNAL_NAME`). Every journal line is written with one ``write`` and fsync'd before the
call returns, so a crash can only tear the last line, which :func:`read_json_lines` cuts.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig

__all__ = ["DPSGD_JOURNAL_NAME", "JOURNAL_NAME", "PARTICIPATION_LOG", "PRIVATE_DIR", "append_line",
           "append_participation", "private_dir", "write_private", "read_json_lines", "read_participation",
           "resolve_run_dir", "round_seconds"]

#: The write-ahead journal of a run's charges, in its run folder.
JOURNAL_NAME = "privacy-journal.jsonl"
#: The journal of the example-level DP-SGD spends (per client), written before the instructions leave;
#: in ``<run dir>/private/`` (owner-only): its lines name each round's cohort.
DPSGD_JOURNAL_NAME = "privacy-journal-dpsgd.jsonl"
#: The run folder's owner-only part: what the published outputs leave out (counts, cohorts, losses).
PRIVATE_DIR = "private"
#: The private server log of per-round client counts, in ``<run dir>/private/``.
PARTICIPATION_LOG = "participation.jsonl"


def resolve_run_dir(cfg: RunConfig) -> Path:
    """``<output-dir>/<run-name>``, or a fresh timestamped folder when ``run-name`` is empty."""
    base = Path(cfg.output_dir)
    if cfg.run_name:
        return base / cfg.run_name
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate, i = base / stamp, 1
    while candidate.exists():
        candidate, i = base / f"{stamp}-{i}", i + 1
    return candidate


def append_line(path: Path, record: dict[str, Any], *, create: bool = False) -> None:
    """Append one JSON line and fsync it (``create``: the file must not exist yet; made owner-only)."""
    flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(record, allow_nan=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def private_dir(run_dir: Path) -> Path:
    """``<run dir>/private/``, created owner-only (0700): the server's own records of a run (who took
    part, cohorts, un-noised losses), which the published outputs leave out."""
    folder = run_dir / PRIVATE_DIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    return folder


def read_json_lines(path: Path, *, what: str) -> list[dict[str, Any]]:
    """Every complete line of a JSON-lines journal; a torn last line (its write never returned) is cut."""
    raw = path.read_bytes()
    complete, _, torn = raw.rpartition(b"\n")
    if torn:
        with open(path, "r+b") as fh:
            fh.truncate(len(complete) + 1 if complete else 0)
            fh.flush()
            os.fsync(fh.fileno())
    out: list[dict[str, Any]] = []
    for i, line in enumerate(complete.decode("utf-8").split("\n") if complete else []):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{what} {path} line {i + 1} is not valid JSON: {exc}") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{what} {path} line {i + 1} must be a JSON object")
        out.append(rec)
    return out


def write_private(run_dir: Path, name: str, record: dict[str, Any]) -> Path:
    """Write ``<run dir>/private/<name>`` (owner-only JSON, fsync'd); returns its path."""
    path = private_dir(run_dir) / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (json.dumps(record, indent=2) + "\n").encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def append_participation(run_dir: Path, counts: dict[str, Any]) -> None:
    """Append one round's line to ``<run dir>/private/participation.jsonl`` (owner-only)."""
    line = json.dumps(counts) + "\n"
    fd = os.open(private_dir(run_dir) / PARTICIPATION_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def read_participation(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The private per-round client counts of a run (``<run dir>/private/participation.jsonl``).

    For the server operator (and tests): these are left out of the published outputs of central mode.
    """
    path = Path(run_dir) / PRIVATE_DIR / PARTICIPATION_LOG
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def round_seconds(run_dir: str | os.PathLike[str]) -> list[float]:
    """Each round's wall seconds, in the order of ``results.json``'s rows (for the operator and the
    benchmarks): from the rows, or, for a run that keeps its counts private (whose published rows leave
    the per-round timing out), from the private participation log."""
    rows = json.loads((Path(run_dir) / "results.json").read_text(encoding="utf-8"))["rounds"]
    if all("seconds" in r for r in rows):
        return [float(r["seconds"]) for r in rows]
    private = {int(r["round"]): float(r["seconds"]) for r in read_participation(run_dir) if "seconds" in r}
    missing = [r["round"] for r in rows if int(r["round"]) not in private]
    if missing:
        raise ValueError(f"run {run_dir}: no wall time for rounds {missing} in results.json or "
                         f"{PRIVATE_DIR}/{PARTICIPATION_LOG}")
    return [private[int(r["round"])] for r in rows]
