"""Gradient leakage on 28x28 Fashion-MNIST images (issue 13), through the shipped defences."""

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
