"""Aggregation: fixed denominator, server re-clipping, NaN/Inf filter, central noise, order."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedprivacy.dp.rng import RandomSource
from fedprivacy.fl.aggregation import PlainAggregator
from fedprivacy.fl.types import ClientUpdate

LIKE = [np.zeros((3, 2), np.float32), np.zeros(4, np.float32)]


def _update(pid: int, scale: float) -> ClientUpdate:
    return ClientUpdate(partition_id=pid, delta=(np.full((3, 2), scale, np.float32), np.full(4, scale, np.float32)))


def test_mean_uses_fixed_denominator_not_reply_count() -> None:
    # Arrange: two tiny updates (norm < C) and a denominator of 10 (expected cohort)
    ups = [_update(0, 0.1), _update(1, 0.2)]
    # Act
    res = PlainAggregator(clip_norm=5.0, noise_std=0.0).aggregate(ups, like=LIKE, denominator=10.0,
                                                                   rng=RandomSource.seeded(0))
    # Assert: (0.1 + 0.2) / 10, not / 2
    np.testing.assert_allclose(res.mean_update[0], np.full((3, 2), 0.03), rtol=1e-6)
    assert res.aggregated == (0, 1) and res.dropped == {} and res.denominator == 10.0


def test_server_reclips_each_update_to_clip_norm() -> None:
    big = _update(0, 100.0)
    res = PlainAggregator(clip_norm=1.0, noise_std=0.0).aggregate([big], like=LIKE, denominator=1.0,
                                                                   rng=RandomSource.seeded(0))
    norm = np.sqrt(sum(np.sum(np.square(a, dtype=np.float64)) for a in res.mean_update))
    assert norm == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_updates_are_left_out_with_a_reason(bad: float) -> None:
    poisoned = _update(1, 0.1)
    poisoned.delta[1][2] = bad
    res = PlainAggregator(clip_norm=1.0, noise_std=0.0).aggregate(
        [_update(0, 0.1), poisoned], like=LIKE, denominator=2.0, rng=RandomSource.seeded(0))
    assert res.aggregated == (0,)
    assert "NaN/Inf" in res.dropped[1]
    assert all(np.all(np.isfinite(a)) for a in res.mean_update)


def test_wrong_shapes_and_duplicates_are_left_out() -> None:
    wrong = ClientUpdate(partition_id=2, delta=(np.zeros((2, 3), np.float32), np.zeros(4, np.float32)))
    res = PlainAggregator(clip_norm=1.0, noise_std=0.0).aggregate(
        [_update(0, 0.1), _update(0, 0.2), wrong], like=LIKE, denominator=1.0, rng=RandomSource.seeded(0))
    assert res.aggregated == (0,)
    assert "shape" in res.dropped[2] and "duplicate" in res.dropped[0]


def test_result_does_not_depend_on_reply_order() -> None:
    rng_vals = RandomSource.seeded(4)
    ups = [ClientUpdate(partition_id=i, delta=tuple(rng_vals.child(i).normal(std=0.3, size=a.shape).astype(np.float32)
                                                   for a in LIKE)) for i in range(6)]
    agg = PlainAggregator(clip_norm=1.0, noise_std=0.7)
    a = agg.aggregate(ups, like=LIKE, denominator=3.0, rng=RandomSource.seeded(1))
    b = agg.aggregate(ups[::-1], like=LIKE, denominator=3.0, rng=RandomSource.seeded(1))
    for x, y in zip(a.mean_update, b.mean_update, strict=True):
        np.testing.assert_array_equal(x, y)


def _mode_round(privacy: str, like: list[np.ndarray], updates: list[ClientUpdate] | None = None):
    """One round of the registered mode ``privacy`` over an exchange that returns ``updates``."""
    from fedprivacy.config import RunConfig
    from fedprivacy.fl.modes import Transport, get_mode
    from fedprivacy.fl.types import RoundInstructions

    cfg = RunConfig(privacy=privacy, clip_norm=1.0, noise_multiplier=2.0, accountant="rdp",
                    target_delta=1e-3)
    mode = get_mode(privacy)
    plan = mode.plan(cfg, population=4, dim=sum(a.size for a in like))
    rnd = mode.round_fn(cfg, plan, Transport(exchange=lambda instr, cohort, w: (updates or [], {})))
    client = mode.client_mechanism
    instr = RoundInstructions(round=1, privacy=privacy, clip_norm=1.0,
                              client_mechanism=client.name if client is not None else "",
                              noise_multiplier=plan.noise_multiplier if client is not None else 0.0,
                              private=plan.event is not None, learning_rate=0.1, local_epochs=1, batch_size=1, num_classes=2, seed=0)
    return rnd(instr, [0, 1, 2, 3], like, RandomSource.seeded(2)).aggregate


def test_central_noise_has_std_sigma_c_on_the_sum() -> None:
    # sigma * C = 2.0 on the sum, denominator 4 -> std 0.5 on the mean; 200k coordinates
    like = [np.zeros(200_000, np.float32)]
    res = _mode_round("central", like)
    sample = res.mean_update[0].astype(np.float64)
    assert abs(sample.mean()) < 5 * 0.5 / np.sqrt(sample.size)
    assert sample.std() == pytest.approx(0.5, rel=0.01)  # sd of the sd estimate ~0.16%
    assert res.noise_std == 2.0 and res.denominator == 4.0


def test_modes_place_noise_where_documented() -> None:
    big = [ClientUpdate(partition_id=0, delta=(np.full(4, 3.0, np.float32),))]  # norm 6 > C = 1
    like = [np.zeros(4, np.float32)]
    none = _mode_round("none", like, big)
    assert none.noise_std == 0.0  # server clips to C, adds nothing
    assert float(np.linalg.norm(none.mean_update[0])) == pytest.approx(1.0 / 4, rel=1e-6)
    local = _mode_round("local", like, big)
    assert local.noise_std == 0.0  # clients already clipped and noised: the server only sums
    np.testing.assert_allclose(local.mean_update[0], np.full(4, 3.0 / 4), rtol=1e-6)


@settings(max_examples=40, deadline=None)
@given(vals=st.lists(arrays(np.float32, 6, elements=st.floats(-1e3, 1e3, width=32)), min_size=1, max_size=8),
       c=st.floats(0.01, 10), denom=st.floats(0.5, 20))
def test_noiseless_mean_norm_is_at_most_m_c_over_denominator(vals: list, c: float, denom: float) -> None:
    like = [np.zeros(6, np.float32)]
    ups = [ClientUpdate(partition_id=i, delta=(v,)) for i, v in enumerate(vals)]
    res = PlainAggregator(clip_norm=c, noise_std=0.0).aggregate(ups, like=like, denominator=denom,
                                                                 rng=RandomSource.seeded(0))
    norm = float(np.linalg.norm(res.mean_update[0].astype(np.float64)))
    assert norm <= len(vals) * c / denom * (1 + 1e-5)


def _reference_aggregate(updates: list[ClientUpdate], like: list[np.ndarray], *, clip_norm: float,
                         denominator: float) -> tuple[tuple[np.ndarray, ...], dict[int, str]]:
    """The rule in the module docstring, written out with the generic checks (no fast path)."""
    from fedprivacy.fl.aggregation import clip_to_norm, non_finite_reason

    total = [np.zeros(a.shape, np.float64) for a in like]
    dropped: dict[int, str] = {}
    for u in sorted(updates, key=lambda u: u.partition_id):
        reason = non_finite_reason(u.delta, like)
        if reason is not None:
            dropped[u.partition_id] = reason
            continue
        for acc, d in zip(total, clip_to_norm(u.delta, clip_norm=clip_norm), strict=True):
            acc += d
    return tuple((acc / denominator).astype(ref.dtype) for acc, ref in zip(total, like, strict=True)), dropped


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), c=st.floats(0.05, 5.0), n=st.integers(1, 12))
def test_aggregate_equals_the_generic_checks_bit_for_bit(seed: int, c: float, n: int) -> None:
    # Arrange: client-clipped float32 replies (their cast may land just above C), raw ones, a float64
    # one, a float16 one, a NaN one and a wrong-shaped one
    from fedprivacy.dp.clipping import clip_arrays

    rng = np.random.default_rng(seed)
    like = [np.zeros((5, 3), np.float32), np.zeros(3, np.float32)]
    ups = []
    for pid in range(n):
        raw = [rng.normal(scale=rng.uniform(0.01, 3.0), size=a.shape) for a in like]
        kind = pid % 6
        if kind == 0:
            delta = tuple(a.astype(np.float32) for a in raw)
        elif kind == 1:
            clipped, _ = clip_arrays(raw, clip_norm=c)
            delta = tuple(a.astype(np.float32) for a in clipped)
        elif kind == 2:
            delta = tuple(raw)
        elif kind == 3:
            delta = tuple(a.astype(np.float16) for a in raw)
        elif kind == 4:
            delta = tuple(a.astype(np.float32) for a in raw)
            delta[1][0] = np.nan
        else:
            delta = (np.zeros((3, 5), np.float32), np.zeros(3, np.float32))
        ups.append(ClientUpdate(partition_id=pid, delta=delta))
    # Act
    res = PlainAggregator(clip_norm=c, noise_std=0.0).aggregate(ups, like=like, denominator=float(n),
                                                                 rng=RandomSource.seeded(0))
    # Assert
    mean, dropped = _reference_aggregate(ups, like, clip_norm=c, denominator=float(n))
    assert res.dropped == dropped
    for got, ref in zip(res.mean_update, mean, strict=True):
        assert got.dtype == ref.dtype
        np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_client_sending_the_largest_finite_floats_is_clipped_to_c_like_the_generic_path(dtype: type) -> None:
    # Arrange: a deviating client fills its reply with its dtype's extremes (the fast path's "no square
    # overflows in float64" at its edge), beside an honest one; 20k entries: past numpy's pairwise block
    big = np.finfo(dtype).max
    like = [np.zeros(20_000, dtype), np.zeros(3, dtype)]
    attacker = ClientUpdate(partition_id=0, delta=(np.full(20_000, big, dtype),
                                                   np.array([-big, big, -big], dtype)))
    honest = ClientUpdate(partition_id=1, delta=(np.full(20_000, 1e-3, dtype), np.zeros(3, dtype)))
    c = 0.5
    # Act
    res = PlainAggregator(clip_norm=c, noise_std=0.0).aggregate([attacker, honest], like=like, denominator=2.0,
                                                                 rng=RandomSource.seeded(0))
    # Assert: nobody dropped, the attacker's share of the sum is at most C, and bit for bit the generic checks
    assert res.dropped == {} and tuple(res.aggregated) == (0, 1)
    alone = PlainAggregator(clip_norm=c, noise_std=0.0).aggregate([attacker], like=like, denominator=1.0,
                                                                   rng=RandomSource.seeded(0))
    assert math.sqrt(sum(float(np.sum(np.square(a.astype(np.float64)))) for a in alone.mean_update)) <= c * (1 + 1e-3)
    mean, dropped = _reference_aggregate([attacker, honest], like, clip_norm=c, denominator=2.0)
    assert dropped == {}
    for got, ref in zip(res.mean_update, mean, strict=True):
        np.testing.assert_array_equal(got, ref)
