"""The masked upload on the wire: b-bit residues packed to ceil(m b / 8) bytes (the upload goal)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import RecordDict

from fedprivacy.config import RunConfig
from fedprivacy.secagg.messages import MaskedInput
from fedprivacy_flwr.secagg_records import from_records, to_records


def _masked(m: int, bits: int, seed: int = 0) -> MaskedInput:
    rng = np.random.default_rng(seed)
    vec = rng.integers(0, 1 << bits, size=m, dtype=np.uint64).astype(np.uint32)
    return MaskedInput(round=3, node_id=7, masked=vec, peers=[1, 2], rejected=[], signature=b"s",
                       design=b"d")


@pytest.mark.parametrize("bits", [16, 20, 32])
def test_the_masked_upload_is_packed_and_round_trips(bits: int) -> None:
    m = 4096
    msg = _masked(m, bits)
    content = to_records("masked", msg, modulus_bits=bits)
    (payload,) = content["secagg-masked"].values()
    # the payload is the packed bytes plus numpy's 128-byte header
    assert len(payload.data) - 128 == m * bits // 8
    back = from_records(RecordDict(content), stage="masked")
    assert np.array_equal(back.masked, msg.masked) and back.masked.dtype == np.uint32
    assert back.peers == msg.peers and back.design == msg.design


def test_the_default_upload_meets_two_and_a_half_bytes_per_coordinate() -> None:
    bits = RunConfig().secagg_bits
    m = 1 << 17  # the engine's padded size of a 100k-parameter model
    content = to_records("masked", _masked(m, bits), modulus_bits=bits)
    (payload,) = content["secagg-masked"].values()
    assert bits == 20 and len(payload.data) / m <= 2.5 + 1e-3


@pytest.mark.parametrize("tamper", [{"count": 4095}, {"packed_bits": 16}, {"packed_bits": True}])
def test_a_packed_upload_that_does_not_match_its_description_is_refused(tamper: dict) -> None:
    content = to_records("masked", _masked(4096, 20), modulus_bits=20)
    fields = dict(content["secagg"])
    fields.update(tamper)
    from flwr.app import ConfigRecord

    content["secagg"] = ConfigRecord(fields)
    with pytest.raises(ValueError):
        from_records(RecordDict(content), stage="masked")


def test_a_residue_beyond_the_ring_cannot_be_packed() -> None:
    msg = _masked(64, 32)
    with pytest.raises(ValueError, match="< 2\\^20"):
        to_records("masked", msg, modulus_bits=20)
