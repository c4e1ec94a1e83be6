"""What every privacy mode is made of: the :class:`PrivacyMode` protocol, the transports a round can
use, the two round shapes (plain and secure) and the claim every DP mode publishes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedprivacy.fl.aggregation import Aggregator
from fedprivacy.fl.types import Exchange, RoundFn, RoundInstructions, RoundOutcome, RoundRecord

if TYPE_CHECKING:
    from fedprivacy.accounting.accountant import Accountant
    from fedprivacy.config import RunConfig
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.fl.mechanisms import ClientMechanism, ServerMechanism
    from fedprivacy.fl.privacy import PrivacyPlan
    from fedprivacy.fl.secure.noise import ServerNoise
    from fedprivacy.fl.secure.server import SecureTransport

__all__ = ["Disclosure", "PrivacyMode", "Transport", "plain_round", "privacy_block", "secure_round"]

_UNCOVERED = "who takes part is seen by the server in this mode and not covered by ε"


@dataclass(frozen=True, slots=True, kw_only=True)
class Disclosure:
    """What a run's published outputs may carry beside the ε-covered model and ε.

    Attributes:
        participation: per-round client counts, the round's secure-aggregation figures and wall times
            (a round's time grows with its cohort) are published; else they go to the server's private
            log only.
        unnoised: the per-round train loss (the mean of the clients' un-noised losses) is published.
        note: the participation block's sentence for the claim.
    """

    participation: bool
    unnoised: bool = True
    note: str = _UNCOVERED

    @classmethod
    def published(cls) -> Disclosure:
        """Everything published, none of it covered by ε (the server sees who takes part anyway)."""
        return cls(participation=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class Transport:
    """How the server reaches its clients; a mode takes the shape its rounds need.

    Attributes:
        exchange: one train message per sampled client (plain rounds).
        secure: the four-stage exchange of secure aggregation (``secagg = true``).
    """

    exchange: Exchange | None = None
    secure: SecureTransport | None = None


class PrivacyMode(Protocol):
    """One privacy mode: where the noise is added, how a round runs, what the run claims, what may be
    published. Everything a mode's name means lives here; nothing outside :mod:`fedprivacy.fl.modes`
    tests the name.

    A mode is an object; :mod:`fedprivacy.fl.modes` keeps the built-in ones in one registry
    (``MODES``) that the config's ``privacy`` key is checked against. ``FederatedRun(mode=...)`` takes
    any object with these members, registered or not.

    Attributes:
        name: the ``privacy`` value that selects it.
        trusted_server: the server may see one client's update without that client's noise.
        client_mechanism: the noise each client adds to its clipped update (travels by name in the
            round's instructions), or None.
        server_mechanism: the noise the trusted server adds to the sum, or None.
        secure_noise: the noise is added inside secure aggregation (the secure transport checks it).
        covers: the privacy report's "What ε covers" lines (empty: no DP, the report claims nothing).
            A mode with neither mechanism nor ``secure_noise`` has no DP: its plan charges nothing and it
            reports no ε (:func:`fedprivacy.fl.mechanisms.check_plan` refuses anything else).
    """

    name: str
    trusted_server: bool
    client_mechanism: ClientMechanism | None
    server_mechanism: ServerMechanism | None
    secure_noise: bool
    covers: tuple[str, ...]

    def check(self, cfg: RunConfig) -> None:
        """Refuse a config this mode cannot honour (ConfigError naming the key), before anything starts."""
        ...

    def disclosure(self, cfg: RunConfig) -> Disclosure:
        """What the run's published outputs may carry."""
        ...

    def plan(self, cfg: RunConfig, *, population: int, dim: int | None) -> PrivacyPlan:
        """The plan: denominator, noise, and the worst-case event the budget check uses before a round
        (``dim``: the number of model parameters the clients send)."""
        ...

    def round_fn(self, cfg: RunConfig, plan: PrivacyPlan, transport: Transport, *,
                 aggregator: Aggregator | None = None, log: Callable[[str], None] = print) -> RoundFn:
        """The function that runs one round over ``transport`` (``aggregator`` overrides the mode's)."""
        ...

    def summary(self, cfg: RunConfig, plan: PrivacyPlan, records: Sequence[RoundRecord], *,
                accountant: Accountant | None, rng: RandomSource) -> dict[str, Any]:
        """The ``privacy`` block of ``results.json`` (and of the privacy report)."""
        ...


def plain_round(exchange: Exchange, aggregator: Aggregator, *, denominator: float,
                release: str = "aggregate", sensitivity_ratio: float = 1.0) -> RoundFn:
    """A round = one exchange of train messages, then aggregation in the clear (or with server noise).

    ``release`` is where what the round releases first becomes observable, where the write-ahead
    charge happens (:func:`fedprivacy.fl.charging.before_release`): ``"aggregate"`` (the server's
    noised aggregate: central, none) or ``"exchange"`` (each client's noised update: local).
    ``sensitivity_ratio``: what the aggregator declared (:func:`fedprivacy.fl.robust.sensitivity_ratio`),
    stamped on its result for :func:`fedprivacy.fl.mechanisms.check_release`.
    """
    from fedprivacy.fl.charging import before_release

    if release not in ("aggregate", "exchange"):
        raise ValueError(f"release must be 'aggregate' or 'exchange', got {release!r}")

    def run(instr: RoundInstructions, cohort: Sequence[int], weights: Sequence[np.ndarray],
            rng: RandomSource) -> RoundOutcome:
        if release == "exchange":
            before_release()
        updates, failures = exchange(instr, cohort, weights)
        if release == "aggregate":
            before_release()
        agg = aggregator.aggregate(updates, like=weights, denominator=denominator, rng=rng)
        if sensitivity_ratio != 1.0:
            agg = dataclasses.replace(agg, sensitivity_ratio=sensitivity_ratio)
        return RoundOutcome(aggregate=agg, failures=dict(failures), updates=tuple(updates))

    return run


def exchange_of(transport: Transport, cfg: RunConfig) -> Exchange:
    """The plain exchange, refusing to fall back to updates in the clear when ``secagg = true``."""
    if cfg.secagg:
        raise ValueError(f"secagg=true with privacy={cfg.privacy!r} needs the secure round")
    if transport.exchange is None:
        raise ValueError("this round needs a transport with an exchange (one train message per client)")
    return transport.exchange


def secure_round(cfg: RunConfig, plan: PrivacyPlan, transport: Transport, *,
                 aggregator: Aggregator | None, log: Callable[[str], None],
                 server_noise: ServerNoise | None = None, denominator: float | None = None) -> RoundFn:
    """The secure-aggregation round (:class:`fedprivacy.fl.secure.SecureRound`); with
    ``server_noise`` (:mod:`fedprivacy.fl.secure.noise`) the server adds it to the unmasked sum;
    ``denominator``: the mean's (default: the expected cohort)."""
    from fedprivacy.fl.secure.server import SecureRound

    if transport.secure is None:
        raise ValueError("secagg=true needs a secure transport (fedprivacy.fl.secure.SecureTransport); "
                         "updates are never sent in the clear")
    if aggregator is not None:
        raise ValueError("a custom aggregator cannot run under secure aggregation: the server only "
                         "ever sees the sum")
    return SecureRound(cfg, transport.secure, population=plan.population, log=log, server_noise=server_noise,
                       denominator=denominator)


def privacy_block(cfg: RunConfig, plan: PrivacyPlan, accountant: Accountant | None,
                  rng: RandomSource) -> dict[str, Any]:
    """The claim of a run (STYLE: unit, adjacency, mechanism, C, σ, sampling, rounds, accountant, ε, δ)."""
    rng_mode = "seeded" if cfg.seeded else "secure"
    if accountant is None:
        return {"mode": "none", "epsilon": None, "delta": None, "unit": "none", "rng_mode": rng_mode,
                "rng": rng.describe()}
    eps = accountant.epsilon(delta=cfg.target_delta)
    block: dict[str, Any] = {
        "mode": plan.mode, "unit": plan.unit, "adjacency": plan.adjacency_label,
        "mechanism": plan.mechanism, "clip_norm": plan.clip_norm,
        "noise_multiplier": plan.noise_multiplier, "noise_std": plan.noise_multiplier * plan.clip_norm,
        "calibrated": plan.calibrated, "sampling": plan.sampling_description,
        "sample_rate": cfg.sample_rate if cfg.sampling == "poisson" else None,
        "cohort_size": cfg.cohort_size if cfg.sampling == "fixed" else None,
        "population": plan.population, "denominator": plan.denominator, "rounds": accountant.steps,
        "accountant": cfg.accountant, "epsilon": eps, "delta": cfg.target_delta,
        "budget": (f"ε ≤ {cfg.target_epsilon:g} at δ = {cfg.target_delta:g}" if cfg.target_epsilon > 0
                   else None),
        "rng_mode": rng_mode, "rng": rng.describe(),
    }
    if plan.adaptive_clip is not None:
        block["clip_norm"] = f"adaptive, initial {plan.clip_norm:g} (per round in rounds[].clip_norm)"
        block["noise_std"] = None  # z_Δ · C_r changes with the clip norm
        block["adaptive_clip"] = plan.adaptive_clip.to_json()
    try:
        block["accountant_claim"] = accountant.claim(delta=cfg.target_delta)
    except Exception as exc:  # the claim is a convenience; never lose the results over it
        block["accountant_claim"] = {"error": str(exc)}
    return block
