"""The client side of a secure-aggregation round: where a client keeps its sessions between exchanges,
and its five protocol steps (each: load the session, one :class:`ClientSession` call, store it).

Client secrets: between exchanges a client's :class:`ClientSession` lives in a :class:`SessionStore`;
the ClientApp uses :class:`ExportedSessionStore` over the node's ``context.state`` (client side only,
see ``clients/secagg_handlers.py``), never messages, metrics, logs or files.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedprivacy.fl.client import client_rng, train_client
from fedprivacy.fl.client_policy import ClientPolicy, PolicyRefusal
from fedprivacy.fl.secure.params import encoding_kind
from fedprivacy.fl.secure.session import export_session, import_session, recall, remember
from fedprivacy.fl.types import ClientUpdate, RoundInstructions
from fedprivacy.secagg.client_session import ClientSession
from fedprivacy.secagg.encoding import EncodingSpec
from fedprivacy.secagg.messages import (
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencyResponse,
    MaskedInput,
    MaskedInputRequest,
    SetupRequest,
    SharedKeys,
    ShareKeysRequest,
    UnmaskRequest,
    UnmaskResponse,
)
from fedprivacy.secagg.peers import PeerAuth
from fedprivacy.secagg.session_state import RoundLog
from fedprivacy.secagg.xnoise import ComponentSeeds

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig
    from fedprivacy.dp.rng import RandomSource

__all__ = [
    "ExportedSessionStore",
    "SessionStore",
    "check_encoding",
    "client_advertise",
    "client_consistency",
    "client_masked",
    "client_masked_round",
    "client_share",
    "client_unmask",
    "forget_peer_auth",
    "peer_auth",
]


#: the field of an exported record that names the ``(run_id, node_id)`` it was stored under
_OWNER = "store-owner"


def _owner(key: tuple[int, int]) -> str:
    return f"{int(key[0])}:{int(key[1])}"  # text: Flower's run ids are unsigned 64-bit


class SessionStore:
    """Where a client keeps its live :class:`ClientSession` (and the round's encoding) between exchanges.

    Sessions are kept per round: a node may hold two live rounds at once when a later round's key
    stages ride on the current round's exchanges (``docs/SECAGG.md``, "Exchanges per round"). This
    base class keeps the objects in process memory, keyed by ``(run_id, node_id)`` and round: fast, but
    only correct when an engine delivers all of a node's messages to the same process.
    :class:`ExportedSessionStore` keeps :func:`export_session` fields in a mutable mapping instead (the
    ClientApp uses the node's ``context.state``), which works on every engine.
    """

    def __init__(self) -> None:
        self._sessions: dict[tuple[int, int], dict[int, ClientSession]] = {}
        self._encodings: dict[tuple[int, int], dict[int, EncodingSpec]] = {}

    def put(self, key: tuple[int, int], session: ClientSession) -> None:
        self._sessions.setdefault(key, {})[session.setup.round] = session

    def put_encoding(self, key: tuple[int, int], round: int, encoding: EncodingSpec) -> None:
        self._encodings.setdefault(key, {})[round] = encoding

    def _load(self, key: tuple[int, int], round: int) -> ClientSession | None:
        return self._sessions.get(key, {}).get(round)

    def _load_encoding(self, key: tuple[int, int], round: int) -> EncodingSpec | None:
        return self._encodings.get(key, {}).get(round)

    def rounds(self, key: tuple[int, int]) -> list[int]:
        """The rounds with a live session."""
        return sorted(self._sessions.get(key, {}))

    def get(self, key: tuple[int, int], *, round: int) -> ClientSession:
        session = self._load(key, round)
        if session is None or session.setup.round != round:
            raise LookupError(f"no secure-aggregation session for round {round} (node {key[1]}); "
                              "the client has not advertised keys for this round")
        return session

    def encoding(self, key: tuple[int, int], *, round: int) -> EncodingSpec:
        """The encoding this client checked and accepted for ``round`` at its share stage."""
        enc = self._load_encoding(key, round)
        if enc is None:
            raise LookupError(f"no accepted encoding for round {round} (node {key[1]}): the client "
                              "checks the encoding at its share stage")
        return enc

    def finish(self, key: tuple[int, int], *, round: int) -> None:
        self._sessions.get(key, {}).pop(round, None)
        self._encodings.get(key, {}).pop(round, None)

    def prune(self, key: tuple[int, int], *, before: int) -> None:
        """Forget the sessions of rounds before ``before`` (rounds that never reached their unmask)."""
        for r in [r for r in self.rounds(key) if r < before]:
            self.finish(key, round=r)


class ExportedSessionStore(SessionStore):
    """Sessions as :func:`export_session` fields in ``holder[f"{field_name}/{round}"]`` (e.g. a node's
    state) and the accepted encoding in ``holder[f"{field_name}-encoding/{round}"]``.

    Each record carries the ``(run_id, node_id)`` key it was stored under, and a record of another key
    is refused (:class:`PolicyRefusal`), never used: Flower 1.42's SuperNode hands a new run the node
    state of its run *series*, and the submitter (or a deviating SuperLink) picks the series, so without
    the check a replayed masked request under a new run id would be answered from the old run's session
    with the same masks and XNoise, and the budget file's once-per-run records would not see it as a
    repeat. A run never inherits another run's secure session.
    """

    def __init__(self, holder: Any, *, field_name: str = "secagg-session",
                 wrap: Callable[[dict[str, Any]], Any] = dict) -> None:
        super().__init__()
        self.holder, self.field_name, self.wrap = holder, field_name, wrap

    def _name(self, round: int, what: str = "") -> str:
        return f"{self.field_name}{what}/{round}"

    # What a record holds is parsed once per process and record object (fl/secure/session.py: remember /
    # recall; a copy of the session, never the object a caller goes on changing).
    def put(self, key: tuple[int, int], session: ClientSession) -> None:
        record = self.wrap({**export_session(session), _OWNER: _owner(key)})
        self.holder[self._name(session.setup.round)] = record
        remember(record, session)

    def put_encoding(self, key: tuple[int, int], round: int, encoding: EncodingSpec) -> None:
        record = self.wrap({**encoding.to_record(), _OWNER: _owner(key)})
        self.holder[self._name(round, "-encoding")] = record
        remember(record, encoding)

    def _record(self, key: tuple[int, int], round: int, what: str = "") -> dict[str, Any] | None:
        """The record's fields without the owner, or None; refuses a record stored under another key."""
        record = self.holder.get(self._name(round, what))
        if record is None:
            return None
        if record.get(_OWNER) != _owner(key):
            raise PolicyRefusal(f"the secure-aggregation state of round {round} in this node's state was not "
                                "made in this run (Flower hands a new run its series' node state): a run "
                                "never uses another run's session, masks or noise")
        return record

    def _load(self, key: tuple[int, int], round: int) -> ClientSession | None:
        record = self._record(key, round)
        if record is None:
            return None
        session = recall(record)
        if not isinstance(session, ClientSession):
            session = import_session({k: v for k, v in dict(record).items() if k != _OWNER})
            remember(record, session)
        return session

    def _load_encoding(self, key: tuple[int, int], round: int) -> EncodingSpec | None:
        record = self._record(key, round, "-encoding")
        if record is None:
            return None
        encoding = recall(record)
        if not isinstance(encoding, EncodingSpec):
            encoding = EncodingSpec.from_record({k: v for k, v in dict(record).items() if k != _OWNER})
            remember(record, encoding)
        return encoding

    def rounds(self, key: tuple[int, int]) -> list[int]:
        prefix = self.field_name + "/"
        return sorted(int(k[len(prefix):]) for k in list(self.holder.keys()) if k.startswith(prefix))

    def finish(self, key: tuple[int, int], *, round: int) -> None:
        for name in (self._name(round), self._name(round, "-encoding")):
            if name in self.holder:
                del self.holder[name]


def client_advertise(store: SessionStore, key: tuple[int, int], setup: SetupRequest, *,
                     partition_id: int, policy: ClientPolicy | None = None,
                     log: RoundLog | None = None, peers: PeerAuth | None = None) -> AdvertiseKeys:
    """Stage 1: a fresh session (fresh keys and self-mask seed) for this round, if the setup meets
    the client's own floor (``policy``, default :class:`ClientPolicy`'s safe defaults) and ``log`` (the
    node's record of rounds taken part in) has not seen this round. Sessions of rounds before the
    previous one are forgotten (they can no longer complete). With ``peers`` the advertisement carries
    the client's long-term signature (bound to the run ``key[0]``, the setup and the round)."""
    policy = policy if policy is not None else ClientPolicy()
    policy.check_secagg(setup)
    session = ClientSession(node_id=partition_id, setup=setup, colluders=policy.colluders,
                            require_active=policy.schedule == "active")
    reply = session.advertise_keys(log=log)
    if peers is not None:
        reply = peers.sign(reply, run_id=key[0], setup=setup)
    store.prune(key, before=setup.round - 1)
    store.put(key, session)
    return reply


def client_share(store: SessionStore, key: tuple[int, int], request: ShareKeysRequest, *,
                 encoding: EncodingSpec, instructions: RoundInstructions, cfg: RunConfig,
                 policy: ClientPolicy | None = None, peers: PeerAuth | None = None) -> SharedKeys:
    """Stage 2: check the round's encoding against the client's own floor, then Shamir-share the
    self-mask seed, the mask key and (distributed DP) the client's XNoise seeds.

    Everything about the noise is fixed here, before any secret leaves the client: the encoding
    (C, scale, bits, dimension, t, z, colluders) is checked against ``policy`` for the roster this
    client was shown (the ρ of the worst released sum), the XNoise design is built from it by the
    client itself, and the component seeds come from the client's own source (its seed rule:
    ``policy.seed``). The masked stage encodes with exactly this encoding and these seeds. With
    ``peers`` every roster entry must carry its peer's long-term signature (:mod:`fedprivacy.secagg.peers`).
    """
    policy = policy if policy is not None else ClientPolicy()
    session = store.get(key, round=request.round)
    if instructions.round != request.round:
        raise ValueError(f"round instructions for round {instructions.round}, secagg request for "
                         f"{request.round}")
    instructions = policy.apply(instructions, path="secagg")  # its mode floor and seed rule
    check_encoding(cfg, encoding, session.setup)
    components = None
    if encoding.kind == "ddgauss":
        roster = len(request.node_ids)
        ddp = encoding.ddp()
        policy.check_distributed(ddp, setup=session.setup, roster=roster)
        rng = client_rng(seed=instructions.seed, partition_id=session.node_id,
                         round=request.round).child("xnoise-seeds")
        components = ComponentSeeds.fresh(ddp.design(roster=roster), round=request.round,
                                          node_id=session.node_id, rng=rng)
    else:  # fixed-point: this client adds no noise (none; central, whose server adds it to the sum)
        if instructions.privacy != cfg.privacy:  # check_encoding matched the encoding to cfg's mode
            raise PolicyRefusal(f"server asks for privacy {instructions.privacy!r} in its instructions but "
                                f"{cfg.privacy!r} in its run config; refused")
        policy.check_mode(cfg.privacy)
    if peers is not None:
        peers.check_roster(request, node_id=session.node_id, run_id=key[0], setup=session.setup)
    reply = session.share_keys(request, components=components)
    store.put(key, session)
    store.put_encoding(key, request.round, encoding)
    return reply


@functools.lru_cache(maxsize=4096)
def _peer_auth(identity: str, directory: str, pins: str, create: bool) -> PeerAuth | None:
    """Loaded once per node and process (the in-process engine runs every node of a run in one)."""
    return PeerAuth.from_paths(identity=identity, directory=directory, pins=pins, create=create)


def peer_auth(policy: ClientPolicy, *, run_id: int, partition_id: int) -> PeerAuth | None:
    """The client's peer authentication (``client-peer-auth``, ``client-identity-key``,
    ``client-peer-directory``): ``None`` under ``relay`` (peers trusted as relayed); else its long-term
    key (``client-identity-key``, or without one ``partition-<id>.identity.pem`` beside the node's durable
    memory file, made on first use) and the directory, or pins in ``partition-<id>.peers.json`` beside
    it. ValueError (one line naming the key) on an unreadable file."""
    if policy.peer_auth == "relay":
        return None
    memory = policy.memory_path(run_id=run_id, partition_id=partition_id)
    own = not policy.identity_key
    if own and policy.peer_directory:
        return _peer_auth("", policy.peer_directory, "", False)  # refused: a directory names given keys
    identity = str(memory.with_name(f"partition-{int(partition_id)}.identity.pem")) if own else policy.identity_key
    return _peer_auth(identity, policy.peer_directory,
                      str(memory.with_name(f"partition-{int(partition_id)}.peers.json")), own)


def forget_peer_auth() -> None:
    """Drop this process's loaded identities (a restarted node reads its key file again)."""
    _peer_auth.cache_clear()


def check_encoding(cfg: RunConfig, encoding: EncodingSpec, setup: SetupRequest) -> None:
    """Refuse an encoding that would add less noise or clip less than this client's own config says."""
    want = encoding_kind(cfg)
    if encoding.kind != want:
        raise ValueError(f"server asks for a {encoding.kind!r} encoding, this client's privacy "
                         f"mode needs {want!r}")
    if cfg.adaptive_clip and want == "ddgauss":  # the clip norm moves: only where the rule can reach
        from fedprivacy.dp.adaptive_clipping import reachable_clip_range

        lo, hi = reachable_clip_range(initial_clip_norm=cfg.clip_norm, target_quantile=cfg.adaptive_clip_quantile,
                                      learning_rate=cfg.adaptive_clip_learning_rate, round=setup.round)
        if not lo <= encoding.clip_norm <= hi:
            raise ValueError(f"server asks for clip norm {encoding.clip_norm:g} outside [{lo:g}, {hi:g}], "
                             f"what adaptive clipping from {cfg.clip_norm:g} can reach by round {setup.round}")
    elif encoding.clip_norm > cfg.clip_norm:
        raise ValueError(f"server asks for clip norm {encoding.clip_norm} > configured {cfg.clip_norm}")
    if encoding.count_scale and not cfg.adaptive_clip:
        raise ValueError("server asks for a clipped-count coordinate, this client's config has "
                         "adaptive-clip=false")
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
                  update: ClientUpdate, *, rng: RandomSource) -> MaskedInput:
    """Stage 3: encode the (clipped) update with the encoding and XNoise seeds this client accepted
    at its share stage, and mask it."""
    from fedprivacy.dp.clipping import flatten

    session = store.get(key, round=request.round)
    encoding = store.encoding(key, round=request.round)
    flat = flatten([np.asarray(a, dtype=np.float64) for a in update.delta], dtype=np.float64)
    vector = encoding.encode(flat, rng=rng, components=session.components)
    reply = session.masked_input(request, vector)
    store.put(key, session)
    return reply


def client_consistency(store: SessionStore, key: tuple[int, int],
                       request: ConsistencyRequest) -> ConsistencyResponse:
    """Stage 4 (active schedule): check the server's view and sign it (once per round)."""
    session = store.get(key, round=request.round)
    reply = session.sign_view(request)
    store.put(key, session)
    return reply


def client_unmask(store: SessionStore, key: tuple[int, int], request: UnmaskRequest) -> UnmaskResponse:
    """Stage 5: reveal one kind of share per peer, then forget the session."""
    reply = store.get(key, round=request.round).unmask(request)
    store.finish(key, round=request.round)
    return reply


def client_masked_round(store: SessionStore, key: tuple[int, int], request: MaskedInputRequest, *,
                        cfg: RunConfig, instructions: RoundInstructions,
                        weights: Sequence[np.ndarray], partition_id: int, num_partitions: int,
                        train: Callable[..., ClientUpdate] | None = None,
                        policy: ClientPolicy | None = None) -> tuple[MaskedInput, ClientUpdate]:
    """Stage 3 as the ClientApp runs it: the client pipeline (train, Δ, clip), then encode and mask.

    The client's own floor (``policy``) decides the seed rule and the mode (the encoding was checked
    at the share stage), and what metadata it discloses. Returns the masked input and the update's metadata (``delta=()``;
    the wire codec encodes it like a plain train reply).
    """
    policy = policy if policy is not None else ClientPolicy()
    if instructions.round != request.round:
        raise ValueError(f"round instructions for round {instructions.round}, secagg request for "
                         f"{request.round}")
    instructions = policy.apply(instructions, path="secagg")
    encoding = store.encoding(key, round=request.round)
    if encoding.count_scale:  # adaptive clipping: train-clip to the C it encodes, so its bit means ||Δ|| < C
        instructions = dataclasses.replace(instructions, clip_norm=encoding.clip_norm)
    update = (train or train_client)(cfg, partition_id=partition_id, num_partitions=num_partitions,
                                     weights=weights, instructions=instructions)
    rng = client_rng(seed=instructions.seed, partition_id=partition_id,
                     round=instructions.round).child("secagg")
    masked = client_masked(store, key, request, update, rng=rng)
    meta = policy.filter_update(ClientUpdate(partition_id=update.partition_id, delta=(),
                                             num_examples=update.num_examples, train_loss=update.train_loss,
                                             metrics=dict(update.metrics)))
    return masked, meta
