"""Properties of L2 clipping (STYLE.md §11: ||clip(x)|| <= C, idempotent, direction kept)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedprivacy.dp.clipping import (
    clip_arrays,
    clip_l2,
    clip_narrow_flat,
    flatten,
    l2_norm,
    unflatten,
)

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False, width=64)
vectors = hnp.arrays(
    np.float64, hnp.array_shapes(min_dims=1, max_dims=2, max_side=20), elements=finite
)
clip_norms = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False)
TOL = 1e-12


@settings(max_examples=200, deadline=None)
@given(x=vectors, c=clip_norms)
def test_clip_l2_bounds_norm_keeps_direction_and_is_idempotent(x: np.ndarray, c: float) -> None:
    y, norm = clip_l2(x, clip_norm=c)
    ref = math.sqrt(math.fsum(float(v) ** 2 for v in x.ravel()))
    assert norm == pytest.approx(ref, rel=1e-12, abs=1e-300)
    assert np.linalg.norm(y.ravel()) <= c * (1 + TOL)
    assert y.shape == x.shape and y.dtype == x.dtype
    if ref <= c:
        np.testing.assert_array_equal(y, x)
    else:
        # direction kept: y = a*x with 0 < a, and the norm is (close to) C
        a = c / ref
        np.testing.assert_allclose(y, x * a, rtol=1e-12, atol=1e-300)
        assert np.linalg.norm(y.ravel()) == pytest.approx(c, rel=1e-12)
    y2, n2 = clip_l2(y, clip_norm=c)
    np.testing.assert_array_equal(y2, y)
    assert n2 <= c * (1 + TOL)


@settings(max_examples=100, deadline=None)
@given(
    arrays=st.lists(
        hnp.arrays(
            np.float32,
            hnp.array_shapes(min_dims=1, max_dims=3, max_side=6),
            elements=st.floats(-1e4, 1e4, width=32),
        ),
        min_size=1,
        max_size=6,
    ),
    c=clip_norms,
    per_layer=st.booleans(),
)
def test_clip_arrays_total_norm_at_most_c(
    arrays: list[np.ndarray], c: float, per_layer: bool
) -> None:
    out, norms = clip_arrays(arrays, clip_norm=c, per_layer=per_layer)
    total = math.sqrt(sum(float(np.sum(o.astype(np.float64) ** 2)) for o in out))
    assert total <= c * (1 + TOL)
    assert [o.shape for o in out] == [a.shape for a in arrays]
    assert all(o.dtype == np.float32 for o in out)
    if per_layer:
        assert isinstance(norms, list) and len(norms) == len(arrays)
        for o, a, n in zip(out, arrays, norms, strict=True):
            assert n == pytest.approx(l2_norm(a), rel=1e-12)
            assert l2_norm(o) <= c / math.sqrt(len(arrays)) * (1 + TOL)
    else:
        assert isinstance(norms, float)
        assert norms == pytest.approx(l2_norm(flatten(arrays, dtype=np.float64)), rel=1e-9)


def test_global_clip_scales_all_layers_by_one_factor() -> None:
    a, b = np.array([3.0, 0.0]), np.array([[0.0, 4.0]])
    (ya, yb), norm = clip_arrays([a, b], clip_norm=1.0)
    assert norm == 5.0
    np.testing.assert_allclose(ya, [0.6, 0.0])
    np.testing.assert_allclose(yb, [[0.0, 0.8]])


def test_per_layer_budget_is_c_over_sqrt_l() -> None:
    layers = [np.full(4, 10.0), np.zeros(3), np.array([0.1])]
    out, norms = clip_arrays(layers, clip_norm=3.0, per_layer=True)
    assert norms == pytest.approx([20.0, 0.0, 0.1])
    assert l2_norm(out[0]) == pytest.approx(3.0 / math.sqrt(3))
    np.testing.assert_array_equal(out[1], layers[1])
    np.testing.assert_array_equal(out[2], layers[2])


def test_zero_vector_is_fine_and_input_is_not_mutated() -> None:
    x = np.zeros(5)
    y, n = clip_l2(x, clip_norm=1.0)
    assert n == 0.0 and (y == 0).all() and y is not x
    z = np.array([30.0, 40.0])
    clip_l2(z, clip_norm=1.0)
    np.testing.assert_array_equal(z, [30.0, 40.0])


def test_huge_values_do_not_overflow_the_norm() -> None:
    x = np.array([1e200, 1e200])
    y, n = clip_l2(x, clip_norm=1.0)
    assert n == pytest.approx(math.sqrt(2) * 1e200)
    np.testing.assert_allclose(y, [1 / math.sqrt(2)] * 2)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_raises_naming_the_argument(bad: float) -> None:
    with pytest.raises(ValueError, match=r"^x contains NaN or Inf"):
        clip_l2(np.array([1.0, bad]), clip_norm=1.0)
    with pytest.raises(ValueError, match=r"arrays\[1\] contains NaN or Inf"):
        clip_arrays([np.ones(2), np.array([bad])], clip_norm=1.0)


@pytest.mark.parametrize("c", [0.0, -1.0, math.inf, math.nan])
def test_bad_clip_norm_names_the_parameter(c: float) -> None:
    with pytest.raises(ValueError, match="clip_norm must be"):
        clip_l2(np.ones(3), clip_norm=c)


def test_type_errors() -> None:
    with pytest.raises(TypeError, match="x must be a numpy array"):
        clip_l2([1.0, 2.0], clip_norm=1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="clip_norm"):
        clip_l2(np.ones(2), clip_norm="1")  # type: ignore[arg-type]


def test_flatten_unflatten_round_trip() -> None:
    like = [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.ones((1, 1, 2), np.float32),
        np.zeros(0),
    ]
    v = flatten(like)
    assert v.shape == (8,)
    back = unflatten(v, like)
    for a, b in zip(like, back, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="vec has 7 entries, but like needs 8"):
        unflatten(v[:7], like)


# ---- clip_narrow_flat: clip_arrays of float64 copies, raveled and joined, bit for bit
narrow_lists = st.lists(
    st.sampled_from([np.float32, np.float16]).flatmap(lambda dt: hnp.arrays(
        dt, hnp.array_shapes(min_dims=1, max_dims=2, max_side=30),
        elements=st.floats(-6e4, 6e4, allow_nan=False, allow_infinity=False, width=16 if dt is np.float16 else 32))),
    min_size=0, max_size=5)


def _client_clipped(arrays: list[np.ndarray], c: float) -> list[np.ndarray]:
    """What a client sends: clipped in float64, then cast back (the cast may land just above C)."""
    clipped, _ = clip_arrays([np.asarray(a, dtype=np.float64) for a in arrays], clip_norm=c)
    return [w.astype(a.dtype) for w, a in zip(clipped, arrays, strict=True)]


def _assert_flat_is_clip_arrays(arrays: list[np.ndarray], c: float) -> float:
    ref, ref_norm = clip_arrays([np.asarray(a, dtype=np.float64) for a in arrays], clip_norm=c)
    out = clip_narrow_flat(arrays, clip_norm=c)
    assert out is not None
    flat, norm = out
    assert norm == ref_norm
    assert flat.dtype == np.float64 and flat.ndim == 1
    np.testing.assert_array_equal(flat, np.concatenate([r.ravel() for r in ref]) if ref else np.zeros(0))
    assert clip_arrays(ref, clip_norm=c)[1] <= c  # the guarantee, on the arrays the vector joins
    return float(ref_norm)


@settings(max_examples=300, deadline=None)
@given(xs=narrow_lists, c=clip_norms, pre_clip=st.booleans())
def test_clip_narrow_flat_is_clip_arrays_of_float64_copies_bit_for_bit(
        xs: list[np.ndarray], c: float, pre_clip: bool) -> None:
    # raw arrays, or a client's clipped-then-cast reply (norm at C up to the cast's rounding)
    _assert_flat_is_clip_arrays(_client_clipped(xs, c) if pre_clip else xs, c)


def test_clip_narrow_flat_takes_the_rescale_path_like_clip_arrays_on_model_sized_arrays() -> None:
    # a 10k-parameter MLP's shapes (the first run is longer than numpy's pairwise block and 8192):
    # the float32 cast of a clipped update lands above C about half the time; both paths bit for bit
    rng = np.random.default_rng(3)
    shapes = [(128, 64), (128,), (10, 128), (10,), (3, 5000)]
    above = 0
    for _ in range(60):
        raw = [rng.normal(scale=rng.uniform(0.01, 1.0), size=s).astype(np.float32) for s in shapes]
        above += _assert_flat_is_clip_arrays(_client_clipped(raw, 1.0), 1.0) > 1.0
        _assert_flat_is_clip_arrays(raw, 0.5)
    assert 5 < above < 55  # both paths were taken


def test_clip_narrow_flat_reads_non_contiguous_arrays_in_c_order() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4).T  # Fortran-ordered view
    _assert_flat_is_clip_arrays([a, np.ones(2, np.float32)], 3.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_clip_narrow_flat_returns_none_on_nan_or_inf(bad: float) -> None:
    a = np.ones(4, np.float32)
    a[2] = bad
    assert clip_narrow_flat([np.ones(3, np.float32), a], clip_norm=1.0) is None


def test_clip_narrow_flat_refuses_wide_or_foreign_arrays() -> None:
    with pytest.raises(TypeError, match=r"arrays\[1\]"):
        clip_narrow_flat([np.ones(2, np.float32), np.ones(2)], clip_norm=1.0)
    with pytest.raises(TypeError, match=r"arrays\[0\]"):
        clip_narrow_flat([[1.0, 2.0]], clip_norm=1.0)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="clip_norm"):
        clip_narrow_flat([np.ones(2, np.float32)], clip_norm=0.0)
