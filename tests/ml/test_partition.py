"""fedprivacy.ml.partition: flwr-datasets partitioners over the local training split."""

import numpy as np
import pytest

from fedprivacy.ml.data import load_dataset, make_synthetic
from fedprivacy.ml.partition import DataSpec, load_partition, load_test_set, partition


@pytest.fixture(scope="module")
def digits_train():
    return load_dataset("digits", seed=0, test_fraction=0.2)[0]


@pytest.mark.parametrize("partitioner", ["iid", "dirichlet", "pathological"])
@pytest.mark.parametrize("num_partitions", [10, 37])
def test_every_training_index_lands_in_exactly_one_partition(
    digits_train, partitioner: str, num_partitions: int
) -> None:
    parts = partition(
        digits_train, num_partitions=num_partitions, partitioner=partitioner, seed=1, alpha=0.5
    )

    assert len(parts) == num_partitions
    assert all(len(p) >= 1 for p in parts)
    allidx = np.sort(np.concatenate(parts))
    np.testing.assert_array_equal(allidx, np.arange(len(digits_train)))


@pytest.mark.parametrize("partitioner", ["iid", "dirichlet", "pathological"])
def test_partitioning_is_deterministic_given_seed(digits_train, partitioner: str) -> None:
    a = partition(digits_train, num_partitions=10, partitioner=partitioner, seed=4)
    b = partition(digits_train, num_partitions=10, partitioner=partitioner, seed=4)
    c = partition(digits_train, num_partitions=10, partitioner=partitioner, seed=5)

    for pa, pb in zip(a, b, strict=True):
        np.testing.assert_array_equal(pa, pb)
    assert any(not np.array_equal(pa, pc) for pa, pc in zip(a, c, strict=True))


@pytest.mark.parametrize(("num_partitions", "k"), [(7, 4), (10, 2), (30, 3), (20, 1)])
def test_pathological_gives_at_most_k_classes_per_partition(
    digits_train, num_partitions: int, k: int
) -> None:
    parts = partition(
        digits_train,
        num_partitions=num_partitions,
        partitioner="pathological",
        classes_per_partition=k,
        seed=0,
    )
    assert max(len(np.unique(digits_train.y[p])) for p in parts) <= k


def test_pathological_refuses_to_drop_classes(digits_train) -> None:
    with pytest.raises(ValueError, match="drop classes"):
        partition(
            digits_train, num_partitions=3, partitioner="pathological", classes_per_partition=2
        )


def test_dirichlet_small_alpha_is_more_skewed_than_iid(digits_train) -> None:
    def mean_classes(parts):
        return np.mean([len(np.unique(digits_train.y[p])) for p in parts])

    iid = partition(digits_train, num_partitions=20, partitioner="iid", seed=0)
    skew = partition(digits_train, num_partitions=20, partitioner="dirichlet", alpha=0.05, seed=0)
    assert mean_classes(iid) == 10
    assert mean_classes(skew) < 6


def test_iid_supports_one_thousand_tiny_partitions(digits_train) -> None:
    parts = partition(digits_train, num_partitions=1000, partitioner="iid", seed=0)
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() == 1 and sizes.max() == 2 and sizes.sum() == len(digits_train)


def test_more_partitions_than_examples_is_refused(digits_train) -> None:
    with pytest.raises(ValueError, match="num_partitions must be in"):
        partition(digits_train, num_partitions=len(digits_train) + 1)


def test_natural_partition_of_synthetic_is_each_clients_own_data() -> None:
    train, _ = make_synthetic(num_clients=6, seed=0, test_fraction=0.2)
    parts = partition(train, num_partitions=6, partitioner="natural")
    for k, p in enumerate(parts):
        np.testing.assert_array_equal(p, np.flatnonzero(train.groups == k))
    with pytest.raises(ValueError, match="natural"):
        partition(train, num_partitions=5, partitioner="natural")


def test_unknown_partitioner_is_refused(digits_train) -> None:
    with pytest.raises(ValueError, match="partitioner must be one of"):
        partition(digits_train, num_partitions=4, partitioner="random")


def test_load_partition_pieces_rebuild_the_training_split() -> None:
    spec = DataSpec(dataset="digits", seed=2, partitioner="dirichlet", dirichlet_alpha=1.0)
    train, test = load_dataset("digits", seed=2, test_fraction=0.2)
    pieces = [load_partition(spec, i, 8) for i in range(8)]

    assert sum(len(p) for p in pieces) == len(train)
    np.testing.assert_array_equal(np.sort(np.concatenate([p.y for p in pieces])), np.sort(train.y))
    np.testing.assert_array_equal(load_partition(spec, 3, 8).x, pieces[3].x)  # cached, same
    np.testing.assert_array_equal(load_test_set(spec).y, test.y)


def test_load_partition_reads_a_run_config_like_object() -> None:
    class Cfg:  # the attributes fedprivacy.config.RunConfig has
        dataset = "synthetic"
        seed = -1  # secure-mode runs: the data seed falls back to 0 in every process
        test_fraction = 0.2
        partitioner = "iid"  # synthetic always uses its natural partition
        synthetic_alpha = 0.5
        synthetic_beta = 0.0

    part = load_partition(Cfg(), 2, 5)
    train, test = make_synthetic(num_clients=5, seed=0, test_fraction=0.2, alpha=0.5, beta=0.0)
    np.testing.assert_array_equal(part.x, train.x[train.groups == 2])
    np.testing.assert_array_equal(load_test_set(Cfg(), 5).x, test.x)
    with pytest.raises(ValueError, match="partition_id"):
        load_partition(Cfg(), 5, 5)


def test_data_spec_rejects_negative_seed() -> None:
    with pytest.raises(ValueError, match="seed must be"):
        DataSpec(seed=-1)


def test_natural_partition_matches_flwr_datasets_natural_id_partitioner() -> None:
    import datasets
    from flwr_datasets.partitioner import NaturalIdPartitioner

    from fedprivacy.ml.data import Split

    groups = np.random.default_rng(4).integers(0, 9, 200).astype(np.int64) * 3  # ids 0, 3, ..., 24
    split = Split(x=np.zeros((200, 2), np.float32), y=np.zeros(200, np.int64), groups=groups)
    ours = partition(split, num_partitions=len(np.unique(groups)), partitioner="natural")

    ref = NaturalIdPartitioner(partition_by="g")
    ref.dataset = datasets.Dataset.from_dict({"g": groups.tolist(), "i": list(range(200))})
    for k, part in enumerate(ours):
        np.testing.assert_array_equal(part, ref.load_partition(k)["i"])


@pytest.mark.parametrize(("n", "k"), [(60, 7), (1437, 1000), (100, 100), (23, 1)])
def test_iid_partition_matches_flwr_datasets_iid_partitioner(n: int, k: int) -> None:
    import datasets
    from flwr_datasets.partitioner import IidPartitioner

    from fedprivacy.ml.data import Split

    split = Split(x=np.zeros((n, 1), np.float32), y=(np.arange(n) % 3).astype(np.int64))
    ours = partition(split, num_partitions=k, partitioner="iid", seed=5)

    perm = np.random.Generator(np.random.PCG64(5)).permutation(n)  # the seeded order IID shards
    ref = IidPartitioner(num_partitions=k)
    ref.dataset = datasets.Dataset.from_dict({"i": perm.tolist()})
    for pid in range(k):
        np.testing.assert_array_equal(ours[pid], ref.load_partition(pid)["i"])
