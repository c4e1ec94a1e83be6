"""fedprivacy.ml.train: plain SGD, DP-SGD through Opacus, evaluation."""

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from dp_accounting import pld, rdp
from opacus.accountants import RDPAccountant

from fedprivacy.ml.data import Split, load_dataset
from fedprivacy.ml.models import build_model, get_weights
from fedprivacy.ml.train import DpsgdConfig, evaluate, train_local


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0, test_fraction=0.2)


def _mlp(seed: int = 0) -> torch.nn.Module:
    return build_model("mlp", input_shape=(1, 8, 8), num_classes=10, seed=seed)


def test_centralised_mlp_reaches_90_percent_with_default_lr(digits) -> None:
    train, test = digits
    model = _mlp()
    result = train_local(model, train, epochs=10, batch_size=32, seed=0)  # default lr

    loss, acc = evaluate(model, test)
    assert acc > 0.90
    assert result.num_examples == len(train)
    assert result.steps == 10 * int(np.ceil(len(train) / 32))
    assert 0 < result.loss < 1.0 and loss < 1.0
    assert result.dpsgd_epsilon is None and result.privacy_unit is None


def test_training_equals_torch_sgd_on_the_same_batches(digits) -> None:
    train, _ = digits
    small = train.subset(np.arange(100))
    ours, ref = _mlp(2), _mlp(2)
    train_local(ours, small, epochs=2, lr=0.3, batch_size=16, seed=11)

    gen = torch.Generator().manual_seed(
        11
    )  # train_local's documented shuffling: randperm per epoch
    opt = torch.optim.SGD(ref.parameters(), lr=0.3)
    x, y = torch.from_numpy(np.array(small.x)), torch.from_numpy(np.array(small.y))
    for _ in range(2):
        perm = torch.randperm(100, generator=gen)
        for start in range(0, 100, 16):
            idx = perm[start : start + 16]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ref(x[idx]), y[idx]).backward()
            opt.step()
    for a, b in zip(get_weights(ours), get_weights(ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_training_is_deterministic_given_seed(digits) -> None:
    train, _ = digits
    a, b, c = _mlp(), _mlp(), _mlp()
    train_local(a, train, epochs=1, lr=0.1, batch_size=32, seed=3)
    train_local(b, train, epochs=1, lr=0.1, batch_size=32, seed=3)
    train_local(c, train, epochs=1, lr=0.1, batch_size=32, seed=4)
    for wa, wb in zip(get_weights(a), get_weights(b), strict=True):
        np.testing.assert_array_equal(wa, wb)
    assert not np.array_equal(get_weights(a)[0], get_weights(c)[0])


def test_evaluate_matches_a_direct_computation(digits) -> None:
    _, test = digits
    model = _mlp(1)
    loss, acc = evaluate(model, test, batch_size=7)

    with torch.no_grad():
        logits = model(torch.from_numpy(np.array(test.x)))
        labels = torch.from_numpy(np.array(test.y))
    assert acc == pytest.approx(float((logits.argmax(1) == labels).float().mean()))
    assert loss == pytest.approx(float(torch.nn.functional.cross_entropy(logits, labels)), rel=1e-5)


def test_a_one_example_partition_trains_with_and_without_dpsgd(digits) -> None:
    train, _ = digits
    tiny = train.subset(np.array([5]))
    for dpsgd in (None, DpsgdConfig(noise_multiplier=1.0, max_grad_norm=1.0)):
        model = _mlp()
        result = train_local(model, tiny, epochs=2, lr=0.1, batch_size=32, seed=0, dpsgd=dpsgd)
        assert result.num_examples == 1 and result.steps == 2
        assert not np.array_equal(get_weights(model)[0], get_weights(_mlp())[0])


def _dpa_event(q: float, sigma: float, steps: int):
    return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)


def test_dpsgd_runs_through_opacus_and_reports_a_matching_epsilon(digits) -> None:
    train, test = digits
    cfg = DpsgdConfig(noise_multiplier=1.1, max_grad_norm=1.0, delta=1e-5)
    model = _mlp()
    before = get_weights(model)

    result = train_local(model, train, epochs=2, lr=0.5, batch_size=64, seed=0, dpsgd=cfg)

    num_batches = int(np.ceil(len(train) / 64))
    assert result.steps == 2 * num_batches
    assert result.dpsgd_sample_rate == pytest.approx(1 / num_batches)
    assert result.privacy_unit == "example"
    assert any(not np.allclose(a, b) for a, b in zip(before, get_weights(model), strict=True))
    assert evaluate(model, test)[1] > 0.3  # noisy but learning (chance is 0.1)

    event = _dpa_event(result.dpsgd_sample_rate, 1.1, result.steps)
    if result.dpsgd_accountant == "opacus-rdp":
        ref = rdp.RdpAccountant(orders=RDPAccountant.DEFAULT_ALPHAS)
        ref.compose(event)
        assert result.dpsgd_epsilon == pytest.approx(ref.get_epsilon(1e-5), rel=1e-4)
    else:
        assert result.dpsgd_accountant == "fedprivacy-pld"
        ref_pld = pld.PLDAccountant(value_discretization_interval=1e-4)
        ref_pld.compose(event)
        assert result.dpsgd_epsilon == pytest.approx(ref_pld.get_epsilon(1e-5), rel=1e-2)


def test_without_fedprivacy_accounting_epsilon_comes_from_opacus_rdp(monkeypatch) -> None:
    from fedprivacy.ml import train as train_module

    monkeypatch.setattr(train_module, "_fedprivacy_epsilon_for", lambda: None)
    train_module._dpsgd_epsilon_cached.cache_clear()
    eps, label = train_module.dpsgd_epsilon(
        noise_multiplier=0.9, sample_rate=0.01, steps=300, delta=1e-6
    )
    train_module._dpsgd_epsilon_cached.cache_clear()

    ref = rdp.RdpAccountant(orders=RDPAccountant.DEFAULT_ALPHAS)
    ref.compose(_dpa_event(0.01, 0.9, 300))
    assert label == "opacus-rdp"
    assert eps == pytest.approx(ref.get_epsilon(1e-6), rel=1e-4)


def test_dpsgd_clips_per_example_gradients() -> None:
    # One full-batch step (q = 1): the update is lr * (sum of clipped per-example gradients + noise) / B,
    # so its norm is at most lr * (C + ||noise|| / B) with ||noise|| ~ sigma * C * sqrt(d), even though
    # the raw gradients are large.
    n, clip, sigma = 400, 0.01, 0.5
    rng = np.random.Generator(np.random.PCG64(0))
    split = Split(x=(rng.random((n, 1, 8, 8)) * 50).astype(np.float32), y=np.arange(n) % 10)
    plain, private = _mlp(), _mlp()
    start = np.concatenate([w.ravel() for w in get_weights(plain)])
    dim = start.size

    train_local(plain, split, epochs=1, lr=1.0, batch_size=n, seed=0)
    result = train_local(
        private,
        split,
        epochs=1,
        lr=1.0,
        batch_size=n,
        seed=0,
        dpsgd=DpsgdConfig(noise_multiplier=sigma, max_grad_norm=clip),
    )

    def moved(model):
        return np.linalg.norm(np.concatenate([w.ravel() for w in get_weights(model)]) - start)

    assert result.steps == 1 and result.dpsgd_sample_rate == 1.0
    assert moved(plain) > 0.5
    assert 0 < moved(private) <= clip + 1.1 * sigma * clip * np.sqrt(dim) / n


def test_dpsgd_is_reproducible_given_seed(digits) -> None:
    train, _ = digits
    small = train.subset(np.arange(200))
    cfg = DpsgdConfig(noise_multiplier=1.0, max_grad_norm=1.0)
    a, b = _mlp(), _mlp()
    train_local(a, small, epochs=1, lr=0.1, batch_size=32, seed=9, dpsgd=cfg)
    train_local(b, small, epochs=1, lr=0.1, batch_size=32, seed=9, dpsgd=cfg)
    for wa, wb in zip(get_weights(a), get_weights(b), strict=True):
        np.testing.assert_array_equal(wa, wb)


def test_dpsgd_epsilon_can_be_left_to_the_server(digits) -> None:
    train, _ = digits
    cfg = DpsgdConfig(noise_multiplier=1.0, max_grad_norm=1.0, compute_epsilon=False)
    result = train_local(_mlp(), train.subset(np.arange(50)), batch_size=10, seed=0, dpsgd=cfg)
    assert result.dpsgd_epsilon is None and result.privacy_unit == "example"
    assert result.steps == 5 and result.dpsgd_sample_rate == pytest.approx(0.2)


def test_secure_mode_goes_to_opacus_secure_rng(digits) -> None:
    try:
        import torchcsprng  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torchcsprng is installed; this test checks the missing-package path")
    train, _ = digits
    cfg = DpsgdConfig(noise_multiplier=1.0, max_grad_norm=1.0, secure_mode=True)
    with pytest.raises(ImportError, match="torchcsprng"):
        train_local(_mlp(), train.subset(np.arange(10)), seed=None, dpsgd=cfg)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"noise_multiplier": 0.0, "max_grad_norm": 1.0}, "noise_multiplier must be > 0"),
        ({"noise_multiplier": 1.0, "max_grad_norm": -1.0}, "max_grad_norm must be > 0"),
        ({"noise_multiplier": 1.0, "max_grad_norm": 1.0, "delta": 1.0}, "delta must be in"),
    ],
)
def test_dpsgd_config_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DpsgdConfig(**kwargs)


def test_bad_training_arguments(digits) -> None:
    train, _ = digits
    with pytest.raises(ValueError, match="epochs"):
        train_local(_mlp(), train, epochs=0)
    with pytest.raises(ValueError, match="lr"):
        train_local(_mlp(), train, lr=-0.1)
    with pytest.raises(TypeError, match="Split"):
        train_local(_mlp(), (train.x, train.y))
