"""Sampling a population given as a ``range``: the same draws as the list path, exactly Poisson at rate q
over a million ids, from the source it is given (AES-256-CTR in a secure run)."""

from __future__ import annotations

import math

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fedprivacy.config import RunConfig
from fedprivacy.dp.rng import RandomSource
from fedprivacy.fl.round_inputs import root_source
from fedprivacy.fl.sampling import fixed_cohort_sample, poisson_sample

KEY = bytes(range(32))
P_FLOOR = 1e-6  # a fixed-seed check fails only if its statistic is this unlikely under the true law


def _source(kind: str, seed: int) -> RandomSource:
    return RandomSource.seeded(seed) if kind == "seeded" else RandomSource.keyed(seed.to_bytes(32, "little"))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), start=st.integers(0, 5), q=st.floats(1e-4, 1.0), seed=st.integers(0, 2**32),
       kind=st.sampled_from(["seeded", "keyed"]))
def test_a_range_population_draws_the_cohort_of_the_list_path(n: int, start: int, q: float, seed: int,
                                                              kind: str) -> None:
    # Arrange: the same ids as a list (the element-by-element path) and as a range (numpy)
    ids = range(start, start + n)
    # Act
    fast = poisson_sample(ids, sample_rate=q, rng=_source(kind, seed))
    slow = poisson_sample(list(ids), sample_rate=q, rng=_source(kind, seed))
    # Assert
    assert fast == slow and all(type(p) is int for p in fast)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2000), data=st.data(), seed=st.integers(0, 2**32))
def test_a_range_population_draws_the_fixed_cohort_of_the_list_path(n: int, data: st.DataObject,
                                                                    seed: int) -> None:
    m = data.draw(st.integers(1, n))
    fast = fixed_cohort_sample(range(n), cohort_size=m, rng=RandomSource.seeded(seed))
    slow = fixed_cohort_sample(list(range(n)), cohort_size=m, rng=RandomSource.seeded(seed))
    assert fast == slow and all(type(p) is int for p in fast)


def test_the_sampler_takes_one_aes_ctr_uniform_per_id_from_its_source() -> None:
    # Arrange: the reference, straight from AES-256-CTR (counter block 0): uint64 words >> 11, times 2^-53
    n, q = 100_000, 0.01
    stream = Cipher(algorithms.AES(KEY), modes.CTR(bytes(16))).encryptor().update(bytes(8 * n))
    u = (np.frombuffer(stream, dtype="<u8") >> np.uint64(11)).astype(np.float64) * 2.0**-53
    # Act
    cohort = poisson_sample(range(n), sample_rate=q, rng=RandomSource.keyed(KEY))
    # Assert
    assert cohort == np.flatnonzero(u < q).tolist()


def test_a_secure_run_samples_from_the_secure_source() -> None:
    # Arrange: the app's default (seed -1) against the seeded research mode
    secure = root_source(RunConfig.from_mapping({"seed": -1})).child("server", 1).child("sampling")
    seeded = root_source(RunConfig.from_mapping({"seed": 3})).child("server", 1).child("sampling")
    # Act
    draws = {tuple(poisson_sample(range(10_000), sample_rate=0.01, rng=secure.child(i))) for i in range(3)}
    # Assert
    assert secure.is_private and secure.describe().startswith("secure (AES-256-CTR")
    assert not seeded.is_private and len(draws) == 3


def test_poisson_over_a_million_ids_is_binomial_in_cohort_size_and_in_every_inclusion() -> None:
    # Arrange: N = 10^6 ids, q = 10^-3 (1000 a round), T = 100 rounds from one AES-CTR source
    n, q, rounds = 1_000_000, 1e-3, 100
    rng = RandomSource.keyed(KEY)
    # Act
    cohorts = [poisson_sample(range(n), sample_rate=q, rng=rng) for _ in range(rounds)]
    # Assert: cohort sizes ~ Binomial(N, q): mean within 5 sd, variance within the chi-square law
    sizes = np.array([len(c) for c in cohorts], dtype=np.float64)
    var = n * q * (1 - q)
    assert abs(sizes.mean() - n * q) < 5 * math.sqrt(var / rounds)
    chi = (rounds - 1) * sizes.var(ddof=1) / var
    assert stats.chi2.ppf(P_FLOOR / 2, rounds - 1) < chi < stats.chi2.ppf(1 - P_FLOOR / 2, rounds - 1)
    # every id's number of inclusions ~ Binomial(T, q): the histogram over the million ids
    counts = np.bincount(np.concatenate([np.asarray(c, dtype=np.int64) for c in cohorts]), minlength=n)
    observed = np.array([np.sum(counts == 0), np.sum(counts == 1), np.sum(counts == 2), np.sum(counts >= 3)])
    law = stats.binom(rounds, q)
    expected = n * np.array([law.pmf(0), law.pmf(1), law.pmf(2), law.sf(2)])
    assert stats.chisquare(observed, expected).pvalue > P_FLOOR
    # and no part of the id range is favoured: ten blocks of 10^5 ids, each ~ Binomial(10^5 T, q)
    blocks = counts.reshape(10, -1).sum(axis=1)
    assert stats.chisquare(blocks, np.full(10, blocks.sum() / 10)).pvalue > P_FLOOR
    assert counts.max() <= rounds and all(c == sorted(set(c)) for c in cohorts)
