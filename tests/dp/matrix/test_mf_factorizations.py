"""Workloads and strategies: A is the optimizer that runs, sqrt/inverse series, A == B C exactly."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivacy.dp.matrix import BandedToeplitz, Blt, Workload, bsr, decoder, errors, toeplitz


def _run_momentum_sgd(g: np.ndarray, beta: float, lrs: np.ndarray) -> np.ndarray:
    """theta_0 - theta_t of heavy-ball SGD, step by step (the independent reference for A)."""
    m, theta, out = np.zeros(g.shape[1]), np.zeros(g.shape[1]), []
    for t in range(g.shape[0]):
        m = beta * m + g[t]
        theta = theta - lrs[t] * m
        out.append(-theta)
    return np.array(out)


@pytest.mark.parametrize("beta,schedule", [(0.0, False), (0.9, False), (0.5, True), (0.0, True)])
def test_the_workload_matrix_is_the_optimizer_that_runs(beta: float, schedule: bool) -> None:
    n = 12
    rng = np.random.default_rng(1)
    lrs = rng.uniform(0.1, 1.0, n) if schedule else np.ones(n)
    w = Workload(num_rounds=n, momentum=beta, learning_rates=tuple(lrs) if schedule else None)
    g = rng.normal(size=(n, 3))
    np.testing.assert_allclose(w.matrix() @ g, _run_momentum_sgd(g, beta, lrs), rtol=1e-12, atol=1e-12)
    assert w.is_toeplitz is (not schedule)


def test_prefix_sums_are_the_all_ones_lower_triangle() -> None:
    np.testing.assert_array_equal(Workload(num_rounds=5).matrix(), np.tril(np.ones((5, 5))))


def test_bsr_of_prefix_sums_is_the_central_binomial_series() -> None:
    # sqrt of 1/(1-x): c_k = binom(2k, k) / 4**k (Kalinin & Lampert 2024, BSR for prefix sums)
    got = bsr(Workload(num_rounds=40), 20).coefs
    want = [math.comb(2 * k, k) / 4**k for k in range(20)]
    np.testing.assert_allclose(got, want, rtol=1e-13)


def test_bsr_with_momentum_is_the_product_of_two_binomial_series() -> None:
    # sqrt of 1/((1-x)(1-beta x)) = (1-x)^{-1/2} (1-beta x)^{-1/2}: r_j r_{k-j} beta^{k-j} summed
    beta, b = 0.9, 16
    r = np.array([math.comb(2 * k, k) / 4**k for k in range(b)])
    want = [sum(r[j] * r[k - j] * beta ** (k - j) for j in range(k + 1)) for k in range(b)]
    np.testing.assert_allclose(bsr(Workload(num_rounds=32, momentum=beta), b).coefs, want, rtol=1e-12)


@settings(max_examples=25)
@given(n=st.integers(1, 24), data=st.data())
def test_the_series_square_root_squares_back(n: int, data: st.DataObject) -> None:
    # workload-like series: a_0 = 1 and 0 <= a_k <= 1 (larger ratios make the root grow like r**k)
    a = np.array([1.0] + data.draw(st.lists(st.floats(0.0, 1.0), min_size=n - 1, max_size=n - 1)))
    s = toeplitz.sqrt(a, n)
    np.testing.assert_allclose(toeplitz.multiply(s, s, n), a, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(toeplitz.materialize(toeplitz.inverse(s, n), n) @ toeplitz.materialize(s, n),
                               np.eye(n), atol=1e-9)


@settings(max_examples=25)
@given(n=st.integers(2, 48), data=st.data(), beta=st.sampled_from([0.0, 0.5, 0.9, 0.99]),
       schedule=st.booleans())
def test_a_equals_b_times_c(n: int, data: st.DataObject, beta: float, schedule: bool) -> None:
    band = data.draw(st.integers(1, n))
    lrs = tuple(np.linspace(1.0, 0.1, n)) if schedule else None
    w = Workload(num_rounds=n, momentum=beta, learning_rates=lrs)
    c = bsr(w, band)
    b = decoder(w, c)
    scale = np.abs(w.matrix()).max()
    assert np.abs(b @ c.matrix() - w.matrix()).max() <= 1e-10 * scale


def test_blt_coefficients_and_matrix() -> None:
    blt = Blt(num_rounds=6, buf_decay=(0.5, 0.9), output_scale=(0.2, 0.1))
    col = blt.column()
    assert col[0] == 1.0
    np.testing.assert_allclose(col[3], 0.2 * 0.5**2 + 0.1 * 0.9**2)
    assert np.allclose(np.triu(blt.matrix(), 1), 0.0)


def test_full_band_bsr_is_the_exact_square_root_and_band_one_is_the_identity() -> None:
    w = Workload(num_rounds=20)
    full = bsr(w, 20).matrix()
    np.testing.assert_allclose(full @ full, w.matrix(), atol=1e-12)
    one = bsr(w, 1)
    assert one.coefs == (1.0,)
    assert errors(w, one)["max"] == pytest.approx(math.sqrt(20))  # B = A: last row has 20 ones


@pytest.mark.parametrize("kwargs,match", [
    ({"num_rounds": 0}, "num_rounds"), ({"num_rounds": 3, "momentum": 1.0}, "momentum"),
    ({"num_rounds": 3, "learning_rates": (1.0, 2.0)}, "learning_rates"),
    ({"num_rounds": 2, "learning_rates": (1.0, -1.0)}, "learning_rates")])
def test_bad_workloads_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Workload(**kwargs)


def test_bad_strategies_are_refused() -> None:
    with pytest.raises(ValueError, match="coefs"):
        BandedToeplitz(num_rounds=4, coefs=(0.0, 1.0))
    with pytest.raises(ValueError, match="band"):
        bsr(Workload(num_rounds=4), 5)
    with pytest.raises(ValueError, match="buf_decay"):
        Blt(num_rounds=4, buf_decay=(1.2,), output_scale=(0.1,))
