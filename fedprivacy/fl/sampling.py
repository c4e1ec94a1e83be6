"""Client sampling for DP-FedAvg, exactly as it is reported to the accountant.

Two schemes (STYLE.md, convention 10: the server samples with exactly the rate or cohort it reports):

* **Poisson sampling** at rate ``q``: each of the ``N`` partitions joins the round independently with
  probability ``q`` (McMahan et al. 2018, "Learning differentially private recurrent language models",
  Alg. 1). Privacy is amplified by sampling under add-remove adjacency (Zhu & Wang 2019).
* **Fixed-size cohorts**: ``m`` of ``N`` partitions uniformly without replacement. This is *not* Poisson
  sampling and is accounted as sampling without replacement under replace-one adjacency (Balle, Barthe &
  Gaboardi 2018, Thm. 10), or refused by the config.

Both return partition ids in ascending order, so everything downstream (message order, summation order)
is independent of the transport's node ids. Randomness is an argument (a ``RandomSource``). A population
given as a ``range`` (ids ``0..N-1``) is sampled with numpy alone, from the very same draws: a round over
a million clients costs one vector of N uniforms, not N Python objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeGuard

import numpy as np

if TYPE_CHECKING:
    from fedprivacy.dp.rng import RandomSource


def poisson_sample(population: Sequence[int], *, sample_rate: float, rng: RandomSource) -> list[int]:
    """Each id joins independently with probability ``sample_rate``; returns the ids sorted."""
    if not 0.0 < sample_rate <= 1.0:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
    if _is_id_range(population):
        if not len(population):
            return []
        draws = rng.uniform(size=len(population))
        return (population.start + np.flatnonzero(draws < sample_rate)).tolist()
    ids = sorted(map(int, population))
    if len(set(ids)) != len(ids):
        raise ValueError("population must not contain duplicate ids")
    if not ids:
        return []
    draws = rng.uniform(size=len(ids))
    return [p for p, u in zip(ids, draws, strict=True) if u < sample_rate]


def fixed_cohort_sample(population: Sequence[int], *, cohort_size: int, rng: RandomSource) -> list[int]:
    """``cohort_size`` ids uniformly without replacement; returns them sorted."""
    if _is_id_range(population):
        if not 1 <= cohort_size <= len(population):
            raise ValueError(f"cohort_size must be in [1, {len(population)}], got {cohort_size}")
        order = rng.permutation(len(population))
        return np.sort(population.start + order[:cohort_size].astype(np.int64)).tolist()
    ids = sorted(map(int, population))
    if len(set(ids)) != len(ids):
        raise ValueError("population must not contain duplicate ids")
    if not 1 <= cohort_size <= len(ids):
        raise ValueError(f"cohort_size must be in [1, {len(ids)}], got {cohort_size}")
    order = rng.permutation(len(ids))
    return sorted(ids[int(i)] for i in order[:cohort_size])


def _is_id_range(population: Sequence[int]) -> TypeGuard[range]:
    """Whether ``population`` is a ``range`` of consecutive ids (sorted, distinct by construction)."""
    return isinstance(population, range) and population.step == 1


def expected_cohort(*, sampling: str, population: int, sample_rate: float, cohort_size: int) -> float:
    """The fixed aggregation denominator: ``q·N`` for Poisson sampling, ``m`` for fixed cohorts.

    Dividing the (noisy) sum by this constant rather than by the number of replies keeps the sensitivity
    of the average at exactly ``C / denominator`` (McMahan et al. 2018, the "fixed-denominator
    estimator" f̃_f); dividing by the random cohort size would leak it and break the bound.
    """
    if population < 1:
        raise ValueError(f"population must be >= 1, got {population}")
    if sampling == "poisson":
        return sample_rate * population
    if sampling == "fixed":
        return float(cohort_size)
    raise ValueError(f"sampling must be 'poisson' or 'fixed', got {sampling!r}")
