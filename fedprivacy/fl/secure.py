"""A DP-FedAvg round under secure aggregation (``secagg = true``; privacy ``none`` or ``distributed``).

The round runs the SecAgg+ state machines of :mod:`fedprivacy.secagg.protocol` over any transport
that implements :class:`SecureTransport` (the Flower Grid in ``server/secagg_exchange.py``, a direct
function call in tests). Four exchanges per round, no pipelining across rounds:

====================  ======================================  =======================================
exchange              server -> each client                   client -> server
====================  ======================================  =======================================
1 ``advertise``       ``SetupRequest``                        ``AdvertiseKeys`` (fresh X25519 keys)
2 ``share``           ``ShareKeysRequest`` (roster)           ``SharedKeys`` (sealed Shamir shares)
3 ``masked`` (train)  model, instructions, encoding,          ``MaskedInput``: the client trains, clips,
                      ``MaskedInputRequest``                  encodes and masks its update
4 ``unmask``          ``UnmaskRequest`` (survivors, dropped)  ``UnmaskResponse``
====================  ======================================  =======================================

Stages 2|3 and 3|4 of one round cannot be merged (``docs/SECAGG.md``, "Merging stages"). With full
participation (``sample-rate = 1`` or a fixed cohort of everyone) the cohort of round r+1 is known
before round r ends and does not depend on data, so round r+1's stage 1 (``SetupRequest`` ->
``AdvertiseKeys``: fresh keys, bound to r+1, independent of r) rides on round r's unmask exchange:
three exchanges per round after the first (``info["secagg_pipelined"]``). With client sampling the
next cohort is drawn only when r+1 starts, so every round takes four exchanges.

Encodings (:class:`EncodingSpec`), both on the client, from the update it already clipped to ``C``:

* ``fixed-point`` (privacy ``none``): clip, scale by ``s``, stochastic rounding, mod ``2^b``
  (:func:`fedprivacy.secagg.quantize.encode_fixed_point`). The decoded sum differs from the sum of
  the clipped float updates by less than ``n/s`` per coordinate (``n`` survivors).
* ``ddgauss`` (privacy ``distributed``): the distributed discrete Gaussian of Kairouz, Liu & Steinke
  2021 (:mod:`fedprivacy.secagg.ddp`): rotation, conditional rounding, ``N_Z(0, (zCs)^2/t)`` per
  client, modular clipping. Any ``t`` or more survivors carry at least ``(zCs)^2`` of noise variance.

Privacy (``distributed``): the round's event is :func:`fedprivacy.accounting.distributed.round_event`
for the number of clients whose masked input is in the released sum (``ServerSession.u3``), never the
plan; the budget check before the round uses the worst case, ``t`` survivors. A round that aborts
(fewer than ``t`` clients at any stage, a disconnected survivor graph, a protocol violation) releases
nothing, spends nothing and leaves the global model unchanged (``RoundOutcome.aborted``).

Client secrets: between exchanges a client's :class:`ClientSession` lives in a :class:`SessionStore`;
the ClientApp uses :class:`ExportedSessionStore` over the node's ``context.state`` (client side only,
see ``clients/secagg_handlers.py``), never messages, metrics, logs or files.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedprivacy.accounting.events import Neighbouring
from fedprivacy.fl.aggregation import AggregateResult, ClientUpdate
from fedprivacy.fl.client import RoundInstructions
from fedprivacy.fl.loop import RoundOutcome
from fedprivacy.fl.privacy import register_plan
from fedprivacy.secagg.graph import min_safe_threshold
from fedprivacy.secagg.protocol import (
    AdvertiseKeys,
    ClientSession,
    MaskedInput,
    MaskedInputRequest,
    RoundAborted,
    SetupRequest,
    SharedKeys,
    ShareKeysRequest,
    UnmaskRequest,
    UnmaskResponse,
)

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.fl.privacy import PrivacyPlan
    from fedprivacy.secagg.ddp import DistributedDPConfig

__all__ = [
    "STAGES",
    "EncodingSpec",
    "SecureRound",
    "SecureTransport",
    "ExportedSessionStore",
    "SessionStore",
    "client_advertise",
    "client_masked",
    "client_share",
    "client_unmask",
    "distributed_privacy_summary",
    "export_session",
    "import_session",
    "plan_distributed",
    "secagg_parameters",
]

STAGES = ("advertise", "share", "masked", "unmask")
ENCODINGS = ("fixed-point", "ddgauss")
_MAX_SCALED_CLIP = 2.0**20  # C*s beyond this adds no precision worth having


# ----------------------------------------------------------------------------- parameters
def expected_cohort_size(cfg: RunConfig, *, population: int) -> int:
    """The cohort the round parameters are sized for (``cohort-size`` or ``round(q N)``)."""
    if cfg.sampling == "fixed":
        return int(cfg.cohort_size)
    return max(1, int(round(cfg.sample_rate * population)))


def secagg_parameters(cfg: RunConfig, *, population: int) -> tuple[int, int]:
    """``(threshold t, degree k)`` of the run, sized for the expected cohort ``n``.

    Automatic degree (``secagg-neighbours = 0``): the complete graph for ``n <= 30`` (Bonawitz et al.
    2017), else ``2 ceil(log2 n) + 1`` (SecAgg+, Bell et al. 2020; 15 for n = 100, see
    ``docs/SECAGG.md`` "Choosing k"). Automatic threshold: the smallest safe one,
    ``t = floor((k + 1)/2) + 1`` (:func:`fedprivacy.secagg.graph.min_safe_threshold`).
    """
    n = expected_cohort_size(cfg, population=population)
    if n < 3:
        raise ValueError(f"secagg needs an expected cohort of >= 3 clients, got {n} "
                         f"(population {population}, sampling {cfg.sampling})")
    if cfg.secagg_neighbours:
        k = min(cfg.secagg_neighbours, n - 1)
    else:
        k = n - 1 if n <= 30 else min(n - 1, 2 * math.ceil(math.log2(n)) + 1)
    t = cfg.secagg_threshold or min_safe_threshold(k)
    if t > n:
        raise ValueError(f"secagg-threshold must be <= the expected cohort {n}, got {t}")
    if 2 * t <= k + 1:
        raise ValueError(f"secagg-threshold must be > (secagg-neighbours+1)/2 = {(k + 1) / 2} "
                         f"(Bonawitz et al. 2017, Sec. 4), got {t}")
    return t, k


def round_degree(*, cohort: int, degree: int, threshold: int) -> int:
    """The degree used for a cohort of ``cohort`` clients: ``min(n-1, k, 2t-2)`` keeps ``t`` safe."""
    return max(2, min(cohort - 1, degree, 2 * threshold - 2))


@dataclass(frozen=True, slots=True, kw_only=True)
class EncodingSpec:
    """How a client turns its clipped float update into ``padded_dim`` residues mod ``2^b`` (public)."""

    kind: str
    dim: int
    clip_norm: float
    scale: float
    modulus_bits: int
    max_clients: int
    noise_multiplier: float = 0.0
    min_survivors: int = 1
    rotation_seed: bytes = b""

    def __post_init__(self) -> None:
        if self.kind not in ENCODINGS:
            raise ValueError(f"kind must be one of {ENCODINGS}, got {self.kind!r}")
        if self.dim < 1 or self.max_clients < 1:
            raise ValueError(f"dim and max_clients must be >= 1, got {self.dim}, {self.max_clients}")
        if not (self.clip_norm > 0 and self.scale > 0):
            raise ValueError(f"clip_norm and scale must be > 0, got {self.clip_norm}, {self.scale}")
        if self.kind == "ddgauss":
            if not self.noise_multiplier > 0:
                raise ValueError(f"noise_multiplier must be > 0 for ddgauss, got {self.noise_multiplier}")
            if len(self.rotation_seed) != 32:
                raise ValueError("rotation_seed must be 32 bytes for ddgauss")
            self.ddp()  # headroom check
        else:
            from fedprivacy.secagg.quantize import check_headroom

            check_headroom(num_clients=self.max_clients, clip_norm=self.clip_norm, scale=self.scale,
                           modulus_bits=self.modulus_bits)

    def ddp(self) -> DistributedDPConfig:
        from fedprivacy.secagg.ddp import DistributedDPConfig

        return DistributedDPConfig(dim=self.dim, clip_norm=self.clip_norm,
                                   noise_multiplier=self.noise_multiplier,
                                   min_survivors=self.min_survivors, scale=self.scale,
                                   modulus_bits=self.modulus_bits, max_clients=self.max_clients)

    @property
    def padded_dim(self) -> int:
        if self.kind == "ddgauss":
            from fedprivacy.secagg.rotation import padded_dim

            return padded_dim(self.dim)
        return self.dim

    def max_abs_error(self, *, num_clients: int) -> float:
        """Bound on the decoding error per coordinate of a fixed-point sum (``n/s``); ddgauss: noise."""
        return num_clients / self.scale

    def encode(self, flat: np.ndarray, *, rng: RandomSource) -> np.ndarray:
        if self.kind == "ddgauss":
            from fedprivacy.secagg.ddp import encode_update

            return encode_update(flat, config=self.ddp(), rotation_seed=self.rotation_seed, rng=rng)
        from fedprivacy.secagg.quantize import encode_fixed_point

        return encode_fixed_point(flat, clip_norm=self.clip_norm, scale=self.scale,
                                  modulus_bits=self.modulus_bits, rng=rng)

    def decode(self, total: np.ndarray) -> np.ndarray:
        if self.kind == "ddgauss":
            from fedprivacy.secagg.ddp import decode_sum

            return decode_sum(total, config=self.ddp(), rotation_seed=self.rotation_seed)
        from fedprivacy.secagg.quantize import decode_fixed_point

        return decode_fixed_point(total, scale=self.scale, modulus_bits=self.modulus_bits)

    def to_record(self) -> dict[str, Any]:
        return {"kind": self.kind, "dim": self.dim, "clip_norm": float(self.clip_norm),
                "scale": float(self.scale), "modulus_bits": self.modulus_bits,
                "max_clients": self.max_clients, "noise_multiplier": float(self.noise_multiplier),
                "min_survivors": self.min_survivors, "rotation_seed": bytes(self.rotation_seed)}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> EncodingSpec:
        types: dict[str, Callable[[Any], Any]] = {
            "kind": str, "dim": int, "clip_norm": float, "scale": float, "modulus_bits": int,
            "max_clients": int, "noise_multiplier": float, "min_survivors": int, "rotation_seed": bytes}
        missing = sorted(set(types) - set(record))
        if missing:
            raise ValueError(f"encoding record misses {missing}")
        return cls(**{k: t(record[k]) for k, t in types.items()})


def _largest_scale(*, clip_norm: float, fits: Callable[[float], bool]) -> float:
    """The largest power of two ``s`` with ``C s <= 2^20`` and ``fits(s)`` (headroom)."""
    s = 2.0 ** math.floor(math.log2(_MAX_SCALED_CLIP / clip_norm))
    while s > 2.0**-30:
        if fits(s):
            return s
        s /= 2.0
    raise ValueError("no fixed-point scale fits the modulus; raise secagg-bits or lower clip-norm")


def make_encoding(cfg: RunConfig, *, population: int, dim: int, threshold: int,
                  rotation_seed: bytes = b"\x00" * 32) -> EncodingSpec:
    """The run's encoding: the largest power-of-two scale whose sum over ``population`` cannot wrap.

    For ``ddgauss`` the headroom check counts the rotated signal and the noise tail at probability
    1e-9; it also keeps a factor 4 of spare range so that the scale (and hence the privacy event) is
    the same in every round.
    """
    kind = "ddgauss" if cfg.privacy == "distributed" else "fixed-point"
    base = dict(kind=kind, dim=dim, clip_norm=cfg.clip_norm, modulus_bits=cfg.secagg_bits,
                max_clients=4 * population if kind == "ddgauss" else population,
                noise_multiplier=cfg.noise_multiplier if kind == "ddgauss" else 0.0,
                min_survivors=threshold if kind == "ddgauss" else 1,
                rotation_seed=rotation_seed if kind == "ddgauss" else b"")

    def fits(s: float) -> bool:
        try:
            EncodingSpec(scale=s, **base)  # type: ignore[arg-type]
        except ValueError:
            return False
        return True

    s = _largest_scale(clip_norm=cfg.clip_norm, fits=fits)
    return EncodingSpec(scale=s, **base)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- privacy plan
def model_dim(cfg: RunConfig, *, population: int) -> int:
    """Number of parameters of the configured model (what the clients encode)."""
    from fedprivacy.fl.loop import default_hooks

    return int(sum(np.size(w) for w in default_hooks(cfg, population=population).init(0)))


def plan_distributed(cfg: RunConfig, *, population: int, denominator: float | None = None,
                     dim: int | None = None) -> PrivacyPlan:
    """The privacy plan of a ``distributed`` run; ``event`` is the worst case (``t`` survivors).

    Registered with :func:`fedprivacy.fl.privacy.register_plan`; ``dim`` defaults to the configured
    model's size.
    """
    from fedprivacy.accounting.distributed import round_event
    from fedprivacy.fl.privacy import PrivacyPlan
    from fedprivacy.fl.sampling import expected_cohort

    if cfg.privacy != "distributed":
        raise ValueError(f"plan_distributed needs privacy='distributed', got {cfg.privacy!r}")
    if cfg.target_delta >= 1.0 / population:
        raise ValueError(f"target-delta must be < 1/population = {1.0 / population:.3g}, "
                         f"got {cfg.target_delta}")
    t, _ = secagg_parameters(cfg, population=population)
    if dim is None:
        dim = model_dim(cfg, population=population)
    enc = make_encoding(cfg, population=population, dim=dim, threshold=t)
    worst = enc.ddp().privacy(num_survivors=t, neighbouring=cfg.neighbouring)
    if denominator is None:
        denominator = expected_cohort(sampling=cfg.sampling, population=population,
                                      sample_rate=cfg.sample_rate, cohort_size=cfg.cohort_size)
    desc = (f"poisson(q={cfg.sample_rate:g}, N={population})" if cfg.sampling == "poisson"
            else f"fixed cohort (m={cfg.cohort_size} of N={population})")
    return PrivacyPlan(
        mode="distributed", population=population, denominator=denominator,
        clip_norm=cfg.clip_norm, noise_multiplier=cfg.noise_multiplier, calibrated=False,
        central_noise_std=0.0, local_noise_std=0.0, unit="user (all data of one client)",
        neighbouring=cfg.neighbouring,
        # KLS 2021's theorem covers neighbouring sums that differ in one client's update while every
        # survivor's noise share is present in both (fedprivacy.accounting.distributed): say so.
        adjacency=(
            "zero-out: one client's update replaced by 0, every survivor's noise share present "
            "(KLS 2021); removing a client together with its noise share is not claimed"
            if Neighbouring.parse(cfg.neighbouring) is Neighbouring.ADD_REMOVE
            else "replace-one: one client's update replaced (sensitivity doubled); every survivor's "
                 "noise share present (KLS 2021)"
        ),
        sampling_description=desc + f"; no amplification claimed; secagg threshold t={t}",
        event=round_event(worst), target_delta=cfg.target_delta, target_epsilon=cfg.target_epsilon,
        mechanism=(f"distributed discrete Gaussian under SecAgg+ (Kairouz, Liu & Steinke 2021): each "
                   f"client adds N_Z(0, (zCs)^2/t), t={t}; the server only sees the noised sum"),
    )


register_plan("distributed", plan_distributed)


def distributed_privacy_summary(cfg: RunConfig, plan: PrivacyPlan, rows: Sequence[Mapping[str, Any]],
                                *, epsilon: float | None) -> dict[str, Any]:
    """What the results' ``privacy`` block says for a ``distributed`` run (noise the survivors added).

    Also the ε of central DP with the same total noise ``σ = z C`` on the same rounds (Gaussian,
    no sampling, RDP), the reference the distributed mechanism is compared against.
    """
    from fedprivacy.accounting.accountant import Accountant, epsilon_for
    from fedprivacy.accounting.events import GaussianEvent, PrivacyEvent

    done = [r for r in rows if r.get("secagg_survivors") and not r.get("aborted")]
    survivors = [int(r["secagg_survivors"]) for r in done]
    central = central_actual = None
    if done:
        central = epsilon_for(noise_multiplier=cfg.noise_multiplier, sample_rate=1.0, steps=len(done),
                              delta=cfg.target_delta, backend="rdp", neighbouring=cfg.neighbouring)
        acc = Accountant(backend="rdp", neighbouring=Neighbouring.parse(cfg.neighbouring))
        for r in done:  # the Gaussian with the std the survivors' noise really had
            z = cfg.noise_multiplier * math.sqrt(int(r["secagg_survivors"]) / int(r["secagg_threshold"]))
            acc.spend(PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=z)))
        central_actual = acc.epsilon(delta=cfg.target_delta)
    z_c = cfg.clip_norm * cfg.noise_multiplier
    return {
        "distributed": {
            "threshold": done[0]["secagg_threshold"] if done else None,
            "per_client_noise_std": (z_c / math.sqrt(done[0]["secagg_threshold"]) if done else None),
            "completed_rounds": [int(r["round"]) for r in done],
            "survivors_per_round": survivors,
            "noise_std_of_sum_per_round": [r["noise_std_sum"] for r in done],
            "rho_per_round": [r["rho"] for r in done],
            "aborted_rounds": [r["round"] for r in rows if r.get("aborted")],
            "epsilon": epsilon,
            "central_dp_epsilon_same_sigma": central,
            "central_dp_epsilon_survivors_sigma": central_actual,
            "central_dp_reference": ("continuous Gaussian on the sum, no sampling, same completed rounds "
                                     "and δ, RDP accountant: with σ = z·C (the target), and with the "
                                     "std the survivors really added, z·C·sqrt(n/t) per round"),
        },
    }


# ----------------------------------------------------------------------------- transport
class SecureTransport(Protocol):
    """Sends one stage's requests (partition id -> protocol message) and returns the replies.

    ``stage("masked", ...)`` also carries the model, the round instructions and the encoding; its
    replies are ``(MaskedInput, ClientUpdate)`` pairs (the ClientUpdate holds only the metadata the
    privacy mode lets a client disclose, ``delta=()``). Missing or failed replies go to ``failures``.
    """

    def stage(self, name: str, requests: Mapping[int, Any], *, instructions: RoundInstructions | None = None,
              weights: Sequence[np.ndarray] | None = None, encoding: EncodingSpec | None = None,
              ) -> tuple[dict[int, Any], dict[int, str]]: ...


_REPLY_TYPES = {"advertise": AdvertiseKeys, "share": SharedKeys, "masked": MaskedInput,
                "unmask": UnmaskResponse}


class SecureRound:
    """The secure :data:`fedprivacy.fl.loop.RoundFn` (four exchanges per round)."""

    def __init__(self, cfg: RunConfig, transport: SecureTransport, *, population: int,
                 log: Callable[[str], None] = print) -> None:
        if not cfg.secagg:
            raise ValueError("SecureRound needs secagg=true")
        if cfg.privacy not in ("none", "distributed"):
            raise ValueError(f"secagg=true supports privacy 'none' or 'distributed', got {cfg.privacy!r}")
        self.cfg = cfg
        self.transport = transport
        self.population = population
        self.threshold, self.degree = secagg_parameters(cfg, population=population)
        self.log = log
        from fedprivacy.fl.sampling import expected_cohort

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
        if instr.round >= cfg.num_server_rounds or not hasattr(self.transport, "unmask_and_advertise"):
            return None
        full = ((cfg.sampling == "poisson" and cfg.sample_rate >= 1.0)
                or (cfg.sampling == "fixed" and cfg.cohort_size == self.population))
        if not full:
            return None
        cohort = tuple(range(self.population))
        k = round_degree(cohort=len(cohort), degree=self.degree, threshold=self.threshold)
        setup = SetupRequest(round=instr.round + 1, threshold=self.threshold, degree=k,
                             modulus_bits=cfg.secagg_bits, dim=dim, min_survivors=self.threshold)
        return setup, cohort

    def _aborted(self, reason: str, *, like: Sequence[np.ndarray], failures: dict[int, str],
                 info: dict[str, Any]) -> RoundOutcome:
        zero = tuple(np.zeros_like(np.asarray(w)) for w in like)
        agg = AggregateResult(mean_update=zero, aggregated=(), dropped={}, noise_std=0.0,
                              denominator=float(self.denominator))
        return RoundOutcome(aggregate=agg, failures=dict(failures), updates=(), event=None,
                            aborted=reason, info={**info, "aborted": reason})

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

    def __call__(self, instr: RoundInstructions, cohort: Sequence[int], weights: Sequence[np.ndarray],
                 rng: RandomSource) -> RoundOutcome:
        from fedprivacy.accounting.distributed import round_event
        from fedprivacy.dp.clipping import unflatten

        cfg = self.cfg
        n, t = len(cohort), self.threshold
        dim = int(sum(np.size(w) for w in weights))
        info: dict[str, Any] = {"secagg_threshold": t, "secagg_exchanges": 0}
        failures: dict[int, str] = {}
        if n < t:
            return self._aborted(f"cohort of {n} is below the secagg threshold {t}", like=weights,
                                 failures=failures, info=info)
        k = round_degree(cohort=n, degree=self.degree, threshold=t)
        enc = make_encoding(cfg, population=self.population, dim=dim, threshold=t,
                            rotation_seed=rng.child("rotation").random_bytes(32))
        setup = SetupRequest(round=instr.round, threshold=t, degree=k, modulus_bits=cfg.secagg_bits,
                             dim=enc.padded_dim, min_survivors=t)
        info["secagg_degree"] = k
        from fedprivacy.secagg.protocol import ProtocolViolation, ServerSession

        server = ServerSession(setup)
        updates: dict[int, ClientUpdate] = {}
        pending, self._pending = self._pending, None
        try:
            if pending is not None and pending[0] == setup and pending[1] == tuple(cohort):
                adv, f = pending[2], pending[3]  # keys advertised with the previous round's unmask
                info["secagg_pipelined"] = True
            else:
                adv, f = self.transport.stage("advertise", {pid: setup for pid in cohort})
                info["secagg_exchanges"] += 1
            failures.update(f)
            adv = self._check("advertise", adv, failures, round=instr.round)
            roster: ShareKeysRequest = server.receive_keys(list(adv.values()))
            shared, f = self.transport.stage("share", {pid: roster for pid in roster.node_ids})
            failures.update(f)
            shared = self._check("share", shared, failures, round=instr.round)
            info["secagg_exchanges"] += 1
            mreqs: dict[int, MaskedInputRequest] = server.receive_shares(list(shared.values()))
            masked, f = self.transport.stage("masked", mreqs, instructions=instr, weights=weights,
                                             encoding=enc)
            failures.update(f)
            masked = self._check("masked", masked, failures, round=instr.round)
            info["secagg_exchanges"] += 1
            updates = {pid: upd for pid, (_, upd) in masked.items()}
            ureqs: dict[int, UnmaskRequest] = server.receive_masked([m for m, _ in masked.values()])
            nxt = self._next_round_setup(instr, dim=enc.padded_dim)
            if nxt is not None:  # stage 1 of round r+1 rides on this round's unmask exchange
                next_setup, next_cohort = nxt
                unm, f, adv_next, f_next = self.transport.unmask_and_advertise(  # type: ignore[attr-defined]
                    ureqs, {pid: next_setup for pid in next_cohort})
                self._pending = (next_setup, next_cohort, adv_next, f_next)
            else:
                unm, f = self.transport.stage("unmask", ureqs)
            failures.update(f)
            unm = self._check("unmask", unm, failures, round=instr.round)
            info["secagg_exchanges"] += 1
            total = server.receive_unmask(list(unm.values()))
        except (RoundAborted, ProtocolViolation) as exc:
            return self._aborted(f"secure aggregation aborted: {exc}", like=weights, failures=failures,
                                 info=info)
        survivors = tuple(sorted(server.u3))
        flat = enc.decode(total)
        mean = unflatten(flat / self.denominator, weights)
        mean_update = tuple(np.asarray(m).astype(np.asarray(w).dtype) for m, w in zip(mean, weights, strict=True))
        info["secagg_survivors"] = len(survivors)
        event = None
        noise_std = 0.0
        if cfg.privacy == "distributed":
            ddp = enc.ddp()
            dr = ddp.privacy(num_survivors=len(survivors), neighbouring=cfg.neighbouring)
            event = round_event(dr)
            noise_std = dr.total_sigma / enc.scale
            info["rho"] = dr.rho
        else:
            info["secagg_max_abs_error"] = enc.max_abs_error(num_clients=len(survivors))
        info["noise_std_sum"] = noise_std
        late = {pid: reason for pid, reason in failures.items() if pid in survivors}
        dropped = {pid: reason for pid, reason in failures.items() if pid not in survivors}
        for pid, reason in late.items():  # in the sum; dropped out only at the unmask stage
            self.log(f"  round {instr.round}: client {pid} is in the sum but missed a later stage: {reason}")
        agg = AggregateResult(mean_update=mean_update, aggregated=survivors, dropped={}, noise_std=noise_std,
                              denominator=float(self.denominator))
        kept = tuple(updates[p] for p in survivors if p in updates)
        return RoundOutcome(aggregate=agg, failures=dropped, updates=kept, event=event, info=info)


# ----------------------------------------------------------------------------- client side
def export_session(session: ClientSession) -> dict[str, Any]:
    """A client session as flat fields for the node's own state: :meth:`ClientSession.to_state`.

    It holds the round's secrets (private keys, self-mask seed, held shares): it must stay on the
    client side (Flower's ``context.state`` lives in the SuperNode and its ClientApp process and is
    never sent to the server), and must never be logged, put in metrics or written to disk.
    """
    return session.to_state()


def import_session(fields: Mapping[str, Any]) -> ClientSession:
    """Rebuild a :class:`ClientSession` from :func:`export_session` (:meth:`ClientSession.from_state`)."""
    return ClientSession.from_state(fields)


class SessionStore:
    """Where a client keeps its live :class:`ClientSession` between a round's exchanges.

    This base class keeps the objects in process memory, keyed by ``(run_id, node_id)`` (one live
    round per node): fast, but only correct when an engine delivers all of a node's messages to the
    same process. :class:`ExportedSessionStore` keeps :func:`export_session` fields in a mutable
    mapping instead (the ClientApp uses the node's ``context.state``), which works on every engine.
    """

    def __init__(self) -> None:
        self._sessions: dict[tuple[int, int], ClientSession] = {}

    def put(self, key: tuple[int, int], session: ClientSession) -> None:
        self._sessions[key] = session

    def _load(self, key: tuple[int, int]) -> ClientSession | None:
        return self._sessions.get(key)

    def get(self, key: tuple[int, int], *, round: int) -> ClientSession:
        session = self._load(key)
        if session is None or session.setup.round != round:
            raise LookupError(f"no secure-aggregation session for round {round} (node {key[1]}); "
                              "the client has not advertised keys for this round")
        return session

    def finish(self, key: tuple[int, int]) -> None:
        self._sessions.pop(key, None)


class ExportedSessionStore(SessionStore):
    """Sessions as :func:`export_session` fields in ``holder[field_name]`` (e.g. a node's state)."""

    def __init__(self, holder: Any, *, field_name: str = "secagg-session",
                 wrap: Callable[[dict[str, Any]], Any] = dict) -> None:
        super().__init__()
        self.holder, self.field_name, self.wrap = holder, field_name, wrap

    def put(self, key: tuple[int, int], session: ClientSession) -> None:
        self.holder[self.field_name] = self.wrap(export_session(session))

    def _load(self, key: tuple[int, int]) -> ClientSession | None:
        fields = self.holder.get(self.field_name)
        return None if fields is None else import_session(dict(fields))

    def finish(self, key: tuple[int, int]) -> None:
        if self.field_name in self.holder:
            del self.holder[self.field_name]


def client_advertise(store: SessionStore, key: tuple[int, int], setup: SetupRequest, *,
                     partition_id: int) -> AdvertiseKeys:
    """Stage 1: a fresh session (fresh keys and self-mask seed) for this round."""
    session = ClientSession(node_id=partition_id, setup=setup)
    reply = session.advertise_keys()
    store.put(key, session)
    return reply


def client_share(store: SessionStore, key: tuple[int, int], request: ShareKeysRequest) -> SharedKeys:
    """Stage 2: Shamir-share the self-mask seed and the mask key among the graph neighbours."""
    session = store.get(key, round=request.round)
    reply = session.share_keys(request)
    store.put(key, session)
    return reply


def check_encoding(cfg: RunConfig, encoding: EncodingSpec, setup: SetupRequest) -> None:
    """Refuse an encoding that would add less noise or clip less than this client's own config says."""
    want = "ddgauss" if cfg.privacy == "distributed" else "fixed-point"
    if encoding.kind != want:
        raise ValueError(f"server asks for a {encoding.kind!r} encoding, this client's privacy "
                         f"mode needs {want!r}")
    if encoding.clip_norm > cfg.clip_norm:
        raise ValueError(f"server asks for clip norm {encoding.clip_norm} > configured {cfg.clip_norm}")
    if encoding.padded_dim != setup.dim or encoding.modulus_bits != setup.modulus_bits:
        raise ValueError("encoding does not match the round's secure-aggregation setup")
    if want == "ddgauss":
        if encoding.noise_multiplier < cfg.noise_multiplier:
            raise ValueError(f"server asks for noise multiplier {encoding.noise_multiplier} < "
                             f"configured {cfg.noise_multiplier}")
        if encoding.min_survivors > setup.required_survivors:
            raise ValueError(f"encoding assumes {encoding.min_survivors} noisy survivors but the round "
                             f"releases sums of {setup.required_survivors}")


def client_masked(store: SessionStore, key: tuple[int, int], request: MaskedInputRequest,
                  update: ClientUpdate, *, cfg: RunConfig, encoding: EncodingSpec,
                  rng: RandomSource) -> MaskedInput:
    """Stage 3: encode the (clipped) update and mask it."""
    from fedprivacy.dp.clipping import flatten

    session = store.get(key, round=request.round)
    check_encoding(cfg, encoding, session.setup)
    flat = flatten([np.asarray(a, dtype=np.float64) for a in update.delta], dtype=np.float64)
    vector = encoding.encode(flat, rng=rng)
    reply = session.masked_input(request, vector)
    store.put(key, session)
    return reply


def client_unmask(store: SessionStore, key: tuple[int, int], request: UnmaskRequest) -> UnmaskResponse:
    """Stage 4: reveal one kind of share per peer, then forget the session."""
    reply = store.get(key, round=request.round).unmask(request)
    store.finish(key)
    return reply
