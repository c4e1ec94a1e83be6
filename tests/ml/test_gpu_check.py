"""scripts/gpu_check.py's logic, on the CPU: its JSON, its tolerance verdict and its refusals."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import fedprivacy.ml.batched as batched

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("script_gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_cpu_dry_run_agrees_with_itself_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    code = _script().main(["--device", "cpu", "--clients", "3", "--repeats", "1", "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == 0
    assert [r["model"] for r in report["rows"]] == ["mlp", "convnet"]
    for row in report["rows"]:
        assert row["within_tolerance"] is True and row["max_abs_diff"] == 0.0
        assert row["batched_device_seconds"] > 0 and row["per_client_cpu_seconds"] > 0


def test_a_device_that_trains_differently_fails_the_check(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    real = batched.train_batched

    def off_by_a_bit(*args: Any, device: Any = "cpu", **kw: Any) -> Any:
        out = real(*args, device=device, **kw)
        if isinstance(device, torch.device):  # the "device" side of the comparison
            for r in out:
                r.weights[0] += 1e-2
        return out

    monkeypatch.setattr(batched, "train_batched", off_by_a_bit)
    code = _script().main(["--device", "cpu", "--clients", "2", "--repeats", "1", "--models", "mlp",
                           "--no-loop"])
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert code == 1 and row["within_tolerance"] is False
    assert row["max_abs_diff"] == pytest.approx(1e-2, rel=1e-3)


def test_bad_arguments_exit_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert _script().main(["--device", "gpu"]) == 2
    assert capsys.readouterr().err.strip() == "gpu_check: device must be one of auto, cpu, cuda, mps; got 'gpu'"
    if not torch.cuda.is_available():
        assert _script().main(["--device", "cuda"]) == 2
