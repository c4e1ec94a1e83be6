"""Smoke run of scripts/bench_population.py --quick: it runs and prints JSON with its keys (no timing)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_population.py"
ROW_KEYS = {"population", "sample_rate", "rounds", "round_seconds", "median_round_seconds",
            "median_train_exchange_seconds", "train_messages", "discovery_seconds", "startup_seconds",
            "wall_seconds", "peak_rss_mb", "peak_rss_children_mb", "peak_tree_pss_mb"}


@pytest.mark.slow
def test_quick_run_prints_json_with_every_population_and_the_ratio(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # Arrange
    spec = importlib.util.spec_from_file_location("bench_population_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    out = tmp_path / "population.json"
    # Act
    code = module.main(["--quick", "--json", str(out)])
    # Assert: stdout is the JSON that was written, one row per population, each ran its rounds
    printed = json.loads(capsys.readouterr().out)
    assert code == 0 and printed == json.loads(out.read_text())
    assert {"workload", "populations", "by_population", "round_time_ratio", "peak_memory_mb", "goals"} <= set(printed)
    rows = printed["populations"]
    assert [r["population"] for r in rows] == [200, 2000] and all(ROW_KEYS <= set(r) for r in rows)
    assert all(r["rounds"] == 2 and r["train_messages"] > 0 and r["peak_rss_mb"] > 0 for r in rows)
    assert rows[1]["sample_rate"] == pytest.approx(20 / 2000) and printed["round_time_ratio"] > 0
    assert [r["population"] for r in printed["by_population"]] == [200, 2000]
