"""fedprivacy.ml.train: plain SGD, DP-SGD through Opacus, evaluation."""

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from dp_accounting import pld

from fedprivacy.dp.rng import RandomSource
from fedprivacy.ml.data import Split, load_dataset
from fedprivacy.ml.models import build_model, get_weights
from fedprivacy.ml.train import DpsgdConfig, PoissonBatchSampler, evaluate, train_local


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
    assert result.dpsgd_accountant == "fedprivacy-pld"
    ref_pld = pld.PLDAccountant(value_discretization_interval=1e-4)
    ref_pld.compose(event)
    assert result.dpsgd_epsilon == pytest.approx(ref_pld.get_epsilon(1e-5), rel=1e-2)
    assert result.dpsgd_rng == RandomSource.seeded(0).describe()  # seed=0: research mode, said so


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


def test_secure_mode_refuses_a_seeded_source(digits) -> None:
    train, _ = digits
    small = train.subset(np.arange(10))
    cfg = DpsgdConfig(noise_multiplier=1.0, max_grad_norm=1.0, secure_mode=True)
    with pytest.raises(ValueError, match="secure_mode=True needs a private DP-SGD source"):
        train_local(_mlp(), small, seed=3, dpsgd=cfg)
    with pytest.raises(ValueError, match="secure_mode=True"):
        train_local(_mlp(), small, dpsgd=cfg, rng=RandomSource.seeded(3))
    result = train_local(_mlp(), small, seed=3, dpsgd=cfg, rng=RandomSource.secure())
    assert result.dpsgd_rng == RandomSource.secure().describe()
    assert train_local(_mlp(), small, dpsgd=cfg).dpsgd_rng.startswith("secure (AES-256-CTR")


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


# ------------------------------------------------------------------ DP-SGD randomness
def _flat(model: torch.nn.Module) -> np.ndarray:
    return np.concatenate([w.ravel().astype(np.float64) for w in get_weights(model)])


def test_dpsgd_noise_is_the_random_sources_draws(digits) -> None:
    """One full-batch step: the update is -lr (sum of clipped gradients + noise) / n, the clipped sum
    has norm <= n C, and the noise (std sigma C = n here) is exactly what the source hands out
    (after the step's batch mask, parameter by parameter)."""
    train, _ = digits
    n, lr, clip = 64, 1.0, 1e-3
    sigma = n / clip
    split = train.subset(np.arange(n))
    model = _mlp()
    start = _flat(model)
    source = RandomSource.seeded(1234)
    result = train_local(
        model,
        split,
        epochs=1,
        lr=lr,
        batch_size=n,
        dpsgd=DpsgdConfig(noise_multiplier=sigma, max_grad_norm=clip, compute_epsilon=False),
        rng=source,
    )
    assert result.steps == 1 and result.dpsgd_sample_rate == 1.0
    replay = RandomSource.seeded(1234)
    assert replay.bernoulli(1.0, size=n).all()  # the batch mask (q = 1) comes first
    shapes = [p.shape for p in _mlp().parameters()]
    expected = np.concatenate(
        [np.asarray(replay.normal(std=sigma * clip, size=tuple(sh)), dtype=np.float32).ravel()
         for sh in shapes]
    ).astype(np.float64)
    moved = (start - _flat(model)) * n / lr  # = noise + clipped gradient sum
    assert np.linalg.norm(expected) > 50 * np.sqrt(expected.size)  # the noise, std 64 per coordinate
    assert np.linalg.norm(moved - expected) <= n * clip * 1.01 + 1e-3  # the rest is the gradient


@pytest.mark.parametrize(
    "make", [RandomSource.seeded, lambda s: RandomSource._from_key(bytes([s]) * 32)]
)
def test_dpsgd_randomness_ignores_torchs_generator(digits, make) -> None:
    """Same source (seeded, or the secure AES-CTR pipeline under a fixed key): same run whatever
    torch's generator holds; another source: another run."""
    train, _ = digits
    small = train.subset(np.arange(100))
    cfg = DpsgdConfig(noise_multiplier=1.0, max_grad_norm=1.0, compute_epsilon=False)
    a, b, c = _mlp(), _mlp(), _mlp()
    torch.manual_seed(0)
    train_local(a, small, batch_size=20, seed=0, dpsgd=cfg, rng=make(7))
    torch.manual_seed(1)
    train_local(b, small, batch_size=20, seed=1, dpsgd=cfg, rng=make(7))
    train_local(c, small, batch_size=20, seed=0, dpsgd=cfg, rng=make(8))
    np.testing.assert_array_equal(_flat(a), _flat(b))  # same source: same noise and batches
    assert not np.array_equal(_flat(a), _flat(c))


def test_dpsgd_noise_statistics_on_the_secure_pipeline(digits) -> None:
    """Secure (AES-CTR) pipeline, fixed key: the noise added in one step is N(0, (sigma C)^2) per
    coordinate (KS test over all parameters), independent across coordinates."""
    from scipy import stats

    train, _ = digits
    n, clip = 32, 1e-3
    sigma = n / clip  # update per coordinate: N(0, 1) + a gradient part of total norm <= 1e-3
    model = _mlp()
    start = _flat(model)
    train_local(
        model,
        train.subset(np.arange(n)),
        epochs=1,
        lr=1.0,
        batch_size=n,
        dpsgd=DpsgdConfig(noise_multiplier=sigma, max_grad_norm=clip, compute_epsilon=False),
        rng=RandomSource._from_key(b"dp-sgd noise statistics test key"),
    )
    z = start - _flat(model)
    assert z.size > 1000
    assert stats.kstest(z, "norm").pvalue > 1e-4
    assert abs(z.mean()) < 5 / np.sqrt(z.size) and abs(z.std() - 1) < 0.05
    assert abs(np.corrcoef(z[:-1], z[1:])[0, 1]) < 5 / np.sqrt(z.size)


def test_poisson_batches_come_from_the_source() -> None:
    """Each index is in a batch with probability q, independently: batch sizes are Binomial(n, q)
    (chi-square), and the masks are the source's Bernoulli draws."""
    from scipy import stats

    n, q, steps = 50, 0.2, 4000
    sampler = PoissonBatchSampler(
        num_samples=n, sample_rate=q, steps=steps, rng=RandomSource._from_key(bytes(range(1, 33)))
    )
    batches = list(sampler)
    assert len(batches) == len(sampler) == steps
    sizes = np.array([len(b) for b in batches])
    counts = np.bincount(sizes, minlength=n + 1)
    expected = stats.binom.pmf(np.arange(n + 1), n, q) * steps
    keep = expected >= 5
    observed = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    assert stats.chisquare(observed, exp * observed.sum() / exp.sum()).pvalue > 1e-4
    hits = np.bincount(np.concatenate(batches), minlength=n)
    assert stats.chisquare(hits).pvalue > 1e-4  # no index favoured
    replay = RandomSource.seeded(5)
    again = PoissonBatchSampler(num_samples=n, sample_rate=q, steps=3, rng=replay)
    masks = [np.flatnonzero(RandomSource.seeded(5).bernoulli(q, size=n))]
    assert list(again)[0] == masks[0].tolist()
    with pytest.raises(ValueError, match="sample_rate"):
        PoissonBatchSampler(num_samples=n, sample_rate=0.0, steps=1, rng=replay)
