"""Adaptive clipping (fedprivacy/dp/adaptive_clipping.py): the paper's update rule and Theorem 1.

References: Andrew, Thakkar, McMahan & Ramaswamy 2021 (Alg. 1, geometric update; Theorem 1), the
centred-count convention of tensorflow_privacy's QuantileEstimatorQuery, and dp-accounting's
composition of the two Gaussians as an independent accountant.
"""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from fedprivacy.accounting import (
    Accountant,
    GaussianEvent,
    NoSampling,
    PoissonSampling,
    PrivacyEvent,
    epsilon_for,
)
from fedprivacy.dp import RandomSource
from fedprivacy.dp.adaptive_clipping import (
    QuantileClipEstimator,
    composed_noise_multiplier,
    count_noise_std_for,
    update_noise_multiplier,
)

DELTA = 1e-5


def _estimator(**kw: float) -> QuantileClipEstimator:
    args = {"initial_clip_norm": 0.1, "target_quantile": 0.5, "learning_rate": 0.2,
            "count_noise_std": 5.0, "expected_cohort": 100.0}
    args.update(kw)
    return QuantileClipEstimator(**args)


# ----------------------------------------------------------------------------- the update rule
def test_geometric_update_is_the_papers_rule() -> None:
    est = _estimator(initial_clip_norm=2.0, target_quantile=0.3, learning_rate=0.5)

    c1 = est.update(0.8)   # too many unclipped: shrink
    c2 = est.update(0.0)   # all clipped: grow

    assert c1 == pytest.approx(2.0 * math.exp(-0.5 * (0.8 - 0.3)), rel=1e-15)
    assert c2 == pytest.approx(c1 * math.exp(-0.5 * (0.0 - 0.3)), rel=1e-15)
    assert est.clip_norm == c2 and est.state().rounds == 2


def test_noisy_fraction_centres_the_bits_and_clamps() -> None:
    est = _estimator(count_noise_std=0.0, expected_cohort=4.0)
    rng = RandomSource.seeded(0)

    assert est.noisy_fraction([True, True, False, False], rng=rng) == 0.5
    assert est.noisy_fraction([True, True, True, True], rng=rng) == 1.0
    assert est.noisy_fraction([True, False, False], rng=rng) == pytest.approx((1 - 1.5) / 4 + 0.5)
    assert est.noisy_fraction([True] * 9, rng=rng) == 1.0  # clamped
    assert est.noisy_fraction([], rng=rng) == 0.5


def test_count_noise_has_std_sigma_b_over_m() -> None:
    est = _estimator(count_noise_std=5.0, expected_cohort=100.0)
    rng = RandomSource.seeded(1)
    bits = [True] * 50 + [False] * 50

    draws = np.asarray([est.noisy_fraction(bits, rng=rng) for _ in range(4000)])

    assert abs(draws.mean() - 0.5) < 4 * 0.05 / math.sqrt(4000)
    assert draws.std() == pytest.approx(5.0 / 100.0, rel=0.05)


@pytest.mark.parametrize("gamma", [0.3, 0.5, 0.8])
def test_private_estimate_tracks_the_target_quantile(gamma: float) -> None:
    # Norms lognormal(0, 0.5) (the paper's §4 shows it tracks real update-norm distributions); after
    # 300 rounds of 100 clients with sigma_b = m/20 the clip sits at the gamma-quantile (+-10%).
    rng = np.random.default_rng(3)
    est = _estimator(initial_clip_norm=0.05, target_quantile=gamma,
                     count_noise_std=count_noise_std_for(100))
    src = RandomSource.seeded(4)
    tail = []
    for rnd in range(300):
        norms = rng.lognormal(0.0, 0.5, size=100)
        est.update(est.noisy_fraction([est.below(n) for n in norms], rng=src))
        if rnd >= 250:
            tail.append(est.clip_norm)

    true_q = math.exp(0.5 * float(norm.ppf(gamma)))
    assert np.median(tail) == pytest.approx(true_q, rel=0.10)


def test_state_round_trip_and_refusals() -> None:
    a = _estimator()
    a.update(0.9)
    b = _estimator(initial_clip_norm=7.0)
    b.load_state_dict(a.state_dict())
    assert b.clip_norm == a.clip_norm and b.state() == a.state()

    with pytest.raises(ValueError, match="keys"):
        b.load_state_dict({"clip_norm": 1.0})
    with pytest.raises(ValueError, match="clip_norm must be a finite number > 0"):
        b.load_state_dict({"clip_norm": -1.0, "rounds": 1, "last_fraction": None})
    with pytest.raises(ValueError, match="last_fraction"):
        b.load_state_dict({"clip_norm": 1.0, "rounds": 1, "last_fraction": 2.0})
    assert b.state() == a.state()


@pytest.mark.parametrize("kw,match", [
    ({"target_quantile": 1.0}, "target_quantile"),
    ({"learning_rate": 0.0}, "learning_rate"),
    ({"count_noise_std": -1.0}, "count_noise_std"),
    ({"initial_clip_norm": 0.0}, "initial_clip_norm"),
    ({"expected_cohort": 0.0}, "expected_cohort"),
])
def test_bad_parameters_name_themselves(kw: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _estimator(**kw)


# ----------------------------------------------------------------------------- Theorem 1
@settings(max_examples=50, deadline=None)
@given(z=st.floats(0.3, 5.0), m=st.integers(10, 10_000))
def test_split_then_compose_gives_back_z(z: float, m: int) -> None:
    sb = count_noise_std_for(m)
    if 2 * sb <= z:
        with pytest.raises(ValueError, match="count_noise_std must be >"):
            update_noise_multiplier(noise_multiplier=z, count_noise_std=sb)
        return

    zd = update_noise_multiplier(noise_multiplier=z, count_noise_std=sb)

    assert zd > z
    assert composed_noise_multiplier(update_noise_multiplier=zd, count_noise_std=sb) == pytest.approx(
        z, rel=1e-12)


def _pair(z: float, m: int) -> tuple[float, float, dpa.DpEvent]:
    sb = count_noise_std_for(m)
    zd = update_noise_multiplier(noise_multiplier=z, count_noise_std=sb)
    # Independent: dp-accounting composes the update Gaussian (std/sensitivity = zd) and the count
    # Gaussian (std sigma_b over sensitivity 1/2) as two releases.
    return zd, sb, dpa.ComposedDpEvent([dpa.GaussianDpEvent(zd), dpa.GaussianDpEvent(sb / 0.5)])


@pytest.mark.parametrize("z,m,rounds", [(1.0, 100, 50), (0.7, 40, 20), (2.0, 1000, 200)])
def test_ledger_event_equals_dp_accountings_rdp_composition_of_the_two_gaussians(
        z: float, m: int, rounds: int) -> None:
    zd, _, pair = _pair(z, m)
    ref = dpa.rdp.RdpAccountant()
    ref.compose(dpa.SelfComposedDpEvent(pair, rounds))
    acc = Accountant(backend="rdp")
    acc.spend(PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=z), sampling=NoSampling(),
                           count=rounds))

    assert acc.epsilon(delta=DELTA) == pytest.approx(ref.get_epsilon(DELTA), rel=1e-9)
    # the update's noise alone would be under-accounted if the count were ignored
    alone = epsilon_for(noise_multiplier=zd, sampling=NoSampling(), steps=rounds, delta=DELTA)
    assert alone < acc.epsilon(delta=DELTA)


def test_ledger_event_equals_dp_accountings_pld_composition_of_the_two_gaussians() -> None:
    _, _, pair = _pair(1.0, 100)
    ref = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    ref.compose(dpa.SelfComposedDpEvent(pair, 30))
    acc = Accountant()
    acc.spend(PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=1.0), sampling=NoSampling(),
                           count=30))

    # ours is the exact analytic Gaussian; dp-accounting's pessimistic PLD sits just above it
    assert acc.epsilon(delta=DELTA) <= ref.get_epsilon(DELTA)
    assert acc.epsilon(delta=DELTA) == pytest.approx(ref.get_epsilon(DELTA), rel=5e-3)


def test_sampled_pair_is_one_sampled_gaussian_of_z() -> None:
    # With Poisson sampling both queries see the same cohort, so the pair is the sampled Gaussian of z
    # (Theorem 1 is per release); dp-accounting's RDP of that event is the independent reference.
    z, m, q, rounds = 1.1, 100, 0.1, 100
    sb = count_noise_std_for(m)
    zd = update_noise_multiplier(noise_multiplier=z, count_noise_std=sb)
    z_back = composed_noise_multiplier(update_noise_multiplier=zd, count_noise_std=sb)
    rdp = dpa.rdp.RdpAccountant()
    rdp.compose(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z_back)),
                                        rounds))
    acc = Accountant(backend="rdp")
    acc.spend(PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=z),
                           sampling=PoissonSampling(rate=q), count=rounds))

    assert acc.epsilon(delta=DELTA) == pytest.approx(rdp.get_epsilon(DELTA), rel=1e-9)
