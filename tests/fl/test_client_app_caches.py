"""The ClientApp resolves a client's floor once per distinct ``client-*`` keys (not once per node)."""

from __future__ import annotations

from flwr.app import Context, RecordDict

from clients.client_app import _policy, _policy_of
from fedprivacy.fl.client_policy import ClientPolicy


def _context(node_config: dict) -> Context:
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config={})


def test_the_policy_is_the_one_of_the_client_keys_and_shared_by_nodes_with_the_same_floor(monkeypatch) -> None:
    monkeypatch.delenv("FEDPRIVACY_CLIENT_POLICY", raising=False)
    _policy_of.cache_clear()
    floor = {"client-privacy-modes": "none,central", "client-min-noise-multiplier": 0.5}
    a = _policy(_context({"partition-id": 0, "num-partitions": 10, **floor}))
    b = _policy(_context({"partition-id": 3, "num-partitions": 10, **floor}))
    assert a is b and a == ClientPolicy.resolve({"partition-id": 3, **floor}, {})
    c = _policy(_context({"partition-id": 3, "num-partitions": 10, "client-privacy-modes": "none"}))
    assert c == ClientPolicy.resolve({"client-privacy-modes": "none"}, {}) and c != a
    assert _policy_of.cache_info().misses == 2
    _policy_of.cache_clear()
