"""The privacy ledger and accountant.

An ``Accountant`` holds an append-only ledger of privacy events for one *unit of privacy* ("user" for
DP-FedAvg across rounds, "example" for DP-SGD inside a client) under one explicit neighbouring
relation, and certifies epsilon at any delta with one backend ("pld" by default, the tightest).

Guarantees:

* Check first, change state last: ``spend`` validates the event, checks that the backend supports it
  and checks the budget before it appends anything; a call that raises leaves the accountant exactly
  as it was. Call ``spend`` (or ``would_exceed``) *before* drawing the noise.
* Never a weaker or approximate bound in silence: an event the backend cannot bound is refused with a
  ValueError that says why.
* Incremental: consecutive identical events are grouped into one self-composed run; the composition
  of all earlier runs is cached, so one more round of the same event costs one self-composition, not
  a recomposition of the whole history.
* Persistence: ``save`` writes JSON atomically (temporary file in the same directory, then
  ``os.replace``); ``load`` validates every field; a restored accountant recomputes the same epsilon,
  bit for bit, because epsilon is a deterministic function of the ledger (runs composed left to right).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedprivacy._io import user_file_mode
from fedprivacy.accounting.backend_base import Backend
from fedprivacy.accounting.backends import get_backend
from fedprivacy.accounting.events import (
    FixedCohortSampling,
    GaussianEvent,
    Neighbouring,
    NoSampling,
    PoissonSampling,
    PrivacyEvent,
    Sampling,
    event_from_dict,
)

__all__ = [
    "LEDGER_FORMAT",
    "UNITS",
    "Accountant",
    "Budget",
    "LedgerEntry",
    "PrivacyBudgetExhausted",
    "epsilon_for",
]

LEDGER_FORMAT = "fedprivacy.ledger/v1"
UNITS = ("user", "example")


class PrivacyBudgetExhausted(RuntimeError):
    """Raised *before* a release that would take epsilon (at the budget's delta) above the budget."""


def _check_delta(delta: Any, name: str = "delta") -> float:
    if isinstance(delta, bool) or not isinstance(delta, int | float):
        raise TypeError(f"{name} must be a real number, got {type(delta).__name__}")
    delta = float(delta)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {delta}")
    return delta


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """A privacy budget: epsilon at most ``epsilon`` at ``delta``."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        if isinstance(self.epsilon, bool) or not isinstance(self.epsilon, int | float):
            raise TypeError(f"epsilon must be a real number, got {type(self.epsilon).__name__}")
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be > 0 and finite, got {self.epsilon}")
        object.__setattr__(self, "epsilon", float(self.epsilon))
        object.__setattr__(self, "delta", _check_delta(self.delta))


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerEntry:
    """One spent event: what, in which round (None outside rounds), for which unit, when (Unix time)."""

    event: PrivacyEvent
    round: int | None
    unit: str
    timestamp: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": self.event.to_dict(),
            "round": self.round,
            "unit": self.unit,
            "timestamp": self.timestamp,
        }


def _check_unit(unit: Any) -> str:
    if not isinstance(unit, str):
        raise TypeError(f"unit must be a str, got {type(unit).__name__}")
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(UNITS)}, got {unit!r}")
    return unit


def _fsync_dir(folder: Path) -> None:
    """fsync a directory (POSIX): makes a rename or a new file in it durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _run_key(event: PrivacyEvent) -> PrivacyEvent:
    return event.with_count(1)


@dataclass(slots=True, kw_only=True)
class _Plan:
    """What spending ``event`` next would make of the ledger's composition (a cache, never state)."""

    event: PrivacyEvent
    runs: list[tuple[PrivacyEvent, int]]
    prefix: Any
    last_state: Any
    epsilons: dict[float, float] = field(default_factory=dict)


class Accountant:
    """Append-only privacy ledger with a budget, composed by one backend under one relation.

    Args:
        backend: registered backend name: "pld" (default, tightest), "rdp" or "prv".
        neighbouring: the neighbouring relation every claim is about.
        budget: optional ``Budget``; ``spend`` refuses events that would exceed it.
        unit: the unit of privacy, "user" or "example"; every claim is labelled with it.
    """

    def __init__(
        self,
        *,
        backend: str = "pld",
        neighbouring: Neighbouring | str = Neighbouring.ADD_REMOVE,
        budget: Budget | None = None,
        unit: str = "user",
    ) -> None:
        self._backend: Backend = get_backend(backend)
        self._backend_name = backend
        self._neighbouring = Neighbouring.parse(neighbouring)
        if budget is not None and not isinstance(budget, Budget):
            raise TypeError(f"budget must be a Budget or None, got {type(budget).__name__}")
        self._budget = budget
        self._unit = _check_unit(unit)
        self._ledger: tuple[LedgerEntry, ...] = ()
        # Runs of identical consecutive events: list of (event with count 1, total count).
        self._runs: list[tuple[PrivacyEvent, int]] = []
        self._prefix: Any = None  # composed state of self._runs[:-1] (None if fewer than 2 runs)
        self._last_state: Any = None  # state of self._runs[-1], cached
        self._eps_cache: dict[float, float] = {}
        self._planned: _Plan | None = None  # the last _plan (a cache: dropped by every change)

    # ------------------------------------------------------------------ properties
    @property
    def backend(self) -> str:
        return self._backend_name

    @property
    def neighbouring(self) -> Neighbouring:
        return self._neighbouring

    @property
    def budget(self) -> Budget | None:
        return self._budget

    @property
    def unit(self) -> str:
        return self._unit

    @property
    def ledger(self) -> tuple[LedgerEntry, ...]:
        return self._ledger

    @property
    def steps(self) -> int:
        """Total number of releases (sum of counts) in the ledger."""
        return sum(count for _, count in self._runs)

    # ------------------------------------------------------------------ support
    def _check_event(self, event: Any) -> PrivacyEvent:
        if not isinstance(event, PrivacyEvent):
            raise TypeError(f"event must be a PrivacyEvent, got {type(event).__name__}")
        reason = self._backend.unsupported_reason(event, self._neighbouring)
        if reason is not None:
            raise ValueError(
                f"unsupported event for accountant={self._backend_name}, "
                f"neighbouring={self._neighbouring.value}: {reason}"
            )
        return event

    def supports(self, event: Any) -> bool:
        """Whether the backend can bound ``event`` under this relation. Never raises."""
        if not isinstance(event, PrivacyEvent):
            return False
        return self._backend.unsupported_reason(event, self._neighbouring) is None

    def unsupported_reason(self, event: PrivacyEvent) -> str | None:
        """None if ``supports(event)``, else why not (one line)."""
        if not isinstance(event, PrivacyEvent):
            return f"event must be a PrivacyEvent, got {type(event).__name__}"
        return self._backend.unsupported_reason(event, self._neighbouring)

    # ------------------------------------------------------------------ composition (pure helpers)
    def _last_run_state(self) -> Any:
        if self._last_state is None and self._runs:
            ev, count = self._runs[-1]
            self._last_state = self._backend.run_state(ev, count, self._neighbouring)
        return self._last_state

    def _total_state(self) -> Any:
        last = self._last_run_state()
        if self._prefix is None:
            return last
        return self._backend.compose(self._prefix, last)

    def _plan(self, event: PrivacyEvent) -> tuple[list[tuple[PrivacyEvent, int]], Any, Any]:
        """Runs, prefix state and last-run state after appending ``event``; mutates nothing.

        Cached for the last event asked about: a round asks ``would_exceed``, ``epsilon_if`` and
        ``spend`` about the same event, and each would otherwise self-compose the last run again.
        """
        planned = self._planned
        if planned is not None and planned.event == event:
            return planned.runs, planned.prefix, planned.last_state
        runs, prefix, last_state = self._compute_plan(event)
        self._planned = _Plan(event=event, runs=runs, prefix=prefix, last_state=last_state)
        return runs, prefix, last_state

    def _compute_plan(self, event: PrivacyEvent) -> tuple[list[tuple[PrivacyEvent, int]], Any, Any]:
        key = _run_key(event)
        b, nb = self._backend, self._neighbouring
        if self._runs and self._runs[-1][0] == key:
            runs = [*self._runs[:-1], (key, self._runs[-1][1] + event.count)]
            prefix = self._prefix
        else:
            runs = [*self._runs, (key, event.count)]
            if self._runs:
                last = self._last_run_state()
                prefix = last if self._prefix is None else b.compose(self._prefix, last)
            else:
                prefix = None
        last_state = b.run_state(runs[-1][0], runs[-1][1], nb)
        return runs, prefix, last_state

    def _epsilon_of(self, prefix: Any, last_state: Any, delta: float) -> float:
        if last_state is None:
            return 0.0
        state = last_state if prefix is None else self._backend.compose(prefix, last_state)
        return self._backend.epsilon(state, delta=delta)

    def _planned_epsilon(self, event: PrivacyEvent, delta: float) -> float:
        """Epsilon at ``delta`` after ``event`` (the same computation as ``epsilon`` after spending
        it, so the value is carried over by ``spend``); cached with the plan."""
        _, prefix, last_state = self._plan(event)
        planned = self._planned
        assert planned is not None
        if delta not in planned.epsilons:
            planned.epsilons[delta] = self._epsilon_of(prefix, last_state, delta)
        return planned.epsilons[delta]

    # ------------------------------------------------------------------ queries
    def epsilon(self, *, delta: float) -> float:
        """Epsilon spent so far at ``delta`` (0.0 for an empty ledger); an upper bound."""
        delta = _check_delta(delta)
        if delta not in self._eps_cache:
            if not self._runs:
                return 0.0
            self._eps_cache[delta] = self._backend.epsilon(self._total_state(), delta=delta)
        return self._eps_cache[delta]

    def delta(self, *, epsilon: float) -> float:
        """Delta spent so far at ``epsilon`` (0.0 for an empty ledger); an upper bound.

        ValueError for the "prv" backend, which reports epsilon only.
        """
        if isinstance(epsilon, bool) or not isinstance(epsilon, int | float):
            raise TypeError(f"epsilon must be a real number, got {type(epsilon).__name__}")
        if not (math.isfinite(epsilon) and epsilon >= 0):
            raise ValueError(f"epsilon must be >= 0 and finite, got {epsilon}")
        if not self._runs:
            return 0.0
        return self._backend.delta(self._total_state(), epsilon=float(epsilon))

    def epsilon_if(self, event: PrivacyEvent, *, delta: float) -> float:
        """Epsilon at ``delta`` if ``event`` were spent next. Changes nothing."""
        delta = _check_delta(delta)
        event = self._check_event(event)
        return self._planned_epsilon(event, delta)

    def would_exceed(self, event: PrivacyEvent) -> bool:
        """True if spending ``event`` would take epsilon above the budget (False without a budget)."""
        event = self._check_event(event)
        if self._budget is None:
            return False
        return self.epsilon_if(event, delta=self._budget.delta) > self._budget.epsilon

    # ------------------------------------------------------------------ the one mutation
    def spend(
        self,
        event: PrivacyEvent,
        *,
        round: int | None = None,
        write_ahead: Callable[[LedgerEntry], None] | None = None,
        released: bool = False,
    ) -> None:
        """Record ``event``. Raises (ValueError, TypeError, PrivacyBudgetExhausted) before any change.

        Call it before the release: if it raises, nothing may be released. ``write_ahead`` is called
        with the new entry after every check and before the in-memory commit (a durable journal
        writes it there, :class:`fedprivacy.accounting.journal.ChargeJournal`); if it raises, the
        accountant is unchanged. ``released=True`` records an event that has *already* been
        released (found out after the fact): no budget check, since refusing would refund what was
        seen; the caller checks :meth:`epsilon` against the budget afterwards and stops.
        """
        event = self._check_event(event)
        if round is not None and (isinstance(round, bool) or not isinstance(round, int)):
            raise TypeError(f"round must be an int or None, got {type(round).__name__}")
        if round is not None and round < 0:
            raise ValueError(f"round must be >= 0, got {round}")
        self._check_charged_ahead(event)
        runs, prefix, last_state = self._plan(event)
        if self._budget is not None and not released:
            eps = self._planned_epsilon(event, self._budget.delta)
            if eps > self._budget.epsilon:
                raise PrivacyBudgetExhausted(
                    f"spending this event would raise epsilon to {eps:.6g} > budget "
                    f"{self._budget.epsilon:g} at delta={self._budget.delta:g} "
                    f"({self._unit}-level, {self._neighbouring.value}); nothing was spent"
                )
        entry = LedgerEntry(event=event, round=round, unit=self._unit, timestamp=time.time())
        if write_ahead is not None:
            write_ahead(entry)
        # Commit: plain assignments only, after every check.
        self._ledger = (*self._ledger, entry)
        self._runs, self._prefix, self._last_state = runs, prefix, last_state
        planned = self._planned
        # epsilon() of the new ledger is the planned epsilon: the same states composed the same way
        self._eps_cache = dict(planned.epsilons) if planned is not None and planned.event == event else {}
        self._planned = None

    def _check_charged_ahead(self, event: PrivacyEvent) -> None:
        """A zero-loss :class:`ChargedAhead` only follows a charge of the very event it covers, for at
        most ``horizon - 1`` rounds per such charge."""
        from fedprivacy.accounting.events import ChargedAhead

        mech = event.mechanism
        if not isinstance(mech, ChargedAhead):
            return
        charges = sum(1 for e in self._ledger if e.event == mech.covers)
        if charges == 0:
            raise ValueError("a ChargedAhead event needs the horizon's charge before it: the ledger does not "
                             f"hold the event it covers ({mech.covers.mechanism!r})")
        used = sum(e.event.count for e in self._ledger
                   if isinstance(e.event.mechanism, ChargedAhead) and e.event.mechanism.covers == mech.covers)
        if used + event.count > charges * (mech.horizon - 1):
            raise ValueError(f"ChargedAhead covers {mech.horizon - 1} rounds after each horizon's charge; "
                             "this one would exceed them")

    # ------------------------------------------------------------------ reporting
    def claim(self, *, delta: float) -> dict[str, Any]:
        """The privacy claim at ``delta``, labelled with unit, relation, mechanism and accountant."""
        delta = _check_delta(delta)
        kinds = sorted({ev.mechanism.kind for ev, _ in self._runs})
        multipliers = sorted(
            {
                float(getattr(ev.mechanism, "noise_multiplier", 0.0))
                for ev, _ in self._runs
                if isinstance(ev.mechanism, GaussianEvent) or hasattr(ev.mechanism, "sampling_description")
            }
        )
        # a registered mechanism that carries its own sampling (fedprivacy.accounting.completion) says so
        samplings = list(dict.fromkeys(getattr(ev.mechanism, "sampling_description", None)
                                       or ev.sampling.describe() for ev, _ in self._runs))
        return {
            "unit": self._unit,
            "neighbouring": self._neighbouring.value,
            "mechanism": kinds[0] if len(kinds) == 1 else kinds,
            "noise_multiplier": (
                multipliers[0] if len(multipliers) == 1 else (multipliers or None)
            ),
            "sampling": samplings[0] if len(samplings) == 1 else samplings,
            "steps": self.steps,
            "accountant": self._backend_name,
            "epsilon": self.epsilon(delta=delta),
            "delta": delta,
            "bound": "upper",
        }

    # ------------------------------------------------------------------ persistence
    def to_json(self) -> dict[str, Any]:
        return {
            "format": LEDGER_FORMAT,
            "backend": self._backend_name,
            "neighbouring": self._neighbouring.value,
            "unit": self._unit,
            "budget": (
                None
                if self._budget is None
                else {"epsilon": self._budget.epsilon, "delta": self._budget.delta}
            ),
            "entries": [e.to_dict() for e in self._ledger],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Accountant:
        """Rebuild an accountant from ``to_json()``; every field is validated (ValueError otherwise)."""
        if not isinstance(d, Mapping):
            raise ValueError(f"ledger must be a JSON object, got {type(d).__name__}")
        expected = {"format", "backend", "neighbouring", "unit", "budget", "entries"}
        if set(d) != expected:
            raise ValueError(f"ledger fields must be {sorted(expected)}, got {sorted(d)}")
        if d["format"] != LEDGER_FORMAT:
            raise ValueError(f"ledger format must be {LEDGER_FORMAT!r}, got {d['format']!r}")
        budget_d = d["budget"]
        budget = None
        if budget_d is not None:
            if not isinstance(budget_d, Mapping) or set(budget_d) != {"epsilon", "delta"}:
                raise ValueError(
                    f"ledger budget must be null or {{epsilon, delta}}, got {budget_d!r}"
                )
            try:
                budget = Budget(epsilon=budget_d["epsilon"], delta=budget_d["delta"])
            except TypeError as exc:
                raise ValueError(f"ledger budget is invalid: {exc}") from None
        try:
            acc = cls(
                backend=d["backend"], neighbouring=d["neighbouring"], budget=budget, unit=d["unit"]
            )
        except TypeError as exc:
            raise ValueError(f"ledger header is invalid: {exc}") from None
        entries = d["entries"]
        if not isinstance(entries, list):
            raise ValueError(f"ledger entries must be a list, got {type(entries).__name__}")
        acc._restore([acc.entry_from_dict(e, f"ledger entry {i}") for i, e in enumerate(entries)])
        return acc

    def entry_from_dict(self, e: Any, what: str = "ledger entry") -> LedgerEntry:
        """A ``LedgerEntry`` from ``LedgerEntry.to_dict()``, validated for this accountant."""
        if not isinstance(e, Mapping) or set(e) != {"event", "round", "unit", "timestamp"}:
            raise ValueError(f"{what} must have fields event, round, unit, timestamp")
        event = event_from_dict(e["event"])
        reason = self.unsupported_reason(event)
        if reason is not None:
            raise ValueError(f"{what} is not supported by {self.backend}: {reason}")
        rnd = e["round"]
        if rnd is not None and (isinstance(rnd, bool) or not isinstance(rnd, int) or rnd < 0):
            raise ValueError(f"{what} round must be null or an int >= 0, got {rnd!r}")
        if e["unit"] != self.unit:
            raise ValueError(f"{what} unit must be {self.unit!r}, got {e['unit']!r}")
        ts = e["timestamp"]
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
            raise ValueError(f"{what} timestamp must be a finite number, got {ts!r}")
        return LedgerEntry(event=event, round=rnd, unit=self.unit, timestamp=float(ts))

    def restore_entries(self, entries: Sequence[LedgerEntry]) -> None:
        """Replace the (empty) ledger by ``entries`` without budget checks: they were spent.

        ValueError if this accountant already holds entries.
        """
        if self._ledger:
            raise ValueError("restore_entries needs an empty accountant")
        self._restore(entries)

    def _restore(self, entries: Sequence[LedgerEntry]) -> None:
        """Replay ``entries`` into an empty accountant without budget checks (they were spent)."""
        runs: list[tuple[PrivacyEvent, int]] = []
        for entry in entries:
            key = _run_key(entry.event)
            if runs and runs[-1][0] == key:
                runs[-1] = (key, runs[-1][1] + entry.event.count)
            else:
                runs.append((key, entry.event.count))
        b, nb = self._backend, self._neighbouring
        prefix = None
        for ev, count in runs[:-1]:
            state = b.run_state(ev, count, nb)
            prefix = state if prefix is None else b.compose(prefix, state)
        self._ledger = tuple(entries)
        self._runs = runs
        self._prefix = prefix
        self._last_state = None
        self._eps_cache = {}
        self._planned = None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ledger as JSON atomically: a temporary file in the same directory, then rename."""
        path = Path(path)
        data = json.dumps(self.to_json(), indent=1, allow_nan=False)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, user_file_mode())  # as open() would: mkstemp's 0600 hides the ledger
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            _fsync_dir(path.parent)  # the rename itself is durable only once the directory is
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Accountant:
        """Read a ledger written by ``save``; validates every field."""
        with open(path, encoding="utf-8") as fh:
            try:
                d = json.load(fh)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"ledger file {os.fspath(path)!r} is not valid JSON: {exc}"
                ) from None
        return cls.from_json(d)

    def __repr__(self) -> str:
        return (
            f"Accountant(backend={self._backend_name!r}, neighbouring={self._neighbouring.value!r}, "
            f"unit={self._unit!r}, budget={self._budget!r}, steps={self.steps})"
        )


def epsilon_for(
    *,
    noise_multiplier: float,
    sample_rate: float | None = None,
    sampling: Sampling | None = None,
    steps: int,
    delta: float,
    backend: str = "pld",
    neighbouring: Neighbouring | str = Neighbouring.ADD_REMOVE,
    sensitivity: float = 1.0,
) -> float:
    """Epsilon of ``steps`` Gaussian releases with ``noise_multiplier``, on a fresh accountant.

    Give exactly one of ``sample_rate`` (Poisson sampling at that rate) or ``sampling``.
    """
    if (sample_rate is None) == (sampling is None):
        raise ValueError("give exactly one of sample_rate or sampling")
    if sampling is None:
        sampling = PoissonSampling(rate=sample_rate)  # type: ignore[arg-type]
    if not isinstance(sampling, NoSampling | PoissonSampling | FixedCohortSampling):
        raise TypeError(f"sampling must be a sampling value, got {type(sampling).__name__}")
    event = PrivacyEvent(
        mechanism=GaussianEvent(noise_multiplier=noise_multiplier, sensitivity=sensitivity),
        sampling=sampling,
        count=steps,
    )
    acc = Accountant(backend=backend, neighbouring=neighbouring)
    acc._check_event(event)
    return acc.epsilon_if(event, delta=delta)
