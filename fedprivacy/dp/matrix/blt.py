"""Optimized BLT strategies: buffer decays and output scales for a workload, a horizon and a schema.

A BLT ``C`` (Dvijotham, McMahan et al. 2024, arXiv 2404.16706, Sec. 5) has the rational generating
function ``c(x) = 1 + sum_j omega_j x / (1 - theta_j x) = P(x) / Q(x)`` with
``Q = prod_j (1 - theta_j x)``, so C's column, ``C^{-1}``'s and the decoder ``B = A C^{-1}``'s are
impulse responses of short recursive filters: O(T * buffers) per evaluation, no T x T matrix.

:func:`optimize_blt` minimizes the min-separation loss of McMahan, Xu & Zhang 2024 ("A hassle-free
algorithm for private learning in practice: don't use tree aggregation, use BLTs", arXiv 2408.08868):
``sens(C)^2 * ||A C^{-1}||_F^2 / T``, the mean squared noise error of the released iterates at a
fixed privacy level. The parameters are kept in ``theta_j in (0, 1)``, ``omega_j > 0`` and
``sum_j omega_j < 1``, so C's coefficients are positive and non-increasing and its sensitivity under
b-min-separation is the earliest pattern's ``|C u|`` (Kalinin & Lampert 2024, arXiv 2405.13763,
Thm. 2; :func:`fedprivacy.dp.matrix.min_sep_sensitivity` recomputes it from C and refuses otherwise).

The optimizer only chooses C: privacy is computed from the returned strategy itself, so a worse
optimum costs accuracy, never ε. The search is deterministic (fixed starts, L-BFGS-B).
"""

from __future__ import annotations

import numpy as np
from scipy import optimize, signal

from fedprivacy.dp.matrix.accounting import MinSeparation
from fedprivacy.dp.matrix.sensitivity import participation_limit
from fedprivacy.dp.matrix.strategies import Blt
from fedprivacy.dp.matrix.workloads import Workload

__all__ = ["OPTIMIZER_VERSION", "blt_loss", "optimize_blt"]

#: bumped whenever the search changes, so on-disk caches of its results are not reused
OPTIMIZER_VERSION = "blt-minsep-lbfgsb-2"

_THETA_MAX = 1.0 - 1e-9


def _filters(blt: Blt) -> tuple[np.ndarray, np.ndarray]:
    """``(P, Q)``: c(x) = P(x) / Q(x) as polynomial coefficient arrays in x (lowest degree first)."""
    th, om = np.asarray(blt.buf_decay), np.asarray(blt.output_scale)
    q = np.array([1.0])
    for t in th:
        q = np.convolve(q, [1.0, -t])
    p = np.concatenate([q, [0.0]])
    for j in range(th.size):
        rest = np.array([1.0])
        for i, t in enumerate(th):
            if i != j:
                rest = np.convolve(rest, [1.0, -t])
        p[1:1 + rest.size] += om[j] * rest
    return p, q


def blt_loss(workload: Workload, blt: Blt, *, min_sep: int, max_participations: int | None) -> float:
    """``sens^2 * ||A C^{-1}||_F^2 / T`` with sens the earliest min-separated pattern's ``|C u|``.

    Valid as the sensitivity only for C with non-negative non-increasing coefficients (the parameter
    box :func:`optimize_blt` searches); A is the workload's constant-rate momentum matrix.
    """
    n = workload.num_rounds
    p, q = _filters(blt)
    b = signal.lfilter(q, p, workload.momentum_coefs())
    k = participation_limit(n, min_sep, max_participations)
    u = np.zeros(n)
    u[np.arange(k) * min_sep] = 1.0
    cu = signal.lfilter(p, q, u)
    frob = float(np.sum((n - np.arange(n)) * b * b))  # Toeplitz B: column j appears n - j times
    return float(np.dot(cu, cu)) * frob / n


def _unpack(x: np.ndarray, n: int, m: int) -> Blt:
    theta = np.clip(1.0 / (1.0 + np.exp(-x[:m])), 1e-6, _THETA_MAX)
    w = np.exp(x[m:2 * m] - np.max(x[m:2 * m]))
    total = min(1.0 / (1.0 + np.exp(-x[2 * m])), 1.0 - 1e-9)  # c_1 = sum(omega) < c_0 = 1, with room
    omega = np.maximum(w / w.sum() * total, 1e-15)
    return Blt(num_rounds=n, buf_decay=tuple(theta), output_scale=tuple(omega), name=f"blt-{m}")


def _starts(n: int, m: int) -> list[np.ndarray]:
    out = []
    for top in (np.log10(max(n, 2)), 0.5 * np.log10(max(n, 2)) + 0.5):
        gap = 10.0 ** -np.linspace(0.3, max(top, 0.31), m)
        theta = 1.0 - gap
        out.append(np.concatenate([np.log(theta / (1.0 - theta)), np.zeros(m), [0.0]]))
    return out


def optimize_blt(workload: Workload, *, num_buffers: int, min_sep: int = 1,
                 max_participations: int | None = None) -> Blt:
    """The BLT with ``num_buffers`` buffers that minimizes :func:`blt_loss` (deterministic).

    Raises:
        ValueError: for ``num_buffers`` < 1 or a bad schema.
    """
    if isinstance(num_buffers, bool) or not isinstance(num_buffers, int) or num_buffers < 1:
        raise ValueError(f"num_buffers must be an integer >= 1, got {num_buffers!r}")
    MinSeparation(min_separation=min_sep, max_participations=max_participations)  # validates the schema
    n, m = workload.num_rounds, num_buffers

    def objective(x: np.ndarray) -> float:
        try:
            value = blt_loss(workload, _unpack(x, n, m), min_sep=min_sep, max_participations=max_participations)
        except (ValueError, FloatingPointError):
            return 1e300
        return float(np.log(value)) if np.isfinite(value) and value > 0 else 1e300

    best: tuple[float, np.ndarray] | None = None
    for x0 in _starts(n, m):
        res = optimize.minimize(objective, x0, method="L-BFGS-B", options={"maxiter": 500})
        if best is None or res.fun < best[0]:
            best = (float(res.fun), res.x)
    assert best is not None
    return _unpack(best[1], n, m)
