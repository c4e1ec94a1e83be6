"""fedprivacy's privacy ledger behind Flower's ``PrivacyAccountant`` protocol (flwr 1.42).

Flower's fixed-clipping DP strategies (``DifferentialPrivacyClientSideFixedClipping``,
``DifferentialPrivacyServerSideFixedClipping``) take an ``accountant=`` that follows
``flwr.serverapp.PrivacyAccountant``. :class:`FedprivacyAccountant` gives them fedprivacy's ledger
instead of Flower's ``RdpAccountant``: PLD by default (the exact analytic Gaussian for unsampled
releases, Balle & Wang 2018, Theorem 8, composed in closed form, Dong, Roth & Su 2022, Corollary 3.3),
check-first, persisted in fedprivacy's ledger format.

What is accounted (read from flwr 1.42's sources):

* Noise: ``N(0, (z C)^2)`` on the sum of the m clipped updates, a ``GaussianEvent(noise_multiplier=z)``
  composed per released aggregate before ``aggregate_train`` returns it: a refused ``compose`` withholds it.
* Flower's own sampling (``random.sample`` from the nodes connected at that moment, Python's global
  Mersenne Twister) is neither uniform over the population nor unpredictable, so it gets no
  amplification credit (``SamplingMethod.NO_AMPLIFICATION``). No add/remove claim holds for Flower's
  strategies; the adapter's ``adjacency`` names the claim: ``"replace-one"`` (the default, sensitivity
  ``2C``) or ``"zero-out"`` (Kairouz et al. 2021, "Practical and private (deep) learning without sampling
  or shuffling", Sec. 2; sensitivity ``C``, Flower's own figure). Both labels are kept in the saved state.
* Amplification only for a cohort fedprivacy drew itself: :class:`SecureCohortFedAvg` draws exactly
  ``cohort_size`` of exactly ``population_size`` nodes with the OS CSPRNG; under
  ``SamplingMethod.WITHOUT_REPLACEMENT`` (replace-one; Balle, Barthe & Gaboardi 2018, Theorem 10) a
  release is accounted as ``FixedCohortSampling`` only if it matches the sampler's latest unaccounted
  draw, else refused. :func:`attach_accountant` attaches it after Flower's other checks. Poisson is refused.

Not covered, by Flower's design: the metrics ``FedAvg`` aggregates without noise, Flower's noise source
(numpy's global generator), client-side clipping (``fixedclipping_mod`` trusts the clients).
This module is Flower glue (it imports flwr); the library ``fedprivacy`` stays Flower-free.
Rationale: docs/FLOWER_ACCOUNTANT.md, section "What Flower releases and what is accounted".
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from logging import INFO
from random import Random
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import (
    GaussianPrivacyEvent,
    Grid,
    PrivacyConfig,
    PrivacySpent,
    SamplingMethod,
)
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.dp_fixed_clipping import DifferentialPrivacyFixedClippingBase

from fedprivacy.accounting import (
    Accountant,
    FixedCohortSampling,
    GaussianEvent,
    Neighbouring,
    NoSampling,
    PrivacyEvent,
)

__all__ = [
    "STATE_SCHEMA_VERSION",
    "CohortDraw",
    "FedprivacyAccountant",
    "SecureCohortFedAvg",
    "attach_accountant",
]

STATE_SCHEMA_VERSION = 2  # 2: the adjacency the figure is claimed under
NODE_WAIT_SECONDS = 60.0
#: ``get_delta`` bisects epsilon(delta) in log space until the bracket is this narrow (relative).
DELTA_RELATIVE_TOLERANCE = 1e-9


def _config_dict(config: PrivacyConfig) -> dict[str, Any]:
    return {
        "target_delta": config.target_delta,
        "population_size": config.population_size,
        "neighboring_relation": config.neighboring_relation.value,
        "sampling_method": config.sampling_method.value,
        "max_epsilon": config.max_epsilon,
    }


def _check_count(count: Any) -> int:
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"count must be an int, got {type(count).__name__}")
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return count


def _check_positive_finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be > 0 and finite, got {value}")
    return float(value)


# ----------------------------------------------------------------------------------- the sampler
@dataclass(frozen=True, slots=True, kw_only=True)
class CohortDraw:
    """One cohort drawn by :class:`SecureCohortFedAvg`: ``cohort_size`` of ``population_size`` nodes."""

    server_round: int
    cohort_size: int
    population_size: int


class SecureCohortFedAvg(FedAvg):
    """``FedAvg`` whose training cohort is a provable fixed-size uniform draw.

    Each round it waits until the population is connected, refuses to go on if the set of connected
    nodes is not exactly the population seen in the first round (``population_size`` node ids), and
    draws exactly ``cohort_size`` of them uniformly without replacement with ``rng`` (default: the
    operating system's CSPRNG, ``secrets.SystemRandom``). Every draw is recorded as a
    :class:`CohortDraw` for :class:`FedprivacyAccountant`. Aggregation, evaluation and the other
    ``FedAvg`` arguments (given as keywords) are Flower's, unchanged.

    Args:
        cohort_size: m, the number of nodes trained per round (>= 1).
        population_size: n, the number of nodes in the federation (>= m).
        rng: the generator that draws the cohort; pass a seeded ``random.Random`` only for
            reproducible research (the draw is then predictable and amplification does not hold).
        node_wait: seconds to wait for the population to connect before raising RuntimeError.
        **fedavg_kwargs: ``FedAvg`` keywords other than ``fraction_train``, ``min_train_nodes``
            and ``min_available_nodes``, which the cohort replaces.
    """

    def __init__(
        self,
        *,
        cohort_size: int,
        population_size: int,
        rng: Random | None = None,
        node_wait: float = NODE_WAIT_SECONDS,
        **fedavg_kwargs: Any,
    ) -> None:
        for name, value, minimum in (("cohort_size", cohort_size, 1),
                                     ("population_size", population_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < minimum:
                raise ValueError(f"{name} must be >= {minimum}, got {value}")
        if cohort_size > population_size:
            raise ValueError(
                f"cohort_size must be <= population_size, got {cohort_size} > {population_size}"
            )
        taken = {"fraction_train", "min_train_nodes", "min_available_nodes"} & set(fedavg_kwargs)
        if taken:
            raise ValueError(
                f"{', '.join(sorted(taken))} cannot be set: cohort_size and population_size "
                "define the training sample"
            )
        super().__init__(
            fraction_train=cohort_size / population_size,
            min_train_nodes=cohort_size,
            min_available_nodes=population_size,
            **fedavg_kwargs,
        )
        self.cohort_size = cohort_size
        self.population_size = population_size
        self.node_wait = _check_positive_finite("node_wait", node_wait)
        self._rng: Random = secrets.SystemRandom() if rng is None else rng
        self.secure_rng = rng is None
        self._population: frozenset[int] | None = None
        self._draws: list[CohortDraw] = []
        self._accounted = 0  # draws[:_accounted] may no longer be used for a release

    @property
    def draws(self) -> tuple[CohortDraw, ...]:
        """Every cohort drawn so far, oldest first."""
        return tuple(self._draws)

    def pending_draw(self) -> CohortDraw | None:
        """The latest draw if no release has been accounted against it yet, else None."""
        if len(self._draws) > self._accounted:
            return self._draws[-1]
        return None

    def mark_accounted(self, draw: CohortDraw) -> None:
        """Record that a release was accounted against ``draw`` (it must be the pending one)."""
        if self.pending_draw() is not draw:
            raise ValueError("draw is not the pending cohort draw of this sampler")
        self._accounted = len(self._draws)

    def _wait_for_population(self, grid: Grid) -> list[int]:
        deadline = time.monotonic() + self.node_wait
        while True:
            nodes = sorted(set(grid.get_node_ids()))
            if len(nodes) > self.population_size:
                raise RuntimeError(
                    f"{len(nodes)} nodes are connected but population_size is "
                    f"{self.population_size}: the cohort would not be sampled from the "
                    "accounted population"
                )
            if len(nodes) == self.population_size:
                return nodes
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"only {len(nodes)} of population_size={self.population_size} nodes "
                    f"connected within {self.node_wait:g} s"
                )
            time.sleep(0.2)

    def draw_cohort(self, server_round: int, grid: Grid) -> list[int]:
        """Draw and record this round's cohort: ``cohort_size`` node ids of the population."""
        nodes = self._wait_for_population(grid)
        if self._population is None:
            self._population = frozenset(nodes)
        elif frozenset(nodes) != self._population:
            raise RuntimeError(
                "the set of connected nodes changed since the first round; a fixed-cohort "
                "accountant is only valid for a fixed population"
            )
        cohort = self._rng.sample(nodes, self.cohort_size)
        self._draws.append(CohortDraw(server_round=server_round, cohort_size=self.cohort_size,
                                      population_size=self.population_size))
        log(INFO, "configure_train: cohort of %d drawn from %d nodes (%s)", self.cohort_size,
            self.population_size, "secure source" if self.secure_rng else "seeded, not private")
        return cohort

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Draw this round's cohort and build one train message per member (as FedAvg does)."""
        cohort = self.draw_cohort(server_round, grid)
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._construct_messages(record, cohort, MessageType.TRAIN)


# ----------------------------------------------------------------------------------- the accountant
class FedprivacyAccountant:
    """fedprivacy's ledger (PLD by default) implementing ``flwr.serverapp.PrivacyAccountant``.

    Args:
        config: Flower's ``PrivacyConfig``. ``NO_AMPLIFICATION`` accounts every release without
            sampling credit and works with Flower's DP strategies as they are (see ``adjacency``).
            ``WITHOUT_REPLACEMENT`` (replace-one) needs ``sampler`` and accounts each release as a
            fixed-size cohort of ``sample_size`` out of ``population_size``, replace-one. ``POISSON``
            is refused (module docstring).
        backend: fedprivacy accountant backend, "pld" (default, tightest) or "rdp".
        sampler: the :class:`SecureCohortFedAvg` whose draws the releases come from (amplified
            accounting only).
        adjacency: the relation the figure is claimed under, with ``NO_AMPLIFICATION``:
            ``"replace-one"`` (default; sensitivity ``2C``) or ``"zero-out"`` (sensitivity ``C``, Flower's
            own figure); never add/remove (module docstring). With ``WITHOUT_REPLACEMENT`` it is
            ``"replace-one"``.

    The budget ``config.max_epsilon`` is checked by ``would_exceed`` (which Flower's strategies call
    before a round); ``compose`` records what was released and never refuses it for the budget.
    """

    def __init__(
        self,
        config: PrivacyConfig,
        *,
        backend: str = "pld",
        sampler: SecureCohortFedAvg | None = None,
        adjacency: str | None = None,
    ) -> None:
        if not isinstance(config, PrivacyConfig):
            raise TypeError(f"config must be a flwr PrivacyConfig, got {type(config).__name__}")
        method = config.sampling_method
        if method is SamplingMethod.POISSON:
            raise ValueError(
                "sampling_method='poisson' is refused: no Flower strategy samples clients by "
                "Poisson sampling (FedAvg draws a fixed-size cohort), so Poisson amplification "
                "cannot be verified; use 'no-amplification', or 'without-replacement' with a "
                "SecureCohortFedAvg sampler"
            )
        if method is SamplingMethod.WITHOUT_REPLACEMENT:
            if not isinstance(sampler, SecureCohortFedAvg):
                raise ValueError(
                    "sampling_method='without-replacement' needs sampler=SecureCohortFedAvg(...): "
                    "only a cohort fedprivacy drew itself is accounted with amplification"
                )
            if sampler.population_size != config.population_size:
                raise ValueError(
                    f"sampler.population_size ({sampler.population_size}) must equal "
                    f"config.population_size ({config.population_size})"
                )
            if not sampler.secure_rng:
                raise ValueError(
                    "sampler draws with a seeded generator: its cohorts are predictable, so "
                    "amplification by sampling does not hold; use the default secure source"
                )
        elif sampler is not None:
            raise ValueError("sampler is only used with sampling_method='without-replacement'")
        allowed = ("replace-one",) if method is SamplingMethod.WITHOUT_REPLACEMENT else ("replace-one", "zero-out")
        adjacency = allowed[0] if adjacency is None else adjacency
        if adjacency not in allowed:
            raise ValueError(
                f"adjacency must be one of {', '.join(map(repr, allowed))} with sampling_method="
                f"{method.value!r}, got {adjacency!r}"
            )
        # zero-out: sensitivity C (the ledger computes it under its add-remove setting, the same sensitivity;
        # the saved state labels it zero-out); replace-one: 2C (module docstring)
        neighbouring = Neighbouring.ADD_REMOVE if adjacency == "zero-out" else Neighbouring.REPLACE_ONE
        self._adjacency = adjacency
        self._config = config
        self._sampler = sampler
        self._ledger = Accountant(backend=backend, neighbouring=neighbouring, unit="user")

    # ------------------------------------------------------------------ protocol: properties
    @property
    def config(self) -> PrivacyConfig:
        """Flower's privacy configuration this accountant was built with."""
        return self._config

    @property
    def adjacency(self) -> str:
        """The relation the figure holds under: "replace-one" (sensitivity 2C, or a secure fixed-size
        cohort) or "zero-out" (sensitivity C)."""
        return self._adjacency

    @property
    def num_releases(self) -> int:
        """Number of composed releases (sum of counts)."""
        return self._ledger.steps

    @property
    def ledger(self) -> Accountant:
        """The fedprivacy ledger behind this adapter (read it; spend through ``compose``). With
        ``adjacency="zero-out"`` its relation setting is ``add-remove`` (the same sensitivity C); the
        claim is zero-out (:attr:`adjacency`, and the saved state says so)."""
        return self._ledger

    # ------------------------------------------------------------------ events
    def _event(self, event: Any, count: int) -> tuple[PrivacyEvent, CohortDraw | None]:
        """fedprivacy's event for ``count`` releases of Flower's ``event``; mutates nothing."""
        if not isinstance(event, GaussianPrivacyEvent):
            raise TypeError(f"event must be a GaussianPrivacyEvent, got {type(event).__name__}")
        count = _check_count(count)
        if event.population_size != self._config.population_size:
            raise ValueError(
                f"event.population_size must equal config.population_size "
                f"({self._config.population_size}), got {event.population_size}"
            )
        mechanism = GaussianEvent(noise_multiplier=float(event.noise_multiplier))
        if self._sampler is None:
            return PrivacyEvent(mechanism=mechanism, sampling=NoSampling(), count=count), None
        draw = self._sampler.pending_draw()
        if draw is None:
            raise ValueError(
                "no pending cohort draw of the sampler: a release is accounted with amplification "
                "only against the cohort SecureCohortFedAvg drew for it"
            )
        if count != 1:
            raise ValueError(f"count must be 1 for a sampled release (one per draw), got {count}")
        if event.sample_size != draw.cohort_size:
            raise ValueError(
                f"event.sample_size must equal the drawn cohort ({draw.cohort_size}), "
                f"got {event.sample_size}"
            )
        sampling = FixedCohortSampling(cohort=draw.cohort_size, population=draw.population_size)
        return PrivacyEvent(mechanism=mechanism, sampling=sampling, count=1), draw

    def compose(self, event: GaussianPrivacyEvent, count: int = 1) -> None:
        """Record ``count`` releases of ``event``. Raises before any change if it cannot."""
        ours, draw = self._event(event, count)
        self._ledger.spend(ours, round=None if draw is None else draw.server_round)
        if draw is not None and self._sampler is not None:
            self._sampler.mark_accounted(draw)

    # ------------------------------------------------------------------ queries
    def get_epsilon(self, delta: float) -> float:
        """Cumulative epsilon at ``delta`` (an upper bound; 0.0 before any release)."""
        return self._ledger.epsilon(delta=delta)

    def get_delta(self, epsilon: float) -> float:
        """Smallest delta (within a relative 1e-9) at which the releases are ``epsilon``-DP.

        An upper bound: it bisects ``get_epsilon`` in log(delta) and returns the upper end of the
        bracket, whose epsilon is at most ``epsilon`` (epsilon(delta) is non-increasing).
        """
        if isinstance(epsilon, bool) or not isinstance(epsilon, int | float):
            raise TypeError(f"epsilon must be a real number, got {type(epsilon).__name__}")
        if not (math.isfinite(epsilon) and epsilon >= 0):
            raise ValueError(f"epsilon must be >= 0 and finite, got {epsilon}")
        if self.num_releases == 0:
            return 0.0
        lo, hi = 1e-300, 1.0 - 1e-12
        if self.get_epsilon(hi) > epsilon:
            return 1.0
        if self.get_epsilon(lo) <= epsilon:
            return lo
        while math.log(hi) - math.log(lo) > DELTA_RELATIVE_TOLERANCE:
            mid = math.sqrt(lo * hi)
            if self.get_epsilon(mid) <= epsilon:
                hi = mid
            else:
                lo = mid
        return hi

    def get_privacy_spent(self, delta: float | None = None) -> PrivacySpent:
        """Epsilon at ``delta`` (default ``config.target_delta``) with the release count."""
        target = self._config.target_delta if delta is None else delta
        return PrivacySpent(
            epsilon=self.get_epsilon(target),
            delta=target,
            num_releases=self.num_releases,
            accounting_method=f"fedprivacy-{self._ledger.backend}",
            optimal_order=None,
        )

    def would_exceed(
        self,
        event: GaussianPrivacyEvent,
        max_epsilon: float | None = None,
        count: int = 1,
    ) -> bool:
        """Whether composing ``event`` next would take epsilon at ``target_delta`` above the limit.

        The limit is ``max_epsilon`` if given, else ``config.max_epsilon`` (ValueError if neither).
        Changes nothing.
        """
        limit = self._config.max_epsilon if max_epsilon is None else max_epsilon
        if limit is None:
            raise ValueError("max_epsilon must be given here or in PrivacyConfig.max_epsilon")
        limit = _check_positive_finite("max_epsilon", limit)
        ours, _ = self._event(event, count)
        return self._ledger.epsilon_if(ours, delta=self._config.target_delta) > limit

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, object]:
        """JSON-serialisable state: Flower's config and fedprivacy's ledger."""
        return {
            "schema_version": STATE_SCHEMA_VERSION,
            "backend": f"fedprivacy-{self._ledger.backend}",
            "config": _config_dict(self._config),
            "adjacency": self._adjacency,
            "ledger": self._labelled(self._ledger.to_json()),
        }

    def _labelled(self, ledger: dict[str, Any]) -> dict[str, Any]:
        """The ledger's JSON with the relation its figure holds under (zero-out is composed by the
        ledger's add-remove setting at sensitivity C, but is not an add-remove claim)."""
        if self._adjacency == "zero-out":
            return {**ledger, "neighbouring": "zero-out"}
        return ledger

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore ``state_dict()`` output; every field is validated before anything changes."""
        if not isinstance(state, Mapping):
            raise ValueError(f"state must be a dict, got {type(state).__name__}")
        if set(state) != {"schema_version", "backend", "config", "adjacency", "ledger"}:
            raise ValueError(
                "state fields must be adjacency, backend, config, ledger, schema_version, got "
                f"{sorted(state)}"
            )
        if state["schema_version"] != STATE_SCHEMA_VERSION:
            raise ValueError(
                f"state schema_version must be {STATE_SCHEMA_VERSION}, got {state['schema_version']!r}"
            )
        if state["backend"] != f"fedprivacy-{self._ledger.backend}":
            raise ValueError(
                f"state backend must be 'fedprivacy-{self._ledger.backend}', got {state['backend']!r}"
            )
        if state["config"] != _config_dict(self._config):
            raise ValueError(
                f"state config {state['config']!r} does not match this accountant's config "
                f"{_config_dict(self._config)!r}"
            )
        if state["adjacency"] != self._adjacency:
            raise ValueError(
                f"state adjacency {state['adjacency']!r} does not match this accountant's "
                f"{self._adjacency!r}"
            )
        ledger_state = state["ledger"]
        if not isinstance(ledger_state, Mapping):
            raise ValueError(f"state ledger must be a dict, got {type(ledger_state).__name__}")
        if self._adjacency == "zero-out":
            if ledger_state.get("neighbouring") != "zero-out":
                raise ValueError("state ledger was kept under another relation: "
                                 f"{ledger_state.get('neighbouring')!r}, not 'zero-out'")
            ledger_state = {**ledger_state, "neighbouring": Neighbouring.ADD_REMOVE.value}
        ledger = Accountant.from_json(ledger_state)
        if (ledger.backend, ledger.neighbouring, ledger.unit) != (
            self._ledger.backend, self._ledger.neighbouring, self._ledger.unit
        ):
            raise ValueError(
                "state ledger was kept under another backend, relation or unit: "
                f"{ledger.backend}/{ledger.neighbouring.value}/{ledger.unit}"
            )
        wanted = FixedCohortSampling if self._sampler is not None else NoSampling
        for i, entry in enumerate(ledger.ledger):
            if not isinstance(entry.event.sampling, wanted):
                raise ValueError(
                    f"state ledger entry {i} has sampling {entry.event.sampling.describe()}, "
                    f"not what this accountant's config accounts"
                )
        self._ledger = ledger


def attach_accountant(
    strategy: DifferentialPrivacyFixedClippingBase, accountant: FedprivacyAccountant
) -> None:
    """Give a Flower fixed-clipping DP strategy an amplified :class:`FedprivacyAccountant`.

    Flower's constructors refuse every accountant whose config is not ``NO_AMPLIFICATION``, because
    FedAvg's own draw cannot be proven (module docstring). For a strategy wrapping the very
    :class:`SecureCohortFedAvg` the accountant was built with, this repeats Flower's other checks
    (positive noise multiplier, ``FedAvg`` aggregation), checks that ``num_sampled_clients`` is the
    cohort size, and sets ``strategy.accountant``. An unamplified accountant can be passed to Flower's
    constructor directly (``accountant=``).
    """
    if not isinstance(strategy, DifferentialPrivacyFixedClippingBase):
        raise TypeError(
            "strategy must be a Flower fixed-clipping DP strategy, got "
            f"{type(strategy).__name__}"
        )
    if not isinstance(accountant, FedprivacyAccountant):
        raise TypeError(f"accountant must be a FedprivacyAccountant, got {type(accountant).__name__}")
    if strategy.accountant is not None:
        raise ValueError("strategy already has an accountant")
    sampler = accountant._sampler  # noqa: SLF001 (same module)
    if sampler is None:
        raise ValueError(
            "accountant is not amplified: pass it to the strategy's constructor (accountant=)"
        )
    if strategy.strategy is not sampler:
        raise ValueError("strategy must wrap the SecureCohortFedAvg the accountant was built with")
    if type(sampler).aggregate_train is not FedAvg.aggregate_train:
        raise ValueError("the sampler must aggregate with FedAvg.aggregate_train")
    if not strategy.noise_multiplier > 0:
        raise ValueError(
            f"strategy.noise_multiplier must be > 0 for accounting, got {strategy.noise_multiplier}"
        )
    if strategy.num_sampled_clients != sampler.cohort_size:
        raise ValueError(
            f"strategy.num_sampled_clients ({strategy.num_sampled_clients}) must equal the "
            f"sampler's cohort_size ({sampler.cohort_size})"
        )
    # Typed ``PrivacyAccountant | None`` in Flower: mypy checks the protocol structurally here.
    strategy.accountant = accountant
