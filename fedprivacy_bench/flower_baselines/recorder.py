"""Timestamps and metrics collected by a baseline ServerApp (same process as the runner)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RoundRecorder:
    """Collects, per server round, the central test accuracy, epsilon and round duration.

    A round's duration is measured from the start of the previous central evaluation to the start
    of this one, so it covers one central evaluation, sampling, the message exchanges, local
    training, aggregation and noise: the same span as fedprivacy's per-round ``seconds`` (round
    plus evaluation) and the torch loop's.
    """

    t_start: float = field(default_factory=time.perf_counter)
    last_exit: float | None = None
    last_enter: float | None = None
    round_seconds: list[float] = field(default_factory=list)
    accuracy: list[float | None] = field(default_factory=list)  # None: round not evaluated
    epsilon: list[float | None] = field(default_factory=list)
    first_round_end: float | None = None
    params: int | None = None
    notes: list[str] = field(default_factory=list)
    failed_rounds: list[int] = field(default_factory=list)
    last_weights: list[np.ndarray] | None = None  # the latest released global model
    _last_digest: bytes | None = None

    def check_update(self, server_round: int, weights: Sequence[np.ndarray]) -> None:
        """Note rounds after which the global model did not change (aggregation failed)."""
        h = hashlib.sha256()
        for w in weights:
            h.update(np.ascontiguousarray(w).tobytes())
        digest = h.digest()
        if server_round > 0 and digest == self._last_digest:
            self.failed_rounds.append(server_round)
        self._last_digest = digest

    def enter(self, server_round: int) -> None:
        now = time.perf_counter()
        previous = self.last_enter if self.last_enter is not None else self.last_exit
        if server_round > 0 and previous is not None:
            self.round_seconds.append(now - previous)
            if server_round == 1:
                self.first_round_end = now
        self.last_enter = now

    def leave(self, server_round: int, *, accuracy: float | None, epsilon: float | None) -> None:
        if server_round > 0:
            self.accuracy.append(accuracy)
            self.epsilon.append(epsilon)
        self.last_exit = time.perf_counter()
