"""The client side of a secure-aggregation round: where a client keeps its session between exchanges,
and its four protocol steps (each: load the session, one :class:`ClientSession` call, store it).

Client secrets: between exchanges a client's :class:`ClientSession` lives in a :class:`SessionStore`;
the ClientApp uses :class:`ExportedSessionStore` over the node's ``context.state`` (client side only,
see ``clients/secagg_handlers.py``), never messages, metrics, logs or files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedprivacy.fl.client import client_rng, train_client
from fedprivacy.fl.client_policy import ClientPolicy
from fedprivacy.fl.secure.params import encoding_kind
from fedprivacy.fl.secure.session import export_session, import_session
from fedprivacy.fl.types import ClientUpdate, RoundInstructions
from fedprivacy.secagg.encoding import EncodingSpec
from fedprivacy.secagg.protocol import (
    AdvertiseKeys,
    ClientSession,
    ConsistencyRequest,
    ConsistencyResponse,
    MaskedInput,
    MaskedInputRequest,
    RoundLog,
    SetupRequest,
    SharedKeys,
    ShareKeysRequest,
    UnmaskRequest,
    UnmaskResponse,
)

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
]


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
                     partition_id: int, policy: ClientPolicy | None = None,
                     log: RoundLog | None = None) -> AdvertiseKeys:
    """Stage 1: a fresh session (fresh keys and self-mask seed) for this round, if the setup meets
    the client's own floor (``policy``, default :class:`ClientPolicy`'s safe defaults) and ``log`` (the
    node's record of rounds taken part in) has not seen this round."""
    policy = policy if policy is not None else ClientPolicy()
    policy.check_secagg(setup)
    session = ClientSession(node_id=partition_id, setup=setup, colluders=policy.colluders,
                            require_active=policy.schedule == "active")
    reply = session.advertise_keys(log=log)
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
    want = encoding_kind(cfg)
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
                  rng: RandomSource, policy: ClientPolicy | None = None) -> MaskedInput:
    """Stage 3: encode the (clipped) update and mask it, if the encoding meets the client's floor
    (the ρ of the worst released sum is computed from the complete encoding the server sent)."""
    from fedprivacy.dp.clipping import flatten

    policy = policy if policy is not None else ClientPolicy()
    session = store.get(key, round=request.round)
    check_encoding(cfg, encoding, session.setup)
    if encoding.kind == "ddgauss":
        policy.check_distributed(encoding.ddp(), setup=session.setup, roster=session.roster_size)
    else:
        policy.check_mode("none")
    flat = flatten([np.asarray(a, dtype=np.float64) for a in update.delta], dtype=np.float64)
    vector = encoding.encode(flat, rng=rng)
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
    store.finish(key)
    return reply


def client_masked_round(store: SessionStore, key: tuple[int, int], request: MaskedInputRequest, *,
                        cfg: RunConfig, encoding: EncodingSpec, instructions: RoundInstructions,
                        weights: Sequence[np.ndarray], partition_id: int, num_partitions: int,
                        train: Callable[..., ClientUpdate] | None = None,
                        policy: ClientPolicy | None = None) -> tuple[MaskedInput, ClientUpdate]:
    """Stage 3 as the ClientApp runs it: the client pipeline (train, Δ, clip), then encode and mask.

    The client's own floor (``policy``) decides the seed rule, the mode and the encoding it accepts,
    and what metadata it discloses. Returns the masked input and the update's metadata (``delta=()``;
    the wire codec encodes it like a plain train reply).
    """
    policy = policy if policy is not None else ClientPolicy()
    if instructions.round != request.round:
        raise ValueError(f"round instructions for round {instructions.round}, secagg request for "
                         f"{request.round}")
    instructions = policy.apply(instructions)
    update = (train or train_client)(cfg, partition_id=partition_id, num_partitions=num_partitions,
                                     weights=weights, instructions=instructions)
    rng = client_rng(seed=instructions.seed, partition_id=partition_id,
                     round=instructions.round).child("secagg")
    masked = client_masked(store, key, request, update, cfg=cfg, encoding=encoding, rng=rng, policy=policy)
    meta = policy.filter_update(ClientUpdate(partition_id=update.partition_id, delta=(),
                                             num_examples=update.num_examples, train_loss=update.train_loss,
                                             metrics=dict(update.metrics)))
    return masked, meta
