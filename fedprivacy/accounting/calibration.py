"""Noise calibration: the smallest noise multiplier whose certified epsilon meets a target.

Bisection on the noise multiplier z, with a *fresh* accountant per trial (no shared state). Epsilon is
non-increasing in z (more noise is a post-processing-dominated mechanism: the Gaussian pair with ratio
r is degraded from the one with ratio r' < r), so the invariant ``epsilon(hi) <= target < epsilon(lo)``
brackets the answer; the search stops when ``hi / lo - 1 <= rel_tol`` and returns ``hi``, whose
epsilon was computed and is at most the target: the result never overshoots.
"""

from __future__ import annotations

import math

from fedprivacy.accounting.accountant import epsilon_for
from fedprivacy.accounting.events import Neighbouring, Sampling

__all__ = ["calibrate_noise_multiplier"]

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
    if isinstance(target_epsilon, bool) or not isinstance(target_epsilon, int | float):
        raise TypeError(
            f"target_epsilon must be a real number, got {type(target_epsilon).__name__}"
        )
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target_epsilon must be > 0 and finite, got {target_epsilon}")
    if isinstance(rel_tol, bool) or not isinstance(rel_tol, int | float) or not 0 < rel_tol <= 1e-3:
        raise ValueError(f"rel_tol must be in (0, 1e-3], got {rel_tol}")

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

    # Bracket: grow hi until it meets the target, shrink lo until it does not.
    hi = 1.0
    while eps(hi) > target_epsilon:
        if hi >= _Z_MAX:
            raise ValueError(
                f"target_epsilon={target_epsilon:g} is not reachable with noise_multiplier <= {_Z_MAX:g}"
            )
        hi *= 2.0
    lo = hi / 2.0
    while eps(lo) <= target_epsilon:
        hi = lo
        if lo <= _Z_MIN:
            return hi
        lo /= 2.0
    # Invariant: eps(hi) <= target < eps(lo).
    while hi / lo - 1.0 > rel_tol:
        mid = math.sqrt(lo * hi)
        if eps(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return hi
