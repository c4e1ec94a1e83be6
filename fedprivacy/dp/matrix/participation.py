"""Samplers that enforce the participation schema the accountant is told about.

* :func:`cyclic_poisson_cohort`: Algorithm 2 of Choquette-Choo et al. 2023 ("(Amplified) Banded
  Matrix Factorization", arXiv 2306.08153). Clients are split once into ``num_groups`` fixed groups by
  their position in the sorted id list; round t includes each client of group ``t mod num_groups``
  independently with probability ``sample_rate`` (uniform draws from the given RandomSource).
* :class:`MinSepLedger`: checks every cohort against b-min-separation and the participation cap
  before it runs, and records it only when it was accepted (check first, change state last).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from fedprivacy.dp.matrix.accounting import CyclicPoisson, MinSeparation
from fedprivacy.dp.rng import RandomSource

__all__ = ["MinSepLedger", "cyclic_poisson_cohort"]


def cyclic_poisson_cohort(clients: Sequence[int], *, schema: CyclicPoisson, round_index: int,
                          rng: RandomSource) -> list[int]:
    """The clients of round ``round_index`` (0-based) under block-cyclic Poisson sampling."""
    ids = sorted(set(int(c) for c in clients))
    if len(ids) < schema.num_groups:
        raise ValueError(f"num_groups={schema.num_groups} exceeds the {len(ids)} clients")
    group = ids[round_index % schema.num_groups::schema.num_groups]
    u = np.asarray(rng.uniform(size=len(group)))
    return [c for c, x in zip(group, u, strict=True) if x < schema.sample_rate]


class MinSepLedger:
    """Refuses a cohort that would break b-min-separation or the cap on participations."""

    def __init__(self, schema: MinSeparation) -> None:
        self._schema = schema
        self._last: dict[int, int] = {}
        self._count: dict[int, int] = {}
        self._round = -1

    def violations(self, round_index: int, cohort: Iterable[int]) -> list[str]:
        """Why ``cohort`` may not run in ``round_index`` (empty when it may)."""
        out = []
        if round_index <= self._round:
            out.append(f"round {round_index} is not after the last recorded round {self._round}")
        k = self._schema.max_participations
        for c in sorted(set(int(x) for x in cohort)):
            last = self._last.get(c)
            if last is not None and round_index - last < self._schema.min_separation:
                out.append(f"client {c} took part in round {last}, < {self._schema.min_separation} rounds ago")
            if k is not None and self._count.get(c, 0) >= k:
                out.append(f"client {c} already took part {k} times")
        return out

    def eligible(self, round_index: int, clients: Iterable[int]) -> list[int]:
        """The clients that may take part in ``round_index``."""
        return [c for c in clients if not self.violations(round_index, [c])]

    def record(self, round_index: int, cohort: Iterable[int]) -> None:
        """Record a cohort that ran; raises ValueError (and records nothing) if it breaks the schema."""
        members = sorted(set(int(x) for x in cohort))
        bad = self.violations(round_index, members)
        if bad:
            raise ValueError(f"cohort breaks {self._schema.describe()}: {bad[0]}")
        for c in members:
            self._last[c] = round_index
            self._count[c] = self._count.get(c, 0) + 1
        self._round = round_index
