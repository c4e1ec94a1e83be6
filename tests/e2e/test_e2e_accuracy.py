"""Accuracy anchors on digits with the default settings (10 clients, in-process engine, seeded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from server.engine import run_inprocess

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("seed", [0, 1])
def test_non_dp_run_reaches_90_percent_on_digits(tmp_path: Path, seed: int) -> None:
    torch.set_num_threads(1)
    result = run_inprocess(run_config={"privacy": "none", "seed": seed, "output-dir": str(tmp_path)},
                           num_supernodes=10, app_dir=REPO, node_id_seed=seed)
    assert result.results_path is not None
    rounds = json.loads(Path(result.results_path).read_text())["rounds"]
    assert len(rounds) == 20
    assert rounds[-1]["test_accuracy"] >= 0.90
