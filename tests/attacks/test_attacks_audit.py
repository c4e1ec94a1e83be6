"""Audit math against closed forms and hand-computed binomial values; broken mechanisms are caught."""

import math

import numpy as np
import pytest
from scipy import stats

from fedprivacy.attacks.audit import (
    audit_dp_fedavg,
    audit_gaussian_mechanism,
    clopper_pearson_interval,
    clopper_pearson_upper,
    epsilon_lower_from_counts,
    epsilon_lower_from_scores,
    one_run_audit_gaussian,
    one_run_epsilon_lower,
    one_run_guesses,
    one_run_p_value,
)
from fedprivacy.dp.rng import RandomSource


def test_clopper_pearson_zero_successes_has_closed_form() -> None:
    # P[Bin(n, p) <= 0] = (1 - p)^n = alpha  =>  p = 1 - alpha^(1/n)
    assert clopper_pearson_upper(0, 10, alpha=0.05) == pytest.approx(
        1 - 0.05 ** (1 / 10), rel=1e-10
    )
    assert clopper_pearson_upper(10, 10, alpha=0.05) == 1.0


@pytest.mark.parametrize(("k", "n"), [(1, 10), (7, 20), (50, 1000)])
def test_clopper_pearson_upper_inverts_the_binomial_cdf(k: int, n: int) -> None:
    hi = clopper_pearson_upper(k, n, alpha=0.025)
    assert stats.binom.cdf(k, n, hi) == pytest.approx(0.025, rel=1e-8)


def test_clopper_pearson_interval_all_successes() -> None:
    lo, hi = clopper_pearson_interval(20, 20, alpha=0.1)
    assert hi == 1.0
    assert lo == pytest.approx(
        0.05 ** (1 / 20), rel=1e-10
    )  # P[Bin(20, lo) >= 20] = lo^20 = alpha/2


def test_epsilon_from_counts_matches_hand_computation() -> None:
    # no errors in 100 + 100 trials, confidence 0.9: each rate <= 1 - 0.05^(1/100)
    r = 1 - 0.05 ** (1 / 100)
    expected = math.log((1 - 1e-5 - r) / r)
    got = epsilon_lower_from_counts(
        false_positives=0,
        negatives=100,
        false_negatives=0,
        positives=100,
        delta=1e-5,
        confidence=0.9,
    )
    assert got == pytest.approx(expected, rel=1e-10)


def test_epsilon_from_counts_is_zero_for_a_coin_flip() -> None:
    assert (
        epsilon_lower_from_counts(
            false_positives=50,
            negatives=100,
            false_negatives=50,
            positives=100,
            delta=0.0,
            confidence=0.95,
        )
        == 0.0
    )


def test_epsilon_from_scores_counts_errors_at_the_threshold() -> None:
    in_scores = np.array([1.0, 2.0, 3.0, 4.0])
    out_scores = np.array([-1.0, 0.0, 1.5, 5.0])
    # threshold 1.0: in-trials >= 1 -> 0 false negatives; out-trials >= 1 -> 2 false positives
    eps, t = epsilon_lower_from_scores(
        in_scores, out_scores, thresholds=[1.0], delta=0.0, confidence=0.9
    )
    fpr_hi = clopper_pearson_upper(2, 4, alpha=0.05)
    fnr_hi = clopper_pearson_upper(0, 4, alpha=0.05)
    expected = max(0.0, math.log((1 - fpr_hi) / fnr_hi), math.log((1 - fnr_hi) / fpr_hi))
    assert t == 1.0
    assert eps == pytest.approx(expected, rel=1e-12)


def test_one_run_pure_dp_all_correct_has_closed_form() -> None:
    # delta = 0, v = r = m: p = q^r, so eps_lower solves q = alpha^(1/r), eps = ln(q / (1 - q))
    q = 0.05 ** (1 / 100)
    assert one_run_p_value(m=100, r=100, v=100, epsilon=math.log(q / (1 - q)), delta=0.0) == (
        pytest.approx(0.05, rel=1e-9)
    )
    eps = one_run_epsilon_lower(m=100, r=100, v=100, delta=0.0, confidence=0.95)
    assert eps == pytest.approx(math.log(q / (1 - q)), abs=1e-5)


def test_one_run_p_value_with_delta_matches_hand_values() -> None:
    eps, delta = 1.0, 0.01
    q = math.exp(eps) / (1 + math.exp(eps))
    # m = r = v = 1: p = q + 2 * 1 * delta * P[B = 0] / 1
    assert one_run_p_value(m=1, r=1, v=1, epsilon=eps, delta=delta) == pytest.approx(
        q + 2 * delta * (1 - q), rel=1e-12
    )
    # m = 3, r = 2, v = 2: tail q^2; max over i=1: P[B=1], i=2: (P[B=1] + P[B=0]) / 2
    p1, p0 = 2 * q * (1 - q), (1 - q) ** 2
    expected = q**2 + 2 * 3 * delta * max(p1, (p1 + p0) / 2)
    assert one_run_p_value(m=3, r=2, v=2, epsilon=eps, delta=delta) == pytest.approx(
        expected, rel=1e-12
    )


def test_one_run_guesses_counts_correct_guesses() -> None:
    scores = np.array([0.1, 0.9, 0.5, 0.2, 0.8, 0.3])
    included = np.array([False, True, False, True, True, False])
    # top 2 (0.9, 0.8): both included; bottom 2 (0.1, 0.2): one excluded, one included
    assert one_run_guesses(scores, included, k_pos=2, k_neg=2) == (4, 3)


def test_gaussian_mechanism_audit_is_sound_and_reasonably_tight() -> None:
    res = audit_gaussian_mechanism(
        epsilon=2.0, delta=1e-5, trials=400_000, confidence=0.95, rng=RandomSource.seeded(1)
    )
    assert not res.broken
    assert 0.5 * 2.0 <= res.epsilon_lower <= 2.0


def test_broken_gaussian_mechanism_is_caught() -> None:
    res = audit_gaussian_mechanism(
        epsilon=2.0,
        delta=1e-5,
        trials=400_000,
        confidence=0.95,
        rng=RandomSource.seeded(2),
        noise_scale=0.5,
    )
    assert res.broken
    assert res.epsilon_lower > 2.0


def test_one_run_audit_of_gaussian_is_sound() -> None:
    res = one_run_audit_gaussian(
        epsilon=4.0, delta=1e-5, canaries=2000, confidence=0.95, rng=RandomSource.seeded(3)
    )
    assert 0.0 < res.epsilon_lower <= 4.0


def test_dp_fedavg_canary_audit_sound_and_broken_variant_caught() -> None:
    kw = dict(delta=1e-5, trials=2000, rounds=1, num_clients=2, dim=64, confidence=0.95)
    ok = audit_dp_fedavg(noise_multiplier=2.0, rng=RandomSource.seeded(4), **kw)
    bad = audit_dp_fedavg(
        noise_multiplier=2.0,
        rng=RandomSource.seeded(5),
        noise_scale=0.3,
        epsilon_claimed=ok.epsilon_claimed,
        **kw,
    )
    assert not ok.broken
    assert bad.broken


def test_audits_reject_too_few_trials_or_canaries() -> None:
    with pytest.raises(ValueError, match="trials"):
        audit_gaussian_mechanism(epsilon=1.0, delta=1e-5, trials=2, rng=RandomSource.seeded(0))
    with pytest.raises(ValueError, match="canaries"):
        one_run_audit_gaussian(epsilon=1.0, delta=1e-5, canaries=1, rng=RandomSource.seeded(0))
