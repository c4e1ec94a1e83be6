"""Gradient-leakage attacks reconstruct undefended updates; defences behave as documented."""

import numpy as np
import pytest
import torch

from fedprivacy.attacks.gradient_leakage import (
    Defence,
    analytic_attack,
    apply_defence,
    build_victim,
    compute_update,
    dlg_attack,
    idlg_attack,
    infer_labels,
    inverting_gradients_attack,
)
from fedprivacy.attacks.metrics import psnr
from fedprivacy.dp.rng import RandomSource

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.data / 16.0, d.target


def test_analytic_inversion_is_exact_without_defence(digits) -> None:
    x, y = digits
    model = build_victim("mlp", seed=0)
    for i in (0, 7, 42):
        upd = compute_update(model, x[i : i + 1], y[i : i + 1])
        rec = analytic_attack(model, upd, batch_size=1)
        np.testing.assert_allclose(rec.images[0].ravel(), x[i], atol=1e-5)
        assert rec.labels[0] == y[i]


def test_idlg_reads_labels_from_the_last_layer_sign(digits) -> None:
    x, y = digits
    model = build_victim("lenet", seed=1)
    for i in range(10):
        upd = compute_update(model, x[i : i + 1], y[i : i + 1])
        assert infer_labels(model, upd, batch_size=1)[0] == y[i]


def test_dlg_reconstructs_one_digit(digits) -> None:
    x, y = digits
    model = build_victim("lenet", seed=0)
    upd = compute_update(model, x[3:4], y[3:4])
    rec = dlg_attack(model, upd, batch_size=1, iterations=100, seed=0)
    assert psnr(x[3].reshape(8, 8), rec.images[0]) > 30.0
    assert rec.labels[0] == y[3]


def test_idlg_reconstructs_one_digit(digits) -> None:
    x, y = digits
    model = build_victim("lenet", seed=0)
    upd = compute_update(model, x[5:6], y[5:6])
    rec = idlg_attack(model, upd, batch_size=1, iterations=100, seed=0)
    assert psnr(x[5].reshape(8, 8), rec.images[0]) > 30.0


def test_inverting_gradients_reconstructs_one_digit(digits) -> None:
    x, y = digits
    model = build_victim("mlp", seed=0)
    upd = compute_update(model, x[9:10], y[9:10])
    rec = inverting_gradients_attack(model, upd, batch_size=1, iterations=300, restarts=1, seed=0)
    assert psnr(x[9].reshape(8, 8), rec.images[0]) > 30.0
    assert rec.labels[0] == y[9]


def test_fedsgd_update_is_the_gradient(digits) -> None:
    x, y = digits
    model = build_victim("mlp", seed=0)
    upd = compute_update(model, x[:2], y[:2])
    model.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(torch.as_tensor(x[:2])), torch.as_tensor(y[:2]))
    loss.backward()
    for u, p in zip(upd, model.parameters(), strict=True):
        np.testing.assert_allclose(u, p.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_clipping_bounds_the_norm_and_noise_destroys_the_analytic_attack(digits) -> None:
    x, y = digits
    model = build_victim("mlp", seed=0)
    upd = compute_update(model, x[0:1], y[0:1])
    clipped = apply_defence(upd, clip_norm=0.5, noise_std=0.0, rng=None)
    assert np.sqrt(sum(float(np.sum(a**2)) for a in clipped)) <= 0.5 + 1e-12
    # clipping rescales g_W and g_b together: the ratio, hence the analytic attack, is unaffected
    rec = analytic_attack(model, clipped, batch_size=1)
    np.testing.assert_allclose(rec.images[0].ravel(), x[0], atol=1e-5)
    noisy = apply_defence(upd, clip_norm=1.0, noise_std=1.0, rng=RandomSource.seeded(0))
    rec = analytic_attack(model, noisy, batch_size=1)
    assert psnr(x[0].reshape(8, 8), rec.images[0]) < 15.0


def test_defence_rejects_noise_without_clipping() -> None:
    with pytest.raises(ValueError, match="clip_norm"):
        Defence(name="bad", noise_multiplier=1.0)


def test_clipping_alone_does_not_stop_a_clipping_aware_idlg(digits) -> None:
    x, y = digits
    model = build_victim("lenet", seed=0)
    upd = apply_defence(
        compute_update(model, x[8:9], y[8:9]), clip_norm=1.0, noise_std=0.0, rng=None
    )
    rec = idlg_attack(model, upd, batch_size=1, iterations=100, seed=0, scale_free=True)
    assert psnr(x[8].reshape(8, 8), rec.images[0]) > 30.0
