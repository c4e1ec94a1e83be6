"""Sensitivity of C under each schema: brute force over every pattern, pinned references, refusals."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivacy.dp.matrix import (
    BandedToeplitz,
    Blt,
    Workload,
    bsr,
    min_sep_sensitivity,
    single_participation_sensitivity,
)


def _brute_force(c: np.ndarray, min_sep: int, k: int) -> float:
    """max over every allowed pattern of |C 1_pi| (aligned contributions: the worst case for C >= 0)."""
    n, best = c.shape[0], 0.0
    for size in range(1, k + 1):
        for pi in itertools.combinations(range(n), size):
            if all(b - a >= min_sep for a, b in zip(pi, pi[1:], strict=False)):
                best = max(best, float(np.linalg.norm(c[:, list(pi)].sum(axis=1))))
    return best


@settings(max_examples=30)
@given(n=st.integers(2, 10), data=st.data(), momentum=st.sampled_from([0.0, 0.5, 0.9]))
def test_min_sep_sensitivity_is_the_worst_pattern(n: int, data: st.DataObject, momentum: float) -> None:
    band = data.draw(st.integers(1, n))
    sep = data.draw(st.integers(1, n))
    k = data.draw(st.integers(1, 4))
    c = bsr(Workload(num_rounds=n, momentum=momentum), band)
    if band > sep and np.any(np.diff(c.column()) > 0):
        with pytest.raises(ValueError, match="cannot bound"):
            min_sep_sensitivity(c, min_sep=sep, max_participations=k)
        return
    got = min_sep_sensitivity(c, min_sep=sep, max_participations=k).value
    assert got == pytest.approx(_brute_force(c.matrix(), sep, k), rel=1e-12)


@settings(max_examples=30)
@given(n=st.integers(4, 40), band=st.integers(1, 8), sep=st.integers(1, 12), k=st.integers(1, 6))
def test_sensitivity_grows_with_participations(n: int, band: int, sep: int, k: int) -> None:
    c = bsr(Workload(num_rounds=n), min(band, n))  # prefix BSR: non-negative, non-increasing
    one = min_sep_sensitivity(c, min_sep=sep, max_participations=k).value
    more = min_sep_sensitivity(c, min_sep=sep, max_participations=k + 1).value
    wider = min_sep_sensitivity(c, min_sep=sep + 1, max_participations=k).value
    assert one <= more + 1e-12 and wider <= one + 1e-12
    assert single_participation_sensitivity(c).value <= one + 1e-12


def test_single_participation_is_the_largest_column_norm() -> None:
    c = bsr(Workload(num_rounds=16, momentum=0.9), 6)
    assert single_participation_sensitivity(c).value == pytest.approx(
        np.linalg.norm(c.matrix(), axis=0).max(), rel=1e-14)


def test_band_one_with_k_participations_is_sqrt_k() -> None:
    c = bsr(Workload(num_rounds=100), 1)
    assert min_sep_sensitivity(c, min_sep=1, max_participations=9).value == pytest.approx(3.0)
    assert min_sep_sensitivity(c, min_sep=10, max_participations=None).value == pytest.approx(math.sqrt(10))


def test_an_increasing_band_wider_than_the_separation_is_refused() -> None:
    c = BandedToeplitz(num_rounds=10, coefs=(1.0, 0.5, 0.8))
    with pytest.raises(ValueError, match="band 3 > min_separation 2"):
        min_sep_sensitivity(c, min_sep=2, max_participations=3)
    neg = BandedToeplitz(num_rounds=10, coefs=(1.0, -0.2))
    with pytest.raises(ValueError, match="non-negative"):
        min_sep_sensitivity(neg, min_sep=1, max_participations=3)
    # the same C is fine when the separation covers the band (orthogonal columns)
    assert min_sep_sensitivity(c, min_sep=3, max_participations=3).value > 0


def test_blt_multi_participation_uses_the_toeplitz_theorem() -> None:
    blt = Blt(num_rounds=16, buf_decay=(0.5, 0.9), output_scale=(0.3, 0.1))
    s = min_sep_sensitivity(blt, min_sep=3, max_participations=4)
    assert "non-increasing" in s.basis
    assert s.value == pytest.approx(_brute_force(blt.matrix(), 3, 4), rel=1e-12)


@pytest.mark.parametrize("kwargs,match", [({"min_sep": 0}, "min_separation"),
                                          ({"min_sep": 2, "max_participations": 0}, "max_participations")])
def test_bad_schemas_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        min_sep_sensitivity(bsr(Workload(num_rounds=8), 2), **kwargs)
