"""L2 clipping of vectors and model updates, and flattening of lists of arrays.

Clipping bounds the L2 sensitivity of a sum of contributions (Abadi et al. 2016, "Deep Learning with
Differential Privacy", Alg. 1; McMahan et al. 2018, "Learning Differentially Private Recurrent
Language Models", DP-FedAvg): ``clip(x) = x * min(1, C / ||x||_2)``.

Guarantee: the returned copy has ``||clip(x)||_2 <= C`` *as computed in float64*, also after rounding
to the input's float dtype (the scale factor is nudged down by a few ulps when rounding would push the
norm above C). Norms are accumulated in float64 and are overflow-safe. A zero vector is returned
unchanged; NaN or Inf raises ``ValueError`` naming the offending argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["NARROW_FLOATS", "clip_arrays", "clip_l2", "clip_narrow_flat", "flatten", "l2_norm", "unflatten"]


def _check_clip_norm(clip_norm: float) -> float:
    if isinstance(clip_norm, bool) or not isinstance(
        clip_norm, int | float | np.integer | np.floating
    ):
        raise TypeError(f"clip_norm must be a real number, got {type(clip_norm).__name__}")
    c = float(clip_norm)
    if not math.isfinite(c) or c <= 0:
        raise ValueError(f"clip_norm must be a finite number > 0, got {clip_norm!r}")
    return c


def _as_array(x: object, name: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
    if x.dtype.kind not in "fiub":
        raise TypeError(f"{name} must have a real numeric dtype, got {x.dtype}")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or Inf")
    return x


def l2_norm(x: np.ndarray) -> float:
    """Overflow-safe float64 L2 norm of all entries of ``x``."""
    v = np.asarray(x, dtype=np.float64).ravel()
    if v.size == 0:
        return 0.0
    # Elementwise square + pairwise sum, not np.dot: a BLAS dot spins up OpenBLAS's thread pool, which
    # fights torch's pool right after a backward pass (measured ~24 ms instead of ~0.05 ms for 100k
    # entries on 2 cores; scripts/benchmark.py notes).
    with np.errstate(over="ignore"):
        s = float(np.add.reduce(np.square(v)))
    if math.isfinite(s):
        return math.sqrt(s)
    m = float(np.max(np.abs(v)))
    w = v / m
    return m * math.sqrt(float(np.add.reduce(np.square(w))))


def _total_norm(arrays: Sequence[np.ndarray]) -> float:
    norms = [l2_norm(a) for a in arrays]
    return _hypot_all(norms)


def _hypot_all(norms: Sequence[float]) -> float:
    if not norms:
        return 0.0
    m = max(norms)
    if m == 0.0:
        return 0.0
    return m * math.sqrt(math.fsum((n / m) ** 2 for n in norms))


def _out_dtype(x: np.ndarray) -> np.dtype:
    return x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)


def _scale_to(arrays: Sequence[np.ndarray], factor: float, bound: float, *,
              total_norm: Callable[[list[np.ndarray]], float] = _total_norm) -> list[np.ndarray]:
    """Scale every array by ``factor`` (rounded to its dtype) so their joint norm, as ``total_norm``
    measures it, stays <= bound."""
    f = factor
    for _ in range(64):
        out = [
            (np.asarray(a, dtype=np.float64) * f).astype(_out_dtype(a), copy=False) for a in arrays
        ]
        if total_norm(out) <= bound:
            return out
        eps = max(float(np.finfo(_out_dtype(a)).eps) for a in arrays)
        f *= 1.0 - 4.0 * eps
    raise ArithmeticError("could not scale below the clip norm")  # pragma: no cover


def clip_l2(x: np.ndarray, *, clip_norm: float) -> tuple[np.ndarray, float]:
    """Clip ``x`` (any shape, all entries together) to L2 norm at most ``clip_norm``.

    ``clip(x) = x * min(1, C / ||x||_2)`` (Abadi et al. 2016, Alg. 1). Sensitivity of a sum of
    clipped vectors is C under add/remove and 2C under replace-one neighbouring.

    Args:
        x: a real numpy array; float dtypes are kept, integer inputs become float64.
        clip_norm: C > 0.

    Returns:
        ``(clipped_copy, original_norm)``; the original norm is a float64 scalar.

    Raises:
        ValueError: if ``clip_norm`` is not a finite positive number or ``x`` has NaN/Inf.
        TypeError: if ``x`` is not a numpy array of a real dtype.
    """
    c = _check_clip_norm(clip_norm)
    arr = _as_array(x, "x")
    norm = l2_norm(arr)
    if norm <= c:
        return arr.astype(_out_dtype(arr), copy=True), norm
    return _scale_to([arr], c / norm, c)[0], norm


def clip_arrays(
    arrays: Sequence[np.ndarray], *, clip_norm: float, per_layer: bool = False
) -> tuple[list[np.ndarray], float | list[float]]:
    """Clip a list of arrays (a model update) globally or per layer.

    Global (``per_layer=False``): the concatenation is clipped to norm C; returns the original total
    norm. Per layer: each of the L arrays is clipped to ``C / sqrt(L)``, so the total norm is still
    at most C (McMahan et al. 2018, §3, "per-layer clipping"); returns the list of original norms.

    Raises:
        ValueError: bad ``clip_norm``, or ``arrays[i]`` contains NaN/Inf (the message names ``i``).
        TypeError: ``arrays`` is not a sequence of numpy arrays.
    """
    c = _check_clip_norm(clip_norm)
    if isinstance(arrays, np.ndarray) or not isinstance(arrays, Sequence):
        raise TypeError(f"arrays must be a sequence of numpy arrays, got {type(arrays).__name__}")
    arrs = [_as_array(a, f"arrays[{i}]") for i, a in enumerate(arrays)]
    if per_layer:
        if not arrs:
            return [], []
        c_layer = c / math.sqrt(len(arrs))
        clipped: list[np.ndarray] = []
        norms: list[float] = []
        for a in arrs:
            n = l2_norm(a)
            norms.append(n)
            if n <= c_layer:
                clipped.append(a.astype(_out_dtype(a), copy=True))
            else:
                clipped.append(_scale_to([a], c_layer / n, c_layer)[0])
        # each layer <= C/sqrt(L) in float64; guard the sum against last-ulp rounding
        if _total_norm(clipped) > c:  # pragma: no cover - needs adversarial rounding
            clipped = _scale_to(clipped, 1.0, c)
        return clipped, norms
    total = _total_norm(arrs)
    if total <= c:
        return [a.astype(_out_dtype(a), copy=True) for a in arrs], total
    return _scale_to(arrs, c / total, c), total


#: The float dtypes whose float64 copies :func:`clip_narrow_flat` clips (no square of them overflows).
NARROW_FLOATS = frozenset((np.dtype(np.float16), np.dtype(np.float32)))


def clip_narrow_flat(arrays: Sequence[np.ndarray], *, clip_norm: float) -> tuple[np.ndarray, float] | None:
    """``clip_arrays([np.asarray(a, dtype=np.float64) for a in arrays], clip_norm=clip_norm)``, its
    arrays raveled and concatenated into one float64 vector, bit for bit, for float16/float32 arrays (a
    server re-clipping replies, :mod:`fedprivacy.fl.aggregation`), in a handful of passes over one
    vector instead of several per array; None when an entry is NaN or ±Inf (``clip_arrays`` raises
    ValueError there).

    Bit for bit: the same float64 values (a widening cast is exact), each array's norm the same
    pairwise sum of the same squares over its own contiguous run (a slice of the vector instead of a
    separate array; numpy's pairwise sum depends only on the run's values and length), the same
    :func:`_hypot_all`, the same scale factor and nudges. No overflow guard is needed: squares of
    float32 values (< 3.5e38) are < 1.2e77, so a non-finite sum means a NaN or ±Inf entry.

    Same guarantee as :func:`clip_arrays`: the result has ``||x||_2 <= C`` in float64.

    Raises:
        ValueError: bad ``clip_norm``.
        TypeError: an array is not a float16/float32 numpy array.
    """
    c = _check_clip_norm(clip_norm)
    bounds = [0]
    for i, a in enumerate(arrays):
        if not isinstance(a, np.ndarray) or a.dtype not in NARROW_FLOATS:
            raise TypeError(f"arrays[{i}] must be a float16/float32 numpy array, got "
                            f"{getattr(a, 'dtype', type(a).__name__)}")
        bounds.append(bounds[-1] + a.size)
    flat = (np.concatenate([a.ravel() for a in arrays], dtype=np.float64) if len(arrays)
            else np.zeros(0, dtype=np.float64))
    norms = _run_norms(flat, bounds)
    if norms is None:
        return None
    total = _hypot_all(norms)
    if total <= c:
        return flat, total
    # the vector scaled as clip_arrays scales the arrays it joins: the same products and nudges (float64's
    # eps), the joint norm taken run by run
    (out,) = _scale_to([flat], c / total, c,
                       total_norm=lambda scaled: _hypot_all(_run_norms(scaled[0], bounds) or [math.inf]))
    return out, total


def _run_norms(flat: np.ndarray, bounds: Sequence[int]) -> list[float] | None:
    """:func:`l2_norm` of each run ``flat[bounds[i]:bounds[i + 1]]`` of a float64 vector of float16/
    float32 values (times a factor <= 1: no square overflows); None if a sum is not finite."""
    squares = np.square(flat)
    norms: list[float] = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        s = float(np.add.reduce(squares[lo:hi]))
        if not math.isfinite(s):
            return None
        norms.append(math.sqrt(s))
    return norms


def flatten(arrays: Sequence[np.ndarray], *, dtype: np.dtype | type | None = None) -> np.ndarray:
    """Concatenate the raveled arrays into one 1-D vector (dtype: the common type, or ``dtype``)."""
    if isinstance(arrays, np.ndarray) or not isinstance(arrays, Sequence):
        raise TypeError(f"arrays must be a sequence of numpy arrays, got {type(arrays).__name__}")
    if not arrays:
        return np.zeros(0, dtype=dtype or np.float64)
    parts = [np.asarray(a).ravel() for a in arrays]
    return np.concatenate(parts).astype(dtype or np.result_type(*parts), copy=False)


def unflatten(vec: np.ndarray, like: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Split ``vec`` into arrays with the shapes and dtypes of ``like`` (inverse of ``flatten``)."""
    v = np.asarray(vec)
    if v.ndim != 1:
        raise ValueError(f"vec must be 1-D, got shape {v.shape}")
    sizes = [int(np.asarray(a).size) for a in like]
    if sum(sizes) != v.size:
        raise ValueError(f"vec has {v.size} entries, but like needs {sum(sizes)}")
    out: list[np.ndarray] = []
    pos = 0
    for a, k in zip(like, sizes, strict=True):
        ref = np.asarray(a)
        out.append(v[pos : pos + k].reshape(ref.shape).astype(ref.dtype, copy=True))
        pos += k
    return out
