"""Exact (CKS 2020) and vectorised discrete samplers against their pmfs."""

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from fedprivacy.dp.discrete import (
    bernoulli_exp_exact,
    discrete_gaussian_pmf,
    sample_discrete_gaussian,
    sample_discrete_gaussian_exact,
    sample_discrete_laplace_exact,
)
from fedprivacy.dp.rng import RandomSource

ALPHA = 1e-4
KEY = bytes(range(7, 39))


def chi_square_vs_pmf(samples: np.ndarray, pmf, min_expected: float = 5.0) -> float:  # type: ignore[no-untyped-def]
    """p-value of a chi-square test, merging the two tails into one bin each."""
    n = len(samples)
    k = 0
    while n * pmf(np.array([k + 1]))[0] >= min_expected:
        k += 1
    support = np.arange(-k, k + 1)
    p = pmf(support)
    counts = np.array([(samples == v).sum() for v in support], dtype=np.float64)
    tail = (1 - p.sum()) / 2
    obs = np.concatenate(([(samples < -k).sum()], counts, [(samples > k).sum()]))
    exp = np.concatenate(([tail], p, [tail])) * n
    return float(stats.chisquare(obs, exp).pvalue)


def dlap_pmf(scale: float):  # type: ignore[no-untyped-def]
    r = math.exp(-1 / scale)
    return lambda x: (1 - r) / (1 + r) * r ** np.abs(x)


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 2)])
def test_bernoulli_exp_exact_frequency(gamma: Fraction) -> None:
    rng = RandomSource._from_key(KEY)
    n = 20_000
    hits = sum(bernoulli_exp_exact(gamma, rng) for _ in range(n))
    assert stats.binomtest(hits, n, math.exp(-gamma)).pvalue > ALPHA


@pytest.mark.parametrize("scale", [Fraction(3, 2), 5])
def test_exact_discrete_laplace_chi_square(scale: Fraction | int) -> None:
    x = sample_discrete_laplace_exact(scale=scale, size=15_000, rng=RandomSource._from_key(KEY))
    assert x.dtype == np.int64
    assert chi_square_vs_pmf(x, dlap_pmf(float(scale))) > ALPHA
    r = math.exp(-1 / float(scale))
    assert abs(x.var() / (2 * r / (1 - r) ** 2) - 1) < 0.08


@pytest.mark.parametrize("sigma_sq", [Fraction(1, 2), 4, 30.25])
def test_exact_discrete_gaussian_chi_square(sigma_sq: Fraction | float) -> None:
    rng = RandomSource.seeded(17) if sigma_sq == 4 else RandomSource._from_key(KEY)
    x = sample_discrete_gaussian_exact(sigma_sq=sigma_sq, size=8_000, rng=rng)
    sigma = math.sqrt(float(sigma_sq))
    assert chi_square_vs_pmf(x, lambda v: discrete_gaussian_pmf(v, sigma=sigma)) > ALPHA
    assert abs(x.mean()) < 6 * sigma / math.sqrt(len(x))


def test_exact_samplers_scalar_and_reproducible() -> None:
    a = sample_discrete_gaussian_exact(sigma_sq=2, size=20, rng=RandomSource.seeded(1))
    b = sample_discrete_gaussian_exact(sigma_sq=2, size=20, rng=RandomSource.seeded(1))
    np.testing.assert_array_equal(a, b)
    assert isinstance(sample_discrete_laplace_exact(scale=2, rng=RandomSource.seeded(1)), int)


@pytest.mark.parametrize("sigma", [0.4, 2.0, 37.5])
@pytest.mark.parametrize("seeded", [False, True])
def test_fast_discrete_gaussian_chi_square_and_moments(sigma: float, seeded: bool) -> None:
    rng = RandomSource.seeded(5) if seeded else RandomSource._from_key(KEY)
    n = 200_000
    x = sample_discrete_gaussian(sigma=sigma, size=n, rng=rng)
    assert x.dtype == np.int64 and x.shape == (n,)
    assert chi_square_vs_pmf(x, lambda v: discrete_gaussian_pmf(v, sigma=sigma)) > ALPHA
    support = np.arange(-int(40 * sigma) - 10, int(40 * sigma) + 11)
    var = float((discrete_gaussian_pmf(support, sigma=sigma) * support.astype(float) ** 2).sum())
    assert abs(x.var() / var - 1) < 6 * math.sqrt(2 / n)


def test_fast_discrete_gaussian_shape() -> None:
    x = sample_discrete_gaussian(sigma=3.0, size=(3, 4), rng=RandomSource.seeded(0))
    assert x.shape == (3, 4) and x.dtype == np.int64


def test_pmf_sums_to_one_and_matches_continuous_for_large_sigma() -> None:
    k = np.arange(-400, 401)
    assert discrete_gaussian_pmf(k, sigma=0.7).sum() == pytest.approx(1.0, rel=1e-12)
    # for large sigma the normaliser is ~ sqrt(2 pi) sigma
    assert discrete_gaussian_pmf(0, sigma=50.0) == pytest.approx(
        1 / (math.sqrt(2 * math.pi) * 50.0), rel=1e-12
    )


def test_errors_name_the_parameter() -> None:
    rng = RandomSource.seeded(0)
    with pytest.raises(ValueError, match="sigma must be"):
        sample_discrete_gaussian(sigma=0.0, size=3, rng=rng)
    with pytest.raises(ValueError, match="sigma_sq must be > 0"):
        sample_discrete_gaussian_exact(sigma_sq=Fraction(-1, 2), size=3, rng=rng)
    with pytest.raises(ValueError, match="scale must be > 0"):
        sample_discrete_laplace_exact(scale=0, size=3, rng=rng)
    with pytest.raises(TypeError, match="scale must be"):
        sample_discrete_laplace_exact(scale="2", size=3, rng=rng)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gamma must be >= 0"):
        bernoulli_exp_exact(Fraction(-1), rng)
