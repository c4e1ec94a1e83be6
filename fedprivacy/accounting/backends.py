"""Accounting backends, looked up by name in a registry: "pld" (default), "rdp", "prv".

A backend turns a *run* (one mechanism + sampling, self-composed ``count`` times) into a composable
state, composes states, and reads epsilon at a target delta. Backends never mutate anything: the
``Accountant`` owns the ledger and caches states. Every backend first answers ``unsupported_reason``;
an event it cannot bound is refused with that reason, never accounted with a weaker or approximate
bound. The Gaussian-DP / CLT approximation is not a backend.

* ``pld``: Google dp-accounting privacy loss distributions (Koskela et al. 2020; Doroshenko et al.
  2022, "Connect the dots"), pessimistic discretisation, so the epsilon is an upper bound.
  Fixed-size cohorts without replacement (not supported by dp-accounting's PLD accountant) use the
  dominating pair of Zhu, Dong & Wang 2022 ("Optimal accounting of differential privacy via
  characteristic function", AISTATS 2022, the subsampling result for sampling without replacement
  under the replace-one relation): if ``(P, Q)`` dominates one release under replace-one, then
  ``(gamma*P + (1-gamma)*Q, Q)`` and its reverse dominate the release on a uniformly random cohort of
  size m out of n, ``gamma = m/n`` (this is Balle, Barthe & Gaboardi 2018, Theorem 10, in
  dominating-pair form). For the Gaussian, ``P = N(2, z^2)`` and ``Q = N(0, z^2)`` in units of C,
  i.e. ``from_gaussian_mechanism(standard_deviation=z/s, sensitivity=2, sampling_prob=m/n)`` with
  both adjacency directions. The pair is attained (so the bound is tight): take every other unit
  equal to ``+C`` and replace one ``+C`` unit by ``-C``; the cohort sum is ``mC`` on one dataset and
  ``mC`` or ``(m-2)C`` (with probability gamma) on the other.
* ``rdp``: dp-accounting's Renyi-DP formulas (Mironov 2017; Mironov, Talwar & Zhang 2019 for the
  Poisson-subsampled Gaussian; Wang, Balle & Kasiviswanathan 2019, Theorem 27, for sampling without
  replacement under replace-one), converted with dp-accounting's ``compute_epsilon``.
  dp-accounting's RDP of ``GaussianDpEvent`` ignores the neighbouring relation, so the accounted
  noise multiplier is converted here (``z/(2s)`` under replace-one). Counts are applied here by
  multiplying one release's RDP vector, never left to the library (it ignores ``count`` for some
  events, ANCHORS.md).
* ``prv``: the privacy random variable accountant of Gopi, Lee & Wutschitz 2021 (package
  ``prv_accountant``, imported lazily), reported as its upper bound; Poisson-subsampled Gaussian under
  add/remove only. A cross-check, not the default.
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
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

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
from fedprivacy.dp.mechanisms import analytic_gaussian_epsilon

__all__ = [
    "BACKENDS",
    "Backend",
    "PldBackend",
    "PrvBackend",
    "RdpBackend",
    "get_backend",
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
    else:
        base = dp_event.ZCDpEvent(rho=mech.rho, xi=0.0)
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
        return self._unsupported_reason(event, neighbouring)

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


@functools.lru_cache(maxsize=64)
def _pld_gaussian(ratio: float) -> Any:
    """PLD of one unsampled Gaussian release with std / distance = ``ratio`` (cached)."""
    return pld_lib.from_gaussian_mechanism(
        standard_deviation=ratio, value_discretization_interval=PLD_VALUE_DISCRETIZATION
    )


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
                # std in units of the per-unit bound s*C (a distance of 2 between the two).
                return pld_lib.from_gaussian_mechanism(
                    standard_deviation=mech.noise_multiplier / mech.sensitivity,
                    sampling_prob=sampling.rate,
                    value_discretization_interval=grid,
                    neighboring_relation=NeighboringRelation.REPLACE_ONE,
                )
            return pld_lib.from_gaussian_mechanism(
                standard_deviation=mech.effective_noise_multiplier(neighbouring),
                sampling_prob=sampling.rate,
                value_discretization_interval=grid,
            )
        # Fixed cohort, replace-one: the Zhu-Dong-Wang pair (gamma N(2) + (1-gamma) N(0), N(0)) in
        # units of s*C, both directions (module docstring).
        return pld_lib.from_gaussian_mechanism(
            standard_deviation=mech.noise_multiplier / mech.sensitivity,
            sensitivity=2.0,
            sampling_prob=sampling.rate,
            value_discretization_interval=grid,
            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        )
    if isinstance(mech, LaplaceEvent):
        # epsilon-DP Laplace under the accountant's relation: pair (Lap(0, 1/eps), Lap(1, 1/eps));
        # subsampled as for the Gaussian (Poisson: add/remove; fixed cohort: Zhu-Dong-Wang).
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

    def run_state(self, event: PrivacyEvent, count: int, neighbouring: Neighbouring) -> Any:
        mech = event.mechanism
        if isinstance(mech, GaussianEvent) and isinstance(event.sampling, NoSampling):
            # k Gaussian releases with ratio r compose exactly to one with ratio r / sqrt(k).
            r = mech.effective_noise_multiplier(neighbouring)
            return _GaussianState(mu_sq=count / r**2)
        return _pld_single(event.with_count(1), neighbouring).self_compose(count)

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
        return float(state.get_epsilon_for_delta(delta))


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

    def run_state(self, event: PrivacyEvent, count: int, neighbouring: Neighbouring) -> Any:
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


# ------------------------------------------------------------------------------------------------ PRV
class PrvBackend(Backend):
    name = "prv"
    description = "privacy random variables (Gopi et al. 2021, prv_accountant), upper bound"
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
        mech = event.mechanism
        if not isinstance(mech, GaussianEvent):
            raise ValueError(self.unsupported_reason(event, neighbouring) or "unsupported event")
        return ((event.sampling.rate, mech.effective_noise_multiplier(neighbouring), count),)

    def compose(self, first: Any, second: Any) -> Any:
        return first + second

    def epsilon(self, state: Any, *, delta: float) -> float:
        import prv_accountant  # lazily: a cross-check only

        prvs = [
            prv_accountant.PoissonSubsampledGaussianMechanism(
                sampling_probability=q, noise_multiplier=r
            )
            for q, r, _ in state
        ]
        counts = [c for _, _, c in state]
        acc = prv_accountant.PRVAccountant(
            prvs=prvs,
            max_self_compositions=counts,
            eps_error=self.eps_error,
            delta_error=delta / 1000.0,
        )
        _, _, eps_upper = acc.compute_epsilon(delta=delta, num_self_compositions=counts)
        return float(eps_upper)


BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend) -> Backend:
    """Add ``backend`` to the registry under ``backend.name``."""
    BACKENDS[backend.name] = backend
    return backend


for _b in (PldBackend(), RdpBackend(), PrvBackend()):
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
