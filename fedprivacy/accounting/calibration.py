"""Noise calibration: the smallest noise multiplier whose certified epsilon meets a target.

A bracketing search on the noise multiplier z with a *fresh* accountant per trial (no shared state).
Epsilon is non-increasing in z (a Gaussian with more noise is a post-processing of one with less), so
the invariant ``epsilon(hi) <= target < epsilon(lo)`` brackets the answer. The bracket is seeded with
the (cheap, looser) RDP answer, narrowed by interpolating log(epsilon) in log(z) and testing a pair of
points either side of the guess, with geometric bisection as the fallback. It stops when
``hi / lo - 1 <= rel_tol`` and returns ``hi``, whose epsilon was computed by the requested backend and
is at most the target: the result never overshoots.

The same search calibrates the completed-round pair of Poisson rounds whose completion is public
(:func:`calibrate_completed`, :mod:`fedprivacy.accounting.completion`) and the dominating Gaussian of a
distributed-DP run (:func:`calibrate_distributed`, :mod:`fedprivacy.accounting.release`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from fedprivacy.accounting.accountant import epsilon_for
from fedprivacy.accounting.audiences import AUDIENCES
from fedprivacy.accounting.completion import CohortRuleSampling, epsilon_completed
from fedprivacy.accounting.events import Neighbouring, NoSampling, PoissonSampling, Sampling
from fedprivacy.accounting.release import SMOOTHING_VARIANCE, VARIANCE_MARGIN

__all__ = [
    "accounted_noise_multiplier",
    "calibrate_completed",
    "calibrate_distributed",
    "calibrate_noise_multiplier",
]

_Z_MIN = 1e-3
_Z_MAX = 1e4


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    target_delta: float,
    sampling: Sampling,
    steps: int,
    backend: str = "pld",
    neighbouring: Neighbouring | str = Neighbouring.ADD_REMOVE,
    sensitivity: float = 1.0,
    rel_tol: float = 1e-3,
) -> float:
    """Smallest noise multiplier (to relative tolerance ``rel_tol``) with epsilon <= ``target_epsilon``.

    Args:
        target_epsilon: epsilon to meet at ``target_delta`` (> 0).
        target_delta: delta in (0, 1).
        sampling: the sampling of each of the ``steps`` Gaussian releases.
        steps: number of releases (>= 1).
        backend: accountant backend name ("pld", "rdp", "prv").
        neighbouring: the neighbouring relation of the claim.
        sensitivity: Gaussian sensitivity in units of the clip norm.
        rel_tol: relative tolerance on the noise multiplier, in (0, 1e-3].

    Returns:
        z with ``epsilon(z) <= target_epsilon`` and ``epsilon(z / (1 + rel_tol)) > target_epsilon``
        (up to the backend's own numerical resolution).

    Raises:
        ValueError: bad arguments, an unsupported combination, or no z in [1e-3, 1e4] meets the target.
    """
    _check_targets(target_epsilon, rel_tol)

    def eps(z: float) -> float:
        return epsilon_for(
            noise_multiplier=z,
            sampling=sampling,
            steps=steps,
            delta=target_delta,
            backend=backend,
            neighbouring=neighbouring,
            sensitivity=sensitivity,
        )

    # For the tight backends, RDP's (looser, cheap) answer is a good first guess for hi; it is
    # verified like any other.
    hi = 1.0
    if backend != "rdp":
        try:
            hi = calibrate_noise_multiplier(
                target_epsilon=target_epsilon,
                target_delta=target_delta,
                sampling=sampling,
                steps=steps,
                backend="rdp",
                neighbouring=neighbouring,
                sensitivity=sensitivity,
                rel_tol=rel_tol,
            )
        except ValueError:
            hi = 1.0  # RDP does not support this event; start from scratch
    bracket = _bracket(eps, target_epsilon, hi, step=0.85 if backend != "rdp" else 0.5)
    return _narrow(eps, target_epsilon, bracket, rel_tol=rel_tol)


def calibrate_completed(*, target_epsilon: float, target_delta: float, sampling: CohortRuleSampling,
                        steps: int, backend: str = "pld", rel_tol: float = 1e-3) -> float:
    """Smallest noise multiplier (to ``rel_tol``) whose ``steps`` completed rounds meet the target
    (the bracket-and-narrow of :func:`calibrate_noise_multiplier`, never overshoots)."""
    _check_targets(target_epsilon, rel_tol)

    def eps(z: float) -> float:
        return epsilon_completed(noise_multiplier=z, sampling=sampling, steps=steps, delta=target_delta,
                                 backend=backend)

    # central DP's z at the inclusion rate q' is a lower bound of the answer: start just above it
    hi = calibrate_noise_multiplier(target_epsilon=target_epsilon, target_delta=target_delta,
                                    sampling=PoissonSampling(rate=min(1.0, sampling.inclusion_rate)),
                                    steps=steps, backend="pld", rel_tol=rel_tol) * 1.02
    bracket = _bracket(eps, target_epsilon, hi, step=0.98)
    return _narrow(eps, target_epsilon, bracket, rel_tol=rel_tol)


def accounted_noise_multiplier(*, noise_multiplier: float, clip_scale: float, l2_sensitivity: float,
                               smoothing_variance: float = SMOOTHING_VARIANCE) -> float:
    """``sqrt((z C s)^2 (1 - VARIANCE_MARGIN) - w) / Delta_2``: the Gaussian the ledger composes for a
    run of noise ``z`` (:func:`fedprivacy.accounting.release.worst_case_release`)."""
    v = (noise_multiplier * clip_scale) ** 2 * (1.0 - VARIANCE_MARGIN) - smoothing_variance
    if not v > 0:
        raise ValueError(f"noise variance (z C s)^2 = {(noise_multiplier * clip_scale) ** 2:g} must "
                         f"exceed the smoothing variance {smoothing_variance:g}; raise the scale")
    return math.sqrt(v) / l2_sensitivity


def calibrate_distributed(*, target_epsilon: float, target_delta: float, steps: int,
                          audience: str = "server", sampling: Sampling | CohortRuleSampling | None = None,
                          neighbouring: Neighbouring | str = Neighbouring.ADD_REMOVE,
                          encoding_for: Callable[[float], tuple[float, float]],
                          smoothing_variance: float = SMOOTHING_VARIANCE,
                          max_slack: float = 1e-6, rel_tol: float = 1e-3) -> float:
    """Smallest noise multiplier ``z`` whose ``audience`` epsilon over ``steps`` rounds meets the target.

    Exact XNoise makes every completed round the same Gaussian release
    (:func:`fedprivacy.accounting.audiences.audience_epsilons`), so the dominating Gaussian is
    calibrated like central DP (:func:`calibrate_noise_multiplier`, ``pld``, never overshoots)
    for the audience's sampling (``server``: none; ``observers``: ``sampling``), at
    ``(target - 2 max_slack, delta e^-max_slack)`` so that any accepted slack ``H <= max_slack``
    keeps the target. Then ``z`` is solved from ``z_acc = sqrt((z C s)^2 - w)/Delta_2``, where
    ``encoding_for(z) -> (C s, Delta_2)`` gives the encoding the run would use at ``z`` (its scale
    depends on the noise through the headroom check); iterated until the encoding at ``z`` carries
    at least ``z_acc``.
    """
    if audience not in AUDIENCES:
        raise ValueError(f"audience must be one of {AUDIENCES}, got {audience!r}")
    if not target_epsilon > 2 * max_slack:
        raise ValueError(f"target_epsilon must be > {2 * max_slack:g}, got {target_epsilon}")
    samp = NoSampling() if audience == "server" or sampling is None else sampling
    if isinstance(samp, CohortRuleSampling):  # the public's completed-round pair
        if Neighbouring.parse(neighbouring) is not Neighbouring.ADD_REMOVE:
            raise ValueError("the completed-round pair is proved for zero-out (neighbouring=add-remove) only")
        z_acc = calibrate_completed(target_epsilon=target_epsilon - 2.0 * max_slack,
                                    target_delta=target_delta * math.exp(-max_slack), sampling=samp,
                                    steps=steps, rel_tol=rel_tol)
    else:
        z_acc = calibrate_noise_multiplier(
            target_epsilon=target_epsilon - 2.0 * max_slack,
            target_delta=target_delta * math.exp(-max_slack), sampling=samp, steps=steps,
            backend="pld", neighbouring=neighbouring, rel_tol=rel_tol)
    z = z_acc
    for _ in range(64):
        clip_scale, l2 = encoding_for(z)
        if (z * clip_scale) ** 2 * (1.0 - VARIANCE_MARGIN) > smoothing_variance and accounted_noise_multiplier(
                noise_multiplier=z, clip_scale=clip_scale, l2_sensitivity=l2,
                smoothing_variance=smoothing_variance) >= z_acc:
            return z
        z = max(z * (1 + 1e-12), math.sqrt(((z_acc * l2) ** 2 + smoothing_variance)
                                           / (1.0 - VARIANCE_MARGIN)) / clip_scale)
    raise ValueError("calibration did not converge: the encoding's scale keeps shrinking with the "
                     "noise; raise secagg-bits")


def _check_targets(target_epsilon: float, rel_tol: float) -> None:
    if isinstance(target_epsilon, bool) or not isinstance(target_epsilon, int | float):
        raise TypeError(
            f"target_epsilon must be a real number, got {type(target_epsilon).__name__}"
        )
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target_epsilon must be > 0 and finite, got {target_epsilon}")
    if isinstance(rel_tol, bool) or not isinstance(rel_tol, int | float) or not 0 < rel_tol <= 1e-3:
        raise ValueError(f"rel_tol must be in (0, 1e-3], got {rel_tol}")


_Bracket = tuple[float, float, float, float]  # lo, eps(lo), hi, eps(hi)


def _bracket(eps: Callable[[float], float], target: float, hi: float, *, step: float) -> _Bracket:
    """Grow ``hi`` until it meets the target, shrink ``lo`` until it does not.

    Returns ``(lo, eps(lo), hi, eps(hi))`` with ``eps(hi) <= target < eps(lo)``, or ``lo == hi`` when
    even ``_Z_MIN`` meets the target (then ``hi`` is the answer).
    """
    e_hi = eps(hi)
    while e_hi > target:
        if hi >= _Z_MAX:
            raise ValueError(
                f"target_epsilon={target:g} is not reachable with noise_multiplier <= {_Z_MAX:g}"
            )
        hi *= 2.0
        e_hi = eps(hi)
    lo = hi * step
    e_lo = eps(lo)
    while e_lo <= target:
        hi, e_hi = lo, e_lo
        if lo <= _Z_MIN:
            return hi, e_hi, hi, e_hi
        lo *= step
        e_lo = eps(lo)
    return lo, e_lo, hi, e_hi


def _narrow(eps: Callable[[float], float], target: float, bracket: _Bracket, *, rel_tol: float) -> float:
    """Narrow ``eps(hi) <= target < eps(lo)`` to ``hi / lo - 1 <= rel_tol``; returns ``hi``."""
    lo, e_lo, hi, e_hi = bracket
    # Interpolate log(eps) linearly in log(z) and test a pair of points just either side of the
    # guess: when they straddle the target we are done.
    half = 0.45 * rel_tol
    for _ in range(4):
        if hi / lo - 1.0 <= rel_tol:
            return hi
        f_lo = math.log(e_lo / target)
        f_hi = math.log(e_hi / target) if e_hi > 0 else -math.inf
        u_lo, u_hi = math.log(lo), math.log(hi)
        if not math.isfinite(f_hi) or f_lo == f_hi:
            break
        guess = math.exp(u_lo + f_lo * (u_hi - u_lo) / (f_lo - f_hi))
        for z in (guess * (1.0 + half), guess / (1.0 + half)):
            if not lo < z < hi:
                continue
            e = eps(z)
            if e <= target:
                hi, e_hi = z, e
            else:
                lo, e_lo = z, e
    # Fallback (rarely needed): geometric bisection keeps the invariant.
    while hi / lo - 1.0 > rel_tol:
        mid = math.sqrt(lo * hi)
        if eps(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi
