"""Epsilon of a distributed run for each audience, and the report's ``audiences`` block.

Three audiences of the same releases (:class:`~fedprivacy.accounting.release.DistributedRelease`):
the *server* sees who takes part and picks the survivors (no amplification); *participants* are sent
the roster and survivors of each round they take part in and know their own kept noise (amplified
only in the rounds they are not in: :mod:`fedprivacy.accounting.participants`); *observers* (the public) see only the models, a post-processing of the server's view, so their
epsilon is at most the server's, amplified by the sampling that ran only when the released noise does
not depend on the survivors and the per-round counts stay private.

Each figure composes the dominating Gaussians with the ``pld`` backend (the central-DP event for the
sampling that ran) and adds the slack: with ``H' = sum (eta + A) - log(1 - sum G)``,
``delta(eps) <= e^H' delta_Gauss(eps - 2H') + e^eps sum G`` (:func:`slack_epsilon`, ``1e-6 delta``
reserved for the last term). Threat models: the constants below; the argument: docs/DISTRIBUTED_DP.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from fedprivacy.accounting.events import Neighbouring, NoSampling, Sampling
from fedprivacy.accounting.release import DistributedRelease

if TYPE_CHECKING:
    from fedprivacy.accounting.completion import CohortRuleSampling
    from fedprivacy.accounting.participants import ParticipantSampling

__all__ = [
    "AUDIENCES",
    "OBSERVERS_THREAT_MODEL",
    "PARTICIPANTS_AMPLIFIED_THREAT_MODEL",
    "PARTICIPANTS_THREAT_MODEL",
    "RDP_ORDERS",
    "SERVER_THREAT_MODEL",
    "AudienceEpsilons",
    "audience_claim",
    "audience_epsilons",
    "participant_epsilon",
    "slack_epsilon",
]

AUDIENCES = ("server", "observers")
#: RDP orders of the cross-check (dp-accounting's defaults above 1).
RDP_ORDERS: tuple[float, ...] = tuple(float(a) for a in rdp_lib.DEFAULT_RDP_ORDERS if a > 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class AudienceEpsilons:
    """Epsilon of a sequence of released rounds for each audience, at ``delta``.

    ``server``: no amplification (the server sees who takes part and picks the survivors);
    ``observers``: *the public*, parties that take part in no round and see only the released
    models, amplified by the sampling that ran, never above ``server`` (the models are a
    post-processing of the server's view). ``participants``: a participating client (or a coalition
    of ``max(c, 1)`` of them, without the server): it is sent the roster and survivors of each round
    it takes part in and knows its own kept noise; amplified (``participants_amplified``) only by the
    rounds it is not in (:mod:`fedprivacy.accounting.participants`); None when not computed.
    ``slack`` is ``H'``. ``server_rdp`` is the RDP cross-check (``server`` is the smaller of it and
    the PLD bound only when the sampler has no truncation term). ``amplified`` says
    whether the observers' figure claims amplification (only when every round is ``exact``).
    """

    server: float
    observers: float
    server_pld: float
    observers_pld: float
    server_rdp: float
    slack: float
    delta: float
    rounds: int
    amplified: bool = False
    sampler_bounded: bool = True  # False: some round used the float64 sampler (deviation unbounded)
    participants: float | None = None
    participants_amplified: bool = False


def _gaussian_epsilon(releases: Sequence[DistributedRelease], sampling: Sampling | CohortRuleSampling, *,
                      delta: float, neighbouring: Neighbouring, backend: str) -> float:
    from fedprivacy.accounting.accountant import Accountant

    acc = Accountant(backend=backend, neighbouring=neighbouring)
    runs: list[list] = []  # consecutive identical events as one self-composed run
    for r in releases:
        ev = r.event(sampling)
        if runs and runs[-1][0] == ev:
            runs[-1][1] += 1
        else:
            runs.append([ev, 1])
    for ev, count in runs:
        acc.spend(ev.with_count(count))
    return acc.epsilon(delta=delta)


@dataclass(frozen=True, slots=True)
class _Composed:
    """The slack terms of a sequence of releases and its Gaussian epsilon under a sampling."""

    releases: Sequence[DistributedRelease]
    delta: float
    neighbouring: Neighbouring
    backend: str

    @property
    def tv(self) -> float:
        return math.fsum(r.sampler_tv for r in self.releases)

    @property
    def slack(self) -> float:
        """``H' = sum (eta + A) - log(1 - sum G)`` (module docstring; docs/DISTRIBUTED_DP.md, "Proofs")."""
        rs = self.releases
        h = math.fsum(r.eta for r in rs) + math.fsum(r.sampler_ratio for r in rs) - math.log1p(-self.tv)
        if not h <= 1e-3:
            raise ValueError(f"the accounting slack H={h:g} is too large (noise components of "
                             "variance below ~1 integer unit, or a huge model); raise the scale or noise")
        return h

    def pld(self, sampling: Sampling | CohortRuleSampling) -> float:
        self.slack  # noqa: B018 -- refuses a slack too large before any composition
        rs = self.releases
        return slack_epsilon(
            lambda d: _gaussian_epsilon(rs, sampling, delta=d, neighbouring=self.neighbouring,
                                        backend=self.backend),
            delta=self.delta, ratio=math.fsum(r.eta for r in rs) + math.fsum(r.sampler_ratio for r in rs),
            tv=self.tv)

    def rdp(self) -> float:
        orders = list(RDP_ORDERS)
        curve = [math.fsum(v) for v in zip(*(r.rdp(orders, neighbouring=self.neighbouring)
                                              for r in self.releases), strict=True)]
        return float(rdp_lib.compute_epsilon(orders, curve, self.delta)[0])

    def unamplified(self) -> tuple[float, float, float]:
        """``(figure, pld, rdp)`` without sampling. The RDP curve counts the sampler's truncation as
        a conditioning, which is not sound (the truncated law's support differs between datasets):
        it is the figure only when there is no truncation term."""
        pld, rdp = self.pld(NoSampling()), self.rdp()
        return (min(pld, rdp) if not self.tv else pld), pld, rdp


def audience_epsilons(releases: Sequence[DistributedRelease], *, delta: float,
                      sampling: Sampling | CohortRuleSampling | None = None,
                      neighbouring: Neighbouring | str = Neighbouring.ADD_REMOVE,
                      backend: str = "pld",
                      participant_releases: Sequence[DistributedRelease] | None = None,
                      participant_sampling: ParticipantSampling | None = None,
                      ) -> AudienceEpsilons:
    """Every audience's epsilon: ``eps_Gauss(delta (1 - 1e-6) e^-H') + 2H'`` (Proposition, "Sampler").

    ``sampling`` is the client sampling that ran as the public sees it (None: no amplification,
    e.g. every client every round, or per-round counts published). The observers' figure uses the
    same accountant and event as central DP for that sampling. ``participant_releases``: the same
    rounds against a participating client
    (:func:`fedprivacy.accounting.release.worst_case_release` with ``participant=True``),
    unamplified unless ``participant_sampling`` is given (Poisson rounds with the cohort-size rule
    public, zero-out, exact noise, counts private: the conditions of the public's amplification),
    then :func:`participant_epsilon`, never below the public's figure nor above the unamplified one.
    """
    nb = Neighbouring.parse(neighbouring)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not releases:
        return AudienceEpsilons(server=0.0, observers=0.0, server_pld=0.0, observers_pld=0.0,
                                server_rdp=0.0, slack=0.0, delta=delta, rounds=0,
                                participants=0.0 if participant_releases is not None else None)
    comp = _Composed(releases, delta, nb, backend)
    server, server_pld, server_rdp = comp.unamplified()
    if sampling is None or isinstance(sampling, NoSampling) or not all(r.exact for r in releases):
        obs_pld = server_pld  # no amplification claimed (nothing sampled, or noise tied to s)
    else:
        obs_pld = comp.pld(sampling)
    participants, p_amp = None, False
    if participant_releases is not None:
        participants = max(_Composed(participant_releases, delta, nb, backend).unamplified()[0], server)
        if (participant_sampling is not None and obs_pld is not server_pld
                and nb is Neighbouring.ADD_REMOVE and all(r.exact for r in participant_releases)):
            amp = max(participant_epsilon(releases, participant_releases, participant_sampling,
                                          delta=delta, backend=backend), min(obs_pld, server))
            participants, p_amp = (amp, True) if amp < participants else (participants, False)
    return AudienceEpsilons(server=server, observers=min(obs_pld, server), server_pld=server_pld,
                            observers_pld=obs_pld, server_rdp=server_rdp, slack=comp.slack,
                            delta=delta, rounds=len(releases), amplified=obs_pld is not server_pld,
                            sampler_bounded=all(r.exact_sampler for r in releases),
                            participants=participants, participants_amplified=p_amp)


def participant_epsilon(releases: Sequence[DistributedRelease],
                        participant_releases: Sequence[DistributedRelease],
                        sampling: ParticipantSampling, *, delta: float, backend: str = "pld") -> float:
    """A participating client's epsilon over these rounds (zero-out), amplified where it is not in
    the round: each round the labelled mixture
    :class:`fedprivacy.accounting.participants.ParticipantRoundGaussian` of the round's dominating
    Gaussian (``releases``) and of what the participant does not know (``participant_releases``),
    with the larger slack of the two per round (every label is one of the two releases)."""
    from fedprivacy.accounting.accountant import Accountant

    if len(releases) != len(participant_releases):
        raise ValueError(f"releases and participant_releases must match, got {len(releases)} and "
                         f"{len(participant_releases)}")
    pairs = list(zip(releases, participant_releases, strict=True))
    ratio = math.fsum(max(r.eta + r.sampler_ratio, p.eta + p.sampler_ratio) for r, p in pairs)
    tv = math.fsum(max(r.sampler_tv, p.sampler_tv) for r, p in pairs)
    if not ratio - math.log1p(-tv) <= 1e-3:
        raise ValueError(f"the accounting slack H={ratio - math.log1p(-tv):g} is too large; raise the "
                         "scale or noise")
    runs: list[list] = []
    for r, p in pairs:
        ev = sampling.event_for(noise_multiplier=r.noise_multiplier,
                                participant_noise_multiplier=p.noise_multiplier)
        if runs and runs[-1][0] == ev:
            runs[-1][1] += 1
        else:
            runs.append([ev, 1])

    def composed(d: float) -> float:
        acc = Accountant(backend=backend, neighbouring=Neighbouring.ADD_REMOVE)
        for ev, count in runs:
            acc.spend(ev.with_count(count))
        return acc.epsilon(delta=d)

    return slack_epsilon(composed, delta=delta, ratio=ratio, tv=tv)


#: Share of delta reserved for the tabulated sampler's truncation (``e^eps TV <= share delta``).
_TV_SHARE = 1e-6


def slack_epsilon(gaussian_epsilon: Callable[[float], float], *, delta: float, ratio: float,
                  tv: float) -> float:
    """The module's chain ("Sampler") for any composed dominating Gaussian:
    ``eps_G(delta (1 - 1e-6) e^-H') + 2H'`` with ``H' = ratio - log(1 - tv)``.

    Over an adaptive composition of rounds each within ``e^(+-(eta + A))`` (pointwise, both datasets)
    of a truncated-exact release that is ``G``-close in total variation to a post-processed Gaussian
    mechanism, ``delta(eps) <= e^H' delta_G(eps - 2H') + e^eps sum G``: ``ratio = sum (eta + A)`` and
    ``tv = sum G`` over the rounds. ``gaussian_epsilon(d)`` is the epsilon at delta ``d`` of the composed
    dominating Gaussians (a PLD accountant's, or ρ-zCDP's conversion for the client's own total).
    ``1e-6 delta`` is reserved for the TV term; returns ``inf`` when ``e^eps tv`` would exceed it (not
    certified this way, epsilon above ~150).
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not (ratio >= 0 and 0 <= tv < 1):
        raise ValueError(f"slack must have ratio >= 0 and tv in [0, 1), got ratio={ratio}, tv={tv}")
    slack = ratio - math.log1p(-tv)
    d_eff = delta * (1.0 - _TV_SHARE if tv else 1.0) * math.exp(-slack)
    eps = gaussian_epsilon(d_eff) + 2.0 * slack
    if tv and eps > math.log(_TV_SHARE * delta / tv):  # e^eps * TV must stay <= share * delta
        return math.inf
    return eps



SERVER_THREAT_MODEL = (
    "the server (and anyone it colludes with, up to c clients who know their own noise): it sees who "
    "takes part, picks the survivors, chooses every message; it learns only sums that carry at least "
    "the honest survivors' kept noise (the secure-aggregation guarantee), so no amplification by "
    "sampling is claimed")
OBSERVERS_THREAT_MODEL = (
    "the public: parties that take part in no round of the run and see only the released models "
    "(a participating client is NOT in this audience: it is sent each round's roster and survivor "
    "list, see the participants' figure); the server follows the protocol and keeps the cohort "
    "secret; the per-round counts (clients sampled, roster, survivors, graph degree) are not "
    "published (they are in the server's private log, with each round's wall time, which grows with "
    "the cohort) and every completed round is charged the same worst-case release, so nothing "
    "published depends on them (timing beyond that, e.g. of messages, is not covered); the models are a "
    "post-processing of the server's view, so this epsilon is never above the server's; "
    "amplification by the sampling that ran is claimed only when the released noise does not depend "
    "on the survivors (exact XNoise without colluders) and the counts stay private; which rounds "
    "complete is public, so a completed Poisson round is accounted as the pair in which the public "
    "also learns how many other clients were sampled: with the probability that client i decided "
    "the round's completion it is an unamplified Gaussian, else the subsampled one "
    "(fedprivacy.accounting.completion; zero-out adjacency); rounds aborted by the cohort-size rule "
    "are inside that pair; a run with a round aborted for another reason (dropouts, a protocol "
    "violation) or a completed round that lost sampled clients after its cohort was chosen "
    "(dropouts: completion then also depends on the survivors) claims no amplification: every "
    "round is charged the server's unamplified Gaussian, valid for every dropout pattern that does "
    "not depend on the data (an observers-budgeted run stops there); the amplified figure of a run "
    "that lost no sampled client assumes that whether a round loses clients does not depend on who "
    "was sampled (true without dropouts; independent per-client dropouts that happened not to "
    "occur would tilt the cohorts towards fewer clients: not modelled)")
PARTICIPANTS_THREAT_MODEL = (
    "a client that takes part in rounds (or a coalition of max(c, 1) such clients, without the "
    "server): each round it takes part in tells it the roster and the survivors, so no amplification "
    "by sampling is claimed; it knows its own kept noise, which is not counted (with c = 0 this makes "
    "its figure larger than the server's; with c >= 1 the server's figure already leaves c clients' "
    "noise out and this figure is the server's)")
PARTICIPANTS_AMPLIFIED_THREAT_MODEL = (
    "one client that takes part in rounds (c = 0), without the server, against another client i "
    "(zero-out adjacency): it is sampled like every client; each round it takes part in tells it the "
    "roster and the survivors, so it sees whether i is in that sum (no amplification there) and it "
    "knows its own kept noise, which is not counted; in the rounds it is not in it sees what the "
    "public sees (the public's pair, amplified); the mixture over the rounds it joins is composed "
    "(fedprivacy.accounting.participants), under the public's conditions (exact noise, counts "
    "private, no round aborted after its cohort was chosen or losing sampled clients)")


def audience_claim(eps: AudienceEpsilons, *, sampling_description: str, colluders: int,
                   exact_noise: bool, sampled: bool = True,
                   counts_published: bool = False, aborted: bool = False,
                   lost: bool = False) -> dict[str, Any]:
    """The ``audiences`` block of a distributed run's privacy report (results.json, console, report)."""
    if eps.amplified:
        why = (f"amplified by {sampling_description}, with which rounds completed public (each completed "
               "round: an unamplified Gaussian with the probability that the client decided its "
               "completion, else subsampled; the public only; counts kept private)")
    elif not sampled:
        why = "not amplified: every client takes part in every round"
    elif not exact_noise:
        why = ("not amplified: the released noise depends on how many survived (colluders > 0, or "
               "the legacy share), so its level could reveal whether a client was in the sum")
    elif aborted:
        why = ("not amplified: a round aborted after its cohort was chosen (dropouts or a protocol "
               "violation), which the public sees and whose cause is not modelled")
    elif lost:
        why = ("not amplified: a completed round lost sampled clients after its cohort was chosen "
               "(dropouts), so its completion also depended on the survivors, which the pair does not "
               "model; every round is charged its unamplified Gaussian, valid for every dropout pattern")
    elif counts_published:
        why = ("not amplified: the per-round client counts are published (publish-participation), and "
               "a known count changes the sampling the public faces")
    else:
        why = "not amplified"
    sampler = ("tabulated discrete Gaussian: exact integer law, its deviation charged (slack H')"
               if eps.sampler_bounded else
               "float64 rejection sampler (legacy share): its deviation from N_Z (~2^-53 per "
               "decision) is NOT bounded in this epsilon")
    return {
        "server": {"epsilon": eps.server, "delta": eps.delta, "amplification": False,
                   "threat_model": SERVER_THREAT_MODEL, "colluders": colluders,
                   "accountant": ("pld of the dominating continuous Gaussian "
                                  "(fedprivacy.accounting.release, Proposition), one worst-case "
                                  "release per completed round; the RDP cross-check is reported, and "
                                  "used only when the sampler has no truncation term"),
                   "pld": eps.server_pld, "rdp_cross_check": eps.server_rdp},
        "observers": {"epsilon": eps.observers, "delta": eps.delta, "amplification": eps.amplified,
                      "who": "the public (takes part in no round)",
                      "sampling": why, "threat_model": OBSERVERS_THREAT_MODEL,
                      "colluders": colluders, "pld": eps.observers_pld},
        "participants": {"epsilon": eps.participants, "delta": eps.delta,
                         "amplification": eps.participants_amplified,
                         "who": f"a participating client (or up to {max(colluders, 1)} of them)",
                         "threat_model": (PARTICIPANTS_AMPLIFIED_THREAT_MODEL if eps.participants_amplified
                                          else PARTICIPANTS_THREAT_MODEL), "colluders": colluders},
        "slack": eps.slack, "rounds": eps.rounds, "noise_sampler": sampler,
    }
