"""Gradient leakage on 28x28 Fashion-MNIST images, through the shipped defences."""

from __future__ import annotations

import numpy as np
import pytest

from fedprivacy.attacks.gradient_leakage import (
    Defence,
    baseline_psnr,
    build_victim,
    evaluate_leakage,
)
from fedprivacy.dp.rng import RandomSource
from fedprivacy.ml.datasets.fashion_mnist import DEBIAN_DIR, find_idx_dir


@pytest.fixture(scope="module")
def fashion_pool() -> tuple[np.ndarray, np.ndarray]:
    if find_idx_dir(DEBIAN_DIR) is None:
        pytest.skip("Debian's dataset-fashion-mnist is not installed (scripts/setup.sh installs it)")
    from fedprivacy.ml.data import load_dataset

    _, test = load_dataset("fashion-mnist", seed=0, test_fraction=0.2)
    return np.asarray(test.x[:64, 0], dtype=np.float64), np.asarray(test.y[:64])


def test_victims_take_28x28_images() -> None:
    assert build_victim("lenet", seed=0, side=28).fc.in_features == 12 * 7 * 7
    assert build_victim("mlp", seed=0, side=28).fc1.in_features == 784


def test_analytic_attack_recovers_a_fashion_image_and_noise_defeats_it(fashion_pool) -> None:
    images, labels = fashion_pool
    defences = [Defence(name="none"), Defence(name="clip", clip_norm=1.0),
                Defence(name="clip+noise", clip_norm=1.0, noise_multiplier=1.0),
                Defence(name="ddg-share", clip_norm=1.0, noise_multiplier=1.0, share_of=10)]

    rows, examples = evaluate_leakage(images, labels, targets=[0, 1, 2], attacks=["analytic"],
                                      defences=defences, rng=RandomSource.seeded(0), seed=0)

    by = {r["defence"]: r for r in rows}
    base = baseline_psnr(images, [0, 1, 2])
    assert examples[("analytic", "none")][0].shape == (28, 28)
    assert by["none"]["psnr"] > 60 and by["clip"]["psnr"] > 60  # exact up to float error
    assert by["none"]["label_accuracy"] == 1.0
    assert by["clip+noise"]["psnr"] < base + 3  # no better than guessing the mean image
    # one client's share of distributed noise (sigma/sqrt(10)) through the shipped ddgauss encoder
    assert by["ddg-share"]["psnr"] < by["clip"]["psnr"] - 30


def _script_main():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "gradient_leakage.py"
    spec = importlib.util.spec_from_file_location("_script_gradient_leakage", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_script_fashion_ladder_on_one_image(fashion_pool, tmp_path) -> None:
    import json

    out, png = tmp_path / "gl.json", tmp_path / "gl.png"

    rc = _script_main()(["--dataset", "fashion-mnist", "--quick", "--attacks", "analytic,idlg",
                         "--json", str(out), "--png", str(png)])

    assert rc == 0 and png.stat().st_size > 0
    payload = json.loads(out.read_text())
    assert (payload["dataset"], payload["image_side"], payload["pool_size"]) == ("fashion-mnist", 28, 10000)
    by = {(r["attack"], r["defence"]): r for r in payload["rows"]}
    shares = ["distributed-dp-share(n=10,sigma=0.1)", "distributed-dp-share(n=10,sigma=1)"]
    assert {d for _, d in by} == {"none", "clip", *(f"clip+noise(sigma={s})" for s in
                                                    ("0.001", "0.01", "0.1", "1")), *shares}
    base = payload["baseline_psnr"]
    for defence in ("none", "clip"):  # a first dense layer with bias gives the image exactly
        assert by[("analytic", defence)]["psnr"] > 60 and by[("analytic", defence)]["label_accuracy"] == 1.0
    assert by[("idlg", "none")]["label_accuracy"] == 1.0  # the sign of the last bias' gradient
    for share in shares:  # one client's share through the shipped ddgauss encoder: sigma / sqrt(10)
        row = by[("analytic", share)]
        assert row["noise_multiplier"] == pytest.approx(float(share.split("sigma=")[1][:-1]) / 10**0.5)
        assert row["psnr"] < by[("analytic", "clip")]["psnr"] - 30 and row["psnr"] < base + 3


@pytest.mark.parametrize("argv, parameter", [
    (["--dataset", "mnist-typo"], "--dataset"),
    (["--images", "0"], "--images"),
    (["--attacks", "dlg,nope"], "--attacks"),
    (["--threads", "-1"], "--threads"),
])
def test_script_bad_arguments_exit_2_with_one_line(argv, parameter, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        _script_main()(argv)

    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and parameter in err


def test_script_missing_data_dir_exits_2_with_one_line(tmp_path, capsys) -> None:
    rc = _script_main()(["--dataset", "fashion-mnist", "--data-dir", str(tmp_path / "empty")])

    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "data-dir" in err and "apt-get install" in err


def test_docs_fashion_table_is_the_saved_json_rendered(capsys) -> None:
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    saved = json.loads((root / "docs" / "gradient_leakage_fashion.json").read_text())

    rc = _script_main()(["--render", str(root / "docs" / "gradient_leakage_fashion.json")])

    table = capsys.readouterr().out.strip()
    assert rc == 0 and table in (root / "docs" / "ATTACKS.md").read_text()
    assert saved["dataset"] == "fashion-mnist" and not saved["quick"] and len(saved["targets"]) == 8
    by = {(r["attack"], r["defence"]): r for r in saved["rows"]}
    # the committed run's converged attacks recover the noise-free image and lose it on one share
    assert by[("idlg", "none")]["psnr"] > 60 and by[("analytic", "clip")]["psnr"] > 150
    for share in ("distributed-dp-share(n=10,sigma=0.1)", "distributed-dp-share(n=10,sigma=1)"):
        assert all(by[(a, share)]["psnr"] < saved["baseline_psnr"] for a in ("dlg", "idlg", "analytic"))


def test_render_rejects_a_file_that_is_not_a_saved_run(tmp_path, capsys) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{}")

    rc = _script_main()(["--render", str(bad)])

    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--render" in err
