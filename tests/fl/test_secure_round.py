"""The secure round (fedprivacy.fl.secure) and its Flower glue, on real protocol sessions and the real engine.

Library level: :class:`SecureRound` over a direct transport that runs the real client steps
(``client_advertise`` ... ``client_unmask``) on fixed updates, with dropouts at every stage; the
reference is the plain numpy sum of the survivors' clipped updates.
Engine level: the real ServerApp/ClientApp through the in-process engine, dropouts injected with the
engine's FaultPlan, compared with the plain FedAvg round of the same seeds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedprivacy.accounting.accountant import Accountant
from fedprivacy.config import RunConfig
from fedprivacy.dp.rng import RandomSource
from fedprivacy.fl.checkpoint import load_checkpoint
from fedprivacy.fl.client_policy import ClientPolicy
from fedprivacy.fl.modes import plan_privacy
from fedprivacy.fl.secure import (
    EncodingSpec,
    ExportedSessionStore,
    SecureRound,
    check_encoding,
    client_advertise,
    client_consistency,
    client_masked,
    client_share,
    client_unmask,
    make_encoding,
    secagg_parameters,
)
from fedprivacy.fl.types import ClientUpdate, RoundInstructions
from fedprivacy.secagg.messages import SetupRequest
from server.engine import run_inprocess
from server.engine.faults import FaultPlan, FaultRule

APP_DIR = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


class DirectTransport:
    """Runs the real client steps in this process; ``drop[stage]`` = partitions that vanish there."""

    def __init__(self, cfg: RunConfig, updates: Mapping[int, list[np.ndarray]],
                 drop: Mapping[str, set[int]] | None = None) -> None:
        self.cfg, self.updates, self.drop = cfg, updates, dict(drop or {})
        # the user runs both sides here: the clients' floor is what the run asks for
        self.policy = ClientPolicy.for_simulation(cfg, colluders=cfg.secagg_colluders,
                                                  schedule=cfg.secagg_schedule)
        self.states: dict[int, dict[str, Any]] = {}  # each node's own state, as the ClientApp keeps it

    def stage(self, name: str, requests: Mapping[int, Any], *, instructions: RoundInstructions | None = None,
              weights: Sequence[np.ndarray] | None = None, encoding: EncodingSpec | None = None,
              ) -> tuple[dict[int, Any], dict[int, str]]:
        out: dict[int, Any] = {}
        failures: dict[int, str] = {}
        for pid, req in requests.items():
            if pid in self.drop.get(name, set()):
                failures[pid] = f"dropped at {name}"
                continue
            key = (1, pid)
            store = ExportedSessionStore(self.states.setdefault(pid, {}))  # sessions serialised
            if name == "advertise":
                out[pid] = client_advertise(store, key, req, partition_id=pid, policy=self.policy)
            elif name == "share":
                assert encoding is not None and instructions is not None
                out[pid] = client_share(store, key, req, encoding=encoding, instructions=instructions,
                                        cfg=self.cfg, policy=self.policy)
            elif name == "masked":
                upd = ClientUpdate(partition_id=pid, delta=tuple(self.updates[pid]))
                msg = client_masked(store, key, req, upd, rng=RandomSource.seeded(pid))
                out[pid] = (msg, ClientUpdate(partition_id=pid, delta=()))
            elif name == "consistency":
                out[pid] = client_consistency(store, key, req)
            else:
                out[pid] = client_unmask(store, key, req)
        return out, failures


def _instr(round_: int = 1, privacy: str = "none") -> RoundInstructions:
    return RoundInstructions(round=round_, privacy=privacy, clip_norm=0.5,
                             client_mechanism="xnoise" if privacy == "distributed" else "", noise_multiplier=1.0 if privacy == "distributed" else 0.0,
                             private=privacy != "none",
                             learning_rate=0.1, local_epochs=1, batch_size=32, num_classes=10, seed=-1)


def _updates(n: int, like: Sequence[np.ndarray], seed: int = 0) -> dict[int, list[np.ndarray]]:
    gen = np.random.default_rng(seed)
    return {pid: [gen.normal(0, 0.3, size=w.shape).astype(np.float32) for w in like] for pid in range(n)}


def _clipped_sum(updates: Mapping[int, list[np.ndarray]], pids: Sequence[int], clip: float) -> np.ndarray:
    total = 0.0
    for pid in pids:
        flat = np.concatenate([a.astype(np.float64).ravel() for a in updates[pid]])
        norm = np.linalg.norm(flat)
        total = total + (flat * min(1.0, clip / norm))
    return np.asarray(total)


@pytest.mark.parametrize("schedule", ["active", "semi-honest"])
def test_secure_round_gives_the_exact_survivors_sum_with_a_dropout_at_every_stage(schedule: str) -> None:
    # Arrange: 10 clients (complete graph, t = 6); one client vanishes before each stage
    cfg = RunConfig(privacy="none", secagg=True, clip_norm=0.5, num_server_rounds=1, secagg_schedule=schedule)
    like = [np.zeros((7, 5), np.float32), np.zeros(5, np.float32)]
    updates = _updates(10, like)
    drop = {"advertise": {1}, "share": {2}, "masked": {3}, "consistency": {4}, "unmask": {4}}
    rnd = SecureRound(cfg, DirectTransport(cfg, updates, drop), population=10, log=lambda _: None)
    # Act
    outcome = rnd(_instr(), list(range(10)), like, RandomSource.seeded(0))
    # Assert: client 4 uploaded its masked input (then vanished), so it is in the sum; 1, 2, 3 are not
    survivors = [0, 4, 5, 6, 7, 8, 9]
    assert outcome.aborted is None and outcome.aggregate.aggregated == tuple(survivors)
    assert set(outcome.failures) == {1, 2, 3} and outcome.event is None
    got = np.concatenate([a.astype(np.float64).ravel() for a in outcome.aggregate.mean_update]) * 10
    ref = _clipped_sum(updates, survivors, 0.5)
    enc = make_encoding(cfg, population=10, dim=ref.size, threshold=rnd.threshold)
    bound = len(survivors) / enc.scale + 1e-6 * 10  # quantisation + float32 storage of the mean
    assert np.max(np.abs(got - ref)) <= bound
    assert outcome.secagg.survivors == 7
    assert outcome.secagg.exchanges == (5 if schedule == "active" else 4)  # + the consistency stage
    # the unmask stage deletes the secrets from the state of every node that completed it
    states = rnd.transport.states  # type: ignore[attr-defined]
    assert all(not states[pid] for pid in (0, 5, 6, 7, 8, 9))
    assert set(states[3]) == {"secagg-session/1", "secagg-session-encoding/1"}  # 3 stopped after sharing
    assert 1 not in states  # 1 never started


class PipeliningTransport(DirectTransport):
    """DirectTransport that also carries round r+1's key stage (the real client steps, in order: round
    r's part first); a node dropped at round r's stage misses both parts, one in ``refuse_next`` fails
    only round r+1's part (its floor refuses that round), as ``clients/secagg_handlers.py`` answers."""

    def __init__(self, *args: Any, refuse_next: Mapping[int, set[int]] | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.refuse_next = dict(refuse_next or {})
        self.log: list[tuple[str, str | None]] = []

    def stage(self, name: str, requests: Mapping[int, Any], **kw: Any) -> tuple[dict[int, Any], dict[int, str]]:
        self.log.append((name, None))
        return super().stage(name, requests, **kw)

    def stage_with_next(self, name: str, requests: Mapping[int, Any], payload: Mapping[str, Any],
                        next_name: str, next_requests: Mapping[int, Any], next_payload: Mapping[str, Any],
                        ) -> tuple[tuple[dict[int, Any], dict[int, str]], tuple[dict[int, Any], dict[int, str]]]:
        main = DirectTransport.stage(self, name, requests, **payload)
        lost = set(main[1]) | self.refuse_next.get(next(iter(requests.values())).round, set())
        nxt = DirectTransport.stage(self, next_name, {p: r for p, r in next_requests.items() if p not in lost},
                                    **next_payload)
        nxt[1].update({p: f"lost at {name}" for p in next_requests if p in lost})
        self.log.append((name, next_name))
        return main, nxt


@pytest.mark.parametrize(("schedule", "first", "steady"), [("active", 5, 3), ("semi-honest", 4, 2)])
def test_pipelined_rounds_on_changing_cohorts_give_each_rounds_exact_sum(
        schedule: str, first: int, steady: int) -> None:
    # Arrange: 10 clients, three rounds on different cohorts (as Poisson sampling gives); client 3 refuses
    # only round 2's part of a merged exchange of round 1; client 8 vanishes at round 2's masked stage
    cfg = RunConfig(privacy="none", secagg=True, clip_norm=0.5, num_server_rounds=3, secagg_schedule=schedule)
    like = [np.zeros((7, 5), np.float32), np.zeros(5, np.float32)]
    updates = _updates(10, like, seed=9)
    cohorts = {1: list(range(10)), 2: [0, 1, 2, 3, 5, 6, 8, 9], 3: [1, 2, 3, 4, 5, 6, 7, 9]}
    transport = PipeliningTransport(cfg, updates, {"masked": {8}}, refuse_next={1: {3}})
    rnd = SecureRound(cfg, transport, population=10, log=lambda _: None)
    rnd.set_lookahead(lambda r: (_instr(r), cohorts[r], RandomSource.seeded(r)) if r in cohorts else None)
    # Act
    outcomes = [rnd(_instr(r), cohorts[r], like, RandomSource.seeded(r)) for r in (1, 2, 3)]
    # Assert: each round's sum is exactly its survivors' (3 left round 2 only; 8 was dropped at the
    # masked stage of every round by this transport, so never in a sum)
    expect = {1: [0, 1, 2, 3, 4, 5, 6, 7, 9], 2: [0, 1, 2, 5, 6, 9], 3: [1, 2, 3, 4, 5, 6, 7, 9]}
    for r, out in zip((1, 2, 3), outcomes, strict=True):
        assert out.aborted is None and out.aggregate.aggregated == tuple(expect[r])
        got = np.concatenate([a.astype(np.float64).ravel() for a in out.aggregate.mean_update]) * 10
        assert np.max(np.abs(got - _clipped_sum(updates, expect[r], 0.5))) <= out.secagg.max_abs_error + 1e-5
    assert 3 in outcomes[1].failures and 3 not in outcomes[0].failures
    assert [o.secagg.exchanges for o in outcomes] == [first, steady, steady]
    carrier = "consistency" if schedule == "active" else "masked"
    assert (carrier, "advertise") in transport.log and ("unmask", "share") in transport.log
    # the unmask stage deleted round 3's survivors' secrets; 8 (never unmasked) holds two live sessions
    # on the active schedule, rounds 1 and 2 (an advertise forgets only rounds before the previous one);
    # on the semi-honest one it missed round 2's advertise with its round-1 masked exchange
    assert all(not transport.states[pid] for pid in expect[3])
    held = sorted(k for k in transport.states[8] if "encoding" not in k)
    assert held == (["secagg-session/1", "secagg-session/2"] if schedule == "active" else ["secagg-session/1"])


def test_below_threshold_round_aborts_releasing_nothing() -> None:
    # Arrange: 6 clients, t = 4; three vanish at the share stage
    cfg = RunConfig(privacy="distributed", secagg=True, accountant="rdp", clip_norm=0.5,
                    noise_multiplier=1.0, target_delta=1e-3)
    like = [np.zeros(40, np.float32)]
    updates = _updates(6, like)
    transport = DirectTransport(cfg, updates, {"share": {0, 1, 2}})
    rnd = SecureRound(cfg, transport, population=6, log=lambda _: None)
    # Act
    outcome = rnd(_instr(privacy="distributed"), list(range(6)), like, RandomSource.seeded(0))
    # Assert
    assert rnd.threshold == 4
    assert outcome.aborted is not None and "aborted" in outcome.aborted
    assert outcome.event is None and outcome.aggregate.aggregated == ()
    assert all(not np.any(u) for u in outcome.aggregate.mean_update)


def test_distributed_round_accounts_the_survivors_noise() -> None:
    # Arrange: 8 clients, t = 5; one drops before the masked stage -> 7 noisy survivors
    cfg = RunConfig(privacy="distributed", secagg=True, accountant="rdp", clip_norm=1.0,
                    noise_multiplier=0.8, target_delta=1e-3)
    like = [np.zeros(4000, np.float32)]
    updates = _updates(8, like, seed=3)
    rnd = SecureRound(cfg, DirectTransport(cfg, updates, {"masked": {5}}), population=8,
                      log=lambda _: None)
    # Act
    outcome = rnd(_instr(privacy="distributed"), list(range(8)), like, RandomSource.seeded(1))
    # Assert: exact XNoise — the 7 survivors' sum keeps exactly σ² = (zCs)² (not 7/5 of it, as the
    # legacy share did); the ledger gets its dominating Gaussian, std sqrt(σ² − w) over Δ₂
    # (fedprivacy.accounting.release, Proposition)
    from fedprivacy.accounting.events import GaussianEvent, NoSampling
    from fedprivacy.accounting.release import SMOOTHING_VARIANCE, VARIANCE_MARGIN

    enc = make_encoding(cfg, population=8, dim=4000, threshold=5)
    ddp = enc.ddp()
    assert enc.xnoise and ddp.design(roster=8).num_seeded == 1
    # charged: the run's one worst case, sigma^2 (1 - 1e-9) (the same for every survivor count)
    z_ref = math.sqrt(ddp.target_variance * (1 - VARIANCE_MARGIN) - SMOOTHING_VARIANCE) / ddp.norm_bound
    assert outcome.secagg.survivors == 7 and outcome.secagg.roster == 8
    assert isinstance(outcome.event.mechanism, GaussianEvent)
    assert isinstance(outcome.event.sampling, NoSampling)  # the server's audience: no amplification
    assert outcome.event.mechanism.noise_multiplier == pytest.approx(z_ref, rel=1e-12)
    assert outcome.aggregate.noise_std == pytest.approx(0.8 * 1.0, rel=1e-9)
    # measured from outside: the released sum is the survivors' clipped sum plus noise of std z·C
    # (4000 coordinates, padded 4096: the estimate's own sd is ~1.1%; the legacy share gave sqrt(7/5))
    got = outcome.aggregate.mean_update[0].astype(np.float64) * 8
    ref = _clipped_sum(updates, [p for p in range(8) if p != 5], 1.0)
    ratio = float(np.std(got - ref)) / outcome.aggregate.noise_std
    assert abs(float(np.mean(got - ref))) < 0.1 and 0.96 < ratio < 1.04


def test_the_plan_budgets_for_the_worst_case_of_t_survivors() -> None:
    cfg = RunConfig(privacy="distributed", secagg=True, accountant="rdp", noise_multiplier=1.0,
                    target_delta=1e-3, model="mlp")
    plan = plan_privacy(cfg, population=10, dim=64 * 32 + 32 + 32 * 10 + 10)  # digits MLP, 32 hidden
    t, k = secagg_parameters(cfg, population=10)
    worst = Accountant(backend="rdp")
    worst.spend(plan.event)
    assert (t, k) == (6, 9) and plan.mode == "distributed"
    # ε(t survivors) >= central Gaussian at σ: rounding only enlarges the sensitivity; within 5%
    # (the dominating Gaussian, not the zCDP conversion)
    central = Accountant(backend="rdp")
    from fedprivacy.accounting.events import GaussianEvent, PrivacyEvent

    central.spend(PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=1.0)))
    assert worst.epsilon(delta=1e-3) >= central.epsilon(delta=1e-3)
    assert worst.epsilon(delta=1e-3) < 1.05 * central.epsilon(delta=1e-3)


@pytest.mark.parametrize(("overrides", "match"), [
    ({"privacy": "central", "secagg": True, "adaptive-clip": True}, "adaptive-clip"),
    ({"privacy": "distributed", "secagg": True, "accountant": "prv"}, "'pld' or 'rdp'"),
    ({"privacy": "distributed", "secagg": True, "noise-multiplier": 0.0}, "target-epsilon"),
    ({"privacy": "distributed", "secagg": True, "privacy-audience": "public"}, "privacy-audience"),
    ({"privacy": "distributed", "secagg": False, "accountant": "rdp"}, "secagg=true"),
    ({"privacy": "none", "secagg": True, "secagg-neighbours": 6, "secagg-threshold": 3}, "secagg-threshold"),
    ({"privacy": "none", "secagg": True, "secagg-neighbours": 1}, "secagg-neighbours"),
])
def test_config_refuses_unsafe_secagg_combinations(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RunConfig.from_mapping(overrides)


def test_client_refuses_an_encoding_with_less_noise_than_its_config() -> None:
    cfg = RunConfig(privacy="distributed", secagg=True, accountant="rdp", noise_multiplier=1.0)
    setup = SetupRequest(round=1, threshold=4, degree=5, dim=64, min_survivors=4, modulus_bits=cfg.secagg_bits)
    good = make_encoding(cfg, population=6, dim=64, threshold=4, rotation_seed=b"\x01" * 32)
    check_encoding(cfg, good, setup)  # accepted
    weak = make_encoding(cfg.replace(noise_multiplier=0.1), population=6, dim=64, threshold=4,
                         rotation_seed=b"\x01" * 32)
    with pytest.raises(ValueError, match="noise multiplier"):
        check_encoding(cfg, weak, setup)
    optimistic = make_encoding(cfg, population=6, dim=64, threshold=5, rotation_seed=b"\x01" * 32)
    with pytest.raises(ValueError, match="survivors"):
        check_encoding(cfg, optimistic, setup)


# ----------------------------------------------------------------------------- real engine
def _run(tmp_path: Path, name: str, faults: FaultPlan | None = None, *, num_supernodes: int = 6,
         **overrides: Any) -> dict[str, Any]:
    run_config = {"num-server-rounds": 1, "seed": 4, "output-dir": str(tmp_path), "run-name": name,
                  "local-epochs": 1, "client-timeout": 30.0, **overrides}
    result = run_inprocess(run_config=run_config, num_supernodes=num_supernodes, app_dir=APP_DIR,
                           faults=faults, node_id_seed=7)
    saved = json.loads((tmp_path / name / "results.json").read_text())
    saved["_weights"] = load_checkpoint(tmp_path / name / "checkpoint").weights
    saved["_by_type"] = dict(result.stats.by_type)
    return saved


def test_engine_secure_round_equals_plain_fedavg_with_dropouts_at_masked_and_unmask(tmp_path: Path) -> None:
    # Arrange: partition 2 never answers its train message (plain) / its masked-input message (secure);
    # partition 4 also vanishes at the unmask stage of the secure run, after uploading its masked input
    plain_faults = FaultPlan(rules=(FaultRule(action="drop", message_type="train", partition_ids=(2,)),))
    secure_faults = FaultPlan(rules=(
        FaultRule(action="drop", message_type="train.secagg_masked", partition_ids=(2,)),
        FaultRule(action="drop", message_type="query.secagg_unmask", partition_ids=(4,)),
    ))
    # Act
    plain = _run(tmp_path, "plain", plain_faults, privacy="none", secagg=False)
    secure = _run(tmp_path, "secure", secure_faults, privacy="none", secagg=True)
    # Assert: same survivors, same model up to the stated quantisation error
    assert secure["_by_type"]["train.secagg_masked"] == 6 and "train" not in secure["_by_type"]
    row = secure["rounds"][0]
    assert row["clients_aggregated"] == plain["rounds"][0]["clients_aggregated"] == 5
    assert row["secagg_survivors"] == 5 and row["secagg_exchanges"] == 5  # active: + consistency
    # the server learnt no client's loss or size beside the masked vectors: no train loss
    assert row["train_loss"] is None and plain["rounds"][0]["train_loss"] is not None
    bound = row["secagg_max_abs_error"] / 6 + 1e-6  # n/s on the sum, /denominator; float32 weights
    for w_s, w_p in zip(secure["_weights"], plain["_weights"], strict=True):
        assert np.max(np.abs(np.asarray(w_s, np.float64) - np.asarray(w_p, np.float64))) <= bound
    assert secure["rounds"][0]["test_accuracy"] == pytest.approx(plain["rounds"][0]["test_accuracy"], abs=0.01)


def test_engine_distributed_run_states_survivors_noise_and_aborted_round_spends_nothing(tmp_path: Path) -> None:
    # Arrange: 3 rounds, 6 clients, t = 4; round 2 loses 3 clients at the masked stage (below t: abort,
    # before its release point); round 3 loses one at the masked stage (5 noisy survivors)
    faults = FaultPlan(rules=(
        FaultRule(action="drop", message_type="train.secagg_masked", rounds=(2,), partition_ids=(0, 1, 2)),
        FaultRule(action="drop", message_type="train.secagg_masked", rounds=(3,), partition_ids=(5,)),
    ))
    # Act
    res = _run(tmp_path, "ddp", faults, privacy="distributed", secagg=True, accountant="rdp",
               **{"num-server-rounds": 3, "target-delta": 1e-3})
    # Assert
    r1, r2, r3 = res["rounds"]
    assert r2["aborted"] and r2["epsilon"] == r1["epsilon"] and r2["test_loss"] == r1["test_loss"]
    assert r3["epsilon"] > r1["epsilon"]
    d = res["privacy"]["distributed"]
    assert d["survivors_per_round"] == [6, 5] and d["aborted_rounds"] == [2] and d["threshold"] == 4
    assert res["privacy"]["rounds"] == 2  # two events spent, none for the aborted round
    # exact XNoise: the sum carries z C whatever the survivors (the legacy share left sqrt(n/t) z C)
    assert d["noise_std_of_sum_per_round"] == pytest.approx([0.5, 0.5], rel=1e-12)
    assert d["noise"].startswith("exact XNoise")
    aud = d["audiences"]
    # the headline: the server's figure, never below the ledger's (they differ at ~1e-12 by discretisation)
    # the headline: every slack term, and never below the ledger or a published row, each row the ledger
    # plus the run's slack
    assert res["privacy"]["epsilon"] == max(aud["server"]["epsilon"], d["ledger_epsilon"], r3["epsilon"])
    assert d["ledger_epsilon"] < r3["epsilon"] == pytest.approx(d["ledger_epsilon"], rel=1e-6)
    # the ledger composes the dominating Gaussians; the figure is the smaller of that plus its slack
    # and the RDP cross-check (both valid): they agree to within the slack here
    assert aud["server"]["epsilon"] == pytest.approx(d["ledger_epsilon"], rel=1e-6)
    assert aud["observers"]["epsilon"] == aud["server"]["epsilon"]  # q = 1: nothing to amplify
    # the same σ as central DP: never below the continuous Gaussian's PLD (rounding only enlarges the
    # sensitivity); the rdp ledger is RDP's composition of z_eff ~ 1 (dp-accounting, independently)
    import dp_accounting

    assert d["central_dp_epsilon_same_sigma"] <= aud["server"]["epsilon"]
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(noise_multiplier=1.0), 2)
    assert aud["server"]["epsilon"] == pytest.approx(rdp.get_epsilon(1e-3), rel=1e-4)
    report = (tmp_path / "ddp" / "privacy_report.md").read_text()
    assert "noise the survivors left" in report and "| 3 | 5 |" in report and "central DP" in report
    assert "| the server |" in report and "| the public (takes part in no round) |" in report
    assert "| participating clients |" in report
    # a participating client knows its own kept noise (c = 0): its figure is above the server's
    assert aud["participants"]["epsilon"] > aud["server"]["epsilon"]
    # the claim names the adjacency KLS 2021 covers, not plain add-remove
    assert res["privacy"]["adjacency"].startswith("zero-out") and "| Adjacency | zero-out" in report


def test_engine_sampled_distributed_run_reports_two_audiences_as_dp_accounting_does(tmp_path: Path) -> None:
    # Arrange: 12 clients, Poisson q = 0.5, exact XNoise, budgeted for the public; dropouts at the masked
    # stage of round 3, which still completes (its completion then also depended on the
    # survivors, which the public's pair does not model)
    faults = FaultPlan(rules=(FaultRule(action="drop", message_type="train.secagg_masked", rounds=(3,),
                                        partition_ids=(3, 8)),))
    # Act
    res = _run(tmp_path, "ddp-sampled", faults, num_supernodes=12, privacy="distributed", secagg=True,
               accountant="pld", **{"sample-rate": 0.5, "num-server-rounds": 3, "target-delta": 1e-4,
                                    "privacy-audience": "observers"})
    # Assert: each completed round's dominating Gaussian, z_r = sqrt((zCs)^2 - w)/Δ₂ (the survivors
    # kept exactly (zCs)^2 of noise), composed by dp-accounting's own PLD accountant: without
    # sampling for the server, the completed-round pair for observers while no client was lost
    import dp_accounting

    from fedprivacy.accounting.kls import rounded_l2_norm_bound
    from fedprivacy.accounting.release import SMOOTHING_VARIANCE
    from fedprivacy.fl.run import read_participation

    cfg = RunConfig.from_mapping({"privacy": "distributed", "secagg": True, "sample-rate": 0.5})
    t, _ = secagg_parameters(cfg, population=12)
    # the counts are not published (the public's amplified figure needs them secret):
    # they are in the server's private log
    private = [r for r in read_participation(tmp_path / "ddp-sampled") if "secagg_survivors" in r]
    rows = [r for r in res["rounds"] if r["epsilon"] is not None]
    assert private and all(r["secagg_survivors"] <= r["secagg_roster"] for r in private)
    for row in res["rounds"]:  # nor each round's wall time, which grows with the cohort
        assert not {"secagg_survivors", "secagg_roster", "secagg_degree", "clients_sampled",
                    "clients_aggregated", "noise_std_sum", "aborted", "seconds"} & set(row)
    assert all(r["seconds"] > 0 for r in private) and res["seconds"] > 0
    enc = make_encoding(cfg, population=12, dim=64 * 32 + 32 + 32 * 10 + 10, threshold=t)
    sigma2 = (cfg.noise_multiplier * enc.clip_norm * enc.scale) ** 2 * (1 - 1e-9)
    # the public sees which rounds completed: each completed round is the labelled mixture whose
    # Gaussian weight is P[client i decided the completion | completed] (n >= max(t, 3) completes;
    # the worse of 11 and 12 other clients), built here from dp-accounting's own PLDs mixed as pmfs
    from scipy import stats

    from tests.accounting.test_accounting_completion import reference_pld

    m0 = max(t, 3)
    decided = max(0.5 * stats.binom.pmf(m0 - 1, o, 0.5)
                  / (0.5 * stats.binom.sf(m0 - 2, o, 0.5) + 0.5 * stats.binom.sf(m0 - 1, o, 0.5))
                  for o in (11, 12))
    d2 = rounded_l2_norm_bound(l2_norm=enc.clip_norm * enc.scale, dim=enc.padded_dim, beta=math.exp(-0.5))
    z = math.sqrt(sigma2 - SMOOTHING_VARIANCE) / d2

    def plain(rounds: int) -> float:
        server = dp_accounting.pld.PLDAccountant()
        server.compose(dp_accounting.GaussianDpEvent(noise_multiplier=z), rounds)
        return float(server.get_epsilon(1e-4))

    assert [r["round"] for r in private] == [1, 2, 3] == [r["round"] for r in rows]
    assert [r["clients_aggregated"] < r["clients_sampled"] for r in private] == [False, False, True]
    # rounds 1, 2 (no client lost): each row is the public's pair composed
    for k in (1, 2):
        observers = reference_pld(z=z, q=0.5, gaussian_weight=decided).self_compose(k)
        assert rows[k - 1]["epsilon"] == pytest.approx(observers.get_epsilon_for_delta(1e-4), rel=2e-3)
        assert rows[k - 1]["epsilon"] < plain(k)
    # round 3 lost clients: every released round is charged the server's unamplified event as well, the
    # run stops there; the public's figure is the server's, and the headline, the ledger and the last row
    # agree on the ledger's figure, above the plain Gaussian of the three rounds
    aud = res["privacy"]["distributed"]["audiences"]
    assert aud["server"]["epsilon"] == pytest.approx(plain(3), rel=2e-3)
    assert aud["observers"]["amplification"] is False and "lost sampled clients" in aud["observers"]["sampling"]
    assert aud["observers"]["epsilon"] == pytest.approx(aud["server"]["epsilon"], rel=1e-12)
    ledger = res["privacy"]["distributed"]["ledger_epsilon"]
    assert res["privacy"]["epsilon"] == rows[2]["epsilon"] == pytest.approx(ledger, rel=1e-6)
    assert rows[2]["epsilon"] > ledger  # the row carries the run's slack
    assert rows[2]["epsilon"] > plain(3) and res["privacy"]["rounds"] == 3  # releases, not ledger steps (6)
    assert res["privacy"]["distributed"]["charged_without_record"] == 0
    # round 3 is the last: the run completed (nothing left to stop); its final model is published
    assert res["status"] == "completed" and res["stopped"] is None
    assert [r["noise_std_sum"] for r in private] == pytest.approx([0.5] * len(private), rel=1e-12)
    d = res["privacy"]["distributed"]
    assert "private" in d["survivors_per_round"] and "private" in d["aborted_rounds"]
    assert res["privacy"]["participation"]["published"] is False


def test_a_reply_from_another_round_counts_as_a_dropout_not_an_abort() -> None:
    # Arrange: client 0 answers the share stage with a message of round 2 (a replay)
    import dataclasses

    cfg = RunConfig(privacy="none", secagg=True, clip_norm=0.5)
    like = [np.zeros(30, np.float32)]
    updates = _updates(6, like, seed=5)

    class Replaying(DirectTransport):
        def stage(self, name: str, requests: Mapping[int, Any], **kw: Any) -> tuple[dict[int, Any], dict[int, str]]:
            out, failures = super().stage(name, requests, **kw)
            if name == "share":
                out[0] = dataclasses.replace(out[0], round=2)
            return out, failures

    rnd = SecureRound(cfg, Replaying(cfg, updates), population=6, log=lambda _: None)
    # Act
    outcome = rnd(_instr(), list(range(6)), like, RandomSource.seeded(0))
    # Assert
    assert outcome.aborted is None and outcome.aggregate.aggregated == (1, 2, 3, 4, 5)
    assert "round" in outcome.failures[0]
    got = outcome.aggregate.mean_update[0].astype(np.float64) * 6
    # within the fixed-point decoding error the round states for its 5 survivors (float32 mean: +1e-6)
    bound = outcome.secagg.max_abs_error + 1e-6
    assert np.max(np.abs(got - _clipped_sum(updates, [1, 2, 3, 4, 5], 0.5))) <= bound < 1e-3


@pytest.mark.parametrize(("schedule", "first", "steady"), [("active", 5, 3), ("semi-honest", 4, 2)])
def test_engine_steady_state_takes_three_exchanges_active_two_semi_honest_with_a_merged_dropout(
        tmp_path: Path, schedule: str, first: int, steady: int) -> None:
    # Arrange: partition 4 misses round 1's unmask exchange, which carries round 2's share stage: it is
    # in round 1's sum (it uploaded its masked input) but not in round 2's, like a client dropped in
    # plain round 2; partition 1 misses round 2's masked upload (a dropout in steady state)
    secure_faults = FaultPlan(rules=(
        FaultRule(action="drop", message_type="query.secagg_unmask", rounds=(1,), partition_ids=(4,)),
        FaultRule(action="drop", message_type="train.secagg_masked", rounds=(2,), partition_ids=(1,))))
    # (semi-honest: round 2's masked exchange carries round 3's advertise, so 1 misses round 3 too)
    plain_faults = FaultPlan(rules=(
        FaultRule(action="drop", message_type="train", rounds=(2,), partition_ids=(4, 1)),
        *((FaultRule(action="drop", message_type="train", rounds=(3,), partition_ids=(1,)),)
          if schedule == "semi-honest" else ())))
    # Act
    secure = _run(tmp_path, "pipe", secure_faults, privacy="none", secagg=True,
                  **{"num-server-rounds": 3, "secagg-schedule": schedule})
    plain = _run(tmp_path, "plain3", plain_faults, privacy="none", secagg=False, **{"num-server-rounds": 3})
    # Assert: every round after the first runs on the exchanges of the round before it plus its own
    # masked (consistency) and unmask exchanges
    rows = secure["rounds"]
    assert [r["secagg_exchanges"] for r in rows] == [first, steady, steady]
    assert [bool(r.get("secagg_pipelined")) for r in rows] == [False, True, True]
    # a node in round r+1's cohort that takes no part in round r's carrier stage gets that key stage as
    # a message of its own (in the same exchange): 4 and 1 for round 3 (active: 1 sent no masked input,
    # so no view to sign; semi-honest: the masked stage carries round 3's keys, and 4 was not in round 2)
    extra = {"active": 2, "semi-honest": 1}[schedule]
    assert secure["_by_type"]["query.secagg_advertise"] == 6 + extra
    third = 6 if schedule == "active" else 5
    assert [r["secagg_survivors"] for r in rows] == [6, 4, third]
    assert [r["clients_aggregated"] for r in plain["rounds"]] == [6, 4, third]
    # three rounds of quantisation error (n/s each), propagated through local training
    for w_s, w_p in zip(secure["_weights"], plain["_weights"], strict=True):
        assert np.max(np.abs(np.asarray(w_s, np.float64) - np.asarray(w_p, np.float64))) <= 2e-4


def test_engine_poisson_sampled_rounds_take_three_exchanges_on_the_cohorts_the_run_samples(
        tmp_path: Path) -> None:
    # Arrange: 12 clients, Poisson q = 0.6, 5 rounds; round 3 loses two clients at the masked stage
    faults = FaultPlan(rules=(FaultRule(action="drop", message_type="train.secagg_masked", rounds=(3,),
                                        partition_ids=tuple(range(12))[::5]),))
    plain_faults = FaultPlan(rules=(FaultRule(action="drop", message_type="train", rounds=(3,),
                                              partition_ids=tuple(range(12))[::5]),))
    common = {"num-server-rounds": 5, "sample-rate": 0.6}
    # Act
    secure = _run(tmp_path, "sampled", faults, num_supernodes=12, privacy="none", secagg=True, **common)
    plain = _run(tmp_path, "plain-sampled", plain_faults, num_supernodes=12, privacy="none", secagg=False,
                 **common)
    # Assert: the secure run aggregates exactly the plain run's sampled cohorts (the next round's key
    # stages went to the cohort the run then used), in three exchanges per round after the first
    rows = secure["rounds"]
    assert [r["clients_sampled"] for r in rows] == [r["clients_sampled"] for r in plain["rounds"]]
    assert [r["secagg_survivors"] for r in rows] == [r["clients_aggregated"] for r in plain["rounds"]]
    assert len({r["clients_sampled"] for r in rows}) > 1  # the cohorts really vary
    assert [r["secagg_exchanges"] for r in rows] == [5, 3, 3, 3, 3]
    for w_s, w_p in zip(secure["_weights"], plain["_weights"], strict=True):
        assert np.max(np.abs(np.asarray(w_s, np.float64) - np.asarray(w_p, np.float64))) <= 5e-4


def test_a_refused_next_round_part_fails_alone_and_round_rs_reply_still_goes_back() -> None:
    # Arrange: a node that advertised keys for round 2 (its round log says so), then gets a round-r
    # message whose secagg-next part asks it to advertise round 2 again (a replayed round)
    from flwr.app import ConfigRecord, Context, Message, RecordDict

    from clients.secagg_handlers import _Next, advertise
    from fedprivacy_flwr.secagg_records import from_records, to_records
    from server.engine._flwr_private import TaskIdentityScope

    cfg = RunConfig(privacy="none", secagg=True, clip_norm=0.5)
    policy = ClientPolicy.for_simulation(cfg, colluders=0, schedule="active")
    ctx = Context(run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 6}, state=RecordDict(),
                  run_config=cfg.to_mapping())

    def setup(r: int) -> SetupRequest:
        return SetupRequest(round=r, threshold=4, degree=5, dim=64, min_survivors=4, modulus_bits=20, active=True)

    with TaskIdentityScope(1):
        first = Message(RecordDict(to_records("advertise", setup(2))), dst_node_id=7,
                        message_type="query.secagg_advertise")
        advertise(first, ctx, partition_id=0, policy=policy)
        part = _Next(cfg=cfg, partition_id=0, policy=policy)
        # Act
        replayed: dict[str, Any] = {"secagg": ConfigRecord({"round r's": "reply"})}
        part.run(Message(RecordDict(to_records("advertise", setup(2), record="secagg-next")), dst_node_id=7,
                         message_type="query.secagg_unmask"), ctx, replayed)
        fresh: dict[str, Any] = {}
        part.run(Message(RecordDict(to_records("advertise", setup(3), record="secagg-next")), dst_node_id=7,
                         message_type="query.secagg_unmask"), ctx, fresh)
    # Assert: the replay is refused for round 2 only (round r's part of the reply is untouched); round 3
    # is admitted and its keys travel as secagg-next
    assert "ProtocolViolation" in replayed["secagg-next-error"]["error"] and "secagg-next" not in replayed
    assert dict(replayed["secagg"]) == {"round r's": "reply"}
    keys = from_records(RecordDict(fresh), stage="advertise", name="secagg-next")
    assert keys.round == 3 and keys.node_id == 0 and "secagg-next-error" not in fresh


def test_engine_observers_run_charges_unamplified_and_stops_after_an_abort_the_pair_does_not_model(
        tmp_path: Path) -> None:
    """Dropouts abort round 2 of a Poisson run budgeted for the public; the public's pair
    does not model that abort, so every released round is charged the server's unamplified event too
    and the run stops there (the ledger, the budget and every row's ε stay valid)."""
    import dp_accounting

    # Arrange: 12 clients, q = 0.5 (seeded: round 2's cohort is 4 clients, t = 4); one of them, partition 3,
    # vanishes at round 2's masked stage: 3 survivors < t, the round aborts (the counts are private)
    faults = FaultPlan(rules=(FaultRule(action="drop", message_type="train.secagg_masked", rounds=(2,),
                                        partition_ids=(3,)),))
    cfg = {"num-server-rounds": 4, "sampling": "poisson", "sample-rate": 0.5, "privacy-audience": "observers",
           "max-failed-fraction": 1.0}
    # Act
    res = _run(tmp_path, "obs", faults, num_supernodes=12, privacy="distributed", secagg=True, **cfg)
    ref = _run(tmp_path, "obs-ref", None, num_supernodes=12, privacy="distributed", secagg=True,
               **{**cfg, "num-server-rounds": 1})
    # Assert: round 2 aborted, the run stopped after it
    rows = res["rounds"]
    assert [r["round"] for r in rows] == [1, 2]
    private = [json.loads(line) for line in
               (tmp_path / "obs" / "private" / "participation.jsonl").read_text().splitlines()]
    assert private[1]["round"] == 2 and "fewer than" in private[1]["aborted"] and "aborted" not in private[0]
    assert "voids its amplification" in (tmp_path / "obs" / "results.json").read_text()
    # round 1 alone: the amplified charge (the reference run); after the abort, the ledger also holds the
    # unamplified event of round 1: at least the plain Gaussian of the plan's z, above the amplified figure
    amplified = ref["privacy"]["distributed"]["ledger_epsilon"]
    assert rows[0]["epsilon"] == pytest.approx(amplified, rel=1e-6) and rows[0]["epsilon"] > amplified
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(dp_accounting.GaussianDpEvent(noise_multiplier=res["privacy"]["noise_multiplier"]), 1)
    plain = pld.get_epsilon(res["privacy"]["delta"])
    ledger = res["privacy"]["distributed"]["ledger_epsilon"]
    assert rows[1]["epsilon"] == pytest.approx(ledger, rel=1e-6) and rows[1]["epsilon"] > ledger > plain > amplified
    # the headline agrees with the last row (the re-charge is not a cut-off round)
    assert res["privacy"]["distributed"]["charged_without_record"] == 0
    assert res["privacy"]["epsilon"] == rows[1]["epsilon"] and res["privacy"]["rounds"] == 1  # 1 released
    # the void is final; a resume (whose rounds would be charged amplified) is refused
    from fedprivacy.errors import ConfigError

    with pytest.raises(ConfigError, match=r"resume=true: run .*obs is final.*privacy-audience='observers'"):
        _run(tmp_path, "obs", None, num_supernodes=12, privacy="distributed", secagg=True, resume=True, **cfg)


def test_engine_observers_budget_discards_a_round_whose_lost_clients_void_the_amplification(tmp_path: Path) -> None:
    """Round 3 completes after losing two sampled clients, so
    every released round is charged unamplified as well; that takes ε above target-epsilon, so round 3's
    model is discarded (the server saw the sum, the public never sees the model) and the run stops."""
    import dp_accounting

    # Arrange: the first engine test's seeded cohorts (round 3 completes with dropouts), calibrated for
    # the public to ε = 6 over 3 rounds
    faults = FaultPlan(rules=(FaultRule(action="drop", message_type="train.secagg_masked", rounds=(3,),
                                        partition_ids=(3, 8)),))
    cfg = {"sample-rate": 0.5, "num-server-rounds": 3, "target-delta": 1e-4, "privacy-audience": "observers",
           "target-epsilon": 6.0, "noise-multiplier": 0.0, "accountant": "pld"}
    # Act
    res = _run(tmp_path, "obs-budget", faults, num_supernodes=12, privacy="distributed", secagg=True, **cfg)
    # Assert: rounds 1 and 2 within the budget, round 3 discarded, the charges stay
    rows = res["rounds"]
    assert [r["round"] for r in rows] == [1, 2] and rows[-1]["epsilon"] <= 6.0
    assert res["status"] == "budget-exhausted" and "round 3 discarded" in res["stopped"]
    assert "voids its amplification" in res["stopped"]
    d = res["privacy"]["distributed"]
    assert d["completed_rounds"] == [1, 2] and d["charged_without_record"] == 1  # round 3 was released
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(dp_accounting.GaussianDpEvent(noise_multiplier=res["privacy"]["noise_multiplier"]), 3)
    assert d["ledger_epsilon"] > 6.0 and d["ledger_epsilon"] > pld.get_epsilon(1e-4) * 0.99
    assert d["audiences"]["observers"]["amplification"] is False  # from the ledger: round 3 has no record
    assert d["audiences"]["observers"]["epsilon"] == pytest.approx(d["audiences"]["server"]["epsilon"], rel=1e-12)
    assert res["privacy"]["epsilon"] >= d["ledger_epsilon"]
    # the records show no void (round 3 was discarded), the ledger does: a resume is refused
    from fedprivacy.errors import ConfigError

    with pytest.raises(ConfigError, match=r"is final"):
        _run(tmp_path, "obs-budget", None, num_supernodes=12, privacy="distributed", secagg=True, resume=True,
             **cfg)


def test_engine_a_client_in_the_sum_that_misses_the_unmask_stage_voids_the_publics_amplification(
        tmp_path: Path) -> None:
    """Every sampled client's masked input is in round 3's sum, but some miss the
    unmask stage; the round completes only because enough of the others' shares arrived, so its
    completion depended on the survivors: the public's pair does not model it (counted, kept private)."""
    # Arrange: the first engine test's seeded cohorts; partitions 3 and 8 vanish at round 3's unmask stage
    faults = FaultPlan(rules=(FaultRule(action="drop", message_type="query.secagg_unmask", rounds=(3,),
                                        partition_ids=(3, 8)),))
    # Act
    res = _run(tmp_path, "late", faults, num_supernodes=12, privacy="distributed", secagg=True,
               accountant="pld", **{"sample-rate": 0.5, "num-server-rounds": 3, "target-delta": 1e-4,
                                    "privacy-audience": "observers"})
    # Assert: round 3 completed with every sampled client in the sum, some late (private log only)
    from fedprivacy.fl.run import read_participation

    private = read_participation(tmp_path / "late")
    assert [r["round"] for r in private] == [1, 2, 3] and all("aborted" not in r for r in private)
    assert private[2]["clients_aggregated"] == private[2]["clients_sampled"] and private[2]["secagg_late"] >= 1
    assert all("secagg_late" not in r for r in private[:2])
    assert all("secagg_late" not in row for row in res["rounds"])
    aud = res["privacy"]["distributed"]["audiences"]
    assert aud["observers"]["amplification"] is False and "lost sampled clients" in aud["observers"]["sampling"]
    assert aud["observers"]["epsilon"] == pytest.approx(aud["server"]["epsilon"], rel=1e-12)
    ledger = res["privacy"]["distributed"]["ledger_epsilon"]
    assert res["privacy"]["epsilon"] == res["rounds"][-1]["epsilon"] == pytest.approx(ledger, rel=1e-6)
    assert res["rounds"][-1]["epsilon"] > ledger  # the row carries the run's slack
    assert res["rounds"][-1]["epsilon"] > aud["server"]["epsilon"]  # 3 amplified + 3 unamplified charges
