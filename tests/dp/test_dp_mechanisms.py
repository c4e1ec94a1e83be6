"""Mechanisms: calibrations against closed forms and dp-accounting; samplers by KS / chi-square."""

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld
from dp_accounting.pld import privacy_loss_mechanism as plm
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from fedprivacy.dp.mechanisms import (
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    analytic_gaussian_std,
    classic_gaussian_std,
    exponential_mechanism,
    gaussian_mechanism,
    laplace_mechanism,
    laplace_scale,
    report_noisy_max,
    report_noisy_max_scale,
)
from fedprivacy.dp.rng import RandomSource

ALPHA = 1e-4
KEY = bytes(range(100, 132))

eps_st = st.floats(min_value=0.01, max_value=30.0)
delta_st = st.floats(min_value=1e-12, max_value=0.2)
sens_st = st.floats(min_value=0.01, max_value=100.0)


# ------------------------------------------------------------------ calibrations
def test_laplace_scale_and_classic_gaussian_closed_forms() -> None:
    assert laplace_scale(sensitivity=2.0, epsilon=0.5) == 4.0
    assert classic_gaussian_std(sensitivity=1.0, epsilon=0.5, delta=1e-5) == pytest.approx(
        math.sqrt(2 * math.log(1.25e5)) / 0.5, rel=1e-15
    )


@pytest.mark.parametrize("eps", [1.0, 2.5])
def test_classic_gaussian_refuses_epsilon_at_least_one(eps: float) -> None:
    with pytest.raises(ValueError, match=r"epsilon must be < 1.*analytic_gaussian_std"):
        classic_gaussian_std(sensitivity=1.0, epsilon=eps, delta=1e-5)


@pytest.mark.parametrize(
    ("sigma", "sens", "eps"),
    [(1.0, 1.0, 0.5), (2.0, 1.0, 1.0), (0.7, 2.0, 3.0), (10.0, 1.0, 0.1), (0.3, 0.5, 8.0)],
)
def test_analytic_delta_matches_dp_accounting_and_closed_form(
    sigma: float, sens: float, eps: float
) -> None:
    ours = analytic_gaussian_delta(noise_std=sigma, sensitivity=sens, epsilon=eps)
    ref = plm.GaussianPrivacyLoss(sigma, sensitivity=sens).get_delta_for_epsilon(eps)
    assert ours == pytest.approx(ref, rel=1e-6)
    # Balle & Wang 2018, Theorem 8, evaluated naively with scipy's normal cdf
    a, b = sens / (2 * sigma), eps * sigma / sens
    naive = stats.norm.cdf(a - b) - math.exp(eps) * stats.norm.cdf(-a - b)
    assert ours == pytest.approx(naive, rel=1e-6)


def test_analytic_delta_at_zero_epsilon_is_total_variation() -> None:
    tv = 2 * stats.norm.cdf(0.5) - 1  # sigma = sensitivity = 1
    assert analytic_gaussian_delta(noise_std=1.0, sensitivity=1.0, epsilon=0.0) == pytest.approx(
        tv, rel=1e-12
    )


@pytest.mark.parametrize(("sigma", "delta"), [(1.0, 1e-5), (5.0, 1e-6)])
def test_analytic_epsilon_matches_dp_accounting_pld(sigma: float, delta: float) -> None:
    ref = pld.from_gaussian_mechanism(sigma, sensitivity=1.0).get_epsilon_for_delta(delta)
    ours = analytic_gaussian_epsilon(noise_std=sigma, sensitivity=1.0, delta=delta)
    assert ours == pytest.approx(ref, rel=1e-6)


@settings(max_examples=150, deadline=None)
@given(eps=eps_st, delta=delta_st, sens=sens_st)
def test_calibrated_sigma_never_overshoots_and_is_tight(
    eps: float, delta: float, sens: float
) -> None:
    sigma = analytic_gaussian_std(sensitivity=sens, epsilon=eps, delta=delta)
    assert analytic_gaussian_delta(noise_std=sigma, sensitivity=sens, epsilon=eps) <= delta
    ref = plm.GaussianPrivacyLoss(sigma, sensitivity=sens).get_delta_for_epsilon(eps)
    assert ref <= delta * (1 + 1e-9)
    smaller = analytic_gaussian_delta(noise_std=sigma * (1 - 1e-7), sensitivity=sens, epsilon=eps)
    assert smaller > delta
    # epsilon of the calibrated sigma round-trips (and is never below the exact one)
    e = analytic_gaussian_epsilon(noise_std=sigma, sensitivity=sens, delta=delta)
    assert e == pytest.approx(eps, rel=1e-8)
    assert analytic_gaussian_delta(noise_std=sigma, sensitivity=sens, epsilon=e) <= delta


@settings(max_examples=100, deadline=None)
@given(eps=st.floats(min_value=0.01, max_value=0.99), delta=delta_st, sens=sens_st)
def test_classic_is_never_tighter_than_analytic(eps: float, delta: float, sens: float) -> None:
    classic = classic_gaussian_std(sensitivity=sens, epsilon=eps, delta=delta)
    assert classic >= analytic_gaussian_std(sensitivity=sens, epsilon=eps, delta=delta)


def test_analytic_epsilon_zero_when_delta_exceeds_tv() -> None:
    assert analytic_gaussian_epsilon(noise_std=100.0, sensitivity=1.0, delta=0.1) == 0.0


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: laplace_scale(sensitivity=0.0, epsilon=1.0), "sensitivity must be"),
        (lambda: laplace_scale(sensitivity=1.0, epsilon=-1.0), "epsilon must be"),
        (lambda: analytic_gaussian_std(sensitivity=1.0, epsilon=1.0, delta=1.0), "delta must be"),
        (lambda: analytic_gaussian_std(sensitivity=1.0, epsilon=math.inf, delta=0.1), "epsilon"),
        (lambda: analytic_gaussian_epsilon(noise_std=0.0, sensitivity=1.0, delta=0.1), "noise_std"),
        (lambda: gaussian_mechanism(np.ones(2), noise_std=-1.0), "noise_std must be"),
        (lambda: laplace_mechanism(np.array([np.nan]), sensitivity=1.0, epsilon=1.0), "value"),
        (lambda: exponential_mechanism([], sensitivity=1.0, epsilon=1.0), "utilities"),
        (lambda: exponential_mechanism([1.0, np.nan], sensitivity=1.0, epsilon=1.0), "utilities"),
        (
            lambda: report_noisy_max([1.0], sensitivity=1.0, epsilon=1.0, noise="cauchy"),  # type: ignore[arg-type]
            "noise must be",
        ),
    ],
)
def test_errors_name_the_parameter(call, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------ additive noise
@pytest.mark.parametrize("rng", [RandomSource._from_key(KEY), RandomSource.seeded(4)])
def test_laplace_and_gaussian_mechanism_noise_distribution(rng: RandomSource) -> None:
    n = 100_000
    value = np.full(n, 3.0)
    lap = laplace_mechanism(value, sensitivity=2.0, epsilon=0.5, rng=rng) - 3.0
    assert stats.kstest(lap, "laplace", args=(0.0, 4.0)).pvalue > ALPHA
    assert abs(np.mean(np.abs(lap)) / 4.0 - 1) < 6 / math.sqrt(n)
    gau = gaussian_mechanism(value.reshape(100, 1000), noise_std=1.5, rng=rng) - 3.0
    assert gau.shape == (100, 1000)
    assert stats.kstest(gau.ravel(), "norm", args=(0.0, 1.5)).pvalue > ALPHA
    scalar = gaussian_mechanism(1.0, noise_std=1.0, rng=rng)
    assert np.ndim(scalar) == 0


def test_laplace_release_lies_on_its_power_of_two_grid() -> None:
    """Mironov 2012: a float ``x + Lap`` reveals x through which doubles can occur; on the grid every
    output of any input is a multiple of γ, so the support is the same for every input."""
    rng = RandomSource.seeded(7)
    gamma = 2.0**-31  # default for Δ₁ = 1, d = 2000: the largest power of two ≤ 2⁻²⁰/2000
    for x in (0.0, 1.0, 0.3, -12.75):
        out = laplace_mechanism(np.full(2000, x), sensitivity=1.0, epsilon=1.0, rng=rng)
        assert np.array_equal(out / gamma, np.rint(out / gamma))
    coarse = laplace_mechanism(np.zeros(50), sensitivity=1.0, epsilon=1.0, rng=rng, granularity=0.25)
    assert np.array_equal(coarse * 4, np.rint(coarse * 4))


@settings(max_examples=200, deadline=None)
@given(
    d=st.integers(min_value=1, max_value=6),
    sens=st.floats(min_value=1e-3, max_value=1e3),
    eps=st.floats(min_value=0.05, max_value=10.0),
    data=st.data(),
)
def test_laplace_neighbours_privacy_loss_is_at_most_epsilon(
    d: int, sens: float, eps: float, data: st.DataObject
) -> None:
    """Coupling: with the same random stream, neighbours' outputs differ by ``γ(k − k')``; the exact
    discrete Laplace of scale Δ_γ/ε then gives every output a log-probability ratio
    ``ε‖k − k'‖₁/Δ_γ``, which must be ≤ ε for any inputs with ``‖x − x'‖₁ ≤ Δ₁``."""
    x = np.array(data.draw(st.lists(st.floats(-1e4, 1e4), min_size=d, max_size=d)))
    step = np.array(data.draw(st.lists(st.floats(-1.0, 1.0), min_size=d, max_size=d)))
    if np.abs(step).sum() > 0:
        step = step / np.abs(step).sum() * sens * data.draw(st.floats(0.0, 1.0))
    x2 = x + step
    assert np.abs(x2 - x).sum() <= sens * (1 + 1e-12)
    out = laplace_mechanism(x, sensitivity=sens, epsilon=eps, rng=RandomSource.seeded(3))
    out2 = laplace_mechanism(x2, sensitivity=sens, epsilon=eps, rng=RandomSource.seeded(3))
    gamma = math.ldexp(1.0, math.frexp(sens / d)[1] - 1 - 20)
    grid_sens = math.ceil(sens / gamma) + d
    shift = np.abs(out - out2).sum() / gamma
    assert shift == int(shift) and shift <= grid_sens
    assert eps * shift / grid_sens <= eps
    # the noise scale in the value's unit is Δ₁/ε up to the grid's 2⁻¹⁹ factor
    assert sens / eps <= gamma * grid_sens / eps <= sens / eps * (1 + 2.0**-19)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"granularity": 0.3}, "granularity must be a power of two"),
        ({"granularity": -0.5}, "granularity"),
        ({"granularity": 2.0**-40, "value": 1e6}, "too large for granularity"),
    ],
)
def test_laplace_grid_errors_name_the_parameter(kwargs: dict, match: str) -> None:  # type: ignore[type-arg]
    value = kwargs.pop("value", 1.0)
    with pytest.raises(ValueError, match=match):
        laplace_mechanism(value, sensitivity=1.0, epsilon=1.0, rng=RandomSource.seeded(0), **kwargs)


def test_mechanisms_default_to_a_secure_source(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[RandomSource] = []
    secure = RandomSource.secure

    def recording() -> RandomSource:
        made.append(secure())
        return made[-1]

    monkeypatch.setattr(RandomSource, "secure", staticmethod(recording))
    gaussian_mechanism(np.zeros(4), noise_std=1.0)
    laplace_mechanism(np.zeros(4), sensitivity=1.0, epsilon=1.0)
    report_noisy_max(np.zeros(3), sensitivity=1.0, epsilon=1.0)
    assert len(made) == 3 and all(m.mode == "secure" for m in made)


# ------------------------------------------------------------------ selection
def _frequencies(draw, k: int, trials: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    return np.bincount([draw() for _ in range(trials)], minlength=k)


@pytest.mark.parametrize("monotonic", [False, True])
def test_exponential_mechanism_frequencies_chi_square(monotonic: bool) -> None:
    u = np.array([0.0, 1.0, 2.0, 3.0, 5.0])
    eps, sens = 1.0, 1.0
    rng = RandomSource.seeded(21)
    counts = _frequencies(
        lambda: exponential_mechanism(
            u, sensitivity=sens, epsilon=eps, rng=rng, monotonic=monotonic
        ),
        len(u),
        12_000,
    )
    w = np.exp(eps * u / (sens if monotonic else 2 * sens))
    expected = w / w.sum() * counts.sum()
    assert stats.chisquare(counts, expected).pvalue > ALPHA


def test_exponential_mechanism_is_stable_for_huge_utilities() -> None:
    import warnings

    rng = RandomSource.seeded(2)
    u = np.array([1e300, -1e300, 1e300 - 1e290])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow or invalid-value warning on the way
        picks = {exponential_mechanism(u, sensitivity=1.0, epsilon=1.0, rng=rng) for _ in range(50)}
    assert picks == {0}  # index 2 is 1e290 behind (probability exp(-5e289)), index 1 far more


@pytest.mark.parametrize("noise", ["gumbel", "exponential", "laplace"])
@pytest.mark.parametrize("monotonic", [False, True])
def test_selection_samplers_use_no_floating_point_noise(
    noise: str, monotonic: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A floating-point Gumbel / exponential / Laplace variate has bounded support (a 53-bit uniform
    # caps it near 36.7 scales), so a candidate far enough behind gets probability 0 under one input
    # and > 0 under a neighbour: pure ε-DP fails. The samplers must decide everything with exact
    # integers (randbelow), so every float sampler of the real source is disabled here.
    def forbidden(*_: object, **__: object) -> None:
        raise AssertionError("a selection mechanism drew floating-point randomness")

    for name in ("gumbel", "exponential", "laplace", "uniform", "normal"):
        monkeypatch.setattr(RandomSource, name, forbidden)
    rng = RandomSource.seeded(5)
    u = np.array([0.0, -80.0, 3.0, 3.0, 1e-300])  # a gap of 80/b: outside any float noise's reach
    picks = {
        report_noisy_max(u, sensitivity=1.0, epsilon=1.0, rng=rng, noise=noise, monotonic=monotonic)  # type: ignore[arg-type]
        for _ in range(200)
    }
    assert picks <= {0, 1, 2, 3, 4} and {2, 3} <= picks
    assert exponential_mechanism(u, sensitivity=1.0, epsilon=1.0, rng=rng, monotonic=monotonic) in range(5)


@pytest.mark.parametrize("noise", ["exponential", "laplace"])
def test_report_noisy_max_ties_and_huge_utilities_are_exact(noise: str) -> None:
    # Exact rationals: utilities far beyond 2^53 grid steps keep their order (no int64 or float
    # overflow), and equal best utilities are chosen equally often.
    rng = RandomSource.seeded(11)
    u = np.array([1e300, 1e300, -1e300])
    counts = _frequencies(lambda: report_noisy_max(u, sensitivity=1.0, epsilon=1.0, rng=rng, noise=noise), 3, 2_000)  # type: ignore[arg-type]
    assert counts[2] == 0
    assert stats.binomtest(int(counts[0]), 2_000, 0.5).pvalue > ALPHA


def _rnm_probabilities(u: np.ndarray, noise: str, b: float) -> np.ndarray:
    """P[argmax(u_i + Z_i) = i] by numerical integration (independent of the sampler)."""
    dist = {
        "laplace": stats.laplace(scale=b),
        "exponential": stats.expon(scale=b),
        "gumbel": stats.gumbel_r(scale=b),
    }[noise]
    probs = []
    for i in range(len(u)):

        def f(x: float, i: int = i) -> float:
            p = dist.pdf(x - u[i])
            for j in range(len(u)):
                if j != i:
                    p *= dist.cdf(x - u[j])
            return float(p)

        lo = float(u.min()) - 60 * b if noise != "exponential" else float(u[i])
        probs.append(integrate.quad(f, lo, float(u.max()) + 60 * b, limit=200)[0])
    return np.array(probs)


@pytest.mark.parametrize("noise", ["gumbel", "exponential", "laplace"])
def test_report_noisy_max_frequencies_chi_square(noise: str) -> None:
    u = np.array([0.0, 1.0, 1.5, 3.0])
    eps, sens = 1.2, 1.0
    rng = RandomSource._from_key(KEY)
    counts = _frequencies(
        lambda: report_noisy_max(u, sensitivity=sens, epsilon=eps, rng=rng, noise=noise),  # type: ignore[arg-type]
        len(u),
        10_000,
    )
    probs = _rnm_probabilities(u, noise, 2 * sens / eps)
    assert probs.sum() == pytest.approx(1.0, abs=1e-6)
    assert stats.chisquare(counts, probs / probs.sum() * counts.sum()).pvalue > ALPHA
    if noise == "gumbel":  # identical to the exponential mechanism
        w = np.exp(eps * u / (2 * sens))
        np.testing.assert_allclose(probs, w / w.sum(), rtol=1e-6)


@pytest.mark.parametrize("noise", ["exponential", "laplace"])
def test_report_noisy_max_probability_ratios_within_e_epsilon(noise: str) -> None:
    # The library's scale gives ε-DP: on neighbouring utilities (|u - u'|_inf <= Δ) every output's
    # probability ratio is at most e^ε. Checked on an adversarial pair with exact probabilities at the
    # scale report_noisy_max really uses (at Δ/ε this pair breaks the bound for both noises), and the
    # sampler's frequencies on both utilities match those probabilities.
    eps, sens = 1.0, 1.0
    u = np.array([0.0, 0.0, 0.5])
    u2 = u + np.array([sens, -sens, -sens])
    b = report_noisy_max_scale(sensitivity=sens, epsilon=eps)
    p1 = _rnm_probabilities(u, noise, b)
    p2 = _rnm_probabilities(u2, noise, b)
    ratios = np.maximum(p1 / p2, p2 / p1)
    assert ratios.max() <= math.exp(eps) * (1 + 1e-6)
    rng = RandomSource.seeded(8)
    for util, probs in ((u, p1), (u2, p2)):
        counts = _frequencies(
            lambda util=util: report_noisy_max(util, sensitivity=sens, epsilon=eps, rng=rng, noise=noise),  # type: ignore[arg-type]
            len(util), 6_000)
        assert stats.chisquare(counts, probs / probs.sum() * counts.sum()).pvalue > ALPHA
