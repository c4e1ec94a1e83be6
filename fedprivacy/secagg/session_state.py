"""What a client keeps in its node's own state: its session as flat fields, and its :class:`RoundLog`.

:func:`to_state` writes every field of a session as ints, bools, str, bytes and lists of them;
:func:`from_state` rebuilds the session and validates every field (TypeError for a wrong type,
ValueError for a wrong value, such as a private key that does not match its public key), so a
tampered or truncated state never yields a session.

The fields hold the round's secrets (private keys, the self-mask seed, held shares): they belong on
the client (Flower's ``context.state`` stays in the SuperNode and its ClientApp process), never in
messages, metrics, logs or files.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from fedprivacy.secagg import wire
from fedprivacy.secagg.keys import KeyPair, Secret, public_from_private
from fedprivacy.secagg.messages import ProtocolViolation, _check_node_id, _Stage

if TYPE_CHECKING:
    from fedprivacy.secagg.client_session import ClientSession

__all__ = ["DERIVED", "ROSTER_FIELDS", "RoundLog", "from_state", "roster_state", "to_state"]

#: session slots rebuilt from others by :func:`from_state` (parsed key objects), not part of the state
DERIVED = ("_enc_key", "_mask_key")
#: the :func:`to_state` fields fixed by the roster, its key maps and the graph (set together in stage 2)
ROSTER_FIELDS = ("roster_ids", "mask_publics", "sign_publics", "graph.nodes", "graph.sizes", "graph.flat")

_S = TypeVar("_S", bound="ClientSession")


def to_state(session: ClientSession, *, roster_fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every field of ``session`` as flat values (ints, bools, str, bytes and lists of them).

    ``roster_fields``: the :func:`roster_state` fields in a form the caller already holds for this
    very roster, key map and graph (an exporter's packed copy), used instead of building them.
    """
    s = session
    _, setup = wire.encode(s.setup)
    held = sorted(s._held_seed_shares)
    revealed = sorted(s._revealed)
    seal_peers = sorted(s._seal_keys)
    return {
        **{f"setup.{k}": v for k, v in setup.items()},
        "node_id": s.node_id, "colluders": s.colluders, "require_active": s.require_active,
        "stage": s._stage.name,
        "enc.private": s._enc.private.reveal(), "enc.public": s._enc.public,
        "mask.private": s._mask.private.reveal(), "mask.public": s._mask.public,
        "sign": s._sign.reveal(), "sign_public": s._sign_public, "seed": s._seed.reveal(),
        "world": s._world, **(roster_state(s) if roster_fields is None else roster_fields),
        "neighbours": list(s._neighbours),
        "seal_keys.peers": seal_peers, "seal_keys.keys": [s._seal_keys[j] for j in seal_peers],
        "own_seed_share": s._own_seed_share,
        "held.peers": held, "held_seed_shares": [s._held_seed_shares[j] for j in held],
        "held_key_shares": [s._held_key_shares[j] for j in held],
        "peers": list(s._peers),
        "view_survivors": list(s._view_survivors), "view_dropped": list(s._view_dropped),
        "view_digest": s._view_digest, "view_signature": s._view_signature,
        "revealed.peers": revealed, "revealed.kinds": [s._revealed[j] for j in revealed],
        **_design_state(s),
        "components": list(s._components),
        "held_components.peers": sorted(s._held_components),
        "held_components.shares": [s._held_components[j] for j in sorted(s._held_components)],
        "own_component_share": s._own_component_share, "component_count": s._component_count,
    }


def roster_state(session: ClientSession) -> dict[str, Any]:
    """The :data:`ROSTER_FIELDS` of :func:`to_state`."""
    s = session
    graph_nodes = sorted(s._graph)
    return {"roster_ids": list(s._roster_ids),
            "mask_publics": [s._mask_publics[i] for i in s._roster_ids],
            "sign_publics": [s._sign_publics[i] for i in s._roster_ids],
            "graph.nodes": graph_nodes, "graph.sizes": [len(s._graph[i]) for i in graph_nodes],
            "graph.flat": [j for i in graph_nodes for j in s._graph[i]]}


def _design_state(session: ClientSession) -> dict[str, Any]:
    d = session._design
    if d is None:
        return {"design.present": False}
    return {"design.present": True, "design.total_variance": float(d.total_variance),
            "design.roster": d.roster, "design.min_survivors": d.min_survivors,
            "design.colluders": d.colluders, "design.kind": d.kind,
            "design.max_components": d.max_components}


class _Fields:
    """Typed reads of one state mapping; each names the field it refuses."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.f = dict(fields)

    def __getitem__(self, name: str) -> Any:
        return self.f[name]

    def ints(self, name: str) -> list[int]:
        v = self.f[name]
        if not isinstance(v, list | tuple) or not all(type(x) is int for x in v):  # bools excluded
            raise TypeError(f"state field {name!r} must be a list of ints")
        return list(v)

    def blobs(self, name: str) -> list[bytes]:
        v = self.f[name]
        if not isinstance(v, list | tuple) or not all(type(x) is bytes for x in v):
            raise TypeError(f"state field {name!r} must be a list of bytes")
        return list(v)

    def blob(self, name: str) -> bytes:
        if not isinstance(self.f[name], bytes):
            raise TypeError(f"state field {name!r} must be bytes")
        return bytes(self.f[name])


def from_state(cls: type[_S], fields: Mapping[str, Any]) -> _S:
    """The inverse of :func:`to_state`: a ``cls`` session; validates every field."""
    f = _Fields(fields)
    setup = wire.decode("secagg.setup", {k[len("setup."):]: v for k, v in f.f.items()
                                         if k.startswith("setup.")})
    s = object.__new__(cls)
    s.node_id = _check_node_id(int(f["node_id"]))
    s.setup = setup
    s.colluders = int(f["colluders"])
    s.require_active = bool(f["require_active"])
    s._stage = _Stage[str(f["stage"])]
    _restore_keys(s, f)
    _restore_roster(s, f)
    _restore_shares(s, f)
    _restore_view(s, f)
    _restore_design(s, f)
    if public_from_private(s._enc.private.reveal()) != s._enc.public or \
            public_from_private(s._mask.private.reveal()) != s._mask.public:
        raise ValueError("state holds a private key that does not match its public key")
    s._derive()
    return s


def _restore_keys(s: ClientSession, f: _Fields) -> None:
    s._enc = KeyPair(Secret(f.blob("enc.private")), f.blob("enc.public"))
    s._mask = KeyPair(Secret(f.blob("mask.private")), f.blob("mask.public"))
    s._sign = Secret(f.blob("sign"))
    s._sign_public = f.blob("sign_public")
    s._seed = Secret(f.blob("seed"))
    s._world = f.blob("world")


def _restore_roster(s: ClientSession, f: _Fields) -> None:
    s._roster_ids = tuple(f.ints("roster_ids"))
    s._mask_publics = dict(zip(s._roster_ids, f.blobs("mask_publics"), strict=True))
    s._sign_publics = dict(zip(s._roster_ids, f.blobs("sign_publics"), strict=True))
    flat, graph, pos = f.ints("graph.flat"), {}, 0
    for i, size in zip(f.ints("graph.nodes"), f.ints("graph.sizes"), strict=True):
        graph[i] = tuple(flat[pos:pos + size])
        pos += size
    s._graph = graph
    s._neighbours = tuple(f.ints("neighbours"))


def _restore_shares(s: ClientSession, f: _Fields) -> None:
    s._seal_keys = dict(zip(f.ints("seal_keys.peers"), f.blobs("seal_keys.keys"), strict=True))
    s._own_seed_share = f.blob("own_seed_share")
    held = f.ints("held.peers")
    s._held_seed_shares = dict(zip(held, f.blobs("held_seed_shares"), strict=True))
    s._held_key_shares = dict(zip(held, f.blobs("held_key_shares"), strict=True))
    s._peers = tuple(f.ints("peers"))


def _restore_view(s: ClientSession, f: _Fields) -> None:
    s._view_survivors = tuple(f.ints("view_survivors"))
    s._view_dropped = tuple(f.ints("view_dropped"))
    s._view_digest = f.blob("view_digest")
    s._view_signature = f.blob("view_signature")
    kinds = f["revealed.kinds"]
    s._revealed = {j: str(k) for j, k in zip(f.ints("revealed.peers"), kinds, strict=True)}
    if not set(s._revealed.values()) <= {"seed", "key"}:
        raise ValueError("state field 'revealed.kinds' must hold 'seed' or 'key'")


def _restore_design(s: ClientSession, f: _Fields) -> None:
    s._design = None
    if f["design.present"] is True:
        from fedprivacy.accounting.xnoise_design import XNoiseDesign

        s._design = XNoiseDesign(
            total_variance=float(f["design.total_variance"]), roster=int(f["design.roster"]),
            min_survivors=int(f["design.min_survivors"]), colluders=int(f["design.colluders"]),
            kind=str(f["design.kind"]), max_components=int(f["design.max_components"]))
    s._components = tuple(f.blobs("components"))
    s._held_components = dict(zip(f.ints("held_components.peers"), f.blobs("held_components.shares"),
                                  strict=True))
    s._own_component_share = f.blob("own_component_share")
    s._component_count = int(f["component_count"])


# ----------------------------------------------------------------------------- round record
class RoundLog:
    """The rounds one client has taken part in, for one run: it refuses a round twice or out of order.

    A round is taken part in from the moment the client advertises keys for it; round numbers must
    strictly increase, so a server can neither run a round again with a different survivor set
    (differencing) nor open two sessions of one round. The record belongs in the node's own state
    (Flower: ``context.state``, which is per run and never leaves the client); a new run starts a new
    record, so exposure across runs is a matter for the client's own budget, not this log.
    """

    __slots__ = ("last_round",)

    def __init__(self, last_round: int = -1) -> None:
        if isinstance(last_round, bool) or not isinstance(last_round, int) or last_round < -1:
            raise ValueError(f"last_round must be an int >= -1, got {last_round!r}")
        self.last_round = last_round

    def check(self, round: int) -> None:
        if round <= self.last_round:
            raise ProtocolViolation(f"round {round} is not after the last round this client took part "
                                    f"in ({self.last_round}): refusing to take part twice")

    def admit(self, round: int) -> None:
        self.check(round)
        self.last_round = round

    def to_state(self) -> dict[str, Any]:
        return {"last_round": self.last_round}

    @classmethod
    def from_state(cls, fields: Mapping[str, Any]) -> RoundLog:
        return cls(int(fields["last_round"]))

    def __repr__(self) -> str:
        return f"RoundLog(last_round={self.last_round})"
