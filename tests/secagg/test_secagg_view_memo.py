"""The consistency stage's memo of checked views (``client_session._VIEWS_PASSED``): a client's verdict on a view
is the one it reaches without the memo, whatever other clients of the same process checked before."""

from __future__ import annotations

import dataclasses

import pytest
from test_secagg_protocol import _active_to_stage_4, _view

from fedprivacy.fl.secure.session import copy_session
from fedprivacy.secagg import client_session
from fedprivacy.secagg.messages import ProtocolViolation


def _verdict(session, request) -> bytes | str:
    try:
        return session.sign_view(request).signature  # Ed25519 signatures are deterministic
    except ProtocolViolation as exc:
        return f"refused: {exc}"


def test_every_clients_verdict_on_every_view_is_the_one_it_reaches_without_the_memo() -> None:
    setup, server, clients, ids, masked = _active_to_stage_4(n=9, t=5)
    honest = server.receive_masked(list(masked.values()))[ids[0]]
    views = {
        "honest": honest,
        "honest, dropping the last": _view(ids[:-1], masked, [ids[-1]]),
        "a signature swapped": dataclasses.replace(
            honest, peer_signatures=[honest.peer_signatures[1], honest.peer_signatures[0],
                                     *honest.peer_signatures[2:]]),
        "a peer set altered": dataclasses.replace(honest, peer_flat=[*honest.peer_flat[:-1], ids[0]]),
        "dropped not the peers outside U3": dataclasses.replace(honest, dropped=[ids[1] + 100]),
        "too few survivors": _view(ids[:4], masked, ids[4:]),
    }
    client_session._VIEWS_PASSED.clear()
    for why, view in views.items():
        for i in ids:
            with_memo = _verdict(copy_session(clients[i]), view)
            kept = dict(client_session._VIEWS_PASSED)
            client_session._VIEWS_PASSED.clear()
            alone = _verdict(copy_session(clients[i]), view)
            client_session._VIEWS_PASSED.clear()
            client_session._VIEWS_PASSED.update(kept)
            assert with_memo == alone, (why, i)
    assert len(client_session._VIEWS_PASSED) == 2  # the two views that passed; refused ones are not kept


def test_a_view_from_the_memo_is_refused_by_a_client_whose_own_peers_it_misstates() -> None:
    setup, server, clients, ids, masked = _active_to_stage_4(n=9, t=5)
    view = server.receive_masked(list(masked.values()))[ids[0]]
    client_session._VIEWS_PASSED.clear()
    clients[ids[0]].sign_view(view)
    assert len(client_session._VIEWS_PASSED) == 1
    other = clients[ids[1]]
    object.__setattr__(other, "_peers", other.peers[:-1])  # its own memory of whom it masked with
    for memo in (True, False):
        if not memo:
            client_session._VIEWS_PASSED.clear()
        with pytest.raises(ProtocolViolation, match="misstates the peers this client masked with"):
            other.sign_view(view)
        assert other.stage == "MASKED"


def test_the_memo_keeps_the_latest_views_only() -> None:
    setup, server, clients, ids, masked = _active_to_stage_4()
    honest = server.receive_masked(list(masked.values()))[ids[0]]
    client_session._VIEWS_PASSED.clear()
    client_session._VIEWS_PASSED.update({("old", k): ({}, b"") for k in range(2 * client_session._VIEWS_KEPT)})
    clients[ids[0]].sign_view(honest)
    assert len(client_session._VIEWS_PASSED) == client_session._VIEWS_KEPT
    assert ("old", 0) not in client_session._VIEWS_PASSED and not any(k[0] == "old" for k in list(client_session._VIEWS_PASSED)[-1:])
