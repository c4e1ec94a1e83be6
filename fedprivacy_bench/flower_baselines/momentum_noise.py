"""What Flower 1.42's DP wrappers release around FedAvgM: correlated noise (docs/DESIGN.md).

``DifferentialPrivacy{Client,Server}SideFixedClipping`` add ``xi_t ~ N(0, (sigma C / m)^2 I)`` to the
arrays the wrapped strategy's ``aggregate_train`` *returns*, i.e. after its server step. ``FedAvgM``
keeps its own ``current_arrays`` (the un-noised post-step model ``x_t``, set from the round's arguments
only in the first round) and momentum ``v_t``; clients train from the released ``r_{t-1} = x_{t-1} +
xi_{t-1}``. With server learning rate 1 and momentum beta, and ``u_t`` the mean clipped update:

    g_t = x_{t-1} - (r_{t-1} + u_t) = -(u_t + xi_{t-1}),   v_t = beta v_{t-1} + g_t,   x_t = x_{t-1} - v_t,

so ``(x_t - x_{t-1}) - beta (x_{t-1} - x_{t-2}) = u_t + xi_{t-1}``, and with ``x = r - xi``:

    y_t := r_t - (1 + beta) r_{t-1} + beta r_{t-2} = u_t + xi_t - beta xi_{t-1} + beta xi_{t-2}
    (r_0 = r_{-1} = x_0, xi_0 = xi_{-1} = 0).

``y`` is an invertible (unit lower-triangular) transform of the releases, so the releases are the
mechanism ``u + A xi`` with ``A`` the lower-triangular Toeplitz matrix of the filter
``H(w) = 1 - beta e^{iw} + beta e^{2iw}``. For one client's contributions ``c_t s`` (``|c_t| <= 1``,
``s = C/m`` the change of the mean) the privacy loss of the T releases is exactly that of one Gaussian
with ``mu^2 = (s / std)^2 ||A^{-1} c||^2`` (adaptive choice of the other clients' updates does not change
the likelihood ratio: it depends on the released history only, the same under both datasets), while
independent noise per round (what an accountant of T Gaussian releases assumes) gives ``T (s/std)^2``
at worst. ``|H(pi/3)| = 1 - beta`` (0.1 for beta = 0.9): a contribution of period 6 meets a tenth of the
noise amplitude.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["noise_filter", "released_differences", "filter_amplitude", "mahalanobis_sq",
           "worst_pattern", "mahalanobis_upper_bound"]


def _check(beta: float, rounds: int) -> None:
    if not 0 <= beta < 1:
        raise ValueError(f"beta must be in [0, 1), got {beta}")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")


def noise_filter(beta: float, rounds: int) -> np.ndarray:
    """``A`` (rounds x rounds): the noise on ``y`` is ``A xi`` (rows: 1, -beta, +beta on the diagonals)."""
    _check(beta, rounds)
    a = np.eye(rounds)
    idx = np.arange(rounds)
    a[idx[1:], idx[:-1]] = -beta
    a[idx[2:], idx[:-2]] = beta
    return a


def released_differences(releases: Sequence[np.ndarray], initial: np.ndarray, beta: float) -> np.ndarray:
    """``y_t = r_t - (1 + beta) r_{t-1} + beta r_{t-2}`` for flat releases ``r_1..r_T`` (``r_0 = r_{-1}``
    = ``initial``); rows are rounds."""
    r = [np.asarray(initial, dtype=np.float64)] * 2 + [np.asarray(x, dtype=np.float64) for x in releases]
    return np.stack([r[t] - (1 + beta) * r[t - 1] + beta * r[t - 2] for t in range(2, len(r))])


def filter_amplitude(beta: float, omega: float) -> float:
    """``|H(omega)| = |1 - beta e^{i omega} + beta e^{2 i omega}|``."""
    return float(abs(1 - beta * np.exp(1j * omega) + beta * np.exp(2j * omega)))


def mahalanobis_sq(pattern: np.ndarray, beta: float) -> float:
    """``||A^{-1} c||^2``: the squared privacy-loss ``mu`` of contributions ``c`` (units of s/std)."""
    c = np.asarray(pattern, dtype=np.float64)
    a = noise_filter(beta, len(c))
    z = np.linalg.solve(a, c)
    return float(z @ z)


def worst_pattern(beta: float, rounds: int, *, grid: int = 64) -> tuple[np.ndarray, float]:
    """A contribution pattern ``c`` in ``{-1, +1}^T`` with large ``||A^{-1} c||^2`` (a lower bound on the
    worst case; the maximum of a convex form over the box is at a vertex): the best square wave
    ``sign(cos(w t + phi))`` on a grid, then single flips while one helps."""
    _check(beta, rounds)
    a = noise_filter(beta, rounds)
    m = np.linalg.inv(a @ a.T)
    t = np.arange(rounds)
    best, best_val = np.ones(rounds), -math.inf
    for w in np.linspace(0, math.pi, grid + 1):
        for phi in np.linspace(0, math.pi, 9):
            c = np.where(np.cos(w * t + phi) >= 0, 1.0, -1.0)
            val = float(c @ m @ c)
            if val > best_val:
                best, best_val = c, val
    improved = True
    while improved:  # flipping c_k changes the form by -4 c_k (M c)_k + 4 M_kk
        improved = False
        gains = -4 * best * (m @ best) + 4 * np.diag(m)
        k = int(np.argmax(gains))
        if gains[k] > 1e-12:
            best = best.copy()
            best[k] = -best[k]
            best_val += float(gains[k])
            improved = True
    return best, best_val


def mahalanobis_upper_bound(beta: float, rounds: int) -> float:
    """``T / sigma_min(A)^2``: no contributions of norm <= 1 per round (any directions) exceed it."""
    s = np.linalg.svd(noise_filter(beta, rounds), compute_uv=False)
    return rounds / float(s[-1]) ** 2
