"""A large population on the in-process engine: node ids in numpy, discovery in bounded chunks."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from flwr.common.constant import SUPERLINK_NODE_ID

import server.loop
from fedprivacy.config import ConfigError
from server.engine import InProcessGrid, load_app_spec, parse_overrides, resolve_run_config
from server.engine._flwr_private import TaskIdentityScope
from server.engine.nodes import NodeTable, make_node_ids
from server.engine.preflight import preflight
from server.engine.run import load_apps, make_run
from server.loop import PartitionNodes, discover_partitions

RUN_ID = 77
REPO_DIR = Path(__file__).resolve().parents[2]


def _reference_node_ids(n: int, seed: int) -> list[int]:
    """The ids drawn one call at a time, repeats and reserved ids skipped (what Flower-style ids need)."""
    rng, ids, seen = random.Random(seed), [], {0, SUPERLINK_NODE_ID}
    while len(ids) < n:
        nid = rng.getrandbits(64)
        if nid not in seen:
            seen.add(nid)
            ids.append(nid)
    return ids


@pytest.mark.parametrize(("n", "seed"), [(1, 0), (7, 1), (5000, 12345)])
def test_seeded_node_ids_are_the_one_call_at_a_time_ids(n: int, seed: int) -> None:
    assert make_node_ids(n, seed).tolist() == _reference_node_ids(n, seed)


def test_secure_node_ids_are_distinct_and_never_reserved() -> None:
    ids = make_node_ids(200_000, None)
    assert ids.dtype == np.uint64 and np.sort(ids).size == len(set(ids.tolist())) == 200_000
    assert not np.isin(ids, np.array([0, SUPERLINK_NODE_ID], dtype=np.uint64)).any()


def test_node_table_finds_every_partition_and_refuses_strangers() -> None:
    # Arrange
    ids = make_node_ids(3000, 5)
    table = NodeTable(ids)
    # Act / Assert: every node's partition, twice (the memo), and ids no node has
    for _ in range(2):
        assert [table.partition_of(int(nid)) for nid in ids] == list(range(3000))
    assert table.ids() == ids.tolist() and len(table) == 3000
    assert {table.partition_of(x) for x in (0, -1, 2**64, int(ids.max()) + 1, "1", True)} == {None}
    with pytest.raises(ValueError, match="distinct"):
        NodeTable(np.array([5, 9, 5], dtype=np.uint64))


def test_discovery_asks_in_chunks_and_maps_every_partition_to_its_node(monkeypatch: pytest.MonkeyPatch) -> None:
    # Arrange: the real apps on 11 virtual SuperNodes, queries 4 at a time
    monkeypatch.setattr(server.loop, "QUERY_CHUNK", 4)
    spec = load_app_spec(REPO_DIR)
    _, capp = load_apps(spec, None, None)
    overrides = {"privacy": "none", "secagg": False, "seed": 1}
    grid = InProcessGrid(client_app=capp, run=make_run(spec, parse_overrides(overrides), RUN_ID),
                         run_config=resolve_run_config(overrides, app_dir=REPO_DIR), num_supernodes=11,
                         node_id_seed=3)
    # Act
    with TaskIdentityScope(RUN_ID):
        nodes = discover_partitions(grid, timeout=30.0, wait=30.0, log=lambda _: None)
    # Assert: the partition each node was given, and no exchange above the chunk
    assert isinstance(nodes, PartitionNodes) and len(nodes) == 11 and list(nodes) == list(range(11))
    assert all(grid.node_partition(nodes[pid]) == pid for pid in range(11))
    assert [n for kind, n, _ in grid.stats.exchanges if kind == "query"] == [4, 4, 3]
    with pytest.raises(KeyError):
        nodes[11]


@pytest.mark.parametrize(("overrides", "clients", "needle"), [
    ("dataset='synthetic' secagg=false privacy='none'", 100_001,
     "dataset 'synthetic' generates all 100001 clients before round 1"),
    ("secagg=false privacy='none'", 5000, "dataset 'digits' has 1437 training examples for 5000 clients"),
])
def test_a_population_the_data_cannot_serve_is_refused_before_start(overrides: str, clients: int,
                                                                     needle: str) -> None:
    with pytest.raises(ConfigError, match="dataset='synthetic-lazy'") as exc:
        preflight(overrides, app_dir=REPO_DIR, num_supernodes=clients)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_synthetic_lazy_passes_the_preflight_at_a_million_clients() -> None:
    pre = preflight("dataset='synthetic-lazy' secagg=false privacy='none' target-delta=1e-7", app_dir=REPO_DIR,
                    num_supernodes=1_000_000)
    assert pre.config.dataset == "synthetic-lazy"
