"""scripts/benchmark.py writes the committed docs only for the full sweep without --out; --keep-models keeps the rows' models."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark.py"


def _script():
    spec = importlib.util.spec_from_file_location("benchmark_script_outputs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_never_writes_the_committed_docs(tmp_path: Path) -> None:
    bench = _script()
    committed = {bench.DOCS_MD, bench.IMG_DIR, bench.RESULTS_DIR}

    quick = bench.output_paths(quick=True, out=None, no_docs=False)
    into = bench.output_paths(quick=True, out=tmp_path, no_docs=False)
    full_elsewhere = bench.output_paths(quick=False, out=tmp_path, no_docs=False)

    assert not committed & set(quick)
    assert quick == (bench.QUICK_OUT / "BENCHMARKS.md", bench.QUICK_OUT / "img", bench.QUICK_OUT)
    assert into == full_elsewhere == (tmp_path / "BENCHMARKS.md", tmp_path / "img", tmp_path)
    assert bench.output_paths(quick=False, out=None, no_docs=False) == (
        bench.DOCS_MD, bench.IMG_DIR, bench.RESULTS_DIR)
    assert bench.output_paths(quick=True, out=tmp_path, no_docs=True) == (None, None, None)


def _fake_calibration(monkeypatch, bench) -> list[tuple[float, float, int]]:
    """sigma = 1 / target epsilon; returns the (epsilon, q, T) the sweep asked for (the calibration
    itself is tested in tests/accounting)."""
    asked: list[tuple[float, float, int]] = []

    def sigma(*, target_epsilon: float, sample_rate: float, rounds: int, rel_tol: float,
              neighbouring: str = "add-remove") -> float:
        asked.append((target_epsilon, sample_rate, rounds))
        # local rows are calibrated as fedprivacy accounts them (replace-one); the others add/remove
        assert neighbouring == ("replace-one" if sample_rate == 1.0 else "add-remove")
        return 1.0 / target_epsilon

    monkeypatch.setattr(bench, "calibrated_sigma", sigma)
    return asked


def test_budget_sweep_is_the_declared_cut_and_never_writes_the_docs(monkeypatch) -> None:
    bench = _script()
    asked = _fake_calibration(monkeypatch, bench)
    specs = bench.fashion_budget_sweep()
    assert len({s.key() for s in specs}) == len(specs) == 8
    assert all(s.dataset == "fashion-mnist" and s.partitioner == "iid" and s.num_clients == 3000
               and s.clients_per_round == 100 and s.rounds == bench.BUDGET_ROUNDS
               and s.eval_every == bench.BUDGET_EVAL_EVERY for s in specs)
    central = sorted((s.target_epsilon, s.seed) for s in specs if s.mode == "central")
    assert central == [(1.0, 0), (2.0, 0), (4.0, 0), (4.0, 1), (8.0, 0)]
    assert sorted(s.seed for s in specs if s.mode == "none") == [0, 1]
    assert [s.mode for s in specs if s.mode not in ("none", "central")] == ["distributed"]
    # sigma calibrated for the rounds that run, at the sampling rate that runs
    assert {a for a in asked} == {(e, 100 / 3000, bench.BUDGET_ROUNDS) for e in (1.0, 2.0, 4.0, 8.0)}
    assert all(s.noise_multiplier == 1.0 / s.target_epsilon for s in specs if s.target_epsilon)
    assert {s.rounds for s in bench.fashion_budget_sweep(rounds=100)} == {100}
    out = bench.output_paths(quick=True, out=bench.BUDGET_OUT, no_docs=False)  # what --budget uses
    assert not {bench.DOCS_MD, bench.IMG_DIR, bench.RESULTS_DIR} & set(out)


def _bench_row(mode: str, acc: float, **kw) -> dict:
    from tests.bench.test_bench_curves import _row

    return dict(_row(mode, 0, acc, **kw), engine="inprocess", seconds_per_round=4.0, params=28938,
                hidden=32, peak_memory_mb=900.0, startup_seconds=20.0)


def _saved(sweep: str, rows: list, **extra) -> dict:
    return {"sweep": sweep, "command": f"python scripts/benchmark.py --{sweep}", "runtime_seconds": 600.0,
            "finished": "2026-12-01 13:00 UTC", "notes": [f"{sweep} note"], "rows": rows, **extra}


def test_several_saved_sweeps_render_on_one_page_with_the_membership_figure(tmp_path: Path) -> None:
    import json

    from tests.bench.test_bench_curves import _mia

    bench = _script()
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    m = tmp_path / "m.json"
    a.write_text(json.dumps(_saved("budget", [_bench_row("none", 0.8, eps=None, target=None),
                                              _bench_row("central", 0.77, eps=4.0, target=4.0)],
                                   scope=["ran: 2 rows", "not run: Dirichlet"], load_average="9.1 8.0 7.5")))
    b.write_text(json.dumps(_saved("full", [])))
    c = tmp_path / "partial.json"  # a stopped sweep's finished rows
    c.write_text(json.dumps({"command": "python scripts/benchmark.py --budget --rounds 100", "budget": True,
                             "rows": [dict(_bench_row("none", 0.83, eps=None, target=None), rounds=100,
                                           wall_seconds=900.0)]}))
    m.write_text(json.dumps({"argv": ["--models", "4"], "settings": [
        _mia(None, auc=0.95, tpr=0.4, acc=0.8), _mia(8.0, auc=0.52, tpr=0.01, acc=0.1)]}))
    m2 = tmp_path / "m2.json"
    m2.write_text(json.dumps({"argv": ["--epsilons", "2"], "settings": [_mia(2.0, auc=0.5, tpr=0.01, acc=0.1)]}))
    out = tmp_path / "out"

    rc = bench.main(["--from-json", str(a), "--from-json", str(b), "--from-json", str(c), "--membership-json", str(m), "--membership-json", str(m2),
                     "--out", str(out)])

    assert rc == 0
    text = (out / "BENCHMARKS.md").read_text()
    assert "`python scripts/benchmark.py --budget` — 2 configurations" in text and "load average at the end 9.1" in text
    assert "`python scripts/benchmark.py --full` — 0 configurations" in text
    assert "## Goals" in text and "- not run: Dirichlet" in text
    assert "`python scripts/benchmark.py --budget --rounds 100` — 1 configurations, 15.0 minutes" in text
    assert text.count(bench.BUDGET_NOTES[0]) == 1 and "0.830 (mean of seeds [0]" in text
    assert "python scripts/user_membership.py --models 4" in text and "budget note" not in text  # script's
    assert "python scripts/user_membership.py --epsilons 2" in text and "| 2 (1e-05) |" in text
    assert (out / "img" / "bench_membership_vs_epsilon.png").is_file()
    assert "--from-json" in text.split("```bash")[1].split("```")[0]  # the render command itself


def test_named_setup_pairs_non_dp_and_calibrated_private_rows_and_never_writes_the_docs(monkeypatch) -> None:
    bench = _script()
    asked = _fake_calibration(monkeypatch, bench)
    setup = bench.FASHION_SETUPS_NAMED["fedavgm"]
    specs = bench.setup_sweep("fedavgm", seeds=(0, 1), epsilons=(4.0, 1.0),
                              modes=("none", "central", "local"))

    assert [(s.mode, s.seed, s.target_epsilon) for s in specs[:3]] == [
        ("none", 0, None), ("central", 0, 4.0), ("central", 0, 1.0)]  # the first pair first
    assert len({s.key() + s.mode for s in specs}) == len(specs) == 10
    assert all(s.server_optimizer == "fedavgm" and s.server_momentum == 0.9 and s.rounds == setup.rounds
               and s.label == "fashion iid fedavgm" and s.num_clients == 3000 for s in specs)
    # central: Poisson q of the setup; local: no amplification (q = 1); both for the T that runs
    assert set(asked) == {(e, q, setup.rounds) for e in (4.0, 1.0) for q in (100 / 3000, 1.0)}
    assert all(s.noise_multiplier == 1.0 / s.target_epsilon for s in specs if s.mode != "none")
    assert {s.rounds for s in bench.setup_sweep("fedavgm", rounds=20)} == {20}
    with pytest.raises(ValueError, match="setup must be one of"):
        bench.setup_sweep("nope")
    notes = bench.setup_notes("fedavgm", specs)
    assert "central ε=4, T=150 → σ=0.2500" in notes[1] and "FedAvgM" in notes[0]
    rc = bench.main(["--setup", "fedavgm", "--only", "no-such-row", "--no-docs"])
    assert rc == 0  # nothing ran, nothing written
    assert bench.main(["--setup", "fedavgm", "--seeds", "x"]) == 2
    # a setup on other data keeps its own label and says where its data comes from (the pairs)
    digits = bench.setup_sweep("digits-100k", seeds=(0, 1), epsilons=(3.0,), modes=("central", "distributed"))
    assert {(s.dataset, s.label, s.rounds, s.clients_per_round) for s in digits} == {
        ("digits", "digits 100k setup", 15, 100)}
    assert len({s.noise_multiplier for s in digits}) == 1  # distributed runs central's σ
    assert "bundled digits" in bench.setup_notes("digits-100k", digits)[0]


def test_dirichlet_setup_gives_600_clients_at_least_20_skewed_examples_each_at_100_per_round(monkeypatch) -> None:
    from fedprivacy.ml import load_partition
    from fedprivacy.ml.partition import partition_sizes
    from fedprivacy_bench import task

    bench = _script()
    asked = _fake_calibration(monkeypatch, bench)
    specs = bench.setup_sweep("fedavgm-dir600", epsilons=(4.0,), modes=("none", "central"))
    assert {(s.partitioner, s.dirichlet_alpha, s.min_partition_size, s.num_clients, s.clients_per_round,
             s.rounds, s.server_optimizer, s.label) for s in specs} == {
        ("dirichlet", 0.5, 20, 600, 100, 120, "fedavgm", "fashion dirichlet0.5 fedavgm-dir600")}
    assert asked == [(4.0, 100 / 600, 120)]  # central's σ for the setup's own q and T
    iid = bench.setup_sweep("fedavgm-c300", rounds=120, epsilons=(4.0,), modes=("none", "central"))
    assert {s.key() for s in specs}.isdisjoint(s.key() for s in iid)  # kept models never overwrite
    assert "dirichlet0.5-n600" in specs[0].key() and "iid" not in specs[0].label  # not an IID goal row
    with pytest.raises(ValueError, match="holdout"):
        bench.setup_sweep("fedavgm-dir600", holdout=True)
    # the real partition (flwr-datasets' DirichletPartitioner through fedprivacy): every client >= 20,
    # and label-skewed (the largest class holds ~37% of a client's images; IID 100 per client: ~15%)
    data = task.data_spec_for(specs[0])
    sizes = np.asarray(partition_sizes(data, 600))
    assert sizes.sum() == 60_000 and sizes.min() >= 20
    share = [np.bincount(load_partition(data, i, 600).y, minlength=10).max() / n for i, n in enumerate(sizes)]
    assert np.mean(share) > 0.3


def test_local_rows_are_calibrated_under_replace_one_as_fedprivacy_accounts_them() -> None:
    from fedprivacy.accounting.accountant import epsilon_for

    bench = _script()
    add_remove = bench.calibrated_sigma(target_epsilon=4.0, sample_rate=1.0, rounds=10, rel_tol=1e-4)
    local = bench.calibrated_sigma(target_epsilon=4.0, sample_rate=1.0, rounds=10, rel_tol=1e-4,
                                   neighbouring="replace-one")
    assert abs(local / add_remove - 2.0) < 1e-2  # no sampling: replace-one doubles the sensitivity
    reported = epsilon_for(noise_multiplier=local, sample_rate=1.0, steps=10, delta=bench.DELTA,
                           backend="pld", neighbouring="replace-one")
    assert 3.9 < reported <= 4.0 + 1e-6  # what a local run's accountant reports for that σ


# --keep-models: a row keeps the very model it evaluated, for the attacks
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



def test_holdout_rows_train_on_48k_images_at_the_same_q_and_sigma_and_keep_the_rest_out(monkeypatch) -> None:
    from fedprivacy.ml import load_partition
    from fedprivacy.ml.data import load_dataset
    from fedprivacy_bench import heldout, task

    bench = _script()
    _fake_calibration(monkeypatch, bench)
    full = bench.setup_sweep("fedavgm-c300", epsilons=(4.0,), modes=("central",))[0]
    held = bench.setup_sweep("fedavgm-c300", epsilons=(4.0,), modes=("central",), holdout=True)[0]
    assert (held.dataset, held.num_clients, held.clients_per_round) == (heldout.NAME, 2400, 240)
    assert held.sample_rate == full.sample_rate and held.noise_multiplier == full.noise_multiplier
    assert held.key() == full.key().replace("fashion-mnist-", "fashion-mnist-holdout-", 1)  # other files
    assert held.label == "fashion iid fedavgm-c300 holdout"
    from fedprivacy_bench.kept_models import members_text

    # the sidecar names the held-out non-members
    assert "held_out_split" in members_text(held) and "held_out_split" not in members_text(full)
    with pytest.raises(ValueError, match="holdout"):
        bench.setup_sweep("digits-100k", holdout=True)
    # the members are the official training images 0..47,999, 20 per client; the rest is held out
    train, test = load_dataset(heldout.NAME, seed=0, test_fraction=0.2, num_clients=2400)
    full_train, full_test = load_dataset("fashion-mnist", seed=0, test_fraction=0.2, num_clients=3000)
    assert len(train) == heldout.TRAINED and np.array_equal(train.x, full_train.x[:heldout.TRAINED])
    assert np.array_equal(test.y, full_test.y)
    out = heldout.held_out_split()
    assert len(out) == 12_000 and np.array_equal(out.x, full_train.x[heldout.TRAINED:])
    assert len(load_partition(task.data_spec_for(held), 2399, 2400)) == 20


def test_flower_rows_of_a_setup_run_flowers_apps_at_central_sigma_on_the_inprocess_engine(monkeypatch) -> None:
    """--flower: Flower rows beside fedprivacy's in one invocation, same data, model, seed and σ (the σ of
    central ε for the setup's q and T); refused on a setup whose server step Flower's apps do not run."""
    bench = _script()
    asked = _fake_calibration(monkeypatch, bench)
    specs = bench.setup_sweep("fedavg-c300", rounds=120, modes=("central",), epsilons=(4.0,),
                              flower=("central", "none", "central-server"))
    assert [(s.framework, s.engine, s.mode, s.option("flower_clipping")) for s in specs] == [
        ("fedprivacy", "inprocess", "central", None), ("flower", "inprocess", "central", None),
        ("flower", "inprocess", "none", None), ("flower", "inprocess", "central", "server")]
    central, flower, none, server = specs
    assert flower.noise_multiplier == server.noise_multiplier == central.noise_multiplier == 0.25
    assert none.noise_multiplier == 0.0 and set(asked) == {(4.0, 0.1, 120)}
    assert {(s.num_clients, s.clients_per_round, s.server_optimizer, s.server_learning_rate, s.seed,
             s.label) for s in specs} == {(3000, 300, "fedavg", 1.0, 0, "fashion iid fedavg-c300")}
    assert len({s.key() for s in specs}) == 4  # distinct log/model names
    assert bench.FLOWER_NOTE in bench.setup_notes("fedavg-c300", specs)
    with pytest.raises(ValueError, match="Flower's FedAvg"):
        bench.setup_sweep("fedavgm-c300", flower=("central",))
    with pytest.raises(ValueError, match="flower rows must be among"):
        bench.setup_sweep("fedavg-c300", flower=("local",))
    assert bench.main(["--setup", "fedavgm-c300", "--flower", "central"]) == 2
