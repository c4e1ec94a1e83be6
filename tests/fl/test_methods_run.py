"""Server optimizers and adaptive clipping inside a real ``FederatedRun``.

The tiny numpy federation of ``test_loop.py`` (clients pull the model towards their own targets, real
``privatize_update``): selection by config key, checkpoint/resume bit for bit, ε unchanged by the
post-processing, and adaptive clipping's per-round clip norm, noise and ledger.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedprivacy.accounting import PoissonSampling, epsilon_for
from fedprivacy.config import RunConfig
from fedprivacy.dp.adaptive_clipping import update_noise_multiplier
from fedprivacy.dp.rng import RandomSource
from fedprivacy.fl.adaptive_clip import UNCLIPPED_TOLERANCE
from fedprivacy.fl.client import client_rng, privatize_update
from fedprivacy.fl.mechanisms import get_client_mechanism
from fedprivacy.fl.run import FederatedRun, run_federated
from fedprivacy.fl.server_opt import FedAvg, make_server_optimizer
from fedprivacy.fl.server_optimizers import FedAdam, FedAvgM, FedYogi
from fedprivacy.fl.types import ClientUpdate, ModelHooks

N = 40
TARGETS = [RandomSource.seeded(7).child(p).normal(std=1.0, size=6) * (1 + p % 5) for p in range(N)]


def _hooks() -> ModelHooks:
    mean_target = np.mean(TARGETS, axis=0)

    def evaluate(w: Any) -> tuple[float, float]:
        loss = float(np.sum((np.concatenate([a.ravel() for a in w]) - mean_target) ** 2))
        return loss, 1.0 / (1.0 + loss)

    return ModelHooks(init=lambda seed: [np.zeros(4, np.float32), np.zeros(2, np.float32)],
                      evaluate=evaluate, num_classes=2)


def _exchange(seen: list[float] | None = None) -> Any:
    def exchange(instr: Any, cohort: Any, weights: Any) -> Any:
        if seen is not None:
            seen.append(instr.clip_norm)
        flat = np.concatenate([np.asarray(a, np.float64).ravel() for a in weights])
        updates = []
        for pid in cohort:
            step = 0.5 * (TARGETS[pid] - flat)
            delta = privatize_update([step[:4], step[4:]], clip_norm=instr.clip_norm,
                                     mechanism=get_client_mechanism(instr.client_mechanism),
                                     noise_multiplier=instr.noise_multiplier, private=instr.private,
                                     rng=client_rng(seed=instr.seed, partition_id=pid, round=instr.round))
            updates.append(ClientUpdate(partition_id=pid, delta=tuple(np.asarray(a, np.float32) for a in delta),
                                        num_examples=10, train_loss=float(np.sum(step**2))))
        return updates, {}

    return exchange


def _cfg(tmp_path: Path, **kw: Any) -> RunConfig:
    base = {"output-dir": str(tmp_path), "seed": 3, "privacy": "central", "secagg": False,
            "accountant": "rdp", "num-server-rounds": 6, "noise-multiplier": 1.0, "clip-norm": 1.0,
            "sample-rate": 0.5, "target-delta": 1e-3}
    base.update(kw)
    return RunConfig.from_mapping(base)


def _run(cfg: RunConfig, **kw: Any) -> dict[str, Any]:
    return run_federated(cfg, population=N, exchange=kw.pop("exchange", _exchange()), hooks=_hooks(),
                         log=kw.pop("log", lambda _l: None), **kw)


# ------------------------------------------------------------------------------ server optimizers
@pytest.mark.parametrize("name,cls,kw", [
    ("fedavg", FedAvg, {}),
    ("fedavgm", FedAvgM, {"server-momentum": 0.5, "server-learning-rate": 0.7}),
    ("fedadam", FedAdam, {"server-beta-1": 0.8, "server-tau": 0.01}),
    ("fedyogi", FedYogi, {"server-beta-2": 0.9, "server-learning-rate": 0.05}),
])
def test_config_key_selects_the_optimizer_with_its_hyper_parameters(
        tmp_path: Path, name: str, cls: type, kw: dict[str, Any]) -> None:
    opt = make_server_optimizer(_cfg(tmp_path, **{"server-optimizer": name, **kw}))

    assert type(opt) is cls
    if name == "fedavgm":
        assert (opt.learning_rate, opt.momentum) == (0.7, 0.5)  # type: ignore[attr-defined]
    if name == "fedadam":
        assert (opt.learning_rate, opt.beta_1, opt.tau) == (0.1, 0.8, 0.01)  # type: ignore[attr-defined]
    if name == "fedyogi":
        assert (opt.learning_rate, opt.beta_2) == (0.05, 0.9)  # type: ignore[attr-defined]


def test_fedavg_with_a_server_rate_is_fedavgm_without_momentum(tmp_path: Path) -> None:
    opt = make_server_optimizer(_cfg(tmp_path, **{"server-learning-rate": 0.5}))
    assert isinstance(opt, FedAvgM) and opt.momentum == 0.0 and opt.learning_rate == 0.5


@pytest.mark.parametrize("key,value,match", [
    ("server-optimizer", "sgd", "server-optimizer must be one of"),
    ("server-momentum", 1.0, "server-momentum"),
    ("server-tau", 0.0, "server-tau"),
    ("server-learning-rate", -1.0, "server-learning-rate"),
])
def test_bad_optimizer_keys_are_refused(tmp_path: Path, key: str, value: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _cfg(tmp_path, **{key: value})


@pytest.mark.parametrize("privacy", ["none", "central", "local"])
def test_fedadam_runs_in_every_plain_mode_and_costs_no_epsilon(tmp_path: Path, privacy: str) -> None:
    kw = {"privacy": privacy, "run-name": privacy}
    if privacy == "local":
        kw["sample-rate"] = 1.0
    plain = _run(_cfg(tmp_path / "a", **kw))
    adam = _run(_cfg(tmp_path / "b", **kw, **{"server-optimizer": "fedadam"}))

    assert [r["epsilon"] for r in adam["rounds"]] == [r["epsilon"] for r in plain["rounds"]]
    assert adam["rounds"][-1]["test_loss"] != plain["rounds"][-1]["test_loss"]
    assert adam["config"]["server-optimizer"] == "fedadam"


@pytest.mark.parametrize("opt", ["fedavgm", "fedadam", "fedyogi"])
def test_killed_run_resumes_the_optimizer_state_bit_for_bit(tmp_path: Path, opt: str) -> None:
    class Killed(BaseException):
        pass

    def kill_after_round_3(line: str) -> None:
        if line.startswith("round   3/"):
            raise Killed

    kw = {"server-optimizer": opt}
    full = _run(_cfg(tmp_path, **kw, **{"run-name": "full"}))
    with pytest.raises(Killed):
        _run(_cfg(tmp_path, **kw, **{"run-name": "cut"}), log=kill_after_round_3)
    resumed = _run(_cfg(tmp_path, **kw, **{"run-name": "cut", "resume": True}))

    assert [r["test_loss"] for r in resumed["rounds"]] == [r["test_loss"] for r in full["rounds"]]
    state = json.loads((tmp_path / "cut" / "checkpoint" / "state.json").read_text())
    assert set(state["extra"]["server_optimizer"]) >= ({"velocity"} if opt == "fedavgm" else {"m", "v"})


# ------------------------------------------------------------------------------ adaptive clipping
def test_adaptive_clip_follows_the_released_fraction_and_is_reported(tmp_path: Path) -> None:
    seen: list[float] = []
    cfg = _cfg(tmp_path, **{"adaptive-clip": True, "clip-norm": 0.05, "num-server-rounds": 8,
                            "run-name": "ada", "adaptive-clip-count-std": 1.0})
    res = _run(cfg, exchange=_exchange(seen))
    rows = res["rounds"]

    clips = [r["clip_norm"] for r in rows]
    assert seen == clips and clips[0] == 0.05
    for a, b in zip(rows, rows[1:], strict=False):  # the paper's geometric rule on the released fraction
        assert b["clip_norm"] == pytest.approx(
            a["clip_norm"] * math.exp(-0.2 * (a["clip_unclipped_fraction"] - 0.5)), rel=1e-12)
    assert clips[-1] > clips[0]  # every update is far above 0.05: the estimate grows
    block = res["privacy"]["adaptive_clip"]
    assert block["count_noise_std"] == 1.0
    assert block["update_noise_multiplier"] == pytest.approx(
        update_noise_multiplier(noise_multiplier=1.0, count_noise_std=1.0))
    saved = json.loads((tmp_path / "ada" / "results.json").read_text())
    assert [r["clip_norm"] for r in saved["rounds"]] == clips
    report = (tmp_path / "ada" / "privacy_report.md").read_text()
    assert "## Adaptive clipping" in report and f"| 8 | {clips[-1]:.4g} |" in report


def test_adaptive_clip_costs_the_same_epsilon_as_the_fixed_clip(tmp_path: Path) -> None:
    fixed = _run(_cfg(tmp_path, **{"run-name": "f"}))
    ada = _run(_cfg(tmp_path, **{"run-name": "a", "adaptive-clip": True, "adaptive-clip-count-std": 1.0}))

    # the pair (update z_Δ, count σ_b) is one Gaussian of z = 1 (Theorem 1): same ledger, same ε
    assert [r["epsilon"] for r in ada["rounds"]] == [r["epsilon"] for r in fixed["rounds"]]
    ref = epsilon_for(noise_multiplier=1.0, sampling=PoissonSampling(rate=0.5), steps=6, delta=1e-3,
                      backend="rdp")
    assert ada["privacy"]["epsilon"] == pytest.approx(ref, rel=1e-12)


def test_adaptive_round_adds_the_raised_noise_and_counts_the_right_bits(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, **{"adaptive-clip": True, "clip-norm": 2.0, "adaptive-clip-count-std": 4.0,
                            "num-server-rounds": 1})
    run = FederatedRun(cfg, population=N, exchange=_exchange(), hooks=_hooks(), callbacks=[])
    run.start()
    rnd_fn = run._round_fn
    assert rnd_fn is not None and run.inputs is not None
    outcome = rnd_fn(run.inputs.instructions(1), list(range(N)), run.weights, RandomSource.seeded(1))

    zd = update_noise_multiplier(noise_multiplier=1.0, count_noise_std=4.0)
    assert outcome.aggregate.noise_std == pytest.approx(zd * 2.0)
    norms = [math.sqrt(float(np.sum(0.25 * TARGETS[p] ** 2))) for p in range(N)]
    true_fraction = sum(n < 2.0 * (1 - UNCLIPPED_TOLERANCE) for n in norms) / N
    assert outcome.clip is not None and outcome.clip.clip_norm == 2.0
    assert abs(outcome.clip.unclipped_fraction - true_fraction) < 5 * 4.0 / N  # σ_b / m, 5 sd


def test_adaptive_clip_resumes_its_estimate(tmp_path: Path) -> None:
    class Killed(BaseException):
        pass

    def kill(line: str) -> None:
        if line.startswith("round   3/"):
            raise Killed

    kw = {"adaptive-clip": True, "clip-norm": 0.1, "adaptive-clip-count-std": 1.0}
    full = _run(_cfg(tmp_path, **kw, **{"run-name": "full"}))
    with pytest.raises(Killed):
        _run(_cfg(tmp_path, **kw, **{"run-name": "cut"}), log=kill)
    resumed = _run(_cfg(tmp_path, **kw, **{"run-name": "cut", "resume": True}))

    assert [r["clip_norm"] for r in resumed["rounds"]] == [r["clip_norm"] for r in full["rounds"]]
    assert [r["test_loss"] for r in resumed["rounds"]] == [r["test_loss"] for r in full["rounds"]]


@pytest.mark.parametrize("kw,match", [
    ({"privacy": "local"}, "adaptive-clip=true is implemented for privacy='central'"),
    ({"adaptive-clip-quantile": 1.0}, "adaptive-clip-quantile"),
    ({"adaptive-clip-learning-rate": 0.0}, "adaptive-clip-learning-rate"),
])
def test_adaptive_clip_refusals(tmp_path: Path, kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _cfg(tmp_path, **{"adaptive-clip": True, **kw})


def test_count_noise_too_small_for_the_round_budget_is_refused_before_round_one(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, **{"adaptive-clip": True, "noise-multiplier": 3.0, "adaptive-clip-count-std": 1.0})
    with pytest.raises(ValueError, match="adaptive-clip-count-std must be > noise-multiplier/2"):
        _run(cfg)
