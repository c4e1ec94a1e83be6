"""Image and ROC metrics against closed forms and hand examples."""

import math

import numpy as np
import pytest

from fedprivacy.attacks.metrics import (
    auc,
    gaussian_window,
    label_accuracy,
    match_images,
    mse,
    psnr,
    roc_curve,
    ssim,
    tpr_at_fpr,
)
from fedprivacy.dp.rng import RandomSource


def test_psnr_and_mse_closed_form() -> None:
    a = np.zeros((8, 8))
    b = np.full((8, 8), 0.1)
    assert mse(a, b) == pytest.approx(0.01)
    assert psnr(a, b) == pytest.approx(20.0)  # 10 log10(1 / 0.01)
    assert psnr(a, a) == 200.0  # exact reconstruction is capped, not inf


def test_ssim_of_constant_images_has_closed_form() -> None:
    # constant images: local variances and covariance are 0, so SSIM = (2ab + C1) / (a^2 + b^2 + C1)
    a, b = 0.3, 0.7
    c1 = 0.01**2
    expected = (2 * a * b + c1) / (a * a + b * b + c1)
    assert ssim(np.full((8, 8), a), np.full((8, 8), b)) == pytest.approx(expected, rel=1e-12)


def test_ssim_identity_symmetry_and_brute_force_reference() -> None:
    rng = RandomSource.seeded(0)
    x = rng.uniform(size=(8, 8))
    y = np.clip(x + rng.normal(std=0.2, size=(8, 8)), 0, 1)
    assert ssim(x, x) == pytest.approx(1.0)
    assert ssim(x, y) == pytest.approx(ssim(y, x))
    # brute-force Wang et al. Eq. 13 at every 5x5 position with the same Gaussian weights
    w = gaussian_window(size=5, sigma=1.0)
    vals = []
    for i in range(4):
        for j in range(4):
            px, py = x[i : i + 5, j : j + 5], y[i : i + 5, j : j + 5]
            mx, my = (w * px).sum(), (w * py).sum()
            vx = (w * (px - mx) ** 2).sum()
            vy = (w * (py - my) ** 2).sum()
            cxy = (w * (px - mx) * (py - my)).sum()
            c1, c2 = 0.01**2, 0.03**2
            vals.append(
                ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
            )
    assert ssim(x, y) == pytest.approx(float(np.mean(vals)), rel=1e-10)
    assert ssim(x, y) < 0.99


def test_match_images_undoes_a_permutation() -> None:
    rng = RandomSource.seeded(1)
    originals = rng.uniform(size=(5, 8, 8))
    order = np.array([3, 0, 4, 1, 2])
    perm = match_images(originals, originals[order])
    np.testing.assert_array_equal(originals[order][perm], originals)


def test_label_accuracy_is_order_free() -> None:
    assert label_accuracy([1, 2, 2], [2, 1, 3]) == pytest.approx(2 / 3)
    assert label_accuracy([4], [4]) == 1.0


def test_auc_of_separating_scores_is_one_and_of_random_scores_about_half() -> None:
    assert auc(np.array([2.0, 3.0, 4.0]), np.array([-1.0, 0.0, 1.0])) == 1.0
    rng = RandomSource.seeded(2)
    a = auc(rng.normal(std=1.0, size=20_000), rng.normal(std=1.0, size=20_000))
    assert abs(a - 0.5) < 0.01  # std of the AUC here is about 0.003


def test_auc_equals_mann_whitney_probability_with_ties() -> None:
    pos = np.array([1.0, 2.0, 2.0, 5.0])
    neg = np.array([0.0, 2.0, 3.0])
    pairs = [(p > n) + 0.5 * (p == n) for p in pos for n in neg]
    assert auc(pos, neg) == pytest.approx(float(np.mean(pairs)))


def test_tpr_at_fpr_hand_example() -> None:
    members = np.array([0.95, 0.9, 0.6, 0.3])
    nonmembers = np.array([0.8, 0.5, 0.4, 0.2, 0.1])
    fpr, tpr = roc_curve(members, nonmembers)
    assert fpr[0] == 0.0 and tpr[-1] == 1.0 and fpr[-1] == 1.0
    # FPR 0: thresholds above 0.8 -> 2 of 4 members
    assert tpr_at_fpr(members, nonmembers, fpr=0.0) == 0.5
    # FPR <= 1/5: threshold 0.6 -> 3 of 4 members with 1 false positive
    assert tpr_at_fpr(members, nonmembers, fpr=0.2) == 0.75
    assert tpr_at_fpr(members, nonmembers, fpr=0.19) == 0.5
    assert math.isclose(auc(members, nonmembers), 16 / 20)  # 5 + 5 + 4 + 2 of 20 pairs
