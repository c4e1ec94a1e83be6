"""The backend interface, and dp-accounting events with units converted (``to_dp_event``).

Adaptive composition, the rule every backend is held to. Rounds are chosen adaptively: the model of
round t depends on earlier outputs, and so does what every other unit contributes. A bound is valid
only if, for one fixed ordered pair of neighbouring datasets (D, D'), the pair of distributions
composed for each round dominates (M_t(D), M_t(D')) whatever the adversary chose (Zhu, Dong & Wang
2022, AISTATS, Definition 7 and Theorem 10). Libraries often keep two directions, "remove" (mixture
vs. pure) and "add" (pure vs. mixture), compose each on its own and report the larger epsilon. That
is valid only when a neighbouring pair cannot change direction between rounds; when it can, an
adversary that switches direction round by round gets more than either direction alone (Lebeda,
Regehr, Kamath & Steinke 2024). ``fedprivacy.accounting.adversary`` computes that adversary's
epsilon; tests hold every backend to it.

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
  composes one pair that dominates both directions at once (``pld_backend._pld_both_directions``: the
  symmetrised trade-off function of Dong, Roth & Su 2022, Theorem 4.2). For one round it equals
  the old figure; over T rounds it is the price of adaptivity: at the README's example (z = 2,
  100 of 1000, T = 50, delta = 1e-5) epsilon goes from 5.148 (the invalid two-directions value,
  which an adaptive adversary beats: it reaches at least 5.169) to 5.538.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation

from fedprivacy.accounting.events import (
    BUILTIN_MECHANISMS,
    DiscreteGaussianEvent,
    ExponentialEvent,
    FixedCohortSampling,
    GaussianEvent,
    LaplaceEvent,
    Neighbouring,
    PoissonSampling,
    PrivacyEvent,
)

__all__ = ["Backend", "PLD_VALUE_DISCRETIZATION", "is_builtin", "to_dp_event"]


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
