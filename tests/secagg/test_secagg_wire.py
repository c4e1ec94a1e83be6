"""Every protocol message survives the flat encoding; malformed fields are refused."""

import numpy as np
import pytest

from fedprivacy.secagg.local import run_round
from fedprivacy.secagg.messages import MaskedInput, SetupRequest
from fedprivacy.secagg.wire import MESSAGE_TYPES, decode, encode


def test_roundtrip_of_every_message_in_a_round() -> None:
    setup = SetupRequest(round=2, threshold=4, degree=4, dim=8, active=True, colluders=1)
    transcript: list = [setup]
    inputs = {i: np.arange(8, dtype=np.uint32) for i in range(5)}
    run_round(setup, inputs, transcript=transcript)
    kinds = set()
    for msg in transcript:
        kind, fields = encode(msg)
        kinds.add(kind)
        for v in fields.values():
            assert isinstance(v, int | bool | bytes | list | np.ndarray)
        back = decode(kind, fields)
        if isinstance(msg, MaskedInput):
            assert np.array_equal(back.masked, msg.masked) and back.node_id == msg.node_id
        else:
            assert back == msg
    assert kinds == set(MESSAGE_TYPES)


def test_decode_refuses_wrong_types_and_unknown_fields() -> None:
    kind, fields = encode(SetupRequest(round=1, threshold=3, degree=4, dim=8))
    with pytest.raises(TypeError):
        decode(kind, {**fields, "round": "1"})
    with pytest.raises(ValueError):
        decode(kind, {**fields, "secret": b"x"})
    with pytest.raises(ValueError):
        decode("secagg.nope", fields)
    with pytest.raises(TypeError, match="active"):
        decode(kind, {**fields, "active": 1})  # a bool field takes no int
    with pytest.raises(TypeError, match="round"):
        decode(kind, {**fields, "round": True})  # an int field takes no bool
