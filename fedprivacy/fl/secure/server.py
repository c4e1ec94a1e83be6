"""The server side of a DP-FedAvg round under secure aggregation (``secagg = true``).

The round runs the SecAgg+ state machines of :mod:`fedprivacy.secagg.protocol` over any transport
that implements :class:`SecureTransport` (the Flower Grid in ``server/secagg_exchange.py``, a direct
function call in tests). Schedule ``secagg-schedule``: ``active`` (the default: secure against a
server that deviates, with ``secagg-colluders`` colluding clients) has five stages, ``semi-honest``
(opt-in) skips the consistency stage:

=======================  ======================================  =======================================
exchange                 server -> each client                   client -> server
=======================  ======================================  =======================================
1 ``advertise``          ``SetupRequest``                        ``AdvertiseKeys`` (fresh keys, commitment)
2 ``share``              ``ShareKeysRequest`` (roster)           ``SharedKeys`` (sealed Shamir shares)
3 ``masked`` (train)     model, instructions, encoding,          ``MaskedInput``: the client trains, clips,
                         ``MaskedInputRequest``                  encodes, masks, signs its peer set
4 ``consistency``        ``ConsistencyRequest`` (the view)       its signature on the view (active only)
5 ``unmask``             ``UnmaskRequest`` (+ certificate)       ``UnmaskResponse``
=======================  ======================================  =======================================

With full participation (``sample-rate = 1`` or a fixed cohort of everyone) the cohort of round r+1 is
known before round r ends and does not depend on data, so round r+1's advertise stage rides on round
r's unmask exchange when the transport is a :class:`PipelinedTransport`: four exchanges per round after
the first on the active schedule, three on the semi-honest one (``SecureRoundInfo.pipelined``). The
protocol's minimum is three and two (``docs/SECAGG.md``, "Exchanges per round"); reaching it needs
the shares of round r+1 to ride on round r's exchanges too (two live sessions per client).

Privacy (``distributed``): every client adds exact XNoise components (:mod:`fedprivacy.secagg.xnoise`,
all from the exact-law sampler) for the design it builds itself from the encoding it checked at its
share stage; the server removes the survivors' excess from the seeds revealed under the certified
view, so the released sum carries exactly ``(zCs)^2`` of honest noise for every survivor count. The
round's event is the dominating Gaussian of that sum
(:meth:`fedprivacy.secagg.ddp.DistributedDPConfig.release` for the survivors in the sum,
``ServerSession.u3``, and the roster), never the plan; the budget check before the round uses the
worst case, ``t`` survivors. A round that aborts
(fewer than ``t`` clients at any stage, a disconnected survivor graph, a protocol violation) releases
nothing, spends nothing and leaves the global model unchanged (``RoundOutcome.aborted``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from fedprivacy.fl.charging import before_release
from fedprivacy.fl.secure.params import (
    largest_roster,
    make_encoding,
    public_sampling,
    secagg_parameters,
)
from fedprivacy.fl.types import (
    AggregateResult,
    ClientUpdate,
    RoundInstructions,
    RoundOutcome,
    SecureRoundInfo,
)
from fedprivacy.secagg.encoding import EncodingSpec, round_degree
from fedprivacy.secagg.protocol import (
    AdvertiseKeys,
    ConsistencyResponse,
    MaskedInput,
    ProtocolViolation,
    RoundAborted,
    ServerSession,
    SetupRequest,
    SharedKeys,
    UnmaskResponse,
)

if TYPE_CHECKING:
    from fedprivacy.accounting.distributed import XNoiseDesign
    from fedprivacy.accounting.events import PrivacyEvent
    from fedprivacy.config import RunConfig
    from fedprivacy.dp.rng import RandomSource

__all__ = ["STAGES", "PipelinedTransport", "SecureRound", "SecureTransport"]

STAGES = ("advertise", "share", "masked", "consistency", "unmask")
_REPLY_TYPES = {"advertise": AdvertiseKeys, "share": SharedKeys, "masked": MaskedInput,
                "consistency": ConsistencyResponse, "unmask": UnmaskResponse}
Replies = tuple[dict[int, Any], dict[int, str]]


class SecureTransport(Protocol):
    """Sends one stage's requests (partition id -> protocol message) and returns the replies.

    ``stage("share", ...)`` also carries the round instructions and the encoding (the client checks
    both against its own floor before it shares anything); ``stage("masked", ...)`` the model and the
    instructions, and its replies are ``(MaskedInput, ClientUpdate)`` pairs (the ClientUpdate holds
    only the metadata the privacy mode lets a client disclose, ``delta=()``). Missing or failed
    replies go to ``failures``.
    """

    def stage(self, name: str, requests: Mapping[int, Any], *, instructions: RoundInstructions | None = None,
              weights: Sequence[np.ndarray] | None = None, encoding: EncodingSpec | None = None,
              ) -> Replies: ...


@runtime_checkable
class PipelinedTransport(SecureTransport, Protocol):
    """A :class:`SecureTransport` that can merge round r's unmask stage with round r+1's advertise."""

    def unmask_and_advertise(self, unmask: Mapping[int, Any], setups: Mapping[int, Any]
                             ) -> tuple[dict[int, Any], dict[int, str], dict[int, Any], dict[int, str]]: ...


class SecureRound:
    """The secure :data:`fedprivacy.fl.types.RoundFn` (four exchanges per round, three pipelined)."""

    def __init__(self, cfg: RunConfig, transport: SecureTransport, *, population: int,
                 log: Callable[[str], None] = print) -> None:
        from fedprivacy.fl.sampling import expected_cohort

        if not cfg.secagg:
            raise ValueError("SecureRound needs secagg=true")
        if cfg.privacy not in ("none", "distributed"):
            raise ValueError(f"secagg=true supports privacy 'none' or 'distributed', got {cfg.privacy!r}")
        self.cfg = cfg
        self.transport = transport
        self.population = population
        self.threshold, self.degree = secagg_parameters(cfg, population=population)
        self.log = log
        self._pending: tuple[SetupRequest, tuple[int, ...], dict[int, Any], dict[int, str]] | None = None
        self.denominator = expected_cohort(sampling=cfg.sampling, population=population,
                                           sample_rate=cfg.sample_rate, cohort_size=cfg.cohort_size)

    def _next_round_setup(self, instr: RoundInstructions, *, dim: int
                          ) -> tuple[SetupRequest, tuple[int, ...]] | None:
        """Round r+1's setup and cohort, when both are known now (else None: no pipelining).

        Only with full participation (``sample-rate = 1``, or a fixed cohort of the whole
        population): then the next cohort is every partition, independent of any data, as the merging
        rule in :mod:`fedprivacy.secagg.protocol` requires. The transport must support it.
        """
        cfg = self.cfg
        if instr.round >= cfg.num_server_rounds or not isinstance(self.transport, PipelinedTransport):
            return None
        full = ((cfg.sampling == "poisson" and cfg.sample_rate >= 1.0)
                or (cfg.sampling == "fixed" and cfg.cohort_size == self.population))
        if not full:
            return None
        cohort = tuple(range(self.population))
        k = round_degree(cohort=len(cohort), degree=self.degree, threshold=self.threshold,
                         colluders=cfg.secagg_colluders)
        return self._setup(instr.round + 1, degree=k, dim=dim), cohort

    def _setup(self, round_: int, *, degree: int, dim: int) -> SetupRequest:
        cfg = self.cfg
        return SetupRequest(round=round_, threshold=self.threshold, degree=degree, modulus_bits=cfg.secagg_bits,
                            dim=dim, min_survivors=self.threshold, colluders=cfg.secagg_colluders,
                            active=cfg.secagg_schedule == "active")

    def _aborted(self, reason: str, *, like: Sequence[np.ndarray], failures: dict[int, str],
                 info: SecureRoundInfo) -> RoundOutcome:
        zero = tuple(np.zeros_like(np.asarray(w)) for w in like)
        agg = AggregateResult(mean_update=zero, aggregated=(), dropped={}, noise_std=0.0,
                              denominator=float(self.denominator))
        return RoundOutcome(aggregate=agg, failures=dict(failures), updates=(), event=None,
                            aborted=reason, secagg=info)

    def _check(self, name: str, replies: dict[int, Any], failures: dict[int, str], *,
               round: int) -> dict[int, Any]:
        """Keep replies of the right type, sender and round; the others count as dropouts.

        (A reply that fails here would otherwise make the server session refuse the whole stage, so one
        faulty client could abort every round.)
        """
        kept = {}
        for pid, reply in replies.items():
            msg: Any = reply[0] if name == "masked" else reply
            if (not isinstance(msg, _REPLY_TYPES[name]) or getattr(msg, "node_id", None) != pid
                    or getattr(msg, "round", None) != round):
                failures[pid] = f"secagg {name}: malformed reply (wrong type, sender or round)"
                continue
            kept[pid] = reply
        return kept

    def _stage(self, name: str, requests: Mapping[int, Any], progress: _Progress, *, round: int,
               **payload: Any) -> dict[int, Any]:
        replies, f = self.transport.stage(name, requests, **payload)
        progress.failures.update(f)
        kept = self._check(name, replies, progress.failures, round=round)
        progress.exchanges += 1
        return kept

    def _advertise(self, setup: SetupRequest, cohort: Sequence[int], progress: _Progress) -> dict[int, Any]:
        """Stage 1, or the keys that already came with the previous round's unmask exchange."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == setup and pending[1] == tuple(cohort):
            progress.pipelined = True
            progress.failures.update(pending[3])
            return self._check("advertise", pending[2], progress.failures, round=setup.round)
        return self._stage("advertise", {pid: setup for pid in cohort}, progress, round=setup.round)

    def _unmask(self, instr: RoundInstructions, ureqs: Mapping[int, Any], progress: _Progress, *,
                dim: int) -> dict[int, Any]:
        """Stage 4, carrying round r+1's stage 1 when the next cohort is already known."""
        nxt = self._next_round_setup(instr, dim=dim)
        if nxt is None:
            return self._stage("unmask", ureqs, progress, round=instr.round)
        next_setup, next_cohort = nxt
        transport: Any = self.transport
        unm, f, adv_next, f_next = transport.unmask_and_advertise(
            ureqs, {pid: next_setup for pid in next_cohort})
        self._pending = (next_setup, next_cohort, adv_next, f_next)
        progress.failures.update(f)
        kept = self._check("unmask", unm, progress.failures, round=instr.round)
        progress.exchanges += 1
        return kept

    def _protocol(self, server: ServerSession, instr: RoundInstructions, cohort: Sequence[int],
                  weights: Sequence[np.ndarray], enc: EncodingSpec, progress: _Progress
                  ) -> tuple[np.ndarray, dict[int, ClientUpdate]]:
        """The four stages; returns the unmasked sum mod 2^b and the metadata the clients disclosed.

        Raises RoundAborted or ProtocolViolation (then the caller releases nothing).
        """
        rnd = instr.round
        adv = self._advertise(server.setup, cohort, progress)
        roster = server.receive_keys(list(adv.values()))
        progress.roster = len(roster.node_ids)
        shared = self._stage("share", {pid: roster for pid in roster.node_ids}, progress, round=rnd,
                             instructions=instr, encoding=enc)
        mreqs = server.receive_shares(list(shared.values()))
        masked = self._stage("masked", mreqs, progress, round=rnd, instructions=instr, weights=weights)
        updates = {pid: upd for pid, (_, upd) in masked.items()}
        ureqs = server.receive_masked([m for m, _ in masked.values()])
        if server.setup.active:  # every survivor signs the one view before anyone reveals a share
            views = self._stage("consistency", ureqs, progress, round=rnd)
            ureqs = server.receive_consistency(list(views.values()))
        # The survivors (server.u3) and hence the round's event are known here, before the unmask
        # requests go out: the write-ahead charge of the release (issue 11; raises on the budget).
        before_release(self._event(enc, len(server.u3), progress.info())[0])
        unm = self._unmask(instr, ureqs, progress, dim=enc.padded_dim)
        return server.receive_unmask(list(unm.values())), updates

    def _event(self, enc: EncodingSpec, survivors: int, info: SecureRoundInfo
               ) -> tuple[PrivacyEvent | None, float, SecureRoundInfo]:
        """The event the survivors' noise gives (distributed), the sum's noise std, the row figures.

        Distributed: the round's dominating Gaussian from the noise actually left in the sum
        (:meth:`fedprivacy.secagg.ddp.DistributedDPConfig.release`), under the sampling of the
        ledger's audience (``privacy-audience``: the run's sampling for observers with exact noise,
        none otherwise).
        """
        if self.cfg.privacy != "distributed":
            info = dataclasses.replace(info, max_abs_error=enc.max_abs_error(num_clients=survivors),
                                       noise_std_sum=0.0)
            return None, 0.0, info
        from fedprivacy.accounting.events import NoSampling

        ddp = enc.ddp()
        rel = ddp.release(roster=info.roster or survivors, survivors=survivors)
        # charged: the run's one worst case (largest roster, slack sup over survivor counts), so that
        # nothing published depends on this round's counts (review F2, F6); it must dominate the
        # realised release, which carries at least its honest noise
        largest = largest_roster(self.cfg, population=self.population)
        worst = ddp.worst_release(max_roster=max(self.threshold, largest))
        if not (rel.honest_variance >= worst.honest_variance and rel.eta + rel.sampler_ratio
                <= worst.eta + worst.sampler_ratio and rel.sampler_tv <= worst.sampler_tv):
            raise ProtocolViolation(f"the round's noise ({rel.honest_variance:.17g}) is not covered by "
                                    f"the run's worst case ({worst.honest_variance:.17g})")
        observers = self.cfg.privacy_audience == "observers"
        event = worst.event(public_sampling(self.cfg, population=self.population) if observers
                            else NoSampling())
        noise_std = math.sqrt(rel.released_variance) / enc.scale
        return event, noise_std, dataclasses.replace(info, noise_std_sum=noise_std, dim=enc.padded_dim)

    def __call__(self, instr: RoundInstructions, cohort: Sequence[int], weights: Sequence[np.ndarray],
                 rng: RandomSource) -> RoundOutcome:
        cfg = self.cfg
        n, t = len(cohort), self.threshold
        progress = _Progress(threshold=t)
        if n < t:
            return self._aborted(f"cohort of {n} is below the secagg threshold {t}", like=weights,
                                 failures=progress.failures, info=progress.info())
        progress.degree = round_degree(cohort=n, degree=self.degree, threshold=t,
                                       colluders=cfg.secagg_colluders)
        enc = self._encoding(instr, dim=int(sum(np.size(w) for w in weights)), threshold=t,
                             rotation_seed=rng.child("rotation").random_bytes(32))
        server = ServerSession(self._setup(instr.round, degree=progress.degree, dim=enc.padded_dim),
                               noise_design=_noise_design(enc))
        try:
            total, updates = self._protocol(server, instr, cohort, weights, enc, progress)
        except (RoundAborted, ProtocolViolation) as exc:
            progress.merge(server.failures)
            return self._aborted(f"secure aggregation aborted: {exc}", like=weights,
                                 failures=progress.failures, info=progress.info())
        progress.merge(server.failures)
        return self._released(instr, weights, enc, total, updates, survivors=tuple(sorted(server.u3)),
                              progress=progress)

    def _encoding(self, instr: RoundInstructions, *, dim: int, threshold: int,
                  rotation_seed: bytes) -> EncodingSpec:
        """The round's encoding (the run's; :class:`fedprivacy.fl.adaptive_clip.AdaptiveSecureRound`
        gives each round its own clip norm and count coordinate)."""
        return make_encoding(self.cfg, population=self.population, dim=dim, threshold=threshold,
                             rotation_seed=rotation_seed)

    def _released(self, instr: RoundInstructions, weights: Sequence[np.ndarray], enc: EncodingSpec,
                  total: np.ndarray, updates: Mapping[int, ClientUpdate], *, survivors: tuple[int, ...],
                  progress: _Progress) -> RoundOutcome:
        """Decode the survivors' sum into the mean update; the outcome with the event that ran."""
        from fedprivacy.dp.clipping import unflatten

        mean = unflatten(enc.decode(total) / self.denominator, weights)
        mean_update = tuple(np.asarray(m).astype(np.asarray(w).dtype) for m, w in zip(mean, weights, strict=True))
        info = dataclasses.replace(progress.info(), survivors=len(survivors))
        event, noise_std, info = self._event(enc, len(survivors), info)
        failures = progress.failures
        for pid, reason in failures.items():  # in the sum; dropped out only at the unmask stage
            if pid in survivors:
                self.log(f"  round {instr.round}: client {pid} is in the sum but missed a later stage: {reason}")
        agg = AggregateResult(mean_update=mean_update, aggregated=survivors, dropped={}, noise_std=noise_std,
                              denominator=float(self.denominator))
        kept = tuple(updates[p] for p in survivors if p in updates)
        dropped = {pid: reason for pid, reason in failures.items() if pid not in survivors}
        return RoundOutcome(aggregate=agg, failures=dropped, updates=kept, event=event, secagg=info)


def _noise_design(enc: EncodingSpec) -> Callable[[int], XNoiseDesign] | None:
    """The XNoise design of a round of ``n`` clients under ``enc`` (None without distributed DP): the
    server removes the survivors' excess components, revealed only under the certified view."""
    if enc.kind != "ddgauss" or not enc.xnoise:
        return None
    ddp = enc.ddp()
    return lambda n: ddp.design(roster=n)


@dataclasses.dataclass(slots=True)
class _Progress:
    """What one secure round has done so far (mutable, local to one call)."""

    threshold: int
    exchanges: int = 0
    degree: int | None = None
    pipelined: bool = False
    roster: int | None = None
    failures: dict[int, str] = dataclasses.field(default_factory=dict)

    def merge(self, failures: Mapping[int, str]) -> None:
        """The server session's reasons for the clients it left out (a transport reason wins)."""
        for pid, reason in failures.items():
            self.failures.setdefault(pid, f"secagg: {reason}")

    def info(self) -> SecureRoundInfo:
        return SecureRoundInfo(threshold=self.threshold, exchanges=self.exchanges, degree=self.degree,
                               pipelined=self.pipelined, roster=self.roster)
