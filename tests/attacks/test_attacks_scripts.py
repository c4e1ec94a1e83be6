"""The attack scripts run end to end in their --quick mode and write the documented JSON."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _main(name: str):
    spec = importlib.util.spec_from_file_location(f"_script_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.slow
def test_audit_script_quick(tmp_path: Path) -> None:
    out = tmp_path / "audit.json"
    assert _main("audit")(["--quick", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {"target", "epsilon_claimed", "epsilon_lower", "confidence", "trials"} <= set(rows[0])
    assert all(r["epsilon_lower"] <= r["epsilon_claimed"] for r in rows)


@pytest.mark.slow
def test_audit_script_flags_a_broken_claim(tmp_path: Path) -> None:
    assert _main("audit")(["--quick", "--broken-demo", "--json", str(tmp_path / "a.json")]) == 1


@pytest.mark.slow
def test_gradient_leakage_script_quick(tmp_path: Path) -> None:
    out, png = tmp_path / "gl.json", tmp_path / "gl.png"
    assert _main("gradient_leakage")(["--quick", "--json", str(out), "--png", str(png)]) == 0
    payload = json.loads(out.read_text())
    assert payload["baseline_psnr"] > 0 and png.stat().st_size > 0
    none = [r for r in payload["rows"] if r["defence"] == "none"]
    assert all(r["psnr"] > 30 for r in none)
    assert {
        "attack",
        "defence",
        "noise_multiplier",
        "psnr",
        "ssim",
        "mse",
        "label_accuracy",
    } <= set(none[0])


@pytest.mark.slow
def test_membership_script_quick(tmp_path: Path) -> None:
    out, png = tmp_path / "mia.json", tmp_path / "roc.png"
    assert _main("membership_inference")(["--quick", "--json", str(out), "--png", str(png)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {"model", "epsilon", "attack", "auc", "tpr_at_fpr_1pct", "tpr_at_fpr_01pct"} <= set(
        rows[0]
    )
