"""fedprivacy.ml.data: bundled digits and generated Synthetic(alpha, beta)."""

import numpy as np
import pytest
from sklearn.datasets import load_digits

from fedprivacy.ml.data import SYNTHETIC_DIM, Split, load_dataset, make_synthetic


def _rows(split: Split) -> np.ndarray:
    """Examples as sortable rows (features then label), in lexicographic order."""
    rows = np.concatenate([split.x.reshape(len(split), -1) * 16, split.y[:, None]], axis=1)
    return rows[np.lexsort(rows.T[::-1])]


def test_digits_shapes_dtypes_and_ranges() -> None:
    train, test = load_dataset("digits", seed=0, test_fraction=0.2)

    assert train.x.shape[1:] == (1, 8, 8) and test.x.shape[1:] == (1, 8, 8)
    assert train.x.dtype == np.float32 and train.y.dtype == np.int64
    assert len(train) + len(test) == 1797
    assert len(test) == 360  # ceil(0.2 * 1797), sklearn's rounding
    assert train.x.min() == 0.0 and train.x.max() == 1.0
    assert set(np.unique(train.y)) == set(range(10)) == set(np.unique(test.y))


def test_digits_split_is_a_stratified_partition_of_sklearn_digits() -> None:
    train, test = load_dataset("digits", seed=3, test_fraction=0.25)
    bunch = load_digits()
    full = Split(
        x=(bunch.images / 16.0).astype(np.float32)[:, None], y=bunch.target.astype(np.int64)
    )

    both = Split(x=np.concatenate([train.x, test.x]), y=np.concatenate([train.y, test.y]))
    np.testing.assert_array_equal(_rows(both), _rows(full))  # disjoint and complete, as multisets
    # stratified: every class's test share is within one example of 25%
    for c in range(10):
        n_c = int((full.y == c).sum())
        assert abs(int((test.y == c).sum()) - 0.25 * n_c) <= 1.0


def test_digits_split_is_deterministic_given_seed() -> None:
    a_train, a_test = load_dataset("digits", seed=7, test_fraction=0.2)
    b_train, _ = load_dataset("digits", seed=7, test_fraction=0.2)
    c_train, _ = load_dataset("digits", seed=8, test_fraction=0.2)

    np.testing.assert_array_equal(a_train.x, b_train.x)
    np.testing.assert_array_equal(a_train.y, b_train.y)
    assert not np.array_equal(a_train.y, c_train.y)


def test_cached_arrays_are_read_only() -> None:
    train, _ = load_dataset("digits", seed=0, test_fraction=0.2)
    with pytest.raises(ValueError):
        train.x[0, 0, 0, 0] = 5.0


def test_synthetic_is_deterministic_and_seed_dependent() -> None:
    a, _ = make_synthetic(num_clients=5, seed=1, test_fraction=0.2)
    b, _ = make_synthetic(num_clients=5, seed=1, test_fraction=0.2)
    c, _ = make_synthetic(num_clients=5, seed=2, test_fraction=0.2)

    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.y, b.y)
    assert a.x.shape != c.x.shape or not np.array_equal(a.x, c.x)


def test_synthetic_client_sizes_classes_and_test_share() -> None:
    train, test = make_synthetic(
        num_clients=40, seed=0, test_fraction=0.2, min_samples=50, max_samples=300
    )

    assert train.x.shape[1] == SYNTHETIC_DIM and train.x.dtype == np.float32
    assert np.all((train.y >= 0) & (train.y < 10))
    assert len(np.unique(np.concatenate([train.y, test.y]))) == 10
    n_tr = np.bincount(train.groups, minlength=40)
    n_te = np.bincount(test.groups, minlength=40)
    total = n_tr + n_te
    assert total.min() >= 50 and total.max() <= 300
    assert len(np.unique(total)) > 5  # power-law sizes, not all equal
    np.testing.assert_array_equal(n_te, np.round(0.2 * total).astype(int))


def test_synthetic_iid_features_follow_the_paper_covariance() -> None:
    # Synthetic-IID: x ~ N(0, Sigma), Sigma_jj = j^-1.2 (Li et al. 2020, section 5.1)
    train, _ = make_synthetic(
        num_clients=4, seed=5, test_fraction=0.1, iid=True, min_samples=3000, max_samples=3000
    )
    var = train.x.astype(np.float64).var(axis=0)
    expected = np.arange(1, SYNTHETIC_DIM + 1) ** -1.2
    np.testing.assert_allclose(var, expected, rtol=0.1)
    np.testing.assert_allclose(train.x.mean(axis=0), 0.0, atol=0.05)


def test_synthetic_non_iid_clients_have_different_means() -> None:
    train, _ = make_synthetic(num_clients=3, seed=0, test_fraction=0.2, alpha=1.0, beta=1.0)
    means = [train.x[train.groups == k, 0].mean() for k in range(3)]
    assert np.ptp(means) > 0.1  # v_k ~ N(B_k, 1) differ between clients


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "nope", "seed": 0, "test_fraction": 0.2}, "dataset must be"),
        ({"name": "digits", "seed": 0, "test_fraction": 1.0}, "test_fraction must be in"),
        ({"name": "synthetic", "seed": 0, "test_fraction": 0.2, "num_clients": 0}, "num_clients"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs: dict, message: str) -> None:
    name = kwargs.pop("name")
    with pytest.raises(ValueError, match=message):
        load_dataset(name, **kwargs)


def test_split_validates_types() -> None:
    with pytest.raises(TypeError, match="float32"):
        Split(x=np.zeros((2, 3)), y=np.zeros(2, dtype=np.int64))
    with pytest.raises(ValueError, match="same N"):
        Split(x=np.zeros((2, 3), np.float32), y=np.zeros(3, dtype=np.int64))
