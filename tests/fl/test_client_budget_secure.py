"""The client's budget on the secure path against a deviating server, with the real
ClientApp handlers on the in-process engine: node state rolled back after a masked reply, and seeded rounds."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from clients import client_app as real
from fedprivacy.accounting.kls import zcdp_epsilon
from fedprivacy.fl.client_budget import ClientBudget
from fedprivacy.fl.client_policy import PolicyRefusal
from fedprivacy_flwr import codec
from server.engine import run_inprocess

REPO = Path(__file__).resolve().parents[2]
BASE = {"num-server-rounds": 1, "accountant": "rdp", "client-timeout": 120.0, "local-epochs": 1,
        "privacy": "distributed", "secagg": True, "noise-multiplier": 1.0, "clip-norm": 1.0,
        "target-delta": 1e-3, "max-failed-fraction": 1.0}


def _app(floor: dict[str, Any], masked=None, *, budget: Path, consistency=None, unmask=None,
         share=None) -> ClientApp:
    """The real handlers, each node with ``floor`` in its node config (the operator's, not the server's);
    node 0 keeps its budget file at ``budget`` (a node's file is its own)."""
    def with_floor(handler):
        def run(msg, context):
            own = {"client-budget-path": str(budget)} if context.node_config["partition-id"] == 0 else {}
            context.node_config = {**context.node_config, **floor, **own}
            return handler(msg, context)
        return run

    app = ClientApp()
    app.query()(with_floor(real.query))
    app.query("secagg_advertise")(with_floor(real.secagg_advertise))
    app.query("secagg_share")(with_floor(share or real.secagg_share))
    app.train("secagg_masked")(with_floor(masked or real.secagg_masked))
    app.query("secagg_consistency")(with_floor(consistency or real.secagg_consistency))
    app.query("secagg_unmask")(with_floor(unmask or real.secagg_unmask))
    return app


def _then_replayed(handler, seen: dict[str, Any], name: str, replay):
    """Node 0 answers ``handler``'s request; then the deviating server's second request, ``replay(msg, context,
    state before the answer)``: ``seen[name]`` is the client's refusal, or "answered again"."""
    def run(msg: Message, context):
        if context.node_config["partition-id"] != 0:
            return handler(msg, context)
        before = copy.deepcopy(context.state)
        reply = handler(msg, context)
        try:
            replay(msg, context, before)
            seen[name] = "answered again"
        except PolicyRefusal as exc:
            seen[name] = str(exc)
        return reply
    return run


def _rolled_back(context, before) -> None:
    """Flower's node-state save after the reply is lost: the state is what it was before the stage."""
    for k in list(context.state.keys()):
        del context.state[k]
    for k, v in before.items():
        context.state[k] = v


def test_a_masked_request_replayed_after_the_node_state_was_lost_is_refused(tmp_path: Path) -> None:
    # Arrange: the reply leaves, then Flower's node-state save is lost (the state goes back to
    # what it was before the masked stage) and the server sends the same round's masked request again: the
    # same masks and XNoise would answer it, and the difference of the two replies is the client's update
    budget = tmp_path / "budget.jsonl"
    seen: dict[str, Any] = {}

    def again(msg: Message, context, before) -> None:
        _rolled_back(context, before)
        instr, _ = codec.decode_train(msg)
        forged = Message(RecordDict({**{k: v for k, v in msg.content.items() if k != "config"},
                                     "config": codec.instructions_record(dataclasses.replace(instr, learning_rate=1e-30))}),
                         dst_node_id=msg.metadata.dst_node_id, message_type=msg.metadata.message_type,
                         group_id=msg.metadata.group_id)
        real.secagg_masked(forged, context)

    masked_twice = _then_replayed(real.secagg_masked, seen, "masked", again)

    floor = {"client-max-rho-total": 20.0}
    # Act
    run_inprocess(run_config={**BASE, "seed": -1, "output-dir": str(tmp_path), "run-name": "y2"},
                  num_supernodes=5, app_dir=REPO, node_id_seed=1, client_app=_app(floor, masked_twice, budget=budget))
    # Assert: the replay is refused by the durable record, which holds the one charge of round 1
    assert "already released by this client" in seen["masked"]
    lines = [json.loads(line) for line in budget.read_text().splitlines()[1:]]
    assert [(c["round"], c["mode"]) for c in lines if c["kind"] == "charge"] == [(1, "distributed")]
    # and the charge carries its release's discrete slack, which the client's total adds
    (charge,) = [c for c in lines if c["kind"] == "charge"]
    assert charge["slack"] > 0 and charge["tv"] > 0
    total = ClientBudget(max_rho_total=20.0, neighbouring="add-remove", path=budget)
    assert total.epsilon(delta=1e-5) >= zcdp_epsilon(rho=charge["rho"], delta=1e-5) + 2 * charge["slack"]


def test_a_masked_request_replayed_under_another_run_of_the_series_is_refused(tmp_path: Path) -> None:
    # Arrange: as above, node 0's node-state save is lost after its masked reply; the server then
    # opens another run of the same run series (Flower 1.42's SuperNode hands it the series' node state, and the
    # submitter picks the series), so the budget file's (run, round) records would not see a repeat
    budget = tmp_path / "budget.jsonl"
    seen: dict[str, Any] = {}

    def in_another_run(msg: Message, context, before) -> None:
        real.secagg_masked(msg, Context(run_id=int(context.run_id) + 1, node_id=context.node_id,
                                        node_config=dict(context.node_config), state=before,
                                        run_config=dict(context.run_config)))

    masked_in_another_run = _then_replayed(real.secagg_masked, seen, "masked", in_another_run)

    # Act
    run_inprocess(run_config={**BASE, "seed": -1, "output-dir": str(tmp_path), "run-name": "z1"},
                  num_supernodes=5, app_dir=REPO, node_id_seed=1,
                  client_app=_app({"client-max-rho-total": 20.0}, masked_in_another_run, budget=budget))
    # Assert: the old run's session, masks and noise are not used by the new run; one charge on record
    assert "was not made in this run" in seen["masked"]
    lines = [json.loads(line) for line in budget.read_text().splitlines()[1:]]
    assert [(c["round"], c["mode"]) for c in lines if c["kind"] == "charge"] == [(1, "distributed")]


def test_a_seeded_secure_round_is_refused_by_a_finite_total(tmp_path: Path) -> None:
    # Arrange: the operator allows the seeded research mode; the server's seed fixes the XNoise,
    # so the server can subtract it: the round costs an unbounded rho, which a finite total cannot pay
    budget = tmp_path / "budget.jsonl"
    floor = {"client-max-rho-total": 20.0, "client-allow-seeded": True}
    # Act
    run_inprocess(run_config={**BASE, "seed": 11, "output-dir": str(tmp_path), "run-name": "y3"},
                  num_supernodes=5, app_dir=REPO, node_id_seed=1, client_app=_app(floor, budget=budget))
    # Assert: every client refused at its share stage (before any secret left it): nothing released or charged
    res = json.loads((tmp_path / "y3" / "results.json").read_text())
    assert res["status"] == "clients-failed" and all(r.get("aborted") for r in res["rounds"])
    lines = [json.loads(line) for line in budget.read_text().splitlines()[1:]]
    assert [(ln["kind"], ln.get("stage")) for ln in lines] == [("stage", "admit")]  # took part; shared nothing


def test_a_seed_sent_only_with_the_masked_request_costs_an_unbounded_rho(tmp_path: Path) -> None:
    # Arrange: the share stage is unseeded (its finite rho is held), then the server puts a seed in
    # the masked request only: the client's rounding and XNoise base component would follow from it, which the
    # server can regenerate (with every client surviving, the base is the whole released noise)
    budget = tmp_path / "budget.jsonl"
    floor = {"client-max-rho-total": 20.0, "client-allow-seeded": True}

    def seeded_masked(msg: Message, context):
        instr, _ = codec.decode_train(msg)
        forged = Message(RecordDict({**{k: v for k, v in msg.content.items() if k != "config"},
                                     "config": codec.instructions_record(dataclasses.replace(instr, seed=777))}),
                         dst_node_id=msg.metadata.dst_node_id, message_type=msg.metadata.message_type,
                         group_id=msg.metadata.group_id)
        return Message(real.secagg_masked(forged, context).content, reply_to=msg)

    # Act
    run_inprocess(run_config={**BASE, "seed": -1, "output-dir": str(tmp_path), "run-name": "z2"},
                  num_supernodes=5, app_dir=REPO, node_id_seed=1, client_app=_app(floor, seeded_masked, budget=budget))
    # Assert: every masked vector was withheld (an unbounded rho a finite total cannot pay); nothing charged
    res = json.loads((tmp_path / "z2" / "results.json").read_text())
    assert res["status"] == "clients-failed" and all(r.get("aborted") for r in res["rounds"])
    lines = [json.loads(line) for line in budget.read_text().splitlines()[1:]]
    assert [ln for ln in lines if ln["kind"] == "charge"] == []


def _answered_twice(handler, seen: dict[str, Any], name: str):
    """Node 0 answers, its node-state save is lost, and the server sends the same request again."""
    def again(msg: Message, context, before) -> None:
        _rolled_back(context, before)
        handler(msg, context)
    return _then_replayed(handler, seen, name, again)


def test_the_share_consistency_and_unmask_stages_are_answered_once_despite_a_lost_node_state(
        tmp_path: Path) -> None:
    # Arrange: after a rollback the session no longer knows it split its keys, signed a
    # view or revealed shares; a second share request (another roster) would split the same keys again, and a
    # second unmask request with another dropped set would reveal a survivor's other share
    budget = tmp_path / "budget.jsonl"
    seen: dict[str, Any] = {}
    app = _app({"client-max-rho-total": 20.0}, budget=budget,
               share=_answered_twice(real.secagg_share, seen, "share"),
               consistency=_answered_twice(real.secagg_consistency, seen, "consistency"),
               unmask=_answered_twice(real.secagg_unmask, seen, "unmask"))
    # Act
    run_inprocess(run_config={**BASE, "seed": -1, "output-dir": str(tmp_path), "run-name": "y2b"},
                  num_supernodes=5, app_dir=REPO, node_id_seed=1, client_app=app)
    # Assert: both second answers refused from the file's record, which holds one line per stage
    assert "share stage of this run was already answered" in seen["share"]
    assert "consistency stage of this run was already answered" in seen["consistency"]
    assert "unmask stage of this run was already answered" in seen["unmask"]
    lines = [json.loads(line) for line in budget.read_text().splitlines()[1:]]
    assert [(ln["kind"], ln.get("stage")) for ln in lines] == [("stage", "admit"), ("stage", "share"), ("charge", None),
                                                              ("stage", "consistency"), ("stage", "unmask")]
