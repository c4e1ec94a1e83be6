"""scripts/membership_inference.py --kept: the curve's saved models attacked end to end.

A real kept model (fedprivacy_bench.kept_models.keep_model: the benchmark's own writer, a Fashion-MNIST
spec with its real 3000-client partition, the weights of a small model trained here in seconds) is
attacked by the script; its figures, cache and generated docs section are checked against a direct
evaluation.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "membership_inference.py"


def _script():
    spec = importlib.util.spec_from_file_location("membership_inference_kept", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _keep(folder: Path, dataset: str, clients: int) -> None:
    import torch

    from fedprivacy.ml import get_weights
    from fedprivacy.ml.data import Split
    from fedprivacy.ml.train import train_local
    from fedprivacy_bench import task
    from fedprivacy_bench.kept_models import keep_model
    from fedprivacy_bench.spec import BenchSpec

    torch.set_num_threads(1)
    spec = BenchSpec(dataset=dataset, framework="fedprivacy", mode="none", engine="inprocess",
                     num_clients=clients, clients_per_round=clients // 10, rounds=2, model="mlp", hidden=16, seed=0,
                     label="kept for the attack test")
    model = task.model_for(spec)
    parts = task.client_split(spec, 0), task.client_split(spec, 1)
    x = np.concatenate([p.x for p in parts])
    y = np.concatenate([p.y for p in parts])
    train_local(model, Split(x=x, y=y), epochs=30, lr=0.1, batch_size=8, seed=0)  # clients 0, 1 memorised
    _, acc = task.evaluate(model, task.test_split(spec))
    record = {"mode": "none", "seed": 0, "rounds": 2, "target_epsilon": None, "epsilon": None,
              "noise_multiplier": 0.0, "clip_norm": 0.0, "delta": 1e-5, "sample_rate": 0.1,
              "num_clients": clients, "clients_per_round": clients // 10, "test_accuracy": acc}
    keep_model(spec, get_weights(model), record, folder)


@pytest.fixture(scope="module")
def kept_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("kept")
    _keep(folder, "fashion-mnist", 3000)
    return folder


@pytest.mark.slow
def test_kept_models_are_attacked_cached_and_written_into_the_docs(kept_dir: Path, tmp_path: Path,
                                                                   capsys) -> None:
    mi = _script()
    mi.REFERENCE_RECIPE = dict(count=1, train_size=500, epochs=1, learning_rate=0.1, batch_size=32, seed=0)
    docs = tmp_path / "ATTACKS.md"
    docs.write_text(f"# head\n\n{mi.DOCS_BEGIN}\nold\n{mi.DOCS_END}\n\ntail\n")
    cache = tmp_path / "cache"
    argv = ["--kept", str(kept_dir), "--cache", str(cache), "--member-clients", "40", "--bootstrap", "20",
            "--permutations", "19", "--json", str(tmp_path / "mia.json"), "--png", str(tmp_path / "mia.png"),
            "--docs", str(docs)]
    assert mi.main(argv) == 0
    out = json.loads((tmp_path / "mia.json").read_text())
    (entry,) = out["models"]
    assert entry["setting"] == "no DP" and entry["members"] == 40 * 20 and entry["nonmembers"] == 10_000
    assert entry["member_clients"] == 40 and entry["nonmember_clients"] == 500
    # the script's test accuracy is the row's own (the same final model, the same 10k test images)
    assert entry["test_accuracy"] == pytest.approx(entry["row_test_accuracy"], abs=1e-9)
    rows = {(r["attack"], r["level"]): r for r in entry["rows"]}
    assert set(rows) == {(a, lv) for a in ("loss", "calibrated-loss", "calibrated-phi", "reference-only")
                         for lv in ("example", "user")}
    assert rows["loss", "user"]["fpr_resolution"] == pytest.approx(1 / 500)
    assert not rows["loss", "user"]["tpr_at_fpr_0.001_resolved"]  # 0.1% of 500 pseudo-clients: none
    assert rows["loss", "example"]["tpr_at_fpr_0.001_resolved"]  # 10 of 10,000 test images
    assert entry["references"]["count_per_half"] == 1 and len(entry["references"]["test_accuracy"]) == 2
    text = docs.read_text()
    assert text.startswith("# head\n\n" + mi.DOCS_BEGIN) and text.endswith(mi.DOCS_END + "\n\ntail\n")
    assert "old" not in text and "| no DP | 0 |" in text and "not resolved" in text and "| test 10,000 |" in text
    assert "python scripts/membership_inference.py --kept" in text
    assert (tmp_path / "mia.png").stat().st_size > 10_000
    # a rerun reads the references and the model's figures from the cache, and gives the same figures
    capsys.readouterr()
    assert mi.main(argv) == 0
    err = capsys.readouterr().err
    assert "from " + str(cache / f"{entry['stem']}.mia.json") in err
    again = json.loads((tmp_path / "mia.json").read_text())
    assert again["models"][0]["rows"] == entry["rows"]


def test_kept_refuses_an_empty_folder_and_a_docs_file_without_the_section(tmp_path: Path, kept_dir: Path,
                                                                          capsys) -> None:
    mi = _script()
    assert mi.main(["--kept", str(tmp_path)]) == 2
    assert "no fedprivacy-bench/model-v1 sidecar" in capsys.readouterr().err
    docs = tmp_path / "plain.md"
    docs.write_text("no section here\n")
    assert mi.main(["--kept", str(kept_dir), "--no-references", "--docs", str(docs)]) == 2
    assert "has no generated section" in capsys.readouterr().err
    assert docs.read_text() == "no section here\n"


@pytest.mark.slow
def test_a_federation_that_held_clients_out_is_attacked_with_those_images(tmp_path: Path) -> None:
    """fashion-mnist-holdout (data3): 2400 clients on the official training images 0..47,999; the script
    takes the held-out images 48,000..59,999 as non-members (no train/test split floor)."""
    mi = _script()
    folder = tmp_path / "kept"
    _keep(folder, "fashion-mnist-holdout", 2400)
    out = tmp_path / "mia.json"
    assert mi.main(["--kept", str(folder), "--no-references", "--member-clients", "40", "--bootstrap", "10",
                    "--permutations", "9", "--json", str(out), "--png", str(tmp_path / "mia.png")]) == 0
    (entry,) = json.loads(out.read_text())["models"]
    assert entry["nonmembers_from"] == "train" and entry["nonmembers"] == 12_000
    assert entry["nonmember_clients"] == 600 and entry["members"] == 800
    assert entry["test_accuracy"] == pytest.approx(entry["row_test_accuracy"], abs=1e-12)
    rows = {(r["attack"], r["level"]): r for r in entry["rows"]}
    assert rows["loss", "user"]["fpr_resolution"] == pytest.approx(1 / 600)
    assert "held-out" in mi.kept_markdown(json.loads(out.read_text())["models"], "cmd")


def test_a_figure_is_listed_above_the_floor_only_if_it_beats_chance_itself() -> None:
    # the held-out ε=4 rows listed TPR@1% (p 0.065, 0.060) as above the floor because another figure
    # of the row beat chance
    mi = _script()
    floor = {"auc_ci95": [0.49, 0.51], "tpr_at_fpr_0.01_ci95": [0.008, 0.011], "tpr_at_fpr_0.001_ci95": [0.0, 0.0012]}
    row = {"attack": "calibrated-loss", "at_chance_5pct": False, "tpr_at_fpr_0.001_resolved": True,
           "auc": 0.506, "auc_p_value": 0.2, "tpr_at_fpr_0.01": 0.0117, "tpr_at_fpr_0.01_p_value": 0.065,
           "tpr_at_fpr_0.001": 0.0018, "tpr_at_fpr_0.001_p_value": 0.01}
    assert mi._verdict(row, floor) == "above the floor (TPR@0.001)"
    assert mi._verdict({**row, "tpr_at_fpr_0.001_p_value": 0.06}, floor) == "above chance, within the floor"
    assert mi._verdict({**row, "tpr_at_fpr_0.01_p_value": 0.01}, floor) == "above the floor (TPR@0.01, TPR@0.001)"
