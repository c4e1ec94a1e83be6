"""Packed b-bit residues: round trip for every width, exact sizes, malformed payloads refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivacy.secagg.packing import pack_residues, packed_size, unpack_residues


@settings(max_examples=200, deadline=None)
@given(st.integers(8, 32), st.integers(0, 70), st.integers(0, 2**32 - 1))
def test_round_trip_and_size(bits: int, count: int, seed: int) -> None:
    v = np.random.default_rng(seed).integers(0, 1 << bits, size=count, dtype=np.uint64).astype(np.uint32)
    data = pack_residues(v, modulus_bits=bits)
    assert len(data) == packed_size(count, modulus_bits=bits) == (count * bits + 7) // 8
    assert np.array_equal(unpack_residues(data, count=count, modulus_bits=bits), v)


def test_bytes_per_coordinate_at_16_and_20_bits() -> None:
    m = 1 << 20
    assert packed_size(m, modulus_bits=16) / m == 2.0
    assert packed_size(m, modulus_bits=20) / m == 2.5


def test_layout_is_a_little_endian_bit_stream() -> None:
    v = np.array([0xABC, 0x123], dtype=np.uint32)  # 12 bits each: 0x123ABC little-endian
    assert pack_residues(v, modulus_bits=12) == bytes([0xBC, 0x3A, 0x12])
    assert pack_residues(np.array([1], dtype=np.uint32), modulus_bits=9) == bytes([1, 0])


@pytest.mark.parametrize("bits", [12, 18, 20])
def test_malformed_payloads_are_refused(bits: int) -> None:
    v = np.arange(5, dtype=np.uint32)
    data = pack_residues(v, modulus_bits=bits)
    with pytest.raises(ValueError, match="bytes"):
        unpack_residues(data + b"\x00", count=5, modulus_bits=bits)
    if (5 * bits) % 8:
        bad = data[:-1] + bytes([data[-1] | 0x80])
        with pytest.raises(ValueError, match="padding"):
            unpack_residues(bad, count=5, modulus_bits=bits)
    with pytest.raises(ValueError, match="< 2\\^"):
        pack_residues(np.array([1 << bits], dtype=np.uint32), modulus_bits=bits)
