"""Mask expansion: a 256-bit seed to a vector of uint32 words, with AES-256-CTR.

A mask is the AES-256-CTR keystream (``cryptography``/OpenSSL, AES-NI) under the full 32-byte seed as
key and an all-zero initial counter block, read as little-endian uint32 words. Every seed is used for
exactly one mask: seeds are fresh per round (self-mask seeds are drawn per round, pairwise seeds are
HKDF outputs whose salt binds the round and the pair), so a fixed counter block never repeats a
(key, counter) pair. Under the PRP assumption on AES-256 the words are indistinguishable from
independent uniform words mod 2**32, hence uniform mod 2**b for every b <= 32 (2**b divides 2**32).

Contrast (ANCHORS.md): Flower 1.42 folds the 32-byte seed to a 32-bit integer for numpy's MT19937,
so a mask has at most 2**32 possible values and can be brute-forced.

Speed: the accumulation works in cache-sized chunks (16 Ki words): the keystreams of all masks for a
chunk are written side by side and summed with one ``np.add.reduce`` per sign while still in cache,
so the cost is the AES-CTR keystream bound plus about one in-cache pass per mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

__all__ = ["SEED_BYTES", "apply_masks", "expand_mask", "keystream", "reduce_mod"]

SEED_BYTES = 32
CHUNK_WORDS = 1 << 14
GROUP = 8
_ZERO_COUNTER = bytes(16)
_ZEROS = bytes(4 * CHUNK_WORDS)


def _encryptor(seed: bytes):  # noqa: ANN202 - cryptography's CipherContext
    if not isinstance(seed, bytes | bytearray):
        raise TypeError(f"seed must be bytes, got {type(seed).__name__}")
    if len(seed) != SEED_BYTES:
        raise ValueError(f"seed must be {SEED_BYTES} bytes (256 bits), got {len(seed)}")
    return Cipher(algorithms.AES(bytes(seed)), modes.CTR(_ZERO_COUNTER)).encryptor()


def keystream(seed: bytes, nbytes: int) -> bytes:
    """The first ``nbytes`` of the AES-256-CTR keystream of ``seed`` (zero counter block)."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    return _encryptor(seed).update(bytes(nbytes))


def _check_bits(modulus_bits: int) -> int:
    if isinstance(modulus_bits, bool) or not isinstance(modulus_bits, int):
        raise TypeError(f"modulus_bits must be an int, got {type(modulus_bits).__name__}")
    if not 16 <= modulus_bits <= 32:
        raise ValueError(f"modulus_bits must be in [16, 32], got {modulus_bits}")
    return modulus_bits


def reduce_mod(vec: np.ndarray, *, modulus_bits: int) -> np.ndarray:
    """In place: ``vec %= 2**modulus_bits`` for a uint32 vector (a no-op at 32 bits)."""
    _check_bits(modulus_bits)
    if modulus_bits < 32:
        np.bitwise_and(vec, np.uint32((1 << modulus_bits) - 1), out=vec)
    return vec


def expand_mask(seed: bytes, *, dim: int, modulus_bits: int = 32) -> np.ndarray:
    """The mask of ``seed``: ``dim`` uint32 words, uniform mod ``2**modulus_bits``."""
    _check_bits(modulus_bits)
    if dim < 0:
        raise ValueError(f"dim must be >= 0, got {dim}")
    out = np.empty(dim, dtype=np.uint32)
    enc = _encryptor(seed)
    buf = bytearray(4 * dim + 15)
    enc.update_into(bytes(4 * dim), buf)
    out[:] = np.frombuffer(buf, dtype="<u4", count=dim)
    return reduce_mod(out, modulus_bits=modulus_bits)


def apply_masks(
    vec: np.ndarray,
    *,
    add: Sequence[bytes] = (),
    subtract: Sequence[bytes] = (),
    modulus_bits: int = 32,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``out = vec + sum(mask(a) for a in add) - sum(mask(s) for s in subtract) mod 2**b``.

    Args:
        vec: a C-contiguous 1-D ``uint32`` array (modified in place unless ``out`` is given).
        add: seeds whose masks are added.
        subtract: seeds whose masks are subtracted.
        modulus_bits: b in [16, 32].
        out: optional C-contiguous uint32 array of the same shape to write into (saves a copy).

    Returns:
        ``out`` (or ``vec``).
    """
    _check_bits(modulus_bits)
    if not isinstance(vec, np.ndarray) or vec.dtype != np.uint32 or vec.ndim != 1:
        raise TypeError("vec must be a 1-D numpy uint32 array")
    if not vec.flags.c_contiguous:
        raise ValueError("vec must be C-contiguous")
    if out is None:
        out = vec
    elif (not isinstance(out, np.ndarray) or out.dtype != np.uint32 or out.shape != vec.shape
          or not out.flags.c_contiguous):
        raise TypeError("out must be a C-contiguous uint32 array shaped like vec")
    # groups of at most GROUP masks of one sign, so that a group's keystream chunks stay in cache
    groups: list[tuple[list[Any], bool]] = []
    for seeds, is_add in ((add, True), (subtract, False)):
        encs = [_encryptor(s) for s in seeds]
        groups += [(encs[i : i + GROUP], is_add) for i in range(0, len(encs), GROUP)]
    if not groups:
        if out is not vec:
            out[:] = vec
        return reduce_mod(out, modulus_bits=modulus_bits)
    dim = vec.shape[0]
    stride = CHUNK_WORDS + 4  # 16 spare bytes per row: update_into wants len(out) >= len(in) + 15
    buf = bytearray(4 * stride * GROUP)
    rows = np.frombuffer(buf, dtype="<u4").reshape(GROUP, stride)
    view = memoryview(buf)
    acc = np.empty(CHUNK_WORDS, dtype=np.uint32)
    for start in range(0, dim, CHUNK_WORDS):
        n = min(CHUNK_WORDS, dim - start)
        part = out[start : start + n]
        if out is not vec:
            part[:] = vec[start : start + n]
        src = _ZEROS if n == CHUNK_WORDS else _ZEROS[: 4 * n]
        for encs, is_add in groups:
            for r, enc in enumerate(encs):
                enc.update_into(src, view[4 * stride * r : 4 * stride * (r + 1)])
            # the group's keystreams are summed while still in cache (uint32 arithmetic wraps)
            np.add.reduce(rows[: len(encs), :n], axis=0, out=acc[:n])
            if is_add:
                np.add(part, acc[:n], out=part)
            else:
                np.subtract(part, acc[:n], out=part)
    return reduce_mod(out, modulus_bits=modulus_bits)
