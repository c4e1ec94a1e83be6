"""An adversarial server for the secure-aggregation protocol, and what it can solve for afterwards.

:class:`MaliciousServer` plays the server against real :class:`ClientSession` objects: it chooses every
message (rosters, which sealed shares reach whom, tampered and replayed ciphertexts, the views each
client is asked to sign, the certificates and unmask requests), shows different clients different
things, and controls ``c`` colluding clients (it holds all of their keys and shares and signs anything
in their name). Honest clients refuse what their checks reject; a refusal is just a missing reply.

:func:`learnable_sums` then does what the attacker would: it reconstructs every secret it has enough
shares of (verifying each against the seed commitment or public key, as the attacker can), and solves
the linear system of the masked vectors it holds. Treating every PRG output whose seed it cannot
compute as an independent uniform vector, a combination ``sum a_u y_u`` reveals something about the
inputs only if every unknown mask cancels: ``a_u = 0`` if ``b_u`` is unknown, ``a_u = a_w`` for an
unknown pairwise mask both ends applied (same world), ``a_u = 0`` if only one end applied it. So the
solvable combinations are spanned by the indicator vectors of the connected components (of
"unknown-mask" edges) free of zero constraints; the function returns them. Every returned component is
also *checked by reconstruction*: the attacker's estimate of the component's sum must equal the true
sum of its inputs (so a positive finding is a demonstrated attack, not a counting artefact).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedprivacy.dp.rng import RandomSource
from fedprivacy.secagg import shamir
from fedprivacy.secagg.client_session import ClientSession
from fedprivacy.secagg.keys import (
    SealError,
    Secret,
    derive_key,
    load_private,
    open_sealed,
    public_from_private,
)
from fedprivacy.secagg.messages import (
    AdvertiseKeys,
    ConsistencyRequest,
    MaskedInput,
    MaskedInputRequest,
    SetupRequest,
    ShareKeysRequest,
    UnmaskRequest,
    UnmaskResponse,
)
from fedprivacy.secagg.prg import apply_masks
from fedprivacy.secagg.robust import recover_secret
from fedprivacy.secagg.transcript import (
    _SHARE_SEAL,
    _context,
    _pair_seed,
    _peers_statement,
    _sign,
    _view_digest,
    _view_statement,
    seed_commitment,
    world_id,
)
from fedprivacy.secagg.xnoise import ComponentSeeds

REFUSALS = (ValueError, TypeError, KeyError)  # ProtocolViolation and SealError are ValueErrors


def _try(fn: Callable[[], object]) -> object | None:
    try:
        return fn()
    except REFUSALS:
        return None


@dataclass
class MaliciousServer:
    """The state of one attack on one round; each ``stage_*`` takes the attacker's choices."""

    setup: SetupRequest
    inputs: Mapping[int, np.ndarray]
    colluders: frozenset[int]
    noise_design: Callable[[int], Any] | None = None  # XNoise: roster size -> XNoiseDesign
    clients: dict[int, ClientSession] = field(default_factory=dict)
    components: dict[int, ComponentSeeds] = field(default_factory=dict)
    comp_shares: dict[tuple[int, int], dict[int, Any]] = field(default_factory=dict)  # (owner, j) -> x -> limbs
    adverts: dict[int, AdvertiseKeys] = field(default_factory=dict)
    worlds: dict[int, bytes] = field(default_factory=dict)  # sender -> world of its shares
    rosters: dict[int, ShareKeysRequest] = field(default_factory=dict)
    cts: dict[tuple[int, int], bytes] = field(default_factory=dict)  # (sender, receiver) -> ct
    masked: dict[int, MaskedInput] = field(default_factory=dict)
    view_sigs: dict[bytes, dict[int, bytes]] = field(default_factory=dict)  # digest -> signer -> sig
    client_view: dict[int, tuple[ConsistencyRequest, bytes]] = field(default_factory=dict)
    seed_shares: dict[int, dict[int, Any]] = field(default_factory=dict)  # owner -> x -> limbs
    key_shares: dict[int, dict[int, Any]] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for i in self.inputs:
            self.clients[i] = ClientSession(node_id=i, setup=self.setup, colluders=self.setup.colluders,
                                            require_active=self.setup.active)

    @property
    def honest(self) -> list[int]:
        return [i for i in self.inputs if i not in self.colluders]

    def _state(self, i: int) -> dict:
        return self.clients[i].to_state()

    # stage 1: every client advertises; the attacker knows the colluders' keys
    def stage_advertise(self) -> None:
        for i, c in self.clients.items():
            self.adverts[i] = c.advertise_keys()
        for i in self.colluders:  # a colluder's own secrets (abscissa 0 marks the secret itself)
            st = self._state(i)
            self.seed_shares.setdefault(i, {})[0] = st["seed"]
            self.key_shares.setdefault(i, {})[0] = st["mask.private"]

    def roster(self, members: Sequence[int]) -> ShareKeysRequest:
        ids = sorted(members)
        a = self.adverts
        return ShareKeysRequest(round=self.setup.round, node_ids=ids,
                                enc_publics=[a[i].enc_public for i in ids],
                                mask_publics=[a[i].mask_public for i in ids],
                                sign_publics=[a[i].sign_public for i in ids],
                                seed_commitments=[a[i].seed_commitment for i in ids])

    # stage 2: a roster per client (the same or not)
    def stage_share(self, roster_of: Mapping[int, Sequence[int]]) -> None:
        for i, members in roster_of.items():
            req = self.roster(members)
            comps = None
            if self.noise_design is not None:
                comps = ComponentSeeds.fresh(self.noise_design(len(req.node_ids)), round=self.setup.round,
                                             node_id=i, rng=RandomSource.secure())
                self.components[i] = comps
            out = _try(lambda i=i, req=req, comps=comps: self.clients[i].share_keys(req, components=comps))
            if out is None:
                self.refusals.append(f"share {i}")
                continue
            self.rosters[i] = req
            self.worlds[i] = world_id(self.setup, req)
            for r, ct in zip(out.receivers, out.ciphertexts, strict=True):  # type: ignore[attr-defined]
                self.cts[(i, r)] = ct
        self._open_colluder_shares()

    def _open_colluder_shares(self) -> None:
        """A colluder opens every sealed share addressed to it, under the sender's world."""
        for (sender, receiver), ct in self.cts.items():
            if receiver not in self.colluders or sender in self.colluders:
                continue
            enc_private = self._state(receiver)["enc.private"]
            lo, hi = sorted((sender, receiver))
            world = self.worlds[sender]
            key = derive_key(load_private(enc_private), self.adverts[sender].enc_public, purpose=_SHARE_SEAL,
                             context=_context(world, self.setup.round, lo, hi))
            try:
                pt = open_sealed(key, ct, purpose=_SHARE_SEAL,
                                 context=_context(world, self.setup.round, sender, receiver))
            except SealError:
                continue
            x = self.abscissa(sender, receiver)
            m = len(self.components[sender].seeds) if sender in self.components else 0
            rows = shamir.decode_shares(pt, num_secrets=2 + m, secret_bytes=32)
            self.seed_shares.setdefault(sender, {})[x] = rows[0]
            self.key_shares.setdefault(sender, {})[x] = rows[1]
            for j in range(1, m + 1):  # a colluding holder keeps every component share it got
                self.comp_shares.setdefault((sender, j), {})[x] = rows[1 + j]

    def abscissa(self, owner: int, holder: int) -> int:
        """Where ``owner`` evaluated the share it sent ``holder``: 1 + position in owner's roster."""
        return sorted(self.rosters[owner].node_ids).index(holder) + 1

    # stage 3: which sealed shares reach whom (and tampering)
    def stage_masked(self, forward: Mapping[int, Sequence[int]], *,
                     tamper: Mapping[int, Sequence[int]] | None = None) -> None:
        tamper = tamper or {}
        for i, senders in forward.items():
            senders = [j for j in senders if (j, i) in self.cts]
            cts = []
            for j in senders:
                ct = self.cts[(j, i)]
                if j in tamper.get(i, ()):
                    ct = ct[:20] + bytes([ct[20] ^ 1]) + ct[21:]
                cts.append(ct)
            req = MaskedInputRequest(round=self.setup.round, senders=senders, ciphertexts=cts)
            out = _try(lambda i=i, req=req: self.clients[i].masked_input(req, self.inputs[i]))
            if out is None:
                self.refusals.append(f"masked {i}")
                continue
            self.masked[i] = out  # type: ignore[assignment]

    def honest_until_masked(self) -> None:
        """Stages 1-3 as an honest server runs them: one roster, every sealed share forwarded."""
        ids = sorted(self.inputs)
        self.stage_advertise()
        self.stage_share(dict.fromkeys(ids, ids))
        self.stage_masked({i: [j for j in ids if (j, i) in self.cts] for i in ids})

    def view(self, survivors: Sequence[int], dropped: Sequence[int] | None = None, *,
             peers: Mapping[int, Sequence[int]] | None = None) -> ConsistencyRequest:
        """A view over uploaders; peer sets and signatures as reported unless ``peers`` overrides."""
        surv = sorted(survivors)
        ps = {u: list(self.masked[u].peers) for u in surv}
        sigs = {u: self.masked[u].signature for u in surv}
        if peers:
            for u, p in peers.items():
                ps[u] = sorted(p)
                if u in self.colluders:  # the attacker signs anything for a colluder
                    sigs[u] = _sign(Secret(self._state(u)["sign"]),
                                    _peers_statement(self.worlds[u], u, ps[u], self.masked[u].design))
        if dropped is None:
            dropped = sorted(set().union(*map(set, ps.values())) - set(surv))
        designs = [self.masked[u].design for u in surv] if self.noise_design is not None else []
        return ConsistencyRequest(round=self.setup.round, survivors=surv, dropped=sorted(dropped),
                                  peer_counts=[len(ps[u]) for u in surv],
                                  peer_flat=[j for u in surv for j in ps[u]],
                                  peer_signatures=[sigs[u] for u in surv], designs=designs)

    # stage 4: the view each client is asked to sign
    def stage_consistency(self, view_of: Mapping[int, ConsistencyRequest]) -> None:
        for i, req in view_of.items():
            if i not in self.worlds:
                continue
            ps = dict(zip(req.survivors, _split(req), strict=True))
            fp = self.masked[i].design if i in self.masked else b""
            digest = _view_digest(self.worlds[i], req.survivors, req.dropped, ps, fp)
            if i in self.colluders:
                sig = _sign(Secret(self._state(i)["sign"]), _view_statement(digest))
            else:
                out = _try(lambda i=i, req=req: self.clients[i].sign_view(req))
                if out is None:
                    self.refusals.append(f"consistency {i}")
                    continue
                sig = out.signature  # type: ignore[attr-defined]
                self.client_view[i] = (req, digest)
            self.view_sigs.setdefault(digest, {})[i] = sig

    def forge_colluder_signatures(self, digest: bytes) -> None:
        for u in self.colluders:
            if u in self.worlds:
                self.view_sigs.setdefault(digest, {})[u] = _sign(Secret(self._state(u)["sign"]),
                                                                   _view_statement(digest))

    def certificate(self, i: int, *, limit: int | None = None) -> UnmaskRequest | None:
        """The best certificate the attacker has for the view client ``i`` signed."""
        if i not in self.client_view:
            return None
        req, digest = self.client_view[i]
        self.forge_colluder_signatures(digest)
        sigs = {u: s for u, s in self.view_sigs.get(digest, {}).items() if u in req.survivors}
        signers = sorted(sigs)[:limit]
        return UnmaskRequest(round=self.setup.round, survivors=list(req.survivors),
                             dropped=list(req.dropped), signers=signers,
                             signatures=[sigs[u] for u in signers])

    # stage 5: unmask requests (any number per client)
    def stage_unmask(self, requests: Sequence[tuple[int, UnmaskRequest]]) -> None:
        for i, req in requests:
            out = _try(lambda i=i, req=req: self.clients[i].unmask(req))
            if out is None:
                self.refusals.append(f"unmask {i}")
                continue
            self.record(out)  # type: ignore[arg-type]

    def record(self, resp: UnmaskResponse) -> None:
        for owners, shares, table in ((resp.seed_owners, resp.seed_shares, self.seed_shares),
                                      (resp.key_owners, resp.key_shares, self.key_shares)):
            for o, sh in zip(owners, shares, strict=True):
                x = self.abscissa(o, resp.node_id)
                table.setdefault(o, {})[x] = shamir.decode_shares(sh, num_secrets=1, secret_bytes=32)[0]
        for o, j, sh in zip(resp.component_owners, resp.component_indices, resp.component_shares, strict=True):
            self.comp_shares.setdefault((o, j), {})[self.abscissa(o, resp.node_id)] = shamir.decode_shares(
                sh, num_secrets=1, secret_bytes=32)[0]


def _split(req: ConsistencyRequest) -> list[list[int]]:
    out, pos = [], 0
    for c in req.peer_counts:
        out.append(list(req.peer_flat[pos:pos + c]))
        pos += c
    return out


@dataclass(frozen=True)
class Finding:
    """A set of honest clients whose input sum the attacker can compute, and that sum; with XNoise,
    the variance of the noise components in it whose seeds the attacker cannot reconstruct."""

    members: frozenset[int]
    estimate: np.ndarray
    truth: np.ndarray
    noise_variance: float = float("nan")


def _secret(shares: Mapping[int, Any] | None, threshold: int, check: Callable[[bytes], bool]) -> bytes | None:
    """What the attacker reconstructs (and verifies, as it can) from the shares it holds."""
    if not shares:
        return None
    if 0 in shares:  # a colluder's own secret
        return bytes(shares[0])
    rec = recover_secret(sorted(shares.items(), key=lambda kv: kv[0]), threshold=threshold, verify=check)
    return None if rec is None else rec.secret


def learnable_sums(adv: MaliciousServer) -> list[Finding]:
    """Every component of honest uploaders whose input sum the attacker can solve for (see module)."""
    s = adv.setup
    t = s.threshold
    bits = s.modulus_bits
    honest = [i for i in adv.honest if i in adv.masked]
    b: dict[int, bytes | None] = {}
    sk: dict[int, bytes | None] = {}
    for i in adv.inputs:
        a = adv.adverts[i]
        b[i] = _secret(adv.seed_shares.get(i), t, lambda v, i=i, a=a: seed_commitment(
            round=s.round, node_id=i, seed=v) == a.seed_commitment)
        sk[i] = _secret(adv.key_shares.get(i), t, lambda v, a=a: public_from_private(v) == a.mask_public)
    # union-find over honest uploaders with a known self mask
    parent = {u: u for u in honest}
    zero = {u for u in honest if b[u] is None}

    def find(u: int) -> int:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    for u in honest:
        for w in adv.masked[u].peers:
            if w in adv.colluders or sk[u] is not None or sk.get(w) is not None:
                continue  # the attacker computes this mask
            mutual = (w in adv.masked and w in parent and u in adv.masked[w].peers
                      and adv.worlds.get(w) == adv.worlds.get(u))
            if mutual:
                parent[find(u)] = find(w)
            else:
                zero.add(u)
    comps: dict[int, set[int]] = {}
    for u in honest:
        comps.setdefault(find(u), set()).add(u)
    bad_roots = {find(u) for u in zero}
    findings = []
    for root, members in comps.items():
        if root in bad_roots:
            continue
        f = _reconstruct(adv, frozenset(members), b, sk, bits)
        if adv.noise_design is not None:
            f = dataclasses.replace(f, noise_variance=_unknown_noise(adv, members))
        findings.append(f)
    return findings


def _unknown_noise(adv: MaliciousServer, members: set[int]) -> float:
    """Sum of the variances of the members' noise components the attacker has no seed for
    (component 0 never has one)."""
    total = 0.0
    for u in members:
        comps = adv.components[u]
        var = comps.design.variances
        total += var[0]
        for j, seed in enumerate(comps.seeds, start=1):
            got = _secret(adv.comp_shares.get((u, j)), adv.setup.threshold, lambda v, seed=seed: v == seed)
            if got is None:
                total += var[j]
    return total


def _reconstruct(adv: MaliciousServer, members: frozenset[int], b: Mapping[int, bytes | None],
                 sk: Mapping[int, bytes | None], bits: int) -> Finding:
    """The attacker's estimate of the members' input sum, and the truth (for the check)."""
    s = adv.setup
    total = np.zeros(s.dim, dtype=np.uint32)
    add: list[bytes] = []
    sub: list[bytes] = []
    for u in members:
        np.add(total, adv.masked[u].masked, out=total)
        sub.append(bytes(b[u]))  # type: ignore[arg-type]
        for w in adv.masked[u].peers:
            if w in members and adv.worlds.get(w) == adv.worlds.get(u) and u in adv.masked[w].peers \
                    and sk[u] is None and sk.get(w) is None and w not in adv.colluders:
                continue  # cancels inside the component
            if sk[u] is not None:
                seed = _pair_seed(load_private(bytes(sk[u])), adv.adverts[w].mask_public,  # type: ignore[arg-type]
                                  world=adv.worlds[u], round_=s.round, me=u, peer=w)
            else:
                key = sk.get(w) if w not in adv.colluders else adv._state(w)["mask.private"]
                seed = _pair_seed(load_private(bytes(key)), adv.adverts[u].mask_public,  # type: ignore[arg-type]
                                  world=adv.worlds[u], round_=s.round, me=w, peer=u)
            (sub if u < w else add).append(seed)  # undo what u applied
    apply_masks(total, add=add, subtract=sub, modulus_bits=bits)
    truth = np.zeros(s.dim, dtype=np.uint64)
    for u in members:
        truth += adv.inputs[u]
    return Finding(members=members, estimate=total,
                   truth=(truth % (1 << bits)).astype(np.uint32))


__all__ = ["Finding", "MaliciousServer", "learnable_sums"]
