"""Two dp-accounting PLD operations the accountant runs every round, bit for bit, faster.

A central-DP run asks its PLD accountant, every round, for the self-composition of one release's
PLD ``count`` times (``PrivacyLossDistribution.self_compose``) and for epsilon at delta
(``get_epsilon_for_delta``). With dp-accounting 0.6 both cost more than a whole plain round at
100 of 1000 clients (fixed cohort, z = 1: the one-release PLD has 384k points, the composed one
~1.4M):

* ``self_compose`` bounds the support of the result with a Chernoff bound (``common.
  compute_self_convolve_bounds``): 40 ``logsumexp`` over the one-release pmf, the log-moment
  generating function at 40 orders. They depend on that pmf alone, not on ``count``, yet are
  recomputed every round (~60% of the call). Here they are computed once per pmf and cached; the
  bounds, the FFT power and the pmf are then computed by the very same operations in the same order
  (Koskela, Jalko & Honkela 2020, "Computing tight differential privacy guarantees using FFT",
  AISTATS, Section 5: the truncated FFT convolution; Doroshenko et al. 2022 for the bounds).
* ``get_epsilon_for_delta`` walks the pmf from its largest loss down in a Python loop (~0.1 s for
  1.4M points). Here the same running sums are computed chunk by chunk with ``np.add.accumulate``
  (sequential, the same additions in the same order as the loop), the losses are the same repeated
  subtraction as ``itertools.count``, ``exp`` is ``math.exp`` itself, and the loop's stopping test
  is evaluated with ``math.log`` at every index where a vectorised ``np.log`` screen (with a margin
  far above its error) says it may hold: the first index where it holds is the loop's break.

Every result is identical to dp-accounting's, float for float (tests/accounting/test_pld_kernels.py
compares both on many PLDs, counts and deltas); anything other than a dense pmf goes to
dp-accounting's own code. Nothing here changes what is accounted: it is the same computation.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import fft, special

__all__ = ["epsilon_for_delta", "release_fft_plans", "self_compose"]

#: dp-accounting's default ``tail_mass_truncation`` of ``self_compose``.
SELF_COMPOSE_TAIL = 1e-15
#: Points per step of the epsilon scan (it stops at the first chunk holding the loop's break).
_CHUNK = 1 << 16
#: Margin of the vectorised screen of the stopping test; np.log and math.log differ by ulps.
_SCREEN = 1e-9


_CHERNOFF: weakref.WeakKeyDictionary[Any, tuple[np.ndarray, tuple[Any, ...]]] = weakref.WeakKeyDictionary()


def _chernoff_terms(pmf: pld_pmf.DensePLDPmf) -> tuple[np.ndarray, tuple[Any, ...]]:
    """Orders and log-MGFs of ``compute_self_convolve_bounds`` for this pmf (its defaults), cached
    for as long as the pmf lives (pmfs are never mutated; the accountant caches one-release PLDs)."""
    terms = _CHERNOFF.get(pmf)
    if terms is None:
        probs = pmf._probs
        orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / len(probs)
        log_mgfs = tuple(special.logsumexp(np.arange(len(probs)) * order, b=probs) for order in orders)
        terms = _CHERNOFF[pmf] = (orders, log_mgfs)
    return terms


def _bounds(pmf: pld_pmf.DensePLDPmf, num_times: int, tail: float) -> tuple[int, int]:
    """``common.compute_self_convolve_bounds(pmf._probs, num_times, tail)``, from cached log-MGFs."""
    upper_bound = (len(pmf._probs) - 1) * num_times
    lower_bound = 0
    if tail == 0:
        return lower_bound, upper_bound
    orders, log_mgfs = _chernoff_terms(pmf)
    for order, log_mgf_value in zip(orders, log_mgfs, strict=True):
        bound = (num_times * log_mgf_value + math.log(2 / tail)) / order
        if not math.isfinite(bound):
            continue
        if order > 0:
            upper_bound = min(upper_bound, math.ceil(bound))
        if order < 0:
            lower_bound = max(lower_bound, math.floor(bound))
    return lower_bound, upper_bound


# scipy.fft (pocketfft) keeps the plans of the last 16 transform lengths of each kind for the life of
# the process, and a plan holds tables of about 2 x 16 bytes a point. The T-fold composition has a
# new length every round (its support grows with T), so a run kept 16 plans of ~2M points, 0.6-1 GB,
# that it never used again: a central run at 100 of 1000 clients with 100k parameters grew from 0.43
# to 1.08 GB of RSS by round 24, against 0.39 GB without DP (the memory goal). Transforms of
# these small lengths (more than the cache holds) push them out; the next composition plans its own
# length as it would have anyway, with the same tables, so the floats are unchanged. scipy.fft has no
# call that clears the cache.
_FLUSH_REAL = tuple(np.zeros(n) for n in range(2, 66))
_FLUSH_COMPLEX = tuple(np.zeros(n, dtype=complex) for n in range(2, 66))


def release_fft_plans() -> None:
    """Evict scipy.fft's cached plans, both kinds (the forward transform of real input and the
    complex inverse), by planning 64 small lengths of each (under a millisecond to a few, freeing)."""
    for a in _FLUSH_REAL:
        fft.fft(a)
    for b in _FLUSH_COMPLEX:
        fft.ifft(b)


def _dense_self_compose(pmf: pld_pmf.DensePLDPmf, num_times: int, tail: float) -> pld_pmf.DensePLDPmf:
    """``DensePLDPmf.self_compose(num_times, tail)`` (with ``common.self_convolve``), bit for bit."""
    probs_in = pmf._probs
    lower, upper = _bounds(pmf, num_times, tail)
    output_len = upper - lower + 1
    fast_len = fft.next_fast_len(max(output_len, len(probs_in)))
    convolved = np.real(fft.ifft(fft.fft(probs_in, fast_len) ** num_times))
    release_fft_plans()
    probs = np.array(np.roll(convolved, -lower)[:output_len])
    inf_prob = tail - math.expm1(num_times * math.log1p(-pmf._infinity_mass))
    return pld_pmf.DensePLDPmf(
        pmf._discretization, pmf._lower_loss * num_times + lower, probs, inf_prob,
        pmf._pessimistic_estimate,
    )


def self_compose(pld: Any, num_times: int, tail_mass_truncation: float = SELF_COMPOSE_TAIL) -> Any:
    """``pld.self_compose(num_times, tail_mass_truncation)``, identical, with cached Chernoff terms."""
    if num_times <= 0:
        raise ValueError(f"num_times must be >= 1, got {num_times}")

    def one(pmf: Any) -> Any:
        if type(pmf) is pld_pmf.DensePLDPmf:
            return _dense_self_compose(pmf, num_times, tail_mass_truncation)
        return pmf.self_compose(num_times, tail_mass_truncation)

    remove = one(pld._pmf_remove)
    if pld._symmetric:
        return pld_lib.PrivacyLossDistribution(remove)
    return pld_lib.PrivacyLossDistribution(remove, one(pld._pmf_add))


def _first_stop(upper: np.ndarray, lower: np.ndarray, losses: np.ndarray, delta: float) -> int | None:
    """First i with ``upper[i] > delta and lower[i] > 0 and log((upper[i]-delta)/lower[i]) >= losses[i]``.

    The exact test (``math.log``, as the loop) runs only where the numpy screen allows it.
    """
    live = (upper > delta) & (lower > 0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = (upper - delta) / lower
        screen = live & (np.log(ratio) >= losses - _SCREEN * np.maximum(1.0, np.abs(losses)))
    for i in np.flatnonzero(screen).tolist():
        if math.log(ratio[i]) >= losses[i]:
            return int(i)
    return None


def _dense_epsilon(pmf: pld_pmf.DensePLDPmf, delta: float, *, chunk_size: int = _CHUNK) -> float:
    """``DensePLDPmf.get_epsilon_for_delta(delta)`` (``pld_pmf._get_epsilon_for_delta``), bit for bit."""
    infinity_mass = pmf._infinity_mass
    if infinity_mass > delta:
        return math.inf
    step = -pmf._discretization
    probs = np.flip(pmf._probs)
    # the loop's running sums before each point: mass_upper from infinity_mass, mass_lower from 0
    mass_upper: Any = infinity_mass
    mass_lower: Any = 0
    loss: Any = (pmf._lower_loss + len(probs) - 1) * pmf._discretization  # itertools.count's start
    for start in range(0, len(probs), chunk_size):
        chunk = probs[start:start + chunk_size]
        n = len(chunk)
        # losses: itertools.count(upper_loss, step) adds step to the previous value each time
        losses = np.add.accumulate(np.concatenate(([loss], np.full(n - 1, step))))
        terms = np.fromiter(map(math.exp, (-losses).tolist()), dtype=np.float64, count=n) * chunk
        upper = np.add.accumulate(np.concatenate(([mass_upper], chunk)))
        lower = np.add.accumulate(np.concatenate(([float(mass_lower)], terms)))
        stop = _first_stop(upper[:-1], lower[:-1], losses, delta)
        # the loop returns max(0, loss) right after a point leaves mass_upper >= delta, mass_lower == 0
        zero = np.flatnonzero((upper[1:] >= delta) & (lower[1:] == 0))
        if zero.size and (stop is None or zero[0] < stop):
            return max(0, float(losses[zero[0]]))
        if stop is not None:
            mass_upper, mass_lower = float(upper[stop]), float(lower[stop])
            break
        mass_upper, mass_lower = float(upper[-1]), float(lower[-1])
        loss = float(losses[-1]) + step
    if mass_upper <= mass_lower + delta:
        return 0
    return math.log((mass_upper - delta) / mass_lower)


def epsilon_for_delta(pld: Any, delta: float) -> float:
    """``pld.get_epsilon_for_delta(delta)``, identical, with a vectorised scan of dense pmfs."""

    def one(pmf: Any) -> float:
        if type(pmf) is pld_pmf.DensePLDPmf:
            return _dense_epsilon(pmf, delta)
        return pmf.get_epsilon_for_delta(delta)

    epsilon_remove = one(pld._pmf_remove)
    if pld._symmetric:
        return epsilon_remove
    return max(epsilon_remove, one(pld._pmf_add))
