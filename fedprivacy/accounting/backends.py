"""Accounting backends, looked up by name in a registry: "pld" (default), "rdp", "prv".

A backend turns a *run* (one mechanism + sampling, self-composed ``count`` times) into a composable
state, composes states, and reads epsilon at a target delta. Backends never mutate anything: the
``Accountant`` owns the ledger and caches states. Every backend first answers ``unsupported_reason``;
an event it cannot bound is refused with that reason, never accounted with a weaker or approximate
bound. The Gaussian-DP / CLT approximation is not a backend.

Adaptive composition (the rule every combination below is checked against). Rounds are chosen
adaptively: the model of round t depends on earlier outputs, and so does what every other unit
contributes. A composition bound is valid only if, for one fixed ordered pair of neighbouring
datasets (D, D'), the pair of distributions composed for each round dominates (M_t(D), M_t(D'))
whatever the adversary chose (Zhu, Dong & Wang 2022, "Optimal accounting of differential privacy
via characteristic function", AISTATS, Definition 7 and Theorem 10). Libraries often keep two
directions, "remove" (mixture vs. pure) and "add" (pure vs. mixture), compose each on its own and
report the larger epsilon. That is valid only when a neighbouring pair cannot change direction
between rounds; when it can, an adversary that switches direction round by round gets more than
either direction alone (Lebeda, Regehr, Kamath & Steinke 2024, "Avoiding pitfalls for privacy
accounting of subsampled mechanisms under composition"). ``fedprivacy.accounting.adversary``
computes such an adversary's epsilon, and the tests hold every backend to it.

* Add/remove, any sampling: D' = D plus one unit in every round, so the direction is fixed by the
  pair: composing "remove" and "add" separately and taking the maximum is valid (Zhu, Dong & Wang
  2022, Theorem 11). The subsampled Gaussian and Laplace use it.
* Replace-one, no sampling: the pairs are symmetric (N(0), N(1); Lap(0), Lap(1); randomized
  response), one pair covers both orders.
* Replace-one, Poisson sampling (Gaussian): dp-accounting's REPLACE_ONE pair
  (q N(+1) + (1-q) N(0), q N(-1) + (1-q) N(0)) is one symmetric pair for both orders. The Laplace
  is refused here.
* Replace-one, fixed cohort (Gaussian, Laplace): the direction *can* switch. Whether the cohort
  sum of the other units looks like the replacing or the replaced unit is the adversary's choice
  through the model, so in one round D sees the mixture and in the next D' does. The PLD therefore
  composes one pair that dominates both directions at once (``_pld_both_directions``: the
  symmetrised trade-off function of Dong, Roth & Su 2022, Theorem 4.2). For one round it equals
  the old figure; over T rounds it is the price of adaptivity: at the README's example (z = 2,
  100 of 1000, T = 50, delta = 1e-5) epsilon goes from 5.148 (the invalid two-directions value,
  which an adaptive adversary beats: it reaches at least 5.169) to 5.538.

* ``pld``: Google dp-accounting privacy loss distributions (Koskela et al. 2020; Doroshenko et al.
  2022, "Connect the dots"), pessimistic discretisation, so the epsilon is an upper bound.
  Fixed-size cohorts without replacement (not supported by dp-accounting's PLD accountant) use the
  dominating pair of Zhu, Dong & Wang 2022 (the subsampling result for sampling without replacement
  under the replace-one relation, Proposition 30): if ``(P, Q)`` dominates one release under
  replace-one, then ``(gamma*P + (1-gamma)*Q, Q)`` and its reverse dominate the release on a
  uniformly random cohort of size m out of n, ``gamma = m/n`` (Balle, Barthe & Gaboardi 2018,
  Theorem 10, in dominating-pair form), merged into one symmetric pair as above. For the Gaussian,
  ``P = N(2, z^2)`` and ``Q = N(0, z^2)`` in units of C. Each direction is attained (so one round
  is tight): take every other unit equal to ``+C`` and replace one ``+C`` unit by ``-C``; the cohort
  sum is ``mC`` on one dataset and ``mC`` or ``(m-2)C`` (with probability gamma) on the other.
* ``rdp``: dp-accounting's Renyi-DP formulas (Mironov 2017; Mironov, Talwar & Zhang 2019 for the
  Poisson-subsampled Gaussian; Wang, Balle & Kasiviswanathan 2019, Theorem 27, for sampling without
  replacement under replace-one), converted with dp-accounting's ``compute_epsilon``. Every formula
  used bounds the Renyi divergence of *both* orders of every neighbouring pair (one vector for both
  directions), and RDP composes adaptively (Mironov 2017, Proposition 1): no direction pitfall.
  dp-accounting's RDP of ``GaussianDpEvent`` ignores the neighbouring relation, so the accounted
  noise multiplier is converted here (``z/(2s)`` under replace-one). Counts are applied here by
  multiplying one release's RDP vector, never left to the library (it ignores ``count`` for some
  events, ANCHORS.md).
* A mechanism registered with ``fedprivacy.accounting.events.register_mechanism`` (not one of the
  four built-ins) carries its own conversion: ``rdp`` uses its ``rdp(orders, ...)`` curve (composed
  additively, counts applied here), ``pld`` its ``pld(...)`` if it defines one; a backend refuses the
  event, with the reason, when the mechanism gives it nothing for that sampling and neighbouring
  (``prv`` always: it knows only the Poisson-sampled Gaussian).
* ``prv``: the privacy random variable accountant of Gopi, Lee & Wutschitz 2021 (package
  ``prv_accountant``, imported lazily), reported as its upper bound; Poisson-subsampled Gaussian under
  add/remove only. ``prv_accountant`` composes only the "remove" direction, so the figure is the
  maximum of its upper bound and the PLD's (which covers "add"). A cross-check, not the default.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld import privacy_loss_mechanism as plm
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from fedprivacy.accounting import pld_kernels
from fedprivacy.accounting.events import (
    BUILTIN_MECHANISMS,
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

__all__ = [
    "BACKENDS",
    "Backend",
    "PldBackend",
    "PrvBackend",
    "RdpBackend",
    "get_backend",
    "is_builtin",
    "register_backend",
    "to_dp_event",
]

#: PLD discretisation of the privacy loss (dp-accounting's default).
PLD_VALUE_DISCRETIZATION = 1e-4


def _to_relation(neighbouring: Neighbouring) -> NeighboringRelation:
    if neighbouring is Neighbouring.REPLACE_ONE:
        return NeighboringRelation.REPLACE_ONE
    return NeighboringRelation.ADD_OR_REMOVE_ONE


def _exponential_rr_parameter(epsilon: float) -> float:
    """Noise parameter p of binary randomized response that is exactly epsilon-DP: 2 / (1 + e^eps)."""
    return 2.0 / (1.0 + math.exp(epsilon))


def to_dp_event(event: PrivacyEvent, neighbouring: Neighbouring | str) -> dp_event.DpEvent:
    """The dp-accounting event for ``event`` under ``neighbouring``, with units converted.

    Gaussian noise multipliers are converted to std / (L2 distance of neighbouring sums), i.e. z/s
    under add/remove and z/(2s) under replace-one, which is what dp-accounting's ``GaussianDpEvent``
    means. Use with an accountant built for the same relation. Raises ValueError for combinations that
    have no dp-accounting equivalent.
    """
    neighbouring = Neighbouring.parse(neighbouring)
    mech, sampling = event.mechanism, event.sampling
    if isinstance(mech, GaussianEvent):
        if isinstance(sampling, PoissonSampling) and neighbouring is Neighbouring.REPLACE_ONE:
            # dp-accounting's PLD applies its own factor 2 for REPLACE_ONE; express in units of C/s.
            base: dp_event.DpEvent = dp_event.GaussianDpEvent(
                mech.noise_multiplier / mech.sensitivity
            )
        else:
            base = dp_event.GaussianDpEvent(mech.effective_noise_multiplier(neighbouring))
    elif isinstance(mech, LaplaceEvent):
        base = dp_event.LaplaceDpEvent(1.0 / mech.epsilon)
    elif isinstance(mech, ExponentialEvent):
        base = dp_event.RandomizedResponseDpEvent(
            noise_parameter=_exponential_rr_parameter(mech.epsilon), num_buckets=2
        )
    elif isinstance(mech, DiscreteGaussianEvent):
        base = dp_event.ZCDpEvent(rho=mech.rho, xi=0.0)
    else:
        raise ValueError(
            f"the registered mechanism {mech.kind!r} has no dp-accounting event; backends account it "
            "through its own rdp() / pld()"
        )
    if isinstance(sampling, PoissonSampling):
        single: dp_event.DpEvent = dp_event.PoissonSampledDpEvent(sampling.rate, base)
    elif isinstance(sampling, FixedCohortSampling):
        single = dp_event.SampledWithoutReplacementDpEvent(
            source_dataset_size=sampling.population, sample_size=sampling.cohort, event=base
        )
    else:
        single = base
    return single if event.count == 1 else dp_event.SelfComposedDpEvent(single, event.count)


class Backend(ABC):
    """One way of composing privacy events. Stateless; states are opaque values it creates."""

    name: ClassVar[str]
    description: ClassVar[str]

    def unsupported_reason(self, event: PrivacyEvent, neighbouring: Neighbouring) -> str | None:
        """None if this backend bounds ``event`` under ``neighbouring``, else a one-line reason."""
        if (
            isinstance(event.sampling, FixedCohortSampling)
            and neighbouring is not Neighbouring.REPLACE_ONE
        ):
            return (
                "fixed-size cohort sampling (without replacement) is only analysed under "
                "neighbouring=replace-one; use replace-one or Poisson sampling"
            )
        if not is_builtin(event):
            return self._registered_reason(event, neighbouring)
        return self._unsupported_reason(event, neighbouring)

    def _registered_reason(self, event: PrivacyEvent, neighbouring: Neighbouring) -> str | None:
        """Reason to refuse an event of a registered (non-built-in) mechanism; None if supported."""
        return f"the {self.name} accountant cannot account the registered mechanism {event.mechanism.kind!r}"

    @abstractmethod
    def _unsupported_reason(
        self, event: PrivacyEvent, neighbouring: Neighbouring
    ) -> str | None: ...

    @abstractmethod
    def run_state(self, event: PrivacyEvent, count: int, neighbouring: Neighbouring) -> Any:
        """State of ``count`` self-composed releases of ``event`` (its own count is ignored)."""

    @abstractmethod
    def compose(self, first: Any, second: Any) -> Any:
        """State of ``first`` followed by ``second``."""

    @abstractmethod
    def epsilon(self, state: Any, *, delta: float) -> float:
        """Smallest epsilon this backend certifies for ``state`` at ``delta``."""

    def delta(self, state: Any, *, epsilon: float) -> float:
        """Smallest delta this backend certifies for ``state`` at ``epsilon`` (an upper bound)."""
        raise ValueError(f"the {self.name} accountant reports epsilon only; use pld or rdp for delta")

    def epsilon_of_runs(
        self, runs: Sequence[tuple[PrivacyEvent, int]], neighbouring: Neighbouring, *, delta: float
    ) -> float:
        """Epsilon of the composition of ``runs`` (pairs of event and count), left to right."""
        if not runs:
            return 0.0
        state = self.run_state(runs[0][0], runs[0][1], neighbouring)
        for ev, count in runs[1:]:
            state = self.compose(state, self.run_state(ev, count, neighbouring))
        return self.epsilon(state, delta=delta)


def is_builtin(event: PrivacyEvent) -> bool:
    """True if the event's mechanism is one of the four built-ins (with dedicated backend code)."""
    return type(event.mechanism) in BUILTIN_MECHANISMS


def _registered_rdp(event: PrivacyEvent, orders: np.ndarray, neighbouring: Neighbouring) -> np.ndarray | None:
    """The registered mechanism's own RDP curve of one release, checked; None if it has no bound."""
    mech = event.mechanism
    curve = mech.rdp(orders, neighbouring=neighbouring, sampling=event.sampling)  # type: ignore[union-attr]
    if curve is None:
        return None
    values = np.asarray(curve, dtype=np.float64)
    if values.shape != orders.shape or np.isnan(values).any() or (values < 0).any():
        raise ValueError(
            f"{mech.kind}.rdp must return {orders.size} non-negative values (one per order), got "
            f"shape {values.shape}"
        )
    return values


def _registered_pld(event: PrivacyEvent, neighbouring: Neighbouring) -> Any | None:
    """The registered mechanism's own PLD of one release, or None (no ``pld`` or no bound)."""
    make = getattr(event.mechanism, "pld", None)
    return None if make is None else make(neighbouring=neighbouring, sampling=event.sampling)


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
                # symmetric pair for both orders (module docstring).
                return pld_lib.from_gaussian_mechanism(
                    standard_deviation=mech.noise_multiplier / mech.sensitivity,
                    sampling_prob=sampling.rate,
                    value_discretization_interval=grid,
                    neighboring_relation=NeighboringRelation.REPLACE_ONE,
                )
            # Add/remove: two directions composed separately; valid because the direction of a
            # neighbouring pair cannot change between rounds (module docstring).
            return pld_lib.from_gaussian_mechanism(
                standard_deviation=mech.effective_noise_multiplier(neighbouring),
                sampling_prob=sampling.rate,
                value_discretization_interval=grid,
            )
        # Fixed cohort, replace-one: the Zhu-Dong-Wang pair (gamma N(2) + (1-gamma) N(0), N(0)) in
        # units of s*C, both directions covered by one pair (module docstring).
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


# ------------------------------------------------------------------------------------------------ RDP
class RdpBackend(Backend):
    name = "rdp"
    description = "Renyi DP (dp-accounting formulas), looser than PLD"
    orders: ClassVar[np.ndarray] = np.asarray(rdp_lib.DEFAULT_RDP_ORDERS, dtype=np.float64)

    def _unsupported_reason(self, event: PrivacyEvent, neighbouring: Neighbouring) -> str | None:
        mech, sampling = event.mechanism, event.sampling
        if isinstance(sampling, PoissonSampling) and neighbouring is Neighbouring.REPLACE_ONE:
            return "the rdp accountant supports Poisson sampling only under add-remove"
        if isinstance(sampling, PoissonSampling | FixedCohortSampling) and not isinstance(
            mech, GaussianEvent
        ):
            return f"the rdp accountant supports sampling only for the Gaussian, not {mech.kind}"
        return None

    def _registered_reason(self, event: PrivacyEvent, neighbouring: Neighbouring) -> str | None:
        try:
            curve = _registered_rdp(event, self.orders, neighbouring)
        except (TypeError, ValueError, ArithmeticError) as exc:  # supports() never raises
            return f"the registered mechanism {event.mechanism.kind!r} has no valid RDP curve: {exc}"
        if curve is None:
            return (
                f"the registered mechanism {event.mechanism.kind!r} gives no RDP bound with "
                f"{event.sampling.describe()} under neighbouring={neighbouring.value}"
            )
        return None

    def run_state(self, event: PrivacyEvent, count: int, neighbouring: Neighbouring) -> Any:
        if not is_builtin(event):
            curve = _registered_rdp(event, self.orders, neighbouring)
            if curve is None:
                raise ValueError(self.unsupported_reason(event, neighbouring) or "unsupported event")
            return curve * count  # RDP composes additively (Mironov 2017, Prop. 1)
        one = to_dp_event(event.with_count(1), neighbouring)
        relation = _to_relation(neighbouring)
        if isinstance(event.mechanism, ExponentialEvent):
            relation = (
                NeighboringRelation.REPLACE_ONE
            )  # randomized response pair, see ExponentialEvent
        acc = rdp_lib.RdpAccountant(orders=list(self.orders), neighboring_relation=relation)
        acc.compose(one)
        # RDP composes additively: count releases have count times the RDP of one (Mironov 2017, Prop. 1).
        return np.asarray(acc.rdp, dtype=np.float64) * count

    def compose(self, first: Any, second: Any) -> Any:
        return first + second

    def epsilon(self, state: Any, *, delta: float) -> float:
        eps, _ = rdp_lib.compute_epsilon(self.orders, state, delta)
        return float(eps)

    def delta(self, state: Any, *, epsilon: float) -> float:
        delta, _ = rdp_lib.compute_delta(self.orders, state, epsilon)
        return min(1.0, float(delta))


# ------------------------------------------------------------------------------------------------ PRV
class PrvBackend(Backend):
    name = "prv"
    description = (
        "privacy random variables (Gopi et al. 2021, prv_accountant), upper bound, "
        "with the PLD's add direction"
    )
    eps_error: ClassVar[float] = 0.01

    def _unsupported_reason(self, event: PrivacyEvent, neighbouring: Neighbouring) -> str | None:
        if not isinstance(event.mechanism, GaussianEvent) or not isinstance(
            event.sampling, PoissonSampling
        ):
            return "the prv accountant supports only the Poisson-sampled Gaussian"
        if neighbouring is not Neighbouring.ADD_REMOVE:
            return "the prv accountant supports only neighbouring=add-remove"
        return None

    def run_state(self, event: PrivacyEvent, count: int, neighbouring: Neighbouring) -> Any:
        if not isinstance(event.mechanism, GaussianEvent):
            raise ValueError(self.unsupported_reason(event, neighbouring) or "unsupported event")
        return ((event.with_count(1), count),)

    def compose(self, first: Any, second: Any) -> Any:
        return first + second

    def epsilon(self, state: Any, *, delta: float) -> float:
        """max(PRV upper bound, PLD): prv_accountant bounds only the remove direction.

        Its ``PoissonSubsampledGaussianMechanism`` is the privacy random variable of the pair
        (q N(1, r^2) + (1-q) N(0, r^2), N(0, r^2)) alone; add/remove DP also needs the reverse pair
        (Zhu, Dong & Wang 2022, Theorem 11). The PLD backend composes both directions (each
        composed on its own, valid because a pair's direction is fixed under add/remove), so the
        maximum of the two is an upper bound for both.
        """
        import prv_accountant  # lazily: a cross-check only

        prvs = []
        for ev, _ in state:
            mech = ev.mechanism
            if not isinstance(mech, GaussianEvent):
                raise ValueError(f"the prv accountant cannot account {mech.kind}")
            prvs.append(
                prv_accountant.PoissonSubsampledGaussianMechanism(
                    sampling_probability=ev.sampling.rate,
                    noise_multiplier=mech.effective_noise_multiplier(Neighbouring.ADD_REMOVE),
                )
            )
        counts = [c for _, c in state]
        acc = prv_accountant.PRVAccountant(
            prvs=prvs,
            max_self_compositions=counts,
            eps_error=self.eps_error,
            delta_error=delta / 1000.0,
        )
        _, _, eps_upper = acc.compute_epsilon(delta=delta, num_self_compositions=counts)
        pld = _PLD.epsilon_of_runs(list(state), Neighbouring.ADD_REMOVE, delta=delta)
        return max(float(eps_upper), pld)


BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend) -> Backend:
    """Add ``backend`` to the registry under ``backend.name``."""
    BACKENDS[backend.name] = backend
    return backend


_PLD = PldBackend()
for _b in (_PLD, RdpBackend(), PrvBackend()):
    register_backend(_b)


def get_backend(name: str) -> Backend:
    """The registered backend called ``name``; ValueError naming the choices otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"backend must be a str, got {type(name).__name__}")
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"backend must be one of {', '.join(sorted(BACKENDS))}, got {name!r}"
        ) from None
