"""XNoise seeds in the protocol (issue 12, protocol side): shared with the self-mask seed, the excess
revealed only for the agreed survivor count, removed exactly by the server."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedprivacy.accounting.distributed import XNoiseDesign
from fedprivacy.dp.discrete import sample_discrete_gaussian
from fedprivacy.dp.rng import RandomSource
from fedprivacy.secagg.local import STAGES
from fedprivacy.secagg.protocol import (
    ClientSession,
    ProtocolViolation,
    RoundAborted,
    ServerSession,
    SetupRequest,
    UnmaskRequest,
)
from fedprivacy.secagg.quantize import to_ring
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
