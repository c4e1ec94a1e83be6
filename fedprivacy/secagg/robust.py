"""Shamir reconstruction that survives wrong shares: Reed–Solomon decoding plus a public check.

Shamir shares of a secret ``s`` with threshold ``t`` are the evaluations of a polynomial of degree
``< t``, i.e. a Reed–Solomon codeword (McEliece & Sarwate 1981, "On sharing secrets and Reed-Solomon
codes"). From ``m`` shares of which at most ``e = floor((m - t)/2)`` are wrong, the polynomial is
unique and Gao's decoder (Gao 2003, "A new algorithm for decoding Reed-Solomon codes") finds it with
one partial extended Euclid on ``(prod_i (X - x_i), interpolant)``.

Secure aggregation uses it so that one faulty or malicious holder cannot silently corrupt a
reconstructed self-mask seed or mask key (issue 10, item 6): every secret also has a public check —
the seed commitment ``SHA-256(.. b)`` advertised in stage 1, or the X25519 public key of a mask key —
so a wrong reconstruction is *detected* even beyond ``e`` errors (then the round aborts: the sum is
never silently wrong), and the holders whose shares disagree with the decoded polynomial are named.

Fast path: the first ``t`` shares are interpolated and checked; only if the check fails is the full
decoder run (``O(m^2)`` field operations over GF(2^521 - 1), ``m`` <= the number of holders).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fedprivacy.secagg.shamir import PRIME, interpolate

__all__ = ["Recovery", "recover"]

_P = PRIME


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """A verified secret and the abscissae of the shares that disagreed with it."""

    secret: int
    bad: tuple[int, ...]


def _trim(a: list[int]) -> list[int]:
    while a and a[-1] == 0:
        a.pop()
    return a


def _sub(a: list[int], b: list[int]) -> list[int]:
    out = [0] * max(len(a), len(b))
    for i, c in enumerate(a):
        out[i] = c
    for i, c in enumerate(b):
        out[i] = (out[i] - c) % _P
    return _trim(out)


def _mul(a: list[int], b: list[int]) -> list[int]:
    if not a or not b:
        return []
    out = [0] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        if x:
            for j, y in enumerate(b):
                out[i + j] = (out[i + j] + x * y) % _P
    return _trim(out)


def _divmod(a: list[int], b: list[int]) -> tuple[list[int], list[int]]:
    """Polynomial division over GF(p): ``a = q b + r`` with ``deg r < deg b`` (``b`` non-zero)."""
    r = list(a)
    inv = pow(b[-1], -1, _P)
    q = [0] * max(0, len(a) - len(b) + 1)
    for shift in range(len(a) - len(b), -1, -1):
        c = r[shift + len(b) - 1] * inv % _P
        q[shift] = c
        if c:
            for j, y in enumerate(b):
                r[shift + j] = (r[shift + j] - c * y) % _P
    return _trim(q), _trim(r[: len(b) - 1])


def _evaluate(a: Sequence[int], x: int) -> int:
    acc = 0
    for c in reversed(a):
        acc = (acc * x + c) % _P
    return acc


def _interpolant(xs: Sequence[int], ys: Sequence[int]) -> tuple[list[int], list[int]]:
    """``(g0, g1)``: ``g0 = prod (X - x_i)`` and the interpolant ``g1`` of degree < m (Lagrange)."""
    g0 = [1]
    for x in xs:
        g0 = _mul(g0, [(-x) % _P, 1])
    g1: list[int] = []
    for x, y in zip(xs, ys, strict=True):
        q, _ = _divmod(g0, [(-x) % _P, 1])  # prod_{j != i} (X - x_j)
        w = y * pow(_evaluate(q, x), -1, _P) % _P
        g1 = _sub(g1, [(-w * c) % _P for c in q])  # g1 += w q
    return g0, g1


def _gao(points: Sequence[tuple[int, int]], threshold: int) -> list[int] | None:
    """The polynomial of degree < ``threshold`` agreeing with all but ``<= (m - t)/2`` points."""
    xs = [x % _P for x, _ in points]
    ys = [y % _P for _, y in points]
    m = len(points)
    g0, g1 = _interpolant(xs, ys)
    # partial extended Euclid: stop once deg(r) < (m + t) / 2, tracking only the g1 cofactor v
    r0, r1, v0, v1 = g0, g1, [], [1]
    while len(r1) - 1 >= (m + threshold) / 2:
        q, r = _divmod(r0, r1)
        r0, r1 = r1, r
        v0, v1 = v1, _sub(v0, _mul(q, v1))
    if not v1:
        return None
    f, rem = _divmod(r1, v1)
    if rem or len(f) > threshold:
        return None
    return f


def recover(points: Sequence[tuple[int, int]], *, threshold: int,
            verify: Callable[[int], bool]) -> Recovery | None:
    """The secret behind ``points`` if it passes ``verify``, despite up to ``(m - t)/2`` bad shares.

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
    f = _gao(points, threshold)
    if f is None:
        return None
    secret = f[0] if f else 0
    if not verify(secret):
        return None
    bad = tuple(x for x, y in points if _evaluate(f, x % _P) != y % _P)
    return Recovery(secret=secret, bad=bad)
