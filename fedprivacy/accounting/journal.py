"""A write-ahead journal of privacy charges: a release is on disk before anyone can see it.

Why. An accountant that is saved with the run's checkpoint, after the round, loses the round if the
process dies between the release (the unmasked sum, the noised aggregate, a client's noised
update) and the checkpoint: ``resume`` runs the round again and the first release is counted
nowhere. Here every charge is appended to a JSON-lines file and ``fsync``'d *before* the caller
may release anything, and recovery rebuilds the accountant from every charge in the file. So:

* a round that was charged is never refunded, whether or not it completed (its release may have
  been seen); a resumed run that repeats the round pays for it again;
* a release is impossible without its charge on disk (the caller releases only after
  :meth:`ChargeJournal.charge` returns, which is after ``fsync``);
* a crash while a line is being written leaves a torn last line: that charge never returned, so
  nothing was released on it, and recovery drops it (and only it: a damaged line anywhere else is
  an error, never skipped).

The event charged is the one the round will release, fixed before the release (e.g. the survivors'
noise of a secure round is known before the unmask requests go out); nothing is lowered afterwards.

File format (``fedprivacy.journal/v1``), one JSON object per line: a ``header`` (the accountant's
backend, relation, unit and budget, ``Accountant.to_json`` without entries; optionally ``plan``, what
the charges were computed from, e.g. a run's noise multiplier and worst-case event, so that a resumed
run can refuse to account the same rounds from anything else), then ``charge`` lines
(``LedgerEntry.to_dict``), and ``completed`` lines (informational: the round finished and was
checkpointed), each line terminated by ``\\n``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedprivacy.accounting.accountant import Accountant, LedgerEntry, _fsync_dir
from fedprivacy.accounting.events import PrivacyEvent

__all__ = ["JOURNAL_FORMAT", "ChargeJournal"]

JOURNAL_FORMAT = "fedprivacy.journal/v1"


class ChargeJournal:
    """An accountant whose every charge is durable before it takes effect.

    Build with :meth:`create` (a new file) or :meth:`recover` (an existing one); spend with
    :meth:`charge`, then release. ``accountant`` is the live ledger (read it, never ``spend`` on it
    directly: that would bypass the journal).
    """

    def __init__(self, path: Path, accountant: Accountant, completed: set[int],
                 plan: Mapping[str, Any] | None = None) -> None:
        self.path = path
        self.accountant = accountant
        self._completed = completed
        #: the header's ``plan`` (what the charges were computed from), None if it has none
        self.plan: dict[str, Any] | None = dict(plan) if plan is not None else None

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, path: str | os.PathLike[str], accountant: Accountant, *,
               plan: Mapping[str, Any] | None = None) -> ChargeJournal:
        """A new journal for ``accountant`` (its existing entries are written as charges).

        ``plan``: JSON-able description of what the charges are computed from, kept in the header.
        ValueError if ``path`` exists: a journal is never overwritten (use :meth:`recover`).
        """
        path = Path(path)
        if not isinstance(accountant, Accountant):
            raise TypeError(f"accountant must be an Accountant, got {type(accountant).__name__}")
        if plan is not None and not isinstance(plan, Mapping):
            raise TypeError(f"plan must be a mapping or None, got {type(plan).__name__}")
        header: dict[str, Any] = {k: v for k, v in accountant.to_json().items() if k != "entries"}
        head: dict[str, Any] = {"kind": "header", "journal": JOURNAL_FORMAT, "ledger": header}
        if plan is not None:
            head["plan"] = dict(plan)
        lines = [head]
        lines += [{"kind": "charge", "entry": e.to_dict()} for e in accountant.ledger]
        data = "".join(json.dumps(line, allow_nan=False) + "\n" for line in lines)
        with open(path, "x", encoding="utf-8") as fh:  # "x": refuse to clobber an existing journal
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(path.parent)
        return cls(path, accountant, set())

    @classmethod
    def recover(cls, path: str | os.PathLike[str]) -> ChargeJournal:
        """Rebuild the accountant from every complete charge in ``path``; drop a torn last line.

        Every field is validated; a damaged line that is not the last one is a ValueError.
        """
        path = Path(path)
        raw = path.read_bytes()
        complete, _, torn = raw.rpartition(b"\n")
        if torn:  # the last write did not finish: its charge never returned, nothing was released
            with open(path, "r+b") as fh:
                fh.truncate(len(complete) + 1 if complete else 0)
                fh.flush()
                os.fsync(fh.fileno())
        text = complete.decode("utf-8") if complete else ""
        records: list[Any] = []
        for i, line in enumerate(text.split("\n") if text else []):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"journal {path} line {i + 1} is not valid JSON: {exc}") from None
        if not records:
            raise ValueError(f"journal {path} has no header (empty or torn at creation)")
        head = records[0]
        if (
            not isinstance(head, Mapping)
            or head.get("kind") != "header"
            or head.get("journal") != JOURNAL_FORMAT
        ):
            raise ValueError(f"journal {path} line 1 must be a {JOURNAL_FORMAT} header")
        ledger = head.get("ledger")
        if not isinstance(ledger, Mapping):
            raise ValueError(f"journal {path} header has no ledger description")
        plan = head.get("plan")
        if plan is not None and not isinstance(plan, Mapping):
            raise ValueError(f"journal {path} header plan must be a JSON object, got {plan!r}")
        accountant = Accountant.from_json({**ledger, "entries": []})
        entries: list[LedgerEntry] = []
        completed: set[int] = set()
        for i, rec in enumerate(records[1:], start=2):
            kind = rec.get("kind") if isinstance(rec, Mapping) else None
            if kind == "charge" and set(rec) == {"kind", "entry"}:
                entries.append(accountant.entry_from_dict(rec["entry"], f"journal line {i}"))
            elif kind == "completed" and set(rec) == {"kind", "round"}:
                rnd = rec["round"]
                if isinstance(rnd, bool) or not isinstance(rnd, int) or rnd < 0:
                    raise ValueError(f"journal line {i} round must be an int >= 0, got {rnd!r}")
                completed.add(rnd)
            else:
                raise ValueError(f"journal line {i} must be a charge or a completed record")
        accountant.restore_entries(entries)
        return cls(path, accountant, completed, plan)

    @classmethod
    def open(cls, path: str | os.PathLike[str], accountant: Accountant, *,
             plan: Mapping[str, Any] | None = None) -> ChargeJournal:
        """:meth:`recover` if ``path`` exists, else :meth:`create` for ``accountant``."""
        return cls.recover(path) if Path(path).exists() else cls.create(path, accountant, plan=plan)

    # ------------------------------------------------------------------ writing
    def _append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, allow_nan=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def charge(self, event: PrivacyEvent, *, round: int | None = None, released: bool = False) -> None:
        """Spend ``event``: every check first, then the line on disk (fsync), then the ledger.

        Raises exactly as ``Accountant.spend`` (budget, unsupported event) with nothing written and
        nothing spent. When it returns, the charge survives any crash: release only then.
        ``released=True``: the event was already released; charged without the budget check.
        """
        self.accountant.spend(
            event,
            round=round,
            # no wall-clock time on disk: the journal is world-readable, and the time between
            # charges is a round's duration, which grows with the (possibly private) cohort size
            write_ahead=lambda entry: self._append({"kind": "charge", "entry": {**entry.to_dict(), "timestamp": 0.0}}),
            released=released,
        )

    def mark_completed(self, round: int) -> None:
        """Record that ``round`` finished (released and checkpointed). Informational only."""
        if isinstance(round, bool) or not isinstance(round, int) or round < 0:
            raise ValueError(f"round must be an int >= 0, got {round!r}")
        self._append({"kind": "completed", "round": round})
        self._completed.add(round)

    # ------------------------------------------------------------------ reading
    @property
    def charged_rounds(self) -> tuple[int, ...]:
        """Rounds with at least one charge, in order of the charges (repeats kept)."""
        return tuple(e.round for e in self.accountant.ledger if e.round is not None)

    @property
    def unfinished_rounds(self) -> tuple[int, ...]:
        """Rounds charged but never marked completed (their release may have been seen)."""
        seen: dict[int, None] = {}
        for r in self.charged_rounds:
            if r not in self._completed:
                seen[r] = None
        return tuple(seen)

    def __repr__(self) -> str:
        return f"ChargeJournal({str(self.path)!r}, {self.accountant!r})"
