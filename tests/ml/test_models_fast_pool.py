"""The models' max pool (``fedprivacy.ml.models.MaxPool2d``, a channels-last copy into torch's kernel) is
``torch.nn.MaxPool2d`` bit for bit: values (ties, signed zeros, infinities, NaNs), gradients, second
derivatives (the gradient-leakage attacks), and whole training runs, plain and DP-SGD."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

from fedprivacy.ml.data import Split
from fedprivacy.ml.models import MaxPool2d, build_model, get_weights
from fedprivacy.ml.train import DpsgdConfig, train_local

# few distinct values: ties in most windows, plus the values whose order is special
_VALUES = (0.0, -0.0, 1.0, -1.0, 0.5, float("inf"), float("-inf"), float("nan"))


def _bits(t: torch.Tensor) -> np.ndarray:
    a = t.detach().contiguous().numpy()
    return a.view(np.int32 if a.dtype == np.float32 else np.int64)


def _every_window_touches_the_input(size: int, *, kernel: int, stride: int, padding: int, dilation: int,
                                    ceil_mode: bool) -> bool:
    """Whether every pooling window along a dimension has a position inside the input (torch's output size).

    A window made only of padding positions (e.g. size 1, kernel 2, padding 1, dilation 2: positions -1
    and 1) makes torch 2.13's own ``max_pool2d`` backward write out of bounds (heap corruption, the
    process aborts) or raise: not a case either pool can be compared on.
    """
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    if span < 0:
        return False
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return all(any(0 <= i * stride - padding + j * dilation < size for j in range(kernel)) for i in range(out))


@st.composite
def _cases(draw: st.DrawFn) -> tuple[torch.Tensor, dict[str, Any]]:
    kernel = draw(st.integers(1, 3))
    padding = draw(st.integers(0, kernel // 2))
    dilation = draw(st.integers(1, 2))
    reach = dilation * (kernel - 1) + 1
    n, c = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    h, w = draw(st.integers(max(1, reach - 2 * padding), 9)), draw(st.integers(max(1, reach - 2 * padding), 9))
    special = draw(st.booleans())
    pool = _VALUES if special else _VALUES[:5]
    vals = draw(st.lists(st.sampled_from(pool), min_size=n * c * h * w, max_size=n * c * h * w))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    x = torch.tensor(vals, dtype=dtype).reshape(n, c, h, w)
    args = {"kernel_size": kernel, "stride": draw(st.sampled_from([None, 1, 2, 3])), "padding": padding,
            "dilation": dilation, "ceil_mode": draw(st.booleans())}
    stride = args["stride"] or kernel
    assume(all(_every_window_touches_the_input(size, kernel=kernel, stride=stride, padding=padding,
                                               dilation=dilation, ceil_mode=args["ceil_mode"]) for size in (h, w)))
    return x, args


def _pool_and_derivatives(pool: nn.Module, x0: torch.Tensor, seed: int) -> tuple[torch.Tensor, ...] | str:
    """Output, gradient and a second derivative of ``pool`` at ``x0``, or the error torch raised."""
    x = x0.clone().requires_grad_()
    try:
        y = pool(x)
        gen = torch.Generator().manual_seed(seed)
        g_up = torch.randn(y.shape, generator=gen, dtype=x0.dtype).requires_grad_()
        v = torch.randn(x0.shape, generator=gen, dtype=x0.dtype)
        (gx,) = torch.autograd.grad(y, x, g_up, create_graph=True)
        (gg,) = torch.autograd.grad((gx * v).sum(), g_up)
    except RuntimeError as exc:  # torch's own refusal (e.g. a window entirely in the padding)
        return type(exc).__name__
    return y, gx, gg


@settings(max_examples=300, deadline=None)
@given(_cases(), st.integers(0, 2**31 - 1))
def test_values_gradients_and_second_derivatives_equal_torchs_pool(case, seed: int) -> None:
    x0, args = case
    ref = _pool_and_derivatives(nn.MaxPool2d(**args), x0, seed)
    fast = _pool_and_derivatives(MaxPool2d(**args), x0, seed)
    if isinstance(ref, str) or isinstance(fast, str):
        assert ref == fast
        return
    for r, f in zip(ref, fast, strict=True):
        assert r.shape == f.shape and r.is_contiguous() and f.is_contiguous()
        np.testing.assert_array_equal(_bits(r), _bits(f))


def test_other_inputs_take_torchs_own_path() -> None:
    pool = MaxPool2d(2)
    x3 = torch.arange(16.0).reshape(1, 4, 4)  # 3-d input
    assert torch.equal(pool(x3), nn.MaxPool2d(2)(x3))
    xt = torch.arange(32.0).reshape(1, 2, 4, 4).transpose(2, 3)  # not contiguous
    assert torch.equal(pool(xt), nn.MaxPool2d(2)(xt))
    with_idx = MaxPool2d(2, return_indices=True)(torch.arange(16.0).reshape(1, 1, 4, 4))
    assert isinstance(with_idx, tuple) and with_idx[1].tolist() == [[[[5, 7], [13, 15]]]]


def _with_torchs_pool(model: nn.Module) -> nn.Module:
    for name, child in model.named_children():
        if isinstance(child, MaxPool2d):
            setattr(model, name, nn.MaxPool2d(child.kernel_size, child.stride))
        else:
            _with_torchs_pool(child)
    return model


@pytest.mark.parametrize("dpsgd", [None, DpsgdConfig(noise_multiplier=1.0, max_grad_norm=1.0)])
@pytest.mark.parametrize(("name", "shape"), [("convnet", (1, 28, 28)), ("cnn", (1, 8, 8))])
def test_training_with_the_fast_pool_gives_the_same_weights(name: str, shape: tuple[int, ...],
                                                            dpsgd: DpsgdConfig | None) -> None:
    rng = np.random.default_rng(3)
    # images with a flat background, as Fashion-MNIST's: the background's windows tie after the ReLU
    x = np.where(rng.random((40, *shape)) < 0.5, 0.0, rng.random((40, *shape))).astype(np.float32)
    split = Split(x=x, y=rng.integers(0, 10, 40).astype(np.int64), num_classes=10)
    fast = build_model(name, input_shape=shape, num_classes=10, seed=5)
    ref = _with_torchs_pool(build_model(name, input_shape=shape, num_classes=10, seed=5))
    assert any(isinstance(m, MaxPool2d) for m in fast.modules())
    assert not any(isinstance(m, MaxPool2d) for m in ref.modules())
    assert list(fast.state_dict()) == list(ref.state_dict())  # same keys: the weights travel as before
    out = [train_local(m, split, epochs=2, lr=0.1, batch_size=10, seed=11, dpsgd=dpsgd) for m in (fast, ref)]
    assert out[0].loss == out[1].loss and out[0].steps == out[1].steps
    for a, b in zip(get_weights(fast), get_weights(ref), strict=True):
        np.testing.assert_array_equal(a, b)
