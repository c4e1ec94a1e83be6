"""fedprivacy.ml.models: parameter counts, shapes, weights round trip, Opacus compatibility."""

import numpy as np
import pytest
import torch
from opacus.validators import ModuleValidator

from fedprivacy.ml.models import build_model, get_weights, num_parameters, set_weights


def _mlp_params(sizes: list[int]) -> int:
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=True))


@pytest.mark.parametrize(
    ("name", "hidden", "expected"),
    [
        ("mlp", 128, _mlp_params([64, 128, 10])),  # 9,610
        ("mlp-large", 288, _mlp_params([64, 288, 288, 10])),  # 104,842
        ("mlp-large", 256, _mlp_params([64, 256, 256, 10])),  # 85,002
        # conv 1->16 (3x3), conv 16->32 (3x3), fc 32*4*4 -> 10
        ("cnn", 32, (16 * 9 + 16) + (32 * 16 * 9 + 32) + (512 * 10 + 10)),  # 9,930
        # conv 1->16 (5x5), pool, conv 16->32 (5x5), pool, fc 32*7*7 -> 10
        ("convnet", 32, (16 * 25 + 16) + (32 * 16 * 25 + 32) + (32 * 49 * 10 + 10)),  # 28,938
        ("convnet", 16, (8 * 25 + 8) + (16 * 8 * 25 + 16) + (16 * 49 * 10 + 10)),  # 11,274
    ],
)
def test_parameter_counts(name: str, hidden: int, expected: int) -> None:
    shape = (1, 28, 28) if name == "convnet" else (1, 8, 8)
    model = build_model(name, input_shape=shape, num_classes=10, hidden=hidden)
    assert num_parameters(model) == expected


def test_default_widths_give_10k_and_100k_parameters() -> None:
    small = build_model("mlp", input_shape=(1, 8, 8), num_classes=10)
    large = build_model("mlp-large", input_shape=(1, 8, 8), num_classes=10)
    assert 9_000 < num_parameters(small) < 11_000
    assert 95_000 < num_parameters(large) < 110_000


@pytest.mark.parametrize(
    ("name", "shape"),
    [("mlp", (1, 8, 8)), ("mlp", (60,)), ("mlp-large", (1, 8, 8)), ("cnn", (1, 8, 8)),
     ("convnet", (1, 28, 28)), ("convnet", (3, 32, 32)), ("mlp", (3, 32, 32))],
)
def test_forward_shape_and_opacus_compatibility(name: str, shape: tuple) -> None:
    model = build_model(name, input_shape=shape, num_classes=10, seed=0)
    out = model(torch.zeros((5, *shape)))
    assert out.shape == (5, 10)
    assert ModuleValidator.validate(model, strict=False) == []


def test_init_is_deterministic_given_seed_and_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = get_weights(build_model("cnn", input_shape=(1, 8, 8), num_classes=10, seed=7))
    after = torch.rand(1)
    b = get_weights(build_model("cnn", input_shape=(1, 8, 8), num_classes=10, seed=7))
    c = get_weights(build_model("cnn", input_shape=(1, 8, 8), num_classes=10, seed=8))

    assert before == after
    for wa, wb in zip(a, b, strict=True):
        np.testing.assert_array_equal(wa, wb)
    assert any(not np.array_equal(wa, wc) for wa, wc in zip(a, c, strict=True))


def test_weights_round_trip_in_state_dict_order() -> None:
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, seed=0)
    weights = get_weights(model)
    assert [w.shape for w in weights] == [tuple(t.shape) for t in model.state_dict().values()]
    assert all(w.dtype == np.float32 for w in weights)

    new = [np.full_like(w, i) for i, w in enumerate(weights)]
    set_weights(model, new)
    for i, w in enumerate(get_weights(model)):
        np.testing.assert_array_equal(w, np.full_like(w, i))
    weights[0][...] = 99.0  # get_weights returned copies
    assert get_weights(model)[0][0, 0] == 0.0


def test_set_weights_rejects_wrong_shapes_counts_and_nan() -> None:
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10)
    weights = get_weights(model)
    with pytest.raises(ValueError, match="arrays"):
        set_weights(model, weights[:-1])
    with pytest.raises(ValueError, match="shape"):
        set_weights(model, [weights[1], *weights[1:]])
    weights[2][0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        set_weights(model, weights)


def test_bad_model_arguments() -> None:
    with pytest.raises(ValueError, match="model must be one of"):
        build_model("resnet", input_shape=(1, 8, 8), num_classes=10)
    with pytest.raises(ValueError, match="cnn"):
        build_model("cnn", input_shape=(60,), num_classes=10)


def test_convnet_on_cifar_shaped_input_counts_three_input_channels() -> None:
    model = build_model("convnet", input_shape=(3, 32, 32), num_classes=10)
    assert num_parameters(model) == (16 * 3 * 25 + 16) + (32 * 16 * 25 + 32) + (32 * 64 * 10 + 10)


def test_model_registry() -> None:
    from fedprivacy.ml.models import model_entry, model_names, register_model

    assert model_names()[:4] == ("mlp", "mlp-large", "cnn", "convnet")
    with pytest.raises(ValueError, match=r"model must be one of mlp, .*convnet; got 'resnet'"):
        build_model("resnet", input_shape=(1, 28, 28), num_classes=10)
    with pytest.raises(ValueError, match="already registered"):
        register_model("mlp", default_hidden=4)(lambda shape, k, h: torch.nn.Linear(1, k))
    with pytest.raises(ValueError, match=r"convnet.*H, W >= 4"):
        build_model("convnet", input_shape=(1, 3, 3), num_classes=10)

    @register_model("test-linear", default_hidden=1)
    def _linear(shape: tuple, num_classes: int, hidden: int) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(shape)), num_classes))

    assert model_entry("test-linear").default_hidden == 1
    assert num_parameters(build_model("test-linear", input_shape=(1, 8, 8), num_classes=3)) == 195


def test_convnet_learns_fashion_mnist() -> None:
    from fedprivacy.ml.data import load_dataset
    from fedprivacy.ml.datasets.fashion_mnist import DEBIAN_DIR, find_idx_dir
    from fedprivacy.ml.train import evaluate, train_local

    if find_idx_dir(DEBIAN_DIR) is None:
        pytest.skip("Debian's dataset-fashion-mnist is not installed (scripts/setup.sh installs it)")
    train, test = load_dataset("fashion-mnist", seed=0, test_fraction=0.2)
    model = build_model("convnet", input_shape=train.feature_shape, num_classes=train.num_classes, seed=0)

    train_local(model, train.subset(np.arange(3000)), epochs=3, lr=0.1, batch_size=16, seed=0)
    _, acc = evaluate(model, test.subset(np.arange(2000)))

    assert acc > 0.75  # chance is 0.10; 3000 images, 3 epochs (measured 0.819)
