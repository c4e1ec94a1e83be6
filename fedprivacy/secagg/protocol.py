"""SecAgg+ state machines: :class:`ClientSession` and :class:`ServerSession`, transport-free.

Protocol (Bonawitz et al. 2017, "Practical Secure Aggregation for Privacy-Preserving Machine
Learning", CCS, Fig. 4; with the sparse graph of Bell et al. 2020, CCS). One session = one round.
Every message is a frozen dataclass of ints, bytes, lists and numpy arrays, so it maps 1:1 onto Flower
``ConfigRecord``/``ArrayRecord`` values.

0. ``SetupRequest`` (server -> clients): round, threshold t, degree k, modulus bits b, dim d.
1. Advertise keys: each client draws two fresh X25519 pairs, ``c`` (sealing shares) and ``s`` (pairwise
   masks), and a fresh 32-byte self-mask seed ``b``; it sends ``(c_pk, s_pk)``.
2. Share keys: the server broadcasts the roster U1. Each client recomputes the public graph
   (:mod:`.graph`; the seed hashes round and roster), refuses an unsafe (k, t), Shamir-shares ``b`` and
   ``s_sk`` (threshold t) among its k neighbours and itself (it keeps its own share of ``b``, so that
   t survivors suffice) and seals each pair of shares to its neighbour with
   ChaCha20-Poly1305 under HKDF(X25519(c_sk, c_pk'), info="fedprivacy/v1/share-seal"), associated data
   (round, sender, receiver). U2 = clients whose sealed shares arrived.
3. Masked input: the server forwards to each client the ciphertexts addressed to it from U2. The client
   opens them (refusing tampered or replayed ones), needs at least t holders of its shares (the
   senders and itself), and uploads
   ``y = x + PRG(b) + sum_{j in P} sgn(i, j) PRG(HKDF(X25519(s_sk, s_pk_j), info="fedprivacy/v1/mask"))``
   mod 2^b, where P are the peers whose shares it received and sgn = +1 if i < j else -1, so the pairwise
   masks cancel in the sum. U3 = clients whose masked vector arrived (the server checks length, dtype,
   range).
4. Unmask: the server sends the survivor list U3 and the dropped list D = U2 \\ U3. A client reveals,
   for each peer in P, its share of ``b`` if the peer survived and its share of ``s_sk`` if it dropped,
   and never both for one peer in one round; it adds its own share of its own ``b``. The server reconstructs, removes the self masks of U3
   and the pairwise masks between U3 and D, and obtains ``sum_{i in U3} x_i mod 2^b`` exactly.

Dropouts: clients may vanish at any stage. The round completes exactly as long as at least
``min_survivors`` (default t) clients survive and every needed secret has t shares from survivors (for
the complete graph: at least t survivors). Otherwise the server raises :class:`RoundAborted` *before* it
asks for any share, and honest clients refuse an unmask request listing fewer than ``min_survivors``
survivors, so an aborted round reveals nothing about any client.

Threat model and security argument:

* Server: may be malicious in the ways listed below; clients refuse and the round aborts. Clients:
  honest-but-curious, up to ``corrupted`` of them may collude with the server (the safety check uses
  ``t > (k + 1 + corrupted)/2``, see :func:`.graph.check_safe`).
* Key authenticity: without a PKI a server can substitute public keys (man in the middle); like
  Bonawitz et al.'s semi-honest variant we assume the roster is relayed faithfully (deploy with
  signed keys to remove this assumption).
* Refused server behaviour (all tested): asking one client for both the self-mask share and the key
  share of the same peer (per-peer memory, also across repeated requests); survivor and dropout lists
  that overlap, omit a peer, or leave out the client itself; survivor lists whose masking graph is
  disconnected (partial sums, see :mod:`.graph`); messages from another round (every request
  carries the round, every ciphertext's AD binds it, every HKDF salt binds it); tampered ciphertexts
  (AEAD); a neighbour list different from the public graph; unsafe (k, t); fewer than t shares.
* What the server sees of an honest client: ``y_i``, uniformly distributed mod 2^b given everything
  else, because it contains PRG(b_i) (whose seed is revealed only if i survived) and PRG(s_ij) for every
  surviving peer j (whose key is never revealed while both i and j survive).

Merging stages (to save Flower message exchanges, each costing >= 0.1 s):

* Allowed: stages 1 and 2 of round r+1 may ride on round r's stage-3 and stage-4 messages (advertise
  with r's masked-input reply, share keys with r's unmask reply), for clients that take part in both
  rounds. It is safe because round r+1 uses fresh keys and seeds independent of round r, all its
  ciphertexts and derived keys bind r+1, and masks do not depend on data, so nothing of round r+1 is
  revealed by r's unmasking. The cohort of r+1 must be fixed before r's unmask stage (the roster
  determines the graph) and must be chosen independently of round-r data (sampling stays
  data-independent, as the accountant assumes).
* Not allowed: merging stage 3 with stage 4 of the same round (a client must never reveal shares before
  the server has committed to the survivor list), or stage 2 with stage 3 of the same round (a client
  must know that at least t peers hold its shares before it uploads, and must mask with exactly the
  peers whose shares it holds so that a dropped peer's masks can be removed).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedprivacy.secagg import shamir
from fedprivacy.secagg.graph import check_safe, graph_seed, harary_neighbours, is_connected
from fedprivacy.secagg.keys import (
    KeyPair,
    Secret,
    context_bytes,
    derive_key,
    load_private,
    open_sealed,
    public_from_private,
    seal,
)
from fedprivacy.secagg.prg import apply_masks

__all__ = [
    "AdvertiseKeys",
    "ClientSession",
    "MaskedInput",
    "MaskedInputRequest",
    "ProtocolViolation",
    "RoundAborted",
    "ServerSession",
    "SetupRequest",
    "ShareKeysRequest",
    "SharedKeys",
    "UnmaskRequest",
    "UnmaskResponse",
]

_SHARE_SEAL = "share-seal"
_MASK = "mask"


class ProtocolViolation(ValueError):
    """A message breaks the protocol (dishonest or buggy peer); the session refuses it unchanged."""


class RoundAborted(RuntimeError):
    """The round cannot complete; nothing about any client has been revealed."""


# ----------------------------------------------------------------------------- messages
@dataclass(frozen=True, slots=True, kw_only=True)
class SetupRequest:
    """Stage 0, server -> client: the round's public parameters."""

    round: int
    threshold: int
    degree: int
    modulus_bits: int = 32
    dim: int
    min_survivors: int = 0  # 0 means "threshold"

    def __post_init__(self) -> None:
        for name in ("round", "threshold", "degree", "modulus_bits", "dim", "min_survivors"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an int, got {type(v).__name__}")
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

    @property
    def required_survivors(self) -> int:
        return max(self.min_survivors, self.threshold)


@dataclass(frozen=True, slots=True, kw_only=True)
class AdvertiseKeys:
    """Stage 1, client -> server."""

    round: int
    node_id: int
    enc_public: bytes
    mask_public: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareKeysRequest:
    """Stage 2, server -> clients: the roster U1 (parallel lists)."""

    round: int
    node_ids: list[int]
    enc_publics: list[bytes]
    mask_publics: list[bytes]


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedKeys:
    """Stage 2, client -> server: one sealed share pair per neighbour."""

    round: int
    node_id: int
    receivers: list[int]
    ciphertexts: list[bytes]


@dataclass(frozen=True, slots=True, kw_only=True)
class MaskedInputRequest:
    """Stage 3, server -> client: the sealed shares addressed to this client, from U2."""

    round: int
    senders: list[int]
    ciphertexts: list[bytes]


@dataclass(frozen=True, slots=True, kw_only=True)
class MaskedInput:
    """Stage 3, client -> server."""

    round: int
    node_id: int
    masked: np.ndarray  # uint32, shape (dim,), values < 2**modulus_bits

    def __repr__(self) -> str:
        return (f"MaskedInput(round={self.round}, node_id={self.node_id}, "
                f"masked=<{self.masked.dtype} x {self.masked.shape}>)")


@dataclass(frozen=True, slots=True, kw_only=True)
class UnmaskRequest:
    """Stage 4, server -> client: U3 (survivors) and D = U2 \\ U3 (dropped)."""

    round: int
    survivors: list[int]
    dropped: list[int]


@dataclass(frozen=True, slots=True, kw_only=True)
class UnmaskResponse:
    """Stage 4, client -> server: shares of survivors' self-mask seeds and dropped peers' keys."""

    round: int
    node_id: int
    seed_owners: list[int] = field(default_factory=list)
    seed_shares: list[bytes] = field(default_factory=list)
    key_owners: list[int] = field(default_factory=list)
    key_shares: list[bytes] = field(default_factory=list)

    def __repr__(self) -> str:
        return (f"UnmaskResponse(round={self.round}, node_id={self.node_id}, "
                f"seed_owners={self.seed_owners}, key_owners={self.key_owners}, shares=<redacted>)")


# ----------------------------------------------------------------------------- helpers
class _Stage(Enum):
    NEW = 0
    ADVERTISED = 1
    SHARED = 2
    MASKED = 3
    DONE = 4
    ABORTED = 5


def _x(node_id: int) -> int:
    """Shamir abscissa of a node (node ids are in [0, 2**64), so x is in [1, 2**64])."""
    return node_id + 1


def _pair_context(round_: int, a: int, b: int) -> bytes:
    lo, hi = (a, b) if a < b else (b, a)
    return context_bytes(round=round_, sender=lo, receiver=hi)


def _pair_seed(mask_private: Secret | bytes | X25519PrivateKey, peer_mask_public: bytes, *,
               round_: int, me: int, peer: int) -> bytes:
    return derive_key(mask_private, peer_mask_public, purpose=_MASK,
                      context=_pair_context(round_, me, peer))


def _check_round(expected: int, got: int, what: str) -> None:
    if got != expected:
        raise ProtocolViolation(f"{what} is for round {got}, this session is round {expected} "
                                f"(replay from another round?)")


def _check_node_id(node_id: int) -> int:
    if isinstance(node_id, bool) or not isinstance(node_id, int) or not 0 <= node_id < 2**64 - 1:
        raise ValueError(f"node_id must be an int in [0, 2**64 - 1), got {node_id!r}")
    return node_id


# ----------------------------------------------------------------------------- client
class ClientSession:
    """One client's side of one SecAgg+ round. Methods must be called in stage order.

    Every method validates the whole request before it changes any state; a refused request raises
    :class:`ProtocolViolation` (or ValueError/TypeError) and leaves the session as it was.
    """

    def __init__(self, *, node_id: int, setup: SetupRequest, corrupted: int = 0) -> None:
        if not isinstance(setup, SetupRequest):
            raise TypeError(f"setup must be a SetupRequest, got {type(setup).__name__}")
        self.node_id = _check_node_id(node_id)
        self.setup = setup
        self.corrupted = corrupted
        self._stage = _Stage.NEW
        self._enc = KeyPair.generate()
        self._mask = KeyPair.generate()
        self._seed = Secret(secrets.token_bytes(32))
        self._enc_key = load_private(self._enc.private)  # parsed once, used for every exchange
        self._mask_key = load_private(self._mask.private)
        self._seal_keys: dict[int, bytes] = {}  # peer -> share-sealing key (derived in stage 2)
        self._neighbours: tuple[int, ...] = ()
        self._graph: dict[int, tuple[int, ...]] = {}
        self._mask_publics: dict[int, bytes] = {}
        self._enc_publics: dict[int, bytes] = {}
        self._held_seed_shares: dict[int, bytes] = {}  # peer -> encoded share of the peer's b
        self._held_key_shares: dict[int, bytes] = {}  # peer -> encoded share of the peer's s_sk
        self._peers: tuple[int, ...] = ()
        self._own_seed_share = b""
        self._revealed: dict[int, str] = {}  # peer -> "seed" | "key"

    def __repr__(self) -> str:
        return (f"ClientSession(node_id={self.node_id}, round={self.setup.round}, "
                f"stage={self._stage.name}, secrets=<redacted>)")

    @property
    def stage(self) -> str:
        return self._stage.name

    def _expect(self, stage: _Stage, what: str) -> None:
        if self._stage is not stage:
            raise ProtocolViolation(f"{what} not allowed in stage {self._stage.name}")

    # stage 1
    def advertise_keys(self) -> AdvertiseKeys:
        self._expect(_Stage.NEW, "advertise_keys")
        self._stage = _Stage.ADVERTISED
        return AdvertiseKeys(round=self.setup.round, node_id=self.node_id,
                             enc_public=self._enc.public, mask_public=self._mask.public)

    # stage 2
    def share_keys(self, request: ShareKeysRequest) -> SharedKeys:
        self._expect(_Stage.ADVERTISED, "share_keys")
        s = self.setup
        _check_round(s.round, request.round, "ShareKeysRequest")
        ids = list(request.node_ids)
        if not (len(ids) == len(request.enc_publics) == len(request.mask_publics)):
            raise ProtocolViolation("roster lists have different lengths")
        if len(set(ids)) != len(ids):
            raise ProtocolViolation("roster lists a node twice")
        roster = list(zip(ids, request.enc_publics, request.mask_publics, strict=True))
        mine = [(e, m) for i, e, m in roster if i == self.node_id]
        if mine != [(self._enc.public, self._mask.public)]:
            raise ProtocolViolation("roster does not carry this client's own public keys")
        if len({m for _, _, m in roster}) != len(roster) or len({e for _, e, _ in roster}) != len(roster):
            raise ProtocolViolation("roster repeats a public key")
        if len(roster) < s.required_survivors:
            raise ProtocolViolation(f"roster has {len(roster)} clients, fewer than the "
                                    f"{s.required_survivors} required")
        try:
            check_safe(num_clients=len(roster), degree=s.degree, threshold=s.threshold,
                       corrupted=self.corrupted)
        except ValueError as exc:
            raise ProtocolViolation(f"unsafe round parameters: {exc}") from None
        gseed = graph_seed(round=s.round, roster=roster)
        graph = harary_neighbours(ids, degree=s.degree, seed=gseed)
        neighbours = graph[self.node_id]
        enc_pub = {i: e for i, e, _ in roster}
        mask_pub = {i: m for i, _, m in roster}
        xs = [_x(j) for j in neighbours] + [_x(self.node_id)]
        seed_int = int.from_bytes(self._seed.reveal(), "big")
        key_int = int.from_bytes(self._mask.private.reveal(), "big")
        b_shares, k_shares = shamir.split_many([seed_int, key_int], threshold=s.threshold, xs=xs)
        own_seed_share = shamir.encode_share(b_shares[-1])  # the own key share is discarded
        cts = []
        seal_keys = {}
        for j, bs, ks in zip(neighbours, b_shares[:-1], k_shares[:-1], strict=True):
            key = derive_key(self._enc_key, enc_pub[j], purpose=_SHARE_SEAL,
                             context=_pair_context(s.round, self.node_id, j))
            seal_keys[j] = key
            plaintext = shamir.encode_share(bs) + shamir.encode_share(ks)
            cts.append(seal(key, plaintext, purpose=_SHARE_SEAL,
                            context=context_bytes(round=s.round, sender=self.node_id, receiver=j)))
        # commit state
        self._own_seed_share = own_seed_share
        self._seal_keys = seal_keys
        self._graph = graph
        self._neighbours = neighbours
        self._enc_publics = enc_pub
        self._mask_publics = mask_pub
        self._stage = _Stage.SHARED
        return SharedKeys(round=s.round, node_id=self.node_id, receivers=list(neighbours),
                          ciphertexts=cts)

    # stage 3
    def masked_input(self, request: MaskedInputRequest, vector: np.ndarray) -> MaskedInput:
        """Mask ``vector`` (uint32 residues mod 2^b, length dim) with the peers that sent shares."""
        self._expect(_Stage.SHARED, "masked_input")
        s = self.setup
        _check_round(s.round, request.round, "MaskedInputRequest")
        if not isinstance(vector, np.ndarray) or vector.dtype != np.uint32 or vector.shape != (s.dim,):
            raise TypeError(f"vector must be a uint32 array of shape ({s.dim},)")
        if s.modulus_bits < 32 and int(vector.max(initial=0)) >= 1 << s.modulus_bits:
            raise ValueError(f"vector has values >= 2^{s.modulus_bits}")
        senders = list(request.senders)
        if len(senders) != len(request.ciphertexts) or len(set(senders)) != len(senders):
            raise ProtocolViolation("senders and ciphertexts do not match one-to-one")
        nb = set(self._neighbours)
        for j in senders:
            if j not in nb:
                raise ProtocolViolation(f"ciphertext from {j}, which is not a neighbour")
        if len(senders) + 1 < s.threshold:
            raise ProtocolViolation(f"only {len(senders) + 1} holders of this client's shares, fewer "
                                    f"than threshold {s.threshold}: refusing to upload")
        seed_shares, key_shares = {}, {}
        for j, ct in zip(senders, request.ciphertexts, strict=True):
            pt = open_sealed(self._seal_keys[j], ct, purpose=_SHARE_SEAL,
                             context=context_bytes(round=s.round, sender=j, receiver=self.node_id))
            if len(pt) != 2 * shamir.SHARE_BYTES:
                raise ProtocolViolation(f"share plaintext from {j} has the wrong length")
            seed_shares[j] = pt[: shamir.SHARE_BYTES]
            key_shares[j] = pt[shamir.SHARE_BYTES:]
        peers = tuple(sorted(senders))
        add = [self._seed.reveal()]
        sub: list[bytes] = []
        for j in peers:
            seed = _pair_seed(self._mask_key, self._mask_publics[j], round_=s.round,
                              me=self.node_id, peer=j)
            (add if self.node_id < j else sub).append(seed)
        y = np.empty(s.dim, dtype=np.uint32)
        apply_masks(np.ascontiguousarray(vector), add=add, subtract=sub,
                    modulus_bits=s.modulus_bits, out=y)
        self._held_seed_shares = seed_shares
        self._held_key_shares = key_shares
        self._peers = peers
        self._stage = _Stage.MASKED
        return MaskedInput(round=s.round, node_id=self.node_id, masked=y)

    # stage 4
    def unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        """Reveal one kind of share per peer; refuse contradictory or unsafe requests."""
        if self._stage not in (_Stage.MASKED, _Stage.DONE):
            raise ProtocolViolation(f"unmask not allowed in stage {self._stage.name}")
        s = self.setup
        _check_round(s.round, request.round, "UnmaskRequest")
        surv, drop = list(request.survivors), list(request.dropped)
        sset, dset = set(surv), set(drop)
        if len(sset) != len(surv) or len(dset) != len(drop):
            raise ProtocolViolation("survivor or dropout list repeats a node")
        both = sset & dset
        if both:
            raise ProtocolViolation(f"nodes listed as both survived and dropped: {sorted(both)}")
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
                raise ProtocolViolation(
                    f"server asks for the {kind} share of {j} after the {prev} share: refusing "
                    f"(both would unmask {j})"
                )
            plan[j] = kind
        resp = UnmaskResponse(
            round=s.round, node_id=self.node_id,
            seed_owners=[self.node_id] + [j for j in self._peers if plan[j] == "seed"],
            seed_shares=[self._own_seed_share]
            + [self._held_seed_shares[j] for j in self._peers if plan[j] == "seed"],
            key_owners=[j for j in self._peers if plan[j] == "key"],
            key_shares=[self._held_key_shares[j] for j in self._peers if plan[j] == "key"],
        )
        self._revealed.update(plan)
        self._stage = _Stage.DONE
        return resp


# ----------------------------------------------------------------------------- server
class ServerSession:
    """The server's side of one SecAgg+ round. Feed each stage the replies that arrived.

    Each ``receive_*`` validates every message before it stores any; a bad message raises
    :class:`ProtocolViolation` and leaves the session unchanged. Too few clients raise
    :class:`RoundAborted` (the session is then closed).
    """

    def __init__(self, setup: SetupRequest) -> None:
        if not isinstance(setup, SetupRequest):
            raise TypeError(f"setup must be a SetupRequest, got {type(setup).__name__}")
        self.setup = setup
        self._stage = _Stage.NEW
        self._roster: dict[int, tuple[bytes, bytes]] = {}
        self._neighbours: dict[int, tuple[int, ...]] = {}
        self._cts: dict[tuple[int, int], bytes] = {}  # (sender, receiver) -> ciphertext
        self.u2: tuple[int, ...] = ()
        self.u3: tuple[int, ...] = ()
        self._peers: dict[int, tuple[int, ...]] = {}
        self._sum: np.ndarray | None = None

    def __repr__(self) -> str:
        return f"ServerSession(round={self.setup.round}, stage={self._stage.name})"

    @property
    def stage(self) -> str:
        return self._stage.name

    def _abort(self, why: str) -> RoundAborted:
        self._stage = _Stage.ABORTED
        return RoundAborted(why)

    def _need(self, count: int, what: str) -> None:
        if count < self.setup.required_survivors:
            raise self._abort(f"{what}: {count} clients left, fewer than "
                              f"{self.setup.required_survivors}; round aborted, nothing revealed")

    def receive_keys(self, messages: list[AdvertiseKeys]) -> ShareKeysRequest:
        if self._stage is not _Stage.NEW:
            raise ProtocolViolation(f"receive_keys not allowed in stage {self._stage.name}")
        s = self.setup
        roster: dict[int, tuple[bytes, bytes]] = {}
        for m in messages:
            _check_round(s.round, m.round, "AdvertiseKeys")
            _check_node_id(m.node_id)
            if m.node_id in roster:
                raise ProtocolViolation(f"node {m.node_id} advertised twice")
            if len(m.enc_public) != 32 or len(m.mask_public) != 32:
                raise ProtocolViolation(f"node {m.node_id} advertised malformed keys")
            roster[m.node_id] = (bytes(m.enc_public), bytes(m.mask_public))
        self._need(len(roster), "key advertisement")
        try:
            check_safe(num_clients=len(roster), degree=s.degree, threshold=s.threshold)
        except ValueError as exc:
            raise self._abort(f"unsafe for the {len(roster)} clients present: {exc}") from None
        ids = sorted(roster)
        entries = [(i, *roster[i]) for i in ids]
        self._neighbours = harary_neighbours(ids, degree=s.degree,
                                             seed=graph_seed(round=s.round, roster=entries))
        self._roster = roster
        self._stage = _Stage.ADVERTISED
        return ShareKeysRequest(round=s.round, node_ids=ids,
                                enc_publics=[roster[i][0] for i in ids],
                                mask_publics=[roster[i][1] for i in ids])

    def receive_shares(self, messages: list[SharedKeys]) -> dict[int, MaskedInputRequest]:
        if self._stage is not _Stage.ADVERTISED:
            raise ProtocolViolation(f"receive_shares not allowed in stage {self._stage.name}")
        s = self.setup
        cts: dict[tuple[int, int], bytes] = {}
        senders: set[int] = set()
        for m in messages:
            _check_round(s.round, m.round, "SharedKeys")
            if m.node_id not in self._roster or m.node_id in senders:
                raise ProtocolViolation(f"unexpected or repeated shares from node {m.node_id}")
            if list(m.receivers) != list(self._neighbours[m.node_id]):
                raise ProtocolViolation(f"node {m.node_id} sent shares to non-neighbours")
            if len(m.ciphertexts) != len(m.receivers):
                raise ProtocolViolation(f"node {m.node_id}: receivers and ciphertexts differ in length")
            senders.add(m.node_id)
            for r, ct in zip(m.receivers, m.ciphertexts, strict=True):
                cts[(m.node_id, r)] = bytes(ct)
        self._need(len(senders), "share distribution")
        self.u2 = tuple(sorted(senders))
        self._cts = cts
        out = {}
        for r in self.u2:
            peers = tuple(j for j in self._neighbours[r] if j in senders)
            self._peers[r] = peers
            out[r] = MaskedInputRequest(round=s.round, senders=list(peers),
                                        ciphertexts=[cts[(j, r)] for j in peers])
        self._stage = _Stage.SHARED
        return out

    def receive_masked(self, messages: list[MaskedInput]) -> dict[int, UnmaskRequest]:
        if self._stage is not _Stage.SHARED:
            raise ProtocolViolation(f"receive_masked not allowed in stage {self._stage.name}")
        s = self.setup
        seen: set[int] = set()
        for m in messages:
            _check_round(s.round, m.round, "MaskedInput")
            if m.node_id not in self._peers or m.node_id in seen:
                raise ProtocolViolation(f"unexpected or repeated masked input from node {m.node_id}")
            y = m.masked
            if not isinstance(y, np.ndarray) or y.dtype != np.uint32 or y.shape != (s.dim,):
                got = (f"{y.dtype} x {y.shape}" if isinstance(y, np.ndarray)
                       else type(y).__name__)
                raise ProtocolViolation(f"masked input of node {m.node_id} must be uint32 x "
                                        f"({s.dim},), got {got}")
            if s.modulus_bits < 32 and int(y.max(initial=0)) >= 1 << s.modulus_bits:
                raise ProtocolViolation(f"masked input of node {m.node_id} has values >= "
                                        f"2^{s.modulus_bits}")
            seen.add(m.node_id)
        self._need(len(seen), "masked input")
        if not is_connected(seen, self._neighbours):
            raise self._abort("the survivors' masking graph is disconnected (unmasking would reveal "
                              "partial sums); round aborted, nothing revealed")
        total = np.zeros(s.dim, dtype=np.uint32)
        for m in messages:
            np.add(total, m.masked, out=total)
        self.u3 = tuple(sorted(seen))
        self._sum = total
        self._stage = _Stage.MASKED
        dropped = [i for i in self.u2 if i not in seen]
        return {i: UnmaskRequest(round=s.round, survivors=list(self.u3), dropped=dropped)
                for i in self.u3}

    def receive_unmask(self, messages: list[UnmaskResponse]) -> np.ndarray:
        """The exact sum of the survivors' inputs mod 2^b (uint32), or :class:`RoundAborted`."""
        if self._stage is not _Stage.MASKED:
            raise ProtocolViolation(f"receive_unmask not allowed in stage {self._stage.name}")
        s = self.setup
        surv = set(self.u3)
        dropped = [i for i in self.u2 if i not in surv]
        seed_pts: dict[int, list[tuple[int, int]]] = {i: [] for i in self.u3}
        key_pts: dict[int, list[tuple[int, int]]] = {i: [] for i in dropped}
        seen: set[int] = set()
        for m in messages:
            _check_round(s.round, m.round, "UnmaskResponse")
            if m.node_id not in surv or m.node_id in seen:
                raise ProtocolViolation(f"unexpected or repeated unmask reply from {m.node_id}")
            holders = set(self._peers[m.node_id])
            for owners, shares, table in ((m.seed_owners, m.seed_shares, seed_pts),
                                          (m.key_owners, m.key_shares, key_pts)):
                peers = holders | {m.node_id} if table is seed_pts else holders
                if len(set(owners)) != len(owners):
                    raise ProtocolViolation(f"node {m.node_id} repeats a share owner")
                if len(owners) != len(shares):
                    raise ProtocolViolation(f"node {m.node_id}: owners and shares differ in length")
                for o, sh in zip(owners, shares, strict=True):
                    if o not in peers or o not in table:
                        raise ProtocolViolation(f"node {m.node_id} sent a share for {o} it "
                                                f"should not hold or reveal")
                    table[o].append((_x(m.node_id), shamir.decode_share(sh)))
            seen.add(m.node_id)
        t = s.threshold
        need_keys = [d for d in dropped if any(d in self._peers[u] for u in self.u3)]
        short = [i for i in self.u3 if len(seed_pts[i]) < t] + [
            d for d in need_keys if len(key_pts[d]) < t]
        if short:
            raise self._abort(f"fewer than threshold {t} shares for nodes {sorted(short)}; "
                              f"round aborted")
        assert self._sum is not None
        total = self._sum.copy()
        subtract: list[bytes] = []
        add: list[bytes] = []
        for i in self.u3:
            b = shamir.reconstruct(seed_pts[i], threshold=t)
            if b >= 2**256:
                raise self._abort(f"reconstructed self-mask seed of {i} is invalid")
            subtract.append(b.to_bytes(32, "big"))
        for d in need_keys:
            sk_int = shamir.reconstruct(key_pts[d], threshold=t)
            if sk_int >= 2**256:
                raise self._abort(f"reconstructed key of {d} is invalid")
            sk = sk_int.to_bytes(32, "big")
            if public_from_private(sk) != self._roster[d][1]:
                raise self._abort(f"reconstructed key of {d} does not match its public key "
                                  f"(corrupt shares)")
            sk_key = load_private(sk)
            for u in self.u3:
                if d in self._peers[u]:
                    seed = _pair_seed(sk_key, self._roster[u][1], round_=s.round, me=d, peer=u)
                    # u added the mask if u < d, subtracted it otherwise: undo that
                    (subtract if u < d else add).append(seed)
        apply_masks(total, add=add, subtract=subtract, modulus_bits=s.modulus_bits)
        self._stage = _Stage.DONE
        return total

