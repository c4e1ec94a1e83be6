"""``distributed``: secure aggregation with distributed discrete Gaussian noise (Kairouz, Liu & Steinke
2021), the mode whose server only ever unmasks a sum that already carries the survivors' noise.

Noise: exact XNoise (:class:`fedprivacy.accounting.xnoise_design.XNoiseDesign`, after Dordis): each
client adds a base component from its own source and seeded components; the server removes the
survivors' excess from seeds revealed under the certified survivor view, so the released sum carries
exactly ``(zCs)^2`` of honest noise for every survivor count, all drawn by the exact-law sampler
(:mod:`fedprivacy.dp.tabulated`). The legacy ``(zCs)^2/t`` share is not run (clients refuse it).

Plan: the budget check before a round uses the worst case, ``t`` survivors (the same noise, the
largest sampler slack), with the encoding sized for the model dimension the run really sends
(``dim``); the ledger's event is the round's dominating Gaussian for ``privacy-audience`` (observers
get the amplification of the sampling that ran). The round (:class:`fedprivacy.fl.secure.SecureRound`)
reports the event of the survivors that really completed it. The summary states the noise they left,
round by round, both audiences' ε and central DP with the same σ.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fedprivacy.accounting.events import Neighbouring, NoSampling, PrivacyEvent
from fedprivacy.fl.aggregation import Aggregator
from fedprivacy.fl.mechanisms import XNOISE, ClientMechanism, ServerMechanism
from fedprivacy.fl.modes.base import Disclosure, Transport, privacy_block, secure_round
from fedprivacy.fl.privacy import PrivacyPlan, denominator_of, sampling_description, sampling_object
from fedprivacy.fl.secure.params import (
    completes,
    counts_private,
    is_cohort_rule_abort,
    largest_roster,
    make_encoding,
    public_sampling,
    secagg_parameters,
)
from fedprivacy.fl.types import RoundFn, RoundRecord

if TYPE_CHECKING:
    from fedprivacy.accounting.accountant import Accountant
    from fedprivacy.accounting.completion import CohortRuleSampling
    from fedprivacy.accounting.events import Sampling
    from fedprivacy.config import RunConfig
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.secagg.ddp import DistributedDPConfig

__all__ = ["DistributedMode", "distributed_summary"]

_PRIVATE_COUNTS = ("per-round client counts, rosters, survivors, graph degrees, noise levels, abort reasons and "
                   "wall times (a round's time grows with its cohort) are left out of the published outputs "
                   "(the public's amplified ε needs them secret); the server keeps them in its private log; "
                   "the run's total time is published")


def _adjacency(cfg: RunConfig) -> str:
    # KLS 2021's theorem covers neighbouring sums that differ in one client's update while every
    # survivor's noise share is present in both (fedprivacy.accounting.release): say so.
    if Neighbouring.parse(cfg.neighbouring) is Neighbouring.ADD_REMOVE:
        return ("zero-out: one client's update replaced by 0, every survivor's noise share present "
                "(KLS 2021); removing a client together with its noise share is not claimed")
    return ("replace-one: one client's update replaced (sensitivity doubled); every survivor's "
            "noise share present (KLS 2021)")


def _audience_sampling(cfg: RunConfig, *, population: int) -> Sampling | CohortRuleSampling:
    """The sampling the ledger's event carries: the public's (``privacy-audience=observers``) or none."""
    if cfg.privacy_audience == "observers":
        return public_sampling(cfg, population=population)
    return NoSampling()


def _run_slack(ddp: DistributedDPConfig, *, roster: int, rounds: int) -> float:
    """``H'`` for ``rounds`` worst-case rounds (:meth:`fedprivacy.secagg.ddp.DistributedDPConfig.slack_bound`)."""
    h, g = ddp.slack_bound(roster=roster)
    return rounds * h - math.log1p(-min(rounds * g, 0.5))


def _tv_reserve(ddp: DistributedDPConfig, *, roster: int) -> float:
    """``1 - 1e-6`` when the sampler has a truncation term to reserve delta for, else 1."""
    return 1.0 - 1e-6 if ddp.slack_bound(roster=roster)[1] > 0 else 1.0


def row_epsilon(accountant: Accountant, cfg: RunConfig, plan: PrivacyPlan) -> float:
    """A round's published ε of a distributed run: the ledger's at the plan's reduced δ plus the plan's
    slack ``2H'`` of ``num-server-rounds`` rounds; when the ledger holds more releases than
    that (a round re-charged after a crash), ``2H'`` of every release at ``δ (1 - 1e-6) e^-H'`` for them
    (the row was 3.4e-9 below the headline)."""
    from fedprivacy.accounting.audiences import slack_epsilon

    releases = charged_releases(accountant, plan)
    if releases <= cfg.num_server_rounds:
        return accountant.epsilon(delta=plan.target_delta) + plan.epsilon_slack
    h, g = plan.slack_per_round
    return slack_epsilon(lambda d: accountant.epsilon(delta=d), delta=cfg.target_delta, ratio=releases * h,
                         tv=releases * g)


def _calibrate(cfg: RunConfig, *, population: int, dim: int, threshold: int, roster: int) -> float:
    """The smallest z meeting ``target-epsilon`` for ``privacy-audience``
    (:func:`fedprivacy.accounting.calibration.calibrate_distributed`, slack included)."""
    from fedprivacy.accounting.calibration import calibrate_distributed

    def encoding_for(z: float) -> tuple[float, float]:
        enc = make_encoding(cfg.replace(noise_multiplier=z), population=population, dim=dim,
                            threshold=threshold)
        return enc.clip_norm * enc.scale, enc.ddp().norm_bound

    max_slack = 1e-6
    for _ in range(8):
        z = calibrate_distributed(
            target_epsilon=cfg.target_epsilon, target_delta=cfg.target_delta,
            steps=cfg.num_server_rounds, audience=cfg.privacy_audience,
            sampling=public_sampling(cfg, population=population), neighbouring=cfg.neighbouring,
            encoding_for=encoding_for, max_slack=max_slack)
        enc = make_encoding(cfg.replace(noise_multiplier=z), population=population, dim=dim,
                            threshold=threshold)
        slack = _run_slack(enc.ddp(), roster=roster, rounds=cfg.num_server_rounds)
        if slack <= max_slack:
            return z
        max_slack = 2.0 * slack
    raise ValueError("calibration did not converge (accounting slack keeps growing)")


_AUDIENCE_LABEL = {
    "server": "server (no amplification)",
    "observers": ("observers = the public, which takes part in no round (participating clients see "
                  "rosters and survivors: their figure is unamplified, in the report)"),
}


class DistributedMode:
    """Distributed DP under SecAgg+ (needs ``secagg = true``; ``pld`` or ``rdp`` accountant)."""

    name = "distributed"
    trusted_server = False
    covers: tuple[str, ...] = (
        "- Covers: the sequence of released global models, against the server and everyone else: "
         "the server only ever unmasks a sum that already carries the survivors' discrete Gaussian "
         "noise (secure aggregation, threshold t).",
        "- Trusts: the first contact between two clients (each pins the other's long-term key then; a "
         "peer directory lifts this, client-peer-auth=relay trusts every relay), and that at "
         "most {colluders} clients collude with it (the ε above is computed for exactly that many "
         "colluders, whose noise is not counted); see docs/SECAGG.md.",
        "- Does not cover: who took part or survived in a round, and timing. Amplification by "
         "client sampling is claimed only in the public's figure (parties that take part in no "
         "round; participating clients see rosters and survivors), see the audiences table. Aborted "
         "rounds release nothing and spend nothing.",
    )
    client_mechanism: ClientMechanism | None = XNOISE
    server_mechanism: ServerMechanism | None = None
    secure_noise = True

    def check(self, cfg: RunConfig) -> None:
        if not cfg.secagg:
            raise ValueError(f"secagg must be true when privacy={self.name!r} (the noise is only hidden by "
                             "secure aggregation); set secagg=true, or privacy='central' secagg=false")
        if cfg.accountant not in ("pld", "rdp"):
            raise ValueError(
                f"accountant must be 'pld' or 'rdp' when privacy={self.name!r} (each round is "
                f"accounted as its dominating Gaussian, fedprivacy.accounting.release), got "
                f"{cfg.accountant!r}")
        if cfg.noise_multiplier == 0 and cfg.target_epsilon == 0:
            raise ValueError(
                f"noise-multiplier must be > 0 when privacy={self.name!r}, or 0 with "
                "target-epsilon > 0 to calibrate it for privacy-audience, got 0")

    def disclosure(self, cfg: RunConfig) -> Disclosure:
        """When the public's figure claims amplification (clients sampled, exact noise, no colluders)
        the per-round counts, rosters, survivors and times stay private (:func:`counts_private`)."""
        if counts_private(cfg):
            return Disclosure(participation=False, note=_PRIVATE_COUNTS)
        return Disclosure.published()

    def plan(self, cfg: RunConfig, *, population: int, dim: int | None) -> PrivacyPlan:
        """The plan; ``event`` is the worst case (``t`` survivors) for a ``dim``-parameter model.

        The event is the round's dominating Gaussian (:mod:`fedprivacy.accounting.release`) for
        ``privacy-audience``; the budget the accountant checks is lowered by the run's worst-case
        accounting slack (``target_epsilon - 2H'`` at ``delta (1 - 1e-6) e^-H'``), so that a round the
        budget admits keeps the final figure, slack included, within the target.
        """
        if dim is None or dim < 1:
            raise ValueError(f"dim (the model's number of parameters) must be >= 1 for "
                             f"privacy='distributed', got {dim}")
        t, _ = secagg_parameters(cfg, population=population)
        roster = max(t, largest_roster(cfg, population=population))
        z, calibrated = cfg.noise_multiplier, False
        if z == 0:
            z = _calibrate(cfg, population=population, dim=dim, threshold=t, roster=roster)
            calibrated = True
        run_cfg = cfg.replace(noise_multiplier=z)
        ddp = make_encoding(run_cfg, population=population, dim=dim, threshold=t).ddp()
        worst = ddp.worst_release(max_roster=roster)  # every completed round is charged this
        spec = None
        if cfg.adaptive_clip:  # the count bit inside secure aggregation (Theorem 1's split)
            from fedprivacy.fl.adaptive_clip import distributed_spec, round_encoding

            spec, worst = distributed_spec(cfg, noise_multiplier=z, target=worst.noise_multiplier,
                                           population=population, dim=dim, threshold=t, roster=roster,
                                           denominator=denominator_of(cfg, population=population))
            ddp = round_encoding(cfg, spec, clip_norm=cfg.clip_norm, population=population, dim=dim,
                                 threshold=t).ddp()
        sampling = _audience_sampling(cfg, population=population)
        slack = _run_slack(ddp, roster=roster, rounds=cfg.num_server_rounds)
        desc = sampling_description(cfg, population=population, replacement_note=False)
        amplified = "" if sampling.rate < 1.0 else "; no amplification claimed"
        how = "exact XNoise components (the released sum carries (zCs)^2 for every survivor count)"
        return PrivacyPlan(
            mode="distributed", population=population, denominator=denominator_of(cfg, population=population),
            clip_norm=cfg.clip_norm, noise_multiplier=z, calibrated=calibrated,
            central_noise_std=0.0, local_noise_std=0.0, unit="user (all data of one client)",
            neighbouring=cfg.neighbouring, adjacency=_adjacency(cfg),
            sampling_description=(desc + f"{amplified}; ledger audience: "
                                  f"{_AUDIENCE_LABEL[cfg.privacy_audience]}; secagg threshold t={t}"),
            event=worst.event(sampling),
            target_delta=cfg.target_delta * _tv_reserve(ddp, roster=roster) * math.exp(-slack),
            target_epsilon=max(cfg.target_epsilon - 2.0 * slack, 0.0) if cfg.target_epsilon else 0.0,
            epsilon_slack=2.0 * slack, slack_per_round=ddp.slack_bound(roster=roster),
            mechanism=(f"distributed discrete Gaussian under SecAgg+ (Kairouz, Liu & Steinke 2021): "
                       f"{how}; the server only sees the noised sum; accounted as its dominating "
                       f"Gaussian (fedprivacy.accounting.release)"
                       + ("; adaptive clip norm (Andrew et al. 2021): each client's clipped-count bit is "
                          "one more coordinate of its secure-aggregation vector under the same noise, the "
                          "event is the pair composed (sensitivity hypot(Delta_2, k_b))" if spec else "")),
            adaptive_clip=spec,
            unamplified_event=(worst.event(NoSampling()) if cfg.privacy_audience == "observers"
                               and sampling.rate < 1.0 else None),
        )

    def round_fn(self, cfg: RunConfig, plan: PrivacyPlan, transport: Transport, *,
                 aggregator: Aggregator | None = None, log: Callable[[str], None] = print) -> RoundFn:
        if plan.adaptive_clip is not None:
            from fedprivacy.fl.adaptive_clip import AdaptiveSecureRound

            if transport.secure is None or aggregator is not None:
                raise ValueError("adaptive clipping in distributed mode needs the secure transport and "
                                 "its own aggregation")
            return AdaptiveSecureRound(cfg.replace(noise_multiplier=plan.noise_multiplier), transport.secure,
                                       population=plan.population, spec=plan.adaptive_clip, log=log)
        return secure_round(cfg.replace(noise_multiplier=plan.noise_multiplier), plan, transport,
                            aggregator=aggregator, log=log)

    def summary(self, cfg: RunConfig, plan: PrivacyPlan, records: Sequence[RoundRecord], *,
                accountant: Accountant | None, rng: RandomSource) -> dict[str, Any]:
        block = privacy_block(cfg, plan, accountant, rng)
        if accountant is not None:
            # the releases, not the ledger's steps: a void's re-charge is not another round
            block["rounds"] = charged_releases(accountant, plan)
            block.update(distributed_summary(cfg.replace(noise_multiplier=plan.noise_multiplier),
                                             records, epsilon=block["epsilon"], plan=plan,
                                             charged=charged_releases(accountant, plan),
                                             voided=voided_in_ledger(accountant, plan)))
            audiences = block["distributed"]["audiences"]
            if audiences is not None:  # the figure with every slack term (the ledger's is below it)
                # never below the ledger, whose charges are the events that ran
                block["epsilon"] = max(audiences[cfg.privacy_audience]["epsilon"], block["epsilon"])
                block["epsilon_audience"] = cfg.privacy_audience
            if records and records[-1].epsilon is not None:  # never below a published row
                block["epsilon"] = max(block["epsilon"], float(records[-1].epsilon))
        return block


def distributed_summary(cfg: RunConfig, records: Sequence[RoundRecord], *,
                        epsilon: float | None, plan: PrivacyPlan | None = None,
                        charged: int | None = None, voided: bool = False) -> dict[str, Any]:
    """The noise the survivors really left, every audience's ε, and central DP with the same σ.

    Every completed round is accounted as the run's one worst-case release
    (:meth:`fedprivacy.secagg.ddp.DistributedDPConfig.worst_release`: largest roster, supremum of the
    slack over survivor counts), so the figures depend on the number of completed rounds
    only, never on their counts. ``charged`` is the number of releases the ledger holds:
    a round that was charged and has no completed record (a crash after its charge, the write-ahead
    write-ahead ledger; or an abort after it) may have been released, so it is accounted too: never
    refunded. The central references are the PLD of the continuous Gaussian ``σ = z C`` on the same
    rounds, without sampling and with the sampling that ran. With :func:`counts_private` the per-round
    counts are left out (they are in the server's private participation log). ``voided``: the
    ledger holds the unamplified re-charge of a voided observers run (the public gets no amplification
    even if the round that voided it was discarded and has no record).
    """
    from fedprivacy.accounting.accountant import epsilon_for

    done = [(r, r.secagg) for r in records if r.secagg is not None and r.secagg.survivors
            and r.aborted is None]
    threshold = done[0][1].threshold if done else None
    cut_off = max(0, (charged or 0) - len(done))
    audiences = central = central_sampled = None
    exact = False
    dims = [s.dim for _, s in done if s.dim]
    if (done or cut_off) and plan is not None and dims:
        ddps = _adaptive_ddps(cfg, plan, [r for r, _ in done], dim=dims[0], cut_off=cut_off)
        exact, audiences = _audiences(cfg, plan, dim=dims[0], rounds=len(done) + cut_off, ddps=ddps,
                                      void=(amplification_void(cfg, records, population=plan.population)
                                            or ("lost" if voided else None)))
    if plan is not None and done:  # no completed round (e.g. every client refused round 1): no reference
        central_sampled = epsilon_for(noise_multiplier=cfg.noise_multiplier,
                                      sampling=sampling_object(cfg, plan.population), steps=len(done),
                                      delta=cfg.target_delta, backend="pld", neighbouring=cfg.neighbouring)
        central = epsilon_for(noise_multiplier=cfg.noise_multiplier, sample_rate=1.0, steps=len(done),
                              delta=cfg.target_delta, backend="pld", neighbouring=cfg.neighbouring)
    private = counts_private(cfg)
    hidden = "private (server's participation log)"
    return {"distributed": {
        "threshold": threshold,
        "noise": ("exact XNoise: the released sum carries σ = z·C for every survivor count" if exact
                  else "legacy share (not run by clients): the sum carries n/t times the target"),
        "completed_rounds": [r.round for r, _ in done],
        "counts": ("private: per-round rosters, survivors, degrees, noise levels and aborts are not "
                   "published (the public's amplified ε needs them secret)" if private else "published"),
        "survivors_per_round": hidden if private else [int(s.survivors or 0) for _, s in done],
        "noise_std_of_sum_per_round": hidden if private else [s.noise_std_sum for _, s in done],
        "aborted_rounds": hidden if private else [r.round for r in records if r.aborted],
        "charged_without_record": cut_off,
        "ledger_epsilon": epsilon,
        "audiences": audiences,
        "central_dp_epsilon_same_sigma": central,
        "central_dp_epsilon_same_sigma_and_sampling": central_sampled,
        "central_dp_reference": ("continuous Gaussian of σ = z·C on the sum, same completed rounds and "
                                 "δ, PLD accountant: without sampling (the server's reference) and "
                                 "with the sampling that ran (the public's reference)"),
    }}


def amplification_void(cfg: RunConfig, records: Sequence[RoundRecord], *, population: int) -> str | None:
    """Why the public's pair does not cover the run (``"aborted"`` / ``"lost"``), None when it does.

    Modelled (:func:`fedprivacy.fl.secure.params.public_sampling`, :mod:`fedprivacy.accounting.completion`):
    rounds whose cohort is exactly the clients in the sum, completed or aborted by the cohort size
    alone: SecureRound's cohort-size abort, or any abort of a round whose cohort size (the server's
    private count) is one the secure round never completes (:func:`completes`: e.g. a cohort of 2
    with ``t = 2`` aborts inside the protocol). Not modelled: an abort of a round whose
    cohort could have completed (dropouts, a protocol violation: ``"aborted"``), and a completed round
    that lost sampled clients after its cohort was chosen (fewer clients in the sum than sampled, or
    clients in the sum that missed the consistency/unmask stage: ``"lost"``), whose
    completion then also depended on the survivors.
    """
    for r in records:
        why = unmodelled_round(cfg, r.aborted, r.clients_sampled, r.clients_aggregated, population=population,
                               late=r.secagg.late if r.secagg is not None else None)
        if why is not None:
            return why
    return None


def unmodelled_round(cfg: RunConfig, reason: str | None, cohort_size: int | None, aggregated: int | None, *,
                     population: int, late: int | None = None) -> str | None:
    """Whether one round (aborted for ``reason``, or completed with ``aggregated`` of its ``cohort_size``
    sampled clients in the sum, ``late`` of them missing a later stage) is outside the public's pair:
    ``"aborted"``, ``"lost"`` or None (see :func:`amplification_void`)."""
    if reason:
        try:
            rule = completes(cfg, population=population)
        except ValueError:
            return "aborted"
        modelled = is_cohort_rule_abort(reason) or (cohort_size is not None and not rule(int(cohort_size)))
        return None if modelled else "aborted"
    if cohort_size is not None and aggregated is not None and int(aggregated) < int(cohort_size):
        return "lost"
    if late:  # in the sum, but missed the consistency/unmask stage: completion needed the others' shares
        return "lost"
    return None


def _is_void_charge(event: PrivacyEvent, plan: PrivacyPlan) -> bool:
    """Whether ``event`` is an unamplified re-charge of
    :meth:`fedprivacy.fl.journal.WriteAheadJournal.void_amplification` (an observers run's rounds are
    charged amplified events; only the void charges the plan's ``unamplified_event``)."""
    void = plan.unamplified_event
    return void is not None and event.with_count(1) == void.with_count(1)


def charged_releases(accountant: Accountant, plan: PrivacyPlan) -> int:
    """The releases the ledger holds: every entry's count except the unamplified re-charges of an
    observers run whose amplification was voided
    (:meth:`fedprivacy.fl.journal.WriteAheadJournal.void_amplification`), which charge rounds already
    counted once (counting them again would make a phantom cut-off round)."""
    return sum(e.event.count for e in accountant.ledger if not _is_void_charge(e.event, plan))


def voided_in_ledger(accountant: Accountant, plan: PrivacyPlan) -> bool:
    """Whether the run's amplification was voided (the ledger holds a void re-charge): also when the
    round that voided it has no record (discarded because the re-charge exceeded the budget)."""
    return any(_is_void_charge(e.event, plan) for e in accountant.ledger)


def _audiences(cfg: RunConfig, plan: PrivacyPlan, *, dim: int, rounds: int,
               ddps: list[list[DistributedDPConfig]] | None = None,
               void: str | None = None) -> tuple[bool, dict[str, Any]]:
    """``(exact, audiences block)`` for ``rounds`` charged rounds, each the run's worst case.

    Rounds aborted by the cohort-size rule are inside :func:`public_sampling`'s pair (which rounds
    complete is public: :mod:`fedprivacy.accounting.completion`). A run that has a round outside it
    (``void``, :func:`amplification_void`: an abort after the cohort was chosen, or a
    completed round that lost sampled clients) claims no amplification for the public:
    every charged round is its unamplified Gaussian. That figure holds for every dropout pattern
    that does not depend on the clients' data (whoever chooses it, adaptively, knowing the cohort):
    given the cohort and the survivors (which the server sees) each round is a Gaussian of
    sensitivity ``Delta`` or no release at all for client ``i``, so the server's unamplified
    composition dominates its view (Zhu, Dong & Wang 2022, Theorem 10), and the public's view
    (models, completion, the run's outputs) is a post-processing of the server's.

    ``ddps`` (adaptive clipping): per charged round, the encodings it can have run with (one for a
    completed round, its own clip norm); the round is charged the worst case over them."""
    from fedprivacy.accounting.audiences import audience_claim, audience_epsilons

    t, _ = secagg_parameters(cfg, population=plan.population)
    ddp = make_encoding(cfg, population=plan.population, dim=dim, threshold=t).ddp()
    roster = max(t, largest_roster(cfg, population=plan.population))
    per_round = ddps if ddps is not None else [[ddp]] * rounds
    worst_list = [_dominating([d.worst_release(max_roster=roster) for d in options]) for options in per_round]
    try:
        participant: list[Any] | None = [
            _dominating([d.worst_release(max_roster=roster, participant=True) for d in options])
            for options in per_round]
    except ValueError:  # no noise is left against a participant (t = 1): no finite figure
        participant = None
    sampling = sampling_object(cfg, plan.population)
    public = None if void else public_sampling(cfg, population=plan.population)
    eps = audience_epsilons(worst_list, delta=cfg.target_delta, sampling=public,
                            neighbouring=cfg.neighbouring, backend=cfg.accountant,
                            participant_releases=participant,
                            participant_sampling=_participant_sampling(cfg, plan.population, public))
    if participant is None:
        eps = dataclasses.replace(eps, participants=math.inf)
    exact = all(w.exact for w in worst_list)
    block = audience_claim(eps, sampling_description=sampling.describe(), colluders=cfg.secagg_colluders,
                           exact_noise=exact, sampled=sampling.rate < 1.0,
                           counts_published=cfg.publish_participation, aborted=void == "aborted",
                           lost=void == "lost")
    return exact, block


def _participant_sampling(cfg: RunConfig, population: int, public: Any) -> Any:
    """The participants' label weights (:func:`fedprivacy.accounting.participants.participant_weights`)
    where the public's completed-round pair holds (Poisson, zero-out, counts private, no void) and
    one participant is the coalition (``c = 0``); else None (the participants' figure unamplified)."""
    from fedprivacy.accounting.completion import CohortRuleSampling
    from fedprivacy.accounting.participants import participant_weights

    if not isinstance(public, CohortRuleSampling) or cfg.secagg_colluders:
        return None
    try:
        return participant_weights(population=population, sample_rate=public.rate,
                                   completes=completes(cfg, population=population))
    except ValueError:  # no round can complete
        return None


def _dominating(releases: Sequence[Any]) -> Any:
    """One release at least as costly as each of ``releases``: the smallest noise multiplier, with the
    largest slack terms of any of them (a charged round whose clip norm is one of several)."""
    if len(releases) == 1:
        return releases[0]
    worst = min(releases, key=lambda r: r.noise_multiplier)  # the PLD's event
    rdp_base = max(r.l2_sensitivity**2 / r.honest_variance for r in releases)  # the RDP cross-check's
    return dataclasses.replace(worst, honest_variance=worst.l2_sensitivity**2 / rdp_base,
                               eta=max(r.eta for r in releases),
                               sampler_ratio=max(r.sampler_ratio for r in releases),
                               sampler_tv=max(r.sampler_tv for r in releases),
                               rdp_log_upper=max(r.rdp_log_upper for r in releases),
                               rdp_log_lower=min(r.rdp_log_lower for r in releases),
                               exact=all(r.exact for r in releases))


def _adaptive_ddps(cfg: RunConfig, plan: PrivacyPlan, records: Sequence[RoundRecord], *, dim: int,
                   cut_off: int) -> list[list[DistributedDPConfig]] | None:
    """Adaptive clipping: per charged round the encodings it can have run with (None without).

    A completed round: its own clip norm (public: a function of released counts). A charged round
    without a record: every clip norm it can have used
    (:func:`fedprivacy.fl.adaptive_clip.worst_cut_off_clip_norm_candidates`). ``dim`` is the rows'
    ``secagg_dim``, the padded dimension plus the count coordinate: ``dim - 1`` is the power of two the
    rotation pads to, which gives the same encoding as the model's dimension.
    """
    from fedprivacy.fl.adaptive_clip import round_encoding, worst_cut_off_clip_norm_candidates

    spec = plan.adaptive_clip
    if spec is None:
        return None
    clips = [r.clip for r in records]
    if any(c is None for c in clips):
        raise ValueError("adaptive clipping: a completed round has no clip norm in its record")
    t, _ = secagg_parameters(cfg, population=plan.population)

    def enc(c: float) -> DistributedDPConfig:
        return round_encoding(cfg, spec, clip_norm=c, population=plan.population, dim=dim - 1,
                              threshold=t).ddp()

    known = [c for c in clips if c is not None]
    done = [[enc(c.clip_norm)] for c in known]
    return done + [[enc(c) for c in worst_cut_off_clip_norm_candidates(spec, known)]] * cut_off
