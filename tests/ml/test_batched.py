"""The batched trainer against the per-client one: same steps, weights and loss within float rounding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from fedprivacy.config import RunConfig
from fedprivacy.errors import ConfigError
from fedprivacy.ml.batched import (
    batching_pays,
    can_batch,
    device_available,
    resolve_device,
    train_batched,
)
from fedprivacy.ml.data import Split
from fedprivacy.ml.models import build_model, get_weights, set_weights
from fedprivacy.ml.train import train_local


def _splits(sizes: list[int], shape: tuple[int, ...], seed: int) -> list[Split]:
    rng = np.random.default_rng(seed)
    return [Split(x=rng.standard_normal((n, *shape)).astype(np.float32),
                  y=rng.integers(0, 10, n).astype(np.int64), num_classes=10) for n in sizes]


def _per_client(model: nn.Module, splits: list[Split], seeds: list[int], **kw: object) -> list:
    start = get_weights(model)
    out = []
    for split, seed in zip(splits, seeds, strict=True):
        set_weights(model, start)
        res = train_local(model, split, seed=seed, **kw)  # type: ignore[arg-type]
        out.append((get_weights(model), res))
    set_weights(model, start)
    return out


@settings(max_examples=12, deadline=None)
@given(
    model=st.sampled_from([("mlp", (1, 8, 8)), ("mlp-large", (12,)), ("cnn", (1, 6, 6))]),
    sizes=st.lists(st.integers(1, 23), min_size=1, max_size=5),
    epochs=st.integers(1, 2),
    batch_size=st.integers(1, 12),
    lr=st.floats(0.01, 0.5),
    seed=st.integers(0, 2**31 - 2),
)
def test_every_client_takes_its_own_steps_and_ends_where_the_per_client_loop_ends(
        model: tuple[str, tuple[int, ...]], sizes: list[int], epochs: int, batch_size: int, lr: float,
        seed: int) -> None:
    name, shape = model
    net = build_model(name, input_shape=shape, num_classes=10, hidden=16, seed=seed % 1000)
    splits = _splits(sizes, shape, seed)
    seeds = [seed + i for i in range(len(sizes))]  # ragged partitions: padded and masked
    want = _per_client(net, splits, seeds, epochs=epochs, lr=lr, batch_size=batch_size)
    before = get_weights(net)
    got = train_batched(net, splits, seeds=seeds, epochs=epochs, lr=lr, batch_size=batch_size)
    for (weights, res), b in zip(want, got, strict=True):
        assert b.steps == res.steps and b.num_examples == res.num_examples
        assert b.loss == pytest.approx(res.loss, rel=1e-4, abs=1e-5)
        for w, bw in zip(weights, b.weights, strict=True):
            np.testing.assert_allclose(bw, w, rtol=1e-4, atol=1e-5)
    for w, w0 in zip(get_weights(net), before, strict=True):
        np.testing.assert_array_equal(w, w0)  # the starting model is left as it was


def test_a_client_past_its_last_step_keeps_its_weights_exactly() -> None:
    net = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=8, seed=0)
    splits = _splits([1, 40], (1, 8, 8), 0)  # 1 step beside 4
    got = train_batched(net, splits, seeds=[5, 6], epochs=1, lr=0.2, batch_size=10)
    (alone, res), _ = _per_client(net, splits, [5, 6], epochs=1, lr=0.2, batch_size=10)
    assert got[0].steps == 1 == res.steps and got[1].steps == 4
    for w, bw in zip(alone, got[0].weights, strict=True):
        np.testing.assert_allclose(bw, w, rtol=1e-6, atol=1e-7)


def test_a_model_with_batch_norm_is_not_batched() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 10))
    assert not can_batch(net)
    with pytest.raises(ValueError, match="per client"):
        train_batched(net, _splits([3], (4,), 0), seeds=[0])


def test_the_registry_batches_the_mlps_and_not_the_convnets() -> None:
    assert batching_pays("mlp") and batching_pays("mlp-large")
    assert not batching_pays("convnet") and not batching_pays("cnn")


def test_a_bad_device_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match="^device must be one of auto, cpu, cuda, mps; got 'gpu'$"):
        resolve_device("gpu")
    with pytest.raises(ConfigError, match="device must be one of auto, cpu, cuda, mps; got 'gpu'"):
        RunConfig.from_mapping({"device": "gpu"})
    with pytest.raises(ConfigError, match="batched-training must be one of off, auto, on"):
        RunConfig.from_mapping({"batched-training": "yes"})
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else
                                           "mps" if device_available("mps") else "cpu")
    for device in ("cuda", "mps"):
        if not device_available(device):
            with pytest.raises(ConfigError, match=f"^device must be 'cpu' or 'auto' here: this torch has no "
                                                  f"{device} device, got '{device}'$"):
                RunConfig.from_mapping({"device": device})
    assert RunConfig.from_mapping({}).batched_training == "auto"  # the batched path is the default
