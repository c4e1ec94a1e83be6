"""Optimized BLTs: the filter loss against dense matrices, the sensitivity against every min-separated
participation pattern (T <= 8), and the coefficient box the Toeplitz theorem needs."""

import itertools

import numpy as np
import pytest

from fedprivacy.dp.matrix import Workload, bsr, errors, min_sep_sensitivity
from fedprivacy.dp.matrix.blt import blt_loss, optimize_blt


def _patterns(n: int, min_sep: int, k: int) -> list[tuple[int, ...]]:
    return [pi for size in range(1, k + 1) for pi in itertools.combinations(range(n), size)
            if all(b - a >= min_sep for a, b in zip(pi, pi[1:], strict=False))]


def _brute_force(c: np.ndarray, min_sep: int, k: int) -> tuple[float, float]:
    """(max_pi |C 1_pi|, max_pi sqrt(sum_{i,j in pi} |(C^T C)_ij|)) over every allowed pattern.

    The first is attained (all contributions aligned); the second bounds
    ``|sum_{i in pi} C[:, i] g_i|`` for any unit vectors g_i (Cauchy-Schwarz on each cross term), so
    they are equal exactly when the aligned pattern is the worst case."""
    gram = c.T @ c
    aligned = bound = 0.0
    for pi in _patterns(c.shape[0], min_sep, k):
        idx = list(pi)
        aligned = max(aligned, float(np.linalg.norm(c[:, idx].sum(axis=1))))
        bound = max(bound, float(np.sqrt(np.abs(gram[np.ix_(idx, idx)]).sum())))
    return aligned, bound


@pytest.mark.parametrize(("n", "momentum", "buffers", "min_sep", "k"), [
    (8, 0.0, 1, 2, 4), (8, 0.9, 2, 2, 4), (8, 0.9, 3, 3, 3), (7, 0.5, 2, 1, 7), (8, 0.0, 4, 4, 2),
    (6, 0.9, 2, 2, 2),
])
def test_the_blt_sensitivity_is_the_worst_of_every_min_separated_pattern(
        n: int, momentum: float, buffers: int, min_sep: int, k: int) -> None:
    # Arrange
    blt = optimize_blt(Workload(num_rounds=n, momentum=momentum), num_buffers=buffers, min_sep=min_sep,
                       max_participations=k)
    # Act
    s = min_sep_sensitivity(blt, min_sep=min_sep, max_participations=k)
    # Assert: the reported value is the maximum over all patterns, for any directions of the contributions
    aligned, bound = _brute_force(blt.matrix(), min_sep, k)
    assert s.value == pytest.approx(aligned, rel=1e-12)
    assert s.value == pytest.approx(bound, rel=1e-12)
    assert "non-increasing" in s.basis


@pytest.mark.parametrize(("momentum", "min_sep", "buffers"), [(0.0, 4, 2), (0.9, 4, 3), (0.9, 16, 2)])
def test_the_loss_is_sensitivity_squared_times_the_dense_mean_squared_error(momentum: float, min_sep: int,
                                                                            buffers: int) -> None:
    w = Workload(num_rounds=100, momentum=momentum)
    k = -(-100 // min_sep)
    blt = optimize_blt(w, num_buffers=buffers, min_sep=min_sep, max_participations=k)
    s = min_sep_sensitivity(blt, min_sep=min_sep, max_participations=k).value
    assert blt_loss(w, blt, min_sep=min_sep, max_participations=k) == pytest.approx(
        s ** 2 * errors(w, blt)["rms"] ** 2, rel=1e-9)


def test_the_optimized_blt_is_in_the_provable_box_and_is_not_worse_than_independent_noise() -> None:
    w = Workload(num_rounds=100, momentum=0.9)
    for min_sep in (4, 16):
        k = -(-100 // min_sep)
        blt = optimize_blt(w, num_buffers=2, min_sep=min_sep, max_participations=k)
        col = blt.column()
        assert np.all(col >= 0) and np.all(np.diff(col) <= 0) and np.all(blt.matrix().T @ blt.matrix() >= 0)
        one = bsr(w, 1)  # DP-SGD: C = I
        indep = min_sep_sensitivity(one, min_sep=min_sep, max_participations=k).value * errors(w, one)["rms"]
        ours = min_sep_sensitivity(blt, min_sep=min_sep, max_participations=k).value * errors(w, blt)["rms"]
        assert ours < indep / 1.5
        assert optimize_blt(w, num_buffers=2, min_sep=min_sep, max_participations=k) == blt  # deterministic


@pytest.mark.parametrize(("kwargs", "match"), [({"num_buffers": 0}, "num_buffers"),
                                               ({"num_buffers": 2, "min_sep": 0}, "min_separation")])
def test_bad_arguments_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        optimize_blt(Workload(num_rounds=8), **kwargs)


def test_a_blt_with_cancelling_scales_is_not_bounded_from_its_float_column() -> None:
    """Huge output scales of opposite signs give a float column that passes the monotone check while the
    stream runs another C, whose sensitivity is larger: such parameters are refused, whatever their column."""
    from fedprivacy.dp.matrix import Blt
    from fedprivacy.dp.matrix.sensitivity import single_participation_sensitivity

    # Arrange: the counterexample a review found (its float column is non-negative and non-increasing)
    bad = Blt(num_rounds=8, buf_decay=(0.30851840206195286,) * 2,
              output_scale=(2284404400882348.5, -2284404400882348.0))
    col = bad.column()
    assert np.all(col >= 0.0) and np.all(np.diff(col) <= 0.0) and not bad.in_monotone_box
    # Act / Assert
    with pytest.raises(ValueError, match="output scales must be > 0"):
        min_sep_sensitivity(bad, min_sep=2, max_participations=4)
    with pytest.raises(ValueError, match="output scales must be > 0"):
        single_participation_sensitivity(bad)
    # a BLT inside the box is bounded as before
    good = Blt(num_rounds=8, buf_decay=(0.9, 0.3), output_scale=(0.5, 0.2))
    assert good.in_monotone_box and min_sep_sensitivity(good, min_sep=2, max_participations=4).value > 0
