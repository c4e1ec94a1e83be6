"""Strategy matrices C of a factorization A = B C: banded Toeplitz (BSR, optimized) and BLT.

The matrix mechanism releases ``C x + z`` and post-processes it with ``B``; equivalently the server
adds ``B z`` to ``A x``, i.e. ``C^{-1} z`` to the gradient stream before its optimizer (Denisov et al.
2022, Sec. 2). Every C here is lower-triangular Toeplitz with ``C[0, 0] > 0``.

* :class:`BandedToeplitz`: ``b`` non-zero diagonals (Choquette-Choo et al. 2023, "(Amplified) Banded
  Matrix Factorization", arXiv 2306.08153). :func:`bsr` is the banded square root of Kalinin &
  Lampert (2024, arXiv 2405.13763): the first ``b`` coefficients of ``sqrt(A)`` for a Toeplitz workload.
* :class:`Blt`: buffered linear Toeplitz, ``c_0 = 1``, ``c_k = sum_j omega_j theta_j**(k-1)``
  (Dvijotham, McMahan et al. 2024, "Efficient and near-optimal noise generation for streaming
  differential privacy", arXiv 2404.16706, Sec. 5): ``C^{-1} z`` streams with one buffer per theta.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedprivacy.dp.matrix import toeplitz
from fedprivacy.dp.matrix.workloads import Workload

__all__ = ["BandedToeplitz", "Blt", "bsr", "decoder", "errors"]


def _floats(name: str, values: object) -> tuple[float, ...]:
    out = tuple(float(v) for v in np.asarray(values, dtype=np.float64).ravel())
    if not out or not all(np.isfinite(out)):
        raise ValueError(f"{name} must be a non-empty sequence of finite floats, got {values!r}")
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class BandedToeplitz:
    """b-banded lower-triangular Toeplitz C: ``C[t, t-j] = coefs[j]`` for ``j < b``, else 0."""

    num_rounds: int
    coefs: tuple[float, ...]
    name: str = "banded"

    def __post_init__(self) -> None:
        object.__setattr__(self, "coefs", _floats("coefs", self.coefs))
        if self.num_rounds < 1:
            raise ValueError(f"num_rounds must be >= 1, got {self.num_rounds}")
        if self.coefs[0] <= 0.0:
            raise ValueError(f"coefs[0] must be > 0 (C invertible), got {self.coefs[0]}")
        if len(self.coefs) > self.num_rounds:
            raise ValueError(f"band {len(self.coefs)} exceeds num_rounds {self.num_rounds}")

    @property
    def band(self) -> int:
        return len(self.coefs)

    def column(self) -> np.ndarray:
        """First column of C, length n."""
        out = np.zeros(self.num_rounds)
        out[: self.band] = self.coefs
        return out

    def matrix(self) -> np.ndarray:
        return toeplitz.materialize(self.column(), self.num_rounds)


@dataclass(frozen=True, slots=True, kw_only=True)
class Blt:
    """BLT C with buffer decays ``theta`` in (0, 1) and output scales ``omega``; ``c_0 = 1``."""

    num_rounds: int
    buf_decay: tuple[float, ...]
    output_scale: tuple[float, ...]
    name: str = "blt"

    def __post_init__(self) -> None:
        object.__setattr__(self, "buf_decay", _floats("buf_decay", self.buf_decay))
        object.__setattr__(self, "output_scale", _floats("output_scale", self.output_scale))
        if len(self.buf_decay) != len(self.output_scale):
            raise ValueError("buf_decay and output_scale must have the same length")
        if not all(0.0 < t < 1.0 for t in self.buf_decay):
            raise ValueError(f"buf_decay must lie in (0, 1), got {self.buf_decay}")
        if self.num_rounds < 1:
            raise ValueError(f"num_rounds must be >= 1, got {self.num_rounds}")

    @property
    def num_buffers(self) -> int:
        return len(self.buf_decay)

    @property
    def band(self) -> int:
        return self.num_rounds  # not banded

    @property
    def in_monotone_box(self) -> bool:
        """``omega_j > 0`` (finite) and ``sum omega <= 1``: C's coefficients ``1, sum_j omega_j theta_j^(t-1)``
        are then positive and non-increasing exactly, and their float64 sums (positive terms only) match
        the exact ones to rounding. Outside it, cancelling scales can give a float column (and a noise
        stream) that differ from the exact C."""
        om = self.output_scale
        return all(np.isfinite(w) and w > 0.0 for w in om) and float(sum(om)) <= 1.0

    def column(self) -> np.ndarray:
        k = np.arange(1, self.num_rounds, dtype=np.float64)
        th, om = np.asarray(self.buf_decay), np.asarray(self.output_scale)
        return np.concatenate([[1.0], (om[None, :] * th[None, :] ** (k[:, None] - 1.0)).sum(axis=1)])

    def matrix(self) -> np.ndarray:
        return toeplitz.materialize(self.column(), self.num_rounds)


def bsr(workload: Workload, band: int) -> BandedToeplitz:
    """Banded square root: the first ``band`` coefficients of ``sqrt(A_const)``.

    For prefix sums these are ``binom(2k, k) / 4**k``; with momentum beta, the coefficients of
    ``(1 - x)^{-1/2} (1 - beta x)^{-1/2}`` (Kalinin & Lampert 2024). A learning-rate schedule makes A
    non-Toeplitz; BSR then uses the constant-rate momentum workload (``B = A C^{-1}`` stays exact).
    """
    if band < 1 or band > workload.num_rounds:
        raise ValueError(f"band must be in [1, num_rounds={workload.num_rounds}], got {band}")
    root = toeplitz.sqrt(workload.momentum_coefs()[:band], band)
    return BandedToeplitz(num_rounds=workload.num_rounds, coefs=tuple(root), name=f"bsr-{band}")


def decoder(workload: Workload, strategy: BandedToeplitz | Blt) -> np.ndarray:
    """Dense ``B = A C^{-1}``, so that ``A == B C`` (for checks and error figures)."""
    n = workload.num_rounds
    c_inv = toeplitz.materialize(toeplitz.inverse(strategy.column(), n), n)
    return workload.matrix() @ c_inv


def errors(workload: Workload, strategy: BandedToeplitz | Blt) -> dict[str, float]:
    """Per-round noise std of ``B z`` (unit z): RMS over rounds and max, before sensitivity scaling."""
    rows = np.sum(decoder(workload, strategy) ** 2, axis=1)
    return {"rms": float(np.sqrt(rows.mean())), "max": float(np.sqrt(rows.max()))}
