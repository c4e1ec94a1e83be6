"""The ``pld`` backend, the default: privacy loss distributions.

Google dp-accounting privacy loss distributions (Koskela et al. 2020; Doroshenko et al. 2022,
"Connect the dots"), pessimistic discretisation, so the epsilon is an upper bound. Fixed-size
cohorts without replacement (not supported by dp-accounting's PLD accountant) use the dominating
pair of Zhu, Dong & Wang 2022 (the subsampling result for sampling without replacement under the
replace-one relation, Proposition 30): if ``(P, Q)`` dominates one release under replace-one, then
``(gamma*P + (1-gamma)*Q, Q)`` and its reverse dominate the release on a uniformly random cohort of
size m out of n, ``gamma = m/n`` (Balle, Barthe & Gaboardi 2018, Theorem 10, in dominating-pair
form), merged into one symmetric pair (``backend_base``). For the Gaussian, ``P = N(2, z^2)`` and
``Q = N(0, z^2)`` in units of C. Each direction is attained (so one round is tight): take every
other unit equal to ``+C`` and replace one ``+C`` unit by ``-C``; the cohort sum is ``mC`` on one
dataset and ``mC`` or ``(m-2)C`` (with probability gamma) on the other.

Unsampled Gaussian runs stay in closed form (``_GaussianState``); a fixed cohort under replace-one
composes one pair for both directions (``_pld_both_directions``; ``backend_base`` says why).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld import privacy_loss_mechanism as plm
from dp_accounting.privacy_accountant import NeighboringRelation

from fedprivacy.accounting import pld_kernels
from fedprivacy.accounting.backend_base import (
    PLD_VALUE_DISCRETIZATION,
    Backend,
    _exponential_rr_parameter,
    _registered_pld,
    is_builtin,
)
from fedprivacy.accounting.events import (
    DiscreteGaussianEvent,
    ExponentialEvent,
    FixedCohortSampling,
    GaussianEvent,
    LaplaceEvent,
    Neighbouring,
    NoSampling,
    PoissonSampling,
    PrivacyEvent,
)
from fedprivacy.dp.mechanisms import analytic_gaussian_delta, analytic_gaussian_epsilon

__all__ = ["PldBackend"]


@functools.lru_cache(maxsize=64)
def _pld_gaussian(ratio: float) -> Any:
    """PLD of one unsampled Gaussian release with std / distance = ``ratio`` (cached)."""
    return pld_lib.from_gaussian_mechanism(
        standard_deviation=ratio, value_discretization_interval=PLD_VALUE_DISCRETIZATION
    )


def _loss_cutoffs(loss: Any, epsilons: np.ndarray) -> np.ndarray:
    """x with {privacy loss >= eps} = {X <= x}, for every eps at once (dp-accounting's convention).

    The same sets as ``MonotonePrivacyLoss.inverse_privacy_loss``, which is scalar (a Python call per
    eps dominated the cost of building a PLD); ``-inf`` is the empty set, ``+inf`` the whole line.
    In dp-accounting's convention the loss is non-increasing in x: REMOVE is
    ``log(1 - q + q mu(x + s) / mu(x))`` and ADD is ``-log(1 - q + q mu(x - s) / mu(x))``.
    """
    q, s = loss.sampling_prob, loss.sensitivity
    with np.errstate(divide="ignore", invalid="ignore"):
        if loss.adjacency_type is plm.AdjacencyType.REMOVE:
            # base loss u = log(mu(x + s) / mu(x)) >= log((e^eps - (1 - q)) / q)
            u = np.log((np.exp(epsilons) - (1.0 - q)) / q)
            sign = -1.0
        else:
            # base loss u = log(mu(x - s) / mu(x)) <= log((e^-eps - (1 - q)) / q)
            u = np.log((np.exp(-epsilons) - (1.0 - q)) / q)
            sign = 1.0
        u = np.where(np.isnan(u), -np.inf, u)
        if isinstance(loss, plm.GaussianPrivacyLoss):
            var = loss.standard_deviation**2
            # REMOVE: (-2xs - s^2) / (2 var) >= u ; ADD: (2xs - s^2) / (2 var) <= u
            x = sign * (2.0 * var * u + s * s) / (2.0 * s)
            if sign < 0:
                return np.where(u == -np.inf, np.inf, x)
            return np.where(u == -np.inf, -np.inf, x)
        if isinstance(loss, plm.LaplacePrivacyLoss):
            b, top = loss.parameter, s / loss.parameter
            if sign < 0:
                # REMOVE base (|x| - |x + s|) / b: s/b for x <= -s, -s/b for x >= 0, linear between.
                x = np.clip(-(b * u + s) / 2.0, -s, 0.0)
                return np.where(u > top, -np.inf, np.where(u < -top, np.inf, x))
            # ADD base (|x| - |x - s|) / b: -s/b for x <= 0, s/b for x >= s, linear between.
            x = np.clip((b * u + s) / 2.0, 0.0, s)
            return np.where(u >= top, np.inf, np.where(u < -top, -np.inf, x))
    raise TypeError(f"no vectorised inverse for {type(loss).__name__}")


def _hockey_stick(loss: Any, epsilons: np.ndarray) -> np.ndarray:
    """``loss.get_delta_for_epsilon(epsilons)``, vectorised: mu_upper(S) - e^eps mu_lower(S)."""
    x = _loss_cutoffs(loss, epsilons)
    with np.errstate(over="ignore"):
        deltas = loss.mu_upper_cdf(x) - np.exp(epsilons + loss.mu_lower_log_cdf(x))
    return np.clip(deltas, 0.0, 1.0)


def _pld_both_directions(make_loss: Any) -> Any:
    """One symmetric PLD that dominates both directions of a subsampled pair at once, in every round.

    ``make_loss(adjacency_type)`` builds dp-accounting's monotone privacy loss of the pair in one
    direction: REMOVE is ``(gamma*P + (1-gamma)*Q, Q)``, ADD is ``(Q, gamma*P + (1-gamma)*Q)``. The
    returned PLD is the pessimistic connect-the-dots discretisation (Doroshenko et al. 2022, PETS,
    Algorithm 1) of the privacy profile ``delta(eps) = max(delta_REMOVE(eps), delta_ADD(eps))`` for
    every real ``eps`` (negative ones included, which composition needs). That profile is the profile
    of a genuine pair of distributions: in f-DP terms it is the symmetrised trade-off function
    ``min(f_p, f_p^{-1})**`` of Dong, Roth & Su 2022 (Theorem 4.2, sampling without replacement
    under replace-one), whose convex conjugate is the maximum of the two conjugates, so its profile
    (Proposition 2.12) is the pointwise maximum; Zhu, Dong & Wang 2022 (Proposition 30, Corollary 32)
    give the same pair as a dominating pair. One pair dominating both orders of every neighbouring
    pair is what adaptive composition needs (Zhu, Dong & Wang 2022, Theorem 10): the adversary may
    switch the direction round by round (Lebeda, Regehr, Kamath & Steinke 2024), so composing the two
    directions separately and taking the larger epsilon at the end is not valid here.
    """
    grid = PLD_VALUE_DISCRETIZATION
    remove = make_loss(plm.AdjacencyType.REMOVE)
    add = make_loss(plm.AdjacencyType.ADD)
    b_remove, b_add = remove.connect_dots_bounds(), add.connect_dots_bounds()
    # The pair's privacy losses lie between the smallest and the largest loss of either direction.
    lower = math.floor(min(b_remove.epsilon_lower, b_add.epsilon_lower) / grid)
    upper = math.ceil(max(b_remove.epsilon_upper, b_add.epsilon_upper) / grid)
    epsilons = np.arange(lower, upper + 1, dtype=np.float64) * grid
    deltas = np.maximum(_hockey_stick(remove, epsilons), _hockey_stick(add, epsilons))
    pmf = pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(grid, lower, upper, deltas)
    return pld_lib.PrivacyLossDistribution(pmf)  # symmetric: the same pmf for both orders


@functools.lru_cache(maxsize=256)
def _pld_single(event: PrivacyEvent, neighbouring: Neighbouring) -> Any:
    """PLD of one release of ``event`` (its count is ignored) under ``neighbouring``.

    Cached: building a PLD is the expensive step, self-composing a cached one is cheap.
    """
    mech, sampling = event.mechanism, event.sampling
    grid = PLD_VALUE_DISCRETIZATION
    if isinstance(mech, GaussianEvent):
        if isinstance(sampling, NoSampling):
            return _pld_gaussian(mech.effective_noise_multiplier(neighbouring))
        if isinstance(sampling, PoissonSampling):
            if neighbouring is Neighbouring.REPLACE_ONE:
                # dp-accounting REPLACE adjacency: q N(+1) + (1-q) N(0) vs q N(-1) + (1-q) N(0),
                # std in units of the per-unit bound s*C (a distance of 2 between the two). One
                # symmetric pair for both orders (``backend_base``'s docstring).
                return pld_lib.from_gaussian_mechanism(
                    standard_deviation=mech.noise_multiplier / mech.sensitivity,
                    sampling_prob=sampling.rate,
                    value_discretization_interval=grid,
                    neighboring_relation=NeighboringRelation.REPLACE_ONE,
                )
            # Add/remove: two directions composed separately; valid because the direction of a
            # neighbouring pair cannot change between rounds (``backend_base``'s docstring).
            return pld_lib.from_gaussian_mechanism(
                standard_deviation=mech.effective_noise_multiplier(neighbouring),
                sampling_prob=sampling.rate,
                value_discretization_interval=grid,
            )
        # Fixed cohort, replace-one: the Zhu-Dong-Wang pair (gamma N(2) + (1-gamma) N(0), N(0)) in
        # units of s*C, both directions covered by one pair (``backend_base``'s docstring).
        std = mech.noise_multiplier / mech.sensitivity
        return _pld_both_directions(
            lambda adjacency: plm.GaussianPrivacyLoss(
                std, sensitivity=2.0, sampling_prob=sampling.rate, adjacency_type=adjacency
            )
        )
    if isinstance(mech, LaplaceEvent):
        # epsilon-DP Laplace under the accountant's relation: pair (Lap(0, 1/eps), Lap(1, 1/eps)).
        if isinstance(sampling, FixedCohortSampling):
            scale = 1.0 / mech.epsilon
            return _pld_both_directions(
                lambda adjacency: plm.LaplacePrivacyLoss(
                    scale, sensitivity=1.0, sampling_prob=sampling.rate, adjacency_type=adjacency
                )
            )
        # No sampling (symmetric), or Poisson under add/remove (two directions, fixed per pair).
        return pld_lib.from_laplace_mechanism(
            parameter=1.0 / mech.epsilon,
            sampling_prob=sampling.rate,
            value_discretization_interval=grid,
        )
    if isinstance(mech, ExponentialEvent):
        # Binary randomized response that is exactly epsilon-DP dominates (ExponentialEvent).
        return pld_lib.from_randomized_response(
            noise_parameter=_exponential_rr_parameter(mech.epsilon),
            num_buckets=2,
            value_discretization_interval=grid,
            neighboring_relation=NeighboringRelation.REPLACE_ONE,
        )
    raise ValueError(f"the pld accountant cannot account {mech.kind}")


@dataclass(frozen=True, slots=True)
class _GaussianState:
    """Composition of unsampled Gaussian releases, kept in closed form.

    Composing Gaussian mechanisms with sensitivity/std ratios mu_i is exactly one Gaussian mechanism
    with mu = sqrt(sum mu_i^2) (Dong, Roth & Su 2022, Corollary 3.3: the composition of mu_i-GDP
    trade-off functions G_mu_i is G_mu, with equality, not a CLT approximation). Its epsilon at delta
    is then the analytic Gaussian mechanism's, exact (Balle & Wang 2018, Theorem 8). This avoids
    re-discretising a wider and wider PLD every round (seconds per round at large epsilon); a PLD is
    built only when this is composed with an event that has no closed form.
    """

    mu_sq: float


def _as_pld(state: Any) -> Any:
    if isinstance(state, _GaussianState):
        return _pld_gaussian(1.0 / math.sqrt(state.mu_sq))
    return state


# ------------------------------------------------------------------------------------------------ PLD
class PldBackend(Backend):
    name = "pld"
    description = "privacy loss distributions (dp-accounting), pessimistic: a tight upper bound"

    def _unsupported_reason(self, event: PrivacyEvent, neighbouring: Neighbouring) -> str | None:
        mech, sampling = event.mechanism, event.sampling
        if isinstance(mech, DiscreteGaussianEvent):
            return (
                "the pld accountant has no bound for the multivariate discrete Gaussian; "
                "use accountant=rdp (zCDP, Canonne-Kamath-Steinke 2020)"
            )
        if isinstance(mech, ExponentialEvent) and not isinstance(sampling, NoSampling):
            return "the exponential mechanism is only accounted without sampling"
        if (
            isinstance(mech, LaplaceEvent)
            and isinstance(sampling, PoissonSampling)
            and neighbouring is Neighbouring.REPLACE_ONE
        ):
            return "Poisson-sampled Laplace is only accounted under add-remove"
        return None

    def _registered_reason(self, event: PrivacyEvent, neighbouring: Neighbouring) -> str | None:
        try:
            pld = _registered_pld(event, neighbouring)
        except (TypeError, ValueError, ArithmeticError) as exc:  # supports() never raises
            return f"the registered mechanism {event.mechanism.kind!r} has no valid PLD: {exc}"
        if pld is None:
            return (
                f"the pld accountant has no bound for the registered mechanism {event.mechanism.kind!r} "
                f"with {event.sampling.describe()} (it gives no pld()); use accountant=rdp"
            )
        return None

    def run_state(self, event: PrivacyEvent, count: int, neighbouring: Neighbouring) -> Any:
        mech = event.mechanism
        if not is_builtin(event):
            pld = _registered_pld(event, neighbouring)
            if pld is None:
                raise ValueError(self.unsupported_reason(event, neighbouring) or "unsupported event")
            return pld_kernels.self_compose(pld, count)
        if isinstance(mech, GaussianEvent) and isinstance(event.sampling, NoSampling):
            # k Gaussian releases with ratio r compose exactly to one with ratio r / sqrt(k).
            r = mech.effective_noise_multiplier(neighbouring)
            return _GaussianState(mu_sq=count / r**2)
        # pld.self_compose(count), bit for bit, without recomputing its Chernoff bound's moments
        return pld_kernels.self_compose(_pld_single(event.with_count(1), neighbouring), count)

    def compose(self, first: Any, second: Any) -> Any:
        if isinstance(first, _GaussianState) and isinstance(second, _GaussianState):
            return _GaussianState(mu_sq=first.mu_sq + second.mu_sq)
        return _as_pld(first).compose(_as_pld(second))

    def epsilon(self, state: Any, *, delta: float) -> float:
        if isinstance(state, _GaussianState):
            # Exact, not discretised: Balle & Wang 2018, Theorem 8, for the composed Gaussian.
            return analytic_gaussian_epsilon(
                noise_std=1.0 / math.sqrt(state.mu_sq), sensitivity=1.0, delta=delta
            )
        return float(pld_kernels.epsilon_for_delta(state, delta))  # = state.get_epsilon_for_delta

    def delta(self, state: Any, *, epsilon: float) -> float:
        if isinstance(state, _GaussianState):
            return analytic_gaussian_delta(
                noise_std=1.0 / math.sqrt(state.mu_sq), sensitivity=1.0, epsilon=epsilon
            )
        return min(1.0, float(state.get_delta_for_epsilon(epsilon)))
