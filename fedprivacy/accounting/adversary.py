"""Lower bounds on epsilon from an explicit adaptive adversary, computed independently of the backends.

What it models. A neighbouring pair of datasets ``(D, D')`` is fixed; in every round the adversary
(who chooses the model, hence what every other unit contributes) picks one of a few *orientations*:
per-round pairs of output distributions ``(M_t(D), M_t(D'))`` that real datasets realise. It picks
after seeing all earlier outputs. For fixed-size cohorts under replace-one (a uniformly random
cohort of m of n units, gamma = m/n; Gaussian noise of std z*C on a sum of L2-clipped updates) the
two orientations are (Lebeda, Regehr, Kamath & Steinke 2024, "Avoiding pitfalls for privacy
accounting of subsampled mechanisms under composition"):

* ``remove``: every other unit contributes what the replacing unit does, so ``M_t(D')`` is
  ``N(mC, z^2C^2)`` and ``M_t(D)`` is ``gamma N((m-2)C, .) + (1 - gamma) N(mC, .)``;
* ``add``: every other unit contributes what the replaced unit does: the same pair, reversed.

Accounting the two directions separately and taking the larger epsilon at the end assumes the
adversary sticks to one orientation. This module computes what an adversary that switches achieves:
a dynamic programme over the running privacy loss (a sufficient statistic; Bellman), each round's
loss rounded *down* to a grid of width ``grid`` with its distribution computed exactly from the normal
or Laplace CDF (scipy; no dp-accounting code).

Guarantee (rigorous up to float rounding): the value is the delta of a real adaptive adversary or
less, so if ``adaptive_delta(...) > delta``, no accountant may print an epsilon at or below that
``epsilon`` for ``delta``. The adversary is not claimed optimal over *all* strategies (it uses two
orientations), so the true epsilon lies between ``adaptive_epsilon`` and a valid upper bound such as
the "pld" backend's.

Rationale: docs/PRIVACY.md, section "The explicit adaptive adversary".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import fft as sfft
from scipy import stats

__all__ = [
    "AdaptiveStrategy",
    "LossIncrements",
    "adaptive_delta",
    "adaptive_delta_schedule",
    "adaptive_epsilon",
    "adaptive_strategy",
    "fixed_cohort_orientations",
    "monte_carlo_delta",
    "poisson_replace_one_orientations",
]

#: Probability mass below which a tail of one round's loss is dropped (lowers the bound, never raises it).
TAIL_MASS = 1e-30


@dataclass(frozen=True, slots=True, kw_only=True)
class LossIncrements:
    """One orientation: the distribution under D of one round's privacy loss, rounded down to a grid.

    ``probs[i]`` is the probability that the loss lies in ``[(first + i) * grid, (first + i + 1) *
    grid)`` (the last cell also holds every larger loss). The masses sum to at most 1.
    """

    name: str
    grid: float
    first: int
    probs: np.ndarray

    def __post_init__(self) -> None:
        if not (isinstance(self.grid, float) and self.grid > 0):
            raise ValueError(f"grid must be a float > 0, got {self.grid!r}")
        probs = np.asarray(self.probs, dtype=np.float64)
        if probs.ndim != 1 or probs.size == 0 or np.any(probs < 0) or probs.sum() > 1 + 1e-9:
            raise ValueError("probs must be a non-empty 1-D array of masses summing to at most 1")
        object.__setattr__(self, "probs", probs)


def _floor_increments(
    name: str, survival: Callable[[np.ndarray], np.ndarray], lo: float, hi: float, grid: float
) -> LossIncrements:
    """Masses of floor(loss / grid) from ``survival(c) = P_D(loss >= c)`` on [lo, hi].

    Mass below ``lo`` is dropped; mass at or above the last grid point stays in the last cell.
    """
    first, last = math.floor(lo / grid), math.floor(hi / grid)
    cuts = np.arange(first, last + 1, dtype=np.float64) * grid
    s = np.clip(survival(cuts), 0.0, 1.0)
    probs = np.append(s[:-1] - s[1:], s[-1])
    return LossIncrements(name=name, grid=grid, first=first, probs=np.clip(probs, 0.0, None))


def _check_grid(grid: float) -> float:
    if isinstance(grid, bool) or not isinstance(grid, int | float) or not 0 < grid <= 0.1:
        raise ValueError(f"grid must be in (0, 0.1], got {grid!r}")
    return float(grid)


def _check_gamma(gamma: float) -> float:
    if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not 0 < gamma < 1:
        raise ValueError(f"sample_rate must be in (0, 1), got {gamma!r}")
    return float(gamma)


def _base_loss_inverse(gamma: float) -> Callable[[np.ndarray], np.ndarray]:
    """The inverse of ``c = log(1 - gamma + gamma e^u)`` (u = log P/Q of the base pair), as a
    function of c; ``-inf`` where ``c <= log(1 - gamma)`` (no u reaches it)."""
    log_keep = math.log1p(-gamma)

    def u_of_loss(c: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            inner = np.expm1(c - log_keep) * (1 - gamma) / gamma  # (e^c - (1-gamma)) / gamma
            return np.where(c > log_keep, np.log(inner), -np.inf)

    return u_of_loss


def _gaussian_mixture_pair(
    r: float, gamma: float, grid: float
) -> tuple[LossIncrements, LossIncrements]:
    """``remove`` (y ~ gamma N(1, r^2) + (1-gamma) N(0, r^2) against N(0, r^2)) and ``add`` (the
    reverse) for a shift of 1 and noise std r. u(y) = log P/Q = (y - 1/2) / r^2, y(u) = r^2 u + 1/2."""
    log_keep = math.log1p(-gamma)
    u_of_loss = _base_loss_inverse(gamma)
    y_tail = float(stats.norm.isf(TAIL_MASS, scale=r))
    u_max = (1.0 + y_tail - 0.5) / r**2
    loss_max = log_keep + float(np.logaddexp(0.0, math.log(gamma / (1 - gamma)) + u_max))

    def surv_remove(c: np.ndarray) -> np.ndarray:
        y = r**2 * u_of_loss(c) + 0.5
        return (1 - gamma) * stats.norm.sf(y, scale=r) + gamma * stats.norm.sf(y - 1.0, scale=r)

    def surv_add(c: np.ndarray) -> np.ndarray:
        # loss_add(y) = -loss_remove(y) with y ~ Q: P(loss_add >= c) = P(y <= y(u(-c))).
        y = r**2 * u_of_loss(-c) + 0.5
        return np.asarray(stats.norm.cdf(y, scale=r))

    return (
        _floor_increments("remove", surv_remove, log_keep, loss_max, grid),
        _floor_increments("add", surv_add, -loss_max, -log_keep, grid),
    )


def fixed_cohort_orientations(
    *,
    mechanism: str,
    sample_rate: float,
    grid: float,
    noise_multiplier: float | None = None,
    epsilon: float | None = None,
) -> tuple[LossIncrements, LossIncrements]:
    """The ``remove`` and ``add`` orientations of one fixed-cohort round under replace-one.

    Args:
        mechanism: "gaussian" (noise std z*C on a sum of contributions clipped to C; the replaced
            unit moves the sum by 2C) or "laplace" (an ``epsilon``-DP Laplace release under
            replace-one: scale b = Delta_1 / epsilon with Delta_1 the replace-one L1 sensitivity).
        sample_rate: gamma = cohort / population, in (0, 1).
        grid: loss grid width (smaller is tighter and slower).
        noise_multiplier: z, for the Gaussian.
        epsilon: the Laplace release's epsilon.

    In units of the distance between the two contributions the base pair is ``P = N(1, r^2)`` vs
    ``Q = N(0, r^2)`` with ``r = z / 2`` (Gaussian), or ``Lap(1, 1/epsilon)`` vs ``Lap(0, 1/epsilon)``.
    ``remove`` draws y from ``gamma P + (1 - gamma) Q`` (the dataset D) against ``Q``; ``add`` draws
    y from ``Q`` against ``gamma P + (1 - gamma) Q``.
    """
    grid, gamma = _check_grid(grid), _check_gamma(sample_rate)
    if mechanism == "gaussian":
        if noise_multiplier is None or not noise_multiplier > 0:
            raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier!r}")
        return _gaussian_mixture_pair(float(noise_multiplier) / 2.0, gamma, grid)
    u_of_loss = _base_loss_inverse(gamma)
    if mechanism == "laplace":
        if epsilon is None or not epsilon > 0:
            raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
        b = 1.0 / float(epsilon)
        # u(y) = (|y| - |y - 1|) / b in [-1/b, 1/b]: 2y - 1 over b on [0, 1], constant outside.
        loss_lo = math.log(1 - gamma + gamma * math.exp(-1.0 / b))
        loss_hi = math.log(1 - gamma + gamma * math.exp(1.0 / b))

        def y_threshold(u: np.ndarray) -> np.ndarray:
            return (np.clip(u * b, -1.0, 1.0) + 1.0) / 2.0

        def surv_remove(c: np.ndarray) -> np.ndarray:
            u = u_of_loss(c)
            y = y_threshold(u)
            tail = (1 - gamma) * stats.laplace.sf(y, scale=b) + gamma * stats.laplace.sf(
                y - 1.0, scale=b
            )
            return np.where(u * b <= -1.0, 1.0, np.where(u * b > 1.0, 0.0, tail))

        def surv_add(c: np.ndarray) -> np.ndarray:
            u = u_of_loss(-c)  # loss_add >= c  <=>  u(y) <= u
            y = y_threshold(u)
            below = stats.laplace.cdf(y, scale=b)
            return np.where(u * b >= 1.0, 1.0, np.where(u * b < -1.0, 0.0, below))

        remove = _floor_increments("remove", surv_remove, loss_lo, loss_hi, grid)
        add = _floor_increments("add", surv_add, -loss_hi, -loss_lo, grid)
        return remove, add
    raise ValueError(f"mechanism must be 'gaussian' or 'laplace', got {mechanism!r}")


def poisson_replace_one_orientations(
    *, noise_multiplier: float, sample_rate: float, grid: float
) -> tuple[LossIncrements, LossIncrements, LossIncrements]:
    """Orientations of one Poisson-sampled Gaussian round under replace-one.

    In units of C, std r = z: the replacing unit contributes +1, and the replaced one either 0 (an
    ``remove``/``add`` pair, as under add/remove) or -1 (``antipodal``: ``q N(1) + (1-q) N(0)`` vs
    ``q N(-1) + (1-q) N(0)``, dp-accounting's REPLACE_ONE pair).
    """
    grid, q = _check_grid(grid), _check_gamma(sample_rate)
    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier!r}")
    r = float(noise_multiplier)
    log_keep = math.log1p(-q)
    y_tail = float(stats.norm.isf(TAIL_MASS, scale=r))
    remove, add = _gaussian_mixture_pair(r, q, grid)

    # Antipodal: loss(y) = log(q e^{(y - 1/2)/r^2} + 1 - q) - log(q e^{(-y - 1/2)/r^2} + 1 - q),
    # increasing in y; invert numerically on a fine y grid (monotone interpolation, rounded down).
    ys = np.linspace(-1.0 - y_tail, 1.0 + y_tail, 400_001)

    def antipodal_loss(y: np.ndarray) -> np.ndarray:
        a = np.logaddexp(math.log(q) + (y - 0.5) / r**2, log_keep)
        b = np.logaddexp(math.log(q) + (-y - 0.5) / r**2, log_keep)
        return np.asarray(a - b)

    losses = antipodal_loss(ys)

    def surv_antipodal(c: np.ndarray) -> np.ndarray:
        # Under-count P(loss >= c): the first grid y with loss >= c lies at or above the true
        # threshold. This is the law of g(y) = the largest cut c_k whose grid threshold is <= y,
        # and g(y) <= loss(y), so it is still a real adversary's rounded-down loss.
        idx = np.searchsorted(losses, c, side="left")
        y = np.where(idx >= ys.size, np.inf, ys[np.minimum(idx, ys.size - 1)])
        return (1 - q) * stats.norm.sf(y, scale=r) + q * stats.norm.sf(y - 1.0, scale=r)

    bound = float(losses[-1])
    return remove, add, _floor_increments("antipodal", surv_antipodal, -bound, bound, grid)


def adaptive_delta(
    orientations: Sequence[LossIncrements],
    *,
    rounds: int,
    epsilon: float,
    loss_floor: float = -15.0,
    loss_margin: float = 15.0,
) -> float:
    """Delta the adaptive adversary attains at ``epsilon`` after ``rounds`` rounds (a lower bound).

    Args:
        orientations: the choices open to the adversary in every round (one ``grid``).
        rounds: number of rounds T >= 1.
        epsilon: the epsilon at which the hockey-stick divergence is evaluated.
        loss_floor, loss_margin: the running loss is tracked on ``[loss_floor, epsilon +
            loss_margin]``; paths that leave it are counted as 0 (a lower bound).
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    return adaptive_delta_schedule(
        [orientations] * rounds, epsilon=epsilon, loss_floor=loss_floor, loss_margin=loss_margin
    )


def adaptive_delta_schedule(
    schedule: Sequence[Sequence[LossIncrements]],
    *,
    epsilon: float,
    loss_floor: float = -15.0,
    loss_margin: float = 15.0,
) -> float:
    """``adaptive_delta`` when round t offers its own orientations ``schedule[t]`` (e.g. cohorts
    that differ from round to round)."""
    return _solve(schedule, epsilon, loss_floor, loss_margin, record=False).delta


@dataclass(frozen=True, slots=True, kw_only=True)
class AdaptiveStrategy:
    """The programme's optimal strategy: ``choices[t][i]`` is the orientation (an index into round
    t's list) played in round t when the rounded-down running loss is ``(first + i) * grid``."""

    epsilon: float
    delta: float
    grid: float
    first: int
    choices: tuple[np.ndarray, ...]

    def choose(self, t: int, rounded: np.ndarray) -> np.ndarray:
        """Orientation indices for round t at rounded losses ``rounded`` (grid units); the first
        orientation off the grid."""
        i = np.asarray(rounded) - self.first
        inside = (i >= 0) & (i < self.choices[t].size)
        return np.where(inside, self.choices[t][np.clip(i, 0, self.choices[t].size - 1)], 0)


def adaptive_strategy(
    schedule: Sequence[Sequence[LossIncrements]],
    *,
    epsilon: float,
    loss_floor: float = -15.0,
    loss_margin: float = 15.0,
) -> AdaptiveStrategy:
    """The strategy behind ``adaptive_delta_schedule`` (for simulating it, e.g. Monte Carlo)."""
    return _solve(schedule, epsilon, loss_floor, loss_margin, record=True)


def _solve(
    schedule: Sequence[Sequence[LossIncrements]],
    epsilon: float,
    loss_floor: float,
    loss_margin: float,
    *,
    record: bool,
) -> AdaptiveStrategy:
    if not schedule or any(not choices for choices in schedule):
        raise ValueError("schedule must be a non-empty list of non-empty orientation lists")
    grid = schedule[0][0].grid
    if any(o.grid != grid for choices in schedule for o in choices):
        raise ValueError("orientations must share one grid")
    lo, hi = math.floor(loss_floor / grid), math.ceil((epsilon + loss_margin) / grid)
    if lo > 0:
        raise ValueError(f"loss_floor must be <= 0, got {loss_floor}")
    losses = np.arange(lo, hi + 1, dtype=np.float64) * grid
    values = np.where(losses > epsilon, -np.expm1(epsilon - losses), 0.0)
    n = values.size
    nfft = sfft.next_fast_len(
        n + max(o.probs.size for choices in schedule for o in choices), real=True
    )
    # W_o[i] = sum_k probs_o[k] * values[i + first_o + k], a correlation, by FFT: entry
    # i + first_o + len_o - 1 of the convolution of values with the reversed probs.
    kernels: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for choices in schedule:
        for o in choices:
            if id(o) not in kernels:
                idx = np.arange(n) + o.first + o.probs.size - 1
                kernels[id(o)] = (sfft.rfft(o.probs[::-1], nfft), idx, (idx >= 0) & (idx < nfft))
    decisions: list[np.ndarray] = []
    for choices in reversed(schedule):  # backward induction: the last round first
        spectrum = sfft.rfft(values, nfft)
        best = np.zeros(n)
        arg = np.zeros(n, dtype=np.int8)
        for j, o in enumerate(choices):
            kernel, idx, ok = kernels[id(o)]
            w = np.zeros(n)
            w[ok] = sfft.irfft(spectrum * kernel, nfft)[idx[ok]]
            if record:
                arg[w > best] = j
            best = np.maximum(best, w)
        values = np.clip(best, 0.0, 1.0)
        if record:
            decisions.append(arg)
    return AdaptiveStrategy(
        epsilon=epsilon,
        delta=float(values[-lo]),
        grid=grid,
        first=lo,
        choices=tuple(reversed(decisions)),
    )


def monte_carlo_delta(
    strategy: AdaptiveStrategy,
    *,
    noise_multiplier: float,
    sample_rate: float,
    paths: int,
    rng: np.random.Generator,
    tilted_rate: float | None = None,
    mean_shift: float = 0.5,
    chunk: int = 500_000,
) -> tuple[float, float]:
    """Monte-Carlo estimate (and standard error) of the true delta of ``strategy`` at its epsilon.

    Simulates the Gaussian fixed-cohort game of ``fixed_cohort_orientations`` (orientation 0 =
    ``remove``, 1 = ``add``) with real samples and the exact (unrounded) privacy loss, the
    strategy acting on the rounded-down loss as in the programme, and estimates
    ``E_D[(1 - e^(epsilon - L))_+]``. Importance sampling makes the rare paths that carry delta
    common: in ``remove`` rounds the mixture component is drawn at ``tilted_rate`` (default
    ``min(0.5, 3 gamma)``) and the standard normal noise is shifted by ``mean_shift``, each
    reweighted by its likelihood ratio. A simulation, not a bound: it checks that the programme's
    delta is what a real adversary gets.
    """
    gamma = _check_gamma(sample_rate)
    tilt = min(0.5, 3.0 * gamma) if tilted_rate is None else _check_gamma(tilted_rate)
    if isinstance(paths, bool) or not isinstance(paths, int) or paths < 2:
        raise ValueError(f"paths must be an int >= 2, got {paths!r}")
    r, mu = float(noise_multiplier) / 2.0, float(mean_shift)
    log_odds, log_keep = math.log(gamma / (1 - gamma)), math.log1p(-gamma)
    w_in, w_out = math.log(gamma / tilt), math.log((1 - gamma) / (1 - tilt))
    total, total_sq = 0.0, 0.0
    for start in range(0, paths, chunk):
        size = min(chunk, paths - start)
        loss = np.zeros(size)
        rounded = np.zeros(size, dtype=np.int64)
        log_weight = np.zeros(size)
        for t in range(len(strategy.choices)):
            remove = strategy.choose(t, rounded) == 0
            component = remove & (rng.random(size) < tilt)
            noise = rng.standard_normal(size) + np.where(remove, mu, 0.0)
            log_weight += np.where(
                remove, np.where(component, w_in, w_out) - mu * noise + 0.5 * mu * mu, 0.0
            )
            step = log_keep + np.logaddexp(0.0, log_odds + (component + r * noise - 0.5) / r**2)
            step = np.where(remove, step, -step)
            loss += step
            rounded += np.floor(step / strategy.grid).astype(np.int64)
        x = np.exp(log_weight) * np.clip(-np.expm1(strategy.epsilon - loss), 0.0, None)
        total, total_sq = total + float(x.sum()), total_sq + float(np.square(x).sum())
    mean = total / paths
    var = max(total_sq / paths - mean * mean, 0.0) * paths / (paths - 1)
    return mean, math.sqrt(var / paths)


def adaptive_epsilon(
    orientations: Sequence[LossIncrements],
    *,
    rounds: int,
    delta: float,
    lower: float,
    upper: float,
    tolerance: float = 1e-3,
) -> float:
    """Largest epsilon (to ``tolerance``) at which the adversary's delta still exceeds ``delta``.

    Bisection on ``adaptive_delta``; ``lower`` must be beaten and ``upper`` not. Any valid
    accountant's epsilon at ``delta`` is at least the returned value.
    """
    if not adaptive_delta(orientations, rounds=rounds, epsilon=lower) > delta:
        raise ValueError(f"the adversary does not beat delta={delta:g} at lower={lower:g}")
    if adaptive_delta(orientations, rounds=rounds, epsilon=upper) > delta:
        raise ValueError(f"the adversary beats delta={delta:g} even at upper={upper:g}")
    while upper - lower > tolerance:
        mid = 0.5 * (lower + upper)
        if adaptive_delta(orientations, rounds=rounds, epsilon=mid) > delta:
            lower = mid
        else:
            upper = mid
    return lower
