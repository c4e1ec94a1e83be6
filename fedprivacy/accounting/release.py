"""One released distributed-DP round as a post-processed continuous Gaussian, and the run's worst case.

A round releases ``f + Y`` on ``Z^m``: ``f`` the integer sum of the rounded vectors (L2 sensitivity
``Delta_2``, :func:`fedprivacy.accounting.kls.rounded_l2_norm_bound`), ``Y`` the honest kept discrete
Gaussian noise of variance ``V``. A Gaussian domination lemma (Poisson summation; Lemma 1 for sums of
discrete Gaussians of any variances, Lemma 2 for the lattice smoothing kernel of variance ``w``)
puts the release within ``e^(+-eta)`` of a post-processing of the continuous Gaussian mechanism of
std ``sqrt(V - w)`` (:func:`gaussian_domination`), so it is accounted as central DP's Gaussian event
(:meth:`DistributedRelease.event`). The tabulated sampler's deviation from ``N_Z`` adds a density-ratio
slack ``A`` and a total-variation term ``G`` (:func:`fedprivacy.dp.tabulated.law_bounds`).
An RDP curve from the same lemma (Canonne, Kamath & Steinke 2020, Thm 14) is a cross-check.

:func:`release_privacy` accounts a round of an :class:`~fedprivacy.accounting.xnoise_design.XNoiseDesign`
from the noise left in its sum; :func:`worst_case_release` dominates every completed round of a run
(supremum of the slack over rosters and survivor counts), so nothing published depends on the counts.
Zero-out adjacency: the client's noise is present in both datasets. Proofs: docs/DISTRIBUTED_DP.md
("Proofs").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedprivacy.accounting.events import (
    GaussianEvent,
    Neighbouring,
    NoSampling,
    PrivacyEvent,
    Sampling,
)
from fedprivacy.accounting.events import _check_int as _int_arg
from fedprivacy.accounting.kls import rounded_l2_norm_bound
from fedprivacy.accounting.xnoise_design import MAX_SEEDED_COMPONENTS

if TYPE_CHECKING:
    from fedprivacy.accounting.completion import CohortRuleSampling
    from fedprivacy.accounting.xnoise_design import XNoiseDesign

__all__ = [
    "SMOOTHING_VARIANCE",
    "VARIANCE_MARGIN",
    "DistributedRelease",
    "GaussianDomination",
    "gaussian_domination",
    "legacy_release",
    "release_privacy",
    "sum_pmf_log_bounds",
    "theta_excess",
    "worst_case_release",
]

#: Variance ``w`` of the lattice smoothing kernel in Lemma 2 (e(3) ~ 4e-26).
SMOOTHING_VARIANCE = 3.0


def theta_excess(variance: float) -> float:
    """``e(u) = 2 sum_{k>=1} exp(-2 pi^2 u k^2)`` (Poisson summation: ``|sum_x phi_u(x-m) - 1| <= e(u)``)."""
    u = float(variance)
    if not (math.isfinite(u) and u > 0):
        raise ValueError(f"variance must be a finite number > 0, got {variance!r}")
    c = 2.0 * math.pi**2 * u
    total, k = 0.0, 1
    while True:
        term = math.exp(-c * k * k)
        total += term
        if term <= 1e-17 * total or term == 0.0:
            break
        k += 1
    # remaining tail < term * sum_{i>=1} exp(-c(2k+1) i) <= term * e^{-c}/(1-e^{-c}): add it as a bound
    return 2.0 * (total + term * math.exp(-c) / (1.0 - math.exp(-c)))


def sum_pmf_log_bounds(variances: Sequence[float]) -> tuple[float, float]:
    """``(log L, log U)`` of Lemma 1: ``L phi_V(y) <= P[sum_j Z_j = y] <= U phi_V(y)``, ``Z_j ~ N_Z(0, v_j)``.

    The induction runs over the variances in decreasing order (any order is valid; this one keeps
    ``u_k >= v_(k+1)/2``). ``log L = -inf`` when some ``e(u_k) >= 1`` (no lower bound).
    """
    vs = sorted((float(v) for v in variances), reverse=True)
    if not vs:
        raise ValueError("variances must not be empty")
    if any(not (math.isfinite(v) and v > 0) for v in vs):
        raise ValueError(f"variances must be finite and > 0, got {variances!r}")
    common = -math.fsum(math.log1p(theta_excess(v)) for v in vs)
    lo_terms, hi_terms = [], []
    acc = vs[0]
    for v in vs[1:]:
        e = theta_excess(acc * v / (acc + v))
        hi_terms.append(math.log1p(e))
        lo_terms.append(math.log1p(-e) if e < 1.0 else -math.inf)
        acc += v
    return common + math.fsum(lo_terms), common + math.fsum(hi_terms)


@dataclass(frozen=True, slots=True, kw_only=True)
class GaussianDomination:
    """A round's noise as a post-processed continuous Gaussian, up to ``e^(+-eta)`` (Proposition)."""

    total_variance: float
    smoothing_variance: float
    continuous_std: float
    eta: float


def gaussian_domination(variances: Sequence[float], *, dim: int,
                        smoothing_variance: float = SMOOTHING_VARIANCE) -> GaussianDomination:
    """Lemmas 1-2 for ``dim`` coordinates of the noise ``sum_j N_Z(0, v_j)``.

    Returns the std ``sqrt(V - w)`` of the dominating continuous Gaussian and ``eta`` (all ``dim``
    coordinates; ``inf`` if the lemma gives no bound, e.g. components with variance below ~0.04).
    """
    d = _int_arg("dim", dim, 1)
    w = float(smoothing_variance)
    total = math.fsum(float(v) for v in variances)
    if not (math.isfinite(w) and 0 < w < total):
        raise ValueError(f"smoothing_variance must be in (0, total variance={total:g}), got {w!r}")
    log_lo, log_hi = sum_pmf_log_bounds(variances)
    e_w = theta_excess(w)
    up = log_hi + math.log1p(e_w)
    down = log_lo + (math.log1p(-e_w) if e_w < 1.0 else -math.inf)
    eta1 = max(up, -down, 0.0)
    return GaussianDomination(total_variance=total, smoothing_variance=w,
                              continuous_std=math.sqrt(total - w), eta=d * eta1)


# ============================================================================ one released round
@dataclass(frozen=True, slots=True, kw_only=True)
class DistributedRelease:
    """The privacy of one completed round whose sum holds ``honest_variances`` of honest noise.

    ``l2_sensitivity`` is ``Delta_2`` (integer units) of one client's rounded vector under zero-out
    (add-remove); the accountant's neighbouring relation applies the factor 2 of replace-one.
    """

    survivors: int
    honest_survivors: int
    l2_sensitivity: float
    dim: int
    released_variance: float
    honest_variance: float
    min_component_variance: float
    continuous_std: float
    eta: float
    rdp_log_upper: float  # m log A of the RDP cross-check
    rdp_log_lower: float  # m log B (<= 0)
    exact: bool = True  # the released noise does not depend on the survivor count (XNoise)
    sampler_ratio: float = 0.0  # A: m sum_j -log(1 - r_j), the tabulated sampler's law vs N_Z
    sampler_tv: float = 0.0  # m sum_j tail_j: its truncation, in total variation
    exact_sampler: bool = True  # False: the float64 rejection sampler (deviation not bounded)

    @property
    def noise_multiplier(self) -> float:
        """Std of the dominating continuous Gaussian over ``Delta_2``: the accounted ``z``."""
        return self.continuous_std / self.l2_sensitivity

    def event(self, sampling: Sampling | CohortRuleSampling | None = None) -> PrivacyEvent:
        """The dominating Gaussian release (central DP's event) under ``sampling`` (default none);
        under :class:`fedprivacy.accounting.completion.CohortRuleSampling` (Poisson rounds whose
        completion is public) the completed round's pair
        :class:`fedprivacy.accounting.completion.CompletedRoundGaussian`."""
        from fedprivacy.accounting.completion import CohortRuleSampling

        if isinstance(sampling, CohortRuleSampling):
            return sampling.event_for(self.noise_multiplier)
        return PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=self.noise_multiplier),
                            sampling=sampling if sampling is not None else NoSampling())

    def rdp(self, orders: Sequence[float], *, neighbouring: Neighbouring | str) -> list[float]:
        """Cross-check RDP curve: ``alpha D^2/(2V) + alpha/(alpha-1) (m log A + S) - m log B + A_s``.

        ``S = A_s - log(1 - TV)`` carries the sampler (ratio ``A_s`` both ways; the truncation is a
        conditioning on an event of probability ``>= 1 - TV`` under both datasets).
        """
        factor = 2.0 if Neighbouring.parse(neighbouring) is Neighbouring.REPLACE_ONE else 1.0
        base = (factor * self.l2_sensitivity) ** 2 / (2.0 * self.honest_variance)
        # sampler: ratio A both ways, truncation as conditioning on prob >= 1 - TV (no delta term)
        extra = self.sampler_ratio - math.log1p(-self.sampler_tv)
        return [a * base + a / (a - 1.0) * (self.rdp_log_upper + extra) - self.rdp_log_lower
                + self.sampler_ratio if a > 1 else math.inf for a in orders]


def release_privacy(design: XNoiseDesign, *, survivors: int, clip_norm: float, scale: float,
                    dim: int, beta: float,
                    smoothing_variance: float = SMOOTHING_VARIANCE) -> DistributedRelease:
    """Account a completed round from the noise actually left in its sum (``survivors`` agreed).

    Args:
        design: the round's noise design (its ``total_variance`` in integer units).
        survivors: the agreed survivor count ``s`` whose excess the server removed.
        clip_norm: ``C``; scale: ``s`` (integer units per unit); dim: padded dimension ``m``.
        beta: conditional rounding parameter (0: unconditional, trivial norm bound).
    """
    # exact: the released noise does not depend on s only without colluders; with c > 0
    # the levels design releases sigma^2 s/(s - c) (colluders' kept noise included)
    return _release(design.honest_kept_variances(survivors=survivors), survivors=survivors,
                    colluders=design.colluders,
                    released_variance=design.released_variance(survivors=survivors),
                    exact=design.colluders == 0,
                    clip_norm=clip_norm, scale=scale, dim=dim, beta=beta,
                    smoothing_variance=smoothing_variance, tabulated=True)


def legacy_release(*, local_variance: float, survivors: int, colluders: int = 0, clip_norm: float,
                   scale: float, dim: int, beta: float,
                   smoothing_variance: float = SMOOTHING_VARIANCE) -> DistributedRelease:
    """A round of the legacy share (each survivor adds ``N_Z(0, local_variance)``), same lemma.

    Its noise, ``s local_variance``, depends on the survivor count, so it is not ``exact``: the
    observers' figure claims no amplification for it
    (:func:`fedprivacy.accounting.audiences.audience_epsilons`).
    """
    s = _int_arg("survivors", survivors, 1)
    c = _int_arg("colluders", colluders, 0)
    if c >= s:
        raise ValueError(f"colluders must be < survivors={s}, got {c}")
    return _release((float(local_variance),) * (s - c), survivors=s, colluders=c,
                    released_variance=s * float(local_variance), exact=False, clip_norm=clip_norm,
                    scale=scale, dim=dim, beta=beta, smoothing_variance=smoothing_variance,
                    tabulated=False)


def _release(variances: Sequence[float], *, survivors: int, colluders: int,
             released_variance: float, exact: bool, clip_norm: float, scale: float, dim: int,
             beta: float, smoothing_variance: float, tabulated: bool) -> DistributedRelease:
    if not clip_norm > 0 or not scale > 0:
        raise ValueError(f"clip_norm and scale must be > 0, got {clip_norm} and {scale}")
    dom = gaussian_domination(variances, dim=dim, smoothing_variance=smoothing_variance)
    log_lo, log_hi = sum_pmf_log_bounds(variances)
    honest = math.fsum(variances)
    # against N_Z(0, V) = phi_V / (1 + e(V)): A = U (1 + e(V)), B = L (1 + e(V)), per coordinate
    shift = math.log1p(theta_excess(honest))
    ratio = tv = 0.0
    if tabulated:  # the sampler's exact law vs N_Z(0, v): ratio on the support, truncation in TV
        from fedprivacy.dp.tabulated import law_bounds

        bounds = {v: law_bounds(v) for v in set(variances)}
        ratio = dim * math.fsum(-math.log1p(-bounds[v][0]) for v in variances)
        tv = dim * math.fsum(bounds[v][1] for v in variances)
    return DistributedRelease(
        survivors=survivors, honest_survivors=survivors - colluders,
        l2_sensitivity=rounded_l2_norm_bound(l2_norm=clip_norm * scale, dim=dim, beta=beta),
        dim=dim, released_variance=released_variance,
        honest_variance=honest, min_component_variance=min(variances),
        continuous_std=dom.continuous_std, eta=dom.eta,
        rdp_log_upper=dim * max(log_hi + shift, 0.0), rdp_log_lower=dim * min(log_lo + shift, 0.0),
        exact=exact, sampler_ratio=ratio, sampler_tv=tv, exact_sampler=tabulated)


# ============================================================================ worst case over rounds
#: Relative margin below ``sigma^2`` at which exact designs are accounted: the component variances are
#: floats, so the honest kept sum equals ``sigma^2`` only up to rounding (``<= ~1e-12`` relative, from
#: ``sigma^2/h - sigma^2/(h+1)``); every round checks that its realised sum is above the accounted one.
VARIANCE_MARGIN = 1e-9


def _design_extent(*, min_survivors: int, colluders: int, max_roster: int) -> tuple[int, int]:
    """``(largest roster a design can have, most honest kept components per coordinate)``.

    ``binary`` (``c = 0``): at ``s`` survivors the kept components number ``s + sum_r popcount(k_r)
    <= s + sum_r k_r = n``, so ``K <= n <= R``. ``levels``: a client keeps ``n - s + 1`` components
    and ``s - c`` honest survivors count, ``K = max_s (s - c)(n - s + 1)``, increasing in ``n``; its
    roster is capped by :data:`MAX_SEEDED_COMPONENTS` (``n - t`` seeded components).
    """
    t, c, r = min_survivors, colluders, max_roster
    if c == 0:
        return r, r
    r = min(r, t + MAX_SEEDED_COMPONENTS)
    return r, max((s - c) * (r - s + 1) for s in range(t, r + 1))


def _smallest_component(total_variance: float, *, min_survivors: int, colluders: int,
                        roster: int) -> float:
    """Smallest component variance of any design with roster ``<= roster`` (default kinds)."""
    s2, t, c = total_variance, min_survivors, colluders
    if c == 0:
        return s2 / roster  # binary: unit sigma^2/n, components b 2^j >= b
    top = roster - c
    return s2 / (top * (top - 1)) if roster > t else s2 / top  # levels: sigma^2/(h(h+1)), h <= top-1


def _largest_share(*, min_survivors: int, roster: int) -> float:
    """Largest fraction of ``sigma^2`` one survivor keeps (binary, ``c = 0``), any ``n <= roster``,
    ``s >= t``: rank 0 keeps ``(1 + ceil((n - s)/s)) sigma^2/n``, largest at ``s = t``."""
    t = min_survivors
    return max((1 + -(-(n - t) // t)) / n for n in range(t, roster + 1))


def worst_case_release(*, total_variance: float, min_survivors: int, colluders: int, max_roster: int,
                       clip_norm: float, scale: float, dim: int, beta: float,
                       participant: bool = False,
                       smoothing_variance: float = SMOOTHING_VARIANCE) -> DistributedRelease:
    """One release that dominates every completed round of the exact XNoise designs (default kinds)
    with roster ``<= max_roster`` and any survivor count ``s`` in ``[t, roster]``.

    Why: the amplified argument mixes rounds of different survivor counts, so its
    slack must be the supremum over them, not the realised one; and a figure computed from the
    realised counts (even its last digits) would publish them. This release depends on the run's
    parameters only: every completed round is charged the same event and the same slack.

    * Noise: ``V = sigma^2 (1 - VARIANCE_MARGIN)`` (exact designs keep ``sigma^2`` of honest noise for
      every ``s``; a smaller variance is a valid domination: the real noise is ``V`` plus independent
      noise). With ``participant=True`` and no colluders, the noise one participating client does
      not know: ``V - sigma^2 share`` (:func:`_largest_share`), since it knows its own kept noise.
      (With ``c >= 1`` the server's figure already removes ``c`` clients' noise.)
    * Slack, per coordinate, with ``K`` components (:func:`_design_extent`), smallest variance
      ``v_-`` and ``u_k >= v_-/2`` in Lemma 1's induction: ``log U <= K log(1 + e(v_-/2))``,
      ``-log L <= K log(1 + e(v_-)) - K log(1 - e(v_-/2))``, so ``eta <= m max(up, down)`` as in
      :func:`gaussian_domination`; the sampler's ratio and tail at their suprema over
      ``[v_-, sigma^2/(t - c)]`` (:func:`fedprivacy.dp.tabulated.law_bounds_sup`), ``K`` times.
    """
    from fedprivacy.dp.tabulated import law_bounds_sup

    t = _int_arg("min_survivors", min_survivors, 1)
    c = _int_arg("colluders", colluders, 0)
    r = _int_arg("max_roster", max_roster, t)
    m = _int_arg("dim", dim, 1)
    s2, w = float(total_variance), float(smoothing_variance)
    if not c < t:
        raise ValueError(f"colluders must be < min_survivors={t}, got {c}")
    r, k = _design_extent(min_survivors=t, colluders=c, max_roster=r)
    v_min = _smallest_component(s2, min_survivors=t, colluders=c, roster=r)
    honest = s2 * (1.0 - VARIANCE_MARGIN)
    if participant and c == 0:
        honest -= s2 * _largest_share(min_survivors=t, roster=r)
    if not honest > w:
        raise ValueError(f"no noise is left against {'a participant' if participant else 'the server'} "
                         f"(min_survivors={t}): the honest variance {honest:g} is below the smoothing "
                         f"variance {w:g}")
    e_half, e_min, e_w = theta_excess(v_min / 2.0), theta_excess(v_min), theta_excess(w)
    if not (e_half < 1.0 and e_w < 1.0):
        raise ValueError(f"noise components of variance {v_min:g} are too small to analyse; raise the scale")
    up = k * math.log1p(e_half)
    down = k * (math.log1p(e_min) - math.log1p(-e_half))
    r_sup, tail_sup = law_bounds_sup(min_variance=v_min, max_variance=s2 / (t - c))
    l2 = rounded_l2_norm_bound(l2_norm=clip_norm * scale, dim=m, beta=beta)
    return DistributedRelease(
        survivors=t, honest_survivors=t - c, l2_sensitivity=l2, dim=m,
        released_variance=s2 * t / (t - c), honest_variance=honest, min_component_variance=v_min,
        continuous_std=math.sqrt(honest - w),
        eta=m * max(up + math.log1p(e_w), down - math.log1p(-e_w)),
        rdp_log_upper=m * (up + math.log1p(e_min)), rdp_log_lower=-m * down,
        exact=c == 0, sampler_ratio=m * k * -math.log1p(-r_sup), sampler_tv=m * k * tail_sup,
        exact_sampler=True)

