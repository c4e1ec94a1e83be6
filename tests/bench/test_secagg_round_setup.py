"""``scripts/secagg_round_bench.py --setup``: the real-data workload of the curve, mode by mode.

The run config must be the benchmark row's own (population, cohort, data, model, local training, clip,
σ), so that the ratio it prints is the one of the rows on docs/BENCHMARKS.md; only the privacy mode and
secure aggregation change between the bench's rows.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("secagg_round_bench_t", REPO / "scripts" / "secagg_round_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_setup_config_is_the_benchmark_rows_own_workload() -> None:
    # Arrange: the saved central ε = 4, T = 120 row of the curve (σ, population, q, model, training)
    saved = json.loads((REPO / "fedprivacy_bench" / "results"
                        / "fashion_setup_fedavgm-c300_t120_eps4.json").read_text())["rows"][0]
    # Act
    cfg, population = _bench().setup_config("fedavgm-c300", epsilon=4.0, setup_rounds=120)
    # Assert
    assert population == saved["num_clients"] == 3000
    assert cfg["noise-multiplier"] == pytest.approx(saved["noise_multiplier"], rel=1e-9)
    assert cfg["sample-rate"] == saved["sample_rate"] and cfg["sampling"] == "poisson"
    assert (cfg["dataset"], cfg["model"], cfg["server-optimizer"]) == ("fashion-mnist", "convnet", "fedavgm")
    assert (cfg["local-epochs"], cfg["batch-size"], cfg["clip-norm"]) == (
        saved["spec"]["local_epochs"], saved["spec"]["batch_size"], saved["clip_norm"])
    # the bench's modes decide these, and its own output folder and rounds
    assert not {"privacy", "secagg", "output-dir", "num-server-rounds"} & set(cfg)


def test_setup_config_refuses_an_unknown_setup_by_name() -> None:
    with pytest.raises(ValueError, match="setup must be one of"):
        _bench().setup_config("no-such-setup", epsilon=4.0, setup_rounds=None)


def test_goal_label_names_the_workload() -> None:
    bench = _bench()
    rows = [{"mode": "central", "seconds_per_round": 2.0, "cpu_seconds_per_round": 2.0},
            {"mode": "distributed", "seconds_per_round": 3.0, "cpu_seconds_per_round": 2.5}]
    assert bench.goals(rows, clients=10, real_data=True) == {
        "distributed_over_central (goal <= 1.3 on the real-data workload)": 1.5,
        "distributed_over_central_cpu (load-robust)": 1.25}
    assert "distributed_over_central (goal <= 2 on digits)" in bench.goals(rows, clients=10)
