"""The real ServerApp/ClientApp through the in-process engine: digits, a crashed and a silent client.

Uses ``server.engine`` (the in-process engine's Grid) so it runs in seconds; the same apps under Flower's own
engines are tested in ``tests/e2e`` (slow).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedprivacy.fl.run import read_participation
from server.engine import run_inprocess
from server.engine.faults import FaultPlan, FaultRule

APP_DIR = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_round_survives_a_crashed_and_a_timed_out_client(tmp_path: Path) -> None:
    # Arrange: 6 clients; partition 1 raises in round 1, partition 4 never answers in round 2
    faults = FaultPlan(rules=(
        FaultRule(action="raise", message_type="train", rounds=(1,), partition_ids=(1,)),
        FaultRule(action="drop", message_type="train", rounds=(2,), partition_ids=(4,)),
    ))
    run_config = {"num-server-rounds": 2, "seed": 3, "output-dir": str(tmp_path), "run-name": "faults",
                  "accountant": "rdp", "client-timeout": 60.0, "local-epochs": 1,
                  "privacy": "central", "secagg": False}
    # Act
    result = run_inprocess(run_config=run_config, num_supernodes=6, app_dir=APP_DIR, faults=faults,
                           node_id_seed=1)
    # Assert
    saved = json.loads((tmp_path / "faults" / "results.json").read_text())
    assert result.results_path is not None
    # central mode: the counts are in the server's private log, not in the published results
    assert "clients_sampled" not in saved["rounds"][0] and not saved["privacy"]["participation"]["published"]
    rounds = read_participation(tmp_path / "faults")
    assert [(r["clients_sampled"], r["clients_aggregated"]) for r in rounds] == [(6, 5), (6, 5)]
    # the fixed denominator makes leaving clients out free: ε is that of 2 full Gaussian rounds
    from fedprivacy.accounting import epsilon_for

    ref = epsilon_for(noise_multiplier=1.0, sample_rate=1.0, steps=2, delta=1e-5, backend="rdp")
    assert saved["privacy"]["rounds"] == 2 and saved["privacy"]["epsilon"] == pytest.approx(ref, rel=1e-12)


def test_bad_run_config_stops_before_training_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="clip-norm"):
        run_inprocess(run_config={"clip-norm": -1.0, "output-dir": str(tmp_path)}, num_supernodes=3,
                      app_dir=APP_DIR)
    assert not any(tmp_path.iterdir())


def test_results_do_not_depend_on_node_ids(tmp_path: Path) -> None:
    runs = []
    for node_seed in (1, 2):
        run_config = {"num-server-rounds": 2, "seed": 5, "output-dir": str(tmp_path), "run-name": f"n{node_seed}",
                      "accountant": "rdp", "sample-rate": 0.6, "local-epochs": 1,
                      "privacy": "distributed", "secagg": True, "target-delta": 1e-3}
        run_inprocess(run_config=run_config, num_supernodes=5, app_dir=APP_DIR, node_id_seed=node_seed)
        runs.append(json.loads((tmp_path / f"n{node_seed}" / "results.json").read_text())["rounds"])
    strip = [[{k: v for k, v in r.items() if k != "seconds"} for r in rows] for rows in runs]
    assert strip[0] == strip[1]


def test_a_distributed_client_whose_training_diverges_still_takes_part(tmp_path: Path) -> None:
    # A learning rate of 1e38 overflows float32 in the first step, so every local update is non-finite.
    # The server is the adversary in distributed mode: an error reply or a dropout would tell it that
    # a client's training diverged on its data. Each client releases a zero update with its noise instead,
    # so every sampled client is aggregated and the round completes.
    run_config = {"num-server-rounds": 1, "seed": 2, "output-dir": str(tmp_path), "run-name": "diverged",
                  "local-epochs": 1, "learning-rate": 1e38, "privacy": "distributed", "secagg": True,
                  "target-delta": 1e-3}
    run_inprocess(run_config=run_config, num_supernodes=5, app_dir=APP_DIR, node_id_seed=1)
    saved = json.loads((tmp_path / "diverged" / "results.json").read_text())
    assert saved.get("stopped") in (None, "") and len(saved["rounds"]) == 1
    rounds = read_participation(tmp_path / "diverged")
    assert [(r["clients_sampled"], r["clients_aggregated"]) for r in rounds] == [(5, 5)]


def test_the_engine_prints_no_line_per_failing_client(tmp_path: Path) -> None:
    # one console line per failing client counts a round's failures (with private counts and
    # "every one of them", the cohort size). Without privacy a diverged update is a real ClientApp error.
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler(level=logging.INFO)
    handler.emit = records.append  # type: ignore[method-assign]
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addHandler(handler)
    try:
        run_config = {"num-server-rounds": 1, "seed": 2, "output-dir": str(tmp_path), "run-name": "errors",
                      "local-epochs": 1, "learning-rate": 1e38, "privacy": "none", "secagg": False}
        run_inprocess(run_config=run_config, num_supernodes=3, app_dir=APP_DIR, node_id_seed=1)
    finally:
        flwr_logger.removeHandler(handler)
    assert any("fedprivacy: 3 clients" in r.getMessage() for r in records)  # the handler sees the run's lines
    assert not any("ClientApp error" in r.getMessage() for r in records)
    saved = json.loads((tmp_path / "errors" / "results.json").read_text())
    assert "NaN or Inf" in saved["stopped"]  # the run itself still says why (its counts are public here)
