"""A participating client's figure (fedprivacy.accounting.participants) against independent computations.

The pair's weights against a brute-force enumeration of who is sampled; its epsilon against
dp-accounting's own Gaussian PLDs mixed as pmfs (pessimistic above, optimistic below); properties
(monotone in T and z, between the public's pair and the unamplified Gaussian) by hypothesis.
"""

from __future__ import annotations

import itertools
import logging
import math

import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivacy.accounting.accountant import Accountant
from fedprivacy.accounting.events import GaussianEvent, Neighbouring, NoSampling, PrivacyEvent
from fedprivacy.accounting.participants import ParticipantRoundGaussian, participant_weights
from tests.accounting.test_accounting_completion import mixture

logging.getLogger("absl").setLevel(logging.ERROR)
# N = 100, q = 0.1, T = 100, t = 6 (the digits MLP's accounted multipliers: all the noise, and the
# noise one participant does not know, 5/7 of it)
Z, ZP, Q, T, DELTA = 0.999931081301083, 0.8450960000721298, 0.1, 100, 1e-5


def _eps(mech: object, steps: int, delta: float = DELTA) -> float:
    acc = Accountant(backend="pld", neighbouring=Neighbouring.ADD_REMOVE)
    acc.spend(PrivacyEvent(mechanism=mech, sampling=NoSampling()).with_count(steps))
    return acc.epsilon(delta=delta)


def _mech(z: float, zp: float, q: float, w: tuple[float, float, float]) -> ParticipantRoundGaussian:
    return ParticipantRoundGaussian(noise_multiplier=z, participant_noise_multiplier=zp, sample_rate=q,
                                    seen_weight=w[0], gaussian_weight=w[1], subsampled_weight=w[2])


def _reference(z: float, zp: float, q: float, w: tuple[float, float, float], *, grid: float,
               pessimistic: bool) -> pld_lib.PrivacyLossDistribution:
    def g(rate: float, s: float) -> pld_lib.PrivacyLossDistribution:
        return pld_lib.from_gaussian_mechanism(s, sampling_prob=rate, value_discretization_interval=grid,
                                               pessimistic_estimate=pessimistic,
                                               use_connect_dots=pessimistic)
    return mixture([(w[0], g(1.0, zp)), (w[1], g(1.0, z)), (w[2], g(q, z)), (1.0 - sum(w), None)],
                   grid=grid, pessimistic=pessimistic)


def _brute(others: int, q: float, m0: int) -> tuple[float, float, float]:
    """Enumerate j's, i's and every other client's inclusion; completes iff the cohort is >= m0."""
    labels = {"p": 0.0, "g": 0.0, "s": 0.0, "0": 0.0}
    for j, i, *rest in itertools.product((0, 1), repeat=others + 2):
        b = sum(rest)
        prob = math.prod(q if x else 1 - q for x in (j, i, *rest))
        if b + j + i < m0:
            continue
        if j:
            labels["p" if i else "0"] += prob
        elif b < m0:  # i decides the round
            labels["g"] += prob
        else:  # b + 1 >= m0 too: subsampled (i in or out)
            labels["s"] += prob
    total = sum(labels.values())
    return labels["p"] / total, labels["g"] / total, labels["s"] / total


@pytest.mark.parametrize(("population", "q", "m0"), [(8, 0.3, 3), (9, 0.5, 4), (7, 0.2, 1)])
def test_weights_are_the_enumerated_view_of_the_worse_population(population: int, q: float, m0: int) -> None:
    w = participant_weights(population=population, sample_rate=q, completes=lambda n: n >= m0)
    cands = [_brute(o, q, m0) for o in (population - 2, population - 1)]
    assert w.seen == pytest.approx(max(c[0] for c in cands), rel=1e-12)
    assert w.seen + w.gaussian == pytest.approx(max(c[0] + c[1] for c in cands), rel=1e-12)
    assert w.seen + w.gaussian + w.subsampled == pytest.approx(max(sum(c) for c in cands), rel=1e-12)


def test_the_review_setting_is_the_dp_accounting_mixture() -> None:
    w = participant_weights(population=100, sample_rate=Q, completes=lambda n: n >= 6)
    weights = (w.seen, w.gaussian, w.subsampled)
    assert weights == pytest.approx((0.0105138, 0.0036015, 0.8931455), abs=1e-6)
    eps = _eps(_mech(Z, ZP, Q, weights), T)
    assert eps == pytest.approx(13.2516, abs=2e-3)
    upper = _reference(Z, ZP, Q, weights, grid=1e-3, pessimistic=True).self_compose(T)
    lower = _reference(Z, ZP, Q, weights, grid=1e-3, pessimistic=False).self_compose(T)
    assert lower.get_epsilon_for_delta(DELTA) <= eps <= upper.get_epsilon_for_delta(DELTA) + 1e-9
    assert upper.get_epsilon_for_delta(DELTA) <= eps * 1.001
    # the adversary that ignores its own noise and sees the roster in the rounds it joins (i in with
    # q^2, nothing with q(1-q), the public's subsampled Gaussian otherwise): an attack, below it
    attack = mixture([(Q * Q, pld_lib.from_gaussian_mechanism(Z, value_discretization_interval=1e-3,
                                                             pessimistic_estimate=False, use_connect_dots=False)),
                      (Q * (1 - Q), None),
                      (1 - Q, pld_lib.from_gaussian_mechanism(Z, sampling_prob=Q, value_discretization_interval=1e-3,
                                                              pessimistic_estimate=False, use_connect_dots=False))],
                     grid=1e-3, pessimistic=False).self_compose(T).get_epsilon_for_delta(DELTA)
    assert 10.4 < attack < eps < 1.3 * attack
    assert _eps(GaussianEvent(noise_multiplier=ZP), T) > 119  # the figure it replaces


def test_replace_one_and_outer_sampling_are_refused() -> None:
    m = _mech(Z, ZP, Q, (0.01, 0.0, 0.9))
    assert m.pld(neighbouring=Neighbouring.REPLACE_ONE, sampling=NoSampling()) is None
    assert m.rdp([2.0], neighbouring=Neighbouring.REPLACE_ONE, sampling=NoSampling()) is None
    with pytest.raises(ValueError, match="participant_noise_multiplier"):
        _mech(0.8, 0.9, Q, (0.01, 0.0, 0.9))
    with pytest.raises(ValueError, match="sum <= 1"):
        _mech(Z, ZP, Q, (0.5, 0.3, 0.3))


@settings(max_examples=3, deadline=None)
@given(q=st.floats(0.02, 0.5), z=st.floats(0.9, 2.0), frac=st.floats(0.7, 1.0), steps=st.integers(1, 6))
def test_never_below_the_reference_and_ordered(q: float, z: float, frac: float, steps: int) -> None:
    # every cohort completes: the weights are the unconditional q^2, 0, 1 - q
    w = participant_weights(population=50, sample_rate=q, completes=lambda n: True)
    weights = (w.seen, w.gaussian, w.subsampled)
    assert weights == pytest.approx((q * q, 0.0, 1 - q), abs=1e-12)
    zp = z * frac
    pld = _mech(z, zp, q, weights).pld(neighbouring=Neighbouring.ADD_REMOVE, sampling=NoSampling())
    eps = pld.self_compose(steps).get_epsilon_for_delta(1e-5)
    lower = _reference(z, zp, q, weights, grid=2e-3, pessimistic=False).self_compose(steps)
    assert eps >= lower.get_epsilon_for_delta(1e-5) - 1e-9
    assert eps <= pld.self_compose(steps + 1).get_epsilon_for_delta(1e-5) + 1e-9  # monotone in T
    louder = _mech(z * 1.1, zp * 1.1, q, weights).pld(neighbouring=Neighbouring.ADD_REMOVE,
                                                       sampling=NoSampling())
    assert eps >= louder.self_compose(steps).get_epsilon_for_delta(1e-5) - 1e-9  # and in z
    unamplified = pld_lib.from_gaussian_mechanism(zp / math.sqrt(steps), value_discretization_interval=1e-4)
    assert eps <= unamplified.get_epsilon_for_delta(1e-5) + 1e-3  # never above no amplification
