"""``codec.record_dict`` / ``metric_record`` / ``arrays_to_record`` build what Flower's constructors
build (without their per-entry checks), or let Flower decide."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivacy_flwr import codec

_METRIC = st.one_of(st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False))


def _same(ours: object, theirs: object) -> None:
    assert type(ours) is type(theirs) and ours == theirs and list(ours) == list(theirs)  # type: ignore[call-overload]
    assert ours.__dict__.keys() == theirs.__dict__.keys()
    assert ours.is_dirty == theirs.is_dirty if hasattr(theirs, "is_dirty") else True  # type: ignore[attr-defined]
    assert pickle.loads(pickle.dumps(ours)) == theirs


@settings(max_examples=200, deadline=None)
@given(fields=st.dictionaries(st.text(max_size=8), _METRIC, max_size=8))
def test_metric_record_equals_flowers(fields: dict) -> None:
    ours, theirs = codec.metric_record(fields), MetricRecord(dict(fields))
    _same(ours, theirs)
    assert ours.object_id == theirs.object_id and all(ours[k] is fields[k] for k in fields)
    with pytest.raises(TypeError):
        ours["bad"] = "text"  # type: ignore[assignment]  # still Flower's record: later writes checked


@pytest.mark.parametrize("value", [True, np.float64(1.5), [1, 2], [1.0, 2], [], "text", None, np.int64(3)])
def test_metric_values_other_than_exact_scalars_are_flowers_to_decide(value: object) -> None:
    try:
        want = MetricRecord({"v": value})  # type: ignore[dict-item]
    except TypeError as exc:
        with pytest.raises(TypeError) as got:
            codec.metric_record({"v": value})
        assert str(got.value) == str(exc)
        return
    _same(codec.metric_record({"v": value}), want)


@settings(max_examples=100, deadline=None)
@given(kinds=st.lists(st.sampled_from(["array", "metric", "config"]), max_size=6), data=st.data())
def test_record_dict_equals_flowers_and_holds_the_same_records(kinds: list[str], data) -> None:
    make = {"array": lambda: codec.arrays_to_record([np.arange(3, dtype=np.float32)]),
            "metric": lambda: MetricRecord({"m": 1.0}), "config": lambda: ConfigRecord({"c": "x"})}
    records = {data.draw(st.text(max_size=6)): make[k]() for k in kinds}
    ours, theirs = codec.record_dict(records), RecordDict(dict(records))
    _same(ours, theirs)
    assert ours.object_id == theirs.object_id and all(ours[k] is records[k] for k in records)
    with pytest.raises(TypeError):
        ours["bad"] = {"not": "a record"}  # type: ignore[assignment]


class _MyConfig(ConfigRecord):
    pass


@pytest.mark.parametrize("records", [{"v": {"a": 1}}, {1: ConfigRecord()}, {"v": None}, {"v": _MyConfig({"a": 1})}])
def test_record_dict_leaves_anything_else_to_flower(records: dict) -> None:
    try:
        want = RecordDict(dict(records))
    except TypeError as exc:
        with pytest.raises(TypeError) as got:
            codec.record_dict(records)
        assert str(got.value) == str(exc)
        return
    _same(codec.record_dict(records), want)


@pytest.mark.parametrize("n", [0, 1, 4])
def test_arrays_to_record_is_the_record_setitem_builds(n: int) -> None:
    arrays = [np.full((2, i + 1), i, dtype=np.float32) for i in range(n)]
    ours = codec.arrays_to_record(arrays)
    theirs = ArrayRecord()
    for i, a in enumerate(arrays):
        theirs[str(i)] = Array.from_numpy_ndarray(a)
    _same(ours, theirs)
    assert ours.object_id == theirs.object_id
    assert ours == ArrayRecord(arrays) and ours.object_id == ArrayRecord(arrays).object_id  # type: ignore[arg-type]
