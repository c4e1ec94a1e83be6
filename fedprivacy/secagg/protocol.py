"""SecAgg+ state machines secure against a malicious server: :class:`ClientSession`, :class:`ServerSession`.

Protocol: Bonawitz et al. 2017 ("Practical Secure Aggregation for Privacy-Preserving Machine Learning",
CCS; Fig. 4 for the semi-honest rounds, Sec. 6 / Fig. 5 for the consistency check against an active
server) on the sparse Harary graph of Bell et al. 2020 (CCS). One session = one round. Every message is
a frozen dataclass of ints, bools, bytes, lists and numpy arrays (:mod:`.wire` maps them 1:1 onto
Flower records). ``docs/SECAGG.md`` has the tables; the argument is here.

Stages (``setup.active``; the semi-honest schedule skips stage 4 and its checks):

0. ``SetupRequest`` (server -> clients): round, threshold t, degree k, modulus bits b, dim d,
   ``min_survivors``, ``colluders`` c, ``active``. A client refuses a setup with fewer colluders than
   its own floor, or a semi-honest one when it requires active security.
1. Advertise: fresh X25519 pairs ``c`` (seals shares) and ``s`` (pairwise masks), a fresh Ed25519 pair
   (signs statements), a fresh 32-byte self-mask seed ``b`` and its commitment
   ``SHA-256("fedprivacy/v1/seed-commit" | round | id | b)``.
2. Share keys: the server sends the roster U1. Each client computes the *world id*
   ``W = SHA-256(setup | roster)``, which seeds the graph and is bound into every AEAD associated data,
   HKDF salt and signature, so clients shown different rosters or setups can never combine anything;
   it refuses unsafe (k, t, c) (:func:`.graph.check_safe`), Shamir-shares ``b`` and ``s_sk`` among its
   k neighbours and itself, and seals each pair of shares to its neighbour (ChaCha20-Poly1305 under
   HKDF(X25519), info ``fedprivacy/v1/share-seal``). U2 = clients whose shares arrived.
3. Masked input: the server forwards ciphertexts. A client keeps the senders whose ciphertext opens
   (the others are listed as ``rejected``): that is its peer set ``P_i``. It needs ``|P_i| + 1 >= t``
   holders (and ``|P_i| >= c + 1`` when active), uploads
   ``y_i = x_i + PRG(b_i) + sum_{j in P_i} sgn(i, j) PRG(s_ij) mod 2^b`` and *signs* ``(W, i, P_i)``:
   the server cannot later claim that i masked with other peers than it really did.
4. Consistency (active only): the server proposes one view ``V = (U3, D, {P_u, sig_u}_{u in U3})``.
   A client signs ``SHA-256(V)`` only if: it is in U3; U3 and D are disjoint roster members;
   ``|U3| >= max(t, min_survivors, T)`` with ``T = floor((n + c)/2) + 1`` (:func:`.graph.min_signers`);
   every ``P_u`` is signed by u and lies in u's graph neighbourhood, its own is the one it used; every
   edge inside U3 is mutual (``w in P_u <=> u in P_w``); ``D = (union of P_u) \\ U3``; and the graph of
   those mutual edges on U3 is ``(c + 1)``-vertex-connected (:func:`.graph.is_k_connected`). It signs
   at most one view per round.
5. Unmask: the server sends ``T`` signatures of members of U3 on the same view. A client verifies
   them, and only for the view it signed itself reveals its share of ``b_j`` for ``j in P_i cap U3``
   (and its own), its share of ``s_j`` for ``j in P_i cap D``, never both kinds for one peer (this memory
   is kept across requests). The server reconstructs with Reed–Solomon decoding (:mod:`.robust`) and
   checks each seed against its commitment and each key against its public key, so a corrupt share is
   corrected or detected (the sum is never silently wrong), removes the masks and gets
   ``sum_{i in U3} x_i mod 2^b``.

Threat model: a server that deviates arbitrarily (chooses every message, forwards what it likes to whom,
shows different clients different things, replays and tampers) together with at most ``c`` clients
that collude with it. Assumptions that remain: (A1) the server relays each client's public keys
faithfully (no PKI: a server that substitutes keys simulates every other client to its victim);
(A2) no Sybils: the roster holds real clients, at most ``c`` of them colluding; (A3) the Diffie–Hellman,
AEAD, PRG, hash and signature primitives are secure.

Claim (active schedule). In every round, for each world, the server learns about the inputs of honest
clients at most their sum over ``U3 \\ C`` for one view ``V`` certified by honest clients, where C is the
set of colluders; ``|U3 \\ C| >= max(t, min_survivors, T) - c``. Argument:

1. *One view.* Honest clients sign at most one view per round; two certified views of one roster of n
   would have ``2T - n > c`` common signers, all colluders: impossible. So every honest client that
   reveals anything uses the same V.
2. *One kind of share per secret.* For honest ``u in U3`` honest holders reveal only ``b_u``
   shares; for honest ``d in D`` only ``s_d`` shares; for everyone else nothing. Colluders add at most
   ``c < t`` shares. So the server knows ``b_u`` exactly for honest ``u in U3``, ``s_d`` exactly for
   ``d in D``, and the secrets of colluders.
3. *What can be solved for.* The server holds ``y_u`` and removes the masks it knows. Treating every
   unknown PRG output as an independent uniform vector, a combination ``sum a_u y_u`` reveals anything
   only if every unknown mask cancels: ``a_u = 0`` when ``b_u`` is unknown, and for a pairwise mask of
   two honest clients with unknown keys, ``a_u = a_w`` if the edge is mutual and ``a_u = 0`` if
   one-sided. The pairwise keys it does not know are exactly those between honest members of U3, and
   those edges are mutual (checked) and connect ``U3 \\ C`` (the used graph is (c+1)-connected). So the
   only learnable combinations are multiples of the sum over ``U3 \\ C``.
4. Replays, other rounds and other rosters fail AEAD, HKDF or signature checks (all bind W), and each
   client takes part in a round once (:class:`RoundLog`, kept by the node per run).

The semi-honest schedule (``active=False``: no stage 4, survivors checked on the public graph) is safe
only against a server that follows the protocol; item 1 of issue 10 (a server forwarding t-1 share
sets to its victim and calling them dropped) breaks it, as ``tests/secagg/test_secagg_adversary.py``
shows. It saves the consistency exchange (see ``docs/SECAGG.md``, "Exchanges per round").
"""

from __future__ import annotations

import functools
import hashlib
import secrets
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedprivacy.secagg import shamir
from fedprivacy.secagg.graph import (
    check_safe,
    harary_neighbours,
    is_connected,
    is_k_connected,
    min_signers,
)
from fedprivacy.secagg.keys import (
    KeyPair,
    SealError,
    Secret,
    context_bytes,
    derive_key,
    load_private,
    open_sealed,
    public_from_private,
    seal,
)
from fedprivacy.secagg.prg import apply_masks
from fedprivacy.secagg.robust import recover_secret

if TYPE_CHECKING:
    from fedprivacy.accounting.distributed import XNoiseDesign
    from fedprivacy.secagg.xnoise import ComponentSeeds

__all__ = [
    "AdvertiseKeys",
    "ClientSession",
    "ConsistencyRequest",
    "ConsistencyResponse",
    "MaskedInput",
    "MaskedInputRequest",
    "ProtocolViolation",
    "RoundAborted",
    "RoundLog",
    "ServerSession",
    "SetupRequest",
    "ShareKeysRequest",
    "SharedKeys",
    "UnmaskRequest",
    "UnmaskResponse",
    "component_commitment",
    "seed_commitment",
    "world_id",
]

_SHARE_SEAL = "share-seal"
_MASK = "mask"
_KEY_BYTES = 32
_SIG_BYTES = 64


class ProtocolViolation(ValueError):
    """A message breaks the protocol (dishonest or buggy peer); the session refuses it unchanged."""


class RoundAborted(RuntimeError):
    """The round cannot complete; the server has no sum, and no honest input is revealed."""


# ----------------------------------------------------------------------------- messages
@dataclass(frozen=True, slots=True, kw_only=True)
class SetupRequest:
    """Stage 0, server -> client: the round's public parameters.

    ``colluders`` is the number of clients assumed to collude with the server (it enters the threshold
    rule, the signature threshold and the connectivity check); ``active`` selects the schedule with
    the consistency stage (secure against a malicious server) or the semi-honest one without it.
    """

    round: int
    threshold: int
    degree: int
    modulus_bits: int = 32
    dim: int
    min_survivors: int = 0  # 0 means "threshold"
    colluders: int = 0
    active: bool = False

    def __post_init__(self) -> None:
        for name in ("round", "threshold", "degree", "modulus_bits", "dim", "min_survivors", "colluders"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        if not isinstance(self.active, bool):
            raise TypeError(f"active must be a bool, got {type(self.active).__name__}")
        if not 0 <= self.round < 2**64:
            raise ValueError(f"round must be in [0, 2**64), got {self.round}")
        if not 16 <= self.modulus_bits <= 32:
            raise ValueError(f"modulus_bits must be in [16, 32], got {self.modulus_bits}")
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")
        if self.threshold < 1:
            raise ValueError(f"threshold must be >= 1, got {self.threshold}")
        if self.min_survivors < 0:
            raise ValueError(f"min_survivors must be >= 0, got {self.min_survivors}")
        if self.colluders < 0:
            raise ValueError(f"colluders must be >= 0, got {self.colluders}")

    @property
    def required_survivors(self) -> int:
        return max(self.min_survivors, self.threshold)


@dataclass(frozen=True, slots=True, kw_only=True)
class AdvertiseKeys:
    """Stage 1, client -> server: three fresh public keys and the commitment to the self-mask seed."""

    round: int
    node_id: int
    enc_public: bytes
    mask_public: bytes
    sign_public: bytes
    seed_commitment: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareKeysRequest:
    """Stage 2, server -> clients: the roster U1 (parallel lists)."""

    round: int
    node_ids: list[int]
    enc_publics: list[bytes]
    mask_publics: list[bytes]
    sign_publics: list[bytes]
    seed_commitments: list[bytes]


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedKeys:
    """Stage 2, client -> server: one sealed share pair per neighbour."""

    round: int
    node_id: int
    receivers: list[int]
    ciphertexts: list[bytes]
    component_commitments: list[bytes] = field(default_factory=list)  # XNoise seeds 1..m


@dataclass(frozen=True, slots=True, kw_only=True)
class MaskedInputRequest:
    """Stage 3, server -> client: the sealed shares addressed to this client, from U2."""

    round: int
    senders: list[int]
    ciphertexts: list[bytes]


@dataclass(frozen=True, slots=True, kw_only=True)
class MaskedInput:
    """Stage 3, client -> server: the masked vector, the peers it masked with (signed), the rejected."""

    round: int
    node_id: int
    masked: np.ndarray  # uint32, shape (dim,), values < 2**modulus_bits
    peers: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    signature: bytes = b""
    design: bytes = b""  # fingerprint of the XNoise design the client encoded with (signed)

    def __repr__(self) -> str:
        return (f"MaskedInput(round={self.round}, node_id={self.node_id}, peers={self.peers}, "
                f"rejected={self.rejected}, masked=<{self.masked.dtype} x {self.masked.shape}>)")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsistencyRequest:
    """Stage 4, server -> survivors: the proposed view (U3, D and every survivor's signed peer set).

    ``peer_counts[i]`` peers of ``survivors[i]`` follow each other in ``peer_flat``.
    """

    round: int
    survivors: list[int]
    dropped: list[int]
    peer_counts: list[int]
    peer_flat: list[int]
    peer_signatures: list[bytes]
    designs: list[bytes] = field(default_factory=list)  # per survivor (XNoise), empty without it


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsistencyResponse:
    """Stage 4, client -> server: the client's signature on the view."""

    round: int
    node_id: int
    signature: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class UnmaskRequest:
    """Stage 5, server -> client: U3, D and (active schedule) >= T signatures of U3 members on the view."""

    round: int
    survivors: list[int]
    dropped: list[int]
    signers: list[int] = field(default_factory=list)
    signatures: list[bytes] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class UnmaskResponse:
    """Stage 5, client -> server: shares of survivors' self-mask seeds and dropped peers' keys."""

    round: int
    node_id: int
    seed_owners: list[int] = field(default_factory=list)
    seed_shares: list[bytes] = field(default_factory=list)
    key_owners: list[int] = field(default_factory=list)
    key_shares: list[bytes] = field(default_factory=list)
    component_owners: list[int] = field(default_factory=list)  # XNoise: excess components only
    component_indices: list[int] = field(default_factory=list)
    component_shares: list[bytes] = field(default_factory=list)

    def __repr__(self) -> str:
        return (f"UnmaskResponse(round={self.round}, node_id={self.node_id}, "
                f"seed_owners={self.seed_owners}, key_owners={self.key_owners}, "
                f"component_owners={self.component_owners}, shares=<redacted>)")


# ----------------------------------------------------------------------------- helpers
class _Stage(Enum):
    NEW = 0
    ADVERTISED = 1
    SHARED = 2
    MASKED = 3
    SIGNED = 4
    DONE = 5
    ABORTED = 6


def _abscissae(ids: Iterable[int]) -> dict[int, int]:
    """Shamir abscissa of each roster member: 1 + its position in the sorted roster (the limbed
    scheme of :mod:`.shamir` needs abscissae in [1, 2^31 - 1); the world fixes the roster)."""
    return {i: k + 1 for k, i in enumerate(sorted(ids))}


_SECRET_BYTES = 32


_ROW_BYTES = 4 * shamir.limbs_per_secret(_SECRET_BYTES)


def _share_rows(data: bytes, start: int, stop: int) -> bytes:
    """``encode_shares(decode_shares(data, ...)[start:stop])`` for ``data`` that ``decode_shares`` accepted:
    the encoding is the rows' little-endian limbs one after another, so rows ``start..stop`` are these
    bytes (no second decode/encode per row)."""
    return bytes(data[_ROW_BYTES * start:_ROW_BYTES * stop])


def _u64s(values: Iterable[int]) -> bytes:
    vals = list(values)
    return struct.pack(f">Q{len(vals)}Q", len(vals), *vals)


def seed_commitment(*, round: int, node_id: int, seed: bytes) -> bytes:
    """``SHA-256("fedprivacy/v1/seed-commit" | round | node_id | seed)``: binding, and hiding for a
    uniformly random 256-bit seed (random-oracle model)."""
    return hashlib.sha256(b"fedprivacy/v1/seed-commit" + struct.pack(">QQ", round, node_id)
                          + bytes(seed)).digest()


def component_commitment(*, round: int, node_id: int, index: int, seed: bytes) -> bytes:
    """Commitment to XNoise component seed ``index`` (same construction as :func:`seed_commitment`)."""
    return hashlib.sha256(b"fedprivacy/v1/component-commit" + struct.pack(">QQQ", round, node_id, index)
                          + bytes(seed)).digest()


def world_id(setup: SetupRequest, roster: ShareKeysRequest) -> bytes:
    """``SHA-256`` over every setup field and the sorted roster: the identity of one protocol instance."""
    columns = (tuple(roster.node_ids), tuple(roster.enc_publics), tuple(roster.mask_publics),
               tuple(roster.sign_publics), tuple(roster.seed_commitments))
    try:
        return _world_id(setup, *columns)
    except TypeError:  # an unhashable element (a bytearray key): computed without the cache
        return _world_id.__wrapped__(setup, *columns)


@functools.lru_cache(maxsize=16)
def _world_id(setup: SetupRequest, *columns: tuple[Any, ...]) -> bytes:
    """:func:`world_id` of equal inputs, computed once per process (every client of the in-process engine
    derives the world of the same roster; equal setups and columns pack to the same bytes)."""
    h = hashlib.sha256(b"fedprivacy/v1/world")
    h.update(struct.pack(">QQQQQQQ?", setup.round, setup.threshold, setup.degree, setup.modulus_bits,
                         setup.dim, setup.min_survivors, setup.colluders, setup.active))
    entries = sorted(zip(*columns, strict=True))
    parts = [struct.pack(">Q", len(entries))]  # hashed as one string: the same bytes as one update each
    for node_id, *keys in entries:
        parts.append(struct.pack(">Q", node_id))
        for k in keys:
            parts.append(struct.pack(">H", len(k)))
            parts.append(bytes(k))
    h.update(b"".join(parts))
    return h.digest()


def _context(world: bytes, round_: int, sender: int, receiver: int) -> bytes:
    return world + context_bytes(round=round_, sender=sender, receiver=receiver)


def _pair_seed(mask_private: X25519PrivateKey, peer_mask_public: bytes, *, world: bytes, round_: int,
               me: int, peer: int) -> bytes:
    lo, hi = (me, peer) if me < peer else (peer, me)
    return derive_key(mask_private, peer_mask_public, purpose=_MASK,
                      context=_context(world, round_, lo, hi))


def _peers_statement(world: bytes, node_id: int, peers: Sequence[int], design: bytes = b"") -> bytes:
    return (b"fedprivacy/v1/peers" + world + struct.pack(">Q", node_id) + _u64s(peers)
            + struct.pack(">H", len(design)) + design)


def _view_digest(world: bytes, survivors: Sequence[int], dropped: Sequence[int],
                 peer_sets: Mapping[int, Sequence[int]], design: bytes = b"") -> bytes:
    h = hashlib.sha256(b"fedprivacy/v1/view" + world)
    h.update(_u64s(sorted(survivors)))
    h.update(_u64s(sorted(dropped)))
    for u in sorted(survivors):
        h.update(_u64s(peer_sets[u]))
    h.update(struct.pack(">H", len(design)) + design)
    return h.digest()


def _view_statement(digest: bytes) -> bytes:
    return b"fedprivacy/v1/view-signature" + digest


def _sign(private: Secret, data: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(private.reveal()).sign(data)


#: views that passed :meth:`ClientSession._check_view`, keyed by everything those checks read: the world
#: id (SHA-256 over the setup and the roster: it fixes the roster's signing keys and the graph, which
#: ``harary_neighbours`` derives from the world), the design fingerprint, c, and the whole proposed view
#: (survivors, dropouts, peer lists, signatures). Like :func:`_verify`'s cache it only saves the
#: in-process engine's clients from re-deriving one another's verdict on the same view: a client checks
#: its own peer set, membership and stage every time, a view that failed is checked again, and a
#: client in its own process (any real deployment) checks every view itself.
_VIEWS_PASSED: dict[tuple[Any, ...], tuple[dict[int, tuple[int, ...]], bytes]] = {}
_VIEWS_KEPT = 8


@functools.lru_cache(maxsize=1 << 16)
def _verify(public: bytes, signature: bytes, data: bytes) -> bool:
    """Ed25519 verification (RFC 8032). Cached: in one process (the in-process engine) many clients
    verify the same statement, and a triple that verified once stays valid."""
    if len(public) != _KEY_BYTES or len(signature) != _SIG_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


def _check_round(expected: int, got: int, what: str) -> None:
    if got != expected:
        raise ProtocolViolation(f"{what} is for round {got}, this session is round {expected} "
                                f"(replay from another round?)")


def _check_node_id(node_id: int) -> int:
    if isinstance(node_id, bool) or not isinstance(node_id, int) or not 0 <= node_id < 2**64 - 1:
        raise ValueError(f"node_id must be an int in [0, 2**64 - 1), got {node_id!r}")
    return node_id


def _unique(values: Sequence[int], what: str) -> list[int]:
    vals = list(values)
    if len(set(vals)) != len(vals):
        raise ProtocolViolation(f"{what} repeats a node")
    return vals


def _split_peer_lists(survivors: Sequence[int], counts: Sequence[int], flat: Sequence[int]
                      ) -> dict[int, tuple[int, ...]]:
    if len(counts) != len(survivors) or any(c < 0 for c in counts) or sum(counts) != len(flat):
        raise ProtocolViolation("peer lists do not match the survivors")
    out, pos = {}, 0
    for u, c in zip(survivors, counts, strict=True):
        out[u] = tuple(flat[pos:pos + c])
        pos += c
    return out


def _used_graph(peer_sets: Mapping[int, Sequence[int]]) -> dict[int, set[int]]:
    """Mutual edges among the keys of ``peer_sets`` (both ends masked with each other)."""
    return {u: {w for w in ps if w in peer_sets and u in peer_sets[w]} for u, ps in peer_sets.items()}


def _check_vector(vector: object, setup: SetupRequest, what: str) -> np.ndarray:
    if not isinstance(vector, np.ndarray) or vector.dtype != np.uint32 or vector.shape != (setup.dim,):
        got = f"{vector.dtype} x {vector.shape}" if isinstance(vector, np.ndarray) else type(vector).__name__
        raise ProtocolViolation(f"{what} must be uint32 x ({setup.dim},), got {got}")
    if setup.modulus_bits < 32 and int(vector.max(initial=0)) >= 1 << setup.modulus_bits:
        raise ProtocolViolation(f"{what} has values >= 2^{setup.modulus_bits}")
    return vector


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


# ----------------------------------------------------------------------------- client
class ClientSession:
    """One client's side of one round. Methods must be called in stage order.

    Every method validates the whole request before it changes any state; a refused request raises
    :class:`ProtocolViolation` (or ValueError/TypeError) and leaves the session as it was.

    Args:
        node_id: this client's id in the protocol.
        setup: the round's parameters (from the server; checked against this client's own floor).
        colluders: the client's own assumption on colluding clients; a setup with fewer is refused.
        require_active: refuse the semi-honest schedule.
    """

    __slots__ = (
        "node_id", "setup", "colluders", "require_active", "_stage",
        "_enc", "_mask", "_sign", "_sign_public", "_seed",
        "_world", "_roster_ids", "_mask_publics", "_sign_publics", "_graph", "_neighbours",
        "_seal_keys", "_own_seed_share", "_held_seed_shares", "_held_key_shares", "_peers",
        "_view_survivors", "_view_dropped", "_view_digest", "_view_signature", "_revealed",
        "_design", "_components", "_held_components", "_own_component_share", "_component_count",
        "_enc_key", "_mask_key",
    )
    #: slots rebuilt from others by :meth:`from_state` (parsed key objects), not part of the state
    DERIVED = ("_enc_key", "_mask_key")

    def __init__(self, *, node_id: int, setup: SetupRequest, colluders: int = 0,
                 require_active: bool = False) -> None:
        if not isinstance(setup, SetupRequest):
            raise TypeError(f"setup must be a SetupRequest, got {type(setup).__name__}")
        if isinstance(colluders, bool) or not isinstance(colluders, int) or colluders < 0:
            raise ValueError(f"colluders must be an int >= 0, got {colluders!r}")
        if setup.colluders < colluders:
            raise ProtocolViolation(f"setup assumes {setup.colluders} colluding clients, this client "
                                    f"assumes {colluders}: refusing")
        if require_active and not setup.active:
            raise ProtocolViolation("setup asks for the semi-honest schedule, this client requires the "
                                    "actively secure one: refusing")
        self.node_id = _check_node_id(node_id)
        self.setup = setup
        self.colluders = colluders
        self.require_active = bool(require_active)
        self._stage = _Stage.NEW
        self._enc = KeyPair.generate()
        self._mask = KeyPair.generate()
        self._sign = Secret(secrets.token_bytes(_KEY_BYTES))
        self._sign_public = Ed25519PrivateKey.from_private_bytes(self._sign.reveal()).public_key(
        ).public_bytes_raw()
        self._seed = Secret(secrets.token_bytes(_KEY_BYTES))
        self._world = b""
        self._roster_ids: tuple[int, ...] = ()
        self._mask_publics: dict[int, bytes] = {}
        self._sign_publics: dict[int, bytes] = {}
        self._graph: dict[int, tuple[int, ...]] = {}
        self._neighbours: tuple[int, ...] = ()
        self._seal_keys: dict[int, bytes] = {}
        self._own_seed_share = b""
        self._held_seed_shares: dict[int, bytes] = {}
        self._held_key_shares: dict[int, bytes] = {}
        self._peers: tuple[int, ...] = ()
        self._view_survivors: tuple[int, ...] = ()
        self._view_dropped: tuple[int, ...] = ()
        self._view_digest = b""
        self._view_signature = b""
        self._revealed: dict[int, str] = {}
        self._design: XNoiseDesign | None = None  # XNoise (issue 12): set in stage 2 if used
        self._components: tuple[bytes, ...] = ()  # this client's seeds of components 1..m
        self._held_components: dict[int, bytes] = {}  # peer -> its m component-seed shares
        self._own_component_share = b""
        self._component_count = -1  # the survivor count component shares were revealed for
        self._derive()

    def _derive(self) -> None:
        self._enc_key = load_private(self._enc.private)
        self._mask_key = load_private(self._mask.private)

    def __repr__(self) -> str:
        return (f"ClientSession(node_id={self.node_id}, round={self.setup.round}, "
                f"stage={self._stage.name}, secrets=<redacted>)")

    @property
    def stage(self) -> str:
        return self._stage.name

    @property
    def peers(self) -> tuple[int, ...]:
        """The peers this client masked with (stage 3 on)."""
        return self._peers

    @property
    def roster_size(self) -> int:
        """Clients in this client's roster (stage 2 on)."""
        return len(self._roster_ids)

    @property
    def components(self) -> ComponentSeeds | None:
        """This client's XNoise seeds of the round (stage 2 on; None without XNoise), for the encoder:
        it must add exactly the components whose seeds it shared."""
        if self._design is None:
            return None
        from fedprivacy.secagg.xnoise import ComponentSeeds

        return ComponentSeeds(design=self._design, round=self.setup.round, node_id=self.node_id,
                              seeds=self._components)

    @property
    def revealed(self) -> dict[int, str]:
        """Peer -> kind of share revealed ("seed" or "key"); a copy."""
        return dict(self._revealed)

    def _expect(self, stage: _Stage, what: str) -> None:
        if self._stage is not stage:
            raise ProtocolViolation(f"{what} not allowed in stage {self._stage.name}")

    @property
    def _fingerprint(self) -> bytes:
        return b"" if self._design is None else self._design.fingerprint()

    @property
    def _num_components(self) -> int:
        return 0 if self._design is None else self._design.num_seeded

    @property
    def _signers_needed(self) -> int:
        return min_signers(len(self._roster_ids), colluders=self.setup.colluders)

    # stage 1
    def advertise_keys(self, *, log: RoundLog | None = None) -> AdvertiseKeys:
        """Stage 1; with ``log``, refuse a round this client already took part in (and record it)."""
        self._expect(_Stage.NEW, "advertise_keys")
        if log is not None:
            log.admit(self.setup.round)
        self._stage = _Stage.ADVERTISED
        return AdvertiseKeys(
            round=self.setup.round, node_id=self.node_id, enc_public=self._enc.public,
            mask_public=self._mask.public, sign_public=self._sign_public,
            seed_commitment=seed_commitment(round=self.setup.round, node_id=self.node_id,
                                            seed=self._seed.reveal()))

    # stage 2
    def share_keys(self, request: ShareKeysRequest, *, components: ComponentSeeds | None = None
                   ) -> SharedKeys:
        """Stage 2. ``components``: this client's XNoise seeds (issue 12), built by the caller from
        its own floor for a design of ``len(request.node_ids)`` clients; shared like ``b``."""
        self._expect(_Stage.ADVERTISED, "share_keys")
        s = self.setup
        _check_round(s.round, request.round, "ShareKeysRequest")
        ids = _unique(request.node_ids, "roster")
        cols = (request.enc_publics, request.mask_publics, request.sign_publics, request.seed_commitments)
        if any(len(c) != len(ids) for c in cols):
            raise ProtocolViolation("roster lists have different lengths")
        if not (set(map(type, ids)) <= {int} and (not ids or (min(ids) >= 0 and max(ids) < 2**64 - 1))):
            for i in ids:  # (the fast test above accepts exactly what this loop accepts)
                _check_node_id(i)
        if not all(set(map(len, c)) <= {_KEY_BYTES} for c in cols):
            raise ProtocolViolation("roster carries a malformed key or commitment")
        for c in cols[:3]:
            if len(set(c)) != len(c):
                raise ProtocolViolation("roster repeats a public key")
        mine = [(e, m, g, h) for i, e, m, g, h in zip(ids, *cols, strict=True) if i == self.node_id]
        own = (self._enc.public, self._mask.public, self._sign_public,
               seed_commitment(round=s.round, node_id=self.node_id, seed=self._seed.reveal()))
        if mine != [own]:
            raise ProtocolViolation("roster does not carry this client's own keys")
        if len(ids) < s.required_survivors:
            raise ProtocolViolation(f"roster has {len(ids)} clients, fewer than the "
                                    f"{s.required_survivors} required")
        try:
            check_safe(num_clients=len(ids), degree=s.degree, threshold=s.threshold,
                       colluders=s.colluders)
        except ValueError as exc:
            raise ProtocolViolation(f"unsafe round parameters: {exc}") from None
        if s.active and min_signers(len(ids), colluders=s.colluders) > len(ids):
            raise ProtocolViolation("roster too small for the signature threshold")
        if components is not None:
            d = components.design
            if components.round != s.round or components.node_id != self.node_id:
                raise ValueError("components were drawn for another round or node")
            if d.roster != len(ids) or d.colluders < self.colluders or d.min_survivors > s.required_survivors:
                raise ValueError(f"components' design (roster {d.roster}, colluders {d.colluders}, "
                                 f"t {d.min_survivors}) does not fit this round (roster {len(ids)}, "
                                 f"colluders >= {self.colluders}, releases sums of >= {s.required_survivors})")
        world = world_id(s, request)
        graph = harary_neighbours(ids, degree=s.degree, seed=world)
        neighbours = graph[self.node_id]
        enc_pub = dict(zip(ids, request.enc_publics, strict=True))
        x_of = _abscissae(ids)
        seeds = () if components is None else tuple(components.seeds)
        shares = shamir.split_secrets([self._seed.reveal(), self._mask.private.reveal(), *seeds],
                                      threshold=s.threshold,
                                      xs=[x_of[j] for j in neighbours] + [x_of[self.node_id]])
        cts, seal_keys = [], {}
        for j, share in zip(neighbours, shares[:-1], strict=True):
            lo, hi = (self.node_id, j) if self.node_id < j else (j, self.node_id)
            key = derive_key(self._enc_key, enc_pub[j], purpose=_SHARE_SEAL,
                             context=_context(world, s.round, lo, hi))
            seal_keys[j] = key
            cts.append(seal(key, shamir.encode_shares(share), purpose=_SHARE_SEAL,
                            context=_context(world, s.round, self.node_id, j)))
        commitments = [component_commitment(round=s.round, node_id=self.node_id, index=j, seed=seed)
                       for j, seed in enumerate(seeds, start=1)]
        # commit state (the own key share is discarded: a live client never reveals it)
        self._own_seed_share = shamir.encode_shares(shares[-1][0:1])
        self._design = None if components is None else components.design
        self._components = seeds
        self._own_component_share = shamir.encode_shares(shares[-1][2:]) if seeds else b""
        self._seal_keys = seal_keys
        self._world = world
        self._roster_ids = tuple(ids)
        self._mask_publics = dict(zip(ids, request.mask_publics, strict=True))
        self._sign_publics = dict(zip(ids, request.sign_publics, strict=True))
        self._graph = graph
        self._neighbours = neighbours
        self._stage = _Stage.SHARED
        return SharedKeys(round=s.round, node_id=self.node_id, receivers=list(neighbours),
                          ciphertexts=cts, component_commitments=commitments)

    # stage 3
    def masked_input(self, request: MaskedInputRequest, vector: np.ndarray) -> MaskedInput:
        """Mask ``vector`` (uint32 residues mod 2^b, length dim) with the peers whose shares opened."""
        self._expect(_Stage.SHARED, "masked_input")
        s = self.setup
        _check_round(s.round, request.round, "MaskedInputRequest")
        if not isinstance(vector, np.ndarray) or vector.dtype != np.uint32 or vector.shape != (s.dim,):
            raise TypeError(f"vector must be a uint32 array of shape ({s.dim},)")
        if s.modulus_bits < 32 and int(vector.max(initial=0)) >= 1 << s.modulus_bits:
            raise ValueError(f"vector has values >= 2^{s.modulus_bits}")
        senders = _unique(request.senders, "senders")
        if len(senders) != len(request.ciphertexts):
            raise ProtocolViolation("senders and ciphertexts do not match one-to-one")
        nb = set(self._neighbours)
        for j in senders:
            if j not in nb:
                raise ProtocolViolation(f"ciphertext from {j}, which is not a neighbour")
        seed_shares, key_shares, comp_shares, rejected = {}, {}, {}, []
        m = self._num_components  # every sender of this world uses this client's design (checked later)
        for j, ct in zip(senders, request.ciphertexts, strict=True):
            try:
                pt = open_sealed(self._seal_keys[j], ct, purpose=_SHARE_SEAL,
                                 context=_context(self._world, s.round, j, self.node_id))
                shamir.decode_shares(pt, num_secrets=2 + m, secret_bytes=_SECRET_BYTES)  # validates
                seed_sh, key_sh = _share_rows(pt, 0, 1), _share_rows(pt, 1, 2)
            except (SealError, TypeError, ValueError):
                rejected.append(j)  # a bad share drops its sender for this client, not the round
                continue
            seed_shares[j], key_shares[j] = seed_sh, key_sh
            if m:
                comp_shares[j] = _share_rows(pt, 2, 2 + m)
        peers = tuple(sorted(seed_shares))
        if len(peers) + 1 < s.threshold:
            raise ProtocolViolation(f"only {len(peers) + 1} holders of this client's shares, fewer "
                                    f"than threshold {s.threshold}: refusing to upload")
        if s.active and len(peers) < s.colluders + 1:
            raise ProtocolViolation(f"only {len(peers)} peers to mask with; {s.colluders} may collude: "
                                    f"refusing to upload")
        add = [self._seed.reveal()]
        sub: list[bytes] = []
        for j in peers:
            seed = _pair_seed(self._mask_key, self._mask_publics[j], world=self._world, round_=s.round,
                              me=self.node_id, peer=j)
            (add if self.node_id < j else sub).append(seed)
        y = np.empty(s.dim, dtype=np.uint32)
        apply_masks(np.ascontiguousarray(vector), add=add, subtract=sub, modulus_bits=s.modulus_bits,
                    out=y)
        fp = self._fingerprint
        signature = _sign(self._sign, _peers_statement(self._world, self.node_id, peers, fp))
        self._held_seed_shares = seed_shares
        self._held_key_shares = key_shares
        self._held_components = {j: comp_shares[j] for j in peers} if m else {}
        self._peers = peers
        self._stage = _Stage.MASKED
        return MaskedInput(round=s.round, node_id=self.node_id, masked=y, peers=list(peers),
                           rejected=sorted(rejected), signature=signature, design=fp)

    # stage 4 (active schedule)
    def sign_view(self, request: ConsistencyRequest) -> ConsistencyResponse:
        """Check the proposed view and sign it; at most one view per round (repeats get the same)."""
        s = self.setup
        if not s.active:
            raise ProtocolViolation("the semi-honest schedule has no consistency stage")
        if self._stage not in (_Stage.MASKED, _Stage.SIGNED):
            raise ProtocolViolation(f"sign_view not allowed in stage {self._stage.name}")
        _check_round(s.round, request.round, "ConsistencyRequest")
        surv = _unique(request.survivors, "survivor list")
        drop = _unique(request.dropped, "dropout list")
        sset, dset = set(surv), set(drop)
        if sset & dset:
            raise ProtocolViolation(f"nodes listed as both survived and dropped: {sorted(sset & dset)}")
        unknown = (sset | dset) - set(self._roster_ids)
        if unknown:
            raise ProtocolViolation(f"nodes {sorted(unknown)} are not in the roster")
        if self.node_id not in sset:
            raise ProtocolViolation("this client is asked to sign a view that does not list it as a survivor")
        need = max(s.required_survivors, self._signers_needed)
        if len(sset) < need:
            raise ProtocolViolation(f"only {len(sset)} survivors in the view, fewer than {need}: refusing")
        if len(request.peer_signatures) != len(surv):
            raise ProtocolViolation("peer signatures do not match the survivors")
        fp = self._fingerprint
        designs = list(request.designs) if request.designs else [b""] * len(surv)
        if designs != [fp] * len(surv):
            raise ProtocolViolation("the survivors do not all use this client's noise design")
        key = (self._world, fp, s.colluders, tuple(surv), tuple(drop), tuple(request.peer_counts),
               tuple(request.peer_flat), tuple(map(bytes, request.peer_signatures)))
        passed = _VIEWS_PASSED.get(key)
        if passed is not None:  # this very view passed every check below that is not about this client
            peer_sets, digest = passed
            if peer_sets[self.node_id] != self._peers:
                raise ProtocolViolation("the view misstates the peers this client masked with")
        else:
            peer_sets, digest = self._check_view(request, surv, drop, sset, dset, fp)
            _VIEWS_PASSED[key] = (peer_sets, digest)
            while len(_VIEWS_PASSED) > _VIEWS_KEPT:
                del _VIEWS_PASSED[next(iter(_VIEWS_PASSED))]
        if self._stage is _Stage.SIGNED:
            if digest != self._view_digest:
                raise ProtocolViolation("this client already signed another view of this round: refusing")
            return ConsistencyResponse(round=s.round, node_id=self.node_id, signature=self._view_signature)
        signature = _sign(self._sign, _view_statement(digest))
        self._view_survivors = tuple(sorted(surv))
        self._view_dropped = tuple(sorted(drop))
        self._view_digest = digest
        self._view_signature = signature
        self._stage = _Stage.SIGNED
        return ConsistencyResponse(round=s.round, node_id=self.node_id, signature=signature)

    def _check_view(self, request: ConsistencyRequest, surv: list[int], drop: list[int], sset: set[int],
                    dset: set[int], fp: bytes) -> tuple[dict[int, tuple[int, ...]], bytes]:
        """:meth:`sign_view`'s checks of the peer sets (signed, in the graph, mutual, D exact, the used
        graph (c + 1)-connected; in this order, with the client's own peer set among them) -> the peer
        sets and the view's digest."""
        s = self.setup
        peer_sets = _split_peer_lists(surv, request.peer_counts, request.peer_flat)
        for u, sig in zip(surv, request.peer_signatures, strict=True):
            ps = peer_sets[u]
            if list(ps) != sorted(set(ps)) or not set(ps) <= set(self._graph[u]):
                raise ProtocolViolation(f"peer set of {u} is not a sorted subset of its neighbours")
            if not _verify(self._sign_publics[u], bytes(sig), _peers_statement(self._world, u, ps, fp)):
                raise ProtocolViolation(f"peer set of {u} is not signed by {u}")
        if peer_sets[self.node_id] != self._peers:
            raise ProtocolViolation("the view misstates the peers this client masked with")
        for u, ps in peer_sets.items():
            for w in ps:
                if w in sset and u not in peer_sets[w]:
                    raise ProtocolViolation(f"{u} masked with {w} but {w} not with {u}: one-sided edge")
        if dset != set().union(*peer_sets.values()) - sset:
            raise ProtocolViolation("the dropout list is not exactly the survivors' peers outside U3")
        if not is_k_connected(sset, _used_graph(peer_sets), s.colluders + 1):
            raise ProtocolViolation(
                f"the survivors' used masking graph is not {s.colluders + 1}-vertex-connected: with "
                f"{s.colluders} colluders the server could learn partial sums; refusing")
        return peer_sets, _view_digest(self._world, surv, drop, peer_sets, fp)

    # stage 5
    def unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        """Reveal one kind of share per peer; refuse contradictory, unsafe or uncertified requests."""
        s = self.setup
        _check_round(s.round, request.round, "UnmaskRequest")
        surv = _unique(request.survivors, "survivor list")
        drop = _unique(request.dropped, "dropout list")
        sset, dset = set(surv), set(drop)
        if s.active:
            if self._stage not in (_Stage.SIGNED, _Stage.DONE):
                raise ProtocolViolation(f"unmask not allowed in stage {self._stage.name} (no signed view)")
            if tuple(sorted(surv)) != self._view_survivors or tuple(sorted(drop)) != self._view_dropped:
                raise ProtocolViolation("unmask request differs from the view this client signed")
            signers = _unique(request.signers, "signer list")
            if len(signers) != len(request.signatures):
                raise ProtocolViolation("signers and signatures do not match one-to-one")
            if not set(signers) <= sset:
                raise ProtocolViolation("a signer of the view is not one of its survivors")
            statement = _view_statement(self._view_digest)
            bad = [u for u, sig in zip(signers, request.signatures, strict=True)
                   if not _verify(self._sign_publics[u], bytes(sig), statement)]
            if bad:
                raise ProtocolViolation(f"signatures of {bad} on the view do not verify")
            if len(signers) < self._signers_needed:
                raise ProtocolViolation(f"only {len(signers)} signatures on the view, fewer than "
                                        f"{self._signers_needed}: refusing to reveal any share")
        else:
            if self._stage not in (_Stage.MASKED, _Stage.DONE):
                raise ProtocolViolation(f"unmask not allowed in stage {self._stage.name}")
            if sset & dset:
                raise ProtocolViolation(f"nodes listed as both survived and dropped: {sorted(sset & dset)}")
            if self.node_id not in sset:
                raise ProtocolViolation("this client is answering, yet it is not listed as a survivor")
            if len(sset) < s.required_survivors:
                raise ProtocolViolation(f"only {len(sset)} survivors listed, fewer than "
                                        f"{s.required_survivors}: refusing to reveal any share")
            unknown = sset - set(self._graph)
            if unknown:
                raise ProtocolViolation(f"survivors {sorted(unknown)} are not in the roster")
            if not is_connected(sset, self._graph):
                raise ProtocolViolation("the survivors' masking graph is disconnected: unmasking would "
                                        "reveal partial sums; refusing")
        missing = [j for j in self._peers if j not in sset and j not in dset]
        if missing:
            raise ProtocolViolation(f"peers {missing} are neither survived nor dropped")
        plan: dict[int, str] = {}
        for j in self._peers:
            kind = "seed" if j in sset else "key"
            prev = self._revealed.get(j)
            if prev is not None and prev != kind:
                raise ProtocolViolation(f"server asks for the {kind} share of {j} after the {prev} share: "
                                        f"refusing (both would unmask {j})")
            plan[j] = kind
        seeds = [j for j in self._peers if plan[j] == "seed"]
        keys = [j for j in self._peers if plan[j] == "key"]
        comp_owners, comp_indices, comp_shares = self._component_reveals(sorted(sset), seeds)
        resp = UnmaskResponse(
            round=s.round, node_id=self.node_id,
            seed_owners=[self.node_id, *seeds],
            seed_shares=[self._own_seed_share, *(self._held_seed_shares[j] for j in seeds)],
            key_owners=keys, key_shares=[self._held_key_shares[j] for j in keys],
            component_owners=comp_owners, component_indices=comp_indices, component_shares=comp_shares)
        if self._design is not None:
            self._component_count = len(sset)
        self._revealed.update(plan)
        self._stage = _Stage.DONE
        return resp

    def _component_reveals(self, survivors: Sequence[int], seed_owners: Sequence[int]
                           ) -> tuple[list[int], list[int], list[bytes]]:
        """Shares of exactly the excess components (XNoise) of this client and its surviving peers,
        for the survivor count of the request; one count per round (a second count is refused)."""
        design = self._design
        if design is None or design.num_seeded == 0:
            return [], [], []
        count = len(survivors)
        if self._component_count not in (-1, count):
            raise ProtocolViolation(f"component shares were revealed for {self._component_count} "
                                    f"survivors; refusing another count ({count})")
        rank = {u: r for r, u in enumerate(survivors)}
        owners, indices, shares = [], [], []
        for owner in (self.node_id, *seed_owners):
            blob = self._own_component_share if owner == self.node_id else self._held_components[owner]
            shamir.decode_shares(blob, num_secrets=design.num_seeded, secret_bytes=_SECRET_BYTES)  # validates
            for j in design.removable(survivors=count, rank=rank[owner]):
                owners.append(owner)
                indices.append(j)
                shares.append(_share_rows(blob, j - 1, j))
        return owners, indices, shares

    # state
    def to_state(self, *, roster_fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every field as flat values (ints, bools, str, bytes and lists of them) for the node's state.

        It holds the round's secrets (private keys, self-mask seed, held shares): keep it on the client
        (Flower's ``context.state`` stays in the SuperNode and its ClientApp process), never in
        messages, metrics, logs or files.

        ``roster_fields``: the :meth:`roster_state` fields in a form the caller already holds for this
        very roster, key map and graph (an exporter's packed copy), used instead of building them.
        """
        from fedprivacy.secagg import wire

        _, setup = wire.encode(self.setup)
        held = sorted(self._held_seed_shares)
        revealed = sorted(self._revealed)
        seal_peers = sorted(self._seal_keys)
        return {
            **{f"setup.{k}": v for k, v in setup.items()},
            "node_id": self.node_id, "colluders": self.colluders, "require_active": self.require_active,
            "stage": self._stage.name,
            "enc.private": self._enc.private.reveal(), "enc.public": self._enc.public,
            "mask.private": self._mask.private.reveal(), "mask.public": self._mask.public,
            "sign": self._sign.reveal(), "sign_public": self._sign_public, "seed": self._seed.reveal(),
            "world": self._world, **(self.roster_state() if roster_fields is None else roster_fields),
            "neighbours": list(self._neighbours),
            "seal_keys.peers": seal_peers, "seal_keys.keys": [self._seal_keys[j] for j in seal_peers],
            "own_seed_share": self._own_seed_share,
            "held.peers": held, "held_seed_shares": [self._held_seed_shares[j] for j in held],
            "held_key_shares": [self._held_key_shares[j] for j in held],
            "peers": list(self._peers),
            "view_survivors": list(self._view_survivors), "view_dropped": list(self._view_dropped),
            "view_digest": self._view_digest, "view_signature": self._view_signature,
            "revealed.peers": revealed, "revealed.kinds": [self._revealed[j] for j in revealed],
            **self._design_state(),
            "components": list(self._components),
            "held_components.peers": sorted(self._held_components),
            "held_components.shares": [self._held_components[j] for j in sorted(self._held_components)],
            "own_component_share": self._own_component_share, "component_count": self._component_count,
        }

    #: the :meth:`to_state` fields fixed by the roster, its key maps and the graph (set together in stage 2)
    ROSTER_FIELDS = ("roster_ids", "mask_publics", "sign_publics", "graph.nodes", "graph.sizes", "graph.flat")

    def roster_state(self) -> dict[str, Any]:
        """The :data:`ROSTER_FIELDS` of :meth:`to_state`."""
        graph_nodes = sorted(self._graph)
        return {"roster_ids": list(self._roster_ids),
                "mask_publics": [self._mask_publics[i] for i in self._roster_ids],
                "sign_publics": [self._sign_publics[i] for i in self._roster_ids],
                "graph.nodes": graph_nodes, "graph.sizes": [len(self._graph[i]) for i in graph_nodes],
                "graph.flat": [j for i in graph_nodes for j in self._graph[i]]}

    def roster_source(self) -> tuple[Any, ...]:
        """What :meth:`roster_state` is computed from (compare two sessions' with ``==``)."""
        return (self._roster_ids, self._mask_publics, self._sign_publics, self._graph)

    def _design_state(self) -> dict[str, Any]:
        d = self._design
        if d is None:
            return {"design.present": False}
        return {"design.present": True, "design.total_variance": float(d.total_variance),
                "design.roster": d.roster, "design.min_survivors": d.min_survivors,
                "design.colluders": d.colluders, "design.kind": d.kind,
                "design.max_components": d.max_components}

    @classmethod
    def from_state(cls, fields: Mapping[str, Any]) -> ClientSession:
        """The inverse of :meth:`to_state`; validates every field (TypeError/ValueError if malformed)."""
        from fedprivacy.secagg import wire

        f = dict(fields)
        setup = wire.decode("secagg.setup", {k[len("setup."):]: v for k, v in f.items()
                                             if k.startswith("setup.")})

        def ints(name: str) -> list[int]:
            v = f[name]
            if not isinstance(v, list | tuple) or not all(type(x) is int for x in v):  # bools excluded
                raise TypeError(f"state field {name!r} must be a list of ints")
            return list(v)

        def blobs(name: str) -> list[bytes]:
            v = f[name]
            if not isinstance(v, list | tuple) or not all(type(x) is bytes for x in v):
                raise TypeError(f"state field {name!r} must be a list of bytes")
            return list(v)

        def blob(name: str) -> bytes:
            if not isinstance(f[name], bytes):
                raise TypeError(f"state field {name!r} must be bytes")
            return bytes(f[name])

        s = object.__new__(cls)
        s.node_id = _check_node_id(int(f["node_id"]))
        s.setup = setup
        s.colluders = int(f["colluders"])
        s.require_active = bool(f["require_active"])
        s._stage = _Stage[str(f["stage"])]
        s._enc = KeyPair(Secret(blob("enc.private")), blob("enc.public"))
        s._mask = KeyPair(Secret(blob("mask.private")), blob("mask.public"))
        s._sign = Secret(blob("sign"))
        s._sign_public = blob("sign_public")
        s._seed = Secret(blob("seed"))
        s._world = blob("world")
        s._roster_ids = tuple(ints("roster_ids"))
        s._mask_publics = dict(zip(s._roster_ids, blobs("mask_publics"), strict=True))
        s._sign_publics = dict(zip(s._roster_ids, blobs("sign_publics"), strict=True))
        flat, graph, pos = ints("graph.flat"), {}, 0
        for i, size in zip(ints("graph.nodes"), ints("graph.sizes"), strict=True):
            graph[i] = tuple(flat[pos:pos + size])
            pos += size
        s._graph = graph
        s._neighbours = tuple(ints("neighbours"))
        s._seal_keys = dict(zip(ints("seal_keys.peers"), blobs("seal_keys.keys"), strict=True))
        s._own_seed_share = blob("own_seed_share")
        held = ints("held.peers")
        s._held_seed_shares = dict(zip(held, blobs("held_seed_shares"), strict=True))
        s._held_key_shares = dict(zip(held, blobs("held_key_shares"), strict=True))
        s._peers = tuple(ints("peers"))
        s._view_survivors = tuple(ints("view_survivors"))
        s._view_dropped = tuple(ints("view_dropped"))
        s._view_digest = blob("view_digest")
        s._view_signature = blob("view_signature")
        kinds = f["revealed.kinds"]
        s._revealed = {j: str(k) for j, k in zip(ints("revealed.peers"), kinds, strict=True)}
        if not set(s._revealed.values()) <= {"seed", "key"}:
            raise ValueError("state field 'revealed.kinds' must hold 'seed' or 'key'")
        s._design = None
        if f["design.present"] is True:
            from fedprivacy.accounting.distributed import XNoiseDesign

            s._design = XNoiseDesign(
                total_variance=float(f["design.total_variance"]), roster=int(f["design.roster"]),
                min_survivors=int(f["design.min_survivors"]), colluders=int(f["design.colluders"]),
                kind=str(f["design.kind"]), max_components=int(f["design.max_components"]))
        s._components = tuple(blobs("components"))
        s._held_components = dict(zip(ints("held_components.peers"), blobs("held_components.shares"),
                                      strict=True))
        s._own_component_share = blob("own_component_share")
        s._component_count = int(f["component_count"])
        if public_from_private(s._enc.private.reveal()) != s._enc.public or \
                public_from_private(s._mask.private.reveal()) != s._mask.public:
            raise ValueError("state holds a private key that does not match its public key")
        s._derive()
        return s


# ----------------------------------------------------------------------------- server
class ServerSession:
    """The honest server's side of one round. Feed each stage the replies that arrived.

    A bad or unexpected reply drops its sender (``failures[node] = reason``) instead of failing the
    stage, so one faulty client cannot abort the round. Too few clients, an unsafe view or an
    unrecoverable secret raise :class:`RoundAborted` (the session is then closed).
    """

    def __init__(self, setup: SetupRequest, *,
                 noise_design: Callable[[int], XNoiseDesign] | None = None) -> None:
        """``noise_design(n)``: the XNoise design of a round with ``n`` clients in its roster (issue 12),
        whose excess components the server removes; ``None`` for no XNoise."""
        if not isinstance(setup, SetupRequest):
            raise TypeError(f"setup must be a SetupRequest, got {type(setup).__name__}")
        self.setup = setup
        self._noise_design = noise_design
        self.design: XNoiseDesign | None = None
        self._commitments: dict[int, list[bytes]] = {}  # dealer -> component commitments
        self._stage = _Stage.NEW
        self.failures: dict[int, str] = {}
        self._roster: dict[int, AdvertiseKeys] = {}
        self._world = b""
        self._neighbours: dict[int, tuple[int, ...]] = {}
        self._forwarded: dict[int, tuple[int, ...]] = {}  # receiver -> senders forwarded to it
        self.u2: tuple[int, ...] = ()
        self.u3: tuple[int, ...] = ()
        self.dropped: tuple[int, ...] = ()
        self.signers: tuple[int, ...] = ()
        self._peers: dict[int, tuple[int, ...]] = {}
        self._peer_sigs: dict[int, bytes] = {}
        self._digest = b""
        self._sum: np.ndarray | None = None

    def __repr__(self) -> str:
        return f"ServerSession(round={self.setup.round}, stage={self._stage.name})"

    @property
    def stage(self) -> str:
        return self._stage.name

    @property
    def world(self) -> bytes:
        return self._world

    def _abort(self, why: str) -> RoundAborted:
        self._stage = _Stage.ABORTED
        return RoundAborted(why)

    def _expect(self, stage: _Stage, what: str) -> None:
        if self._stage is not stage:
            raise ProtocolViolation(f"{what} not allowed in stage {self._stage.name}")

    def _need(self, count: int, what: str) -> None:
        need = self.setup.required_survivors
        if count < need:
            raise self._abort(f"{what}: {count} clients left, fewer than {need}; round aborted, "
                              f"nothing revealed")

    def _fail(self, node: object, reason: str) -> None:
        if isinstance(node, int) and not isinstance(node, bool):
            self.failures.setdefault(node, reason)

    def _accept(self, messages: Sequence[object], cls: type, allowed: Iterable[int] | None, what: str
                ) -> dict[int, Any]:
        """The messages of the right type, round and sender, one per sender (a repeat drops the sender).

        ``allowed=None`` accepts any valid node id (stage 1)."""
        allowed = None if allowed is None else set(allowed)
        out: dict[int, Any] = {}
        repeated: set[int] = set()
        for m in messages:
            node = getattr(m, "node_id", None)
            if not isinstance(m, cls) or getattr(m, "round", None) != self.setup.round \
                    or not isinstance(node, int):
                self._fail(node, f"{what}: wrong message type or round")
            elif (node not in allowed) if allowed is not None else not (
                    isinstance(node, int) and not isinstance(node, bool) and 0 <= node < 2**64 - 1):
                self._fail(node, f"{what}: unexpected sender")
            elif node in out:
                repeated.add(node)
            else:
                out[node] = m
        for node in repeated:
            out.pop(node, None)
            self._fail(node, f"{what}: sent twice")
        return out

    # stage 1 -> 2
    def receive_keys(self, messages: Sequence[AdvertiseKeys]) -> ShareKeysRequest:
        self._expect(_Stage.NEW, "receive_keys")
        s = self.setup
        roster: dict[int, AdvertiseKeys] = {}
        for node, m in self._accept(messages, AdvertiseKeys, None, "advertise").items():
            keys = (m.enc_public, m.mask_public, m.sign_public, m.seed_commitment)
            if not all(isinstance(k, bytes) and len(k) == _KEY_BYTES for k in keys):
                self._fail(node, "advertise: malformed keys")
                continue
            roster[node] = m
        for attr in ("enc_public", "mask_public", "sign_public"):  # a repeated key drops both owners
            owners: dict[bytes, list[int]] = {}
            for node, m in roster.items():
                owners.setdefault(getattr(m, attr), []).append(node)
            for nodes in owners.values():
                if len(nodes) > 1:
                    for node in nodes:
                        roster.pop(node, None)
                        self._fail(node, "advertise: public key used by another client")
        self._need(len(roster), "key advertisement")
        try:
            check_safe(num_clients=len(roster), degree=s.degree, threshold=s.threshold,
                       colluders=s.colluders)
        except ValueError as exc:
            raise self._abort(f"unsafe for the {len(roster)} clients present: {exc}") from None
        ids = sorted(roster)
        request = ShareKeysRequest(
            round=s.round, node_ids=ids, enc_publics=[roster[i].enc_public for i in ids],
            mask_publics=[roster[i].mask_public for i in ids],
            sign_publics=[roster[i].sign_public for i in ids],
            seed_commitments=[roster[i].seed_commitment for i in ids])
        self._world = world_id(s, request)
        self._neighbours = harary_neighbours(ids, degree=s.degree, seed=self._world)
        self._roster = roster
        if self._noise_design is not None:
            self.design = self._noise_design(len(ids))
        self._stage = _Stage.ADVERTISED
        return request

    # stage 2 -> 3
    def receive_shares(self, messages: Sequence[SharedKeys]) -> dict[int, MaskedInputRequest]:
        self._expect(_Stage.ADVERTISED, "receive_shares")
        s = self.setup
        cts: dict[tuple[int, int], bytes] = {}
        senders: set[int] = set()
        num_comp = 0 if self.design is None else self.design.num_seeded
        for node, m in self._accept(messages, SharedKeys, self._roster, "share").items():
            if list(m.receivers) != list(self._neighbours[node]) or len(m.ciphertexts) != len(m.receivers) \
                    or not all(isinstance(c, bytes) for c in m.ciphertexts):
                self._fail(node, "share: receivers are not its graph neighbours, or malformed ciphertexts")
                continue
            comms = list(m.component_commitments)
            if len(comms) != num_comp or not all(isinstance(c, bytes) and len(c) == 32 for c in comms):
                self._fail(node, f"share: {len(comms)} component commitments, the design has {num_comp}")
                continue
            self._commitments[node] = comms
            senders.add(node)
            for r, ct in zip(m.receivers, m.ciphertexts, strict=True):
                cts[(node, r)] = bytes(ct)
        self._need(len(senders), "share distribution")
        self.u2 = tuple(sorted(senders))
        out = {}
        for r in self.u2:
            peers = tuple(j for j in self._neighbours[r] if j in senders)
            self._forwarded[r] = peers
            out[r] = MaskedInputRequest(round=s.round, senders=list(peers),
                                        ciphertexts=[cts[(j, r)] for j in peers])
        self._stage = _Stage.SHARED
        return out

    # stage 3 -> 4 (active) or 5 (semi-honest)
    def receive_masked(self, messages: Sequence[MaskedInput]) -> dict[int, Any]:
        """Stage 3's replies -> a :class:`ConsistencyRequest` (active) or an :class:`UnmaskRequest`
        (semi-honest) per survivor."""
        self._expect(_Stage.SHARED, "receive_masked")
        s = self.setup
        kept: dict[int, MaskedInput] = {}
        for node, m in self._accept(messages, MaskedInput, self._forwarded, "masked").items():
            try:
                _check_vector(m.masked, s, f"masked input of node {node}")
            except ProtocolViolation as exc:
                self._fail(node, str(exc))
                continue
            fwd = set(self._forwarded[node])
            peers, rejected = list(m.peers), list(m.rejected)
            if (peers != sorted(set(peers)) or set(peers) | set(rejected) != fwd
                    or len(peers) + len(rejected) != len(fwd) or len(peers) + 1 < s.threshold):
                self._fail(node, "masked: peer and rejected lists do not match the forwarded shares")
                continue
            fp = b"" if self.design is None else self.design.fingerprint()
            if m.design != fp:
                self._fail(node, "masked: encoded with another noise design")
                continue
            if s.active and not _verify(self._roster[node].sign_public, bytes(m.signature),
                                        _peers_statement(self._world, node, tuple(peers), fp)):
                self._fail(node, "masked: peer set not signed")
                continue
            kept[node] = m
        peer_sets = {u: tuple(m.peers) for u, m in kept.items()}
        # a one-sided edge (u masked with w, w rejected u's shares) drops u: the sum stays exact
        for u in sorted(peer_sets):
            if any(w in peer_sets and u not in peer_sets[w] for w in peer_sets[u]):
                self._fail(u, "masked with a peer that rejected its shares")
        survivors = {u for u in peer_sets if u not in self.failures}
        if s.active:
            survivors = self._safe_core(survivors, peer_sets)
        self._need(len(survivors), "masked input")
        if s.active:
            if len(survivors) < min_signers(len(self._roster), colluders=s.colluders):
                raise self._abort(f"masked input: {len(survivors)} survivors cannot give the "
                                  f"{min_signers(len(self._roster), colluders=s.colluders)} signatures "
                                  f"the view needs; round aborted, nothing revealed")
        elif not is_connected(survivors, self._neighbours):
            raise self._abort("the survivors' masking graph is disconnected (unmasking would reveal "
                              "partial sums); round aborted, nothing revealed")
        self.u3 = tuple(sorted(survivors))
        used = {u: peer_sets[u] for u in self.u3}
        self.dropped = tuple(sorted(set().union(*used.values()) - survivors))
        self._peers = used
        self._peer_sigs = {u: bytes(kept[u].signature) for u in self.u3}
        total = np.zeros(s.dim, dtype=np.uint32)
        for u in self.u3:
            np.add(total, kept[u].masked, out=total)
        self._sum = total
        self._stage = _Stage.MASKED
        if not s.active:
            return {u: UnmaskRequest(round=s.round, survivors=list(self.u3), dropped=list(self.dropped))
                    for u in self.u3}
        fp = b"" if self.design is None else self.design.fingerprint()
        self._digest = _view_digest(self._world, self.u3, self.dropped, used, fp)
        counts = [len(used[u]) for u in self.u3]
        flat = [j for u in self.u3 for j in used[u]]
        sigs = [self._peer_sigs[u] for u in self.u3]
        designs = [fp] * len(self.u3) if fp else []
        # one request, the same for every survivor (as the unmask request): the view is one
        req = ConsistencyRequest(round=s.round, survivors=list(self.u3), dropped=list(self.dropped),
                                 peer_counts=counts, peer_flat=flat, peer_signatures=sigs, designs=designs)
        return dict.fromkeys(self.u3, req)

    def _safe_core(self, survivors: set[int], peer_sets: Mapping[int, Sequence[int]]) -> set[int]:
        """The largest part of the survivors the clients will accept: peel clients with <= c mutual
        peers among the survivors, keep the largest connected part, and check (c + 1)-connectivity.
        Clients left out count as dropped (their masked input is not used)."""
        c = self.setup.colluders
        alive = set(survivors)
        while True:
            used = _used_graph({u: peer_sets[u] for u in alive})
            weak = {u for u in alive if len(used[u]) <= c}
            if not weak:
                break
            for u in weak:
                self._fail(u, f"masked: {c + 1} or more surviving peers needed, it has fewer")
            alive -= weak
        if not alive:
            return alive
        used = _used_graph({u: peer_sets[u] for u in alive})
        parts: list[set[int]] = []
        left = set(alive)
        while left:
            start = min(left)
            part, stack = {start}, [start]
            while stack:
                for w in used[stack.pop()]:
                    if w not in part:
                        part.add(w)
                        stack.append(w)
            parts.append(part)
            left -= part
        best = max(parts, key=lambda p: (len(p), -min(p)))
        for u in alive - best:
            self._fail(u, "masked: not connected to the largest part of the survivors")
        if not is_k_connected(best, used, c + 1):
            raise self._abort(f"the survivors' used masking graph is not {c + 1}-vertex-connected; "
                              f"round aborted, nothing revealed")
        return best

    # stage 4 -> 5 (active)
    def receive_consistency(self, messages: Sequence[ConsistencyResponse]) -> dict[int, UnmaskRequest]:
        self._expect(_Stage.MASKED, "receive_consistency")
        s = self.setup
        if not s.active:
            raise ProtocolViolation("the semi-honest schedule has no consistency stage")
        statement = _view_statement(self._digest)
        signers = {}
        for node, m in self._accept(messages, ConsistencyResponse, self.u3, "consistency").items():
            if isinstance(m.signature, bytes) and _verify(self._roster[node].sign_public, m.signature,
                                                           statement):
                signers[node] = m.signature
            else:
                self._fail(node, "consistency: no valid signature on the view")
        need = min_signers(len(self._roster), colluders=s.colluders)
        if len(signers) < need:
            raise self._abort(f"consistency: {len(signers)} signatures on the view, fewer than {need}; "
                              f"round aborted, nothing revealed")
        self.signers = tuple(sorted(signers))
        self._stage = _Stage.SIGNED
        req = UnmaskRequest(round=s.round, survivors=list(self.u3), dropped=list(self.dropped),
                            signers=list(self.signers), signatures=[signers[u] for u in self.signers])
        return dict.fromkeys(self.signers, req)

    def _seed_check(self, node: int) -> Callable[[bytes], bool]:
        """A reconstructed self-mask seed must open the commitment ``node`` advertised."""
        commit, round_ = self._roster[node].seed_commitment, self.setup.round

        def check(value: bytes) -> bool:
            return seed_commitment(round=round_, node_id=node, seed=value) == commit
        return check

    def _key_check(self, node: int) -> Callable[[bytes], bool]:
        """A reconstructed mask key must be the private key of the public key ``node`` advertised."""
        public = self._roster[node].mask_public

        def check(value: bytes) -> bool:
            return public_from_private(value) == public
        return check

    def _component_check(self, key: tuple[int, int]) -> Callable[[bytes], bool]:
        """A reconstructed component seed must open the commitment its dealer sent in stage 2."""
        node, index = key
        commit, round_ = self._commitments[node][index - 1], self.setup.round

        def check(value: bytes) -> bool:
            return component_commitment(round=round_, node_id=node, index=index, seed=value) == commit
        return check

    def _recover_all(self, points: Mapping[Any, list[tuple[int, np.ndarray]]],
                     check: Callable[[Any], Callable[[bytes], bool]], what: str) -> dict[Any, bytes]:
        """Every owner's secret, verified: one batched interpolation of the first t shares, then
        Reed–Solomon decoding (:func:`.robust.recover_secret`) for any that fails its check; holders of
        wrong shares go to ``failures``. An unrecoverable secret aborts the round."""
        t = self.setup.threshold
        short = sorted(o for o, pts in points.items() if len(pts) < t)
        if short:
            raise self._abort(f"fewer than threshold {t} shares of the {what} of {short}; round aborted")
        owners = sorted(points)
        first: dict[int, bytes] = {}
        if owners:
            xs = np.asarray([[x for x, _ in points[o][:t]] for o in owners], dtype=np.uint64)
            sh = np.asarray([[v for _, v in points[o][:t]] for o in owners])[:, :, None, :]
            try:
                out = shamir.reconstruct_secrets(xs, sh, secret_bytes=_SECRET_BYTES)
                first = {o: out[j][0] for j, o in enumerate(owners)}
            except shamir.ShareError:
                first = {}  # some group is inconsistent: check each on its own below
        node_of = {x: i for i, x in _abscissae(self._roster).items()}
        result = {}
        for o in owners:
            verify = check(o)
            if o in first and verify(first[o]):
                result[o] = first[o]
                continue
            rec = recover_secret(points[o], threshold=t, verify=verify, secret_bytes=_SECRET_BYTES)
            if rec is None:
                raise self._abort(f"{what} of {o} not recoverable from {len(points[o])} shares (threshold "
                                  f"{t}; corrupt shares or too few); round aborted, the sum is not released")
            for x in rec.bad:
                self._fail(node_of[x], f"unmask: wrong share of the {what} of {o}")
            result[o] = rec.secret
        return result

    def _unmask_points(self, m: UnmaskResponse, node: int, holds: set[int], *, surv: set[int], dropped: set[int],
                       seed_pts: dict[int, Any], key_pts: dict[int, Any], comp_pts: dict[tuple[int, int], Any]
                       ) -> tuple[list[tuple[dict[int, Any], int, np.ndarray]], list[tuple[tuple[int, int], np.ndarray]]]:
        """One unmask reply's shares, checked in order and decoded in one pass (shamir.decode_many).

        Raises the error the item-by-item check-then-decode would raise first: a check that fails
        first decodes the shares before it (a malformed one among them raises its own error)."""
        revealing = (holds & surv) | {node}
        pending: list[bytes] = []
        places: list[tuple[dict[int, Any], int]] = []
        comp_keys: list[tuple[int, int]] = []
        try:
            for owners, shares, table, allowed in ((m.seed_owners, m.seed_shares, seed_pts, revealing),
                                                   (m.key_owners, m.key_shares, key_pts, holds & dropped)):
                if len(set(owners)) != len(owners) or len(owners) != len(shares):
                    raise ValueError("owners and shares do not match one-to-one")
                for o, sh in zip(owners, shares, strict=True):
                    if o not in allowed:
                        raise ValueError(f"a share for {o} it should not hold or reveal")
                    places.append((table, o))
                    pending.append(sh)
            trip = (m.component_owners, m.component_indices, m.component_shares)
            if len({len(v) for v in trip}) != 1:
                raise ValueError("component owners, indices and shares differ in length")
            for o, j, sh in zip(*trip, strict=True):
                if (o, j) not in comp_pts or o not in revealing:
                    raise ValueError(f"a share of component {j} of {o} it should not reveal")
                comp_keys.append((o, j))
                pending.append(sh)
        except (TypeError, ValueError):
            shamir.decode_many(pending, num_secrets=1, secret_bytes=_SECRET_BYTES)  # an earlier bad share first
            raise
        rows = shamir.decode_many(pending, num_secrets=1, secret_bytes=_SECRET_BYTES)[:, 0]
        got = [(table, o, rows[i]) for i, (table, o) in enumerate(places)]
        return got, [(key_, rows[len(places) + i]) for i, key_ in enumerate(comp_keys)]

    # stage 5 -> sum
    def receive_unmask(self, messages: Sequence[UnmaskResponse]) -> np.ndarray:
        """The exact sum of the survivors' inputs mod 2^b (uint32), or :class:`RoundAborted`."""
        self._expect(_Stage.SIGNED if self.setup.active else _Stage.MASKED, "receive_unmask")
        s = self.setup
        surv, dropped = set(self.u3), set(self.dropped)
        x_of = _abscissae(self._roster)
        seed_pts: dict[int, list[tuple[int, np.ndarray]]] = {i: [] for i in self.u3}
        key_pts: dict[int, list[tuple[int, np.ndarray]]] = {i: [] for i in self.dropped}
        removable: dict[int, tuple[int, ...]] = {}
        if self.design is not None:
            from fedprivacy.secagg.xnoise import removable_components

            removable = removable_components(self.design, self.u3)
        comp_pts: dict[tuple[int, int], list[tuple[int, np.ndarray]]] = {
            (i, j): [] for i, idx in removable.items() for j in idx}
        answering = self.signers if s.active else self.u3
        for node, m in self._accept(messages, UnmaskResponse, answering, "unmask").items():
            holds = set(self._peers[node])
            try:
                got, comp_got = self._unmask_points(m, node, holds, surv=surv, dropped=dropped,
                                                    seed_pts=seed_pts, key_pts=key_pts, comp_pts=comp_pts)
            except (TypeError, ValueError) as exc:
                self._fail(node, f"unmask: malformed reply ({exc})")
                continue
            for table, o, value in got:
                table[o].append((x_of[node], value))
            for key_, value in comp_got:
                comp_pts[key_].append((x_of[node], value))
        subtract = list(self._recover_all(seed_pts, self._seed_check, "self-mask seed").values())
        add: list[bytes] = []
        for d, key in self._recover_all(key_pts, self._key_check, "mask key").items():
            sk_key = load_private(key)
            for u in self.u3:
                if d in self._peers[u]:
                    seed = _pair_seed(sk_key, self._roster[u].mask_public, world=self._world,
                                      round_=s.round, me=d, peer=u)
                    (subtract if u < d else add).append(seed)  # undo what u applied
        comp_seeds = self._recover_all(comp_pts, self._component_check, "noise component")
        if self._sum is None:  # pragma: no cover - guarded by the stage check
            raise self._abort("no masked sum")
        total = self._sum.copy()
        apply_masks(total, add=add, subtract=subtract, modulus_bits=s.modulus_bits)
        if self.design is not None:
            from fedprivacy.secagg.xnoise import excess_noise, remove_excess

            revealed: dict[int, dict[int, bytes]] = {i: {} for i in removable}
            for (i, j), seed in comp_seeds.items():
                revealed[i][j] = seed
            excess = excess_noise(self.design, revealed, survivors=self.u3, round=s.round, size=s.dim)
            total = remove_excess(total, excess, modulus_bits=s.modulus_bits)
        self._stage = _Stage.DONE
        return total
