"""End-to-end rounds of both schedules: exact sums under dropouts, aborts, faults that drop a client
instead of the round, the client's refusals, and its state."""

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from fedprivacy.secagg import shamir
from fedprivacy.secagg.client_session import ClientSession
from fedprivacy.secagg.graph import harary_neighbours, is_connected, min_signers
from fedprivacy.secagg.local import STAGES, run_round
from fedprivacy.secagg.messages import (
    ConsistencyRequest,
    MaskedInput,
    MaskedInputRequest,
    ProtocolViolation,
    RoundAborted,
    SetupRequest,
    UnmaskRequest,
    UnmaskResponse,
)
from fedprivacy.secagg.prg import expand_mask
from fedprivacy.secagg.server_session import ServerSession
from fedprivacy.secagg.session_state import RoundLog
from fedprivacy.secagg.transcript import world_id


def _inputs(ids, dim, bits, seed=0):
    gen = np.random.default_rng(seed)  # test data only, not masks or noise
    return {i: gen.integers(0, 2**bits, dim).astype(np.uint32) for i in ids}


def _off_by(blob: bytes, delta: int) -> bytes:
    """A revealed share (limbed scheme) with its first limb moved by ``delta``."""
    limbs = shamir.decode_shares(blob, num_secrets=1, secret_bytes=32).astype(np.uint64)
    limbs[0, 0] = (limbs[0, 0] + delta) % shamir.LIMB_PRIME
    return shamir.encode_shares(limbs.astype(np.uint32))


def _plain_sum(inputs, ids, bits):
    total = np.zeros(next(iter(inputs.values())).shape, dtype=np.uint64)
    for i in ids:
        total += inputs[i]
    return (total % (2**bits)).astype(np.uint32)


def _alive(drops, node, stage):
    d = drops.get(node)
    return d is None or STAGES.index(stage) < STAGES.index(d)


# ------------------------------------------------------------------ honest rounds
@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(4, 9), bits=st.integers(16, 32), active=st.booleans(), data=st.data())
def test_complete_graph_exact_sum_iff_enough_survive(n: int, bits: int, active: bool, data) -> None:
    t = n // 2 + 1
    ids = data.draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n, unique=True))
    drops = data.draw(st.dictionaries(st.sampled_from(ids), st.sampled_from(STAGES), max_size=n))
    setup = SetupRequest(round=5, threshold=t, degree=n - 1, modulus_bits=bits, dim=50, active=active)
    inputs = _inputs(ids, 50, bits)
    early = [i for i in ids if _alive(drops, i, "share")]
    uploaders = [i for i in early if _alive(drops, i, "masked")]
    signers = [i for i in uploaders if _alive(drops, i, "consistency")]
    answering = [i for i in signers if _alive(drops, i, "unmask")]
    need_sig = min_signers(len(early), colluders=0) if active else 0
    ok = (len(early) >= t and len(uploaders) >= max(t, need_sig) and len(signers) >= need_sig
          and len(answering) >= t)
    if ok:
        total, server, _ = run_round(setup, inputs, drop_before=drops)
        assert set(server.u3) == set(uploaders)
        assert np.array_equal(total, _plain_sum(inputs, uploaders, bits))
        assert server.failures == {}
    else:
        with pytest.raises(RoundAborted):
            run_round(setup, inputs, drop_before=drops)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(active=st.booleans(), colluders=st.integers(0, 1), data=st.data())
def test_sparse_graph_exact_sum_with_dropouts(active: bool, colluders: int, data) -> None:
    n, k = 16, 6
    t = (k + 1 + colluders) // 2 + 1
    ids = list(range(1, n + 1))
    drops = data.draw(st.dictionaries(st.sampled_from(ids), st.sampled_from(STAGES), max_size=3))
    setup = SetupRequest(round=1, threshold=t, degree=k, modulus_bits=32, dim=64, colluders=colluders,
                         active=active)
    inputs = _inputs(ids, 64, 32, seed=1)
    try:
        total, server, _ = run_round(setup, inputs, drop_before=drops)
    except RoundAborted:  # a neighbourhood lost too many members: allowed, but only then
        return
    assert np.array_equal(total, _plain_sum(inputs, server.u3, 32))
    uploaders = {i for i in ids if _alive(drops, i, "masked")}
    assert set(server.u3) <= uploaders
    if not active:  # the active server may leave out badly connected uploaders, as failures
        assert set(server.u3) == uploaders
    assert set(server.u3) | set(server.failures) >= uploaders


def test_abort_below_threshold_reveals_nothing() -> None:
    n, t = 6, 4
    ids = list(range(n))
    setup = SetupRequest(round=2, threshold=t, degree=n - 1, dim=8)
    server = ServerSession(setup)
    clients = {i: ClientSession(node_id=i, setup=setup) for i in ids}
    roster = server.receive_keys([c.advertise_keys() for c in clients.values()])
    reqs = server.receive_shares([clients[i].share_keys(roster) for i in ids])
    masked = [clients[i].masked_input(reqs[i], np.zeros(8, np.uint32)) for i in ids[:2]]
    with pytest.raises(RoundAborted):
        server.receive_masked(masked)
    # and an honest client refuses an unmask request listing fewer than t survivors
    with pytest.raises(ProtocolViolation, match="fewer than"):
        clients[0].unmask(UnmaskRequest(round=2, survivors=[0, 1], dropped=[2, 3, 4, 5]))
    assert clients[0].revealed == {}


def test_pipelined_rounds_follow_the_active_three_exchange_schedule() -> None:
    """Active schedule in steady state (docs/SECAGG.md): A_r = masked input r + shares of r+1,
    B_r = consistency r + advertise of r+2, C_r = unmask r; every round's sum stays exact."""
    ids = list(range(6))
    rounds = (1, 2, 3)
    setups = {r: SetupRequest(round=r, threshold=4, degree=5, dim=8, active=True) for r in rounds}
    servers = {r: ServerSession(setups[r]) for r in rounds}
    log = {i: RoundLog() for i in ids}
    clients = {r: {i: ClientSession(node_id=i, setup=setups[r], require_active=True) for i in ids}
               for r in rounds}
    inputs = {r: {i: np.full(8, 10 * r + i, np.uint32) for i in ids} for r in rounds}
    rosters = {r: servers[r].receive_keys([clients[r][i].advertise_keys(log=log[i]) for i in ids])
               for r in (1, 2)}
    mreq = {1: servers[1].receive_shares([clients[1][i].share_keys(rosters[1]) for i in ids])}
    exchanges = 0
    for r in (1, 2):
        masked = [clients[r][i].masked_input(mreq[r][i], inputs[r][i]) for i in ids]  # A_r
        if r + 1 in rosters:
            mreq[r + 1] = servers[r + 1].receive_shares(
                [clients[r + 1][i].share_keys(rosters[r + 1]) for i in ids])
        creq = servers[r].receive_masked(masked)
        views = [clients[r][i].sign_view(creq[i]) for i in ids]  # B_r
        if r + 2 in setups:
            rosters[r + 2] = servers[r + 2].receive_keys(
                [clients[r + 2][i].advertise_keys(log=log[i]) for i in ids])
        ureq = servers[r].receive_consistency(views)
        replies = [clients[r][i].unmask(ureq[i]) for i in ids]  # C_r
        total = servers[r].receive_unmask(replies)
        exchanges += 3
        assert np.array_equal(total, _plain_sum(inputs[r], ids, 32))
    assert exchanges == 6 and servers[3].stage == "SHARED"  # ready for its masked input


def test_pipelined_rounds_follow_the_semi_honest_two_exchange_schedule() -> None:
    """Semi-honest opt-in: round r+1's advertise rides with round r-1's unmask exchange and its
    shares with round r's masked-input exchange; every round's sum stays exact."""
    ids = list(range(6))
    setups = {r: SetupRequest(round=r, threshold=4, degree=5, dim=8) for r in (1, 2, 3)}
    servers = {r: ServerSession(setups[r]) for r in setups}
    clients = {r: {i: ClientSession(node_id=i, setup=setups[r]) for i in ids} for r in setups}
    inputs = {r: {i: np.full(8, 10 * r + i, np.uint32) for i in ids} for r in setups}
    rosters = {r: servers[r].receive_keys([c.advertise_keys() for c in clients[r].values()])
               for r in (1, 2)}
    mreq = {1: servers[1].receive_shares([clients[1][i].share_keys(rosters[1]) for i in ids])}
    for r in (1, 2):
        masked = [clients[r][i].masked_input(mreq[r][i], inputs[r][i]) for i in ids]
        if r + 1 in rosters:
            mreq[r + 1] = servers[r + 1].receive_shares(
                [clients[r + 1][i].share_keys(rosters[r + 1]) for i in ids])
        ureq = servers[r].receive_masked(masked)
        replies = [clients[r][i].unmask(ureq[i]) for i in ids]
        if r + 2 in setups:
            rosters[r + 2] = servers[r + 2].receive_keys(
                [c.advertise_keys() for c in clients[r + 2].values()])
        total = servers[r].receive_unmask(replies)
        assert np.array_equal(total, _plain_sum(inputs[r], ids, 32))
    assert servers[3].stage == "SHARED"


def test_secure_sum_equals_plain_sum_within_the_stated_quantisation_error() -> None:
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.secagg.quantize import check_headroom, decode_fixed_point, encode_fixed_point

    n, dim, bits, clip = 7, 300, 32, 1.0
    scale = 2.0**24
    check_headroom(num_clients=n, clip_norm=clip, scale=scale, modulus_bits=bits)
    data = RandomSource.seeded(4)
    floats = {i: (data.uniform(size=dim) - 0.5) * (3.0 if i == 2 else 0.01) for i in range(n)}
    rng = RandomSource.seeded(5)
    enc = {i: encode_fixed_point(f, clip_norm=clip, scale=scale, modulus_bits=bits,
                                 rng=rng.child(i)) for i, f in floats.items()}
    setup = SetupRequest(round=1, threshold=4, degree=n - 1, modulus_bits=bits, dim=dim, active=True)
    total, server, _ = run_round(setup, enc, drop_before={6: "masked"})
    got = decode_fixed_point(total, scale=scale, modulus_bits=bits)
    clipped = [f * min(1.0, clip / np.linalg.norm(f)) for f in floats.values()]
    plain = sum(clipped[i] for i in server.u3)
    assert np.max(np.abs(got - plain)) < len(server.u3) / scale


# ------------------------------------------------------------------ a faulty client drops, not the round
def _to_stage_3(n=5, t=3, round_=9, dim=16, active=False, colluders=0, degree=None, bits=32):
    ids = list(range(10, 10 + n))
    setup = SetupRequest(round=round_, threshold=t, degree=n - 1 if degree is None else degree, dim=dim,
                         active=active, colluders=colluders, modulus_bits=bits)
    server = ServerSession(setup)
    clients = {i: ClientSession(node_id=i, setup=setup, colluders=colluders) for i in ids}
    roster = server.receive_keys([c.advertise_keys() for c in clients.values()])
    reqs = server.receive_shares([clients[i].share_keys(roster) for i in ids])
    return setup, server, clients, reqs, ids


def _rest(setup, server, clients, masked, *, tamper=None):
    """Finish a round from the masked inputs; ``tamper(replies)`` may alter the unmask replies."""
    nxt = server.receive_masked(masked)
    if setup.active:
        nxt = server.receive_consistency([clients[i].sign_view(r) for i, r in nxt.items()])
    replies = [clients[i].unmask(r) for i, r in nxt.items()]
    return server.receive_unmask(tamper(replies) if tamper else replies)


@pytest.mark.parametrize("active", [False, True])
def test_malformed_masked_vectors_drop_their_sender_only(active: bool) -> None:
    setup, server, clients, reqs, ids = _to_stage_3(n=7, t=4, active=active, bits=20)
    inputs = {i: np.full(16, i, np.uint32) for i in ids}
    masked = {i: clients[i].masked_input(reqs[i], inputs[i]) for i in ids}
    masked[ids[5]] = dataclasses.replace(masked[ids[5]], masked=np.zeros(15, np.uint32))
    masked[ids[6]] = dataclasses.replace(masked[ids[6]], masked=np.full(16, 2**20, np.uint32))
    total = _rest(setup, server, clients, list(masked.values()) + ["not a message"])
    assert set(server.failures) == {ids[5], ids[6]}
    assert server.u3 == tuple(ids[:5]) and server.dropped == (ids[5], ids[6])
    assert np.array_equal(total, _plain_sum(inputs, ids[:5], 20))


@pytest.mark.parametrize("active", [False, True])
def test_shares_sent_outside_the_graph_drop_their_sender(active: bool) -> None:
    ids = list(range(12))
    setup = SetupRequest(round=1, threshold=3, degree=4, dim=4, active=active)
    server = ServerSession(setup)
    clients = {i: ClientSession(node_id=i, setup=setup) for i in ids}
    roster = server.receive_keys([c.advertise_keys() for c in clients.values()])
    shared = [clients[i].share_keys(roster) for i in ids]
    shared[0] = dataclasses.replace(shared[0], receivers=[r + 100 for r in shared[0].receivers])
    reqs = server.receive_shares(shared)
    assert 0 not in server.u2 and "not its graph neighbours" in server.failures[0]
    inputs = {i: np.full(4, i, np.uint32) for i in ids}
    total = _rest(setup, server, clients, [clients[i].masked_input(reqs[i], inputs[i]) for i in reqs])
    assert np.array_equal(total, _plain_sum(inputs, server.u3, 32)) and 0 not in server.u3


@pytest.mark.parametrize("active", [False, True])
def test_a_tampered_share_excludes_its_sender_and_the_sum_stays_exact(active: bool) -> None:
    setup, server, clients, reqs, ids = _to_stage_3(n=7, t=4, active=active)
    victim, sender = ids[0], ids[3]
    req = reqs[victim]
    pos = req.senders.index(sender)
    cts = list(req.ciphertexts)
    flipped = bytearray(cts[pos])
    flipped[20] ^= 0x40
    cts[pos] = bytes(flipped)
    inputs = {i: np.full(16, i, np.uint32) for i in ids}
    masked = [clients[i].masked_input(dataclasses.replace(req, ciphertexts=cts) if i == victim else reqs[i],
                                      inputs[i]) for i in ids]
    assert masked[0].rejected == [sender] and sender not in masked[0].peers
    total = _rest(setup, server, clients, masked)
    # the sender masked with the victim, which did not mask back: the sender is dropped, sum exact
    assert sender in server.failures and sender in server.dropped
    assert np.array_equal(total, _plain_sum(inputs, server.u3, 32))


def test_replay_from_another_round_is_refused() -> None:
    setup, server, clients, reqs, ids = _to_stage_3(round_=9)
    c = clients[ids[0]]
    with pytest.raises(ProtocolViolation, match="round 8"):
        c.masked_input(dataclasses.replace(reqs[ids[0]], round=8), np.zeros(16, np.uint32))
    # ciphertexts of round 9 replayed into a round-10 session of the same nodes: none opens
    _, _, clients10, _, _ = _to_stage_3(round_=10)
    replay = MaskedInputRequest(round=10, senders=reqs[ids[0]].senders,
                                ciphertexts=reqs[ids[0]].ciphertexts)
    with pytest.raises(ProtocolViolation, match="fewer than threshold"):
        clients10[ids[0]].masked_input(replay, np.zeros(16, np.uint32))
    assert clients10[ids[0]].stage == "SHARED"


@pytest.mark.parametrize("active", [False, True])
def test_a_corrupt_seed_share_is_corrected_and_its_holder_named(active: bool) -> None:
    setup, server, clients, reqs, ids = _to_stage_3(n=7, t=4, active=active)
    inputs = {i: np.full(16, 3 * i, np.uint32) for i in ids}
    liar = ids[1]

    def corrupt(replies):
        out = []
        for r in replies:
            if r.node_id == liar:  # every seed share it reveals is off by one
                bad = [_off_by(x, 1) for x in r.seed_shares]
                r = dataclasses.replace(r, seed_shares=bad)
            out.append(r)
        return out

    total = _rest(setup, server, clients, [clients[i].masked_input(reqs[i], inputs[i]) for i in ids],
                  tamper=corrupt)
    assert np.array_equal(total, _plain_sum(inputs, ids, 32))
    assert "wrong share of the self-mask seed" in server.failures[liar]


@pytest.mark.parametrize("active", [False, True])
def test_an_unrecoverable_corrupt_share_aborts_instead_of_a_wrong_sum(active: bool) -> None:
    # t = 4 of 5: with one holder silent and one lying there is no redundancy left to correct
    setup, server, clients, reqs, ids = _to_stage_3(n=5, t=4, active=active)
    inputs = {i: np.full(16, i, np.uint32) for i in ids}

    def corrupt(replies):
        replies = [r for r in replies if r.node_id != ids[4]]
        r0 = replies[0]
        bad = [_off_by(x, 7) for x in r0.seed_shares]
        return [dataclasses.replace(r0, seed_shares=bad), *replies[1:]]

    with pytest.raises(RoundAborted, match="not recoverable"):
        _rest(setup, server, clients, [clients[i].masked_input(reqs[i], inputs[i]) for i in ids],
              tamper=corrupt)


@pytest.mark.parametrize("active", [False, True])
def test_a_malformed_unmask_reply_drops_its_sender(active: bool) -> None:
    setup, server, clients, reqs, ids = _to_stage_3(n=7, t=4, active=active)
    inputs = {i: np.full(16, i, np.uint32) for i in ids}

    def garble(replies):
        r = replies[2]
        return [*replies[:2], dataclasses.replace(r, seed_shares=[b"x" * 3] * len(r.seed_owners)),
                *replies[3:]]

    total = _rest(setup, server, clients, [clients[i].masked_input(reqs[i], inputs[i]) for i in ids],
                  tamper=garble)
    assert np.array_equal(total, _plain_sum(inputs, ids, 32))
    assert "malformed" in server.failures[ids[2]]


# ------------------------------------------------------------------ refusals (semi-honest checks)
def test_refuses_both_shares_of_one_peer_across_requests() -> None:
    setup, server, clients, reqs, ids = _to_stage_3()
    victim, asked = ids[1], clients[ids[0]]
    asked.masked_input(reqs[ids[0]], np.zeros(16, np.uint32))
    first = asked.unmask(UnmaskRequest(round=9, survivors=ids, dropped=[]))
    assert victim in first.seed_owners
    lying = UnmaskRequest(round=9, survivors=[i for i in ids if i != victim], dropped=[victim])
    with pytest.raises(ProtocolViolation, match="both would unmask"):
        asked.unmask(lying)
    assert asked.unmask(UnmaskRequest(round=9, survivors=ids, dropped=[])).seed_owners == first.seed_owners


def test_refuses_contradicting_survivor_and_dropout_lists() -> None:
    setup, server, clients, reqs, ids = _to_stage_3()
    c = clients[ids[0]]
    c.masked_input(reqs[ids[0]], np.zeros(16, np.uint32))
    bad = [
        UnmaskRequest(round=9, survivors=ids, dropped=[ids[1]]),  # in both
        UnmaskRequest(round=9, survivors=ids[1:], dropped=[]),  # self missing
        UnmaskRequest(round=9, survivors=ids[:3], dropped=[]),  # peers unaccounted for
        UnmaskRequest(round=9, survivors=ids + [ids[0]], dropped=[]),  # repeated
    ]
    for req in bad:
        with pytest.raises(ProtocolViolation):
            c.unmask(req)
    assert c.revealed == {}


def test_refuses_unsafe_parameters_altered_roster_and_a_setup_below_its_own_floor() -> None:
    ids = list(range(8))
    unsafe = SetupRequest(round=1, threshold=4, degree=7, dim=4)
    clients = {i: ClientSession(node_id=i, setup=unsafe) for i in ids}
    adv = [c.advertise_keys() for c in clients.values()]
    roster = ServerSession(dataclasses.replace(unsafe, threshold=5)).receive_keys(adv)
    with pytest.raises(ProtocolViolation, match="unsafe round parameters"):
        clients[0].share_keys(roster)
    with pytest.raises(RoundAborted, match="threshold must be >"):
        ServerSession(unsafe).receive_keys(adv)
    honest = SetupRequest(round=1, threshold=5, degree=7, dim=4)
    c = ClientSession(node_id=0, setup=honest)
    a = c.advertise_keys()
    others = [ClientSession(node_id=i, setup=honest).advertise_keys() for i in ids[1:]]
    roster = ServerSession(honest).receive_keys([a, *others])
    for field, value in (("mask_publics", others[0].mask_public), ("sign_publics", others[0].sign_public),
                         ("seed_commitments", b"\0" * 32)):
        swapped = dataclasses.replace(roster, **{field: [value, *getattr(roster, field)[1:]]})
        with pytest.raises(ProtocolViolation):
            c.share_keys(swapped)
    assert c.stage == "ADVERTISED"
    # the client's own floor: colluders and the active schedule
    with pytest.raises(ProtocolViolation, match="colluding"):
        ClientSession(node_id=0, setup=honest, colluders=1)
    with pytest.raises(ProtocolViolation, match="semi-honest"):
        ClientSession(node_id=0, setup=honest, require_active=True)


# ------------------------------------------------------------------ the active schedule's checks
def _active_to_stage_4(n=9, t=5, degree=None, colluders=0, withhold=None):
    """A round to the consistency stage; ``withhold`` = (victim, kept senders) forwarded to the victim."""
    setup, server, clients, reqs, ids = _to_stage_3(n=n, t=t, active=True, colluders=colluders,
                                                    degree=degree)
    if withhold is not None:
        victim, keep = withhold
        r = reqs[victim]
        pos = [r.senders.index(j) for j in keep]
        reqs[victim] = dataclasses.replace(r, senders=[r.senders[p] for p in pos],
                                           ciphertexts=[r.ciphertexts[p] for p in pos])
    masked = {i: clients[i].masked_input(reqs[i], np.full(16, i, np.uint32)) for i in ids}
    return setup, server, clients, ids, masked


def _view(survivors, masked, dropped):
    return ConsistencyRequest(round=9, survivors=list(survivors), dropped=list(dropped),
                              peer_counts=[len(masked[u].peers) for u in survivors],
                              peer_flat=[j for u in survivors for j in masked[u].peers],
                              peer_signatures=[masked[u].signature for u in survivors])


def test_active_client_signs_only_a_consistent_view() -> None:
    setup, server, clients, ids, masked = _active_to_stage_4()
    honest = server.receive_masked(list(masked.values()))[ids[0]]
    c = clients[ids[0]]
    bad = {
        "self missing": _view(ids[1:], masked, [ids[0]]),
        "too few survivors": _view(ids[:4], masked, ids[4:]),
        "overlap": dataclasses.replace(honest, dropped=[ids[1]]),
        "dropped not the peers outside U3": dataclasses.replace(honest, dropped=[ids[1] + 100]),
        "a peer set altered": dataclasses.replace(honest, peer_flat=[*honest.peer_flat[:-1], ids[0]]),
        "a signature swapped": dataclasses.replace(
            honest, peer_signatures=[honest.peer_signatures[1], honest.peer_signatures[0],
                                     *honest.peer_signatures[2:]]),
        "another round": dataclasses.replace(honest, round=8),
    }
    for why, req in bad.items():
        with pytest.raises(ProtocolViolation):
            c.sign_view(req)
        assert c.stage == "MASKED", why
    sig = c.sign_view(honest)
    assert c.sign_view(honest) == sig  # a repeat gets the same signature
    other = _view(ids[:-1], masked, [ids[-1]])
    with pytest.raises(ProtocolViolation, match="already signed another view"):
        c.sign_view(other)


def test_active_client_refuses_a_view_with_one_sided_or_weakly_connected_edges() -> None:
    # the server forwards to the victim only t - 1 of its neighbours' shares
    n, t = 9, 5
    ids = list(range(10, 10 + n))
    victim, keep = ids[0], ids[1:t]
    setup, server, clients, ids, masked = _active_to_stage_4(n=n, t=t, withhold=(victim, keep))
    assert masked[victim].peers == keep
    full = _view(ids, masked, [])  # one-sided edges: the others masked with the victim
    with pytest.raises(ProtocolViolation, match="one-sided"):
        clients[ids[5]].sign_view(full)
    # calling the victim's peers dropped leaves the victim isolated among the survivors
    lying = _view([i for i in ids if i not in keep], masked, keep)
    with pytest.raises(ProtocolViolation):
        clients[ids[5]].sign_view(lying)
    # the honest server did not forward that way: it drops the victim (its reply does not match what
    # was forwarded to it) and the sum over the rest stays exact
    nxt = server.receive_masked(list(masked.values()))
    assert victim in server.failures and victim in server.dropped
    nxt = server.receive_consistency([clients[i].sign_view(r) for i, r in nxt.items()])
    total = server.receive_unmask([clients[i].unmask(r) for i, r in nxt.items()])
    assert np.array_equal(total, _plain_sum({i: np.full(16, i, np.uint32) for i in ids}, server.u3, 32))


def test_active_client_reveals_only_with_enough_valid_signatures_on_its_view() -> None:
    setup, server, clients, ids, masked = _active_to_stage_4()
    creq = server.receive_masked(list(masked.values()))
    sigs = {i: clients[i].sign_view(creq[i]) for i in ids}
    need = min_signers(len(ids))
    c = clients[ids[0]]
    good = server.receive_consistency(list(sigs.values()))[ids[0]]
    few = dataclasses.replace(good, signers=good.signers[: need - 1], signatures=good.signatures[: need - 1])
    forged = dataclasses.replace(good, signatures=[good.signatures[1], *good.signatures[1:]])
    repeated = dataclasses.replace(good, signers=[good.signers[0]] * need,
                                   signatures=[good.signatures[0]] * need)
    other_view = dataclasses.replace(good, survivors=good.survivors[:-1], dropped=[good.survivors[-1]])
    for req in (few, forged, repeated, other_view, UnmaskRequest(round=9, survivors=ids, dropped=[])):
        with pytest.raises(ProtocolViolation):
            c.unmask(req)
    assert c.revealed == {}
    assert c.unmask(good).seed_owners[0] == ids[0]


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(colluders=st.integers(1, 2), data=st.data())
def test_colluders_raise_every_threshold(colluders: int, data) -> None:
    n, k = 14, 6
    t = (k + 1 + colluders) // 2 + 1
    setup = SetupRequest(round=1, threshold=t, degree=k, dim=4, colluders=colluders, active=True)
    ids = list(range(n))
    drops = data.draw(st.dictionaries(st.sampled_from(ids), st.sampled_from(STAGES), max_size=2))
    try:
        total, server, _ = run_round(setup, {i: np.full(4, i, np.uint32) for i in ids}, drop_before=drops)
    except RoundAborted:
        return
    assert len(server.signers) >= min_signers(n, colluders=colluders)
    used = {u: {w for w in server._peers[u] if w in server.u3} for u in server.u3}
    from fedprivacy.secagg.graph import is_k_connected

    assert is_k_connected(set(server.u3), used, colluders + 1)
    assert int(total[0]) == sum(server.u3)
    from fedprivacy.secagg.graph import check_safe

    with pytest.raises(ValueError, match="threshold must be >"):
        check_safe(num_clients=n, degree=k, threshold=t - 1, colluders=colluders)


# ------------------------------------------------------------------ state and the round record
def _full_state_cycle(stage_index: int) -> None:
    setup = SetupRequest(round=3, threshold=4, degree=5, dim=8, active=True)
    ids = list(range(6))
    server = ServerSession(setup)
    clients = {i: ClientSession(node_id=i, setup=setup) for i in ids}

    def reload() -> None:
        for i in ids:
            state = clients[i].to_state()
            clients[i] = ClientSession.from_state(state)
            assert clients[i].to_state() == state

    inputs = {i: np.full(8, i + 1, np.uint32) for i in ids}
    steps = [
        lambda: server.receive_keys([clients[i].advertise_keys() for i in ids]),
        lambda r: server.receive_shares([clients[i].share_keys(r) for i in ids]),
        lambda r: server.receive_masked([clients[i].masked_input(r[i], inputs[i]) for i in ids]),
        lambda r: server.receive_consistency([clients[i].sign_view(r[i]) for i in ids]),
        lambda r: server.receive_unmask([clients[i].unmask(r[i]) for i in ids]),
    ]
    out = None
    for j, step in enumerate(steps):
        if j == stage_index:
            reload()
        out = step() if j == 0 else step(out)
    assert np.array_equal(out, _plain_sum(inputs, ids, 32))


@pytest.mark.parametrize("stage_index", range(5))
def test_a_session_saved_and_restored_at_any_stage_finishes_the_round(stage_index: int) -> None:
    _full_state_cycle(stage_index)


def test_to_state_covers_every_field_of_the_session() -> None:
    setup = SetupRequest(round=3, threshold=4, degree=5, dim=8, active=True)
    _, _, clients, _, _ = _to_stage_3(n=6, t=4, active=True)
    c = next(iter(clients.values()))
    state = c.to_state()
    roots = {k.split(".")[0] for k in state}
    for slot in ClientSession.__slots__:
        if slot in ClientSession.DERIVED:
            continue
        assert slot.lstrip("_") in roots or slot.lstrip("_").rstrip("s") in {r.rstrip("s") for r in roots}, slot
    assert all(isinstance(v, int | bool | str | bytes | list) for v in state.values())
    # a malformed state is refused, naming the field
    with pytest.raises(TypeError, match="peers"):
        ClientSession.from_state({**state, "peers": ["x"]})
    wrong = ClientSession(node_id=0, setup=setup).to_state()
    with pytest.raises(ValueError, match="does not match"):
        ClientSession.from_state({**state, "enc.private": wrong["enc.private"]})


def test_round_log_refuses_a_round_twice_or_out_of_order() -> None:
    log = RoundLog()
    setup = SetupRequest(round=4, threshold=2, degree=2, dim=4)
    first = ClientSession(node_id=1, setup=setup)
    first.advertise_keys(log=log)
    again = ClientSession(node_id=1, setup=setup)
    with pytest.raises(ProtocolViolation, match="twice"):
        again.advertise_keys(log=log)
    assert again.stage == "NEW" and log.last_round == 4
    with pytest.raises(ProtocolViolation):
        ClientSession(node_id=1, setup=dataclasses.replace(setup, round=3)).advertise_keys(log=log)
    ClientSession(node_id=1, setup=dataclasses.replace(setup, round=5)).advertise_keys(log=log)
    assert RoundLog.from_state(log.to_state()).last_round == 5


# ------------------------------------------------------------------ what the server sees
def _chi2_high_bits(values: np.ndarray, bits: int) -> float:
    top = (values >> np.uint32(bits - 8)).astype(np.int64)
    counts = np.bincount(top, minlength=256)
    return float(chisquare(counts).pvalue)


def test_everything_the_server_saw_leaves_an_honest_input_uniform() -> None:
    n, bits, dim = 6, 24, 40_000
    ids = list(range(1, n + 1))
    setup = SetupRequest(round=4, threshold=4, degree=n - 1, modulus_bits=bits, dim=dim, active=True)
    inputs = {i: np.full(dim, 7, dtype=np.uint32) for i in ids}  # maximally non-uniform inputs
    transcript: list = []
    total, server, _ = run_round(setup, inputs, drop_before={ids[-1]: "masked"}, transcript=transcript)
    honest = ids[0]
    y = next(m.masked for m in transcript if isinstance(m, MaskedInput) and m.node_id == honest)
    # the server learns honest's self-mask seed from the unmask replies: remove it; what remains
    # is the input plus the pairwise masks with the surviving peers, whose keys stay secret
    x_of = {i: k + 1 for k, i in enumerate(sorted(ids))}  # abscissa: position in the sorted roster
    pts = [(x_of[m.node_id], shamir.decode_shares(sh, num_secrets=1, secret_bytes=32))
           for m in transcript if isinstance(m, UnmaskResponse)
           for o, sh in zip(m.seed_owners, m.seed_shares, strict=True) if o == honest][:4]
    seed = shamir.reconstruct_secrets(np.asarray([[x for x, _ in pts]], dtype=np.uint64),
                                      np.asarray([[v for _, v in pts]]), secret_bytes=32)[0][0]
    residual = (y - expand_mask(seed, dim=dim, modulus_bits=bits)) & np.uint32(2**bits - 1)
    assert _chi2_high_bits(y, bits) > 1e-4
    assert _chi2_high_bits(residual, bits) > 1e-4
    # negative control: without the remaining pairwise masks the residual is the input itself
    assert _chi2_high_bits(inputs[honest], bits) < 1e-10
    assert np.array_equal(total, _plain_sum(inputs, ids[:-1], bits))


def test_no_secret_in_reprs_of_sessions_and_messages() -> None:
    setup, server, clients, reqs, ids = _to_stage_3()
    c = clients[ids[0]]
    c.masked_input(reqs[ids[0]], np.zeros(16, np.uint32))
    resp = c.unmask(UnmaskRequest(round=9, survivors=ids, dropped=[]))
    state = c.to_state()
    secrets_hex = [state[k].hex() for k in ("seed", "mask.private", "enc.private", "sign")]
    secrets_hex += [sh.hex() for sh in resp.seed_shares]
    text = " ".join([repr(c), repr(server), repr(resp), str(resp)])
    for h in secrets_hex:
        assert h not in text and h[:16] not in text


# ------------------------------------------------------------------ dropout model (semi-honest rules)
def _predicted_abort(nb, dropped, t) -> bool:
    if not is_connected({i for i in nb if i not in dropped}, nb):
        return True
    for i, ns in nb.items():
        alive = sum(1 for j in ns if j not in dropped)
        if i in dropped and any(u not in dropped for u in ns) and alive < t:
            return True
        if i not in dropped and alive + 1 < t:
            return True
    return False


def _graph_of(setup, transcript):
    roster = next(m for m in transcript if type(m).__name__ == "ShareKeysRequest")
    return harary_neighbours(roster.node_ids, degree=setup.degree, seed=world_id(setup, roster))


def test_abort_probability_bound_and_failure_model_match_the_protocol() -> None:
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.secagg.graph import abort_probability_bound

    n, k, t, p = 16, 4, 3, 0.2
    ids = list(range(n))
    rng = RandomSource.seeded(9)
    nb = harary_neighbours(ids, degree=k, seed=b"g" * 32)
    trials = 4000
    drops = rng.bernoulli(p, size=(trials, n))
    aborts = sum(_predicted_abort(nb, {i for i in ids if row[i]}, t) for row in drops)
    bound = abort_probability_bound(num_clients=n, degree=k, threshold=t, dropout=p)
    assert aborts / trials <= bound + 3 * math.sqrt(bound / trials)
    assert aborts > 0  # the model is not vacuous at these parameters
    # the semi-honest protocol aborts exactly when the model predicts it (first 12 drop patterns)
    setup = SetupRequest(round=1, threshold=t, degree=k, dim=4)
    inputs = {i: np.zeros(4, np.uint32) for i in ids}
    checked = 0
    for row in drops[:60]:
        dropped = {i for i in ids if row[i]}
        if n - len(dropped) < t:
            continue
        transcript: list = []
        try:
            run_round(setup, inputs, drop_before={i: "masked" for i in dropped}, transcript=transcript)
            aborted = False
        except RoundAborted:
            aborted = True
        assert aborted == _predicted_abort(_graph_of(setup, transcript), dropped, t)
        checked += 1
        if checked == 12:
            break


def test_refuses_a_survivor_list_that_splits_the_masking_graph() -> None:
    n, k, t = 12, 4, 3
    ids = list(range(n))
    setup = SetupRequest(round=3, threshold=t, degree=k, dim=4)
    server = ServerSession(setup)
    clients = {i: ClientSession(node_id=i, setup=setup) for i in ids}
    transcript = [server.receive_keys([c.advertise_keys() for c in clients.values()])]
    reqs = server.receive_shares([clients[i].share_keys(transcript[0]) for i in ids])
    for i in ids:
        clients[i].masked_input(reqs[i], np.zeros(4, np.uint32))
    nb = _graph_of(setup, transcript)
    cut = next(set(c) for c in itertools.combinations(ids, 4) if not is_connected(set(ids) - set(c), nb))
    survivors = [i for i in ids if i not in cut]
    victim = survivors[0]
    with pytest.raises(ProtocolViolation, match="disconnected"):
        clients[victim].unmask(UnmaskRequest(round=3, survivors=survivors, dropped=sorted(cut)))
    assert clients[victim].revealed == {}
