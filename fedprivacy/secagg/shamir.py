"""Shamir secret sharing: the reference scheme over GF(2^521 - 1) and a fast limbed scheme over GF(2^31 - 1).

Shamir (1979): to share a secret ``s`` with threshold ``t`` draw ``a_1..a_{t-1}`` uniformly from GF(p)
and hand party ``x`` the value ``f(x) = s + a_1 x + ... + a_{t-1} x^{t-1}``. Any ``t`` shares determine
``f`` (Lagrange interpolation) and hence ``s = f(0)``; any ``t - 1`` shares are *information-
theoretically* independent of ``s``.

**Reference scheme** (:func:`split`, :func:`split_many`, :func:`reconstruct`, ...). The field
``p = 2^521 - 1`` is larger than 2**256, so the 32-byte secrets of secure aggregation (self-mask seeds
and X25519 private keys) embed without reduction, and any abscissa below ``p`` (e.g. a 64-bit node id
plus one) works. Plain Python integers; coefficients from :func:`secrets.randbelow` (the OS CSPRNG).

**Limbed scheme** (:func:`split_secrets`, :func:`reconstruct_secrets`, :func:`encode_shares`,
:func:`decode_shares`), for speed: a secret of ``B`` bytes is cut into ``L = ceil(8 B / 30)`` limbs of
30 bits (9 for 32 bytes), each shared with its own independent random polynomial over the Mersenne
prime field ``q = 2^31 - 1``, all evaluated at once with numpy (``uint64``, no overflow before the
reduction mod ``q``). Coefficients are uniform on ``[0, q)`` by rejection from 31-bit words of
:func:`secrets.token_bytes`.

Guarantees of the limbed scheme. ``t - 1`` shares reveal nothing about any bit of the secret, with no
computational assumption (Shamir's secrecy holds in every prime field larger than the number of
parties whose elements hold the secret: ``2^30 < q``); the abscissae must lie in ``[1, q)``, so callers
number the holders ``1..n`` (e.g. position in the sorted roster plus one) instead of using 64-bit node
ids. Any ``t`` shares give back every limb exactly; a decoded limb ``>= 2^30`` (or high bits beyond
``8 B``) proves the shares inconsistent and is reported, never returned as a wrong secret. This
catches random corruption (a random wrong share passes with probability about ``2^-23`` for a 32-byte
secret) but *not* a holder who crafts its share: only a check against a commitment (or a public key)
of the secret detects that, and it is the caller's job.
Rationale: docs/SECAGG.md, section "Shamir over a small field".
"""

from __future__ import annotations

import functools
import secrets
import sys
from collections.abc import Callable, Sequence

import numpy as np

__all__ = [
    "LIMB_BITS",
    "LIMB_PRIME",
    "PRIME",
    "SHARE_BYTES",
    "ShareError",
    "decode_share",
    "decode_many",
    "decode_shares",
    "encode_share",
    "encode_shares",
    "interpolate",
    "lagrange_weights",
    "limbs_per_secret",
    "reconstruct",
    "reconstruct_secrets",
    "split",
    "split_many",
    "split_secrets",
]

PRIME = 2**521 - 1
SHARE_BYTES = 66  # ceil(521 / 8)


def _check_xs(xs: Sequence[int], *, allow_zero: bool = False) -> list[int]:
    out = []
    low = 0 if allow_zero else 1
    for x in xs:
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"share abscissae must be ints, got {type(x).__name__}")
        if not low <= x < PRIME:
            raise ValueError(f"share abscissae must be in [{low}, p), got {x}")
        out.append(x)
    if len(set(out)) != len(out):
        raise ValueError("share abscissae must be distinct")
    return out


def _check_threshold(threshold: int, num_shares: int) -> None:
    if isinstance(threshold, bool) or not isinstance(threshold, int):
        raise TypeError(f"threshold must be an int, got {type(threshold).__name__}")
    if not 1 <= threshold <= num_shares:
        raise ValueError(f"threshold must be in [1, num_shares={num_shares}], got {threshold}")


def split_many(
    secrets_: Sequence[int], *, threshold: int, xs: Sequence[int]
) -> list[list[int]]:
    """Share every secret in ``secrets_`` at the abscissae ``xs``; returns ``shares[i][j] = f_i(xs[j])``.

    Each secret gets its own independent random polynomial of degree ``threshold - 1``.
    """
    xs = _check_xs(xs)
    _check_threshold(threshold, len(xs))
    for s in secrets_:
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"secret must be an int, got {type(s).__name__}")
        if not 0 <= s < PRIME:
            raise ValueError(f"secret must be in [0, p), got a {s.bit_length()}-bit value")
    # powers[j][k] = xs[j]**k mod p, shared by all secrets
    powers = []
    for x in xs:
        row = [1] * threshold
        for k in range(1, threshold):
            row[k] = row[k - 1] * x % PRIME
        powers.append(row)
    out = []
    for s in secrets_:
        coeffs = [s] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
        out.append([sum(c * p for c, p in zip(coeffs, row, strict=True)) % PRIME for row in powers])
    return out


def split(secret: int, *, threshold: int, xs: Sequence[int]) -> list[int]:
    """Shares of one secret at ``xs`` (see :func:`split_many`)."""
    return split_many([secret], threshold=threshold, xs=xs)[0]


def lagrange_weights(xs: Sequence[int], *, at: int = 0) -> list[int]:
    """Weights ``w_i`` with ``f(at) = sum_i w_i f(xs[i])`` for every polynomial of degree < len(xs)."""
    xs = _check_xs(xs, allow_zero=True)
    at %= PRIME
    nums, dens = [], []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if i != j:
                num = num * (at - xj) % PRIME
                den = den * (xi - xj) % PRIME
        nums.append(num)
        dens.append(den)
    # one inversion for all denominators (Montgomery's trick)
    prefix = [1] * (len(dens) + 1)
    for i, d in enumerate(dens):
        prefix[i + 1] = prefix[i] * d % PRIME
    inv = pow(prefix[-1], -1, PRIME)
    weights = [0] * len(dens)
    for i in range(len(dens) - 1, -1, -1):
        weights[i] = nums[i] * inv * prefix[i] % PRIME
        inv = inv * dens[i] % PRIME
    return weights


def interpolate(points: Sequence[tuple[int, int]], *, at: int = 0) -> int:
    """Value at ``at`` of the unique polynomial of degree < len(points) through ``points``."""
    xs = [x for x, _ in points]
    w = lagrange_weights(xs, at=at)
    return sum(wi * (y % PRIME) for wi, (_, y) in zip(w, points, strict=True)) % PRIME


def reconstruct(points: Sequence[tuple[int, int]], *, threshold: int) -> int:
    """The secret from at least ``threshold`` shares ``(x, f(x))``; uses the first ``threshold``.

    Raises:
        ValueError: fewer than ``threshold`` shares (nothing about the secret is computed).
    """
    if len(points) < threshold:
        raise ValueError(f"need at least threshold={threshold} shares, got {len(points)}")
    return interpolate(list(points)[:threshold], at=0)


def encode_share(value: int) -> bytes:
    """Fixed-width big-endian encoding of a field element (66 bytes)."""
    if not 0 <= value < PRIME:
        raise ValueError("share value must be in [0, p)")
    return value.to_bytes(SHARE_BYTES, "big")


def decode_share(data: bytes) -> int:
    """Inverse of :func:`encode_share`; refuses wrong lengths and values outside the field."""
    if len(data) != SHARE_BYTES:
        raise ValueError(f"share must be {SHARE_BYTES} bytes, got {len(data)}")
    value = int.from_bytes(data, "big")
    if value >= PRIME:
        raise ValueError("share value is not a field element")
    return value


# ----------------------------------------------------------------------------- limbed scheme
LIMB_PRIME = 2**31 - 1  # Mersenne prime q
LIMB_BITS = 30  # bits of secret per limb: 2^30 < q, so the limb encoding is injective
_Q = np.uint64(LIMB_PRIME)
_LIMB_MASK = (1 << LIMB_BITS) - 1


class ShareError(ValueError):
    """Shares that no polynomial of degree < threshold over a valid secret passes through."""


_LE_U32 = np.dtype("<u4")
_NATIVE_LE = sys.byteorder == "little" and memoryview(b"\0" * 4).cast("I").itemsize == 4


@functools.lru_cache(maxsize=8)
def _limbs_of(secret_bytes: int) -> int:
    return limbs_per_secret(secret_bytes)


def limbs_per_secret(secret_bytes: int) -> int:
    """``ceil(8 B / 30)``: limbs of a ``B``-byte secret (9 for 32 bytes)."""
    if isinstance(secret_bytes, bool) or not isinstance(secret_bytes, int) or secret_bytes < 1:
        raise ValueError(f"secret_bytes must be an int >= 1, got {secret_bytes!r}")
    return -(-8 * secret_bytes // LIMB_BITS)


def _limb_xs(xs: Sequence[int], *, name: str = "xs") -> np.ndarray:
    out = []
    for x in xs:
        if isinstance(x, bool) or not isinstance(x, int | np.integer):
            raise TypeError(f"{name} must be ints, got {type(x).__name__}")
        if not 1 <= int(x) < LIMB_PRIME:
            raise ValueError(f"{name} must be in [1, 2^31 - 1) (number the holders 1..n), got {x}")
        out.append(int(x))
    if len(set(out)) != len(out):
        raise ValueError(f"{name} must be distinct, got {out}")
    return np.asarray(out, dtype=np.uint64)


def _to_limbs(secrets_: Sequence[bytes]) -> tuple[np.ndarray, int]:
    """(S, L) uint64 limbs (little-endian 30-bit pieces) of equally long byte strings."""
    if not secrets_:
        raise ValueError("secrets must not be empty")
    nbytes = len(secrets_[0])
    for b in secrets_:
        if not isinstance(b, bytes | bytearray):
            raise TypeError(f"secrets must be bytes, got {type(b).__name__}")
        if len(b) != nbytes or nbytes == 0:
            raise ValueError(f"secrets must be non-empty and of one length, got lengths "
                             f"{sorted({len(x) for x in secrets_})}")
    limbs = limbs_per_secret(nbytes)
    rows = []
    for b in secrets_:
        v = int.from_bytes(b, "little")
        rows.append([(v >> (LIMB_BITS * j)) & _LIMB_MASK for j in range(limbs)])
    return np.array(rows, dtype=np.uint64), nbytes


def _uniform_field(shape: tuple[int, ...], random_bytes: Callable[[int], bytes]) -> np.ndarray:
    """Uniform elements of GF(q): 31-bit words, the one value ``q`` (= 2^31 - 1) rejected and redrawn."""
    count = int(np.prod(shape, dtype=np.int64))
    out = np.frombuffer(random_bytes(4 * count), dtype="<u4").astype(np.uint64) & np.uint64(LIMB_PRIME)
    bad = np.flatnonzero(out == _Q)  # probability 2^-31 per element
    while bad.size:
        redraw = np.frombuffer(random_bytes(4 * bad.size), dtype="<u4").astype(np.uint64)
        redraw &= np.uint64(LIMB_PRIME)
        out[bad] = redraw
        bad = bad[redraw == _Q]
    return out.reshape(shape)


def split_secrets(
    secrets_: Sequence[bytes], *, threshold: int, xs: Sequence[int],
    random_bytes: Callable[[int], bytes] = secrets.token_bytes,
) -> np.ndarray:
    """Shares of equally long byte strings at the small abscissae ``xs`` (limbed scheme, see above).

    Args:
        secrets_: ``S`` secrets of ``B`` bytes each (e.g. a self-mask seed and a private key).
        threshold: ``t``; any ``t`` holders reconstruct, any ``t - 1`` learn nothing.
        xs: the ``n`` holders' abscissae, distinct, in ``[1, 2^31 - 1)``.
        random_bytes: source of the coefficients (the OS CSPRNG; injectable for known-answer tests).

    Returns:
        ``uint32`` array of shape ``(n, S, L)``: ``out[h]`` is what holder ``h`` receives
        (:func:`encode_shares` turns it into ``4 S L`` bytes).
    """
    x = _limb_xs(xs)
    _check_threshold(threshold, len(x))
    limbs, _ = _to_limbs(secrets_)
    coeffs = _uniform_field((threshold - 1, *limbs.shape), random_bytes)
    xb = x[:, None, None]
    # Horner from the top coefficient: acc < q and x < q, so acc * x + c < 2^62 + 2^31 (no overflow)
    acc = np.zeros((len(x), *limbs.shape), dtype=np.uint64)
    for c in coeffs[::-1]:
        acc *= xb
        acc += c
        acc %= _Q
    acc *= xb
    acc += limbs
    acc %= _Q
    return acc.astype(np.uint32)


def encode_shares(shares: np.ndarray) -> bytes:
    """One holder's ``(S, L)`` share limbs as ``4 S L`` little-endian bytes."""
    a = np.asarray(shares)
    if a.ndim != 2 or a.dtype.kind not in "ui" or (a.size and int(a.max()) >= LIMB_PRIME):
        raise ValueError("shares must be a 2-D array of field elements (< 2^31 - 1)")
    return a.astype("<u4").tobytes()


def decode_shares(data: bytes, *, num_secrets: int, secret_bytes: int) -> np.ndarray:
    """Inverse of :func:`encode_shares`; refuses a wrong length and values outside GF(2^31 - 1)."""
    limbs = _limbs_of(secret_bytes)
    want = 4 * num_secrets * limbs
    if not isinstance(data, bytes | bytearray) or len(data) != want:
        got = len(data) if isinstance(data, bytes | bytearray) else type(data).__name__
        raise ValueError(f"shares must be {want} bytes ({num_secrets} secrets x {limbs} limbs), got {got}")
    # a server decodes thousands per round: the check in Python on a memoryview is ~2x cheaper
    words = memoryview(data).cast("I") if _NATIVE_LE else np.frombuffer(data, dtype=_LE_U32)
    if want and max(words) >= LIMB_PRIME:
        raise ValueError("share value is not an element of GF(2^31 - 1)")
    return np.frombuffer(data, dtype=_LE_U32).reshape(num_secrets, limbs).astype(np.uint32)


def decode_many(datas: Sequence[bytes], *, num_secrets: int, secret_bytes: int) -> np.ndarray:
    """:func:`decode_shares` of every item, stacked ``(N, S, L)``: one pass over their joined bytes
    (a server decodes ~100 shares a reply). Refuses what :func:`decode_shares` refuses, with the
    error it raises for the first item it refuses."""
    limbs = _limbs_of(secret_bytes)
    want = 4 * num_secrets * limbs
    if all(isinstance(d, bytes | bytearray) and len(d) == want for d in datas):
        words = np.frombuffer(b"".join(datas), dtype=_LE_U32)
        if not words.size or int(words.max()) < LIMB_PRIME:
            return words.reshape(len(datas), num_secrets, limbs).astype(np.uint32)
    for d in datas:  # the first item the one-pass checks refuse raises decode_shares' own error
        decode_shares(d, num_secrets=num_secrets, secret_bytes=secret_bytes)
    raise AssertionError("unreachable: decode_shares refuses an item the checks above refused")  # pragma: no cover


def _pow_mod(base: np.ndarray, exponent: int) -> np.ndarray:
    """Elementwise ``base^exponent mod q`` (square and multiply on uint64 arrays)."""
    result = np.ones_like(base)
    b = base % _Q
    e = exponent
    while e:
        if e & 1:
            result = result * b % _Q
        b = b * b % _Q
        e >>= 1
    return result


def _weights_at_zero(xs: np.ndarray) -> np.ndarray:
    """Lagrange weights ``w[j, i] = prod_{m != i} x_m / (x_m - x_i)`` mod q for each row of ``xs`` (J, t)."""
    _, t = xs.shape
    num = np.ones(xs.shape, dtype=np.uint64)
    den = np.ones(xs.shape, dtype=np.uint64)
    for m in range(t):
        xm = xs[:, m : m + 1]
        others = np.arange(t) != m  # every i but m takes the factor of m
        diff = (xm + _Q - xs) % _Q  # x_m - x_i mod q
        num[:, others] = num[:, others] * xm % _Q
        den[:, others] = den[:, others] * diff[:, others] % _Q
    return num * _pow_mod(den, LIMB_PRIME - 2) % _Q  # Fermat: den^(q-2) = den^-1


def reconstruct_secrets(xs: np.ndarray | Sequence[Sequence[int]], shares: np.ndarray, *,
                        secret_bytes: int) -> list[list[bytes]]:
    """Batched reconstruction: ``J`` groups, each ``S`` secrets from the same ``t`` holders.

    Args:
        xs: ``(J, t)`` abscissae of the holders whose shares are given (each row distinct, in
            ``[1, 2^31 - 1)``); exactly ``t`` = threshold shares per group.
        shares: ``(J, t, S, L)`` share limbs (:func:`decode_shares` of each holder's bytes).
        secret_bytes: ``B``, the secrets' length.

    Returns:
        ``out[j][s]``: the ``B``-byte secret ``s`` of group ``j``.

    Raises:
        ShareError: some group's shares interpolate to a limb ``>= 2^30`` or to a value with bits
            beyond ``8 B``: they cannot all be honest shares of one secret (nothing is returned).
            Passing this check does not prove the shares honest (see the module docstring).
    """
    xi = np.asarray(xs)
    if xi.dtype.kind not in "ui":
        raise TypeError(f"xs must be integers, got dtype {xi.dtype}")
    sh = np.asarray(shares)
    limbs = limbs_per_secret(secret_bytes)
    if xi.ndim != 2 or sh.ndim != 4 or sh.shape[:2] != xi.shape or sh.shape[3] != limbs:
        raise ValueError(f"xs must be (J, t) and shares (J, t, S, {limbs}), got {xi.shape} and {sh.shape}")
    if xi.size and (int(xi.min()) < 1 or int(xi.max()) >= LIMB_PRIME):
        raise ValueError("xs must be in [1, 2^31 - 1) (number the holders 1..n)")
    x = xi.astype(np.uint64)
    srt = np.sort(x, axis=1)
    if (srt[:, 1:] == srt[:, :-1]).any():
        raise ValueError("xs must be distinct within each group")
    if sh.size and int(sh.max()) >= LIMB_PRIME:
        raise ValueError("share value is not an element of GF(2^31 - 1)")
    w = _weights_at_zero(x)
    acc = np.zeros((x.shape[0], *sh.shape[2:]), dtype=np.uint64)
    for i in range(x.shape[1]):  # acc + w * s < 2^31 + 2^62: no overflow
        acc += w[:, i, None, None] * sh[:, i].astype(np.uint64)
        acc %= _Q
    top_bits = 8 * secret_bytes - LIMB_BITS * (limbs - 1)
    bad = (acc > np.uint64(_LIMB_MASK)).any(axis=(1, 2)) | (
        acc[:, :, -1] >= np.uint64(1 << top_bits)).any(axis=1)
    if bad.any():
        raise ShareError(f"shares of groups {np.flatnonzero(bad).tolist()} are inconsistent "
                         f"(tampered or corrupted): no valid {secret_bytes}-byte secret")
    out = []
    for group in acc.tolist():
        row = []
        for limb_values in group:
            v = 0
            for j, limb in enumerate(limb_values):
                v |= limb << (LIMB_BITS * j)
            row.append(v.to_bytes(secret_bytes, "little"))
        out.append(row)
    return out
