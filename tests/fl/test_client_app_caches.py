"""The ClientApp resolves a client's floor once per distinct ``client-*`` keys (not once per node)."""

from __future__ import annotations

from flwr.app import Context, RecordDict

from clients.client_app import _forget_last, _policy, _policy_of
from fedprivacy.fl.client_policy import ClientPolicy


def _context(node_config: dict) -> Context:
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config={})


def test_the_policy_is_the_one_of_the_client_keys_and_shared_by_nodes_with_the_same_floor(monkeypatch) -> None:
    monkeypatch.delenv("FEDPRIVACY_CLIENT_POLICY", raising=False)
    _policy_of.cache_clear()
    _forget_last()
    floor = {"client-privacy-modes": "none,central", "client-min-noise-multiplier": 0.5}
    a = _policy(_context({"partition-id": 0, "num-partitions": 10, **floor}))
    b = _policy(_context({"partition-id": 3, "num-partitions": 10, **floor}))
    assert a is b and a == ClientPolicy.resolve({"partition-id": 3, **floor}, {})
    c = _policy(_context({"partition-id": 3, "num-partitions": 10, "client-privacy-modes": "none"}))
    assert c == ClientPolicy.resolve({"client-privacy-modes": "none"}, {}) and c != a
    assert _policy_of.cache_info().misses == 2
    _policy_of.cache_clear()


def test_another_order_of_the_same_client_keys_resolves_the_same_floor(monkeypatch) -> None:
    # the cache key keeps the node config's order (no sort per message): another order may miss the
    # cache, but never resolves another floor
    monkeypatch.delenv("FEDPRIVACY_CLIENT_POLICY", raising=False)
    _policy_of.cache_clear()
    _forget_last()
    floor = [("client-privacy-modes", "none,central"), ("client-min-noise-multiplier", 0.5)]
    a = _policy(_context({"partition-id": 0, "num-partitions": 10, **dict(floor)}))
    b = _policy(_context({"partition-id": 0, "num-partitions": 10, **dict(floor[::-1])}))
    assert a == b == ClientPolicy.resolve(dict(floor), {})
    _policy_of.cache_clear()


def test_the_run_config_is_parsed_once_per_run_config() -> None:
    from clients.client_app import _config, _node

    _config.cache_clear()
    _forget_last()
    run_config = {"num-server-rounds": 3, "privacy": "none", "seed": 1}
    ctx = [Context(run_id=1, node_id=7, node_config={"partition-id": i, "num-partitions": 4}, state=RecordDict(),
                   run_config=dict(run_config)) for i in range(3)]
    cfgs = [_node(c)[0] for c in ctx]
    assert cfgs[0] is cfgs[1] is cfgs[2] and _config.cache_info().misses == 1
    assert [_node(c)[1:] for c in ctx] == [(0, 4), (1, 4), (2, 4)]
    _config.cache_clear()


def test_the_last_floor_is_reused_only_for_the_same_client_keys(monkeypatch) -> None:
    # the one-entry memo in front of the cache: a node with one more, one less or another client-* value,
    # or another environment, resolves its own floor
    monkeypatch.delenv("FEDPRIVACY_CLIENT_POLICY", raising=False)
    _policy_of.cache_clear()
    _forget_last()
    base = {"partition-id": 1, "num-partitions": 4, "client-privacy-modes": "none,central"}
    variants = [
        {**base, "client-privacy-modes": "none"},
        {**base, "client-allow-seeded": True},
        {"partition-id": 1, "num-partitions": 4},
        {**base, "other": 1},  # not a client-* key: the floor of base
    ]
    first = _policy(_context(base))
    for nc in variants:
        got = _policy(_context(nc))
        assert got == ClientPolicy.resolve(nc, {})
        assert _policy(_context(base)) is first
    monkeypatch.setenv("FEDPRIVACY_CLIENT_POLICY", '{"client-allow-seeded": true}')
    assert _policy(_context(base)) == ClientPolicy.resolve(base, {"FEDPRIVACY_CLIENT_POLICY": '{"client-allow-seeded": true}'})
    assert _policy(_context(base)) != first
    _policy_of.cache_clear()
    _forget_last()


def test_the_last_run_config_is_reused_only_for_an_equal_one() -> None:
    from clients.client_app import _config, _node

    _config.cache_clear()
    _forget_last()
    a = {"num-server-rounds": 3, "privacy": "none", "seed": 1}
    b = {**a, "seed": 2}

    def cfg(rc: dict):
        return _node(Context(run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 2},
                             state=RecordDict(), run_config=dict(rc)))[0]

    ca, cb, ca2 = cfg(a), cfg(b), cfg(a)
    assert ca.seed == 1 and cb.seed == 2 and ca2 == ca
    _config.cache_clear()
    _forget_last()
