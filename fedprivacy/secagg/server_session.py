"""The honest server's side of one SecAgg+ round: :class:`ServerSession`.

Protocol: Bonawitz et al. 2017 (CCS; Fig. 4, and Sec. 6 / Fig. 5 for the consistency check) on the
Harary graph of Bell et al. 2020 (CCS); the client's side is :class:`.client_session.ClientSession`.
The session collects each stage's replies and builds the next requests: the roster (stage 1), the
forwarded ciphertexts (2), the survivors' view or the unmask request (3), the certified unmask
request (4, active schedule), and the exact sum of the survivors' inputs mod 2^b (5).

Faults: a reply of the wrong type, round or sender, a repeat, a malformed field, a one-sided edge,
a bad signature or a wrong share drops its sender into ``failures`` instead of failing the stage.
The round aborts (:class:`.messages.RoundAborted`: no sum, no honest input revealed) only when too few
clients are left, the view cannot be made safe, or a secret cannot be recovered; wrong shares are
corrected by Reed–Solomon decoding (:mod:`.robust`) or detected through the commitments, so the sum
is never silently wrong. The threat model and the argument are in ``docs/SECAGG.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedprivacy.secagg import shamir
from fedprivacy.secagg.graph import (
    check_safe,
    harary_neighbours,
    is_connected,
    is_k_connected,
    min_signers,
    used_graph,
)
from fedprivacy.secagg.keys import load_private, public_from_private
from fedprivacy.secagg.messages import (
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencyResponse,
    MaskedInput,
    MaskedInputRequest,
    ProtocolViolation,
    RoundAborted,
    SetupRequest,
    SharedKeys,
    ShareKeysRequest,
    UnmaskRequest,
    UnmaskResponse,
    _check_vector,
    _Stage,
)
from fedprivacy.secagg.peers import identity_columns as _identity_columns
from fedprivacy.secagg.prg import apply_masks
from fedprivacy.secagg.robust import recover_secret
from fedprivacy.secagg.transcript import (
    _KEY_BYTES,
    _SECRET_BYTES,
    _abscissae,
    _pair_seed,
    _peers_statement,
    _verify,
    _view_digest,
    _view_statement,
    component_commitment,
    seed_commitment,
    world_id,
)

if TYPE_CHECKING:
    from fedprivacy.accounting.xnoise_design import XNoiseDesign

__all__ = ["ServerSession"]


class ServerSession:
    """The honest server's side of one round. Feed each stage the replies that arrived.

    A bad or unexpected reply drops its sender (``failures[node] = reason``) instead of failing the
    stage, so one faulty client cannot abort the round. Too few clients, an unsafe view or an
    unrecoverable secret raise :class:`RoundAborted` (the session is then closed).
    """

    def __init__(self, setup: SetupRequest, *,
                 noise_design: Callable[[int], XNoiseDesign] | None = None) -> None:
        """``noise_design(n)``: the XNoise design of a round with ``n`` clients in its roster,
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
            seed_commitments=[roster[i].seed_commitment for i in ids],
            **_identity_columns([roster[i] for i in ids]))
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
        kept = self._accept_masked(messages)
        peer_sets = {u: tuple(m.peers) for u, m in kept.items()}
        survivors = self._survivors(peer_sets)
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
        return dict.fromkeys(self.u3, self._view_request())

    def _accept_masked(self, messages: Sequence[MaskedInput]) -> dict[int, MaskedInput]:
        """The masked inputs whose vector, peer and rejected lists, design and (active) signed peer
        set are in order; each other sender goes to ``failures``."""
        s = self.setup
        fp = b"" if self.design is None else self.design.fingerprint()
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
            if m.design != fp:
                self._fail(node, "masked: encoded with another noise design")
                continue
            if s.active and not _verify(self._roster[node].sign_public, bytes(m.signature),
                                        _peers_statement(self._world, node, tuple(peers), fp)):
                self._fail(node, "masked: peer set not signed")
                continue
            kept[node] = m
        return kept

    def _survivors(self, peer_sets: Mapping[int, Sequence[int]]) -> set[int]:
        """U3: the uploaders without a one-sided edge (u masked with w, w rejected u's shares: the sum
        stays exact without u); on the active schedule the safe core of :meth:`_safe_core`. Aborts when
        too few are left, too few to sign (active) or disconnected (semi-honest)."""
        s = self.setup
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
        return survivors

    def _view_request(self) -> ConsistencyRequest:
        """The proposed view of U3 (one request, the same for every survivor: the view is one); it
        also fixes the digest the survivors' signatures must cover."""
        s, used = self.setup, self._peers
        fp = b"" if self.design is None else self.design.fingerprint()
        self._digest = _view_digest(self._world, self.u3, self.dropped, used, fp)
        counts = [len(used[u]) for u in self.u3]
        flat = [j for u in self.u3 for j in used[u]]
        sigs = [self._peer_sigs[u] for u in self.u3]
        designs = [fp] * len(self.u3) if fp else []
        return ConsistencyRequest(round=s.round, survivors=list(self.u3), dropped=list(self.dropped),
                                  peer_counts=counts, peer_flat=flat, peer_signatures=sigs, designs=designs)

    def _safe_core(self, survivors: set[int], peer_sets: Mapping[int, Sequence[int]]) -> set[int]:
        """The largest part of the survivors the clients will accept: peel clients with <= c mutual
        peers among the survivors, keep the largest connected part, and check (c + 1)-connectivity.
        Clients left out count as dropped (their masked input is not used)."""
        c = self.setup.colluders
        alive = set(survivors)
        while True:
            used = used_graph({u: peer_sets[u] for u in alive})
            weak = {u for u in alive if len(used[u]) <= c}
            if not weak:
                break
            for u in weak:
                self._fail(u, f"masked: {c + 1} or more surviving peers needed, it has fewer")
            alive -= weak
        if not alive:
            return alive
        used = used_graph({u: peer_sets[u] for u in alive})
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
