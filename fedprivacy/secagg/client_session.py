"""The client's side of one SecAgg+ round: :class:`ClientSession`.

Protocol: Bonawitz et al. 2017 ("Practical Secure Aggregation for Privacy-Preserving Machine Learning",
CCS; Fig. 4 for the semi-honest rounds, Sec. 6 / Fig. 5 for the consistency check against an active
server) on the sparse Harary graph of Bell et al. 2020 (CCS). One session is one round. Stages:
1 advertise fresh keys and a commitment to the self-mask seed ``b``; 2 Shamir-share ``b`` and the mask
key among the graph neighbours, sealed to each; 3 upload ``y = x + PRG(b) + sum_j ±PRG(s_ij) mod 2^b``
with a signed peer set; 4 (active schedule) sign at most one checked view of the survivors; 5 reveal
one kind of share per peer, for the certified view only.

Threat model: a server that deviates arbitrarily, with at most ``c`` colluding clients; assuming
authentic peer keys (:mod:`.peers`), no Sybils and secure primitives, the server learns per round and world
at most the sum over the honest members of one certified survivor set (at least
``max(t, min_survivors, T) - c`` of them). The semi-honest schedule (no stage 4) is safe only against
a server that follows the protocol. The argument is in ``docs/SECAGG.md``.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedprivacy.secagg import session_state, shamir
from fedprivacy.secagg.graph import (
    check_safe,
    harary_neighbours,
    is_connected,
    is_k_connected,
    min_signers,
    used_graph,
)
from fedprivacy.secagg.keys import (
    KeyPair,
    SealError,
    Secret,
    derive_key,
    load_private,
    open_sealed,
    seal,
)
from fedprivacy.secagg.messages import (
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencyResponse,
    MaskedInput,
    MaskedInputRequest,
    ProtocolViolation,
    SetupRequest,
    SharedKeys,
    ShareKeysRequest,
    UnmaskRequest,
    UnmaskResponse,
    _check_node_id,
    _check_round,
    _split_peer_lists,
    _Stage,
    _unique,
)
from fedprivacy.secagg.prg import apply_masks
from fedprivacy.secagg.session_state import RoundLog
from fedprivacy.secagg.transcript import (
    _KEY_BYTES,
    _SECRET_BYTES,
    _SHARE_SEAL,
    _abscissae,
    _context,
    _pair_seed,
    _peers_statement,
    _share_rows,
    _sign,
    _verify,
    _view_digest,
    _view_statement,
    component_commitment,
    seed_commitment,
    world_id,
)

if TYPE_CHECKING:
    from fedprivacy.accounting.xnoise_design import XNoiseDesign
    from fedprivacy.secagg.xnoise import ComponentSeeds

__all__ = ["ClientSession"]


#: views that passed :meth:`ClientSession._check_view`, keyed by everything those checks read: the world
#: id (SHA-256 over the setup and the roster: it fixes the roster's signing keys and the graph, which
#: ``harary_neighbours`` derives from the world), the design fingerprint, c, and the whole proposed view
#: (survivors, dropouts, peer lists, signatures). Like :func:`_verify`'s cache it only saves the
#: in-process engine's clients from re-deriving one another's verdict on the same view: a client checks
#: its own peer set, membership and stage every time, a view that failed is checked again, and a
#: client in its own process (any real deployment) checks every view itself.
_VIEWS_PASSED: dict[tuple[Any, ...], tuple[dict[int, tuple[int, ...]], bytes]] = {}
_VIEWS_KEPT = 8


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
        self._design: XNoiseDesign | None = None  # XNoise: set in stage 2 if used
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
        """Stage 2. ``components``: this client's XNoise seeds, built by the caller from its own floor
        for a design of ``len(request.node_ids)`` clients; shared like ``b``."""
        self._expect(_Stage.ADVERTISED, "share_keys")
        s = self.setup
        ids = self._check_roster(request)
        self._check_components(components, len(ids))
        world = world_id(s, request)
        graph = harary_neighbours(ids, degree=s.degree, seed=world)
        neighbours = graph[self.node_id]
        x_of = _abscissae(ids)
        seeds = () if components is None else tuple(components.seeds)
        shares = shamir.split_secrets([self._seed.reveal(), self._mask.private.reveal(), *seeds],
                                      threshold=s.threshold,
                                      xs=[x_of[j] for j in neighbours] + [x_of[self.node_id]])
        cts, seal_keys = self._seal_shares(world, dict(zip(ids, request.enc_publics, strict=True)),
                                           neighbours, shares[:-1])
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

    def _check_roster(self, request: ShareKeysRequest) -> list[int]:
        """The roster's ids, once it is well formed, carries this client's own keys, is large enough
        and passes the (k, t, c) rules (:func:`.graph.check_safe`)."""
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
        return ids

    def _check_components(self, components: ComponentSeeds | None, roster: int) -> None:
        """XNoise seeds must be this round's and this node's, for a design that fits the round."""
        if components is None:
            return
        s, d = self.setup, components.design
        if components.round != s.round or components.node_id != self.node_id:
            raise ValueError("components were drawn for another round or node")
        if d.roster != roster or d.colluders < self.colluders or d.min_survivors > s.required_survivors:
            raise ValueError(f"components' design (roster {d.roster}, colluders {d.colluders}, "
                             f"t {d.min_survivors}) does not fit this round (roster {roster}, "
                             f"colluders >= {self.colluders}, releases sums of >= {s.required_survivors})")

    def _seal_shares(self, world: bytes, enc_pub: Mapping[int, bytes], neighbours: Sequence[int],
                     shares: np.ndarray) -> tuple[list[bytes], dict[int, bytes]]:
        """Each neighbour's shares sealed to it (ChaCha20-Poly1305 under HKDF(X25519), info
        ``fedprivacy/v1/share-seal``, associated data binding world, round, sender and receiver),
        and the seal key of each neighbour."""
        s = self.setup
        cts, seal_keys = [], {}
        for j, share in zip(neighbours, shares, strict=True):
            lo, hi = (self.node_id, j) if self.node_id < j else (j, self.node_id)
            key = derive_key(self._enc_key, enc_pub[j], purpose=_SHARE_SEAL,
                             context=_context(world, s.round, lo, hi))
            seal_keys[j] = key
            cts.append(seal(key, shamir.encode_shares(share), purpose=_SHARE_SEAL,
                            context=_context(world, s.round, self.node_id, j)))
        return cts, seal_keys

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
        if not is_k_connected(sset, used_graph(peer_sets), s.colluders + 1):
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
            self._check_certificate(request, surv, drop, sset)
        else:
            self._check_survivors(sset, dset)
        plan = self._reveal_plan(sset, dset)
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

    def _check_certificate(self, request: UnmaskRequest, surv: list[int], drop: list[int],
                           sset: set[int]) -> None:
        """Active schedule: the request is for the view this client signed, and at least T distinct
        survivors signed that view (:func:`.graph.min_signers`)."""
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

    def _check_survivors(self, sset: set[int], dset: set[int]) -> None:
        """Semi-honest schedule: the listed survivors are disjoint from the dropouts, include this
        client, are enough, lie in the roster and are connected in the public graph."""
        s = self.setup
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

    def _reveal_plan(self, sset: set[int], dset: set[int]) -> dict[int, str]:
        """Peer -> the kind of share to reveal ("seed" for a survivor, "key" for a dropout); refuses
        a peer that is neither, and a kind other than the one already revealed for that peer."""
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
        return plan

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
    #: slots rebuilt from others by :meth:`from_state` (parsed key objects), not part of the state
    DERIVED = session_state.DERIVED
    #: the :meth:`to_state` fields fixed by the roster, its key maps and the graph (set together in stage 2)
    ROSTER_FIELDS = session_state.ROSTER_FIELDS

    def to_state(self, *, roster_fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every field as flat values for the node's state (:func:`.session_state.to_state`)."""
        return session_state.to_state(self, roster_fields=roster_fields)

    @classmethod
    def from_state(cls, fields: Mapping[str, Any]) -> ClientSession:
        """The inverse of :meth:`to_state`; validates every field (:func:`.session_state.from_state`)."""
        return session_state.from_state(cls, fields)

    def roster_state(self) -> dict[str, Any]:
        """The :data:`ROSTER_FIELDS` of :meth:`to_state`."""
        return session_state.roster_state(self)

    def roster_source(self) -> tuple[Any, ...]:
        """What :meth:`roster_state` is computed from (compare two sessions' with ``==``)."""
        return (self._roster_ids, self._mask_publics, self._sign_publics, self._graph)
