"""Integer-valued noise: exact discrete Laplace and discrete Gaussian samplers, and a fast one.

Exact samplers (Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for Differential Privacy",
NeurIPS; arXiv:2004.00010, §5): every random decision is a Bernoulli with a *rational* parameter,
decided by comparing an exactly uniform integer from :meth:`RandomSource.randbelow` with a
numerator, and all arithmetic is done with :class:`fractions.Fraction`. No floating point is used, so
the output distribution is exactly the discrete Laplace / discrete Gaussian (given an ideal source of
uniform bits) and Mironov's (2012) floating-point attack does not apply.

* Algorithm 1: Bernoulli(exp(−γ)) for rational γ ≥ 0.
* Algorithm 2: discrete Laplace ``Lap_Z(t/s)``, ``P[X = x] ∝ exp(−|x| s/t)``.
* Algorithm 3: discrete Gaussian ``N_Z(0, σ²)``, ``P[X = x] ∝ exp(−x²/(2σ²))``, by rejection from
  ``Lap_Z(⌊σ⌋ + 1)``.

These run in pure Python (tens of microseconds per sample). For millions of coordinates use
:func:`sample_discrete_gaussian`, the vectorised sampler of Kairouz, Liu & Steinke 2021 ("The
Distributed Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation", ICML;
reference implementation in tensorflow_privacy/distributed_discrete_gaussian): the same rejection
scheme as Algorithm 3, but the discrete Laplace proposal (a difference of two geometrics) and the
acceptance test are computed in float64 from the RandomSource's uniforms. Its distribution differs
from the exact one only through floating point: 53-bit uniforms and rounded ``exp``/``log`` move each
decision probability by ~2^-53 in absolute terms, and proposals are truncated at ~36.7·t (mass
< 1e-16). It is what secure aggregation uses.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Any

import numpy as np

from fedprivacy.dp.rng import RandomSource

__all__ = [
    "bernoulli_exp_exact",
    "discrete_gaussian_pmf",
    "sample_discrete_gaussian",
    "sample_discrete_gaussian_exact",
    "sample_discrete_laplace_exact",
]

Rational = Fraction | int


def _to_fraction(name: str, value: object) -> Fraction:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a Fraction, int or float, got bool")
    if isinstance(value, Fraction):
        q = value
    elif isinstance(value, int | np.integer):
        q = Fraction(int(value))
    elif isinstance(value, float | np.floating):
        if not math.isfinite(float(value)):
            raise ValueError(f"{name} must be finite and > 0, got {value!r}")
        q = Fraction(float(value))  # exact binary value of the float
    else:
        raise TypeError(f"{name} must be a Fraction, int or float, got {type(value).__name__}")
    if q <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return q


def _count(size: int | tuple[int, ...] | None) -> tuple[int, tuple[int, ...] | None]:
    if size is None:
        return 1, None
    if isinstance(size, bool):
        raise TypeError("size must be an int or a tuple of ints")
    shape = (int(size),) if isinstance(size, int | np.integer) else tuple(int(d) for d in size)
    if any(d < 0 for d in shape):
        raise ValueError(f"size must be non-negative, got {size!r}")
    return math.prod(shape), shape


def _source(rng: RandomSource | None) -> RandomSource:
    if rng is None:
        return RandomSource.secure()
    if not isinstance(rng, RandomSource):
        raise TypeError(f"rng must be a fedprivacy.dp.rng.RandomSource, got {type(rng).__name__}")
    return rng


def _bexp(num: int, den: int, rng: RandomSource) -> bool:
    """Exact Bernoulli(exp(−num/den)) for integers num ≥ 0, den ≥ 1 (CKS 2020, Algorithm 1)."""
    while num > den:  # γ > 1: ⌊γ⌋ Bernoulli(e^{−1}) trials, then the fractional part
        if not _bexp(1, 1, rng):
            return False
        num -= den
    # γ = num/den in [0, 1]: A_k ~ Bernoulli(γ/k) = [U < num] with U uniform on [0, den·k)
    k = 1
    while rng.randbelow(den * k) < num:
        k += 1
    return k % 2 == 1


def bernoulli_exp_exact(gamma: Rational, rng: RandomSource) -> bool:
    """Exact Bernoulli(exp(−γ)) for rational γ ≥ 0 (Canonne, Kamath & Steinke 2020, Algorithm 1).

    For γ ∈ [0, 1]: draw ``A_k ~ Bernoulli(γ/k)`` for k = 1, 2, ... until the first ``A_k = 0``;
    return True iff that k is odd (``P = Σ (−γ)^j / j! = e^{−γ}``). For γ > 1: ``⌊γ⌋`` independent
    ``Bernoulli(e^{−1})`` trials and one ``Bernoulli(e^{−(γ−⌊γ⌋)})`` must all succeed. Each
    ``Bernoulli(a/b)`` compares an exactly uniform integer on ``[0, b)`` with ``a``.
    """
    g = Fraction(gamma)
    if g < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma!r}")
    return _bexp(g.numerator, g.denominator, rng)


def _discrete_laplace_one(s: int, t: int, rng: RandomSource) -> int:
    """One draw of ``Lap_Z(t/s)`` (Canonne, Kamath & Steinke 2020, Algorithm 2)."""
    while True:
        u = rng.randbelow(t)
        if not _bexp(u, t, rng):
            continue
        v = 0
        while _bexp(1, 1, rng):
            v += 1
        x = u + t * v  # Geometric(1 − e^{−1/t}) on {0, 1, ...}
        y = x // s  # Geometric(1 − e^{−s/t})
        negative = rng.randbelow(2) == 1
        if negative and y == 0:
            continue  # reject −0 so that 0 is not counted twice
        return -y if negative else y


def sample_discrete_laplace_exact(
    *,
    scale: Rational | float,
    size: int | tuple[int, ...] | None = None,
    rng: RandomSource | None = None,
) -> Any:
    """Exact discrete Laplace ``P[X = x] ∝ exp(−|x|/scale)`` on the integers.

    Canonne, Kamath & Steinke 2020, Algorithm 2, with ``scale = t/s`` in lowest terms (a float scale
    is taken at its exact binary value). Adding it to an integer query of L1 sensitivity Δ gives
    (Δ/scale)-DP (CKS 2020, Proposition 4 / Ghosh, Roughgarden & Sundararajan 2009).

    Returns:
        int64 array of shape ``size`` (a Python int when ``size`` is None).
    """
    q = _to_fraction("scale", scale)
    n, shape = _count(size)
    src = _source(rng)
    t, s = q.numerator, q.denominator
    vals = [_discrete_laplace_one(s, t, src) for _ in range(n)]
    if shape is None:
        return vals[0]
    return np.asarray(vals, dtype=np.int64).reshape(shape)


def _isqrt_floor(q: Fraction) -> int:
    """⌊√q⌋ for rational q ≥ 0, exactly (⌊√q⌋ = isqrt(⌊q⌋))."""
    return math.isqrt(q.numerator // q.denominator)


def sample_discrete_gaussian_exact(
    *,
    sigma_sq: Rational | float,
    size: int | tuple[int, ...] | None = None,
    rng: RandomSource | None = None,
) -> Any:
    """Exact discrete Gaussian ``P[X = x] ∝ exp(−x²/(2σ²))`` on the integers.

    Canonne, Kamath & Steinke 2020, Algorithm 3: with ``t = ⌊σ⌋ + 1``, draw ``Y ~ Lap_Z(t)`` and
    accept with probability ``exp(−(|Y| − σ²/t)² / (2σ²))`` (Algorithm 1, exact rationals). Adding
    it to an integer query of L2 sensitivity Δ satisfies ½(Δ/σ)²-concentrated DP (CKS 2020,
    Theorem 4). ``sigma_sq`` is the variance *parameter* σ² (a float is taken at its exact value).

    Returns:
        int64 array of shape ``size`` (a Python int when ``size`` is None).
    """
    var = _to_fraction("sigma_sq", sigma_sq)
    n, shape = _count(size)
    src = _source(rng)
    t = _isqrt_floor(var) + 1
    p, q = var.numerator, var.denominator
    # accept with exp(−(|y| − σ²/t)²/(2σ²)) = exp(−(|y|qt − p)² / (2pqt²)), all integers
    den = 2 * p * q * t * t
    vals: list[int] = []
    while len(vals) < n:
        y = _discrete_laplace_one(1, t, src)
        if _bexp((abs(y) * q * t - p) ** 2, den, src):
            vals.append(y)
    if shape is None:
        return vals[0]
    return np.asarray(vals, dtype=np.int64).reshape(shape)


def discrete_gaussian_pmf(x: Any, *, sigma: float) -> np.ndarray:
    """``P[X = x]`` of the discrete Gaussian with parameter σ (normalised numerically).

    The normaliser ``Σ_k exp(−k²/(2σ²))`` is summed over ``|k| ≤ ⌈σ⌉·40 + 10``, which leaves out
    less than ``e^{−800}`` of the mass.
    """
    sig = float(sigma)
    if not math.isfinite(sig) or sig <= 0:
        raise ValueError(f"sigma must be a finite number > 0, got {sigma!r}")
    k = np.arange(-(math.ceil(sig) * 40 + 10), math.ceil(sig) * 40 + 11, dtype=np.float64)
    norm = math.fsum(np.exp(-(k**2) / (2 * sig * sig)).tolist())
    xs = np.asarray(x, dtype=np.float64)
    return np.exp(-(xs**2) / (2 * sig * sig)) / norm


@functools.lru_cache(maxsize=64)
def _acceptance(sigma: float, t: int) -> float:
    """Probability that one proposal of :func:`sample_discrete_gaussian` is accepted (for sizing).

    Cached: it costs ~0.5 ms at sigma ~ 1000 (40 t terms) and one round calls it with one sigma for
    every client.
    """
    if t > 10_000:
        return 0.75  # the limit is ~0.760 as sigma grows
    r = math.exp(-1.0 / t)
    k = np.arange(0, 40 * t + 10, dtype=np.float64)
    # |Y| = k proposed with prob (1-r) r^k from ±G (minus the rejected "−0" half at k = 0)
    p_abs = (1 - r) * r**k
    p_abs[0] *= 0.5
    acc = np.exp(-((k - sigma * sigma / t) ** 2) / (2 * sigma * sigma))
    return max(0.05, float((p_abs * acc).sum()))


def sample_discrete_gaussian(
    *, sigma: float, size: int | tuple[int, ...], rng: RandomSource | None = None
) -> np.ndarray:
    """Vectorised discrete Gaussian ``N_Z(0, σ²)`` for millions of coordinates (int64).

    ``sigma`` is the scale *parameter* σ of ``P[x] ∝ exp(−x²/(2σ²))``; the variance is slightly
    below σ² (CKS 2020, Corollary 9): by 2e-7 relative at σ = 1, by < 1e-15 once σ ≥ 1.5.

    Kairouz, Liu & Steinke 2021, §4 and their reference implementation: the rejection sampler of
    Canonne, Kamath & Steinke 2020, Algorithm 3, run on whole numpy arrays. With ``t = ⌊σ⌋ + 1``:

    1. ``Y = ±⌊t·E⌋`` with ``E ~ Exp(1)`` and a fair sign, rejecting "−0": ``⌊t·E⌋`` is geometric
       with ``P[G ≥ k] = e^{−k/t}``, so ``Y`` is the discrete Laplace ``Lap_Z(t)`` (the same law as
       the reference implementation's difference of two geometrics, at one ``log`` per proposal);
    2. accept ``Y`` iff ``U < exp(−(|Y| − σ²/t)² / (2σ²))`` with ``U`` uniform on [0, 1).

    How it differs from :func:`sample_discrete_gaussian_exact`: steps 1–2 use float64 ``log``/``exp``
    and 53-bit uniforms, so each decision probability is off by rounding (~2^-53 absolute), as in the
    reference implementation; the privacy analysis (CKS 2020, Theorem 4) assumes the exact law. The exponentials and uniforms come from ``rng``
    (secure by default), never from numpy's global generator.
    """
    sig = float(sigma) if not isinstance(sigma, bool) else math.nan
    if not math.isfinite(sig) or sig <= 0:
        raise ValueError(f"sigma must be a finite number > 0, got {sigma!r}")
    if sig > 2.0**40:
        raise ValueError(f"sigma must be <= 2**40 for the float64 sampler, got {sigma!r}")
    n, shape = _count(size)
    src = _source(rng)
    t = math.floor(sig) + 1
    var = sig * sig
    shift = var / t
    out = np.empty(n, dtype=np.int64)
    filled = 0
    p_est = _acceptance(sig, t)  # overall acceptance, refined as we go
    while filled < n:
        need = min(n - filled, 1 << 16)  # cache-sized passes
        m = int(need / p_est * 1.01 + 6 * math.sqrt(need)) + 64
        lap = src.laplace(scale=float(t), size=m)  # ±t·E, E ~ Exp(1)
        neg = lap < 0
        g = np.abs(lap)
        np.floor(g, out=g)
        keep = ~(neg & (g == 0.0))  # reject "−0" so that 0 is not counted twice
        d = g - shift
        d *= d
        d /= -2.0 * var
        np.exp(d, out=d)
        u = src.uniform(m)
        keep &= u < d
        # the accepted proposals with the proposal's sign (copysign: -g where lap < 0; a "-0.0" is
        # never kept); gathering by index is ~2x faster than a boolean mask
        y = np.take(np.copysign(g, lap), np.flatnonzero(keep))
        take = min(len(y), need)
        out[filled : filled + take] = y[:take]  # integral floats, cast exactly
        filled += take
        p_est = max(0.05, len(y) / m)
    return out.reshape(shape) if shape is not None else out
