"""A row run with ``--keep-models`` keeps the very model it evaluated, for the attacks (issue 13)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark.py"


def _script():
    spec = importlib.util.spec_from_file_location("benchmark_script_kept", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kept_model_is_the_evaluated_final_model_with_its_partition_and_privacy(tmp_path: Path) -> None:
    from fedprivacy_bench import task
    from fedprivacy_bench.kept_models import FORMAT, client_partitions, load_kept_model
    from fedprivacy_bench.spec import BenchSpec

    bench = _script()
    spec = BenchSpec(dataset="digits", framework="fedprivacy", mode="central", engine="inprocess",
                     num_clients=20, clients_per_round=10, rounds=2, hidden=8, noise_multiplier=0.5,
                     target_epsilon=30.0, seed=1, label="tiny kept")
    keep = tmp_path / "models"
    row = bench.run_one(spec, log_dir=tmp_path, timeout=600, keep_dir=keep)  # the worker process path
    assert row["status"] == "ok", row["note"]
    stem = spec.key()
    assert row["kept_model"] == str((keep / f"{stem}.json").resolve())
    assert sorted(p.name for p in keep.iterdir()) == sorted(
        f"{stem}{ext}" for ext in (".json", ".npz", ".partition.npz"))

    kept = load_kept_model(keep / f"{stem}.json")
    meta = json.loads((keep / f"{stem}.json").read_text())
    assert kept.meta == meta and meta["format"] == FORMAT and kept.spec == spec
    assert (meta["mode"], meta["seed"], meta["rounds"], meta["noise_multiplier"], meta["sample_rate"]) == (
        "central", 1, 2, 0.5, 0.5)
    assert meta["epsilon"] == row["epsilon"] and meta["p_client_never_sampled"] == pytest.approx(0.25)
    assert meta["model"]["params"] == row["params"] and meta["setup"] == "tiny kept"
    # the final global model: the server's own test accuracy on it, reproduced from the kept weights
    _, acc = task.evaluate(kept.model, task.test_split(spec))
    assert acc == pytest.approx(row["test_accuracy"], abs=1e-9)
    # the exact partition: every training example in one client, as the ClientApps load them
    assert sum(len(p) for p in kept.partitions) == meta["data"]["train_examples"]
    assert np.unique(np.concatenate(kept.partitions)).size == meta["data"]["train_examples"]
    assert all(np.array_equal(a, b) for a, b in zip(kept.partitions, client_partitions(spec), strict=True))
    assert len(task.client_split(spec, 3)) == len(kept.partitions[3])

    # a tampered partition file is refused, not silently attacked with the wrong members
    with np.load(keep / f"{stem}.partition.npz") as z:
        lengths, flat = z["lengths"], z["flat"][::-1].copy()
    np.savez(keep / f"{stem}.partition.npz", lengths=lengths, flat=flat)
    with pytest.raises(ValueError, match="partition"):
        load_kept_model(keep / f"{stem}.json")


def test_keep_models_flag_reaches_the_sweep(monkeypatch, tmp_path: Path) -> None:
    bench = _script()
    seen: dict[str, object] = {}

    def fake_sweep(specs, **kw):
        seen.update(kw)
        return []

    monkeypatch.setattr(bench, "run_sweep", fake_sweep)
    assert bench.main(["--setup", "fedavgm-c300", "--only", "no-such-row", "--no-docs",
                       "--keep-models", str(tmp_path)]) == 0
    assert seen["keep_dir"] == tmp_path
