"""The fast ArrayRecord codec is byte-compatible with Flower's own (np.save / np.load) both ways."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivacy_flwr import codec

DTYPES = [np.float32, np.float64, np.int64, np.uint32, np.int8, np.bool_, np.dtype(">f4")]


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(0, 7), min_size=1, max_size=3), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**31))
def test_encoding_is_byte_identical_to_flowers_and_decodes_both_ways(shape: list[int], dtype: object,
                                                                     seed: int) -> None:
    a = (np.random.default_rng(seed).normal(size=shape) * 100).astype(dtype)
    ours = codec.arrays_to_record([a, a[..., ::-1]])  # a non-contiguous view too
    theirs = ArrayRecord.from_numpy_ndarrays([a, np.ascontiguousarray(a[..., ::-1])])
    assert list(ours.keys()) == list(theirs.keys()) == ["0", "1"]
    for k in ours:
        x, y = ours[k], theirs[k]
        assert (x.dtype, tuple(x.shape), x.stype, x.data) == (y.dtype, tuple(y.shape), y.stype, y.data)
        # the same Flower object (built without Array's constructor): equal, same content id and
        # dirty flag, and it survives the pickling of the engine's worker pool
        assert pickle.loads(pickle.dumps(x)) == y
        assert x == y and x.is_dirty == y.is_dirty and x.object_id == y.object_id
    for got, want in zip(codec.record_to_arrays(theirs), theirs.to_numpy_ndarrays(), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)


def test_a_header_other_than_np_saves_takes_flowers_own_load() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    buf = io.BytesIO()
    np.save(buf, np.asfortranarray(a), allow_pickle=False)  # Fortran order: another header
    fortran = Array(dtype="float32", shape=(3, 4), stype="numpy.ndarray", data=buf.getvalue())
    assert np.array_equal(codec.record_to_arrays(ArrayRecord({"0": fortran}))[0], a)
    lying = Array(dtype="float32", shape=(4, 3), stype="numpy.ndarray",
                  data=codec.arrays_to_record([a])["0"].data)  # declared shape != header's
    got = codec.record_to_arrays(ArrayRecord({"0": lying}))[0]
    assert got.shape == (3, 4)  # what np.load reads, as before
    truncated = Array(dtype="float32", shape=(3, 4), stype="numpy.ndarray", data=lying.data[:-4])
    with pytest.raises(ValueError):
        codec.record_to_arrays(ArrayRecord({"0": truncated}))


def test_decoded_arrays_are_read_only_views() -> None:
    got = codec.record_to_arrays(codec.arrays_to_record([np.ones(5)]))[0]
    assert not got.flags.writeable
    with pytest.raises(ValueError):
        got[0] = 2.0
