"""The data-set registry, Fashion-MNIST (Debian IDX files, data-dir, environment) and ``hf:`` data sets
saved locally in the Hugging Face Hub's schema (save_to_disk and the Hub's parquet layout): real files,
real ``datasets`` / flwr-datasets code, no mocks."""

from __future__ import annotations

import gzip
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from fedprivacy.config import RunConfig
from fedprivacy.ml.data import (
    Split,
    dataset_entry,
    dataset_names,
    load_dataset,
    register_dataset,
)
from fedprivacy.ml.datasets import fashion_mnist as fm
from fedprivacy.ml.partition import DataSpec, data_spec, load_partition, load_test_set

# ----------------------------------------------------------------------------- the registry


@dataclass(frozen=True, slots=True, kw_only=True)
class _Opts:
    scale: float = field(default=1.0, metadata={"config_key": "synthetic-alpha"})


@register_dataset("test-registry-toy", options=_Opts, description="two classes on a line")
def _toy(opts: _Opts, /, *, name: str, seed: int, test_fraction: float, num_clients: int):
    x = (np.arange(40, dtype=np.float32) * np.float32(opts.scale)).reshape(40, 1)
    y = (np.arange(40) % 3).astype(np.int64)
    return Split(x=x[:30], y=y[:30], num_classes=5), Split(x=x[30:], y=y[30:], num_classes=5)


def test_builtin_datasets_are_registered() -> None:
    names = dataset_names()
    for name in ("digits", "fashion-mnist", "synthetic", "hf:<name>"):
        assert name in names
    assert dataset_entry("hf:ylecun/mnist").name == "hf:"
    assert dataset_entry("synthetic").natural_partition and dataset_entry("synthetic").per_client


def test_unknown_dataset_is_refused_with_the_registered_names() -> None:
    with pytest.raises(ValueError, match=r"dataset must be one of .*fashion-mnist.*got 'mnist'"):
        dataset_entry("mnist")
    with pytest.raises(ValueError, match="dataset must be one of"):
        dataset_entry("hf:")
    with pytest.raises(ValueError, match="already registered"):
        register_dataset("digits")(_toy)
    with pytest.raises(ValueError, match="frozen dataclass"):
        register_dataset("test-registry-bad", options=dict)


def test_a_new_dataset_is_one_decorated_loader() -> None:
    # loads, reads its option from the run-config key it names, partitions, and validates in RunConfig
    train, test = load_dataset("test-registry-toy", seed=0, test_fraction=0.2, scale=2.0)
    assert train.x[-1, 0] == 58.0 and train.num_classes == 5 == test.num_classes

    class Cfg:
        dataset = "test-registry-toy"
        seed = 0
        test_fraction = 0.2
        partitioner = "iid"
        synthetic_alpha = 3.0

    spec = data_spec(Cfg())
    assert spec.options == _Opts(scale=3.0)
    parts = [load_partition(spec, i, 3) for i in range(3)]
    assert sorted(np.concatenate([p.x[:, 0] for p in parts]).tolist()) == [3.0 * i for i in range(30)]
    assert load_test_set(spec).num_classes == 5
    RunConfig(dataset="test-registry-toy")  # the config validates against the registry


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="takes the options"):
        load_dataset("digits", seed=0, test_fraction=0.2, alpha=1.0)
    with pytest.raises(TypeError, match="options must be"):
        DataSpec(dataset="synthetic", options=fm.FashionMnistOptions())


def test_config_validates_dataset_and_model_against_the_registries() -> None:
    cfg = RunConfig.from_mapping(
        {"dataset": "fashion-mnist", "data-dir": "/x", "model": "convnet", "partitioner": "natural"}
    )
    assert cfg.data_dir == "/x" and data_spec(cfg).options == fm.FashionMnistOptions(data_dir="/x")
    with pytest.raises(ValueError, match=r"dataset must be one of .*digits"):
        RunConfig(dataset="cifar")
    with pytest.raises(ValueError, match=r"model must be one of .*convnet"):
        RunConfig(model="resnet")


# ----------------------------------------------------------------------------- Fashion-MNIST

_DEBIAN = fm.DEBIAN_DIR


def _debian_or_skip() -> None:
    if fm.find_idx_dir(_DEBIAN) is None:
        if shutil.which("apt-get") is not None:  # scripts/setup.sh installs it wherever apt exists
            pytest.fail(f"{_DEBIAN} is missing: run bash scripts/setup.sh (installs dataset-fashion-mnist)")
        pytest.skip("no apt-get here and Debian's dataset-fashion-mnist is not installed")


def test_fashion_mnist_from_debian_package_has_the_published_shape() -> None:
    _debian_or_skip()
    train, test = load_dataset("fashion-mnist", seed=0, test_fraction=0.2)

    assert train.x.shape == (60_000, 1, 28, 28) and test.x.shape == (10_000, 1, 28, 28)
    assert train.x.dtype == np.float32 and train.x.min() == 0.0 and train.x.max() == 1.0
    # Xiao et al. 2017: 6,000 training and 1,000 test images per class
    np.testing.assert_array_equal(np.bincount(train.y), np.full(10, 6000))
    np.testing.assert_array_equal(np.bincount(test.y), np.full(10, 1000))
    # the first training labels of the official files: ankle boot, T-shirt, T-shirt, dress, ...
    np.testing.assert_array_equal(train.y[:10], [9, 0, 0, 3, 0, 2, 7, 2, 5, 5])
    assert train.num_classes == 10


def _write_idx(path: Path, arr: np.ndarray, *, compress: bool) -> None:
    raw = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()
    if compress:
        with gzip.open(path.with_name(path.name + ".gz"), "wb") as fh:
            fh.write(raw)
    else:
        path.write_bytes(raw)


def _fake_fashion(folder: Path, *, compress: bool, n_train: int = 30, n_test: int = 10) -> dict:
    rng = np.random.default_rng(1)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for stem, arr in arrays.items():
        _write_idx(folder / stem, arr, compress=compress)
    return arrays


@pytest.mark.parametrize("compress", [True, False])
def test_fashion_mnist_from_data_dir_round_trips_the_idx_bytes(tmp_path: Path, compress: bool) -> None:
    arrays = _fake_fashion(tmp_path / "fashion-mnist", compress=compress)  # the subfolder is found too

    train, test = load_dataset("fashion-mnist", seed=0, test_fraction=0.2, data_dir=str(tmp_path))

    np.testing.assert_array_equal(train.x[:, 0] * 255, arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(train.y, arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(test.x[:, 0] * 255, arrays["t10k-images-idx3-ubyte"])
    np.testing.assert_array_equal(test.y, arrays["t10k-labels-idx1-ubyte"])


def test_fashion_mnist_environment_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    arrays = _fake_fashion(tmp_path, compress=True, n_train=12)
    monkeypatch.setenv(fm.DATA_DIR_ENV, str(tmp_path))
    train, _ = fm.load_fashion_mnist(debian_dir=tmp_path / "nowhere")
    np.testing.assert_array_equal(train.y, arrays["train-labels-idx1-ubyte"])


def test_a_given_folder_without_the_files_is_an_error_that_says_how_to_get_them(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"data-dir is .*apt-get install dataset-fashion-mnist"):
        fm.load_fashion_mnist(data_dir=str(tmp_path))


def test_no_source_at_all_fails_with_instructions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # no data-dir, no environment variable, no Debian files, and (on this machine) no internet
    for var in (fm.DATA_DIR_ENV, "HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    from fedprivacy.ml.datasets import hf

    if hf._hub_reachable(timeout=1.0):
        pytest.skip("the Hugging Face Hub is reachable: the Hub fall-back would succeed")
    with pytest.raises(RuntimeError, match=r"Fashion-MNIST not found.*apt-get install dataset-fashion-mnist"):
        fm.load_fashion_mnist(debian_dir=tmp_path)


def test_read_idx_refuses_corrupt_files(tmp_path: Path) -> None:
    bad_magic = tmp_path / "a-idx1-ubyte"
    bad_magic.write_bytes(bytes([0, 0, 0x0D, 1]) + struct.pack(">I", 2) + b"\0" * 8)
    with pytest.raises(ValueError, match="not an unsigned-byte IDX"):
        fm.read_idx(bad_magic)
    short = tmp_path / "b-idx3-ubyte"
    short.write_bytes(bytes([0, 0, 0x08, 3]) + struct.pack(">3I", 2, 28, 28) + b"\0" * 100)
    with pytest.raises(ValueError, match="header says shape"):
        fm.read_idx(short)


def test_fashion_mnist_partitions_into_3000_clients_of_20(tmp_path: Path) -> None:
    _debian_or_skip()
    spec = DataSpec(dataset="fashion-mnist", partitioner="iid")
    sizes = [len(load_partition(spec, i, 3000)) for i in (0, 1, 2999)]
    assert sizes == [20, 20, 20]


# ----------------------------------------------------------------------------- hf: local copies


def _hub_like(n: int, *, kind: str, seed: int = 0):
    """A small ``datasets.Dataset`` with the features of the Hub's FEMNIST / CIFAR-10 / MNIST."""
    import datasets
    from PIL import Image

    rng = np.random.default_rng(seed)
    if kind == "cifar":
        pixels = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        feats = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
        data = {"img": [Image.fromarray(p, mode="RGB") for p in pixels],
                "label": rng.integers(0, 10, n).tolist()}
    else:
        pixels = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        if kind == "femnist":  # flwrlabs/femnist: image, writer_id, hsf_id, character (62 classes)
            feats = datasets.Features({
                "image": datasets.Image(), "writer_id": datasets.Value("string"),
                "hsf_id": datasets.Value("int64"), "character": datasets.ClassLabel(num_classes=62),
            })
            data = {"image": [Image.fromarray(p, mode="L") for p in pixels],
                    "writer_id": [f"f{int(w):04d}_{int(w) % 7:02d}" for w in rng.integers(0, 5, n)],
                    "hsf_id": [0] * n, "character": rng.integers(0, 20, n).tolist()}
        else:  # ylecun/mnist, zalando-datasets/fashion_mnist: image, label
            feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
            data = {"image": [Image.fromarray(p, mode="L") for p in pixels],
                    "label": rng.integers(0, 10, n).tolist()}
    return datasets.Dataset.from_dict(data, features=feats), pixels


def test_femnist_saved_to_disk_loads_with_its_natural_writer_partition(tmp_path: Path) -> None:
    ds, pixels = _hub_like(60, kind="femnist")
    ds.save_to_disk(str(tmp_path / "femnist"))
    name = f"hf:{tmp_path / 'femnist'}"

    train, test = load_dataset(name, seed=0, test_fraction=0.25)  # no test split: 25% held out
    assert len(train) == 45 and len(test) == 15 and train.num_classes == 62
    assert train.x.shape[1:] == (1, 28, 28)
    writers = np.unique(np.asarray(ds["writer_id"]))
    spec = DataSpec(dataset=name, partitioner="natural", test_fraction=0.25)
    parts = [load_partition(spec, k, len(writers)) for k in range(len(writers))]
    # partition k is exactly the held-in examples of the k-th writer (sorted ids), through
    # flwr-datasets' NaturalIdPartitioner; together they are the training split
    assert sum(len(p) for p in parts) == len(train)
    for k, part in enumerate(parts):
        assert np.all(part.groups == k)
        mine = np.flatnonzero(np.asarray(ds["writer_id"]) == writers[k])
        rows = {pixels[i].tobytes() for i in mine}
        assert all((np.rint(img[0] * 255).astype(np.uint8)).tobytes() in rows for img in part.x)
    with pytest.raises(ValueError, match="natural clients"):
        load_partition(spec, 0, len(writers) + 1)


def test_cifar_like_parquet_in_the_hubs_layout_goes_through_federated_dataset(tmp_path: Path) -> None:
    train_ds, train_px = _hub_like(24, kind="cifar", seed=1)
    test_ds, test_px = _hub_like(8, kind="cifar", seed=2)
    (tmp_path / "data").mkdir()
    train_ds.to_parquet(str(tmp_path / "data" / "train-00000-of-00001.parquet"))
    test_ds.to_parquet(str(tmp_path / "data" / "test-00000-of-00001.parquet"))

    train, test = load_dataset(f"hf:{tmp_path}", seed=0, test_fraction=0.2)

    assert train.x.shape == (24, 3, 32, 32) and test.x.shape == (8, 3, 32, 32)
    np.testing.assert_allclose(np.transpose(train.x, (0, 2, 3, 1)) * 255, train_px, atol=1e-3)
    np.testing.assert_array_equal(test.y, test_ds["label"])
    assert train.num_classes == 10 and train.groups is None


def test_mnist_like_dataset_dict_uses_its_test_split(tmp_path: Path) -> None:
    import datasets

    tr, tr_px = _hub_like(20, kind="mnist", seed=3)
    te, _ = _hub_like(6, kind="mnist", seed=4)
    datasets.DatasetDict({"train": tr, "test": te}).save_to_disk(str(tmp_path / "mnist"))

    train, test = load_dataset(f"hf:{tmp_path / 'mnist'}", seed=0, test_fraction=0.2)

    assert len(train) == 20 and len(test) == 6
    np.testing.assert_allclose(train.x[:, 0] * 255, tr_px, atol=1e-3)
    assert RunConfig(dataset=f"hf:{tmp_path / 'mnist'}", model="convnet").model == "convnet"


def test_hub_names_fail_fast_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedprivacy.ml.datasets import hf

    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    if hf._hub_reachable(timeout=1.0):
        pytest.skip("the Hugging Face Hub is reachable")
    with pytest.raises(RuntimeError, match="unreachable"):
        load_dataset("hf:flwrlabs/femnist", seed=0, test_fraction=0.2)
    with pytest.raises(RuntimeError, match="does not exist"):
        load_dataset("hf:/no/such/folder", seed=0, test_fraction=0.2)
