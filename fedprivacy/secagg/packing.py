"""Pack ``b``-bit ring residues into ``ceil(m b / 8)`` bytes for the upload (and back).

A masked input is ``m`` residues mod ``2^b``; sending them as uint32 costs 4 bytes per coordinate
whatever ``b``. Packed, 16 bits cost 2 B and 20 bits 2.5 B per coordinate (the upload goal).
Layout: little-endian bit stream, residue ``i`` in bits ``[i b, (i+1) b)``; the tail is zero-padded
to a whole byte and :func:`unpack_residues` refuses a payload of the wrong length or with nonzero
padding, so a malformed upload is detected rather than decoded into garbage.

When ``g b`` is a multiple of 8 and at most 64 for ``g = 8 / gcd(b, 8)`` (b = 8, 10, 12, 14, 16,
20, 24, 28, 32) groups of ``g`` residues are assembled in a uint64 and sliced to bytes (vectorised);
other widths go through ``numpy.unpackbits`` / ``packbits`` (correct, slower).
"""

from __future__ import annotations

import math

import numpy as np

from fedprivacy.secagg.quantize import _bits  # the ring's width rule, [8, 32]

__all__ = ["pack_residues", "packed_size", "unpack_residues"]


def packed_size(count: int, *, modulus_bits: int) -> int:
    """Bytes of ``count`` packed residues: ``ceil(count b / 8)``."""
    return (int(count) * _bits(modulus_bits) + 7) // 8


def _group(b: int) -> int:
    g = 8 // math.gcd(b, 8)
    return g if g * b <= 64 else 0


def pack_residues(values: np.ndarray, *, modulus_bits: int) -> bytes:
    """uint32 residues ``< 2^b`` -> packed bytes (ValueError for a residue out of range)."""
    b = _bits(modulus_bits)
    v = np.asarray(values)
    if v.dtype != np.uint32 or v.ndim != 1:
        raise ValueError("values must be a 1-D uint32 array")
    if b < 32 and v.size and int(v.max()) >= 1 << b:
        raise ValueError(f"values must be < 2^{b}")
    if b in (8, 16, 32):
        return v.astype({8: "<u1", 16: "<u2", 32: "<u4"}[b]).tobytes()
    m = v.shape[0]
    g = _group(b)
    if g:
        k = -(-m // g)
        padded = np.zeros(k * g, dtype=np.uint64)
        padded[:m] = v
        grid = padded.reshape(k, g)
        word = np.zeros(k, dtype=np.uint64)
        for j in range(g):
            word |= grid[:, j] << np.uint64(j * b)
        nbytes = g * b // 8
        out = word.astype("<u8").view(np.uint8).reshape(k, 8)[:, :nbytes].tobytes()
        return out[: packed_size(m, modulus_bits=b)]
    bits = np.unpackbits(v.astype("<u4").view(np.uint8).reshape(m, 4), axis=1, bitorder="little")
    return np.packbits(bits[:, :b].reshape(-1), bitorder="little").tobytes()


def unpack_residues(data: bytes, *, count: int, modulus_bits: int) -> np.ndarray:
    """Packed bytes -> ``count`` uint32 residues (ValueError on a wrong length or nonzero padding)."""
    b = _bits(modulus_bits)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be an int >= 0, got {count!r}")
    raw = bytes(data)
    if len(raw) != packed_size(count, modulus_bits=b):
        raise ValueError(f"packed payload must be {packed_size(count, modulus_bits=b)} bytes for "
                         f"{count} residues of {b} bits, got {len(raw)}")
    if b in (8, 16, 32):
        return np.frombuffer(raw, dtype={8: "<u1", 16: "<u2", 32: "<u4"}[b]).astype(np.uint32)
    g = _group(b)
    if g:
        nbytes = g * b // 8
        k = -(-count // g)
        buf = np.zeros((k, 8), dtype=np.uint8)
        flat = np.frombuffer(raw + bytes(k * nbytes - len(raw)), dtype=np.uint8)
        buf[:, :nbytes] = flat.reshape(k, nbytes)
        word = buf.view("<u8").reshape(k)
        mask = np.uint64((1 << b) - 1)
        grid = np.stack([(word >> np.uint64(j * b)) & mask for j in range(g)], axis=1).reshape(-1)
        out = grid[:count].astype(np.uint32)
        if int(np.count_nonzero(grid[count:])):
            raise ValueError("packed payload has nonzero padding")
        return out
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little")
    if int(np.count_nonzero(bits[count * b:])):
        raise ValueError("packed payload has nonzero padding")
    vals = bits[: count * b].reshape(count, b)
    full = np.zeros((count, 32), dtype=np.uint8)
    full[:, :b] = vals
    return np.packbits(full, axis=1, bitorder="little").view("<u4").reshape(count).astype(np.uint32)
