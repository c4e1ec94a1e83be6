"""What a run produced: its status, the ``results.json`` content and the final model.

``results.json`` is :meth:`Results.to_json`; its ``status`` is a :class:`RunStatus` value, one of the
statuses of :mod:`fedprivacy.exit_codes` (or ``pending``/``running`` while the run is not over).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from fedprivacy.fl.types import RoundRecord

if TYPE_CHECKING:
    from fedprivacy.accounting.accountant import Accountant
    from fedprivacy.fl.privacy import PrivacyPlan

__all__ = ["Results", "RunResult", "RunStatus"]


class RunStatus(StrEnum):
    """Where a run stands; the last three are the statuses a finished run reports."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    BUDGET_EXHAUSTED = "budget-exhausted"
    CLIENTS_FAILED = "clients-failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class Results:
    """The content of ``results.json``.

    Attributes:
        run_name: the run folder's name (else the config's ``run-name``).
        run_dir: the run folder (None: a run that writes nothing).
        status: how the run ended.
        stopped: why it stopped early, else None.
        population: the number of partitions N.
        resumed: one entry per resumption (after which round, when).
        config: the run config's mapping (kebab-case keys).
        resolved: the plan's noise multiplier (and whether it was calibrated), denominator, N.
        rounds: the published rows, one per completed round.
        privacy: the mode's claim, with the participation and write-ahead blocks.
        seconds: the run's total wall time.
        dpsgd: the example-level DP-SGD block (None without DP-SGD).
    """

    run_name: str
    run_dir: str | None
    status: RunStatus
    stopped: str | None
    population: int
    resumed: list[dict[str, Any]]
    config: dict[str, Any]
    resolved: dict[str, Any]
    rounds: list[dict[str, Any]]
    privacy: dict[str, Any]
    seconds: float
    dpsgd: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``results.json`` mapping (its keys in this order; ``dpsgd`` only with DP-SGD)."""
        out: dict[str, Any] = {
            "run_name": self.run_name, "run_dir": self.run_dir, "status": self.status.value,
            "stopped": self.stopped, "population": self.population, "resumed": self.resumed,
            "config": self.config, "resolved": self.resolved, "rounds": self.rounds,
            "privacy": self.privacy, "seconds": self.seconds,
        }
        if self.dpsgd is not None:
            out["dpsgd"] = self.dpsgd
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """What a run produced.

    Attributes:
        status: how the run ended (a :class:`RunStatus`, equal to its string).
        stopped: why the run stopped early, else None.
        weights: the final global weights.
        accountant: the run's user-level accountant (None without DP).
        records: one :class:`RoundRecord` per completed round.
        plan: the privacy plan.
        results: the ``results.json`` content (:meth:`Results.to_json`, what
            :class:`fedprivacy.fl.callbacks.OutputsCallback` writes).
    """

    status: RunStatus
    stopped: str | None
    weights: tuple[np.ndarray, ...]
    accountant: Accountant | None
    records: tuple[RoundRecord, ...]
    plan: PrivacyPlan
    results: dict[str, Any]
