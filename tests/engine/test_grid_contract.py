"""The in-process Grid honours Flower's Grid contract (ids, reply_to, errors, timeouts).

Reference behaviour: flwr 1.42's InMemoryGrid + InMemoryLinkState + Simulation Engine
(``flwr/superlink/grid/inmemory_grid.py``, ``flwr/server/superlink/linkstate``,
``flwr/server/superlink/fleet/vce/vce_api.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid

from server.engine import (
    FaultPlan,
    FaultRule,
    InProcessGrid,
    load_app_spec,
    parse_overrides,
    resolve_run_config,
    run_inprocess,
)
from server.engine._flwr_private import TaskIdentityScope
from server.engine.run import load_apps, make_run

RUN_ID = 4242


def _grid(toyapp_dir: Path, n: int = 4, workers: int = 1, faults: FaultPlan | None = None,
          **overrides: object) -> InProcessGrid:
    spec = load_app_spec(toyapp_dir)
    _, capp = load_apps(spec, None, None)
    cfg = resolve_run_config(dict(overrides), app_dir=toyapp_dir)
    return InProcessGrid(
        client_app=capp,
        run=make_run(spec, parse_overrides(dict(overrides)), RUN_ID),
        run_config=cfg,
        num_supernodes=n,
        workers=workers,
        faults=faults,
        node_id_seed=1,
    )


@pytest.fixture()
def identity() -> Iterator[None]:
    with TaskIdentityScope(RUN_ID):
        yield


def _train_msgs(grid: Grid, rnd: int = 1) -> list[Message]:
    content = RecordDict(
        {"arrays": ArrayRecord([np.zeros(8)]), "config": ConfigRecord({"round": rnd})}
    )
    return [Message(content, nid, "train", group_id=str(rnd)) for nid in grid.get_node_ids()]


def test_is_a_flower_grid_with_distinct_random_node_ids(toyapp_dir: Path, identity: None) -> None:
    grid = _grid(toyapp_dir, n=50)
    ids = list(grid.get_node_ids())
    assert isinstance(grid, Grid)
    assert len(set(ids)) == 50
    assert all(0 < i < 2**64 and i != SUPERLINK_NODE_ID for i in ids)
    assert [n.node_id for n in grid.get_nodes()] == ids
    assert grid.run.run_id == RUN_ID


def test_reply_metadata_follows_flower_rules(toyapp_dir: Path, identity: None) -> None:
    grid = _grid(toyapp_dir)
    msgs = _train_msgs(grid)
    replies = list(grid.send_and_receive(msgs, timeout=30))

    assert len(replies) == len(msgs)
    ins_ids = [m.metadata.message_id for m in msgs]
    assert all(uuid.UUID(i).version == 4 for i in ins_ids)
    assert len(set(ins_ids)) == len(ins_ids)
    for ins, rep in zip(msgs, replies, strict=True):
        md, rmd = ins.metadata, rep.metadata
        assert md.src_node_id == SUPERLINK_NODE_ID and md.run_id == RUN_ID
        assert rmd.reply_to_message_id == md.message_id
        assert rmd.message_id not in ("", md.message_id)
        assert (rmd.src_node_id, rmd.dst_node_id) == (md.dst_node_id, SUPERLINK_NODE_ID)
        assert rmd.group_id == "1" and rmd.message_type == "train" and rmd.run_id == RUN_ID
        assert rmd.created_at >= md.created_at
        assert 0 < rmd.ttl <= md.ttl
        assert rmd.delivered_at != ""
    # each client saw its own node_config: partition ids 0..3 in node order
    pids = [int(r.content["metrics"]["partition-id"]) for r in replies]
    assert pids == [grid.node_partition(m.metadata.dst_node_id) for m in msgs]
    assert sorted(pids) == [0, 1, 2, 3]
    assert {int(r.content["metrics"]["num-partitions"]) for r in replies} == {4}


def test_push_then_pull_and_unknown_ids(toyapp_dir: Path, identity: None) -> None:
    grid = _grid(toyapp_dir)
    msgs = _train_msgs(grid)
    ids = list(grid.push_messages(msgs))
    first = list(grid.pull_messages(ids[:2]))
    rest = list(grid.pull_messages(ids[2:]))
    again = list(grid.pull_messages(ids[:1] + ["not-an-id"]))

    assert [r.metadata.reply_to_message_id for r in first] == ids[:2]
    assert [r.metadata.reply_to_message_id for r in rest] == ids[2:]
    # Flower answers an id it does not know (or whose reply was delivered) with an error
    assert [r.error.code for r in again] == [ErrorCode.MESSAGE_UNAVAILABLE] * 2


def test_invalid_destination_is_refused_without_an_id(toyapp_dir: Path, identity: None) -> None:
    grid = _grid(toyapp_dir)
    good = _train_msgs(grid)[0]
    bad = Message(RecordDict(), 999, "train", group_id="1")

    ids = list(grid.push_messages([bad, good]))

    assert ids == [good.metadata.message_id]


def test_client_exception_becomes_flower_error_reply(toyapp_dir: Path, identity: None) -> None:
    grid = _grid(toyapp_dir, **{"fail-partition": 2})
    msgs = _train_msgs(grid)
    replies = list(grid.send_and_receive(msgs, timeout=30))

    errors = [r for r in replies if r.has_error()]
    assert len(replies) == 4 and len(errors) == 1
    err = errors[0]
    assert grid.node_partition(err.metadata.src_node_id) == 2
    assert err.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    # Flower's reason format: "<class '...ClientAppException'>:<'...message...'>"
    assert err.error.reason.startswith("<class 'flwr.clientapp.client_app.ClientAppException'>")
    assert "toy client 2 fails on purpose" in err.error.reason


def test_timeout_returns_what_arrived_and_keeps_the_rest(toyapp_dir: Path, identity: None) -> None:
    # partition 1's reply comes 2.5 s late (virtual time: nothing sleeps); the ServerApp gets the
    # replies that arrived within the 1 s timeout; the late one can still be pulled, like on a SuperLink.
    late = FaultPlan(rules=(FaultRule(action="delay", message_type="train", partition_ids=(1,), delay=2.5),))
    grid = _grid(toyapp_dir, faults=late)
    msgs = sorted(_train_msgs(grid), key=lambda m: grid.node_partition(m.metadata.dst_node_id))

    replies = list(grid.send_and_receive(msgs, timeout=1.0))
    later = list(grid.pull_messages([msgs[1].metadata.message_id]))  # partition 1's

    assert sorted(grid.node_partition(r.metadata.src_node_id) for r in replies) == [0, 2, 3]
    assert [grid.node_partition(r.metadata.src_node_id) for r in later] == [1]
    assert grid.stats.late == 1 and grid.stats.delayed == 1


def test_node_state_persists_from_one_message_of_a_node_to_the_next(toyapp_dir: Path,
                                                                    identity: None) -> None:
    # the toy client counts its calls in context.state: every node sees 1, 2, 3
    grid = _grid(toyapp_dir)
    for rnd in (1, 2, 3):
        replies = list(grid.send_and_receive(_train_msgs(grid, rnd), timeout=30))
        assert {int(r.content["metrics"]["calls"]) for r in replies} == {rnd}


def test_pool_gives_the_same_replies_as_inline(toyapp_dir: Path, identity: None) -> None:
    serial, pool = _grid(toyapp_dir, n=9), _grid(toyapp_dir, n=9, workers=2)
    try:
        for rnd in (1, 2):
            a = list(serial.send_and_receive(_train_msgs(serial, rnd), timeout=30))
            b = list(pool.send_and_receive(_train_msgs(pool, rnd), timeout=30))
            assert [r.metadata.src_node_id for r in a] == [r.metadata.src_node_id for r in b]
            for ra, rb in zip(a, b, strict=True):
                np.testing.assert_array_equal(
                    ra.content["arrays"].to_numpy_ndarrays()[0],
                    rb.content["arrays"].to_numpy_ndarrays()[0],
                )
        assert pool.workers == 2
    finally:
        pool.close()


def test_run_config_uses_flower_parser_and_refuses_unknown_keys(toyapp_dir: Path) -> None:
    cfg = resolve_run_config("num-server-rounds=3 timeout=1.5 seed=9", app_dir=toyapp_dir)

    assert cfg["num-server-rounds"] == 3 and cfg["timeout"] == 1.5 and cfg["seed"] == 9
    assert cfg["dim"] == 8  # default kept
    with pytest.raises(ValueError, match="no-such-key"):
        resolve_run_config("no-such-key=1", app_dir=toyapp_dir)


def test_run_inprocess_runs_the_apps_by_reference(toyapp_dir: Path) -> None:
    result = run_inprocess(
        run_config={"num-server-rounds": 3}, num_supernodes=5, app_dir=toyapp_dir
    )
    rounds = result.context.state["toy-results"]["rounds"]

    # reference: mean of w + (pid+1)*0.01*round over pids 0..4, accumulated over rounds
    expected, w = [], 0.0
    for rnd in (1, 2, 3):
        w = w + np.mean([(p + 1) * 0.01 * rnd for p in range(5)])
        expected.append(f"mean={w:.12f}")
    assert [r.split()[-1] for r in rounds] == expected
    assert result.stats.messages == 15 and result.stats.replies == 15
    assert result.run_config["num-server-rounds"] == 3


def test_failed_call_keeps_the_previous_node_state(toyapp_dir: Path, identity: None) -> None:
    from flwr.app import MetricRecord
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg: Message, context):  # type: ignore[no-untyped-def]
        n = int(context.state.get("c", ConfigRecord({"n": 0}))["n"]) + 1
        context.state["c"] = ConfigRecord({"n": n})
        if msg.content["config"]["fail"]:
            raise RuntimeError("failed half-way")
        return Message(RecordDict({"m": MetricRecord({"n": n})}), reply_to=msg)

    spec = load_app_spec(toyapp_dir)
    grid = InProcessGrid(
        client_app=app,
        run=make_run(spec, {}, RUN_ID),
        run_config=resolve_run_config({}, app_dir=toyapp_dir),
        num_supernodes=1,
    )
    (node,) = grid.get_node_ids()

    def call(fail: bool) -> Message:
        content = RecordDict({"config": ConfigRecord({"fail": fail})})
        (reply,) = grid.send_and_receive([Message(content, node, "train")], timeout=30)
        return reply

    assert call(False).content["m"]["n"] == 1
    assert call(True).has_error()
    # Flower does not keep the Context of a failed call: the counter continues from 1
    assert call(False).content["m"]["n"] == 2


def test_load_apps_takes_objects_or_references_and_refuses_the_wrong_kind(toyapp_dir: Path) -> None:
    from server.engine._flwr_private import LoadClientAppError, LoadServerAppError

    spec = load_app_spec(toyapp_dir)
    sapp, capp = load_apps(spec, None, None)
    assert load_apps(spec, sapp, capp) == (sapp, capp)  # objects are used as given
    with pytest.raises(LoadServerAppError, match=f"{spec.client_app_ref} is not a ServerApp"):
        load_apps(spec, spec.client_app_ref, None)
    with pytest.raises(LoadClientAppError, match=f"{spec.server_app_ref} is not a ClientApp"):
        load_apps(spec, None, spec.server_app_ref)


def test_engine_log_line_does_not_disclose_the_message_count(toyapp_dir: Path) -> None:
    """The closing line counted every message (the sum of the cohort sizes, private when
    the run keeps its counts private); it names supernodes, workers and seconds only."""
    import logging

    from server.engine import run_inprocess

    lines: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Grab()
    logging.getLogger("flwr").addHandler(handler)
    try:
        run_inprocess(num_supernodes=4, app_dir=toyapp_dir)
    finally:
        logging.getLogger("flwr").removeHandler(handler)
    engine = [line for line in lines if line.startswith("in-process engine:")]
    assert len(engine) == 1 and "4 supernodes" in engine[0]
    assert "messages" not in engine[0]


def test_message_ids_are_canonical_random_uuid4s() -> None:
    # the engine's own uuid4 strings (one os.urandom call per batch): what str(uuid.uuid4()) gives
    from server.engine.grid import _uuid4s

    ids = _uuid4s(5000)
    parsed = [uuid.UUID(i) for i in ids]
    assert all(str(u) == i and u.version == 4 and u.variant == uuid.RFC_4122 for u, i in zip(parsed, ids, strict=True))
    assert len(set(ids)) == len(ids) and _uuid4s(0) == []
    # every non-fixed bit varies (122 random bits): none stuck at 0 or 1 over 5000 ids
    ored = anded = parsed[0].int
    for u in parsed[1:]:
        ored |= u.int
        anded &= u.int
    fixed = (0xF << 76) | (0x3 << 62)
    assert ored | fixed == (1 << 128) - 1 and anded & ~fixed == 0
