"""Randomised Hadamard rotation (Kairouz, Liu & Steinke 2021, Section 4.2; Suresh et al. 2017).

``rotate(x) = H D x`` on ``x`` zero-padded to the next power of two ``m``, where ``D`` is a diagonal of
random signs and ``H`` the Walsh-Hadamard matrix scaled by ``1/sqrt(m)`` (orthonormal and symmetric,
so ``H^-1 = H``). The rotation preserves the L2 norm and, because the signs are independent of the
vector, every coordinate of ``H D v`` is sub-Gaussian with variance proxy ``||v||^2 / m``
(Hoeffding), which bounds coordinates well below the modular range (used by the headroom check).

The signs are *public*: every client and the server expand the same public seed with AES-256-CTR;
they are not a privacy mechanism and need not be secret.
"""

from __future__ import annotations

import math

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

__all__ = ["fwht", "inverse_rotate", "padded_dim", "random_signs", "rotate"]


def padded_dim(dim: int) -> int:
    """The smallest power of two >= dim (and >= 1)."""
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    return 1 << (dim - 1).bit_length()


def random_signs(seed: bytes, n: int) -> np.ndarray:
    """``n`` values in {-1.0, +1.0} from the AES-256-CTR keystream of the public 32-byte ``seed``."""
    if len(seed) != 32:
        raise ValueError(f"seed must be 32 bytes, got {len(seed)}")
    nbytes = (n + 7) // 8
    enc = Cipher(algorithms.AES(bytes(seed)), modes.CTR(bytes(16))).encryptor()
    bits = np.unpackbits(np.frombuffer(enc.update(bytes(nbytes)), dtype=np.uint8))[:n]
    return 1.0 - 2.0 * bits.astype(np.float64)


def fwht(x: np.ndarray) -> np.ndarray:
    """Orthonormal fast Walsh-Hadamard transform of a float64 vector of power-of-two length (copy)."""
    n = x.shape[0]
    if n & (n - 1):
        raise ValueError(f"length must be a power of two, got {n}")
    y = np.array(x, dtype=np.float64, copy=True)
    h = 1
    while h < n:
        v = y.reshape(-1, 2, h)
        a = v[:, 0, :].copy()
        v[:, 0, :] += v[:, 1, :]
        np.subtract(a, v[:, 1, :], out=v[:, 1, :])
        h *= 2
    y *= 1.0 / math.sqrt(n)
    return y


def rotate(x: np.ndarray, *, seed: bytes) -> np.ndarray:
    """``H D pad(x)``: length ``padded_dim(len(x))``."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    m = padded_dim(x.shape[0])
    padded = np.zeros(m, dtype=np.float64)
    padded[: x.shape[0]] = x
    padded *= random_signs(seed, m)
    return fwht(padded)


def inverse_rotate(y: np.ndarray, *, seed: bytes, dim: int) -> np.ndarray:
    """``(D H y)[:dim]``, the inverse of :func:`rotate`."""
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    out = fwht(y)
    out *= random_signs(seed, y.shape[0])
    return out[:dim]
