"""``synthetic-lazy``: client k is a function of (seed, k) alone, made only when asked for."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fedprivacy.ml.datasets.synthetic import SyntheticOptions
from fedprivacy.ml.datasets.synthetic_lazy import (
    EVAL_CLIENTS,
    synthetic_client,
    synthetic_client_size,
)
from fedprivacy.ml.partition import DataSpec, load_partition, load_test_set, partition_size

SPEC = DataSpec(dataset="synthetic-lazy", seed=4)


def test_a_client_is_the_same_at_every_population_size_and_clients_differ() -> None:
    # Act
    small, large = load_partition(SPEC, 7, 10), load_partition(SPEC, 7, 1_000_000)
    other = load_partition(SPEC, 8, 1_000_000)
    # Assert
    assert np.array_equal(small.x, large.x) and np.array_equal(small.y, large.y)
    assert set(large.groups.tolist()) == {7} and large.x.shape[1] == 60 and large.num_classes == 10
    assert not np.array_equal(large.x[:1], other.x[:1])
    assert partition_size(SPEC, 7, 1_000_000) == len(large)


def test_the_last_of_a_million_clients_is_made_without_the_others() -> None:
    # Arrange
    tracemalloc.start()
    # Act
    split = load_partition(SPEC, 999_999, 1_000_000)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # Assert: one client's arrays (<= 1000 x 60 doubles and their copies), not a million clients'
    assert len(split) >= 1 and peak < 20 * 2**20


def test_client_sizes_follow_floor_lognormal_4_2_plus_50_capped_at_1000() -> None:
    # Arrange: 2000 clients' sizes (train + held out) against the CDF of min(floor(LogNormal(4, 2)) + 50, 1000)
    opts, k = SyntheticOptions(), 2000
    sizes = np.array([sum(len(s) for s in synthetic_client(opts, seed=1, test_fraction=0.2, client_id=c))
                      for c in range(k)])
    law = stats.lognorm(s=2.0, scale=math.exp(4.0))
    # Assert: at each threshold the share at or below it is Binomial(k, F) within 5 sd
    for t in (60, 100, 200, 500, 999):
        p = law.cdf(t - 50 + 1)  # floor(L) + 50 <= t  <=>  L < t - 49
        assert abs(np.mean(sizes <= t) - p) < 5 * math.sqrt(p * (1 - p) / k)
    assert sizes.min() >= 50 and sizes.max() == 1000


def test_the_test_set_pools_the_held_out_part_of_the_first_clients() -> None:
    # Act
    pooled = load_test_set(SPEC, 1_000_000)
    first = [synthetic_client(SPEC.options, seed=4, test_fraction=0.2, client_id=c)[1] for c in (0, 1)]
    # Assert: the same examples at every population of at least EVAL_CLIENTS clients, client 0 first
    assert np.array_equal(pooled.x, load_test_set(SPEC, EVAL_CLIENTS).x)
    assert set(pooled.groups.tolist()) == set(range(EVAL_CLIENTS))
    assert np.array_equal(pooled.x[:len(first[0]) + len(first[1])], np.concatenate([s.x for s in first]))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32), client=st.integers(0, 10**7), fraction=st.floats(0.05, 0.5))
def test_the_size_alone_is_the_size_of_the_client_it_would_make(seed: int, client: int, fraction: float) -> None:
    opts = SyntheticOptions()
    train, _ = synthetic_client(opts, seed=seed, test_fraction=fraction, client_id=client)
    assert synthetic_client_size(opts, seed=seed, test_fraction=fraction, client_id=client) == len(train)


def test_partition_size_of_a_lazy_data_set_is_its_partitions_length() -> None:
    assert [partition_size(SPEC, k, 10**6) for k in range(50)] == [len(load_partition(SPEC, k, 10**6))
                                                                   for k in range(50)]
