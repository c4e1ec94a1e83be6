"""The server side of a DP-FedAvg round under secure aggregation (``secagg = true``).

The round runs the SecAgg+ state machines of :mod:`fedprivacy.secagg` over any transport that
implements :class:`SecureTransport` (the Flower Grid in ``server/secagg_exchange.py``, a direct
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

Pipelining: with a :class:`PipelinedTransport` and the next round's inputs
(:meth:`SecureRound.set_lookahead`), round r+1's key stages ride on round r's last exchanges: three
exchanges per round on the active schedule, two on the semi-honest one, in steady state.

Privacy (``distributed``): the released sum carries exactly ``(zCs)^2`` of honest XNoise for every
survivor count; the round's event is the dominating Gaussian of that sum for the survivors really in
it (:meth:`fedprivacy.secagg.ddp.DistributedDPConfig.release`), never the plan, and the budget check
before the round uses the worst case, ``t`` survivors. A round that aborts releases nothing, spends
nothing and leaves the global model unchanged (``RoundOutcome.aborted``).
Rationale: docs/SECAGG.md, sections "Exchanges per round" and "The secure round's server side".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from fedprivacy.fl.charging import before_release
from fedprivacy.fl.secure.noise import GaussianSumNoise, ServerNoise
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
from fedprivacy.secagg.messages import (
    AdvertiseKeys,
    ConsistencyResponse,
    MaskedInput,
    ProtocolViolation,
    RoundAborted,
    SetupRequest,
    SharedKeys,
    UnmaskResponse,
)
from fedprivacy.secagg.server_session import ServerSession

if TYPE_CHECKING:
    from fedprivacy.accounting.events import PrivacyEvent
    from fedprivacy.accounting.xnoise_design import XNoiseDesign
    from fedprivacy.config import RunConfig
    from fedprivacy.dp.rng import RandomSource

__all__ = ["STAGES", "PipelinedTransport", "SecureRound", "SecureTransport"]

Lookahead = Callable[[int], "tuple[RoundInstructions, Sequence[int], RandomSource] | None"]

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
    """A :class:`SecureTransport` that also sends one key stage of round r+1 (``next_name``:
    ``advertise`` or ``share``) in the same exchange as a stage of round r: one message per node
    carrying both parts, or either part alone. Returns ``(replies, failures)`` of each part."""

    def stage_with_next(self, name: str, requests: Mapping[int, Any], payload: Mapping[str, Any],
                        next_name: str, next_requests: Mapping[int, Any], next_payload: Mapping[str, Any],
                        ) -> tuple[Replies, Replies]: ...


class SecureRound:
    """The secure :data:`fedprivacy.fl.types.RoundFn` (five exchanges per round, three pipelined)."""

    def __init__(self, cfg: RunConfig, transport: SecureTransport, *, population: int,
                 log: Callable[[str], None] = print, central_noise_multiplier: float | None = None,
                 server_noise: ServerNoise | None = None, denominator: float | None = None) -> None:
        from fedprivacy.fl.sampling import expected_cohort

        if not cfg.secagg:
            raise ValueError("SecureRound needs secagg=true")
        if central_noise_multiplier is not None:  # shorthand for the i.i.d. Gaussian (privacy central)
            if server_noise is not None:
                raise ValueError("give central_noise_multiplier or server_noise, not both")
            server_noise = GaussianSumNoise(noise_multiplier=central_noise_multiplier)
        if cfg.mode.secure_noise and server_noise is not None:
            raise ValueError("a mode whose noise is added in secure aggregation takes no server noise")
        if cfg.is_dp and not cfg.mode.secure_noise and server_noise is None:
            raise ValueError(f"secagg=true with privacy={cfg.privacy!r} needs the server's noise "
                             "(on the unmasked sum) or noise added in secure aggregation")
        #: what the server adds to the unmasked sum before decoding (central, dpftrl), else None
        self.server_noise = server_noise
        self.cfg = cfg
        self.transport = transport
        self.population = population
        self.threshold, self.degree = secagg_parameters(cfg, population=population)
        self.log = log
        self.lookahead: Lookahead | None = None
        self._ahead: _Ahead | None = None  # round r+1's key stages done during round r
        self.denominator = denominator if denominator is not None else expected_cohort(
            sampling=cfg.sampling, population=population, sample_rate=cfg.sample_rate,
            cohort_size=cfg.cohort_size)

    def set_lookahead(self, lookahead: Lookahead) -> None:
        """``lookahead(r)``: round r's instructions, cohort and source exactly as the run will pass them
        (None past the last round); :meth:`fedprivacy.fl.run.FederatedRun.round_inputs`."""
        self.lookahead = lookahead

    def _plan_ahead(self, instr: RoundInstructions, enc: EncodingSpec, *, dim: int) -> _Ahead | None:
        """Round r+1's setup (and, when it is the run's, its encoding), to run its key stages now.

        None without a lookahead or a pipelining transport, after the last round, or for a next cohort
        below the threshold (that round aborts at once). The next cohort comes from the run's sampling,
        independent of any data; its sessions are separate from round r's (fresh keys, seeds, round
        number), so merging the messages changes what no client reveals (``docs/SECAGG.md``).
        """
        if self.lookahead is None or not isinstance(self.transport, PipelinedTransport):
            return None
        inputs = self.lookahead(instr.round + 1)
        if inputs is None or len(inputs[1]) < self.threshold:
            return None
        nxt_instr, nxt_cohort, nxt_rng = inputs
        degree = round_degree(cohort=len(nxt_cohort), degree=self.degree, threshold=self.threshold,
                              colluders=self.cfg.secagg_colluders)
        nxt_enc = None
        if type(self)._encoding is SecureRound._encoding:  # the run's encoding: known before round r ends
            nxt_enc = self._encoding(nxt_instr, dim=dim, threshold=self.threshold,
                                     rotation_seed=nxt_rng.child("rotation").random_bytes(32))
        setup = self._setup(nxt_instr.round, degree=degree, dim=(nxt_enc or enc).padded_dim)
        self._ahead = _Ahead(instructions=nxt_instr, cohort=tuple(nxt_cohort), setup=setup, encoding=nxt_enc)
        return self._ahead

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
               ahead: _Ahead | None = None, **payload: Any) -> dict[int, Any]:
        """One exchange: this round's stage ``name``, and round r+1's next key stage if ``ahead`` has one."""
        nxt = None if ahead is None else ahead.next_stage()
        if nxt is None:
            replies, f = self.transport.stage(name, requests, **payload)
        else:
            assert ahead is not None
            transport: Any = self.transport
            (replies, f), (nxt_replies, nxt_f) = transport.stage_with_next(
                name, requests, payload, nxt[0], nxt[1], nxt[2])
            ahead.failures.update(nxt_f)
            ahead.received(nxt[0], self._check(nxt[0], nxt_replies, ahead.failures, round=ahead.setup.round))
        progress.failures.update(f)
        kept = self._check(name, replies, progress.failures, round=round)
        progress.exchanges += 1
        return kept

    def _keys(self, server: ServerSession, cohort: Sequence[int], instr: RoundInstructions, enc: EncodingSpec,
              progress: _Progress, pending: _Ahead | None) -> dict[int, Any]:
        """Stages 1 and 2 (or what of them rode on the previous round): the masked-input requests."""
        rnd = instr.round
        if pending is not None and pending.advertised is not None:
            progress.pipelined = True
            progress.failures.update(pending.failures)
            if pending.aborted is not None:
                raise RoundAborted(pending.aborted)
            if pending.masked_requests is not None:
                progress.roster = pending.roster
                return pending.masked_requests
        adv = (pending.advertised if pending is not None and pending.advertised is not None
               else self._stage("advertise", {pid: server.setup for pid in cohort}, progress, round=rnd))
        roster = server.receive_keys(list(adv.values()))
        progress.roster = len(roster.node_ids)
        shared = self._stage("share", {pid: roster for pid in roster.node_ids}, progress, round=rnd,
                             instructions=instr, encoding=enc)
        return server.receive_shares(list(shared.values()))

    def _protocol(self, server: ServerSession, instr: RoundInstructions, cohort: Sequence[int],
                  weights: Sequence[np.ndarray], enc: EncodingSpec, progress: _Progress,
                  pending: _Ahead | None = None) -> tuple[np.ndarray, dict[int, ClientUpdate]]:
        """The stages; returns the unmasked sum mod 2^b and the metadata the clients disclosed.

        Raises RoundAborted or ProtocolViolation (then the caller releases nothing).
        """
        rnd = instr.round
        mreqs = self._keys(server, cohort, instr, enc, progress, pending)
        ahead = self._plan_ahead(instr, enc, dim=int(sum(np.size(w) for w in weights)))
        active = server.setup.active
        masked = self._stage("masked", mreqs, progress, round=rnd, ahead=None if active else ahead,
                             instructions=instr, weights=weights)
        updates = {pid: upd for pid, (_, upd) in masked.items()}
        ureqs = server.receive_masked([m for m, _ in masked.values()])
        if active:  # every survivor signs the one view before anyone reveals a share
            views = self._stage("consistency", ureqs, progress, round=rnd, ahead=ahead)
            ureqs = server.receive_consistency(list(views.values()))
        # The survivors (server.u3) and hence the round's event are known here, before the unmask
        # requests go out: the write-ahead charge of the release (raises on the budget).
        noise = self.server_noise
        before_release(self._event(enc, len(server.u3), progress.info())[0] if noise is None else noise.event(rnd))
        if noise is not None:
            noise.charged(rnd)
        unm = self._stage("unmask", ureqs, progress, round=rnd, ahead=ahead)
        return server.receive_unmask(list(unm.values())), updates

    def _event(self, enc: EncodingSpec, survivors: int, info: SecureRoundInfo
               ) -> tuple[PrivacyEvent | None, float, SecureRoundInfo]:
        """The event the survivors' noise gives (distributed), the sum's noise std, the row figures.

        Distributed: the round's dominating Gaussian from the noise actually left in the sum
        (:meth:`fedprivacy.secagg.ddp.DistributedDPConfig.release`), under the sampling of the
        ledger's audience (``privacy-audience``: the run's sampling for observers with exact noise,
        none otherwise).
        """
        if not self.cfg.mode.secure_noise:  # the plan's event, if any (central: the server's noise)
            std = 0.0 if self.server_noise is None else self.server_noise.noise_std(enc)
            info = dataclasses.replace(info, max_abs_error=enc.max_abs_error(num_clients=survivors),
                                       noise_std_sum=std)
            return None, std, info
        from fedprivacy.accounting.events import NoSampling

        ddp = enc.ddp()
        rel = ddp.release(roster=info.roster or survivors, survivors=survivors)
        # charged: the run's one worst case (largest roster, slack sup over survivor counts), so that
        # nothing published depends on this round's counts; it must dominate the
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
        pending, self._ahead = self._ahead, None
        if n < t:
            return self._aborted(f"cohort of {n} is below the secagg threshold {t}", like=weights,
                                 failures=progress.failures, info=progress.info())
        progress.degree = round_degree(cohort=n, degree=self.degree, threshold=t,
                                       colluders=cfg.secagg_colluders)
        if pending is not None and (pending.setup.round != instr.round or pending.cohort != tuple(cohort)
                                    or (pending.encoding is not None and pending.instructions != instr)):
            pending = None  # not this round's inputs (the run did not follow its lookahead)
        if pending is not None and pending.encoding is not None:
            enc = pending.encoding
        else:
            enc = self._encoding(instr, dim=int(sum(np.size(w) for w in weights)), threshold=t,
                                 rotation_seed=rng.child("rotation").random_bytes(32))
        setup = self._setup(instr.round, degree=progress.degree, dim=enc.padded_dim)
        if pending is not None and pending.setup != setup:
            pending = None
        server = (pending.server if pending is not None and pending.server is not None
                  else ServerSession(setup, noise_design=_noise_design(enc)))
        try:
            total, updates = self._protocol(server, instr, cohort, weights, enc, progress, pending)
        except (RoundAborted, ProtocolViolation) as exc:
            progress.merge(server.failures)
            return self._aborted(f"secure aggregation aborted: {exc}", like=weights,
                                 failures=progress.failures, info=progress.info())
        progress.merge(server.failures)
        if self.server_noise is not None:  # charged before the unmask; released only now
            from fedprivacy.secagg.quantize import torus_noised

            noise = self.server_noise.draw(enc, round=instr.round, size=int(np.size(total)), rng=rng)
            total = torus_noised(total, noise, modulus_bits=enc.modulus_bits)  # lifted to [-2^(b-1), 2^(b-1))
        return self._released(instr, weights, enc, total, updates, survivors=tuple(sorted(server.u3)),
                              progress=progress)

    def _encoding(self, instr: RoundInstructions, *, dim: int, threshold: int,
                  rotation_seed: bytes) -> EncodingSpec:
        """The round's encoding (the run's; :class:`fedprivacy.fl.adaptive_clip.AdaptiveSecureRound`
        gives each round its own clip norm and count coordinate)."""
        headroom = None if self.server_noise is None else self.server_noise.headroom_multiplier
        return make_encoding(self.cfg, population=self.population, dim=dim, threshold=threshold,
                             rotation_seed=rotation_seed, server_noise_multiplier=headroom)

    def _released(self, instr: RoundInstructions, weights: Sequence[np.ndarray], enc: EncodingSpec,
                  total: np.ndarray, updates: Mapping[int, ClientUpdate], *, survivors: tuple[int, ...],
                  progress: _Progress) -> RoundOutcome:
        """Decode the survivors' sum into the mean update; the outcome with the event that ran."""
        from fedprivacy.dp.clipping import unflatten

        # central: ``total`` is already the noised sum's centred real lift, in ring units
        decoded = enc.decode(total) if self.server_noise is None else total / enc.scale
        mean = unflatten(decoded / self.denominator, weights)
        mean_update = tuple(np.asarray(m).astype(np.asarray(w).dtype) for m, w in zip(mean, weights, strict=True))
        info = dataclasses.replace(progress.info(), survivors=len(survivors))
        event, noise_std, info = self._event(enc, len(survivors), info)
        failures = progress.failures
        missed = {pid: reason for pid, reason in failures.items() if pid in survivors}  # in the sum; a later stage
        if missed and not self.cfg.mode.disclosure(self.cfg).participation:  # who took part is private
            self.log(f"  round {instr.round}: clients in the sum missed a later stage (ids not published)")
        else:
            for pid, reason in missed.items():
                self.log(f"  round {instr.round}: client {pid} is in the sum but missed a later stage: {reason}")
        if missed:  # the completion depended on the other survivors' shares: the row says how many
            info = dataclasses.replace(info, late=len(missed))
        # the server's noise: std (per unit of C) times Delta on a sum whose sensitivity is Delta
        noise = self.server_noise
        ratio = 1.0 if noise is None else noise.sensitivity_ratio(enc)
        if noise is not None:
            event = noise.event(instr.round)
        agg = AggregateResult(mean_update=mean_update, aggregated=survivors, dropped={}, noise_std=noise_std,
                              denominator=float(self.denominator), sensitivity_ratio=ratio,
                              correlated_draw=None if noise is None else noise.correlated_draw(instr.round))
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
class _Ahead:
    """Round r+1's key stages as they ride on round r's exchanges (mutable, held by the SecureRound)."""

    instructions: RoundInstructions
    cohort: tuple[int, ...]
    setup: SetupRequest
    encoding: EncodingSpec | None  # None: the round's encoding is not known ahead (no share stage ahead)
    advertised: dict[int, Any] | None = None
    server: ServerSession | None = None
    roster: int | None = None
    masked_requests: dict[int, Any] | None = None
    aborted: str | None = None
    failures: dict[int, str] = dataclasses.field(default_factory=dict)

    def next_stage(self) -> tuple[str, dict[int, Any], dict[str, Any]] | None:
        """The next key stage to send (name, requests, payload), or None (done, or not possible ahead)."""
        if self.aborted is not None:
            return None
        if self.advertised is None:
            return "advertise", {pid: self.setup for pid in self.cohort}, {}
        if self.encoding is None or self.server is not None:
            return None
        self.server = ServerSession(self.setup, noise_design=_noise_design(self.encoding))
        try:
            roster = self.server.receive_keys(list(self.advertised.values()))
        except (RoundAborted, ProtocolViolation) as exc:
            self.aborted = str(exc)
            return None
        self.roster = len(roster.node_ids)
        return "share", {pid: roster for pid in roster.node_ids}, {"instructions": self.instructions,
                                                                  "encoding": self.encoding}

    def received(self, name: str, replies: dict[int, Any]) -> None:
        if name == "advertise":
            self.advertised = replies
            return
        assert self.server is not None
        try:
            self.masked_requests = self.server.receive_shares(list(replies.values()))
        except (RoundAborted, ProtocolViolation) as exc:
            self.aborted = str(exc)


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
