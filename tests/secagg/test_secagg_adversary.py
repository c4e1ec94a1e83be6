"""A malicious server against the protocol: it chooses every message, and then solves for
what it can (``adversary.learnable_sums``). Every attack either aborts with nothing revealed or reveals
only the sum of at least ``required_survivors - colluders`` honest survivors, one sum per round.

Negative controls show the harness finds real attacks: the same schedules against the semi-honest
schedule reconstruct the victim's input exactly.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import numpy as np
import pytest
from adversary import MaliciousServer, learnable_sums
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fedprivacy.secagg.client_session import ClientSession
from fedprivacy.secagg.graph import check_safe, effective_degree, min_safe_threshold
from fedprivacy.secagg.messages import (
    MaskedInputRequest,
    ProtocolViolation,
    SetupRequest,
    UnmaskRequest,
)
from fedprivacy.secagg.server_session import ServerSession
from fedprivacy.secagg.session_state import RoundLog


def _inputs(ids, dim=6, bits=32, seed=0):
    gen = np.random.default_rng(seed)  # test data only
    return {i: gen.integers(0, 2**bits, dim).astype(np.uint32) for i in ids}


def assert_reveals_only_allowed_sums(adv: MaliciousServer) -> list:
    """The active schedule's guarantee, as an assertion on what the attacker can solve for."""
    findings = learnable_sums(adv)
    allowed = adv.setup.required_survivors - adv.setup.colluders
    for f in findings:
        assert np.array_equal(f.estimate, f.truth)  # a finding is a demonstrated reconstruction
        assert len(f.members) >= allowed, (sorted(f.members), allowed, adv.refusals)
    per_world = Counter(adv.worlds[min(f.members)] for f in findings)
    assert all(v == 1 for v in per_world.values()), per_world
    if adv.noise_design is not None:  # XNoise: every solvable sum keeps at least the target noise
        for f in findings:
            target = adv.components[min(f.members)].design.total_variance
            assert f.noise_variance >= target * (1 - 1e-9), (f.noise_variance, target)
    return findings


def _isolate(adv: MaliciousServer, victim: int, keep: list[int], *, split_stories: bool,
             symmetric: bool = False) -> None:
    """The victim gets t-1 share sets; its peers are called dropped. ``symmetric``:
    the victim's shares also reach only those t-1 peers (so every edge left is mutual)."""
    ids = sorted(adv.inputs)
    adv.stage_advertise()
    adv.stage_share({i: ids for i in ids})
    forward = {i: [j for j in ids if (j, i) in adv.cts] for i in ids}
    forward[victim] = keep
    if symmetric:
        for i in ids:
            if i not in keep and i != victim:
                forward[i] = [j for j in forward[i] if j != victim]
    adv.stage_masked(forward)
    up = sorted(adv.masked)
    alive = [i for i in up if i not in keep]
    if adv.setup.active:
        story_a = adv.view(up)  # everyone survived (the victim's peers protect it)
        story_b = adv.view(alive)  # the victim's peers dropped
        view_of = {i: (story_a if split_stories and i in keep else story_b) for i in up}
        adv.stage_consistency(view_of)
        adv.stage_unmask([(i, req) for i in up if (req := adv.certificate(i)) is not None])
        # and every uncertified request too
        adv.stage_unmask([(i, UnmaskRequest(round=adv.setup.round, survivors=alive, dropped=keep))
                          for i in alive])
    else:  # each peer hears that it survived and the other peers dropped
        stories = {i: (alive, keep) for i in alive}
        stories.update({j: (sorted({*alive, j}), [p for p in keep if p != j]) for j in keep})
        adv.stage_unmask([(i, UnmaskRequest(round=adv.setup.round, survivors=s, dropped=d))
                          for i, (s, d) in stories.items()])


# ------------------------------------------------------------------ item 1, both graphs
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("active", [False, True])
def test_item1_victim_masked_with_t_minus_1_peers_called_dropped(active: bool, symmetric: bool) -> None:
    n, t = 9, 5  # complete graph, n >= 2t - 1: the same story for every holder
    ids = list(range(n))
    setup = SetupRequest(round=3, threshold=t, degree=n - 1, dim=6, active=active)
    adv = MaliciousServer(setup=setup, inputs=_inputs(ids), colluders=frozenset())
    victim, keep = 0, [1, 2, 3, 4]
    _isolate(adv, victim, keep, split_stories=False, symmetric=symmetric)
    findings = learnable_sums(adv)
    if not active:  # negative control: the semi-honest schedule leaks the victim's input exactly
        leak = [f for f in findings if f.members == {victim}]
        assert leak and np.array_equal(leak[0].estimate, adv.inputs[victim])
    else:
        assert findings == [] or assert_reveals_only_allowed_sums(adv)
        assert adv.clients[victim].revealed == {}


@pytest.mark.parametrize("active", [False, True])
def test_item1_on_a_sparse_graph_with_different_stories_to_different_holders(active: bool) -> None:
    n, k = 40, 9
    t = min_safe_threshold(k)
    ids = list(range(n))
    setup = SetupRequest(round=4, threshold=t, degree=k, dim=6, active=active)
    adv = MaliciousServer(setup=setup, inputs=_inputs(ids, seed=2), colluders=frozenset())
    adv.stage_advertise()
    adv.stage_share({i: ids for i in ids})
    victim = 0
    nb = adv.clients[victim].to_state()["neighbours"]
    keep = nb[: t - 1]
    forward = {i: [j for j in ids if (j, i) in adv.cts] for i in ids}
    forward[victim] = keep
    adv.stage_masked(forward)
    up = sorted(adv.masked)
    alive = [i for i in up if i not in keep]
    # the story for each holder: the victim's peers dropped, except the one asked, which "survived"
    stories = {i: (alive, keep) for i in alive}
    stories.update({j: (sorted({*alive, j}), [p for p in keep if p != j]) for j in keep})
    if active:
        adv.stage_consistency({i: adv.view(s, d) for i, (s, d) in stories.items()})
        adv.stage_consistency({i: adv.view(up) for i in up if i not in adv.client_view})
        adv.stage_unmask([(i, req) for i in up if (req := adv.certificate(i)) is not None])
        # and each story under whatever certificate the holder signed
        adv.stage_unmask([(i, dataclasses.replace(req, survivors=s, dropped=d)) for i, (s, d) in stories.items()
                          if (req := adv.certificate(i)) is not None])
        assert_reveals_only_allowed_sums(adv)
        assert not any(victim in f.members and len(f.members) < t for f in learnable_sums(adv))
    else:
        adv.stage_unmask([(i, UnmaskRequest(round=4, survivors=s, dropped=d)) for i, (s, d) in stories.items()])
        leak = [f for f in learnable_sums(adv) if victim in f.members]
        assert leak and leak[0].members == {victim}
        assert np.array_equal(leak[0].estimate, adv.inputs[victim])


def test_a_certificate_does_not_authorise_other_survivor_lists() -> None:
    """Every holder signs the honest view; then each is told "only the victim and you survived"
    under that certificate. Semi-honest checks alone would let this isolate the victim."""
    n, t = 9, 5
    ids = list(range(n))
    setup = SetupRequest(round=3, threshold=t, degree=n - 1, dim=6, active=True)
    adv = MaliciousServer(setup=setup, inputs=_inputs(ids, seed=5), colluders=frozenset())
    adv.honest_until_masked()
    adv.stage_consistency({i: adv.view(ids) for i in ids})
    victim = 0
    reqs = []
    for i in ids:
        cert = adv.certificate(i)
        assert cert is not None and len(cert.signers) == n
        surv = sorted({victim, i})
        reqs.append((i, dataclasses.replace(cert, survivors=surv, dropped=[u for u in ids if u not in surv])))
    adv.stage_unmask(reqs)
    assert len(adv.refusals) == n
    adv.stage_unmask([(i, adv.certificate(i)) for i in ids])  # the certified view is still answered
    (finding,) = assert_reveals_only_allowed_sums(adv)
    assert finding.members == set(ids)


# ------------------------------------------------------------------ item 5: colluders
def test_item5_two_colluding_neighbours_are_refused_by_the_degree_rule() -> None:
    # n = 10, k = 2, t = 3 with 2 colluders: both neighbours of a client may collude
    with pytest.raises(ValueError, match="degree must be > colluders"):
        check_safe(num_clients=10, degree=2, threshold=3, colluders=2)
    setup = SetupRequest(round=1, threshold=3, degree=2, dim=4, colluders=2, active=True)
    clients = {i: ClientSession(node_id=i, setup=setup, colluders=2) for i in range(10)}
    server = ServerSession(setup)
    with pytest.raises(Exception, match="degree must be > colluders"):
        server.receive_keys([c.advertise_keys() for c in clients.values()])


@pytest.mark.parametrize("xnoise", [False, True])
@pytest.mark.parametrize("colluders", [1, 2])
def test_colluders_with_the_server_learn_only_the_honest_survivors_sum(colluders: int, xnoise: bool) -> None:
    from fedprivacy.accounting.xnoise_design import XNoiseDesign

    n, k = 14, 6
    t = min_safe_threshold(k, colluders=colluders)
    ids = list(range(n))
    setup = SetupRequest(round=2, threshold=t, degree=k, dim=6, colluders=colluders, active=True)
    noise = (lambda r: XNoiseDesign(total_variance=1e4, roster=r, min_survivors=t, colluders=colluders)
             ) if xnoise else None
    adv = MaliciousServer(setup=setup, inputs=_inputs(ids, seed=3),
                          colluders=frozenset(ids[:colluders]), noise_design=noise)
    adv.honest_until_masked()
    up = sorted(adv.masked)
    adv.stage_consistency({i: adv.view(up) for i in up})
    adv.stage_unmask([(i, req) for i in up if (req := adv.certificate(i)) is not None])
    (finding,) = assert_reveals_only_allowed_sums(adv)
    assert finding.members == set(ids) - set(ids[:colluders])  # exactly the honest survivors' sum
    if xnoise:  # and it keeps exactly the target noise: the colluders' seeds and reveals strip none
        assert math.isclose(finding.noise_variance, 1e4, rel_tol=1e-12)


# ------------------------------------------------------------------ item 6: differencing and replays
def test_item6_one_view_per_round_and_no_second_session() -> None:
    n, t = 9, 5
    ids = list(range(n))
    setup = SetupRequest(round=5, threshold=t, degree=n - 1, dim=6, active=True)
    adv = MaliciousServer(setup=setup, inputs=_inputs(ids, seed=4), colluders=frozenset())
    adv.honest_until_masked()
    a, b = adv.view(ids[:-1]), adv.view(ids[1:])  # two survivor sets that differ in one client each
    adv.stage_consistency({i: (a if i < n // 2 else b) for i in ids})
    adv.stage_unmask([(i, req) for i in ids if (req := adv.certificate(i)) is not None])
    for i in ids:  # and every client asked again under the other view
        other = adv.certificate(i)
        if other is not None:
            adv.stage_unmask([(j, other) for j in ids if j != i])
    assert_reveals_only_allowed_sums(adv)
    # the round cannot be opened again for these clients
    log = RoundLog()
    ClientSession(node_id=0, setup=setup).advertise_keys(log=log)
    with pytest.raises(ProtocolViolation, match="twice"):
        ClientSession(node_id=0, setup=setup).advertise_keys(log=log)


def test_replayed_shares_and_signatures_from_another_round_are_useless() -> None:
    ids = list(range(7))
    runs = {}
    for r in (1, 2):
        setup = SetupRequest(round=r, threshold=4, degree=6, dim=6, active=True)
        adv = MaliciousServer(setup=setup, inputs=_inputs(ids, seed=r), colluders=frozenset())
        adv.stage_advertise()
        adv.stage_share({i: ids for i in ids})
        runs[r] = adv
    one, two = runs[1], runs[2]
    one.stage_masked({i: [j for j in ids if (j, i) in one.cts] for i in ids})
    one.stage_consistency({i: one.view(ids) for i in ids})
    # round-1 ciphertexts into round 2: nothing opens, so nobody uploads
    for i in ids:
        senders = [j for j in ids if (j, i) in one.cts]
        req = MaskedInputRequest(round=2, senders=senders, ciphertexts=[one.cts[(j, i)] for j in senders])
        with pytest.raises(ProtocolViolation):
            two.clients[i].masked_input(req, two.inputs[i])
    # round-2 clients that reached the consistency stage refuse round-1 signatures
    two.stage_masked({i: [j for j in ids if (j, i) in two.cts] for i in ids})
    two.stage_consistency({i: two.view(ids) for i in ids})
    cert1 = one.certificate(0)
    assert cert1 is not None
    with pytest.raises(ProtocolViolation):
        two.clients[0].unmask(dataclasses.replace(cert1, round=2))
    assert two.clients[0].revealed == {}


def test_tampered_instructions_in_the_setup_are_refused_by_the_client_floor() -> None:
    setup = SetupRequest(round=1, threshold=5, degree=7, dim=4, colluders=1, active=True)
    with pytest.raises(ProtocolViolation, match="colluding"):  # fewer colluders than the client assumes
        ClientSession(node_id=0, setup=dataclasses.replace(setup, colluders=0), colluders=1)
    with pytest.raises(ProtocolViolation, match="semi-honest"):
        ClientSession(node_id=0, setup=dataclasses.replace(setup, active=False), colluders=1,
                      require_active=True)


# ------------------------------------------------------------------ random malicious schedules
def _resolved(adv: MaliciousServer, surv: list[int]) -> list[int]:
    """What an attacker keeps to get a view signed: no one-sided edge, every survivor with more than
    c mutual peers among the survivors."""
    surv = set(surv)
    while True:
        ps = {u: set(adv.masked[u].peers) for u in surv}
        bad = {u for u in surv if any(w in surv and u not in ps[w] for w in ps[u])}
        bad |= {u for u in surv if len({w for w in ps[u] if w in surv and u in ps[w]}) <= adv.setup.colluders}
        if not bad:
            return sorted(surv)
        surv -= bad


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(c=st.integers(0, 2), honest_count=st.integers(5, 9), complete=st.booleans(),
       degree_pick=st.floats(0, 1), extra_t=st.integers(0, 1), min_surv_pick=st.floats(0, 1.2),
       own_roster_rate=st.sampled_from([0.0, 0.1, 0.3]), withhold_rate=st.sampled_from([0.0, 0.1, 0.3]),
       tamper_rate=st.sampled_from([0.0, 0.1]), victim_pick=st.floats(0, 1.3),
       stories=st.lists(st.sampled_from(["all", "resolved", "random", "isolate", "isolate-resolved",
                                         "wrong-dropped"]), min_size=1, max_size=3),
       mix=st.sampled_from([0.0, 0.3, 1.0]), symmetric=st.booleans(), xnoise=st.booleans(),
       rseed=st.integers(0, 2**32 - 1))
def test_random_malicious_schedules_reveal_only_allowed_sums(
        c, honest_count, complete, degree_pick, extra_t, min_surv_pick, own_roster_rate, withhold_rate,
        tamper_rate, victim_pick, stories, mix, symmetric, xnoise, rseed) -> None:
    """Random malicious schedules. The structure depends on fresh keys (the graph is seeded by the
    world id), so every choice that depends on it comes from ``random.Random(rseed)``."""
    import random

    rnd = random.Random(rseed)
    n = honest_count + c
    ids = list(range(n))
    degree = n - 1 if complete or n < 7 else max(c + 1, 2) + int(degree_pick * (n - 3 - max(c + 1, 2)))
    k = effective_degree(n, degree)
    t = min(min_safe_threshold(k, colluders=c) + extra_t, k + 1)
    try:
        check_safe(num_clients=n, degree=degree, threshold=t, colluders=c)
    except ValueError:
        event("unsafe parameters (skipped)")
        return
    setup = SetupRequest(round=7, threshold=t, degree=degree, dim=6, colluders=c, active=True,
                         min_survivors=int(min_surv_pick * t))
    colluders = frozenset(rnd.sample(ids, c))
    noise = None
    if xnoise:  # exact noise whatever the survivors: the attacker must not strip it
        from fedprivacy.accounting.xnoise_design import XNoiseDesign

        def noise(roster: int) -> XNoiseDesign:
            return XNoiseDesign(total_variance=1e4, roster=roster,
                                min_survivors=min(setup.required_survivors, roster), colluders=c)
    adv = MaliciousServer(setup=setup, inputs=_inputs(ids, seed=rseed % 97), colluders=colluders,
                          noise_design=noise)
    honest = [i for i in ids if i not in colluders]
    adv.stage_advertise()
    # rosters: mostly everyone, sometimes a world of its own for a client
    roster_of = {}
    for i in ids:
        if i not in colluders and rnd.random() < own_roster_rate:
            size = rnd.randint(min(setup.required_survivors, n) - 1, n - 1)
            roster_of[i] = sorted({i, *rnd.sample([j for j in ids if j != i], size)})
        else:
            roster_of[i] = ids
    adv.stage_share(roster_of)
    # forwarding: a victim gets t - 1 share sets or so; others lose some; some are tampered
    victim = honest[int(victim_pick * len(honest))] if victim_pick < 1 else None
    forward, tamper = {}, {}
    for i in ids:
        senders = [j for j in ids if (j, i) in adv.cts]
        rnd.shuffle(senders)
        if i in colluders:
            forward[i] = senders
        elif i == victim:
            forward[i] = senders[: rnd.randint(max(0, min(len(senders), t - 2)), len(senders))]
        else:
            forward[i] = [j for j in senders if rnd.random() >= withhold_rate]
        if senders and i not in colluders and rnd.random() < tamper_rate:
            tamper[i] = [rnd.choice(senders)]
    if symmetric and victim is not None:  # the victim's shares reach only the peers it masks with
        kept = set(forward[victim])
        for i in ids:
            if i != victim and i not in kept and i not in colluders:
                forward[i] = [j for j in forward[i] if j != victim]
    adv.stage_masked(forward, tamper=tamper)
    up = sorted(adv.masked)
    if not up:
        return
    # views: one to three stories, each over its own survivor set
    views = []
    for kind in stories:
        if kind.startswith("isolate") and victim in adv.masked:
            surv = [u for u in up if u not in adv.masked[victim].peers]
        elif kind in ("random", "wrong-dropped"):
            surv = sorted(rnd.sample(up, rnd.randint(1, len(up))))
        else:
            surv = up
        if kind.endswith("resolved"):
            surv = _resolved(adv, surv)
            if not surv:
                continue
        dropped = None
        if kind == "wrong-dropped":
            dropped = sorted(set(rnd.sample(ids, rnd.randint(0, n))) - set(surv))
        views.append(adv.view(surv, dropped))
    if not views:
        return
    adv.stage_consistency({i: rnd.choice(views) if rnd.random() < mix else views[0] for i in up})
    for view in views:  # colluders sign every story
        adv.stage_consistency(dict.fromkeys((u for u in colluders if u in adv.worlds), view))
    requests = []
    for i in up:
        if i in colluders:
            continue
        cert = adv.certificate(i, limit=None if rnd.random() < 0.7 else rnd.randint(0, n))
        if cert is not None:
            requests.append((i, cert))
        if rnd.random() < 0.5:  # other lists: bare, or under the certificate of the signed view
            view = rnd.choice(views)
            bare = UnmaskRequest(round=7, survivors=list(view.survivors), dropped=list(view.dropped))
            requests.append((i, bare))
            if cert is not None:
                requests.append((i, dataclasses.replace(cert, survivors=bare.survivors,
                                                        dropped=bare.dropped)))
        if victim is not None and cert is not None and rnd.random() < 0.5:
            # "only the victim and you survived" under the certificate this holder signed
            surv = sorted({victim, i})
            requests.append((i, dataclasses.replace(cert, survivors=surv,
                                                    dropped=[u for u in up if u not in surv])))
    adv.stage_unmask(requests)
    # again, with every certificate the attacker now holds, to everyone
    adv.stage_unmask([(i, cert) for j in up if (cert := adv.certificate(j)) is not None
                      for i in up if i not in colluders])
    findings = assert_reveals_only_allowed_sums(adv)
    event(f"sums learnt: {len(findings)}" + (" (XNoise: noise checked)" if xnoise and findings else ""))
    event("some honest client revealed shares" if any(adv.clients[i].revealed for i in honest)
          else "no honest client revealed")
