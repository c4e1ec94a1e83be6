"""The on-disk caches (partitions, the digits split): same results, keyed by their inputs, robust to bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedprivacy.ml import diskcache
from fedprivacy.ml import partition as part


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FEDPRIVACY_CACHE_DIR", str(tmp_path))
    part._partitions_cached.cache_clear()
    yield tmp_path
    part._partitions_cached.cache_clear()


def _files(root: Path) -> list[Path]:
    return sorted((root / "partitions").glob("*.npz"))


def _no_partitioning(*args: object, **kwargs: object) -> list[np.ndarray]:
    raise AssertionError("the partitions should have come from the disk cache")


@pytest.mark.parametrize("partitioner", ["iid", "dirichlet"])
def test_a_second_process_reads_the_same_partitions_from_disk(cache: Path, partitioner: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    spec = part.DataSpec(dataset="digits", seed=3, partitioner=partitioner)
    first = part._partitions_cached(spec, 40)
    assert len(_files(cache)) == 1
    part._partitions_cached.cache_clear()  # as a fresh process would start
    monkeypatch.setattr(part, "partition", _no_partitioning)
    again = part._partitions_cached(spec, 40)
    assert len(again) == 40 and all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert all(not p.flags.writeable for p in again)


def test_the_key_covers_the_inputs(cache: Path) -> None:
    for spec, n in ((part.DataSpec(seed=1), 20), (part.DataSpec(seed=2), 20), (part.DataSpec(seed=1), 21),
                    (part.DataSpec(seed=1, partitioner="dirichlet", dirichlet_alpha=0.3), 20)):
        part._partitions_cached(spec, n)
    assert len(_files(cache)) == 4


def test_a_corrupt_or_foreign_file_is_recomputed_and_rewritten(cache: Path) -> None:
    spec = part.DataSpec(seed=5)
    want = part._partitions_cached(spec, 30)
    (path,) = _files(cache)
    for bad in (b"not an npz", path.read_bytes()[:100]):
        path.write_bytes(bad)
        part._partitions_cached.cache_clear()
        got = part._partitions_cached(spec, 30)
        assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))
    # a well-formed file whose indices are not a partition (an index twice) is refused too
    lengths = np.array([len(p) for p in want])
    flat = np.concatenate(want)
    flat[1] = flat[0]
    np.savez(path, key=np.array(path.stem), lengths=lengths, flat=flat)
    part._partitions_cached.cache_clear()
    got = part._partitions_cached(spec, 30)
    assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))


def test_an_empty_cache_dir_setting_turns_the_disk_cache_off(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDPRIVACY_CACHE_DIR", "")
    part._partitions_cached.cache_clear()
    assert diskcache.cache_dir() is None
    part._partitions_cached(part.DataSpec(seed=9), 10)
    part._partitions_cached.cache_clear()
    assert not list(tmp_path.rglob("*.npz"))


_DIGITS_PROBE = """
import sys
from fedprivacy.ml.datasets.digits import load_digits_split
train, test = load_digits_split(seed=4, test_fraction=0.25)
print(int("sklearn" in sys.modules), train.x.tobytes().hex()[:64], test.y.sum(), len(train), len(test))
"""


def test_the_digits_split_comes_from_disk_without_importing_sklearn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import subprocess
    import sys

    from fedprivacy.ml.datasets.digits import load_digits_split

    env = {**os.environ, "FEDPRIVACY_CACHE_DIR": str(tmp_path)}

    def probe() -> list[str]:
        out = subprocess.run([sys.executable, "-c", _DIGITS_PROBE], env=env, capture_output=True,
                             text=True, check=True)
        return out.stdout.split()

    first, second = probe(), probe()
    assert first[0] == "1" and second[0] == "0"  # the second process never imports scikit-learn
    assert first[1:] == second[1:]
    monkeypatch.setenv("FEDPRIVACY_CACHE_DIR", str(tmp_path))
    cached = load_digits_split(seed=4, test_fraction=0.25)
    monkeypatch.setenv("FEDPRIVACY_CACHE_DIR", "")
    fresh = load_digits_split(seed=4, test_fraction=0.25)  # computed with scikit-learn
    for a, b in zip(cached, fresh, strict=True):
        assert np.array_equal(a.x, b.x) and a.x.dtype == b.x.dtype
        assert np.array_equal(a.y, b.y) and a.y.dtype == b.y.dtype
