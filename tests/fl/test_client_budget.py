"""The client's cumulative ρ budget: a server that keeps asking gets refused.

The adversary is the server: it picks every round number and may start new runs. The client sums the
zCDP ρ of what it released (Bun & Steinke 2016, Lemma 2.3) in its own durable memory (a budget file, or the node's default file), and a
round its total cannot pay is refused (a dropout). Against the real ClientApp's train handler.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.client_app import train
from fedprivacy.config import RunConfig
from fedprivacy.fl.client_budget import BUDGET_FORMAT, BudgetCharge, ClientBudget, total_epsilon
from fedprivacy.fl.client_policy import ClientPolicy, PolicyRefusal
from fedprivacy.fl.types import RoundInstructions
from fedprivacy_flwr import codec
from server.engine._flwr_private import TaskIdentityScope

REPO = Path(__file__).resolve().parents[2]
CFG = RunConfig(privacy="local", secagg=False, clip_norm=0.5, noise_multiplier=1.0, model="mlp")


@pytest.fixture(autouse=True)
def _task_identity():
    with TaskIdentityScope(1):
        yield


def _context(run_id: int = 1, **client_keys: object) -> Context:
    return Context(run_id=run_id, node_id=7, node_config={"partition-id": 0, "num-partitions": 3, **client_keys},
                   state=RecordDict(), run_config=CFG.to_mapping())


@pytest.fixture(scope="module")
def weights() -> list[np.ndarray]:
    from fedprivacy.fl.task import default_hooks

    return [np.asarray(w) for w in default_hooks(CFG, population=3).init(0)]


def _message(weights: list[np.ndarray], **changes: object):
    instr = RoundInstructions(round=1, privacy="local", clip_norm=0.5, client_mechanism="gaussian", noise_multiplier=1.0, private=True, learning_rate=0.1,
                              local_epochs=1, batch_size=32, num_classes=10, seed=-1)
    return codec.train_message(7, dataclasses.replace(instr, **changes), codec.arrays_to_record(weights))


def _file_charges(path: Path) -> list[dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    head = dict(lines[0])
    assert len(head.pop("id")) == 16  # the file's random id, which the node state remembers
    assert head == {"kind": "header", "format": BUDGET_FORMAT, "neighbouring": "add-remove"}
    return [ln for ln in lines[1:] if ln["kind"] == "charge"]  # secure rounds' stage lines aside


# ------------------------------------------------------------------ the adversary, local mode
def test_fresh_round_numbers_run_the_budget_out_then_every_round_is_refused(tmp_path: Path, weights,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    # Arrange: the client's own floor: z >= 1 (rho = 2/z^2 = 2 per local round), a total of 5 in its file
    path = tmp_path / "node" / "budget.jsonl"
    keys = {"client-max-rho-total": 5.0, "client-budget-path": str(path)}
    ctx = _context(**keys)
    # Act: the server asks for round after round with fresh, increasing numbers (and less noise)
    answered, refused = [], []
    for rnd in (1, 2, 3, 17, 1000):
        try:
            train(_message(weights, round=rnd, noise_multiplier=2e-9), ctx)
            answered.append(rnd)
        except PolicyRefusal as exc:
            refused.append((rnd, str(exc)))
    # Assert: two rounds (rho 4 <= 5); the third would be 6 > 5; nothing after it either
    assert answered == [1, 2] and [r for r, _ in refused] == [3, 17, 1000]
    assert all("client-max-rho-total" in why and "cumulative budget cannot pay" in why for _, why in refused)
    # the figures stay in the client's own log, not in the reason the server receives
    assert not any("6 > 5" in why or str(path) in why for _, why in refused)
    local = [r.getMessage() for r in caplog.records if r.name == "fedprivacy.fl.client_budget"]
    assert len(local) == 3 and all("total to 6 > 5" in m and str(path) in m for m in local)
    charges = _file_charges(path)
    assert [(c["round"], c["rho"], c["mode"], c["run"]) for c in charges] == [(1, 2.0, "local", "1"), (2, 2.0, "local", "1")]
    assert math.fsum(c["rho"] for c in charges) <= 5.0
    assert path.stat().st_mode & 0o077 == 0  # the operator's file, owner-only


def test_a_new_run_with_the_same_budget_file_is_refused(tmp_path: Path, weights,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    # Arrange: run 1 spends the budget
    path = tmp_path / "budget.jsonl"
    keys = {"client-max-rho-total": 4.0, "client-budget-path": str(path)}
    ctx1 = _context(run_id=1, **keys)
    for rnd in (1, 2):
        train(_message(weights, round=rnd), ctx1)
    # Act / Assert: a new run (fresh node state, round numbers from 1 again) is refused at once
    with pytest.raises(PolicyRefusal, match=r"round 1 would cost rho = 2, which this client's cumulative budget") as refused:
        train(_message(weights, round=1), _context(run_id=2, **keys))
    # the reason reaches the new run's server: nothing of the node's history in it
    assert str(path) not in str(refused.value) and "spent" not in str(refused.value)
    assert "6" not in str(refused.value).replace("2016", "")
    assert len(_file_charges(path)) == 2

def test_a_new_run_does_not_reset_the_default_memorys_budget(weights, caplog: pytest.LogCaptureFixture) -> None:
    # Arrange: the default configuration (no client-budget-path): the node's memory in its default directory
    per_node = {"client-max-rho-total": 4.0}
    ctx3 = _context(run_id=3, **per_node)
    train(_message(weights, round=1), ctx3)
    train(_message(weights, round=2), ctx3)
    with pytest.raises(PolicyRefusal, match="cumulative budget cannot pay"):
        train(_message(weights, round=3), ctx3)
    # Act: the server starts a new run (fresh node state, round numbers from 1 again)
    caplog.clear()
    with pytest.raises(PolicyRefusal, match="cumulative budget cannot pay"):
        train(_message(weights, round=1), _context(run_id=4, **per_node))
    # Assert: the charges of run 3 are in the node's own file, which the new run reads
    path = ClientPolicy().memory_path(run_id=4, partition_id=0)
    assert path.parent == Path(os.environ["FEDPRIVACY_CLIENT_MEMORY_DIR"])
    assert [(c["run"], c["round"]) for c in _file_charges(path)] == [("3", 1), ("3", 2)]
    assert any(str(path) in r.getMessage() for r in caplog.records)


def test_a_round_replayed_after_its_node_state_was_lost_is_refused_by_the_budget_file(tmp_path: Path,
                                                                                     weights) -> None:
    # Arrange: Flower saves node state after the reply has left, once; a lost save rolls the
    # round record (and a secure round's session) back, so the same round could be answered again
    path = tmp_path / "budget.jsonl"
    keys = {"client-max-rho-total": 10.0, "client-budget-path": str(path)}
    train(_message(weights, round=1), _context(run_id=5, **keys))
    # Act / Assert: the same run and round from a node whose state was lost (a fresh Context) is refused
    with pytest.raises(PolicyRefusal, match=r"round 1's admit stage of this run was already answered by this client"):
        train(_message(weights, round=1), _context(run_id=5, **keys))
    assert [(c["run"], c["round"]) for c in _file_charges(path)] == [("5", 1)]
    # another round of the run, or round 1 of another run, is a new release
    train(_message(weights, round=2), _context(run_id=5, **keys))
    train(_message(weights, round=1), _context(run_id=6, **keys))
    assert [(c["run"], c["round"]) for c in _file_charges(path)] == [("5", 1), ("5", 2), ("6", 1)]


def test_a_seeded_round_costs_an_unbounded_rho(tmp_path: Path, weights) -> None:
    # the server that sent the seed regenerates the client's noise and subtracts it
    policy = ClientPolicy(allow_seeded=True)
    instr = RoundInstructions(round=1, privacy="local", clip_norm=0.5, client_mechanism="gaussian", noise_multiplier=1.0, private=True, learning_rate=0.1,
                              local_epochs=1, batch_size=32, num_classes=10, seed=-1)
    assert policy.round_rho(instr) == pytest.approx(2.0)
    assert policy.round_rho(dataclasses.replace(instr, seed=3)) == math.inf
    keys = {"client-max-rho-total": 10.0, "client-budget-path": str(tmp_path / "b.jsonl"),
            "client-allow-seeded": True}
    with pytest.raises(PolicyRefusal, match="unbounded rho"):
        train(_message(weights, round=1, seed=3), _context(**keys))
    train(_message(weights, round=2), _context(**keys))  # its own secure source: rho = 2


def test_the_default_floor_has_a_finite_total(weights) -> None:
    # no client-* keys: rho 2 per local round, total 20 -> the 11th round is refused
    ctx = _context()
    for rnd in range(1, 11):
        train(_message(weights, round=rnd, noise_multiplier=2e-9), ctx)
    with pytest.raises(PolicyRefusal, match="client-max-rho-total"):
        train(_message(weights, round=11), ctx)
    assert ClientPolicy().max_rho_total == 20.0


def test_central_and_none_rounds_cost_an_unbounded_rho(tmp_path: Path, weights) -> None:
    # the update leaves without the client's noise: a finite total cannot pay for it
    path = tmp_path / "b.jsonl"
    keys = {"client-privacy-modes": "central,none,local", "client-budget-path": str(path)}
    with pytest.raises(PolicyRefusal, match="unbounded rho"):
        train(_message(weights, privacy="central", client_mechanism="", noise_multiplier=0.0), _context(**keys))
    assert _file_charges(path) == []
    # an operator who trusts the server lifts the total; the record then says it is unbounded
    ctx = _context(**keys, **{"client-max-rho-total": "inf"})
    train(_message(weights, privacy="none", round=2, client_mechanism="", noise_multiplier=0.0, private=False), ctx)
    train(_message(weights, privacy="local", round=3), ctx)
    assert [c["rho"] for c in _file_charges(path)] == ["inf", 2.0]
    assert ClientBudget(max_rho_total=math.inf, neighbouring="add-remove", path=path).spent == math.inf
    # and the same file under a finite total refuses everything after
    with pytest.raises(PolicyRefusal, match="client-max-rho-total"):
        train(_message(weights, round=4), _context(run_id=2, **keys, **{"client-max-rho-total": 100.0}))


def test_a_file_kept_under_another_relation_is_refused(tmp_path: Path, weights) -> None:
    path = tmp_path / "b.jsonl"
    train(_message(weights), _context(**{"client-budget-path": str(path)}))
    with pytest.raises(ValueError, match="client-neighbouring"):
        train(_message(weights, round=2), _context(**{"client-budget-path": str(path),
                                                      "client-neighbouring": "replace-one"}))


# ------------------------------------------------------------------ durability
CHILD = r"""
import os, signal, sys, dataclasses
sys.path.insert(0, sys.argv[1])
import numpy as np
from flwr.app import Context, RecordDict
from clients import client_app
from fedprivacy.config import RunConfig
from fedprivacy.fl.types import RoundInstructions
from fedprivacy.fl.task import default_hooks
from fedprivacy_flwr import codec
from server.engine._flwr_private import TaskIdentityScope

cfg = RunConfig(privacy="local", secagg=False, clip_norm=0.5, noise_multiplier=1.0, model="mlp")
ctx = Context(run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 3,
              "client-budget-path": sys.argv[2]}, state=RecordDict(), run_config=cfg.to_mapping())
w = [np.asarray(a) for a in default_hooks(cfg, population=3).init(0)]
instr = RoundInstructions(round=1, privacy="local", clip_norm=0.5, client_mechanism="gaussian", noise_multiplier=1.0, private=True, learning_rate=0.1,
                          local_epochs=1, batch_size=32, num_classes=10, seed=-1)
if sys.argv[3] == "training":  # die while training: no reply, and no charge either
    real = client_app.train_client
    def dying(*a, **k):
        os.kill(os.getpid(), signal.SIGKILL)
    client_app.train_client = dying
with TaskIdentityScope(1):
    reply = client_app.train(codec.train_message(7, instr, codec.arrays_to_record(w)), ctx)
# the reply has left the ClientApp: the parent is told, then the process dies at once (no cleanup)
os.write(1, b"replied\n")
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("point", ["replied", "training"])
def test_the_charge_is_on_disk_before_the_reply_leaves(tmp_path: Path, point: str) -> None:
    # Arrange / Act: a real ClientApp process SIGKILLed right after its reply left (or while training)
    path = tmp_path / "budget.jsonl"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(REPO), str(path), point], cwd=REPO,
                          capture_output=True, timeout=300, check=False)
    # Assert
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    if point == "replied":  # whatever left, its charge was in the file first
        assert proc.stdout == b"replied\n"
        assert [(c["round"], c["rho"]) for c in _file_charges(path)] == [(1, 2.0)]
    else:  # nothing left: nothing charged (never a charge without cause, never a release without charge)
        assert proc.stdout == b"" and _file_charges(path) == []


# ------------------------------------------------------------------ properties of the ledger
rhos = st.lists(st.one_of(st.floats(min_value=0.0, max_value=3.0), st.just(math.inf)), max_size=25)


@settings(max_examples=60, deadline=None)
@given(requests=rhos, total=st.floats(min_value=0.1, max_value=20.0))
def test_charged_rho_never_exceeds_the_total_and_a_refusal_changes_nothing(tmp_path_factory, requests,
                                                                           total) -> None:
    path = tmp_path_factory.mktemp("b") / "budget.jsonl"
    budget = ClientBudget(max_rho_total=total, neighbouring="add-remove", path=path)
    accepted: list[float] = []
    for rnd, rho in enumerate(requests, start=1):
        before = path.read_bytes()
        try:
            budget.charge(rho, run="1", round=rnd, mode="local")
            accepted.append(rho)
        except PolicyRefusal:
            assert path.read_bytes() == before  # check first, change state last
            assert math.fsum(accepted) + rho > total
    assert math.fsum(accepted) <= total and budget.spent == math.fsum(accepted)
    # the file is the ledger: a fresh reader (another run) sees exactly the accepted charges
    again = ClientBudget(max_rho_total=total, neighbouring="add-remove", path=path)
    assert [c.rho for c in again.charges] == accepted


@settings(max_examples=60, deadline=None)
@given(n=st.integers(min_value=0, max_value=6), cut=st.floats(min_value=0.0, max_value=1.0))
def test_a_crash_at_any_byte_keeps_every_charge_whose_line_was_complete(tmp_path_factory, n, cut) -> None:
    path = tmp_path_factory.mktemp("b") / "budget.jsonl"
    budget = ClientBudget(max_rho_total=100.0, neighbouring="add-remove", path=path)
    for rnd in range(1, n + 1):
        budget.charge(0.25 * rnd, run="1", round=rnd, mode="distributed")
    raw = path.read_bytes()
    header_len = raw.index(b"\n") + 1
    keep = header_len + int(cut * (len(raw) - header_len))
    path.write_bytes(raw[:keep])
    complete = raw[:keep].count(b"\n") - 1  # the header's line is complete
    recovered = ClientBudget(max_rho_total=100.0, neighbouring="add-remove", path=path)
    assert [c.round for c in recovered.charges] == list(range(1, complete + 1))
    assert path.read_bytes() == raw[: raw[:keep].rfind(b"\n") + 1]  # the torn line is cut off


def test_the_total_epsilon_adds_the_discrete_slack_by_the_servers_chain() -> None:
    # Reference: rho-zCDP composed, converted at delta' = delta (1 - 1e-6) e^-H', plus 2H', with
    # H' = sum slack - log(1 - sum tv) (fedprivacy.accounting.audiences.slack_epsilon), computed by hand here
    from fedprivacy.accounting.kls import zcdp_epsilon

    charges = [BudgetCharge(run="1", round=r, mode="distributed", rho=0.5, slack=4e-7, tv=3e-70) for r in (1, 2, 3)]
    charges.append(BudgetCharge(run="2", round=1, mode="local", rho=2.0))
    h = 3 * 4e-7 - math.log1p(-9e-70)
    expected = zcdp_epsilon(rho=3.5, delta=1e-5 * (1 - 1e-6) * math.exp(-h)) + 2 * h
    assert math.isclose(total_epsilon(charges, delta=1e-5), expected, rel_tol=1e-12)
    assert total_epsilon(charges, delta=1e-5) > zcdp_epsilon(rho=3.5, delta=1e-5) + 2.4e-6  # the slack counts
    # without slack the total is rho-zCDP's own conversion; a round without the client's noise makes it unbounded
    assert total_epsilon(charges[3:], delta=1e-5) == zcdp_epsilon(rho=2.0, delta=1e-5)
    assert total_epsilon([*charges, BudgetCharge(run="3", round=1, mode="central", rho=math.inf)],
                         delta=1e-5) == math.inf


@settings(max_examples=60, deadline=None)
@given(rhos=st.lists(st.floats(min_value=0.0, max_value=5.0), min_size=1, max_size=6),
       slacks=st.lists(st.floats(min_value=0.0, max_value=1e-4), min_size=6, max_size=6),
       tvs=st.lists(st.floats(min_value=0.0, max_value=1e-20), min_size=6, max_size=6))
def test_the_total_epsilon_grows_with_every_charge_and_its_slack(rhos, slacks, tvs) -> None:
    charges = [BudgetCharge(run="1", round=i, mode="distributed", rho=r, slack=slacks[i], tv=tvs[i])
               for i, r in enumerate(rhos)]
    bare = [dataclasses.replace(c, slack=0.0, tv=0.0) for c in charges]
    eps = [total_epsilon(charges[:k], delta=1e-6) for k in range(len(charges) + 1)]
    assert all(a <= b for a, b in zip(eps, eps[1:], strict=False))  # composition never lowers the total
    assert total_epsilon(charges, delta=1e-6) >= total_epsilon(bare, delta=1e-6)
    assert total_epsilon(charges, delta=1e-6) >= 2 * math.fsum(slacks[: len(charges)])


def test_a_charges_slack_survives_the_file(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    budget = ClientBudget(max_rho_total=10.0, neighbouring="add-remove", path=path)
    budget.charge(0.5, run="1", round=1, mode="distributed", slack=4.27e-7, tv=1.7e-70)
    budget.charge(1.0, run="1", round=2, mode="local")
    lines = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    assert (lines[0]["slack"], lines[0]["tv"]) == (4.27e-7, 1.7e-70) and "slack" not in lines[1]
    again = ClientBudget(max_rho_total=10.0, neighbouring="add-remove", path=path)
    assert again.charges == budget.charges and again.epsilon(delta=1e-5) == budget.epsilon(delta=1e-5)
    with pytest.raises(ValueError, match="slack must be finite"):
        BudgetCharge(run="1", round=3, mode="distributed", rho=0.5, slack=-1e-9)


def test_a_damaged_line_before_the_end_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    budget = ClientBudget(max_rho_total=10.0, neighbouring="add-remove", path=path)
    budget.charge(1.0, run="1", round=1, mode="local")
    budget.charge(1.0, run="1", round=2, mode="local")
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{not json", lines[2]]) + "\n")
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        ClientBudget(max_rho_total=10.0, neighbouring="add-remove", path=path)


def test_node_config_keys_and_the_charge_record() -> None:
    p = ClientPolicy.from_node_config({"client-max-rho-total": "7.5", "client-budget-path": "/x/b.jsonl"})
    assert (p.max_rho_total, p.budget_path) == (7.5, "/x/b.jsonl")
    assert ClientPolicy.from_node_config(p.to_node_config()) == p
    assert ClientPolicy.from_node_config({"client-max-rho-total": "inf"}).max_rho_total == math.inf
    with pytest.raises(ValueError, match="max_rho_total must be > 0"):
        ClientPolicy(max_rho_total=0.0)
    assert ClientPolicy.for_simulation(CFG).max_rho_total == math.inf  # the user runs both sides
    c = BudgetCharge(run="3", round=4, mode="none", rho=math.inf)
    assert BudgetCharge.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    with pytest.raises(ValueError, match="rho must be >= 0"):
        BudgetCharge(run="3", round=4, mode="local", rho=float("nan"))


# ------------------------------------------------------------------ distributed mode, real apps
def _budgeted_client_app(budget_dir: Path, total: float):
    """The real ClientApp, each node with its operator's budget keys (its own file) in node_config."""
    from flwr.clientapp import ClientApp

    from clients import client_app as real

    app = ClientApp()

    def wrap(handler):
        def run(msg, context):
            pid = context.node_config["partition-id"]
            context.node_config = {**context.node_config, "client-max-rho-total": total,
                                   "client-budget-path": str(budget_dir / f"node{pid}.jsonl")}
            return handler(msg, context)
        return run

    app.query()(wrap(real.query))
    app.query("secagg_advertise")(wrap(real.secagg_advertise))
    app.query("secagg_share")(wrap(real.secagg_share))
    app.train("secagg_masked")(wrap(real.secagg_masked))
    app.query("secagg_consistency")(wrap(real.secagg_consistency))
    app.query("secagg_unmask")(wrap(real.secagg_unmask))
    return app


def test_a_distributed_run_stops_getting_updates_when_the_clients_budgets_run_out(tmp_path: Path) -> None:
    from server.engine import run_inprocess

    # Arrange: 4 nodes, distributed DP (each round's worst released sum costs rho ~ 0.5 at z = 1), each
    # node's own total 1.2 in its own file; the server asks for 4 rounds, then a new run
    budgets = tmp_path / "budgets"
    cfg = {"num-server-rounds": 4, "seed": -1, "output-dir": str(tmp_path), "run-name": "d1",
           "accountant": "rdp", "client-timeout": 60.0, "local-epochs": 1, "privacy": "distributed",
           "secagg": True, "target-delta": 1e-3, "max-failed-fraction": 1.0}
    app = _budgeted_client_app(budgets, 1.2)
    # Act
    run_inprocess(run_config=cfg, num_supernodes=4, app_dir=REPO, node_id_seed=1, client_app=app)
    # Assert: rounds 1 and 2 released; then every node refuses at its share stage (before any secret)
    results = json.loads((tmp_path / "d1" / "results.json").read_text())
    done = [r["round"] for r in results["rounds"] if not r.get("aborted")]
    assert done == [1, 2]
    for pid in range(4):
        charges = _file_charges(budgets / f"node{pid}.jsonl")
        assert [(c["round"], c["mode"]) for c in charges] == [(1, "distributed"), (2, "distributed")]
        rho = charges[0]["rho"]
        assert 0.5 <= rho < 0.51 and math.fsum(c["rho"] for c in charges) <= 1.2
    # Act: a new run with the same nodes' files: nothing is released
    run_inprocess(run_config={**cfg, "run-name": "d2"}, num_supernodes=4, app_dir=REPO, node_id_seed=1,
                  client_app=app)
    results = json.loads((tmp_path / "d2" / "results.json").read_text())
    assert [r["round"] for r in results["rounds"] if not r.get("aborted")] == []
    assert all(len(_file_charges(budgets / f"node{pid}.jsonl")) == 2 for pid in range(4))


def test_the_total_refuses_slack_beyond_its_cap_so_the_total_epsilon_stays_certified(tmp_path: Path) -> None:
    # Arrange: rounds of tiny rho each carrying slack; the rho cap alone would admit all of them
    path = tmp_path / "b.jsonl"
    budget = ClientPolicy(budget_path=str(path)).budget()
    assert budget.max_slack_total == 1e-3
    # Act: charge rounds of rho 0.1 and slack 3e-4 until refused
    done = 0
    with pytest.raises(PolicyRefusal, match="client-max-slack-total"):
        for rnd in range(1, 20):
            budget.charge(0.1, run="1", round=rnd, mode="distributed", slack=3e-4, tv=1e-70)
            done = rnd
    # Assert: 3 rounds (slack 9e-4 <= 1e-3), the 4th refused with nothing written; the total stays certified
    assert done == 3 and len(ClientBudget(max_rho_total=20.0, neighbouring="add-remove", path=path).charges) == 3
    assert math.isfinite(budget.epsilon(delta=1e-5))
    with pytest.raises(PolicyRefusal, match="sampler truncation"):
        budget.check(0.1, round=9, what="distributed", tv=1e-59)


# ------------------------------------------------------------------ the default memory against its own node state
def _memory_of(ctx: Context) -> Path:
    return ClientPolicy().memory_path(run_id=int(ctx.run_id), partition_id=0)


@pytest.mark.parametrize("damage", ["missing", "truncated", "replaced"])
def test_a_memory_missing_truncated_or_replaced_behind_the_node_state_is_refused(weights, damage: str) -> None:
    # Arrange: a node answered round 1 from its default memory; then the file loses what the node state saw
    ctx = _context(run_id=8)
    train(_message(weights, round=1), ctx)
    path = _memory_of(ctx)
    lines = path.read_text().splitlines(keepends=True)
    if damage == "missing":
        path.unlink()
    elif damage == "truncated":
        path.write_text("".join(lines[:-1]))  # the round's charge gone: round 1 could be released again
    else:
        path.unlink()
        ClientBudget(max_rho_total=20.0, neighbouring="add-remove", path=path)  # a fresh file, another id
    # Act / Assert: the next message is refused (the server counts a dropout), and nothing is released
    with pytest.raises(PolicyRefusal, match="missing, replaced or behind its node state"):
        train(_message(weights, round=2), ctx)
    # a node state that saw less (a rolled-back one) still reads a file that holds more
    fresh = _context(run_id=9)
    train(_message(weights, round=1), fresh)


def test_a_memory_that_cannot_be_created_is_refused_naming_the_key(tmp_path: Path, weights) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(PolicyRefusal, match="set node config client-memory-dir") as refused:
        train(_message(weights), _context(**{"client-memory-dir": str(blocker / "sub")}))
    assert "cannot be created" in str(refused.value) and str(blocker) not in str(refused.value)  # the path stays here
    with pytest.raises(PolicyRefusal, match="set node config client-budget-path"):
        train(_message(weights), _context(**{"client-budget-path": str(blocker / "b.jsonl")}))


def test_a_plain_round_replayed_after_a_node_state_rollback_is_refused_by_the_default_memory(weights) -> None:
    # Arrange: the default configuration; the node answers local round 1, then its node-state save is lost
    import copy

    ctx = _context(run_id=10)
    before = copy.deepcopy(ctx.state)
    first = codec.decode_train_reply(train(_message(weights, round=1), ctx), 0)
    for k in list(ctx.state.keys()):
        del ctx.state[k]
    for k, v in before.items():
        ctx.state[k] = v
    # Act / Assert: the same round again (fresh noise: averaging replies would shrink it) is refused
    with pytest.raises(PolicyRefusal, match="round 1's admit stage of this run was already answered"):
        train(_message(weights, round=1), ctx)
    assert first.delta and len(_file_charges(_memory_of(ctx))) == 1


def test_a_simulations_memory_is_in_ram_where_it_can_be(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedprivacy.fl.client_policy import RUN_TEMP, run_temp_base

    monkeypatch.delenv("FEDPRIVACY_RUN_TEMP")
    path = ClientPolicy(memory_dir=RUN_TEMP).memory_path(run_id=12, partition_id=3)
    assert path == Path(run_temp_base()) / f"fedprivacy-client-memory-{os.getuid()}" / "run-12" / "partition-3.jsonl"
    import tempfile

    assert run_temp_base() == ("/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else tempfile.gettempdir())


def test_a_file_rewritten_in_place_is_read_again_from_its_start(tmp_path: Path) -> None:
    # this process parses a file once and then only what was appended; a file rewritten under the same
    # inode (larger than what was parsed) must not be taken for an append: its header (random id) differs
    path = tmp_path / "b.jsonl"
    ClientBudget(max_rho_total=10.0, neighbouring="add-remove", path=path).charge(1.0, run="1", round=1, mode="local")
    other = tmp_path / "other.jsonl"
    fresh = ClientBudget(max_rho_total=10.0, neighbouring="add-remove", path=other)
    for rnd in (1, 2, 3):
        fresh.charge(0.5, run="2", round=rnd, mode="local")
    with path.open("r+b") as fh:  # the same inode, another file's bytes
        fh.truncate(0)
        fh.write(other.read_bytes())
    again = ClientBudget(max_rho_total=10.0, neighbouring="add-remove", path=path)
    assert [(c.run, c.round, c.rho) for c in again.charges] == [("2", 1, 0.5), ("2", 2, 0.5), ("2", 3, 0.5)]
