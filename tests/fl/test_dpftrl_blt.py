"""privacy = "dpftrl" with dpftrl-factorization = "blt": the noise against C^{-1} z recomputed densely, the
printed ε against dp-accounting's Gaussian at z / (sensitivity by brute force), the on-disk cache of the
optimized parameters, and real runs on the in-process Flower engine, plain and over secure aggregation."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import dp_accounting
import numpy as np
import pytest
import torch

from fedprivacy.config import RunConfig
from fedprivacy.dp.matrix import Blt, Workload
from fedprivacy.dp.matrix.blt import optimize_blt
from fedprivacy.dp.rng import RandomSource
from fedprivacy.fl.aggregation import PlainAggregator
from fedprivacy.fl.client import local_exchange
from fedprivacy.fl.modes import Transport, get_mode
from fedprivacy.fl.modes.dpftrl import cached_blt
from fedprivacy.fl.round_inputs import RoundInputs
from fedprivacy.fl.run import run_federated
from fedprivacy.fl.task import default_hooks
from fedprivacy.ml import diskcache
from fedprivacy.report import privacy_report_md
from server.engine import run_inprocess

N, DELTA = 6, 1e-3
APP_DIR = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("FEDPRIVACY_CACHE_DIR", str(tmp_path / "cache"))
    cached_blt.cache_clear()


def _cfg(tmp_path: Path, **kw: Any) -> RunConfig:
    base = {"num-server-rounds": 6, "seed": 3, "local-epochs": 1, "dataset": "digits", "model": "mlp",
            "secagg": False, "privacy": "dpftrl", "noise-multiplier": 1.5, "target-delta": DELTA,
            "output-dir": str(tmp_path), "run-name": "r", "dpftrl-factorization": "blt", "dpftrl-buffers": 2,
            "dpftrl-groups": 2}
    return RunConfig.from_mapping({**base, **kw})


def _brute_sensitivity(c: np.ndarray, min_sep: int, k: int) -> float:
    """max over every pattern with gaps >= min_sep and <= k rounds of sqrt(sum_{i,j in pi} |(C^T C)_ij|):
    a bound for any directions of the contributions, attained when they align."""
    gram, best = np.abs(c.T @ c), 0.0
    for size in range(1, k + 1):
        for pi in itertools.combinations(range(c.shape[0]), size):
            if all(b - a >= min_sep for a, b in zip(pi, pi[1:], strict=False)):
                best = max(best, float(np.sqrt(gram[np.ix_(pi, pi)].sum())))
    return best


def test_the_noise_added_is_c_inverse_z_for_the_blt_and_the_z_drawn(tmp_path: Path) -> None:
    # Arrange: momentum SGD's workload, 3 groups over 12 rounds (the BLT is far from banded there)
    rounds = 12
    cfg = _cfg(tmp_path, **{"num-server-rounds": rounds, "dpftrl-groups": 3, "server-optimizer": "fedavgm"})
    mode = get_mode("dpftrl")
    weights = [np.asarray(w) for w in default_hooks(cfg, population=N).init(0)]
    dim = int(sum(w.size for w in weights))
    plan = mode.plan(cfg, population=N, dim=dim)
    round_fn = mode.round_fn(cfg, plan, Transport(exchange=local_exchange(cfg, population=N)))
    inputs = RoundInputs(cfg, population=N, root=RandomSource.seeded(1), plan=plan, mode=mode, num_classes=10)
    added = []
    # Act
    for rnd in range(1, rounds + 1):
        instr, cohort, _ = inputs.take(rnd)
        outcome = round_fn(instr, cohort, weights, RandomSource.seeded(7 if rnd == 1 else rnd))
        clean = PlainAggregator(clip_norm=cfg.clip_norm, noise_std=0.0).aggregate(
            outcome.updates, like=weights, denominator=1.0, rng=RandomSource.seeded(0))
        added.append(np.concatenate([
            (np.asarray(m, np.float64) * plan.denominator - np.asarray(c, np.float64)).ravel()
            for m, c in zip(outcome.aggregate.mean_update, clean.mean_update, strict=True)]))
    # Assert: the strategy is the optimized BLT; w = C^{-1} Z with its dense matrix from the same source
    strategy = optimize_blt(Workload(num_rounds=rounds, momentum=cfg.server_momentum), num_buffers=2, min_sep=3,
                            max_participations=4)
    assert plan.correlated is not None and plan.correlated.strategy == strategy
    c = strategy.matrix()
    assert float(np.tril(c, -3).max()) > 0.1  # not banded within the separation
    sens = _brute_sensitivity(c, 3, 4)
    std = plan.central_noise_std
    assert std == pytest.approx(1.5 * cfg.clip_norm * sens, rel=1e-12)
    source = RandomSource.seeded(7).child("dpftrl-noise")
    z = np.stack([np.asarray(source.normal(std=std, size=dim)) for _ in range(rounds)])
    expected = np.linalg.solve(c, z)
    assert np.allclose(np.stack(added), expected, atol=1e-5 * float(np.abs(expected).max()))


def test_the_printed_epsilon_is_the_gaussian_at_z_over_the_brute_force_sensitivity(tmp_path: Path) -> None:
    # Arrange: 6 rounds, 2 groups of 3: 2-min-separation, <= 3 participations
    cfg = _cfg(tmp_path)
    # Act
    result = run_federated(cfg, population=N, exchange=local_exchange(cfg, population=N), log=lambda _: None)
    # Assert: noise std / (clip * sens) is z, and the one horizon charge is GaussianDpEvent(z) by PLD
    privacy = result["privacy"]
    strategy = optimize_blt(Workload(num_rounds=6), num_buffers=2, min_sep=2, max_participations=3)
    sens = _brute_sensitivity(strategy.matrix(), 2, 3)
    assert privacy["noise_std"] == pytest.approx(1.5 * cfg.clip_norm * sens, rel=1e-12)
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(dp_accounting.GaussianDpEvent(noise_multiplier=privacy["noise_std"] / (cfg.clip_norm * sens)))
    eps = pld.get_epsilon(DELTA)
    assert [r["epsilon"] for r in result["rounds"]] == pytest.approx([eps] * 6, rel=1e-6)
    claim = privacy["correlated"]
    assert claim["factorization"] == "blt-2" and claim["buffers"] == 2 and claim["band"] is None
    assert claim["sensitivity"] == pytest.approx(sens, rel=1e-12) and "non-increasing" in claim["sensitivity_basis"]
    report = privacy_report_md(result, covers=get_mode("dpftrl").covers)
    assert "C = blt-2 (2 buffers, not banded, 6 rounds)" in report and claim["sensitivity_basis"] in report


def test_the_optimized_parameters_are_cached_on_disk_and_a_file_only_chooses_c(tmp_path: Path) -> None:
    # Arrange
    w = Workload(num_rounds=12, momentum=0.9)
    fresh = cached_blt(w, num_buffers=2, min_sep=3, max_participations=4)
    files = list((tmp_path / "cache" / "dpftrl-blt").glob("*.npz"))
    assert len(files) == 1 and fresh == optimize_blt(w, num_buffers=2, min_sep=3, max_participations=4)
    key = files[0].stem
    # Act: a file in the provable box is used as it is; one outside it (increasing coefficients) is not
    diskcache.write("dpftrl-blt", key, {"buf_decay": np.array([0.5, 0.9]), "output_scale": np.array([0.2, 0.1])})
    cached_blt.cache_clear()
    read_back = cached_blt(w, num_buffers=2, min_sep=3, max_participations=4)
    diskcache.write("dpftrl-blt", key, {"buf_decay": np.array([0.5, 0.9]), "output_scale": np.array([2.0, 0.1])})
    cached_blt.cache_clear()
    refused = cached_blt(w, num_buffers=2, min_sep=3, max_participations=4)
    # Assert
    assert read_back == Blt(num_rounds=12, buf_decay=(0.5, 0.9), output_scale=(0.2, 0.1), name="blt-2")
    assert refused == fresh


def _inprocess(tmp_path: Path, name: str, **overrides: object) -> dict:
    run_config = {"num-server-rounds": 4, "seed": 2, "output-dir": str(tmp_path), "run-name": name,
                  "local-epochs": 1, "privacy": "dpftrl", "secagg": False, "noise-multiplier": 1.5,
                  "dpftrl-factorization": "blt", "dpftrl-buffers": 2, "dpftrl-groups": 2, "sample-rate": 1.0,
                  "target-delta": DELTA, **overrides}
    run_inprocess(run_config=run_config, num_supernodes=12, app_dir=APP_DIR, node_id_seed=3)
    return json.loads((tmp_path / name / "results.json").read_text())


def test_the_flower_apps_run_blt_plain_and_over_secure_aggregation_at_the_same_epsilon(tmp_path: Path) -> None:
    # Act: the real ServerApp and ClientApps on the in-process engine, with and without secure aggregation
    plain = _inprocess(tmp_path, "plain")
    secure = _inprocess(tmp_path, "secure", secagg=True)
    # Assert
    strategy = optimize_blt(Workload(num_rounds=4), num_buffers=2, min_sep=2, max_participations=2)
    sens = _brute_sensitivity(strategy.matrix(), 2, 2)
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(dp_accounting.GaussianDpEvent(noise_multiplier=1.5))
    for result in (plain, secure):
        assert result["status"] == "completed" and len(result["rounds"]) == 4
        assert [r["epsilon"] for r in result["rounds"]] == pytest.approx([pld.get_epsilon(DELTA)] * 4, rel=1e-6)
        assert result["privacy"]["correlated"]["sensitivity"] == pytest.approx(sens, rel=1e-12)
        assert math.isfinite(result["rounds"][-1].get("test_accuracy", 0.0))
    assert secure["privacy"]["correlated"] == plain["privacy"]["correlated"]
    assert "torus" in secure["privacy"]["mechanism"] and "blt-2" in secure["privacy"]["mechanism"]


def test_the_noise_on_the_unmasked_sum_is_c_inverse_z_for_the_blt() -> None:
    # Arrange: 9 clients in 3 groups, 12 rounds of momentum SGD's BLT, real client steps over secure aggregation
    from tests.fl.test_dpftrl_secure import _added, _encoding
    from tests.fl.test_secure_round import DirectTransport, _instr, _updates

    n, dim, rounds = 9, 2000, 12
    cfg = RunConfig(privacy="dpftrl", secagg=True, clip_norm=0.5, num_server_rounds=rounds, noise_multiplier=1.5,
                    dpftrl_factorization="blt", dpftrl_buffers=2, dpftrl_groups=3, server_optimizer="fedavgm",
                    target_delta=DELTA)
    like = [np.zeros(dim, np.float32)]
    updates = _updates(n, like)
    mode = get_mode("dpftrl")
    plan = mode.plan(cfg, population=n, dim=dim)
    round_fn = mode.round_fn(cfg, plan, Transport(secure=DirectTransport(cfg, updates)), log=lambda _: None)
    # Act: round t trains group (t - 1) mod 3; the stream is seeded by the first round's source
    outcomes = [round_fn(_instr(t, privacy="dpftrl"), [p for p in range(n) if p % 3 == (t - 1) % 3], like,
                         RandomSource.seeded(7 if t == 1 else t)) for t in range(1, rounds + 1)]
    # Assert: innovations of std z sens Delta, w = C^{-1} Z from the same source, for the optimized BLT
    strategy = optimize_blt(Workload(num_rounds=rounds, momentum=0.9), num_buffers=2, min_sep=3, max_participations=4)
    sens = _brute_sensitivity(strategy.matrix(), 3, 4)
    enc = _encoding(cfg, strategy, sens, n=n, dim=dim, threshold=round_fn.threshold)
    std = 1.5 * sens * (0.5 + math.sqrt(dim) / enc.scale)
    source = RandomSource.seeded(7).child("dpftrl-noise")
    z = np.stack([np.asarray(source.normal(std=std * enc.scale, size=dim)) for _ in range(rounds)])
    expected = np.linalg.solve(strategy.matrix(), z) / enc.scale
    added = np.stack([_added(o, updates, plan) for o in outcomes])
    assert np.allclose(added, expected, rtol=1e-6, atol=n / enc.scale)
    assert all(o.aggregate.noise_std == pytest.approx(std, rel=1e-12) for o in outcomes)
    assert [o.aggregate.correlated_draw.index for o in outcomes] == list(range(1, rounds + 1))
