"""The client's session in the node state (fl/secure/session.py): packed list fields and the
per-record copy of the live session change nothing a session holds or does, at any stage; a state that did
not come from this process's own record (another object, a pickle, an edit) is parsed and validated."""

from __future__ import annotations

import gc
import pickle

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict

from fedprivacy.fl.secure import ExportedSessionStore
from fedprivacy.fl.secure import session as sess
from fedprivacy.secagg.client_session import ClientSession
from fedprivacy.secagg.messages import SetupRequest
from fedprivacy.secagg.server_session import ServerSession

_IDS = list(range(7))


def _plain_sum(inputs: dict[int, np.ndarray], ids: list[int], bits: int) -> np.ndarray:
    total = np.zeros_like(next(iter(inputs.values())), dtype=np.uint64)
    for i in ids:
        total += inputs[i]
    return (total % (1 << bits)).astype(np.uint32)


def _round(reload: str) -> tuple[np.ndarray, dict[int, list[dict]]]:
    """One active round of 7 clients, 2 dropping after their masked input; every client's session goes
    through an ExportedSessionStore over a Flower RecordDict between stages. ``reload``: ``memo`` (the
    same record objects, as the in-process engine), ``parse`` (a pickled copy of the node state, as a
    process boundary), ``plain`` (no store). Returns the sum and each client's states stage by stage."""
    setup = SetupRequest(round=2, threshold=4, degree=6, dim=12, active=True)
    server = ServerSession(setup)
    states = {i: RecordDict() for i in _IDS}
    clients = {i: ClientSession(node_id=i, setup=setup) for i in _IDS}
    seen: dict[int, list[dict]] = {i: [] for i in _IDS}
    inputs = {i: np.arange(12, dtype=np.uint32) * (i + 1) for i in _IDS}

    def through_store(i: int) -> ClientSession:
        seen[i].append(clients[i].to_state())
        if reload == "plain":
            return clients[i]
        store = ExportedSessionStore(states[i], wrap=ConfigRecord)
        store.put((1, i), clients[i])
        if reload == "parse":
            states[i] = pickle.loads(pickle.dumps(states[i]))
        got = ExportedSessionStore(states[i], wrap=ConfigRecord).get((1, i), round=2)
        assert got is not clients[i] and got.to_state() == clients[i].to_state()
        return got

    adv = [clients[i].advertise_keys() for i in _IDS]
    requests = server.receive_keys(adv)
    shares = []
    for i in _IDS:
        clients[i] = through_store(i)
        shares.append(clients[i].share_keys(requests))
    masked_requests = server.receive_shares(shares)
    survivors = _IDS[:-2]
    masked = []
    for i in _IDS:
        clients[i] = through_store(i)
        masked.append(clients[i].masked_input(masked_requests[i], inputs[i]))
    consistency_requests = server.receive_masked([m for m in masked if m.node_id in survivors])
    signed = []
    for i in survivors:
        clients[i] = through_store(i)
        signed.append(clients[i].sign_view(consistency_requests[i]))
    unmask_requests = server.receive_consistency(signed)
    replies = []
    for i in survivors:
        clients[i] = through_store(i)
        replies.append(clients[i].unmask(unmask_requests[i]))
    total = server.receive_unmask(replies)
    return total, seen


def test_a_round_through_the_store_equals_the_round_without_it_at_every_stage() -> None:
    memo_sum, _ = _round("memo")
    parse_sum, _ = _round("parse")
    plain_sum, _ = _round("plain")
    inputs = {i: np.arange(12, dtype=np.uint32) * (i + 1) for i in _IDS}
    want = _plain_sum(inputs, _IDS[:-2], 32)
    for got in (memo_sum, parse_sum, plain_sum):
        assert np.array_equal(got, want)


def _session_at_masked() -> ClientSession:
    setup = SetupRequest(round=2, threshold=4, degree=6, dim=12, active=True)
    server = ServerSession(setup)
    clients = {i: ClientSession(node_id=i, setup=setup) for i in _IDS}
    requests = server.receive_keys([c.advertise_keys() for c in clients.values()])
    masked_requests = server.receive_shares([c.share_keys(requests) for c in clients.values()])
    c = clients[3]
    c.masked_input(masked_requests[3], np.ones(12, np.uint32))
    return c


def test_export_packs_the_list_fields_and_import_restores_the_same_session() -> None:
    c = _session_at_masked()
    state = c.to_state()
    exported = sess.export_session(c)
    assert set(exported) == set(state)
    for name in (*sess.INT_LISTS, *sess.BLOB_LISTS):
        assert isinstance(exported[name], bytes), name
    # nothing roster-sized is left as a list for Flower's per-element check
    assert not [k for k, v in exported.items() if isinstance(v, list) and len(v) > 1 and k != "revealed.kinds"]
    assert sess.import_session(dict(ConfigRecord(exported))).to_state() == state
    assert sess.import_session(state).to_state() == state  # the unpacked form is still accepted


@pytest.mark.parametrize(("name", "bad"), [("roster_ids", b"\x00" * 7), ("mask_publics", b"\x00\x00\x00\x02"),
                                           ("held_seed_shares", b"\x00\x00\x00\x01\x00\x00\x00\x05abc")])
def test_a_malformed_packing_is_refused_naming_the_field(name: str, bad: bytes) -> None:
    exported = sess.export_session(_session_at_masked())
    with pytest.raises(ValueError, match=name):
        sess.import_session({**exported, name: bad})


def test_recall_answers_only_for_the_very_record_and_only_while_it_lives() -> None:
    c = _session_at_masked()
    record = ConfigRecord(sess.export_session(c))
    sess.remember(record, c)
    first = sess.recall(record)
    assert isinstance(first, ClientSession) and first is not c and first.to_state() == c.to_state()
    # a copy: changing what recall returned (or the original) leaves what it keeps unchanged
    first._revealed[99] = "seed"  # type: ignore[attr-defined]  # (the one slot a session edits in place)
    c._held_seed_shares.clear()  # type: ignore[attr-defined]
    again = sess.recall(record)
    assert isinstance(again, ClientSession) and 99 not in again._revealed  # type: ignore[attr-defined]
    assert again._held_seed_shares  # type: ignore[attr-defined]
    # an equal record that is not the same object, or a pickled one, is parsed instead
    assert sess.recall(ConfigRecord(dict(record))) is None
    assert sess.recall(pickle.loads(pickle.dumps(record))) is None
    # when the node state drops the record, the kept session (its secrets) goes with it
    key = id(record)
    del record
    gc.collect()
    assert key not in sess._LIVE


def test_a_plain_dict_holder_always_parses() -> None:
    c = _session_at_masked()
    holder: dict = {}
    store = ExportedSessionStore(holder)
    store.put((1, 3), c)
    assert sess.recall(holder["secagg-session/2"]) is None
    assert store.get((1, 3), round=2).to_state() == c.to_state()


def test_an_edited_record_is_parsed_and_validated_not_recalled() -> None:
    c = _session_at_masked()
    holder = RecordDict()
    store = ExportedSessionStore(holder, wrap=ConfigRecord)
    store.put((1, 3), c)
    edited = ConfigRecord({**dict(holder.config_records["secagg-session/2"]), "peers": ["x"]})
    holder["secagg-session/2"] = edited
    with pytest.raises(TypeError, match="peers"):
        store.get((1, 3), round=2)


def _export_without_cache(c: ClientSession) -> dict:
    kept = dict(sess._ROSTERS)
    sess._ROSTERS.clear()
    try:
        return sess.export_session(c)
    finally:
        sess._ROSTERS.clear()
        sess._ROSTERS.update(kept)


def test_the_packed_roster_cache_exports_what_an_export_without_it_does() -> None:
    setup = SetupRequest(round=2, threshold=4, degree=6, dim=12, active=True)
    server = ServerSession(setup)
    clients = {i: ClientSession(node_id=i, setup=setup) for i in _IDS}
    requests = server.receive_keys([c.advertise_keys() for c in clients.values()])
    sess._ROSTERS.clear()
    for c in clients.values():  # before stage 2: nothing cached
        assert sess.export_session(c) == _export_without_cache(c)
    assert not sess._ROSTERS
    masked_requests = server.receive_shares([c.share_keys(requests) for c in clients.values()])
    for c in clients.values():  # one world: packed once, every client's export equal to a fresh one
        got = sess.export_session(c)
        assert got == _export_without_cache(c) and list(got) == list(c.to_state())
    assert len(sess._ROSTERS) == 1
    for i, c in clients.items():
        c.masked_input(masked_requests[i], np.ones(12, np.uint32))
        assert sess.export_session(c) == _export_without_cache(c)
    # a session of the same world whose graph differs (its own memory, edited) is packed from itself
    odd = sess.copy_session(clients[3])
    graph = dict(odd._graph)
    graph[0] = graph[0][:-1]
    object.__setattr__(odd, "_graph", graph)
    assert sess.export_session(odd) == _export_without_cache(odd)
    assert sess.export_session(odd)["graph.flat"] != sess.export_session(clients[3])["graph.flat"]
    sess._ROSTERS.clear()


@pytest.mark.parametrize("reload", ["memo", "parse"])
def test_a_record_made_under_another_run_or_node_is_refused_not_used(reload: str) -> None:
    # Arrange: Flower hands a new run of the same series the old run's node state
    from fedprivacy.fl.client_policy import PolicyRefusal
    from fedprivacy.secagg.encoding import EncodingSpec

    setup = SetupRequest(round=2, threshold=4, degree=6, dim=12, active=True)
    state = RecordDict()
    store = ExportedSessionStore(state, wrap=ConfigRecord)
    store.put((1, 3), ClientSession(node_id=3, setup=setup))
    store.put_encoding((1, 3), 2, EncodingSpec(kind="fixed-point", dim=12, clip_norm=1.0, scale=2.0**8, max_clients=7,
                                               modulus_bits=32))
    if reload == "parse":
        state = pickle.loads(pickle.dumps(state))
    again = ExportedSessionStore(state, wrap=ConfigRecord)
    # Act / Assert: the same run and node get it back; another run id (or node) is refused, for both records
    assert again.get((1, 3), round=2).node_id == 3 and again.encoding((1, 3), round=2).kind == "fixed-point"
    for other in [(2, 3), (1, 4), (2**64 - 1, 3)]:
        with pytest.raises(PolicyRefusal, match="was not made in this run"):
            again.get(other, round=2)
        with pytest.raises(PolicyRefusal, match="was not made in this run"):
            again.encoding(other, round=2)
