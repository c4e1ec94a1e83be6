"""Smoke test of scripts/benchmark.py with tiny settings (no Ray rows): slow, end to end."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark.py"


@pytest.mark.slow
def test_quick_sweep_subset_writes_rows(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("benchmark_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "bench.json"

    code = module.main(["--quick", "--rounds", "2", "--no-docs", "--json", str(out),
                        "--only", "torch-loop,digits-fedprivacy-inprocess-none"])

    assert code == 0
    payload = json.loads(out.read_text())
    rows = {r["framework"]: r for r in payload["rows"]}
    assert set(rows) == {"torch", "fedprivacy"}
    for row in rows.values():
        assert row["status"] == "ok", row["note"]
        assert row["rounds"] == 2
        assert 0.0 <= row["test_accuracy"] <= 1.0
        assert row["seconds_per_round"] > 0 and row["peak_memory_mb"] > 0
        assert row["params"] == 9610  # the ~10k-parameter MLP on digits
    assert rows["fedprivacy"]["ratio_vs_torch_loop"] is not None
    assert len(payload["goals"]) == 5
