"""The privacy modes whose server sees the (clipped) updates or a plain sum: ``none``, ``central``,
``local``.

* ``central`` (trusted server, DP-FedAvg; McMahan et al. 2018, Alg. 1): the server adds N(0, (σC)²) to
  the sum of clipped updates. Unit: user (one client's whole data set). Event per round:
  ``Gaussian(z=σ)`` under the sampling that ran: Poisson(q) with amplification under add-remove, or a
  fixed cohort of m of N (without replacement, replace-one only).
* ``local`` (untrusted server): each participating client adds N(0, (σC)²) to its own clipped update.
  The server sees who took part, so there is *no* amplification by sampling, and the worst-case client
  takes part every round. Any two clipped inputs are ≤ 2C apart, so the claim is about replace-one
  adjacency of one client's input: ``Gaussian(z=σ)`` composed once per round, replace-one.
* ``none``: nothing is accounted; ε is reported as ``null``. With ``secagg = true`` the server sees only
  the fixed-point sum (:class:`fedprivacy.fl.secure.SecureRound`).

Calibration: with ``target-epsilon > 0`` and ``noise-multiplier = 0`` the smallest σ with
ε(σ, sampling, T rounds, δ) ≤ target is found by :func:`fedprivacy.accounting.calibration.
calibrate_noise_multiplier` (never overshoots).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fedprivacy.fl.adaptive_clip import AdaptiveClipRound, adaptive_clip_spec
from fedprivacy.fl.aggregation import Aggregator
from fedprivacy.fl.mechanisms import GAUSSIAN, GAUSSIAN_SUM, ClientMechanism, ServerMechanism
from fedprivacy.fl.modes.base import (
    Disclosure,
    Transport,
    exchange_of,
    plain_round,
    privacy_block,
    secure_round,
)
from fedprivacy.fl.privacy import PrivacyPlan, denominator_of, sampling_description, sampling_object
from fedprivacy.fl.robust import make_aggregator, sensitivity_ratio
from fedprivacy.fl.types import RoundFn, RoundRecord

if TYPE_CHECKING:
    from fedprivacy.accounting.accountant import Accountant
    from fedprivacy.accounting.events import Sampling
    from fedprivacy.config import RunConfig
    from fedprivacy.dp.rng import RandomSource

__all__ = ["CentralMode", "LocalMode", "NoneMode"]


class NoneMode:
    """No differential privacy: updates clipped (``clip-norm > 0``) and averaged; nothing accounted."""

    name = "none"
    trusted_server = True
    covers: tuple[str, ...] = ()  # no DP: the report claims nothing
    client_mechanism: ClientMechanism | None = None
    server_mechanism: ServerMechanism | None = None
    secure_noise = False

    def check(self, cfg: RunConfig) -> None:
        if cfg.target_epsilon > 0:
            raise ValueError(f"target-epsilon must be 0 when privacy={self.name!r} (nothing is accounted), got "
                             f"{cfg.target_epsilon:g}; set target-epsilon=0 or choose a DP privacy mode")
        if cfg.adaptive_clip and cfg.secagg:
            raise ValueError("adaptive-clip=true with secagg=true needs privacy='distributed' (the count "
                             "bit travels inside secure aggregation with its own discrete noise)")

    def disclosure(self, cfg: RunConfig) -> Disclosure:
        return Disclosure.published()

    def plan(self, cfg: RunConfig, *, population: int, dim: int | None = None) -> PrivacyPlan:
        denominator = denominator_of(cfg, population=population)
        return PrivacyPlan(mode="none", population=population, denominator=denominator,
                           clip_norm=cfg.clip_norm, noise_multiplier=0.0, calibrated=False,
                           central_noise_std=0.0, local_noise_std=0.0, unit="none",
                           neighbouring=cfg.neighbouring,
                           sampling_description=sampling_description(cfg, population=population),
                           event=None, target_delta=cfg.target_delta, target_epsilon=0.0,
                           adaptive_clip=(adaptive_clip_spec(cfg, noise_multiplier=0.0,
                                                             denominator=denominator)
                                          if cfg.adaptive_clip else None))

    def round_fn(self, cfg: RunConfig, plan: PrivacyPlan, transport: Transport, *,
                 aggregator: Aggregator | None = None, log: Callable[[str], None] = print) -> RoundFn:
        if cfg.secagg:
            return secure_round(cfg, plan, transport, aggregator=aggregator, log=log)
        if plan.adaptive_clip is not None:
            return _adaptive_round(cfg, plan, transport, aggregator)
        agg = aggregator or make_aggregator(cfg, clip_norm=cfg.clip_norm)
        return plain_round(exchange_of(transport, cfg), agg, denominator=plan.denominator)

    def summary(self, cfg: RunConfig, plan: PrivacyPlan, records: Sequence[RoundRecord], *,
                accountant: Accountant | None, rng: RandomSource) -> dict[str, Any]:
        return privacy_block(cfg, plan, accountant, rng)


class _GaussianMode:
    """``Gaussian(z=σ)`` once per round on clipped updates; where the noise goes is the subclass's."""

    name = ""
    mechanism = ""
    trusted_server = False
    client_mechanism: ClientMechanism | None = None
    server_mechanism: ServerMechanism | None = None
    secure_noise = False
    #: the sampling amplifies the ε (the server keeps who takes part secret); else no amplification
    amplified = True

    def check(self, cfg: RunConfig) -> None:
        if cfg.noise_multiplier == 0 and cfg.target_epsilon == 0:
            raise ValueError(
                f"noise-multiplier must be > 0 (or target-epsilon > 0 to calibrate it) when "
                f"privacy={self.name!r}, got {cfg.noise_multiplier}; set e.g. noise-multiplier=1.0")

    def neighbouring(self, cfg: RunConfig) -> str:
        """The adjacency the claim is about (a client mechanism's clipped inputs: replace-one)."""
        return cfg.neighbouring if self.amplified else "replace-one"

    def sampling(self, cfg: RunConfig, population: int) -> Sampling:
        """The sampling the accountant sees (none where the server sees who takes part)."""
        from fedprivacy.accounting.events import NoSampling

        return sampling_object(cfg, population) if self.amplified else NoSampling()

    def _sigma(self, cfg: RunConfig, population: int) -> tuple[float, bool]:
        """σ as configured, or calibrated to the target (then ``True``)."""
        if cfg.noise_multiplier > 0:
            return cfg.noise_multiplier, False
        from fedprivacy.accounting.calibration import calibrate_noise_multiplier
        from fedprivacy.accounting.events import Neighbouring

        sigma = calibrate_noise_multiplier(
            target_epsilon=cfg.target_epsilon, target_delta=cfg.target_delta,
            sampling=self.sampling(cfg, population), steps=cfg.num_server_rounds,
            backend=cfg.accountant, neighbouring=Neighbouring.parse(self.neighbouring(cfg)))
        return float(sigma), True

    def plan(self, cfg: RunConfig, *, population: int, dim: int | None = None) -> PrivacyPlan:
        from fedprivacy.accounting.events import Neighbouring, PrivacyEvent

        sigma, calibrated = self._sigma(cfg, population)
        released = (self.server_mechanism.event(noise_multiplier=sigma, clip_norm=cfg.clip_norm, dim=dim)
                    if self.server_mechanism is not None
                    else self._client().event(noise_multiplier=sigma, dim=dim))
        event = PrivacyEvent(mechanism=released, sampling=self.sampling(cfg, population), count=1)
        desc = sampling_description(cfg, population=population)
        if not self.amplified:
            desc += "; local DP: no amplification (the server sees who takes part)"
        std = (self.server_mechanism.noise_std(clip_norm=cfg.clip_norm, noise_multiplier=sigma)
               if self.server_mechanism is not None else sigma * cfg.clip_norm)
        plan = PrivacyPlan(
            mode=self.name, population=population, denominator=denominator_of(cfg, population=population),
            clip_norm=cfg.clip_norm, noise_multiplier=sigma, calibrated=calibrated,
            central_noise_std=std if self.server_mechanism is not None else 0.0,
            local_noise_std=std if self.client_mechanism is not None else 0.0,
            unit="user (all data of one client)",
            neighbouring=Neighbouring.parse(self.neighbouring(cfg)).value, sampling_description=desc,
            event=event, target_delta=cfg.target_delta, target_epsilon=cfg.target_epsilon,
            mechanism=self.mechanism)
        if cfg.adaptive_clip and self.server_mechanism is not None:
            # Andrew et al. 2021, Thm. 1: the update's multiplier is raised so that it and the noised
            # clipped count together are one Gaussian of multiplier sigma (the event above).
            spec = adaptive_clip_spec(cfg, noise_multiplier=sigma, denominator=plan.denominator)
            plan = dataclasses.replace(
                plan, adaptive_clip=spec, central_noise_std=spec.update_noise_multiplier * cfg.clip_norm,
                mechanism=self.mechanism + " with an adaptive clip norm (Andrew et al. 2021)")
        return plan

    def _client(self) -> ClientMechanism:
        if self.client_mechanism is None:
            raise TypeError(f"privacy mode {self.name!r} names neither a client nor a server mechanism")
        return self.client_mechanism

    def disclosure(self, cfg: RunConfig) -> Disclosure:
        return Disclosure.published()

    def summary(self, cfg: RunConfig, plan: PrivacyPlan, records: Sequence[RoundRecord], *,
                accountant: Accountant | None, rng: RandomSource) -> dict[str, Any]:
        block = privacy_block(cfg, plan, accountant, rng)
        if not cfg.secagg:
            return block
        from fedprivacy.fl.modes.central_secure import secure_central_summary

        return secure_central_summary(block, cfg, plan, accountant)


_CENTRAL_PRIVATE = ("per-round client counts, the train loss (the mean of the clients' un-noised losses) and "
                    "the rounds' wall times (a round's time grows with its cohort) are left out of the "
                    "published outputs (ε covers none of them); the server keeps them in its private log; "
                    "the run's total time is published")
_CENTRAL_PUBLISHED = ("publish-participation=true: per-round client counts and the train loss are in the outputs "
                      "and are NOT covered by ε (with sampling the counts disclose who took part; the train loss "
                      "is the mean of the clients' un-noised losses)")


class CentralMode(_GaussianMode):
    """A trusted server adds N(0, (σC)²) to the sum of the clipped updates it re-clipped."""

    name = "central"
    mechanism = "Gaussian on the sum of clipped updates (server-side noise)"
    trusted_server = True
    covers: tuple[str, ...] = (
        "- Covers: the sequence of released global models (and anything computed from them, such as "
         "the test accuracy), against anyone who sees them, for the unit above.",
        "- Trusts: the server. It sees each sampled client's clipped, un-noised update before adding "
         "the noise.",
        "- Does not cover: the train loss (the mean of clients' un-noised losses, a diagnostic kept in "
         "the server's private log unless publish-participation=true), and timing.",
        "- Assumes: who took part in each round stays secret from the audience (the ε uses amplification "
         "by client sampling): the server keeps the cohorts and counts in the run folder's owner-only "
         "`private/` and `checkpoint/`; anyone who learns them faces the un-amplified Gaussian.",
    )
    server_mechanism: ServerMechanism | None = GAUSSIAN_SUM

    def check(self, cfg: RunConfig) -> None:
        super().check(cfg)
        if cfg.secagg and cfg.adaptive_clip:
            raise ValueError("adaptive-clip=true with privacy='central' and secagg=true is not implemented "
                             "(the clipped count would need its own noise in the sum); set secagg=false, "
                             "or privacy='distributed'")

    def covers_for(self, cfg: RunConfig) -> tuple[str, ...]:
        """The report's lines: over secure aggregation the server sees only the exact sum."""
        from fedprivacy.fl.modes.central_secure import COVERS

        return COVERS if cfg.secagg else self.covers

    def plan(self, cfg: RunConfig, *, population: int, dim: int | None = None) -> PrivacyPlan:
        if not cfg.secagg:
            return super().plan(cfg, population=population, dim=dim)
        from fedprivacy.fl.modes.central_secure import secure_central_plan

        return secure_central_plan(cfg, population=population, dim=dim, mechanism=self.mechanism)

    def disclosure(self, cfg: RunConfig) -> Disclosure:
        """With client sampling the number of clients in a round is itself a disclosure (at N = 10,
        q = 0.5 a full cohort has probability ~1e-3, far above δ) that the amplified ε does not
        cover, and so are the un-noised train loss and the rounds' times; ``publish-participation``
        publishes them, uncovered."""
        if cfg.publish_participation:
            return Disclosure(participation=True, note=_CENTRAL_PUBLISHED)
        return Disclosure(participation=False, unnoised=False, note=_CENTRAL_PRIVATE)

    def round_fn(self, cfg: RunConfig, plan: PrivacyPlan, transport: Transport, *,
                 aggregator: Aggregator | None = None, log: Callable[[str], None] = print) -> RoundFn:
        if cfg.secagg:  # the server adds its noise to the unmasked sum (fedprivacy.fl.modes.central_secure)
            from fedprivacy.fl.secure.noise import GaussianSumNoise

            return secure_round(cfg.replace(noise_multiplier=plan.noise_multiplier), plan, transport,
                                aggregator=aggregator, log=log,
                                server_noise=GaussianSumNoise(noise_multiplier=plan.noise_multiplier))
        if plan.adaptive_clip is not None:
            return _adaptive_round(cfg, plan, transport, aggregator)
        agg = aggregator or make_aggregator(cfg, clip_norm=cfg.clip_norm,
                                            noise_std=plan.noise_multiplier * cfg.clip_norm,
                                            neighbouring=plan.neighbouring)
        # the rule's own sensitivity, declared by the object that aggregates (a rule without one is refused)
        ratio = sensitivity_ratio(agg, plan.neighbouring)
        check_cohort = getattr(agg, "check_cohort", None)
        if callable(check_cohort):
            check_cohort(plan.denominator)
        return plain_round(exchange_of(transport, cfg), agg, denominator=plan.denominator,
                           sensitivity_ratio=ratio)


class LocalMode(_GaussianMode):
    """Each client adds N(0, (σC)²) to its own clipped update; the server sums what arrives."""

    name = "local"
    mechanism = "Gaussian on each clipped update (client-side noise)"
    client_mechanism: ClientMechanism | None = GAUSSIAN
    amplified = False
    covers: tuple[str, ...] = (
        "- Covers: each client's released update, against the server and everyone else; no trust in "
         "the server. Clients do not disclose losses or example counts.",
        "- Worst case: a client that takes part in every round. No amplification by sampling is "
         "claimed, because the server sees who takes part.",
    )

    def check(self, cfg: RunConfig) -> None:
        super().check(cfg)
        if cfg.adaptive_clip:
            raise ValueError(
                f"adaptive-clip=true is implemented for privacy='central', 'distributed' and 'none', got "
                f"{self.name!r} (local mode has no private count of the clipped updates)")
        if cfg.secagg:
            raise ValueError(f"secagg=true with privacy={self.name!r} is not supported; set secagg=false for "
                             "local DP, or privacy='distributed'")

    def round_fn(self, cfg: RunConfig, plan: PrivacyPlan, transport: Transport, *,
                 aggregator: Aggregator | None = None, log: Callable[[str], None] = print) -> RoundFn:
        agg = aggregator or make_aggregator(cfg, clip_norm=0.0)  # post-processing of noised updates
        # The clients' noised updates are the release: charge before the train messages go out.
        return plain_round(exchange_of(transport, cfg), agg, denominator=plan.denominator,
                           release="exchange")


def _adaptive_round(cfg: RunConfig, plan: PrivacyPlan, transport: Transport,
                    aggregator: Aggregator | None) -> RoundFn:
    """The plain round with an adaptive clip norm (:mod:`fedprivacy.fl.adaptive_clip`)."""
    if aggregator is not None:
        raise ValueError("adaptive-clip=true chooses its own aggregation (clip to the round's estimate); "
                         "a custom aggregator cannot be combined with it")
    assert plan.adaptive_clip is not None
    return AdaptiveClipRound(exchange_of(transport, cfg), plan.adaptive_clip, denominator=plan.denominator)
