"""Client sampling: exactly the scheme that is accounted."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivacy.dp.rng import RandomSource
from fedprivacy.fl.sampling import expected_cohort, fixed_cohort_sample, poisson_sample


def test_poisson_rate_one_takes_everyone_sorted() -> None:
    assert poisson_sample([3, 1, 2, 0], sample_rate=1.0, rng=RandomSource.seeded(0)) == [0, 1, 2, 3]


def test_poisson_inclusion_frequency_matches_rate() -> None:
    # Arrange: 200 ids x 200 rounds = 40k Bernoulli(q) draws
    q, n, trials = 0.1, 200, 200
    rng = RandomSource.seeded(11)
    counts = np.zeros(n)
    for t in range(trials):
        for pid in poisson_sample(range(n), sample_rate=q, rng=rng.child(t)):
            counts[pid] += 1
    total = counts.sum()
    sd = math.sqrt(n * trials * q * (1 - q))
    assert abs(total - n * trials * q) < 5 * sd
    # each id: Binomial(200, 0.1), mean 20, sd ~4.2; all within 6 sd
    assert np.all(np.abs(counts - trials * q) < 6 * math.sqrt(trials * q * (1 - q)))


def test_poisson_cohort_size_varies() -> None:
    rng = RandomSource.seeded(3)
    sizes = {len(poisson_sample(range(50), sample_rate=0.3, rng=rng.child(i))) for i in range(30)}
    assert len(sizes) > 3  # not a fixed-size cohort in disguise


def test_seeded_sampling_is_reproducible_and_secure_is_not_fixed() -> None:
    a = poisson_sample(range(100), sample_rate=0.5, rng=RandomSource.seeded(5).child("server", 1))
    b = poisson_sample(range(100), sample_rate=0.5, rng=RandomSource.seeded(5).child("server", 1))
    assert a == b
    draws = {tuple(poisson_sample(range(100), sample_rate=0.5, rng=RandomSource.secure())) for _ in range(3)}
    assert len(draws) == 3


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 60), data=st.data(), seed=st.integers(0, 2**32))
def test_fixed_cohort_is_m_distinct_sorted_members(n: int, data: st.DataObject, seed: int) -> None:
    m = data.draw(st.integers(1, n))
    ids = list(range(100, 100 + n))
    cohort = fixed_cohort_sample(ids, cohort_size=m, rng=RandomSource.seeded(seed))
    assert len(cohort) == m == len(set(cohort))
    assert cohort == sorted(cohort) and set(cohort) <= set(ids)


def test_fixed_cohort_marginals_are_uniform() -> None:
    n, m, trials = 20, 5, 2000
    rng = RandomSource.seeded(9)
    counts = np.zeros(n)
    for t in range(trials):
        counts[fixed_cohort_sample(range(n), cohort_size=m, rng=rng.child(t))] += 1
    p = m / n
    assert np.all(np.abs(counts - trials * p) < 6 * math.sqrt(trials * p * (1 - p)))


def test_fixed_cohort_refuses_too_large_cohort() -> None:
    with pytest.raises(ValueError, match="cohort_size"):
        fixed_cohort_sample(range(3), cohort_size=4, rng=RandomSource.seeded(0))


def test_expected_cohort_is_the_fixed_denominator() -> None:
    assert expected_cohort(sampling="poisson", population=200, sample_rate=0.05, cohort_size=0) == 10.0
    assert expected_cohort(sampling="fixed", population=200, sample_rate=1.0, cohort_size=7) == 7.0
    with pytest.raises(ValueError, match="sampling"):
        expected_cohort(sampling="uniform", population=2, sample_rate=1.0, cohort_size=0)
