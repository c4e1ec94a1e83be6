"""Shamir secret sharing over the prime field GF(p), p = 2**521 - 1 (a Mersenne prime).

Shamir (1979): to share a secret ``s`` with threshold ``t`` draw ``a_1..a_{t-1}`` uniformly from GF(p)
and hand party ``x`` the value ``f(x) = s + a_1 x + ... + a_{t-1} x^{t-1}``. Any ``t`` shares determine
``f`` (Lagrange interpolation) and hence ``s = f(0)``; any ``t - 1`` shares are *information-
theoretically* independent of ``s``: for every candidate secret there is exactly one polynomial of
degree < t through it and the ``t - 1`` shares, and all are equally likely.

The field is larger than 2**256, so the 32-byte secrets of secure aggregation (self-mask seeds and
X25519 private keys) embed without reduction. Arithmetic is plain Python integers; evaluation shares
one table of powers ``x^j mod p`` across all secrets (``split_many``) and reconstruction computes the
Lagrange weights once per set of abscissae with a single modular inversion (``lagrange_weights``).
Coefficients come from :func:`secrets.randbelow` (the OS CSPRNG).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

__all__ = [
    "PRIME",
    "SHARE_BYTES",
    "decode_share",
    "encode_share",
    "interpolate",
    "lagrange_weights",
    "reconstruct",
    "split",
    "split_many",
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
