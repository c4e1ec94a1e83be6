"""Streamed correlated noise equals the dense C^{-1} Z, holds O(b d) / O(buffers d), resumes exactly."""

import numpy as np
import pytest
from scipy.linalg import solve_triangular

from fedprivacy.dp.matrix import Blt, StreamingNoise, Workload, bsr
from fedprivacy.dp.rng import RandomSource

STRATEGIES = [bsr(Workload(num_rounds=20), 1), bsr(Workload(num_rounds=20), 4),
              bsr(Workload(num_rounds=20, momentum=0.9), 20),
              Blt(num_rounds=20, buf_decay=(0.3, 0.95), output_scale=(0.25, 0.1))]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name + str(s.band))
def test_streamed_noise_is_the_dense_inverse_times_z(strategy) -> None:
    n, d, std = strategy.num_rounds, 7, 1.5
    # the stream's draws, row by row, from a fresh source with the same seed
    src = RandomSource.seeded(5)
    rows = [src.normal(std=std, size=d) for _ in range(n)]
    stream = StreamingNoise(strategy, dim=d, noise_std=std, rng=RandomSource.seeded(5))
    got = np.stack([stream.next() for _ in range(n)])
    want = solve_triangular(strategy.matrix(), np.stack(rows), lower=True)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="all drawn"):
        stream.next()


def test_banded_noise_holds_at_most_b_minus_one_past_rounds() -> None:
    n, d, b = 50, 1000, 6
    stream = StreamingNoise(bsr(Workload(num_rounds=n), b), dim=d, noise_std=1.0, rng=RandomSource.seeded(0))
    held = []
    for _ in range(n):
        stream.next()
        held.append(stream.held_floats())
    assert max(held) == (b - 1) * d  # plus the returned round: b * d <= (b + 1) * d


def test_blt_noise_holds_one_buffer_per_decay() -> None:
    blt = Blt(num_rounds=200, buf_decay=(0.2, 0.5, 0.99), output_scale=(0.1, 0.1, 0.1))
    stream = StreamingNoise(blt, dim=500, noise_std=1.0, rng=RandomSource.seeded(0))
    for _ in range(200):
        stream.next()
        assert stream.held_floats() == 3 * 500


def test_a_restored_stream_continues_with_the_same_noise() -> None:
    s = bsr(Workload(num_rounds=12), 3)
    a = StreamingNoise(s, dim=4, noise_std=1.0, rng=RandomSource.seeded(9))
    for _ in range(5):
        a.next()
    state = a.state_dict()
    rest_a = [a.next() for _ in range(7)]
    b_rng = RandomSource.seeded(9)
    b_rng.normal(std=1.0, size=5 * 4)  # the same generator position
    b = StreamingNoise(s, dim=4, noise_std=1.0, rng=b_rng)
    b.load_state_dict(state)
    np.testing.assert_array_equal(np.stack([b.next() for _ in range(7)]), np.stack(rest_a))


def test_a_malformed_state_is_refused_and_leaves_the_stream_as_it_was() -> None:
    s = bsr(Workload(num_rounds=12), 3)
    a = StreamingNoise(s, dim=4, noise_std=1.0, rng=RandomSource.seeded(9))
    bad = {"round": 5, "past": [np.zeros(4)], "buffers": np.zeros((0, 4))}  # needs 2 past arrays
    with pytest.raises(ValueError, match="past"):
        a.load_state_dict(bad)
    assert a.round == 0 and a.held_floats() == 0


@pytest.mark.parametrize("kwargs,match", [({"dim": 0, "noise_std": 1.0}, "dim"),
                                          ({"dim": 3, "noise_std": 0.0}, "noise_std")])
def test_bad_arguments_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StreamingNoise(bsr(Workload(num_rounds=4), 2), **kwargs)
