"""Calibration and sampling of the basic DP mechanisms.

* Laplace mechanism: noise ``Lap(Δ₁/ε)`` gives ε-DP (Dwork, McSherry, Nissim & Smith 2006;
  Dwork & Roth 2014, Theorem 3.6), released on a power-of-two grid with the exact discrete Laplace
  so that it stays ε-DP in floating point (Mironov 2012; Canonne, Kamath & Steinke 2020).
* Gaussian mechanism, two calibrations:
  - classic ``σ = Δ₂ √(2 ln(1.25/δ)) / ε``, valid only for ``ε < 1`` (Dwork & Roth 2014, Theorem A.1);
  - analytic (Balle & Wang 2018, "Improving the Gaussian Mechanism for Differential Privacy",
    Theorem 8 and Algorithm 1): exact, for every ε > 0.
* Exponential mechanism (McSherry & Talwar 2007, Theorem 6; Dwork & Roth 2014, Theorem 3.10) and
  report-noisy-max (Dwork & Roth 2014, §3.3; permute-and-flip, McKenna & Sheldon 2020), sampled
  exactly with rational Bernoulli(exp(−γ)) decisions and the exact discrete Laplace (Canonne, Kamath
  & Steinke 2020), so that no floating-point support gap breaks pure ε-DP.

All noise comes from a :class:`fedprivacy.dp.rng.RandomSource` (secure by default). The Gaussian
mechanism's sampler returns floating-point values; see :mod:`fedprivacy.dp.discrete` for exact integer noise
(Mironov 2012's floating-point attack does not apply there). Sensitivities are in the unit of the
released value; the neighbouring relation they assume (add/remove or replace-one) is the caller's.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Literal

import numpy as np
from scipy import optimize, special

from fedprivacy.dp.discrete import bernoulli_exp_exact, sample_discrete_laplace_exact
from fedprivacy.dp.rng import RandomSource

__all__ = [
    "analytic_gaussian_delta",
    "analytic_gaussian_epsilon",
    "analytic_gaussian_std",
    "classic_gaussian_std",
    "exponential_mechanism",
    "gaussian_mechanism",
    "laplace_mechanism",
    "laplace_scale",
    "report_noisy_max",
    "report_noisy_max_scale",
]


# ---------------------------------------------------------------------------- validation
def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


def _positive(name: str, value: object) -> float:
    v = _real(name, value)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def _delta(value: object) -> float:
    v = _real("delta", value)
    if not 0.0 < v < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {value!r}")
    return v


def _source(rng: RandomSource | None) -> RandomSource:
    if rng is None:
        return RandomSource.secure()
    if not isinstance(rng, RandomSource):
        raise TypeError(f"rng must be a fedprivacy.dp.rng.RandomSource, got {type(rng).__name__}")
    return rng


def _values(value: Any, name: str = "value") -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or Inf")
    return arr


# ---------------------------------------------------------------------------- Laplace
def laplace_scale(*, sensitivity: float, epsilon: float) -> float:
    """Scale ``b = Δ₁ / ε`` of the Laplace mechanism (Dwork & Roth 2014, Theorem 3.6): ε-DP."""
    return _positive("sensitivity", sensitivity) / _positive("epsilon", epsilon)


def laplace_mechanism(
    value: Any,
    *,
    sensitivity: float,
    epsilon: float,
    rng: RandomSource | None = None,
    granularity: float | None = None,
) -> Any:
    """Release ``value`` plus Laplace noise of scale ≈ ``Δ₁/ε`` per coordinate: exactly ε-DP on floats.

    The textbook mechanism ``x + Lap(Δ₁/ε)`` (Dwork, McSherry, Nissim & Smith 2006; Dwork & Roth
    2014, Theorem 3.6) is not ε-DP when computed in floating point: which doubles can come out depends
    on the input (Mironov 2012, "On significance of the least significant bits for differential
    privacy", CCS, §3), and most outputs from one input are impossible from its neighbour. This
    release therefore works on the grid ``γ·ℤ`` (``γ`` a power of two):

    1. ``k = rint(x / γ)`` (exact integers; neighbours' ``k`` differ in L1 by at most
       ``Δ₁/γ + d``: rounding moves each of the ``d`` coordinates by < 1 grid step);
    2. ``k + Y`` with ``Y`` the exact discrete Laplace ``P[Y = y] ∝ exp(−|y| ε / Δ_γ)``,
       ``Δ_γ = ⌈Δ₁/γ⌉ + d`` (Canonne, Kamath & Steinke 2020, Algorithm 2 and Proposition 4; no
       floating point, see :func:`fedprivacy.dp.discrete.sample_discrete_laplace_exact`), which is
       ε-DP for an integer query of L1 sensitivity ``Δ_γ``;
    3. ``γ·(k + Y)``: an exact float (post-processing).

    The noise is ``γ·Δ_γ/ε ≤ (Δ₁ + γ(d + 1))/ε`` in the value's unit: by default ``γ`` is the largest
    power of two ≤ ``Δ₁·2⁻²⁰/d``, so the scale exceeds ``Δ₁/ε`` by a factor ≤ ``1 + 2⁻¹⁹``.
    The exact sampler runs in pure Python (tens of µs per coordinate): meant for counts, histograms
    and other small releases, not for model-sized vectors (use the Gaussian and an accountant there).

    Args:
        value: the query's value (array-like or scalar), finite.
        sensitivity: its L1 sensitivity Δ₁ (> 0) under the caller's neighbouring relation.
        epsilon: the privacy parameter (> 0).
        rng: the randomness (default: a fresh secure source).
        granularity: the grid ``γ`` (> 0, a power of two); default ``Δ₁·2⁻²⁰/d`` rounded down to one.

    Returns:
        A float64 array of ``value``'s shape (a numpy float for a scalar), every entry a multiple of γ.

    Raises:
        ValueError: a non-finite value, a non-positive parameter, a granularity that is not a power
            of two, or a value too large for the grid (``|x|/γ`` beyond 2⁵⁰).
    """
    sens = _positive("sensitivity", sensitivity)
    eps = _positive("epsilon", epsilon)
    arr = _values(value)
    d = max(int(arr.size), 1)
    if granularity is None:
        gamma = math.ldexp(1.0, math.frexp(sens / d)[1] - 1 - 20)  # largest power of two ≤ Δ₁·2⁻²⁰/d
    else:
        gamma = _positive("granularity", granularity)
        if math.frexp(gamma)[0] != 0.5:
            raise ValueError(f"granularity must be a power of two, got {granularity!r}")
    k = np.rint(arr / gamma)
    if arr.size and float(np.max(np.abs(k))) >= 2.0**50:
        raise ValueError(f"value is too large for granularity {gamma!r} (|value|/granularity ≥ 2^50)")
    grid_sens = math.ceil(sens / gamma) + d
    scale = Fraction(grid_sens) / Fraction(eps)  # the exact binary value of ε
    noise = sample_discrete_laplace_exact(scale=scale, size=arr.shape, rng=_source(rng))
    out = (k + np.asarray(noise, dtype=np.float64)) * gamma
    return out if out.ndim else np.float64(out)


# ---------------------------------------------------------------------------- Gaussian
def classic_gaussian_std(*, sensitivity: float, epsilon: float, delta: float) -> float:
    """Classic calibration ``σ = Δ₂ √(2 ln(1.25/δ)) / ε`` (Dwork & Roth 2014, Theorem A.1).

    The theorem holds only for ``0 < ε < 1``; for larger ε this refuses rather than return an
    invalid σ. It is also loose (about 1.3x at ε≈0.5): prefer :func:`analytic_gaussian_std`.

    Raises:
        ValueError: if ``epsilon >= 1`` (message points to ``analytic_gaussian_std``), or for an
            invalid sensitivity/epsilon/delta.
    """
    s = _positive("sensitivity", sensitivity)
    e = _positive("epsilon", epsilon)
    d = _delta(delta)
    if e >= 1.0:
        raise ValueError(
            f"epsilon must be < 1 for the classic Gaussian calibration (Dwork & Roth 2014, "
            f"Theorem A.1), got {epsilon!r}; use analytic_gaussian_std, which is exact for any epsilon"
        )
    return s * math.sqrt(2.0 * math.log(1.25 / d)) / e


def _log_delta(sigma: float, sensitivity: float, epsilon: float) -> float:
    """log δ(ε) of the Gaussian mechanism (Balle & Wang 2018, Theorem 8), stably.

    ``δ = Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ)``; with ``l1 = log Φ(a)``, ``l2 = ε + log Φ(b)``,
    ``δ = e^{l1} (1 − e^{l2 − l1})`` which avoids cancellation and underflow.
    """
    a = sensitivity / (2.0 * sigma) - epsilon * sigma / sensitivity
    b = -sensitivity / (2.0 * sigma) - epsilon * sigma / sensitivity
    l1 = float(special.log_ndtr(a))
    l2 = epsilon + float(special.log_ndtr(b))
    if l2 >= l1:  # only by rounding; the true δ is > 0 but below double resolution
        return -math.inf
    return l1 + math.log(-math.expm1(l2 - l1))


def analytic_gaussian_delta(*, noise_std: float, sensitivity: float, epsilon: float) -> float:
    """Exact δ(ε) of the Gaussian mechanism with std σ and L2 sensitivity Δ.

    Balle & Wang 2018, Theorem 8: ``M(x) = f(x) + N(0, σ² I)`` is (ε, δ)-DP if and only if
    ``δ ≥ Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ)``. This returns the right-hand side.
    ``epsilon = 0`` is allowed (it gives the total-variation distance).
    """
    sigma = _positive("noise_std", noise_std)
    sens = _positive("sensitivity", sensitivity)
    eps = _real("epsilon", epsilon)
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    return math.exp(_log_delta(sigma, sens, eps))


def analytic_gaussian_std(*, sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest σ for which the Gaussian mechanism is (ε, δ)-DP (never overshoots ε).

    Balle & Wang 2018, Theorem 8 gives the exact condition ``δ(σ) ≤ δ``; Algorithm 1 there solves
    it for σ. Here δ(σ) is decreasing in σ and we solve ``log δ(σ) = log δ`` with Brent's method on
    ``log σ``, then step σ up by ulps until ``δ(σ) ≤ δ`` holds in floating point, so the returned σ
    is always valid (at most ~1e-12 relative above the exact one).
    """
    sens = _positive("sensitivity", sensitivity)
    eps = _positive("epsilon", epsilon)
    d = _delta(delta)
    target = math.log(d)

    def f(log_sigma: float) -> float:
        return _log_delta(math.exp(log_sigma), sens, eps) - target

    lo, hi = math.log(sens) - 2.0, math.log(sens) + 2.0
    while f(lo) <= 0:  # need δ(σ_lo) > δ
        lo -= 2.0
    while f(hi) > 0:  # need δ(σ_hi) <= δ
        hi += 2.0
    root = optimize.brentq(f, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
    sigma = math.exp(root)
    while math.exp(_log_delta(sigma, sens, eps)) > d:  # the same test analytic_gaussian_delta makes
        sigma = math.nextafter(sigma, math.inf) * (1.0 + 1e-15)
    return sigma


def analytic_gaussian_epsilon(*, noise_std: float, sensitivity: float, delta: float) -> float:
    """Smallest ε for which the Gaussian mechanism with std σ is (ε, δ)-DP (never under-reports).

    Inverts Balle & Wang 2018, Theorem 8 in ε (δ(ε) is decreasing); returns 0.0 when δ(0) ≤ δ.
    The result is stepped up until ``δ(ε) ≤ δ`` holds in floating point.
    """
    sigma = _positive("noise_std", noise_std)
    sens = _positive("sensitivity", sensitivity)
    d = _delta(delta)
    target = math.log(d)

    def f(eps: float) -> float:
        return _log_delta(sigma, sens, eps) - target

    if f(0.0) <= 0:
        return 0.0
    hi = 1.0
    while f(hi) > 0:
        hi *= 2.0
    eps = optimize.brentq(f, 0.0, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
    while math.exp(_log_delta(sigma, sens, eps)) > d:  # the same test analytic_gaussian_delta makes
        eps = math.nextafter(eps, math.inf) * (1.0 + 1e-15)
    return float(eps)


def gaussian_mechanism(value: Any, *, noise_std: float, rng: RandomSource | None = None) -> Any:
    """Release ``value + N(0, noise_std²)`` per coordinate.

    Calibrate ``noise_std`` with :func:`analytic_gaussian_std` (one release) or with
    ``fedprivacy.accounting`` (compositions, subsampling). Balle & Wang 2018, Theorem 8.
    """
    sigma = _positive("noise_std", noise_std)
    arr = _values(value)
    return arr + _source(rng).normal(std=sigma, size=arr.shape)


# ---------------------------------------------------------------------------- selection
def _utilities(utilities: Any) -> np.ndarray:
    u = np.asarray(utilities, dtype=np.float64)
    if u.ndim != 1 or u.size == 0:
        raise ValueError(f"utilities must be a non-empty 1-D array, got shape {u.shape}")
    if not np.isfinite(u).all():
        raise ValueError("utilities contains NaN or Inf")
    return u


def _selection_gaps(u: np.ndarray, factor: Fraction) -> list[Fraction]:
    """``factor · (max u − u_r)`` for every candidate, as exact rationals (floats are dyadic)."""
    exact = [Fraction(float(x)) for x in u]
    top = max(exact)
    return [factor * (top - x) for x in exact]


def _selection_factor(sensitivity: float, epsilon: float, monotonic: bool) -> Fraction:
    """``ε/(2Δu)`` (``ε/Δu`` when monotonic) as an exact rational of the floats given."""
    sens = Fraction(_positive("sensitivity", sensitivity))
    eps = Fraction(_positive("epsilon", epsilon))
    return eps / (sens if monotonic else 2 * sens)


def exponential_mechanism(
    utilities: Any,
    *,
    sensitivity: float,
    epsilon: float,
    rng: RandomSource | None = None,
    monotonic: bool = False,
) -> int:
    """Pick index ``r`` with probability ∝ ``exp(ε u_r / (2Δu))`` (ε-DP), sampled exactly.

    McSherry & Talwar 2007, Theorem 6; Dwork & Roth 2014, Theorem 3.10. With ``monotonic=True``
    (every utility moves in the same direction between neighbours) the factor 2 is dropped,
    ``exp(ε u_r / Δu)``, still ε-DP (Dwork & Roth 2014, remark after Theorem 3.10).

    The sampler uses no floating point, so the output law is exactly the mechanism's (given ideal
    uniform integers): a floating-point Gumbel-max draw has bounded support (``u`` on a 2⁻⁵³ grid
    bounds the Gumbel to about [−3.6, 36.7]), so a candidate about 40/factor behind the best has
    probability 0 under one input and > 0 under a neighbour, which breaks pure ε-DP (the selection
    analogue of Mironov 2012; Ilvento 2020, "Implementing the Exponential Mechanism with Base-2
    Differential Privacy", CCS, treats the same problem). Here the utilities are taken at their exact
    binary values and, by rejection: propose ``r`` uniformly (``randbelow``), accept it with
    probability ``exp(−factor·(max u − u_r))`` decided by the exact Bernoulli(exp(−γ)) of Canonne,
    Kamath & Steinke 2020 (Algorithm 1) for the rational γ. An accepted index has probability
    ∝ ``exp(factor·u_r)``; the best candidate is always accepted, so at most ``len(u)`` proposals
    are expected.
    """
    u = _utilities(utilities)
    gaps = _selection_gaps(u, _selection_factor(sensitivity, epsilon, monotonic))
    src = _source(rng)
    while True:
        r = src.randbelow(len(gaps))
        if bernoulli_exp_exact(gaps[r], src):
            return r


def report_noisy_max_scale(*, sensitivity: float, epsilon: float, monotonic: bool = False) -> float:
    """The noise scale :func:`report_noisy_max` adds to each utility: ``2Δu/ε`` (``Δu/ε`` monotonic).

    With this scale, neighbouring utility vectors (``‖u − u'‖∞ ≤ Δu``) give every output index a
    probability ratio of at most ``e^ε`` (Dwork & Roth 2014, Claim 3.9; McKenna & Sheldon 2020, Thm 1).
    """
    sens = _positive("sensitivity", sensitivity)
    eps = _positive("epsilon", epsilon)
    return (sens if monotonic else 2.0 * sens) / eps


#: Grid steps per unit of sensitivity for the Laplace report-noisy-max (the noise scale exceeds
#: ``2Δu/ε`` by the factor ``1 + 2⁻²⁰`` that rounding costs).
_RNM_GRID = 2**20


def _report_noisy_max_laplace(u: np.ndarray, sens: float, eps: float, monotonic: bool, src: RandomSource) -> int:
    """Report-noisy-max with exact discrete Laplace noise on the grid ``γ = Δu/2²⁰``.

    ``v_r = round(u_r/γ)`` (exact rationals; rounding is monotone and moves each value by ≤ 1/2, so
    neighbours' ``v`` differ by at most ``Δ_g = 2²⁰ + 1`` per coordinate, in the same direction when
    the utilities do). Index ``r`` wins (ties go to the lowest index) iff ``Z_r ≥ k`` for an integer
    threshold ``k`` set by the other candidates' noisy values and ``v_r``; between neighbours ``k``
    moves by at most ``2Δ_g`` (``Δ_g`` when monotonic). The discrete Laplace of scale ``t`` has
    ``P[Z = z − m] ≤ e^{m/t} P[Z = z]``, hence ``P[Z ≥ k − m] ≤ e^{m/t} P[Z ≥ k]``, and with
    ``t = 2Δ_g/ε`` (``Δ_g/ε``) every output's probability ratio is at most ``e^ε`` after integrating
    over the other noises: Dwork & Roth 2014, Claim 3.9's argument, on the integers. The noise is
    the exact sampler of Canonne, Kamath & Steinke 2020 (Algorithm 2): no floating point.
    """
    grid = Fraction(_RNM_GRID) / Fraction(sens)  # 1/γ
    v = [round(Fraction(float(x)) * grid) for x in u]
    grid_sens = _RNM_GRID + 1
    scale = Fraction(grid_sens if monotonic else 2 * grid_sens) / Fraction(eps)
    noise = sample_discrete_laplace_exact(scale=scale, size=len(v), rng=src)
    noisy = [a + int(z) for a, z in zip(v, noise, strict=True)]
    return noisy.index(max(noisy))


def report_noisy_max(
    utilities: Any,
    *,
    sensitivity: float,
    epsilon: float,
    rng: RandomSource | None = None,
    noise: Literal["gumbel", "exponential", "laplace"] = "gumbel",
    monotonic: bool = False,
) -> int:
    """Report the index of the largest noisy utility (ε-DP), sampled without floating point.

    Noise of scale ``b = 2Δu/ε`` (``Δu/ε`` when ``monotonic``) on each utility:

    * ``"gumbel"``: identical in distribution to :func:`exponential_mechanism` (Gumbel-max trick),
      and sampled as it is, exactly.
    * ``"exponential"``: report-noisy-max with exponential noise, which is the permute-and-flip
      mechanism (McKenna & Sheldon 2020, Theorem 1; equivalence: Ding, Kifer et al. 2021,
      "The permute-and-flip mechanism is identical to report-noisy-max with exponential noise"),
      sampled as permute-and-flip: visit the candidates in a uniformly random order and return the
      first one accepted with probability ``exp(−(max u − u_r)/b)`` (exact Bernoulli, CKS 2020
      Algorithm 1; the best candidate is always accepted).
    * ``"laplace"``: report-noisy-max, Dwork & Roth 2014, Claim 3.9 (stated there for counting
      queries with ``Lap(1/ε)``, i.e. monotonic with Δ=1; general Δu-sensitive utilities need 2Δu/ε),
      with the exact discrete Laplace on a grid of ``Δu/2²⁰`` (scale ``b·(1 + 2⁻²⁰)``; see
      :func:`_report_noisy_max_laplace` for the proof on the integers).

    Floating-point noise would have bounded support (≈ 36.7·b for a 53-bit uniform), so a candidate
    far enough behind would have probability 0 under one input and > 0 under a neighbour.
    """
    u = _utilities(utilities)
    if noise not in ("gumbel", "exponential", "laplace"):
        raise ValueError(f"noise must be 'gumbel', 'exponential' or 'laplace', got {noise!r}")
    src = _source(rng)
    if noise == "gumbel":
        return exponential_mechanism(u, sensitivity=sensitivity, epsilon=epsilon, rng=src, monotonic=monotonic)
    if noise == "laplace":
        sens = _positive("sensitivity", sensitivity)
        eps = _positive("epsilon", epsilon)
        return _report_noisy_max_laplace(u, sens, eps, monotonic, src)
    gaps = _selection_gaps(u, _selection_factor(sensitivity, epsilon, monotonic))
    for r in src.permutation(len(gaps)):
        if bernoulli_exp_exact(gaps[int(r)], src):
            return int(r)
    raise AssertionError("unreachable: the best candidate (gap 0) is always accepted")
