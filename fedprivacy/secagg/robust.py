"""Shamir reconstruction that survives wrong shares: Reed–Solomon decoding plus a public check.

Shamir shares of a secret ``s`` with threshold ``t`` are the evaluations of a polynomial of degree
``< t`` (for the limbed scheme of :mod:`.shamir`: one polynomial per 30-bit limb over GF(2^31 - 1),
all evaluated at the holder's abscissa), i.e. a Reed–Solomon codeword (McEliece & Sarwate 1981, "On sharing secrets and Reed-Solomon
codes"). From ``m`` shares of which at most ``e = floor((m - t)/2)`` are wrong, the polynomial is
unique and Gao's decoder (Gao 2003, "A new algorithm for decoding Reed-Solomon codes") finds it with
one partial extended Euclid on ``(prod_i (X - x_i), interpolant)``.

Secure aggregation uses it so that one faulty or malicious holder cannot silently corrupt a
reconstructed self-mask seed or mask key: every secret also has a public check —
the seed commitment ``SHA-256(.. b)`` advertised in stage 1, or the X25519 public key of a mask key —
so a wrong reconstruction is *detected* even beyond ``e`` errors (then the round aborts: the sum is
never silently wrong), and the holders whose shares disagree with the decoded polynomial are named.

Fast path: the first ``t`` shares are interpolated and checked (:func:`.shamir.reconstruct_secrets`,
batched over many secrets by the caller); only if the check fails is the full decoder run, limb by
limb (``O(m^2)`` field operations per limb, ``m`` <= the number of holders): a wrong share is wrong in
the limbs its holder altered, so the union of the disagreeing positions names the bad holders, and
``t`` of the others give the secret.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fedprivacy.secagg.shamir import LIMB_PRIME, PRIME, ShareError, interpolate, reconstruct_secrets

__all__ = ["Recovery", "SecretRecovery", "decode_polynomial", "recover", "recover_secret"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """A verified secret and the abscissae of the shares that disagreed with it."""

    secret: int
    bad: tuple[int, ...]


def _trim(a: list[int]) -> list[int]:
    while a and a[-1] == 0:
        a.pop()
    return a


def _sub(a: list[int], b: list[int], p: int) -> list[int]:
    out = [0] * max(len(a), len(b))
    for i, c in enumerate(a):
        out[i] = c
    for i, c in enumerate(b):
        out[i] = (out[i] - c) % p
    return _trim(out)


def _mul(a: list[int], b: list[int], p: int) -> list[int]:
    if not a or not b:
        return []
    out = [0] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        if x:
            for j, y in enumerate(b):
                out[i + j] = (out[i + j] + x * y) % p
    return _trim(out)


def _divmod(a: list[int], b: list[int], p: int) -> tuple[list[int], list[int]]:
    """Polynomial division over GF(p): ``a = q b + r`` with ``deg r < deg b`` (``b`` non-zero)."""
    r = list(a)
    inv = pow(b[-1], -1, p)
    q = [0] * max(0, len(a) - len(b) + 1)
    for shift in range(len(a) - len(b), -1, -1):
        c = r[shift + len(b) - 1] * inv % p
        q[shift] = c
        if c:
            for j, y in enumerate(b):
                r[shift + j] = (r[shift + j] - c * y) % p
    return _trim(q), _trim(r[: len(b) - 1])


def _evaluate(a: Sequence[int], x: int, p: int) -> int:
    acc = 0
    for c in reversed(a):
        acc = (acc * x + c) % p
    return acc


def _interpolant(xs: Sequence[int], ys: Sequence[int], p: int) -> tuple[list[int], list[int]]:
    """``(g0, g1)``: ``g0 = prod (X - x_i)`` and the interpolant ``g1`` of degree < m (Lagrange)."""
    g0 = [1]
    for x in xs:
        g0 = _mul(g0, [(-x) % p, 1], p)
    g1: list[int] = []
    for x, y in zip(xs, ys, strict=True):
        q, _ = _divmod(g0, [(-x) % p, 1], p)  # prod_{j != i} (X - x_j)
        w = y * pow(_evaluate(q, x, p), -1, p) % p
        g1 = _sub(g1, [(-w * c) % p for c in q], p)  # g1 += w q
    return g0, g1


def decode_polynomial(points: Sequence[tuple[int, int]], *, threshold: int, prime: int) -> list[int] | None:
    """The polynomial (coefficients, low first) of degree < ``threshold`` over GF(``prime``) that
    agrees with all but at most ``(m - t)/2`` of the ``m`` points (Gao 2003), or ``None``."""
    xs = [x % prime for x, _ in points]
    ys = [y % prime for _, y in points]
    m = len(points)
    g0, g1 = _interpolant(xs, ys, prime)
    # partial extended Euclid: stop once deg(r) < (m + t) / 2, tracking only the g1 cofactor v
    r0, r1, v0, v1 = g0, g1, [], [1]
    while len(r1) - 1 >= (m + threshold) / 2:
        q, r = _divmod(r0, r1, prime)
        r0, r1 = r1, r
        v0, v1 = v1, _sub(v0, _mul(q, v1, prime), prime)
    if not v1:
        return None
    f, rem = _divmod(r1, v1, prime)
    if rem or len(f) > threshold:
        return None
    return f


def recover(points: Sequence[tuple[int, int]], *, threshold: int,
            verify: Callable[[int], bool]) -> Recovery | None:
    """Reference scheme (GF(2^521 - 1), integer secrets): the secret behind ``points`` if it passes
    ``verify``, despite up to ``(m - t)/2`` bad shares.

    Args:
        points: shares ``(x, f(x))`` with distinct ``x``.
        threshold: ``t``; at least ``t`` points are needed.
        verify: the public check of the secret (seed commitment, public key).

    Returns:
        ``Recovery(secret, bad)`` with the abscissae of the shares that disagree with the decoded
        polynomial (empty on the fast path, where the first ``t`` shares already verify), or ``None``
        when no polynomial within the error bound passes the check (too many bad shares, or a dealer
        that shared inconsistent values).
    """
    if len(points) < threshold:
        return None
    first = interpolate(list(points)[:threshold], at=0)
    if verify(first):
        return Recovery(secret=first, bad=())
    if len(points) == threshold:
        return None
    f = decode_polynomial(points, threshold=threshold, prime=PRIME)
    if f is None:
        return None
    secret = f[0] if f else 0
    if not verify(secret):
        return None
    bad = tuple(x for x, y in points if _evaluate(f, x % PRIME, PRIME) != y % PRIME)
    return Recovery(secret=secret, bad=bad)


@dataclass(frozen=True, slots=True, kw_only=True)
class SecretRecovery:
    """A verified byte secret (limbed scheme) and the abscissae of the shares that disagreed with it."""

    secret: bytes
    bad: tuple[int, ...]


def _limbed(xs: Sequence[int], shares: Sequence[np.ndarray], secret_bytes: int) -> bytes | None:
    try:
        return reconstruct_secrets(np.asarray([list(xs)], dtype=np.uint64),
                                   np.asarray([list(shares)])[:, :, None, :], secret_bytes=secret_bytes)[0][0]
    except ShareError:
        return None


def recover_secret(points: Sequence[tuple[int, np.ndarray]], *, threshold: int,
                   verify: Callable[[bytes], bool], secret_bytes: int = 32) -> SecretRecovery | None:
    """Limbed scheme: the ``secret_bytes`` secret behind ``points`` = ``(x, limbs)`` (``limbs`` the
    ``L`` share limbs of one secret) if it passes ``verify``, despite up to ``(m - t)/2`` bad shares.

    The first ``t`` shares are tried first; otherwise each limb is decoded on its own, the holders
    that disagree in any limb are set aside, and ``t`` of the others are interpolated and checked.
    """
    if len(points) < threshold:
        return None
    xs = [int(x) for x, _ in points]
    shares = [np.asarray(s, dtype=np.uint64) for _, s in points]
    first = _limbed(xs[:threshold], shares[:threshold], secret_bytes)
    if first is not None and verify(first):
        return SecretRecovery(secret=first, bad=())
    if len(points) == threshold:
        return None
    bad: set[int] = set()
    for limb in range(shares[0].shape[0]):
        f = decode_polynomial([(x, int(s[limb])) for x, s in zip(xs, shares, strict=True)],
                              threshold=threshold, prime=LIMB_PRIME)
        if f is None:
            return None
        bad |= {x for x, s in zip(xs, shares, strict=True)
                if _evaluate(f, x, LIMB_PRIME) != int(s[limb]) % LIMB_PRIME}
    good = [(x, s) for x, s in zip(xs, shares, strict=True) if x not in bad]
    if len(good) < threshold:
        return None
    secret = _limbed([x for x, _ in good[:threshold]], [s for _, s in good[:threshold]], secret_bytes)
    if secret is None or not verify(secret):
        return None
    return SecretRecovery(secret=secret, bad=tuple(sorted(bad)))
