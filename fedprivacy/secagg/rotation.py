"""Randomised Hadamard rotation (Kairouz, Liu & Steinke 2021, Section 4.2; Suresh et al. 2017).

``rotate(x) = H D x`` on ``x`` zero-padded to the next power of two ``m``, where ``D`` is a diagonal of
random signs and ``H`` the Walsh-Hadamard matrix scaled by ``1/sqrt(m)`` (orthonormal and symmetric,
so ``H^-1 = H``). The rotation preserves the L2 norm and, because the signs are independent of the
vector, every coordinate of ``H D v`` is sub-Gaussian with variance proxy ``||v||^2 / m``
(Hoeffding), which bounds coordinates well below the modular range (used by the headroom check).

The signs are *public*: every client and the server expand the same public seed with AES-256-CTR;
they are not a privacy mechanism and need not be secret.

Speed (the transform is the largest cost of a distributed-DP client). The fast transform
applies the ``log2 m`` butterfly levels ``(a, b) -> (a + b, a - b)`` in the textbook order, level
``h = 1, 2, 4, ...``, and scales by ``1/sqrt(m)`` last, so every output is the same sequence of IEEE
operations as the plain loop and the result is bit-identical to it (tested against the plain loop).
Only the memory layout changes:

* numpy is slow on the small levels (``h = 2 .. 64``: inner runs of ``h`` doubles); a block of
  ``2^r`` columns is transposed first, so those levels act on whole contiguous rows, then transposed
  back for the large levels;
* vectors beyond :data:`BLOCK` doubles do the first ``log2 BLOCK`` levels block by block while the
  block is in cache, then the remaining levels over the whole vector;
* two buffers alternate between levels (no temporary per level), the signs of a seed are cached
  (one round uses one seed for all clients and the server), and sign flips are exact, so
  ``(x s) c = (x c) s`` bit for bit: the inverse applies signs and scale in one multiplication.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from fedprivacy.secagg.prg import keystream

__all__ = ["BLOCK", "fwht", "inverse_rotate", "padded_dim", "random_signs", "rotate"]

BLOCK = 1 << 16  # doubles per cache block (512 KiB, and as much scratch: fits a 1 MiB L2)
_TRANSPOSED_BITS = 5  # levels h < 2^5 run on the transposed block


def padded_dim(dim: int) -> int:
    """The smallest power of two >= dim (and >= 1)."""
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    return 1 << (dim - 1).bit_length()


@functools.lru_cache(maxsize=4)
def _signs(seed: bytes, n: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(keystream(seed, (n + 7) // 8), dtype=np.uint8))[:n]
    out = 1.0 - 2.0 * bits.astype(np.float64)
    out.setflags(write=False)
    return out


def random_signs(seed: bytes, n: int) -> np.ndarray:
    """``n`` values in {-1.0, +1.0} from the AES-256-CTR keystream of the public 32-byte ``seed``.

    The array is cached per ``(seed, n)`` and read-only; copy it to modify it.
    """
    if not isinstance(seed, bytes | bytearray):
        raise TypeError(f"seed must be bytes, got {type(seed).__name__}")
    if len(seed) != 32:
        raise ValueError(f"seed must be 32 bytes, got {len(seed)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    return _signs(bytes(seed), n)


def _levels(src: np.ndarray, dst: np.ndarray, h: int, stop: int,
            inner: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Butterfly levels ``h, 2h, ... < stop`` on the flat ``src`` (rows of ``inner`` values), with
    ``dst`` as the other buffer; returns ``(result, spare)``."""
    while h < stop:
        a = src.reshape(-1, 2, h * inner)
        b = dst.reshape(-1, 2, h * inner)
        np.add(a[:, 0], a[:, 1], out=b[:, 0])
        np.subtract(a[:, 0], a[:, 1], out=b[:, 1])
        src, dst = dst, src
        h *= 2
    return src, dst


def _block(x: np.ndarray, out: np.ndarray, tmp: np.ndarray) -> None:
    """All levels of the unscaled transform of the flat power-of-two block ``x`` into ``out``."""
    n = x.shape[0]
    cols = 1 << min(_TRANSPOSED_BITS, n.bit_length() - 1)
    rows = n // cols
    np.copyto(tmp.reshape(cols, rows), x.reshape(rows, cols).T)  # small levels act on rows now
    a, b = _levels(tmp, out, 1, cols, inner=rows)
    np.copyto(b.reshape(rows, cols), a.reshape(cols, rows).T)  # natural order again
    a, b = _levels(b, a, cols, n)
    if a is not out:
        np.copyto(out, a)


def _fwht_unscaled(x: np.ndarray) -> np.ndarray:
    """The transform without the ``1/sqrt(m)`` factor, into a new array (``x`` is not modified)."""
    n = x.shape[0]
    out = np.empty(n, dtype=np.float64)
    if n <= BLOCK:
        _block(x, out, np.empty(n, dtype=np.float64))
        return out
    scratch = np.empty(BLOCK, dtype=np.float64)
    for start in range(0, n, BLOCK):
        _block(x[start : start + BLOCK], out[start : start + BLOCK], scratch)
    a, _ = _levels(out, np.empty(n, dtype=np.float64), BLOCK, n)
    return a


def _check_power_of_two(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    n = x.shape[0]
    if n < 1 or n & (n - 1):
        raise ValueError(f"length must be a power of two, got {n}")
    return x


def fwht(x: np.ndarray) -> np.ndarray:
    """Orthonormal fast Walsh-Hadamard transform of a float64 vector of power-of-two length (copy)."""
    y = _fwht_unscaled(_check_power_of_two(x))
    y *= 1.0 / math.sqrt(y.shape[0])
    return y


def rotate(x: np.ndarray, *, seed: bytes) -> np.ndarray:
    """``H D pad(x)``: length ``padded_dim(len(x))``."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    m = padded_dim(x.shape[0])
    signs = random_signs(seed, m)
    d = x.shape[0]
    padded = np.empty(m, dtype=np.float64)
    np.multiply(x, signs[:d], out=padded[:d])
    np.multiply(signs[d:], 0.0, out=padded[d:])  # signed zeros, as zero padding times the signs
    y = _fwht_unscaled(padded)
    y *= 1.0 / math.sqrt(m)
    return y


def inverse_rotate(y: np.ndarray, *, seed: bytes, dim: int) -> np.ndarray:
    """``(D H y)[:dim]``, the inverse of :func:`rotate`."""
    y = _check_power_of_two(y)
    m = y.shape[0]
    if not 1 <= dim <= m:
        raise ValueError(f"dim must be in [1, {m}], got {dim}")
    out = _fwht_unscaled(y)[:dim]
    # a sign flip is exact, so (v c) s == v (c s) bit for bit: one pass for scale and signs
    out *= random_signs(seed, m)[:dim] * (1.0 / math.sqrt(m))
    return out
