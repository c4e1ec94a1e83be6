"""XNoise designs, the Gaussian domination lemma (brute force) and the two-audience epsilon."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from fedprivacy.accounting.audiences import audience_epsilons
from fedprivacy.accounting.events import NoSampling, PoissonSampling
from fedprivacy.accounting.release import (
    gaussian_domination,
    release_privacy,
    sum_pmf_log_bounds,
    theta_excess,
)
from fedprivacy.accounting.xnoise_design import XNoiseDesign


# ----------------------------------------------------------------------------- designs
@st.composite
def designs(draw: st.DrawFn) -> XNoiseDesign:
    n = draw(st.integers(1, 120))
    t = draw(st.integers(1, n))
    c = draw(st.integers(0, min(t - 1, 3)))
    if c and n - t > 64:
        t = n - draw(st.integers(0, 64))
        c = min(c, t - 1)
    var = draw(st.floats(1.0, 1e9))
    return XNoiseDesign(total_variance=var, roster=n, min_survivors=t, colluders=c)


@settings(max_examples=80, deadline=None)
@given(designs())
def test_honest_noise_is_exactly_the_target_for_every_survivor_count(d: XNoiseDesign) -> None:
    for s in range(d.min_survivors, d.roster + 1):
        assert math.isclose(d.honest_variance(survivors=s), d.total_variance, rel_tol=1e-12)
        assert d.released_variance(survivors=s) >= d.honest_variance(survivors=s) * (1 - 1e-12)
        for r in range(s):
            keep, drop = set(d.kept(survivors=s, rank=r)), set(d.removable(survivors=s, rank=r))
            assert 0 in keep and not keep & drop
            assert keep | drop == set(range(d.num_seeded + 1))


@settings(max_examples=60, deadline=None)
@given(designs())
def test_without_colluders_the_released_noise_is_the_target(d: XNoiseDesign) -> None:
    if d.colluders:
        return
    for s in range(d.min_survivors, d.roster + 1):
        assert math.isclose(d.released_variance(survivors=s), d.total_variance, rel_tol=1e-12)


def test_component_counts_and_the_old_inflation() -> None:
    assert XNoiseDesign(total_variance=1.0, roster=10, min_survivors=6).num_seeded == 1
    assert XNoiseDesign(total_variance=1.0, roster=100, min_survivors=9).num_seeded == 4
    assert XNoiseDesign(total_variance=1.0, roster=100, min_survivors=51).num_seeded == 1
    assert XNoiseDesign(total_variance=1.0, roster=7, min_survivors=7).num_seeded == 0
    lv = XNoiseDesign(total_variance=1.0, roster=10, min_survivors=6, colluders=1)
    assert lv.kind == "levels" and lv.num_seeded == 4
    # levels: each client keeps sigma^2/(s-c); the released sum carries s/(s-c) of the target
    assert math.isclose(lv.released_variance(survivors=10), 10 / 9)


def test_design_refusals_name_the_parameter() -> None:
    with pytest.raises(ValueError, match="colluders"):
        XNoiseDesign(total_variance=1.0, roster=10, min_survivors=3, colluders=3)
    with pytest.raises(ValueError, match="binary"):
        XNoiseDesign(total_variance=1.0, roster=10, min_survivors=6, colluders=1, kind="binary")
    with pytest.raises(ValueError, match="max_components"):
        XNoiseDesign(total_variance=1.0, roster=100, min_survivors=9, colluders=1)
    with pytest.raises(ValueError, match="survivors"):
        XNoiseDesign(total_variance=1.0, roster=10, min_survivors=6).kept(survivors=5, rank=0)
    a = XNoiseDesign(total_variance=1.0, roster=10, min_survivors=6)
    assert a.fingerprint() != XNoiseDesign(total_variance=1.0, roster=11, min_survivors=6).fingerprint()


# ----------------------------------------------------------------------------- lemma, brute force
def _dg_pmf(v: float, lim: int) -> np.ndarray:
    x = np.arange(-lim, lim + 1, dtype=np.float64)
    w = np.exp(-(x**2) / (2 * v))
    return w / w.sum()


def _sum_pmf(variances: list[float], lim: int) -> np.ndarray:
    out = np.array([1.0])
    for v in variances:
        out = np.convolve(out, _dg_pmf(v, lim))
    return out  # support [-lim*N, lim*N]


def _phi(v: float, y: np.ndarray) -> np.ndarray:
    return np.exp(-(y**2) / (2 * v)) / math.sqrt(2 * math.pi * v)


def test_theta_excess_matches_the_direct_poisson_sum() -> None:
    for u in (0.05, 0.3, 1.0):
        m = np.linspace(0, 1, 41)
        k = np.arange(-200, 201)
        sums = [float(_phi(u, k - mm).sum()) for mm in m]
        assert max(abs(s - 1) for s in sums) <= theta_excess(u) + 1e-14  # float summation
        assert max(abs(s - 1) for s in sums) >= theta_excess(u) * 0.99  # attained at m = 0


@pytest.mark.parametrize("variances", [[0.3, 0.5], [0.4, 0.4, 0.4], [0.25, 1.0, 0.6, 2.0],
                                       [3.0, 0.35]])
def test_lemma1_bounds_the_brute_force_convolution(variances: list[float]) -> None:
    lim = 30
    p = _sum_pmf(variances, lim)
    y = np.arange(-lim * len(variances), lim * len(variances) + 1, dtype=np.float64)
    keep = np.abs(y) <= 12  # where the truncated convolution is exact to double precision
    ratio = p[keep] / _phi(sum(variances), y[keep])
    lo, hi = sum_pmf_log_bounds(variances)
    assert np.all(ratio <= math.exp(hi) * (1 + 1e-12))
    assert np.all(ratio >= math.exp(lo) * (1 - 1e-12))
    assert hi - lo > 1e-6  # the bound is not vacuous at these small variances (the test can fail)


def _smoothed_pmf(total: float, w: float, ys: np.ndarray) -> np.ndarray:
    """P[K_w(X) = y], X ~ N(0, total - w): numerical integral over x (fine grid)."""
    s1 = math.sqrt(total - w)
    x = np.linspace(-12 * s1, 12 * s1, 24001)
    z = np.arange(-60, 61, dtype=np.float64)
    norm_x = np.exp(-((z[None, :] - x[:, None]) ** 2) / (2 * w)).sum(axis=1)
    px = np.exp(-(x**2) / (2 * s1 * s1)) / (math.sqrt(2 * math.pi) * s1)
    dx = x[1] - x[0]
    return np.array([float((px * np.exp(-((y - x) ** 2) / (2 * w)) / norm_x).sum() * dx)
                     for y in ys])


def test_proposition_against_the_smoothed_continuous_gaussian() -> None:
    variances, w = [0.45, 0.7, 1.1], 0.4
    lim = 30
    p = _sum_pmf(variances, lim)
    ys = np.arange(-8, 9, dtype=np.float64)
    p = p[(ys + lim * len(variances)).astype(int)]
    wpmf = _smoothed_pmf(sum(variances), w, ys)
    eta = gaussian_domination(variances, dim=1, smoothing_variance=w).eta
    assert 1e-6 < eta < 0.5
    assert np.all(np.abs(np.log(p / wpmf)) <= eta + 1e-7)


def _gauss_delta(eps: float, mu: float) -> float:
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))


@pytest.mark.parametrize("shift", [(1,), (2,), (1, 1), (2, 1)])
def test_brute_force_delta_of_the_discrete_release_is_below_the_bound(shift: tuple[int, ...]) -> None:
    """Exact hockey-stick delta(eps) of P_Y^m shifted by an integer vector vs the Proposition."""
    variances, w, lim = [0.5, 0.8, 1.6], 0.45, 30
    m = len(shift)
    p1 = _sum_pmf(variances, lim)
    y = np.arange(-lim * 3, lim * 3 + 1)
    q = p1
    for _ in range(m - 1):
        q = np.multiply.outer(q, p1)
    q = q.reshape([p1.size] * m)
    p = q
    for axis, dlt in enumerate(shift):
        p = np.roll(p, dlt, axis=axis)  # mass near the edges is ~0, roll is a shift
    dom = gaussian_domination(variances, dim=m, smoothing_variance=w)
    mu = math.sqrt(sum(s * s for s in shift)) / dom.continuous_std
    assert y.size == p1.size
    for eps in (0.0, 0.25, 0.5, 1.0, 2.0):
        exact = float(np.maximum(p - math.exp(eps) * q, 0).sum())
        bound = math.exp(dom.eta) * _gauss_delta(eps - 2 * dom.eta, mu)
        assert exact <= bound + 1e-12, (eps, exact, bound)


# ----------------------------------------------------------------------------- two audiences
def _release(n: int = 10, t: int = 6, survivors: int = 9, scale: float = 4096.0, z: float = 1.0):
    design = XNoiseDesign(total_variance=(z * scale) ** 2, roster=n, min_survivors=t)
    return release_privacy(design, survivors=survivors, clip_norm=1.0, scale=scale, dim=2**14,
                           beta=math.exp(-0.5))


def test_server_epsilon_is_the_continuous_gaussian_without_amplification() -> None:
    rel = _release()
    rounds = 100
    ref = pld_lib.from_gaussian_mechanism(standard_deviation=rel.noise_multiplier,
                                          value_discretization_interval=1e-4).self_compose(rounds)
    eps = audience_epsilons([rel] * rounds, delta=1e-5)
    assert eps.server >= ref.get_epsilon_for_delta(1e-5) * (1 - 1e-3)
    assert eps.server <= ref.get_epsilon_for_delta(1e-5) * (1 + 1e-3)
    assert eps.observers == eps.server  # no sampling: nothing to amplify
    # the goal: within 5% of the continuous Gaussian of std z*C*s (not the rounded bound)
    ideal = pld_lib.from_gaussian_mechanism(standard_deviation=1.0).self_compose(rounds)
    assert eps.server <= 1.05 * ideal.get_epsilon_for_delta(1e-5)


def test_observers_epsilon_is_central_dp_with_the_sampling_that_ran() -> None:
    rel = _release()
    q, rounds = 0.1, 100
    ref = pld_lib.from_gaussian_mechanism(standard_deviation=rel.noise_multiplier,
                                          sampling_prob=q,
                                          value_discretization_interval=1e-4).self_compose(rounds)
    eps = audience_epsilons([rel] * rounds, delta=1e-5, sampling=PoissonSampling(rate=q))
    assert eps.observers >= ref.get_epsilon_for_delta(1e-5) * (1 - 1e-3)
    assert eps.observers <= ref.get_epsilon_for_delta(1e-5) * (1 + 1e-3)
    assert eps.observers < eps.server / 5
    central = pld_lib.from_gaussian_mechanism(standard_deviation=1.0, sampling_prob=q,
                                              value_discretization_interval=1e-4).self_compose(rounds)
    assert eps.observers <= 1.05 * central.get_epsilon_for_delta(1e-5)


def test_rdp_cross_check_is_looser_and_replace_one_doubles_the_sensitivity() -> None:
    rel = _release()
    a = audience_epsilons([rel] * 50, delta=1e-6)
    assert a.server_rdp > a.server_pld and a.server == a.server_pld
    b = audience_epsilons([rel] * 10, delta=1e-6, neighbouring="replace-one")
    ref = pld_lib.from_gaussian_mechanism(standard_deviation=rel.noise_multiplier / 2)
    assert math.isclose(b.server, ref.self_compose(10).get_epsilon_for_delta(1e-6), rel_tol=2e-3)
    # beyond ~150 the sampler's truncation term cannot be certified by the PLD path; the RDP curve
    # is not a valid fallback (truncation changes the support): reported, not used
    huge = audience_epsilons([rel] * 50, delta=1e-6, neighbouring="replace-one")
    assert huge.server_pld == math.inf and huge.server == math.inf and huge.server_rdp > 150


def test_tiny_components_make_the_slack_visible_or_refused() -> None:
    # variance 0.5 per component over 2^14 coordinates: eta is far from negligible -> refused
    design = XNoiseDesign(total_variance=5.0, roster=10, min_survivors=6)
    rel = release_privacy(design, survivors=10, clip_norm=1.0, scale=2.0, dim=2**14, beta=0.0)
    assert rel.eta > 1e-6
    with pytest.raises(ValueError, match="slack"):
        audience_epsilons([rel], delta=1e-5)
    assert audience_epsilons([], delta=1e-5).server == 0.0
    assert audience_epsilons([_release()], delta=1e-5, sampling=NoSampling()).rounds == 1


# ----------------------------------------------------------------------------- calibration
@pytest.mark.parametrize("audience", ["server", "observers"])
def test_calibration_meets_the_audience_target_without_overshooting(audience: str) -> None:
    from fedprivacy.accounting.calibration import accounted_noise_multiplier, calibrate_distributed
    from fedprivacy.accounting.kls import rounded_l2_norm_bound as bound

    dim, rounds, q = 2**12, 30, 0.2

    def encoding_for(z: float) -> tuple[float, float]:  # a scale that shrinks as the noise grows
        s = 2.0 ** math.floor(math.log2(20000.0 / (8 * z)))
        return s, bound(l2_norm=s, dim=dim, beta=math.exp(-0.5))

    z = calibrate_distributed(target_epsilon=4.0, target_delta=1e-5, steps=rounds, audience=audience,
                              sampling=PoissonSampling(rate=q), encoding_for=encoding_for)

    def eps_at(zz: float) -> float:
        cs, _ = encoding_for(zz)
        d = XNoiseDesign(total_variance=(zz * cs) ** 2, roster=20, min_survivors=11)
        rel = release_privacy(d, survivors=18, clip_norm=1.0, scale=cs, dim=dim, beta=math.exp(-0.5))
        e = audience_epsilons([rel] * rounds, delta=1e-5, sampling=PoissonSampling(rate=q))
        return e.server if audience == "server" else e.observers

    assert eps_at(z) <= 4.0
    assert eps_at(z / 1.01) > 4.0  # and not much more noise than needed
    cs, d2 = encoding_for(z)
    assert accounted_noise_multiplier(noise_multiplier=z, clip_scale=cs, l2_sensitivity=d2) > 0
    with pytest.raises(ValueError, match="audience"):
        calibrate_distributed(target_epsilon=4.0, target_delta=1e-5, steps=3, audience="public",
                              encoding_for=encoding_for)


def test_the_legacy_share_gets_the_pld_but_no_amplification() -> None:
    from fedprivacy.accounting.release import legacy_release

    scale, t = 4096.0, 6
    rel = legacy_release(local_variance=scale**2 / t, survivors=6, clip_norm=1.0, scale=scale,
                         dim=2**14, beta=math.exp(-0.5))
    assert not rel.exact and math.isclose(rel.honest_variance, scale**2)
    eps = audience_epsilons([rel] * 20, delta=1e-5, sampling=PoissonSampling(rate=0.1))
    assert eps.observers == eps.server and not eps.amplified
    exact = audience_epsilons([_release()] * 20, delta=1e-5, sampling=PoissonSampling(rate=0.1))
    assert exact.amplified and exact.observers < exact.server
    # the PLD of the legacy round is below its old zCDP/RDP figure (the tighter conversion)
    from fedprivacy.accounting.kls import distributed_round, zcdp_epsilon

    old = distributed_round(clip_norm=1.0, scale=scale, dim=2**14, beta=math.exp(-0.5),
                            local_sigma=scale / math.sqrt(t), num_survivors=6)
    assert eps.server < zcdp_epsilon(rho=20 * old.rho, delta=1e-5)


def test_the_samplers_deviation_is_charged_and_the_float_sampler_is_flagged() -> None:
    from fedprivacy.accounting.release import legacy_release
    from fedprivacy.dp.tabulated import law_bounds

    rel = _release()
    r, tail = law_bounds(rel.min_component_variance)
    assert rel.exact_sampler and rel.sampler_ratio >= rel.dim * r and rel.sampler_tv >= rel.dim * tail
    e = audience_epsilons([rel] * 10, delta=1e-5)
    assert e.slack >= 10 * rel.sampler_ratio and e.sampler_bounded
    old = legacy_release(local_variance=4096.0**2 / 6, survivors=6, clip_norm=1.0, scale=4096.0,
                         dim=2**14, beta=0.0)
    assert not old.exact_sampler and not audience_epsilons([old], delta=1e-5).sampler_bounded


def test_the_claim_states_both_audiences_and_their_threat_models() -> None:
    from fedprivacy.accounting.audiences import audience_claim
    from fedprivacy.accounting.release import legacy_release

    eps = audience_epsilons([_release()] * 5, delta=1e-5, sampling=PoissonSampling(rate=0.1))
    c = audience_claim(eps, sampling_description="poisson(q=0.1)", colluders=0, exact_noise=True)
    assert c["server"]["amplification"] is False and c["observers"]["amplification"] is True
    assert c["observers"]["epsilon"] < c["server"]["epsilon"]
    assert "post-processing" in c["observers"]["threat_model"] and "survivors" in c["server"]["threat_model"]
    old = legacy_release(local_variance=4096.0**2 / 6, survivors=6, clip_norm=1.0, scale=4096.0,
                         dim=2**14, beta=0.0)
    e2 = audience_epsilons([old] * 5, delta=1e-5, sampling=PoissonSampling(rate=0.1))
    c2 = audience_claim(e2, sampling_description="poisson(q=0.1)", colluders=0, exact_noise=False)
    assert c2["observers"]["epsilon"] == c2["server"]["epsilon"]
    assert "NOT bounded" in c2["noise_sampler"] and "legacy" in c2["observers"]["sampling"]
