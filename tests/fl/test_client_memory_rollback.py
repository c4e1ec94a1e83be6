"""A server that gets a client's node state rolled back, under the default configuration (no
``client-budget-path``): the real ClientApp handlers on the in-process engine, real crypto.

The adversary: after node 0 answers a secure stage, Flower's node-state save is lost (``context.state``
goes back to the copy from before the stage) and the server sends the stage's request again. Without a
durable memory the session would answer again: a second signed view or a second unmask reveals the other
share of a peer, a second upload under the same masks and noise gives the difference of two updates. The
node's default memory (a simulation's run-temporary file, or a SuperNode's default directory) refuses the
second answer, and the test audits what the server holds: one upload per client, and for no client both
its self-mask seed shares and its pairwise-key shares, so the only vector it can unmask is the sum.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Message, RecordDict
from flwr.clientapp import ClientApp

from clients import client_app as real
from fedprivacy.fl.client_policy import ClientPolicy, PolicyRefusal
from fedprivacy_flwr import codec
from fedprivacy_flwr.secagg_records import from_records
from server.engine import run_inprocess

REPO = Path(__file__).resolve().parents[2]
BASE = {"num-server-rounds": 1, "accountant": "rdp", "client-timeout": 120.0, "local-epochs": 1,
        "privacy": "distributed", "secagg": True, "noise-multiplier": 1.0, "clip-norm": 1.0,
        "target-delta": 1e-3, "max-failed-fraction": 1.0, "seed": -1}
HANDLERS = {"share": "secagg_share", "masked": "secagg_masked", "consistency": "secagg_consistency",
            "unmask": "secagg_unmask"}


def _rolled_back(context, before: RecordDict) -> None:
    """The node-state save after the reply is lost: the state is what it was before the stage."""
    for k in list(context.state.keys()):
        del context.state[k]
    for k, v in before.items():
        context.state[k] = v


def _second_request(stage: str, msg: Message) -> Message:
    """The server's second request: the same one (a masked one with a vanishing learning rate, whose
    upload minus the first would be the victim's update under the same masks and noise)."""
    if stage != "masked":
        return msg
    instr, _ = codec.decode_train(msg)
    config = codec.instructions_record(dataclasses.replace(instr, learning_rate=1e-30))
    return Message(RecordDict({**{k: v for k, v in msg.content.items() if k != "config"}, "config": config}),
                   dst_node_id=msg.metadata.dst_node_id, message_type=msg.metadata.message_type,
                   group_id=msg.metadata.group_id)


def _app(attacked: str, *, memory_dir: str | None, seen: dict[str, Any],
         replies: dict[str, list[tuple[int, Any]]]) -> ClientApp:
    """Every node runs the real handlers (``memory_dir``: its node config's ``client-memory-dir``, None
    = the engine's default); node 0's ``attacked`` stage is rolled back and asked again; every reply that
    leaves a client is kept in ``replies`` (what the server holds)."""
    def wrap(stage: str | None, handler):
        def run(msg: Message, context):
            if memory_dir is not None:
                context.node_config = {**context.node_config, "client-memory-dir": memory_dir}
            pid = int(context.node_config["partition-id"])
            before = copy.deepcopy(context.state)
            reply = handler(msg, context)
            if stage is not None:
                replies[stage].append((pid, from_records(reply.content, stage=stage)))
            if stage == attacked and pid == 0:
                _rolled_back(context, before)
                try:
                    second = handler(_second_request(stage, msg), context)
                    seen["second"] = "answered again"
                    replies[stage].append((pid, from_records(second.content, stage=stage)))
                except PolicyRefusal as exc:
                    seen["second"] = str(exc)
            return reply
        return run

    app = ClientApp()
    app.query()(wrap(None, real.query))
    app.query("secagg_advertise")(wrap(None, real.secagg_advertise))
    app.query("secagg_share")(wrap("share", real.secagg_share))
    app.train("secagg_masked")(wrap("masked", real.secagg_masked))
    app.query("secagg_consistency")(wrap("consistency", real.secagg_consistency))
    app.query("secagg_unmask")(wrap("unmask", real.secagg_unmask))
    return app


@pytest.mark.parametrize("stage, memory_dir", [("share", None), ("masked", None), ("consistency", None),
                                               ("unmask", None), ("masked", ""), ("unmask", "")],
                         ids=["share", "masked", "consistency", "unmask", "masked-supernode", "unmask-supernode"])
def test_a_rolled_back_node_state_gets_no_second_answer_at_any_secure_stage(
        stage: str, memory_dir: str | None, tmp_path: Path) -> None:
    # Arrange: the default configuration: no client-budget-path; the simulation's run-temporary memory
    # (None) or a SuperNode's default directory ("")
    seen: dict[str, Any] = {}
    replies: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    app = _app(stage, memory_dir=memory_dir, seen=seen, replies=replies)
    # Act
    run_inprocess(run_config={**BASE, "output-dir": str(tmp_path), "run-name": "rb"}, num_supernodes=5,
                  app_dir=REPO, node_id_seed=1, client_app=app)
    # Assert: the second answer is refused by the node's durable memory
    assert f"round 1's {stage} stage" in seen["second"] or "already released by this client" in seen["second"]
    # the round went on with node 0's one answer: the sum is released
    res = json.loads((tmp_path / "rb" / "results.json").read_text())
    assert res["status"] == "completed"
    # what the server holds: one reply per client and stage, so one upload of node 0 (no difference attack)
    for got in replies.values():
        assert sorted(pid for pid, _ in got) == [0, 1, 2, 3, 4]
    # and no client's two secrets: for every owner, either self-mask shares or pairwise-key shares, never both
    seed_owners = {o for _, r in replies["unmask"] for o in r.seed_owners}
    key_owners = {o for _, r in replies["unmask"] for o in r.key_owners}
    assert seed_owners and not seed_owners & key_owners  # every client survived: seeds only, the sum only
    # the memory is where the default says, and it is the node's file (not Flower's node state)
    if memory_dir == "":
        home = Path(os.environ["FEDPRIVACY_CLIENT_MEMORY_DIR"])
        assert (home / "partition-0.jsonl").exists()
        stages = [json.loads(ln) for ln in (home / "partition-0.jsonl").read_text().splitlines()[1:]]
        assert [(s["kind"], s.get("stage")) for s in stages] == [
            ("stage", "admit"), ("stage", "share"), ("charge", None), ("stage", "consistency"), ("stage", "unmask")]
    assert ClientPolicy().budget_path == "" and ClientPolicy().memory_dir == ""


def test_a_simulations_memory_goes_with_its_run(tmp_path: Path) -> None:
    # the run-temporary area holds every node's file while the run lasts, and nothing after it
    seen: list[Path] = []

    def masked(msg: Message, context):
        seen.extend(Path(os.environ["FEDPRIVACY_RUN_TEMP"]).glob("run-*/partition-*.jsonl"))
        return real.secagg_masked(msg, context)

    app = ClientApp()
    app.query()(real.query)
    for stage in ("advertise", "share", "consistency", "unmask"):
        app.query(f"secagg_{stage}")(getattr(real, f"secagg_{stage}"))
    app.train("secagg_masked")(masked)
    run_inprocess(run_config={**BASE, "output-dir": str(tmp_path), "run-name": "tmp"}, num_supernodes=5,
                  app_dir=REPO, node_id_seed=1, client_app=app)
    assert seen and not list(Path(os.environ["FEDPRIVACY_RUN_TEMP"]).glob("run-*/*"))
