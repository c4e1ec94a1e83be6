"""XNoise seeds in the protocol (protocol side): shared with the self-mask seed, the excess
revealed only for the agreed survivor count, removed exactly by the server."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedprivacy.accounting.xnoise_design import XNoiseDesign
from fedprivacy.dp.discrete import sample_discrete_gaussian
from fedprivacy.dp.rng import RandomSource
from fedprivacy.secagg.client_session import ClientSession
from fedprivacy.secagg.local import STAGES
from fedprivacy.secagg.messages import ProtocolViolation, RoundAborted, SetupRequest, UnmaskRequest
from fedprivacy.secagg.quantize import to_ring
from fedprivacy.secagg.server_session import ServerSession
from fedprivacy.secagg.xnoise import ComponentSeeds, component_noise

DIM, BITS, VAR = 64, 32, 400.0


def _alive(drops, node, stage):
    d = drops.get(node)
    return d is None or STAGES.index(stage) < STAGES.index(d)


def _round(n, t, k, drops, *, c=0, active=True, tamper=None, capture=None):
    """One round with XNoise; returns (total, expected kept-noise sum + inputs, server, clients)."""
    setup = SetupRequest(round=3, threshold=t, degree=k, dim=DIM, colluders=c, active=active)

    def design_for(roster: int) -> XNoiseDesign:
        return XNoiseDesign(total_variance=VAR, roster=roster, min_survivors=t, colluders=c)

    ids = list(range(n))
    server = ServerSession(setup, noise_design=design_for)
    clients = {i: ClientSession(node_id=i, setup=setup, colluders=c, require_active=active) for i in ids}
    roster = server.receive_keys([clients[i].advertise_keys() for i in ids if _alive(drops, i, "advertise")])
    design = design_for(len(roster.node_ids))
    comps = {i: ComponentSeeds.fresh(design, round=3, node_id=i, rng=RandomSource.secure())
             for i in roster.node_ids}
    shared = [clients[i].share_keys(roster, components=comps[i]) for i in roster.node_ids
              if _alive(drops, i, "share")]
    reqs = server.receive_shares(shared)
    gen = np.random.default_rng(1)  # test data only
    x = {i: gen.integers(-1000, 1000, DIM) for i in ids}
    base = {i: sample_discrete_gaussian(sigma=math.sqrt(design.variances[0]), size=DIM,
                                        rng=RandomSource.seeded(100 + i)) for i in ids}

    def encoded(i: int) -> np.ndarray:  # x + all of i's noise (component 0 from its own source)
        q = x[i] + base[i]
        for j, seed in enumerate(comps[i].seeds, start=1):
            q = q + component_noise(seed, variance=design.variances[j], size=DIM, round=3, node_id=i, index=j)
        return to_ring(q, modulus_bits=BITS)

    masked = [clients[i].masked_input(r, encoded(i)) for i, r in reqs.items() if _alive(drops, i, "masked")]
    nxt = server.receive_masked(masked)
    if active:
        nxt = server.receive_consistency([clients[i].sign_view(r) for i, r in nxt.items()
                                          if _alive(drops, i, "consistency")])
    replies = [clients[i].unmask(r) for i, r in nxt.items() if _alive(drops, i, "unmask")]
    if capture is not None:
        capture.extend(replies)
    if tamper:
        replies = tamper(replies)
    total = server.receive_unmask(replies)
    u3 = list(server.u3)
    expect = np.zeros(DIM, dtype=np.int64)
    for r, i in enumerate(u3):
        expect += x[i] + base[i]
        for j in design.kept(survivors=len(u3), rank=r):
            if j == 0:  # component 0 is the client's own draw, already in base
                continue
            expect += component_noise(comps[i].seeds[j - 1], variance=design.variances[j], size=DIM,
                                      round=3, node_id=i, index=j)
    return total, to_ring(expect, modulus_bits=BITS), server, clients, design


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(6, 11), active=st.booleans(), c=st.integers(0, 1), data=st.data())
def test_the_sum_keeps_exactly_the_designs_noise_for_the_agreed_survivors(n, active, c, data) -> None:
    k = n - 1
    t = (k + 1 + c) // 2 + 1
    drops = data.draw(st.dictionaries(st.sampled_from(list(range(n))), st.sampled_from(STAGES), max_size=2))
    try:
        total, expect, server, _, design = _round(n, t, k, drops, c=c, active=active)
    except RoundAborted:
        return
    assert np.array_equal(total, expect)
    assert math.isclose(design.honest_variance(survivors=len(server.u3)), VAR, rel_tol=1e-12)


def test_holders_reveal_only_the_excess_components_of_surviving_peers() -> None:
    replies: list = []
    total, expect, server, _, design = _round(9, 5, 8, {8: "masked", 7: "masked"}, capture=replies)
    assert np.array_equal(total, expect)
    s = len(server.u3)
    rank = {u: r for r, u in enumerate(server.u3)}
    removable = {(u, j) for u in server.u3 for j in design.removable(survivors=s, rank=rank[u])}
    revealed = [(o, j) for r in replies for o, j in zip(r.component_owners, r.component_indices, strict=True)]
    assert removable and set(revealed) == removable  # exactly the excess, never a kept component
    assert all(o in server.u3 for o, _ in revealed)  # nothing of the dropped clients


def test_a_view_with_another_noise_design_is_refused() -> None:
    n, t = 7, 5
    setup = SetupRequest(round=3, threshold=t, degree=n - 1, dim=DIM, active=True)
    ids = list(range(n))

    def design_for(roster: int, var: float = VAR) -> XNoiseDesign:
        return XNoiseDesign(total_variance=var, roster=roster, min_survivors=t)

    server = ServerSession(setup, noise_design=lambda r: design_for(r, 2 * VAR))  # the server's own idea
    clients = {i: ClientSession(node_id=i, setup=setup, require_active=True) for i in ids}
    roster = server.receive_keys([c.advertise_keys() for c in clients.values()])
    comps = {i: ComponentSeeds.fresh(design_for(n), round=3, node_id=i, rng=RandomSource.secure()) for i in ids}
    reqs = server.receive_shares([clients[i].share_keys(roster, components=comps[i]) for i in ids])
    masked = [clients[i].masked_input(reqs[i], np.zeros(DIM, np.uint32)) for i in ids]
    with pytest.raises(RoundAborted):  # every upload carries another fingerprint than the server's
        server.receive_masked(masked)
    assert all("another noise design" in r for r in server.failures.values())
    # and a client never signs a view whose survivors declare another design
    honest = ServerSession(setup, noise_design=design_for)
    cl = {i: ClientSession(node_id=i, setup=setup, require_active=True) for i in ids}
    r2 = honest.receive_keys([c.advertise_keys() for c in cl.values()])
    q2 = honest.receive_shares([cl[i].share_keys(r2, components=ComponentSeeds.fresh(
        design_for(n), round=3, node_id=i, rng=RandomSource.secure())) for i in ids])
    views = honest.receive_masked([cl[i].masked_input(q2[i], np.zeros(DIM, np.uint32)) for i in ids])
    other = design_for(n, 2 * VAR).fingerprint()
    lying = dataclasses.replace(views[0], designs=[other] * n)
    with pytest.raises(ProtocolViolation, match="noise design"):
        cl[0].sign_view(lying)
    cl[0].sign_view(views[0])  # the honest view is signed


def test_semi_honest_component_reveals_are_pinned_to_one_survivor_count() -> None:
    n, k, t = 12, 4, 3  # sparse: client 0 has non-peers whose status does not touch its per-peer rule
    setup = SetupRequest(round=3, threshold=t, degree=k, dim=DIM)
    ids = list(range(n))
    design = XNoiseDesign(total_variance=VAR, roster=n, min_survivors=t)
    server = ServerSession(setup, noise_design=lambda r: design)
    clients = {i: ClientSession(node_id=i, setup=setup) for i in ids}
    roster = server.receive_keys([c.advertise_keys() for c in clients.values()])
    comps = {i: ComponentSeeds.fresh(design, round=3, node_id=i, rng=RandomSource.secure()) for i in ids}
    reqs = server.receive_shares([clients[i].share_keys(roster, components=comps[i]) for i in ids])
    for i in ids:
        clients[i].masked_input(reqs[i], np.zeros(DIM, np.uint32))
    c0 = clients[0]
    first = c0.unmask(UnmaskRequest(round=3, survivors=ids, dropped=[]))
    assert first.component_indices and set(first.component_indices) <= set(range(1, design.num_seeded + 1))
    # a different survivor count (a non-peer "dropped") would change which components are excess
    from fedprivacy.secagg.graph import is_connected

    graph = {i: tuple(clients[i].peers) for i in ids}
    far = next(x for x in ids if x != 0 and x not in c0.peers and is_connected(set(ids) - {x}, graph))
    with pytest.raises(ProtocolViolation, match="another count"):
        c0.unmask(UnmaskRequest(round=3, survivors=[i for i in ids if i != far], dropped=[far]))


def test_a_corrupt_component_share_is_corrected_or_detected() -> None:
    from fedprivacy.secagg import shamir

    def corrupt(replies):
        r = replies[0]
        if not r.component_shares:
            return replies
        limbs = shamir.decode_shares(r.component_shares[0], num_secrets=1, secret_bytes=32).astype(np.uint64)
        limbs[0, 0] = (limbs[0, 0] + 1) % shamir.LIMB_PRIME
        bad = [shamir.encode_shares(limbs.astype(np.uint32)), *r.component_shares[1:]]
        return [dataclasses.replace(r, component_shares=bad), *replies[1:]]

    total, expect, server, _, _ = _round(9, 5, 8, {}, tamper=corrupt)
    assert np.array_equal(total, expect)
    assert any("noise component" in reason for reason in server.failures.values())


def _unmask_points_plain(server, m, node, holds, *, surv, dropped, seed_pts, key_pts, comp_pts):
    """The server's reading of one unmask reply before the one-pass decode: check and decode
    share by share."""
    from fedprivacy.secagg import shamir

    got = []
    for owners, shares, table, allowed in ((m.seed_owners, m.seed_shares, seed_pts, (holds & surv) | {node}),
                                           (m.key_owners, m.key_shares, key_pts, holds & dropped)):
        if len(set(owners)) != len(owners) or len(owners) != len(shares):
            raise ValueError("owners and shares do not match one-to-one")
        for o, sh in zip(owners, shares, strict=True):
            if o not in allowed:
                raise ValueError(f"a share for {o} it should not hold or reveal")
            got.append((table, o, shamir.decode_shares(sh, num_secrets=1, secret_bytes=32)[0]))
    trip = (m.component_owners, m.component_indices, m.component_shares)
    if len({len(v) for v in trip}) != 1:
        raise ValueError("component owners, indices and shares differ in length")
    comp_got = []
    for o, j, sh in zip(*trip, strict=True):
        if (o, j) not in comp_pts or o not in (holds & surv) | {node}:
            raise ValueError(f"a share of component {j} of {o} it should not reveal")
        comp_got.append(((o, j), shamir.decode_shares(sh, num_secrets=1, secret_bytes=32)[0]))
    return got, comp_got


_BAD_SHARES = [b"\x01" * 35, b"\xff" * 36, "not bytes", None, bytearray(36), memoryview(bytes(36)), b""]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_one_pass_unmask_decoding_reads_and_refuses_replies_as_share_by_share_decoding(data) -> None:
    """The server decodes an unmask reply's shares in one pass (shamir.decode_many); for
    honest replies and for replies with up to three faults (malformed, out-of-field, non-bytes or
    bytearray shares, owners it may not reveal, duplicate owners, a missing component index) at any
    positions, the decoded points or the error (type and text: the first fault in the order of the
    share-by-share reading) are the old reading's, so the failures and the sum cannot change."""
    from fedprivacy.secagg.xnoise import removable_components

    checked = []

    def compare(replies):
        server = holder[0]
        surv, dropped = set(server.u3), set(server.dropped)
        seed_pts = {i: [] for i in server.u3}
        key_pts = {i: [] for i in server.dropped}
        comp_pts = {(i, j): [] for i, idx in removable_components(server.design, server.u3).items() for j in idx}
        for r in replies:
            m = r
            for _ in range(data.draw(st.integers(0, 3))):
                field = data.draw(st.sampled_from(["seed_shares", "key_shares", "component_shares", "seed_owners",
                                                   "component_owners", "component_indices"]))
                vals = list(getattr(m, field))
                if not vals:
                    continue
                p = data.draw(st.integers(0, len(vals) - 1))
                if field.endswith("shares"):
                    vals[p] = data.draw(st.sampled_from(_BAD_SHARES))
                elif field == "component_indices":
                    vals.pop(p)
                else:
                    vals[p] = data.draw(st.sampled_from([10**6, vals[0], -1]))
                m = dataclasses.replace(m, **{field: vals})
            out = []
            for fn in (lambda *a, **k: server._unmask_points(*a, **k),
                       lambda *a, **k: _unmask_points_plain(server, *a, **k)):
                try:
                    got, comp = fn(m, m.node_id, set(server._peers[m.node_id]), surv=surv, dropped=dropped,
                                   seed_pts=seed_pts, key_pts=key_pts, comp_pts=comp_pts)
                    out.append(("ok", [(id(t), o, v.dtype, v.tolist()) for t, o, v in got],
                                [(k, v.dtype, v.tolist()) for k, v in comp]))
                except (TypeError, ValueError) as exc:
                    out.append(("refused", type(exc), str(exc)))
            assert out[0] == out[1]
            checked.append(out[0][0])
        return replies

    holder = []
    orig = ServerSession.receive_unmask

    def spy(self, messages):
        holder.append(self)
        return orig(self, compare(messages))

    ServerSession.receive_unmask = spy  # type: ignore[method-assign]
    try:
        _round(7, 4, 6, {5: "unmask", 6: "masked"})
    except RoundAborted:
        pass
    finally:
        ServerSession.receive_unmask = orig  # type: ignore[method-assign]
    assert checked
