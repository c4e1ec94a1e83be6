"""Lower-triangular Toeplitz matrices as truncated power series (pure numpy).

A lower-triangular Toeplitz n x n matrix is its first column ``c``; products, inverses and square
roots of such matrices are those of the power series ``c(x) = sum_k c_k x^k`` truncated at degree
n - 1 (the algebra of lower-triangular Toeplitz matrices is isomorphic to R[x]/(x^n)). The square
root is the one with a positive leading coefficient; Kalinin & Lampert (2024, "Banded Square Root
Matrix Factorization for Differentially Private Model Training") use it for BSR.
"""

from __future__ import annotations

import numpy as np

__all__ = ["inverse", "materialize", "multiply", "sqrt"]


def _pad(c: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n)
    m = min(n, c.size)
    out[:m] = c[:m]
    return out


def materialize(coefs: np.ndarray, n: int) -> np.ndarray:
    """The dense n x n lower-triangular Toeplitz matrix with first column ``coefs`` (zero-padded)."""
    c = _pad(np.asarray(coefs, dtype=np.float64), n)
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    return np.where(lag >= 0, c[np.clip(lag, 0, n - 1)], 0.0)


def multiply(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """First column of the product of two lower-triangular Toeplitz matrices (length n)."""
    return _pad(np.convolve(_pad(np.asarray(a, float), n), _pad(np.asarray(b, float), n)), n)


def inverse(coefs: np.ndarray, n: int) -> np.ndarray:
    """First column of the inverse (length n): solves ``C y = e_0`` by forward substitution."""
    c = np.asarray(coefs, dtype=np.float64)
    if c.size == 0 or c[0] == 0.0:
        raise ValueError("a lower-triangular Toeplitz matrix is invertible only with coefs[0] != 0")
    band = min(c.size, n)
    y = np.zeros(n)
    for t in range(n):
        acc = 1.0 if t == 0 else 0.0
        lo = max(0, t - band + 1)
        acc -= float(np.dot(c[1:t - lo + 1][::-1], y[lo:t])) if t > lo else 0.0
        y[t] = acc / c[0]
    return y


def sqrt(coefs: np.ndarray, n: int) -> np.ndarray:
    """First column of the square root with positive diagonal (length n).

    ``s_0 = sqrt(a_0)``, ``s_k = (a_k - sum_{j=1..k-1} s_j s_{k-j}) / (2 s_0)``.
    """
    a = _pad(np.asarray(coefs, dtype=np.float64), n)
    if a[0] <= 0.0:
        raise ValueError(f"the square root needs coefs[0] > 0, got {a[0]}")
    s = np.zeros(n)
    s[0] = np.sqrt(a[0])
    for k in range(1, n):
        s[k] = (a[k] - float(np.dot(s[1:k], s[k - 1:0:-1]))) / (2.0 * s[0])
    return s
