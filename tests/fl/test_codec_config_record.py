"""``codec.config_record`` builds the ConfigRecord Flower's constructor builds, or lets Flower decide."""

from __future__ import annotations

import enum
import pickle

import numpy as np
import pytest
from flwr.app import ConfigRecord
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivacy_flwr import codec

_SCALAR = st.one_of(st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False), st.text(max_size=5),
                    st.binary(max_size=5), st.booleans())
_VALUE = st.one_of(_SCALAR, st.lists(st.integers(0, 2**64 - 1), max_size=4),
                   st.lists(st.binary(max_size=4), max_size=4), st.lists(st.booleans(), max_size=3),
                   st.lists(st.text(max_size=3), max_size=3), st.lists(st.floats(allow_nan=False), max_size=3))


class _Colour(enum.IntEnum):
    RED = 1


@settings(max_examples=300, deadline=None)
@given(fields=st.dictionaries(st.text(max_size=8), _VALUE, max_size=12))
def test_record_equals_flowers_and_holds_the_same_value_objects(fields: dict) -> None:
    ours, theirs = codec.config_record(fields), ConfigRecord(dict(fields))
    assert type(ours) is ConfigRecord and ours == theirs and list(ours) == list(theirs)
    assert all(ours[k] is fields[k] for k in fields)
    assert ours.__dict__.keys() == theirs.__dict__.keys() and ours.is_dirty == theirs.is_dirty
    assert ours.object_id == theirs.object_id and pickle.loads(pickle.dumps(ours)) == theirs
    ours["late"] = 1  # still Flower's record: later writes are checked
    with pytest.raises(TypeError):
        ours["bad"] = object()  # type: ignore[assignment]


@pytest.mark.parametrize("value", [np.float64(1.5), _Colour.RED, [np.int64(3)], [True, 1], [1, True]])
def test_subclasses_and_mixed_lists_are_flowers_to_decide(value: object) -> None:
    try:
        want = ConfigRecord({"v": value})  # type: ignore[dict-item]
    except TypeError as exc:
        with pytest.raises(TypeError, match=str(exc)[:20]):
            codec.config_record({"v": value})
        return
    assert codec.config_record({"v": value}) == want


@pytest.mark.parametrize("fields", [{"v": object()}, {"v": [1, "a"]}, {"v": [object()]}, {1: 2}, {"v": None}])
def test_what_flower_refuses_is_refused_with_flowers_error(fields: dict) -> None:
    with pytest.raises(TypeError) as theirs:
        ConfigRecord(dict(fields))
    with pytest.raises(TypeError) as ours:
        codec.config_record(fields)
    assert str(ours.value) == str(theirs.value)
