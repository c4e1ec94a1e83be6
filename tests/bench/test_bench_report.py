"""Report machinery of scripts/benchmark.py: ratios, goal verdicts, table, markdown, memory."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import pytest

from fedprivacy_bench import report
from fedprivacy_bench.fedprivacy_runner import run_config_for
from fedprivacy_bench.memory import process_tree, tree_memory_mb
from fedprivacy_bench.spec import BenchSpec, make_record, steady_state_seconds


def _spec(**kw: object) -> BenchSpec:
    base: dict[str, object] = dict(dataset="digits", framework="fedprivacy", mode="none",
                                   engine="inprocess", num_clients=1000, clients_per_round=100,
                                   rounds=5, hidden=1330)
    base.update(kw)
    return BenchSpec(**base)  # type: ignore[arg-type]


def _row(*, secs: float, acc: float, eps: float | None = None, params: int = 99_760,
         **kw: object) -> dict:
    spec = _spec(**kw)
    return make_record(spec, params=params, round_seconds=[9.0] + [secs] * 4, rounds=5,
                       test_accuracy=acc, epsilon=eps, peak_memory_mb=500.0)


def test_steady_state_is_median_after_warmup() -> None:
    rounds = [12.0, 0.3, 0.1, 0.2, 0.5]
    assert steady_state_seconds(rounds) == statistics.median(rounds[1:])
    assert steady_state_seconds([4.0]) == 4.0
    assert steady_state_seconds([]) is None


def test_ratios_compare_with_the_same_framework_on_the_same_setup() -> None:
    rows = [
        _row(secs=0.10, acc=0.90),
        _row(secs=0.13, acc=0.86, eps=3.0, mode="central", noise_multiplier=1.1),
        _row(secs=0.50, acc=0.88, framework="flower", engine="ray"),
        _row(secs=1.00, acc=0.85, eps=14.0, framework="flower", engine="ray", mode="central",
             noise_multiplier=1.1),
        _row(secs=0.05, acc=0.91, framework="torch", engine="loop"),
        _row(secs=7.0, acc=0.5, hidden=128, params=9610),  # other setup: never a reference here
    ]
    out = report.add_ratios(rows)
    central, fl_central = out[1], out[3]
    assert central["ratio_vs_none"]["seconds_per_round"] == pytest.approx(0.13 / 0.10)
    assert central["ratio_vs_none"]["accuracy_points"] == pytest.approx(-4.0)
    assert central["ratio_vs_torch_loop"] == pytest.approx(0.13 / 0.05)
    assert central["ratio_vs_flower_fedavg"] == pytest.approx(0.13 / 0.50)
    assert fl_central["ratio_vs_none"]["seconds_per_round"] == pytest.approx(1.00 / 0.50)
    assert out[5]["ratio_vs_none"]["seconds_per_round"] == pytest.approx(1.0)
    assert out[5]["ratio_vs_torch_loop"] is None


def test_goal_verdicts_follow_the_figures() -> None:
    rows = report.add_ratios([
        _row(secs=0.10, acc=0.90),
        _row(secs=0.14, acc=0.89, eps=3.0, mode="distributed", noise_multiplier=1.1),
        _row(secs=0.50, acc=0.88, framework="flower", engine="ray"),
        _row(secs=2.00, acc=0.80, eps=14.0, framework="flower", engine="ray",
             mode="secagg+central", noise_multiplier=1.1),
        _row(secs=1.0, acc=0.70, dataset="synthetic", hidden=140, params=9950),
        _row(secs=1.1, acc=0.62, eps=2.99, dataset="synthetic", hidden=140, params=9950,
             mode="central", noise_multiplier=1.1, target_epsilon=3.0),
    ])
    verdicts = {g["goal"]: g["verdict"] for g in report.evaluate_goals(rows)}
    assert verdicts[next(k for k in verdicts if "1.3×" in k)] == "missed"  # 1.4x > 1.3x
    assert verdicts[next(k for k in verdicts if "within 5 points" in k)] == "missed"  # -8 pts
    assert verdicts[next(k for k in verdicts if "plain FedAvg" in k)] == "met"
    assert verdicts[next(k for k in verdicts if "SecAgg+ + DP" in k)] == "met"
    assert verdicts[next(k for k in verdicts if "completion" in k)] == "met"
    assert len(verdicts) == 5


def test_missing_rows_are_reported_as_not_measured_with_the_reason() -> None:
    refused = make_record(_spec(mode="distributed", noise_multiplier=1.0), status="refused",
                          note="ValueError: privacy='distributed' is not available")
    goals = report.evaluate_goals(report.add_ratios([_row(secs=0.1, acc=0.9), refused]))
    first = goals[0]
    assert first["verdict"] == "not measured"
    assert "not available" in first["figures"]


def test_markdown_has_one_line_per_row_and_states_command_and_machine() -> None:
    rows = report.add_ratios([_row(secs=0.1, acc=0.9), _row(secs=0.2, acc=0.8, mode="central",
                                                             eps=3.0, noise_multiplier=1.0)])
    table = report.markdown_table(rows).splitlines()
    assert len(table) == 2 + len(rows)
    assert all(line.count("|") == len(report.TABLE_COLUMNS) + 1 for line in table)
    payload = {"rows": rows, "goals": report.evaluate_goals(rows), "machine": report.machine_info(),
               "command": "python scripts/benchmark.py --quick", "sweep": "quick",
               "runtime_seconds": 120.0, "finished": "now", "notes": ["a note"]}
    md = report.render_markdown(payload)
    assert "python scripts/benchmark.py --quick" in md
    assert payload["machine"]["cpu"] in md and f"{os.cpu_count()} cores" in md
    assert "| 3.00 |" in md  # epsilon column of the central row


def test_spec_round_trips_and_validates() -> None:
    spec = _spec(mode="dpsgd", extra=(("dpsgd_noise_multiplier", 1.0),))
    assert BenchSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError, match="clients_per_round"):
        _spec(clients_per_round=2000)
    with pytest.raises(ValueError, match="mode"):
        _spec(mode="bogus")


def test_run_config_uses_only_keys_fedprivacy_accepts() -> None:
    from fedprivacy.config import RunConfig

    for mode in ("none", "central", "local", "distributed", "dpsgd"):
        spec = _spec(mode=mode, noise_multiplier=0.0 if mode in ("none", "dpsgd") else 1.2)
        cfg = RunConfig.from_mapping(run_config_for(spec, output_dir="out"))
        assert cfg.sample_rate == pytest.approx(0.1)
        assert cfg.hidden_units == 1330
        assert cfg.privacy == ("none" if mode in ("none", "dpsgd") else mode)
        assert cfg.dpsgd is (mode == "dpsgd")
        assert cfg.secagg is (mode == "distributed")
        assert cfg.accountant == "pld"  # distributed too: each round the PLD of its dominating Gaussian
    synthetic = RunConfig.from_mapping(run_config_for(_spec(dataset="synthetic", hidden=140),
                                                      output_dir="out"))
    assert synthetic.dataset == "synthetic"
    adam = RunConfig.from_mapping(run_config_for(
        _spec(server_optimizer="fedadam", server_learning_rate=0.05, server_beta_1=0.8,
              server_beta_2=0.95, server_tau=0.01), output_dir="out"))
    assert (adam.server_optimizer, adam.server_learning_rate, adam.server_beta_1, adam.server_beta_2,
            adam.server_tau) == ("fedadam", 0.05, 0.8, 0.95, 0.01)
    assert _spec(server_optimizer="fedadam").key().endswith("-fedadam-r5")  # rows of other optimizers differ


def test_memory_sampler_sees_child_processes() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        for _ in range(50):
            if child.pid in process_tree(os.getpid()):
                break
            time.sleep(0.05)
        assert child.pid in process_tree(os.getpid())
        assert tree_memory_mb(os.getpid()) > tree_memory_mb(child.pid) > 0
    finally:
        child.kill()
        child.wait()


def test_distributed_record_keeps_each_audiences_epsilon_from_results_json() -> None:
    from fedprivacy_bench.fedprivacy_runner import record_from_results

    results = {"status": "completed",
               "rounds": [{"test_accuracy": 0.5, "epsilon": 10.3, "seconds": 2.0}] * 2,
               "privacy": {"epsilon": 10.35, "accountant": "pld", "sampling": "poisson(q=0.1, N=1000)",
                           "epsilon_audience": "server",
                           "distributed": {"audiences": {"server": {"epsilon": 10.35, "amplification": False},
                                                         "observers": {"epsilon": 3.004,
                                                                       "amplification": True}},
                                           "central_dp_epsilon_same_sigma": 10.34,
                                           "central_dp_epsilon_same_sigma_and_sampling": 2.997,
                                           "noise": "exact XNoise"}}}
    rec = record_from_results(_spec(mode="distributed", noise_multiplier=1.0), results)
    assert rec["epsilon"] == 10.35 and rec["epsilon_note"].startswith("fedprivacy pld accountant")
    assert rec["epsilon_audiences"] == {
        "audience": "server", "server": 10.35, "observers": 3.004, "observers_amplified": True,
        "central_same_sigma_and_sampling": 2.997, "central_same_sigma_no_sampling": 10.34,
        "noise": "exact XNoise"}
    central = record_from_results(_spec(mode="central", noise_multiplier=1.0),
                                  {**results, "privacy": {"epsilon": 2.997}})
    assert "epsilon_audiences" not in central
