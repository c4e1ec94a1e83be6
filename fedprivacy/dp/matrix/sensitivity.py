"""L2 sensitivity of ``x -> C x`` when one client's clipped contributions (norm <= 1) change.

``sens(C) = max_pi max_{|g_i|<=1} |sum_{i in pi} C[:, i] g_i|`` over the participation patterns pi
the schema allows (Choquette-Choo et al. 2023, "Multi-Epoch Matrix Factorization", Sec. 2). Three
results, each applied only where its hypotheses hold (a wrong one would under-state epsilon):

* single participation: the largest column norm of C (any C).
* b-min-separation, at most k participations, C with columns ``i, j`` orthogonal whenever
  ``|i - j| >= min_sep`` (true for a banded C with band <= min_sep): exact,
  ``sqrt(max_pi sum_{i in pi} |C[:, i]|^2)`` by the dynamic program of Choquette-Choo et al. 2023
  "(Amplified) Banded MF" (arXiv 2306.08153, Theorem 2 and Algorithm 3).
* b-min-separation for a Toeplitz C with non-negative, non-increasing coefficients (any band): exact,
  the worst case is k participations exactly min_sep apart (arXiv 2405.13763, Theorem 2).

Any other (C, schema) pair is refused, naming the condition that failed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedprivacy.dp.matrix.strategies import BandedToeplitz, Blt

__all__ = ["Sensitivity", "min_sep_sensitivity", "participation_limit", "single_participation_sensitivity"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Sensitivity:
    """A sensitivity (in units of the clip norm) and the result it rests on."""

    value: float
    basis: str


def participation_limit(num_rounds: int, min_sep: int, k: int | None) -> int:
    """The most participations possible: ``min(k, ceil(n / min_sep))``."""
    most = -(-num_rounds // min_sep)
    return most if k is None else min(k, most)


def _best_separated_sum(x: np.ndarray, min_sep: int, k: int) -> float:
    """max over index sets pi, |pi| <= k, pairwise gaps >= min_sep, of sum x[pi] (x >= 0)."""
    n = x.size
    f = np.zeros(n + min_sep)
    for _ in range(k):
        g = f.copy()
        g[:n] = x + f[min_sep:min_sep + n]
        f = np.maximum.accumulate(g[::-1])[::-1]
    return float(f[0])


def _check_blt(strategy: BandedToeplitz | Blt) -> None:
    """A BLT is bounded only inside its monotone box (:attr:`Blt.in_monotone_box`): outside it the float
    column the bound is computed from may not be the C that the noise stream runs."""
    if isinstance(strategy, Blt) and not strategy.in_monotone_box:
        raise ValueError(f"cannot bound the sensitivity of BLT {strategy.name!r}: its output scales must be > 0 "
                         f"and sum to <= 1 (got {strategy.output_scale}), else its computed coefficients need "
                         "not be the C that runs")


def single_participation_sensitivity(strategy: BandedToeplitz | Blt) -> Sensitivity:
    """Largest column norm; for lower-triangular Toeplitz C it is the first column's norm."""
    _check_blt(strategy)
    return Sensitivity(value=float(np.linalg.norm(strategy.column())),
                       basis="single participation: max column norm of C")


def _check_schema(num_rounds: int, min_sep: int, k: int | None) -> None:
    if isinstance(min_sep, bool) or not isinstance(min_sep, int) or min_sep < 1:
        raise ValueError(f"min_separation must be an integer >= 1, got {min_sep!r}")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"max_participations must be an integer >= 1 or None, got {k!r}")


def min_sep_sensitivity(strategy: BandedToeplitz | Blt, *, min_sep: int,
                        max_participations: int | None = None) -> Sensitivity:
    """Sensitivity under b-min-separation (gaps >= ``min_sep`` rounds) with at most k participations.

    Raises:
        ValueError: when neither theorem's hypotheses hold for this (C, schema), or on bad input.
    """
    n = strategy.num_rounds
    _check_blt(strategy)
    _check_schema(n, min_sep, max_participations)
    k = participation_limit(n, min_sep, max_participations)
    if k == 1:
        return single_participation_sensitivity(strategy)
    col = strategy.column()
    if strategy.band <= min_sep:
        norms2 = np.array([np.sum(col[: n - i] ** 2) for i in range(n)])
        value = np.sqrt(_best_separated_sum(norms2, min_sep, k))
        return Sensitivity(value=float(value), basis=(
            f"{min_sep}-min-separation, <= {k} participations, band {strategy.band} <= separation: "
            "orthogonal columns (Choquette-Choo et al. 2023, arXiv 2306.08153, Theorem 2)"))
    if np.all(col >= 0.0) and np.all(np.diff(col) <= 0.0):
        # k participations exactly min_sep apart from round 0: u = sum_j e_{j*min_sep}, |C u|.
        u = np.zeros(n)
        u[np.arange(k) * min_sep] = 1.0
        cu = np.convolve(col, u)[:n]
        return Sensitivity(value=float(np.linalg.norm(cu)), basis=(
            f"{min_sep}-min-separation, <= {k} participations, Toeplitz C with non-negative "
            "non-increasing coefficients (arXiv 2405.13763, Theorem 2)"))
    raise ValueError(
        f"cannot bound the sensitivity: band {strategy.band} > min_separation {min_sep} and C's "
        "coefficients are not non-negative and non-increasing")
