"""The engine's batched train path against its per-client path: real apps, real runs, both ways."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fedprivacy.fl.client_batch as client_batch
from fedprivacy.fl.checkpoint import load_checkpoint
from server.engine import FaultPlan, FaultRule, run_inprocess

_BASE = {"num-server-rounds": 2, "seed": 11, "local-epochs": 1, "dataset": "digits", "client-timeout": 30.0,
         "secagg": False, "accountant": "rdp", "model": "mlp"}


def _run(tmp: Path, name: str, faults: FaultPlan | None = None, **keys: Any) -> tuple[dict, list[np.ndarray]]:
    cfg = {**_BASE, **keys, "output-dir": str(tmp), "run-name": name}
    run_inprocess(run_config=cfg, num_supernodes=6, app_dir=Path(__file__).resolve().parents[2],
                  node_id_seed=3, faults=faults)
    results = json.loads((tmp / name / "results.json").read_text(encoding="utf-8"))
    ckpt = load_checkpoint(tmp / name / "checkpoint")
    assert ckpt is not None
    return results, [np.asarray(w) for w in ckpt.weights]


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = client_batch.train_clients

    def spy(*args: Any, **kw: Any) -> Any:
        calls.append(len(kw["partition_ids"]))
        return real(*args, **kw)

    monkeypatch.setattr(client_batch, "train_clients", spy)
    return calls


@pytest.mark.parametrize("privacy", [
    {"privacy": "central", "sample-rate": 0.5, "noise-multiplier": 1.1},
    {"privacy": "local", "noise-multiplier": 0.8, "neighbouring": "replace-one"},
    {"privacy": "none"},
])
def test_a_batched_run_publishes_what_the_per_client_run_publishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, privacy: dict[str, Any]) -> None:
    calls = _spy(monkeypatch)
    per_client, w_per_client = _run(tmp_path, "off", **privacy, **{"batched-training": "off"})
    assert calls == []
    batched, w_batched = _run(tmp_path, "auto", **privacy, **{"batched-training": "auto"})
    assert calls and all(c > 1 for c in calls)  # the cohorts went through the batch entry
    assert batched["privacy"] == per_client["privacy"]  # the same ε, claim and randomness label
    for got, want in zip(batched["rounds"], per_client["rounds"], strict=True):
        for key, value in want.items():
            if key == "seconds":
                continue
            if isinstance(value, float):
                assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
            else:
                assert got[key] == value, key
    for a, b in zip(w_batched, w_per_client, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_client_that_fails_in_a_batched_round_fails_alone(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy(monkeypatch)
    faults = FaultPlan(rules=(FaultRule(action="raise", message_type="train", partition_ids=(2,)),))
    keys = {"privacy": "none", "max-failed-fraction": 0.5}
    batched, w_batched = _run(tmp_path, "auto", faults, **keys, **{"batched-training": "auto"})
    per_client, w_per_client = _run(tmp_path, "off", faults, **keys, **{"batched-training": "off"})
    assert calls == [5, 5]  # the other five trained together, each round
    assert [r.get("failed") for r in batched["rounds"]] == [r.get("failed") for r in per_client["rounds"]]
    for a, b in zip(w_batched, w_per_client, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
