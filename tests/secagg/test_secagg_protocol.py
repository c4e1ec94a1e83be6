"""End-to-end SecAgg+ rounds: exact sums under dropouts, aborts, and a dishonest server refused."""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from fedprivacy.secagg import shamir
from fedprivacy.secagg.keys import SealError
from fedprivacy.secagg.local import STAGES, run_round
from fedprivacy.secagg.prg import expand_mask
from fedprivacy.secagg.protocol import (
    ClientSession,
    MaskedInput,
    MaskedInputRequest,
    ProtocolViolation,
    RoundAborted,
    ServerSession,
    SetupRequest,
    UnmaskRequest,
    UnmaskResponse,
)


def _inputs(ids, dim, bits, seed=0):
    gen = np.random.default_rng(seed)  # test data only, not masks or noise
    return {i: gen.integers(0, 2**bits, dim).astype(np.uint32) for i in ids}


def _plain_sum(inputs, ids, bits):
    total = np.zeros(next(iter(inputs.values())).shape, dtype=np.uint64)
    for i in ids:
        total += inputs[i]
    return (total % (2**bits)).astype(np.uint32)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(4, 9), bits=st.integers(16, 32), data=st.data())
def test_complete_graph_exact_sum_iff_at_least_t_survive(n: int, bits: int, data) -> None:
    t = n // 2 + 1
    ids = data.draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n, unique=True))
    drops = data.draw(st.dictionaries(st.sampled_from(ids), st.sampled_from(STAGES), max_size=n))
    setup = SetupRequest(round=5, threshold=t, degree=n - 1, modulus_bits=bits, dim=50)
    inputs = _inputs(ids, 50, bits)
    # who uploads a masked input: alive before "masked"
    uploaders = [i for i in ids if drops.get(i) not in ("advertise", "share", "masked")]
    early_alive = [i for i in ids if drops.get(i) not in ("advertise", "share")]
    answering = [i for i in uploaders if drops.get(i) != "unmask"]
    if len(early_alive) >= t and len(uploaders) >= t and len(answering) >= t:
        total, server, _ = run_round(setup, inputs, drop_before=drops)
        assert set(server.u3) == set(uploaders)
        assert np.array_equal(total, _plain_sum(inputs, uploaders, bits))
    else:
        with pytest.raises(RoundAborted):
            run_round(setup, inputs, drop_before=drops)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_sparse_graph_exact_sum_with_dropouts(data) -> None:
    n, k, t = 16, 6, 4
    ids = list(range(1, n + 1))
    drops = data.draw(st.dictionaries(st.sampled_from(ids), st.sampled_from(STAGES), max_size=3))
    setup = SetupRequest(round=1, threshold=t, degree=k, modulus_bits=32, dim=64)
    inputs = _inputs(ids, 64, 32, seed=1)
    try:
        total, server, _ = run_round(setup, inputs, drop_before=drops)
    except RoundAborted:  # a neighbourhood lost too many members: allowed, but only then
        return
    assert np.array_equal(total, _plain_sum(inputs, server.u3, 32))
    assert set(server.u3) == {i for i in ids if drops.get(i) not in ("advertise", "share", "masked")}


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
    assert clients[0]._revealed == {}


# ------------------------------------------------------------------ a dishonest server
def _to_stage_3(n=5, t=3, round_=9, dim=16):
    ids = list(range(10, 10 + n))
    setup = SetupRequest(round=round_, threshold=t, degree=n - 1, dim=dim)
    server = ServerSession(setup)
    clients = {i: ClientSession(node_id=i, setup=setup) for i in ids}
    roster = server.receive_keys([c.advertise_keys() for c in clients.values()])
    reqs = server.receive_shares([clients[i].share_keys(roster) for i in ids])
    return setup, server, clients, reqs, ids


def test_refuses_both_shares_of_one_peer_across_requests() -> None:
    setup, server, clients, reqs, ids = _to_stage_3()
    victim, asked = ids[1], clients[ids[0]]
    asked.masked_input(reqs[ids[0]], np.zeros(16, np.uint32))
    first = asked.unmask(UnmaskRequest(round=9, survivors=ids, dropped=[]))
    assert victim in first.seed_owners
    lying = UnmaskRequest(round=9, survivors=[i for i in ids if i != victim], dropped=[victim])
    with pytest.raises(ProtocolViolation, match="both would unmask"):
        asked.unmask(lying)
    # a repeat of the honest request is answered consistently
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
    assert c._revealed == {}


def test_refuses_replay_from_another_round() -> None:
    setup, server, clients, reqs, ids = _to_stage_3(round_=9)
    c = clients[ids[0]]
    with pytest.raises(ProtocolViolation, match="round 8"):
        c.masked_input(dataclasses.replace(reqs[ids[0]], round=8), np.zeros(16, np.uint32))
    # ciphertexts of round 9 replayed into a round-10 session of the same nodes
    _, _, clients10, reqs10, _ = _to_stage_3(round_=10)
    replay = MaskedInputRequest(round=10, senders=reqs[ids[0]].senders,
                                ciphertexts=reqs[ids[0]].ciphertexts)
    with pytest.raises(SealError):
        clients10[ids[0]].masked_input(replay, np.zeros(16, np.uint32))


def test_refuses_tampered_ciphertext() -> None:
    setup, server, clients, reqs, ids = _to_stage_3()
    req = reqs[ids[0]]
    cts = list(req.ciphertexts)
    flipped = bytearray(cts[1])
    flipped[20] ^= 0x40
    cts[1] = bytes(flipped)
    with pytest.raises(SealError):
        clients[ids[0]].masked_input(dataclasses.replace(req, ciphertexts=cts),
                                     np.zeros(16, np.uint32))
    # swapping senders (misrouting) also fails authentication
    swapped = dataclasses.replace(req, ciphertexts=[req.ciphertexts[1], req.ciphertexts[0],
                                                    *req.ciphertexts[2:]])
    with pytest.raises(SealError):
        clients[ids[0]].masked_input(swapped, np.zeros(16, np.uint32))
    assert clients[ids[0]].stage == "SHARED"


def test_server_refuses_masked_vectors_of_wrong_length_dtype_or_range() -> None:
    ids = list(range(5))
    setup = SetupRequest(round=1, threshold=3, degree=4, dim=16, modulus_bits=20)
    server = ServerSession(setup)
    clients = {i: ClientSession(node_id=i, setup=setup) for i in ids}
    roster = server.receive_keys([c.advertise_keys() for c in clients.values()])
    reqs = server.receive_shares([clients[i].share_keys(roster) for i in ids])
    good = [clients[i].masked_input(reqs[i], np.zeros(16, np.uint32)) for i in ids]
    for bad in (np.zeros(15, np.uint32), np.zeros(16, np.int64), np.zeros(16, np.float32),
                np.full(16, 2**20, np.uint32)):
        msgs = [*good[:-1], MaskedInput(round=1, node_id=ids[-1], masked=bad)]
        with pytest.raises(ProtocolViolation):
            server.receive_masked(msgs)
    assert server.stage == "SHARED"
    server.receive_masked(good)  # the session was left unchanged by the refusals


def test_refuses_unsafe_graph_threshold_and_altered_roster() -> None:
    ids = list(range(8))
    # threshold 4 with 7 neighbours (8 holders): a lying server could collect both share sets
    unsafe = SetupRequest(round=1, threshold=4, degree=7, dim=4)
    clients = {i: ClientSession(node_id=i, setup=unsafe) for i in ids}
    adv = [c.advertise_keys() for c in clients.values()]
    safe_server = ServerSession(dataclasses.replace(unsafe, threshold=5))
    roster = safe_server.receive_keys(adv)
    with pytest.raises(ProtocolViolation, match="unsafe round parameters"):
        clients[0].share_keys(roster)
    with pytest.raises(RoundAborted, match="threshold must be >"):
        ServerSession(unsafe).receive_keys(adv)
    honest = SetupRequest(round=1, threshold=5, degree=7, dim=4)
    c = ClientSession(node_id=0, setup=honest)
    a = c.advertise_keys()
    others = [ClientSession(node_id=i, setup=honest).advertise_keys() for i in ids[1:]]
    roster = ServerSession(honest).receive_keys([a, *others])
    swapped = dataclasses.replace(roster, mask_publics=[others[0].mask_public,
                                                        *roster.mask_publics[1:]])
    with pytest.raises(ProtocolViolation):
        c.share_keys(swapped)
    assert c.stage == "ADVERTISED"


def test_server_refuses_shares_sent_outside_the_graph() -> None:
    ids = list(range(12))
    setup = SetupRequest(round=1, threshold=3, degree=4, dim=4)
    server = ServerSession(setup)
    clients = {i: ClientSession(node_id=i, setup=setup) for i in ids}
    roster = server.receive_keys([c.advertise_keys() for c in clients.values()])
    shared = [clients[i].share_keys(roster) for i in ids]
    bad = dataclasses.replace(shared[0], receivers=[r + 100 for r in shared[0].receivers])
    with pytest.raises(ProtocolViolation, match="non-neighbours"):
        server.receive_shares([bad, *shared[1:]])


# ------------------------------------------------------------------ what the server sees
def _chi2_high_bits(values: np.ndarray, bits: int) -> float:
    top = (values >> np.uint32(bits - 8)).astype(np.int64)
    counts = np.bincount(top, minlength=256)
    return float(chisquare(counts).pvalue)


def test_everything_the_server_saw_leaves_an_honest_input_uniform() -> None:
    n, bits, dim = 6, 24, 40_000
    ids = list(range(1, n + 1))
    setup = SetupRequest(round=4, threshold=4, degree=n - 1, modulus_bits=bits, dim=dim)
    inputs = {i: np.full(dim, 7, dtype=np.uint32) for i in ids}  # maximally non-uniform inputs
    transcript: list = []
    total, server, _ = run_round(setup, inputs, drop_before={ids[-1]: "masked"},
                                 transcript=transcript)
    honest = ids[0]
    y = next(m.masked for m in transcript if isinstance(m, MaskedInput) and m.node_id == honest)
    # the server learns honest's self-mask seed from the unmask replies: remove it; what remains
    # is the input plus the pairwise masks with the surviving peers, whose keys stay secret
    pts = [(m.node_id + 1, shamir.decode_share(sh)) for m in transcript
           if isinstance(m, UnmaskResponse)
           for o, sh in zip(m.seed_owners, m.seed_shares, strict=True) if o == honest]
    seed = shamir.reconstruct(pts, threshold=4).to_bytes(32, "big")
    residual = (y - expand_mask(seed, dim=dim, modulus_bits=bits)) & np.uint32(2**bits - 1)
    assert _chi2_high_bits(y, bits) > 1e-4
    assert _chi2_high_bits(residual, bits) > 1e-4
    # negative control: without the remaining pairwise masks the residual is the input itself
    assert _chi2_high_bits(inputs[honest], bits) < 1e-10
    # and the sum is still exact
    assert np.array_equal(total, _plain_sum(inputs, ids[:-1], bits))


def test_no_secret_in_reprs_of_sessions_and_messages() -> None:
    setup, server, clients, reqs, ids = _to_stage_3()
    c = clients[ids[0]]
    c.masked_input(reqs[ids[0]], np.zeros(16, np.uint32))
    resp = c.unmask(UnmaskRequest(round=9, survivors=ids, dropped=[]))
    secrets_hex = [c._seed.reveal().hex(), c._mask.private.reveal().hex(), c._enc.private.reveal().hex()]
    secrets_hex += [sh.hex() for sh in resp.seed_shares]
    text = " ".join([repr(c), repr(server), repr(resp), str(resp), repr(c._mask), repr(c._seed)])
    for h in secrets_hex:
        assert h not in text and h[:16] not in text


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
    setup = SetupRequest(round=1, threshold=4, degree=n - 1, modulus_bits=bits, dim=dim)
    total, server, _ = run_round(setup, enc, drop_before={6: "masked"})
    got = decode_fixed_point(total, scale=scale, modulus_bits=bits)
    clipped = [f * min(1.0, clip / np.linalg.norm(f)) for f in floats.values()]
    plain = sum(clipped[i] for i in server.u3)
    assert np.max(np.abs(got - plain)) < len(server.u3) / scale


def _predicted_abort(nb, dropped, t) -> bool:
    from fedprivacy.secagg.graph import is_connected

    if not is_connected({i for i in nb if i not in dropped}, nb):
        return True
    for i, ns in nb.items():
        alive = sum(1 for j in ns if j not in dropped)
        if i in dropped and any(u not in dropped for u in ns) and alive < t:
            return True
        if i not in dropped and alive + 1 < t:
            return True
    return False


def test_abort_probability_bound_and_failure_model_match_the_protocol() -> None:
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.secagg.graph import abort_probability_bound, graph_seed, harary_neighbours

    n, k, t, p = 16, 4, 3, 0.2
    ids = list(range(n))
    rng = RandomSource.seeded(9)
    seed = b"g" * 32
    nb = harary_neighbours(ids, degree=k, seed=seed)
    trials = 4000
    drops = rng.bernoulli(p, size=(trials, n))
    aborts = sum(_predicted_abort(nb, {i for i in ids if row[i]}, t) for row in drops)
    bound = abort_probability_bound(num_clients=n, degree=k, threshold=t, dropout=p)
    assert aborts / trials <= bound + 3 * math.sqrt(bound / trials)
    assert aborts > 0  # the model is not vacuous at these parameters
    # the protocol aborts exactly when the model predicts it (first 12 drop patterns)
    setup = SetupRequest(round=1, threshold=t, degree=k, dim=4)
    inputs = {i: np.zeros(4, np.uint32) for i in ids}
    checked = 0
    for row in drops[:60]:
        dropped = {i for i in ids if row[i]}
        if n - len(dropped) < t:
            continue
        # run_round derives the graph from the real keys: recompute the model on that graph
        transcript: list = []
        try:
            run_round(setup, inputs, drop_before={i: "masked" for i in dropped}, transcript=transcript)
            aborted = False
        except RoundAborted:
            aborted = True
        roster = next(m for m in transcript if type(m).__name__ == "ShareKeysRequest")
        entries = list(zip(roster.node_ids, roster.enc_publics, roster.mask_publics, strict=True))
        real_nb = harary_neighbours(ids, degree=k, seed=graph_seed(round=1, roster=entries))
        assert aborted == _predicted_abort(real_nb, dropped, t)
        checked += 1
        if checked == 12:
            break


def test_refuses_a_survivor_list_that_splits_the_masking_graph() -> None:
    import itertools

    from fedprivacy.secagg.graph import graph_seed, harary_neighbours, is_connected

    n, k, t = 12, 4, 3
    ids = list(range(n))
    setup = SetupRequest(round=3, threshold=t, degree=k, dim=4)
    server = ServerSession(setup)
    clients = {i: ClientSession(node_id=i, setup=setup) for i in ids}
    roster = server.receive_keys([c.advertise_keys() for c in clients.values()])
    reqs = server.receive_shares([clients[i].share_keys(roster) for i in ids])
    for i in ids:
        clients[i].masked_input(reqs[i], np.zeros(4, np.uint32))
    entries = list(zip(roster.node_ids, roster.enc_publics, roster.mask_publics, strict=True))
    nb = harary_neighbours(ids, degree=k, seed=graph_seed(round=3, roster=entries))
    cut = next(set(c) for c in itertools.combinations(ids, 4)
               if not is_connected(set(ids) - set(c), nb))
    survivors = [i for i in ids if i not in cut]
    victim = survivors[0]
    with pytest.raises(ProtocolViolation, match="disconnected"):
        clients[victim].unmask(UnmaskRequest(round=3, survivors=survivors, dropped=sorted(cut)))
    assert clients[victim]._revealed == {}
    # the honest server aborts such a round itself, before asking for any share
    fresh = ServerSession(setup)
    cl2 = {i: ClientSession(node_id=i, setup=setup) for i in ids}
    r2 = fresh.receive_keys([c.advertise_keys() for c in cl2.values()])
    q2 = fresh.receive_shares([cl2[i].share_keys(r2) for i in ids])
    e2 = list(zip(r2.node_ids, r2.enc_publics, r2.mask_publics, strict=True))
    nb2 = harary_neighbours(ids, degree=k, seed=graph_seed(round=3, roster=e2))
    cut2 = next(set(c) for c in itertools.combinations(ids, 4)
                if not is_connected(set(ids) - set(c), nb2))
    masked = [cl2[i].masked_input(q2[i], np.zeros(4, np.uint32)) for i in ids if i not in cut2]
    with pytest.raises(RoundAborted, match="disconnected"):
        fresh.receive_masked(masked)


def test_pipelined_rounds_follow_the_two_exchange_schedule() -> None:
    """Round r+1's advertise rides with round r-1's unmask exchange and its shares with round r's
    masked-input exchange (docs/SECAGG.md); every round's sum stays exact."""
    ids = list(range(6))
    setups = {r: SetupRequest(round=r, threshold=4, degree=5, dim=8) for r in (1, 2, 3)}
    servers = {r: ServerSession(setups[r]) for r in setups}
    clients = {r: {i: ClientSession(node_id=i, setup=setups[r]) for i in ids} for r in setups}
    inputs = {r: {i: np.full(8, 10 * r + i, np.uint32) for i in ids} for r in setups}
    # warm-up: rounds 1 and 2 advertise, round 1 shares
    rosters = {r: servers[r].receive_keys([c.advertise_keys() for c in clients[r].values()])
               for r in (1, 2)}
    mreq = {1: servers[1].receive_shares([clients[1][i].share_keys(rosters[1]) for i in ids])}
    for r in (1, 2):
        # exchange A_r: masked input r together with shares of r+1
        masked = [clients[r][i].masked_input(mreq[r][i], inputs[r][i]) for i in ids]
        if r + 1 in rosters:
            mreq[r + 1] = servers[r + 1].receive_shares(
                [clients[r + 1][i].share_keys(rosters[r + 1]) for i in ids])
        ureq = servers[r].receive_masked(masked)
        # exchange B_r: unmask r together with advertise of r+2
        replies = [clients[r][i].unmask(ureq[i]) for i in ids]
        if r + 2 in setups:
            rosters[r + 2] = servers[r + 2].receive_keys(
                [c.advertise_keys() for c in clients[r + 2].values()])
        total = servers[r].receive_unmask(replies)
        assert np.array_equal(total, _plain_sum(inputs[r], ids, 32))
    assert servers[3].stage == "SHARED"  # round 3 is ready for its masked-input exchange
