"""Known-answer and property tests of the secagg primitives: keys, Shamir, PRG, graph, ring, rotation."""

import hashlib
import hmac

import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.linalg import hadamard

from fedprivacy.dp.rng import RandomSource
from fedprivacy.secagg import shamir
from fedprivacy.secagg.graph import check_safe, harary_neighbours, min_safe_threshold
from fedprivacy.secagg.keys import (
    KeyPair,
    SealError,
    Secret,
    context_bytes,
    derive_key,
    open_sealed,
    public_from_private,
    seal,
)
from fedprivacy.secagg.prg import CHUNK_WORDS, apply_masks, expand_mask
from fedprivacy.secagg.quantize import check_headroom, from_ring, stochastic_round, to_ring
from fedprivacy.secagg.rotation import fwht, inverse_rotate, rotate

# RFC 7748, section 6.1
ALICE_SK = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
ALICE_PK = bytes.fromhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
BOB_SK = bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
BOB_PK = bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
SHARED = bytes.fromhex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")


def _hkdf_reference(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 written out with hmac, independent of cryptography's HKDF."""
    prk = hmac.new(salt or bytes(32), ikm, hashlib.sha256).digest()
    okm, block, i = b"", b"", 1
    while len(okm) < length:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        okm += block
        i += 1
    return okm[:length]


def test_x25519_rfc7748_vectors() -> None:
    assert public_from_private(ALICE_SK) == ALICE_PK
    assert public_from_private(BOB_SK) == BOB_PK
    a = X25519PrivateKey.from_private_bytes(ALICE_SK)
    assert a.exchange(X25519PublicKey.from_public_bytes(BOB_PK)) == SHARED


def test_hkdf_rfc5869_case_1() -> None:
    ikm = bytes([0x0B] * 22)
    salt = bytes(range(13))
    info = bytes(range(0xF0, 0xFA))
    okm = bytes.fromhex("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
                        "34007208d5b887185865")
    got = HKDF(algorithm=hashes.SHA256(), length=42, salt=salt, info=info).derive(ikm)
    assert got == okm
    assert _hkdf_reference(ikm, salt, info, 42) == okm


def test_derive_key_is_x25519_then_hkdf_with_purpose_label() -> None:
    ctx = context_bytes(round=7, sender=1, receiver=2)
    k_ab = derive_key(ALICE_SK, BOB_PK, purpose="mask", context=ctx)
    k_ba = derive_key(Secret(BOB_SK), ALICE_PK, purpose="mask", context=ctx)
    assert k_ab == k_ba == _hkdf_reference(SHARED, ctx, b"fedprivacy/v1/mask", 32)
    assert derive_key(ALICE_SK, BOB_PK, purpose="share-seal", context=ctx) != k_ab
    other_round = context_bytes(round=8, sender=1, receiver=2)
    assert derive_key(ALICE_SK, BOB_PK, purpose="mask", context=other_round) != k_ab


def test_seal_binds_round_sender_receiver_and_detects_tampering() -> None:
    key = bytes(range(32))
    ctx = context_bytes(round=1, sender=3, receiver=4)
    ct = seal(key, b"share", purpose="share-seal", context=ctx)
    assert open_sealed(key, ct, purpose="share-seal", context=ctx) == b"share"
    assert seal(key, b"share", purpose="share-seal", context=ctx) != ct  # fresh nonce
    for bad in (context_bytes(round=2, sender=3, receiver=4),
                context_bytes(round=1, sender=4, receiver=3)):
        with pytest.raises(SealError):
            open_sealed(key, ct, purpose="share-seal", context=bad)
    tampered = bytearray(ct)
    tampered[-20] ^= 1
    with pytest.raises(SealError):
        open_sealed(key, bytes(tampered), purpose="share-seal", context=ctx)


def test_secrets_never_in_repr() -> None:
    kp = KeyPair.generate()
    raw = kp.private.reveal()
    for text in (repr(kp), str(kp.private), repr(Secret(raw))):
        assert raw.hex() not in text and str(raw) not in text
    with pytest.raises(TypeError):
        import pickle

        pickle.dumps(kp.private)


# ------------------------------------------------------------------ Shamir
@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 12), data=st.data())
def test_shamir_any_t_shares_reconstruct(n: int, data: st.DataObject) -> None:
    t = data.draw(st.integers(1, n))
    secret = data.draw(st.integers(0, 2**256 - 1))
    xs = data.draw(st.lists(st.integers(1, 2**64), min_size=n, max_size=n, unique=True))
    shares = shamir.split(secret, threshold=t, xs=xs)
    subset = data.draw(st.lists(st.sampled_from(range(n)), min_size=t, max_size=t, unique=True))
    pts = [(xs[i], shares[i]) for i in subset]
    assert shamir.reconstruct(pts, threshold=t) == secret
    with pytest.raises(ValueError):
        shamir.reconstruct(pts[:-1], threshold=t)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(3, 10), data=st.data())
def test_shamir_t_minus_1_shares_fit_every_secret(n: int, data: st.DataObject) -> None:
    """Any t-1 shares are consistent with any candidate secret: exactly one polynomial of degree < t
    passes through (0, candidate) and them, so the shares carry no information about the secret."""
    t = data.draw(st.integers(2, n))
    secret = data.draw(st.integers(0, 2**256 - 1))
    candidate = data.draw(st.integers(0, 2**256 - 1))
    xs = list(range(1, n + 1))
    shares = shamir.split(secret, threshold=t, xs=xs)
    known = [(xs[i], shares[i]) for i in range(t - 1)]
    poly_pts = [(0, candidate), *known]  # t points define a polynomial of degree < t
    for x, y in known:
        assert shamir.interpolate(poly_pts, at=x) == y
    assert shamir.interpolate(poly_pts, at=0) == candidate
    # and the remaining shares of *that* polynomial are all valid field elements differing from
    # the true ones unless candidate == secret
    if candidate != secret:
        assert shamir.interpolate(poly_pts, at=xs[t - 1]) != shares[t - 1]


def test_shamir_encoding_refuses_non_field_values() -> None:
    assert shamir.decode_share(shamir.encode_share(12345)) == 12345
    with pytest.raises(ValueError):
        shamir.decode_share(b"\xff" * shamir.SHARE_BYTES)
    with pytest.raises(ValueError):
        shamir.decode_share(b"\x00" * 3)


# ------------------------------------------------------------------ PRG
def test_mask_is_aes256_ctr_keystream_little_endian_words() -> None:
    seed = bytes(range(32))
    ecb = Cipher(algorithms.AES(seed), modes.ECB()).encryptor()
    blocks = b"".join(ecb.update(i.to_bytes(16, "big")) for i in range(4))
    expected = np.frombuffer(blocks, dtype="<u4")
    assert np.array_equal(expand_mask(seed, dim=16), expected)
    assert np.array_equal(expand_mask(seed, dim=16, modulus_bits=20), expected & (2**20 - 1))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 6), bits=st.integers(16, 32), dim=st.integers(1, 300),
       seed=st.binary(min_size=32, max_size=32))
def test_pairwise_masks_cancel_mod_2b(n: int, bits: int, dim: int, seed: bytes) -> None:
    pair = {(i, j): hashlib.sha256(seed + bytes([i, j])).digest()
            for i in range(n) for j in range(i + 1, n)}
    total = np.zeros(dim, dtype=np.uint32)
    inputs = [(np.arange(dim, dtype=np.uint64) * (i + 1) % (2**bits)).astype(np.uint32) for i in range(n)]
    for i in range(n):
        y = inputs[i].copy()
        add = [pair[(i, j)] for j in range(i + 1, n)]
        sub = [pair[(j, i)] for j in range(i)]
        apply_masks(y, add=add, subtract=sub, modulus_bits=bits)
        np.add(total, y, out=total)
    expected = np.sum(np.stack(inputs).astype(np.uint64), axis=0) % (2**bits)
    assert np.array_equal(total & np.uint32(2**bits - 1), expected.astype(np.uint32))


def test_apply_masks_matches_expand_across_chunks() -> None:
    dim = CHUNK_WORDS + 123
    a, b = b"a" * 32, b"b" * 32
    y = np.zeros(dim, dtype=np.uint32)
    apply_masks(y, add=[a], subtract=[b])
    assert np.array_equal(y, expand_mask(a, dim=dim) - expand_mask(b, dim=dim))


def test_apply_masks_with_many_seeds_of_both_signs_matches_reference() -> None:
    dim = 3 * CHUNK_WORDS // 2
    add = [bytes([i]) * 32 for i in range(11)]
    sub = [bytes([100 + i]) * 32 for i in range(9)]
    ref = np.full(dim, 5, dtype=np.uint64)
    for s in add:
        ref += expand_mask(s, dim=dim)
    for s in sub:
        ref += 2**32 - expand_mask(s, dim=dim).astype(np.uint64)
    base = np.full(dim, 5, dtype=np.uint32)
    y = np.empty(dim, dtype=np.uint32)
    apply_masks(base, add=add, subtract=sub, modulus_bits=30, out=y)
    assert np.array_equal(y, (ref % 2**30).astype(np.uint32))
    assert np.all(base == 5)


def test_prg_refuses_short_seed() -> None:
    with pytest.raises(ValueError, match="256 bits"):
        expand_mask(b"x" * 4, dim=4)


# ------------------------------------------------------------------ graph
@settings(max_examples=30, deadline=None)
@given(n=st.integers(3, 40), k=st.integers(2, 45), seed=st.binary(min_size=32, max_size=32))
def test_harary_graph_is_regular_and_symmetric(n: int, k: int, seed: bytes) -> None:
    ids = list(range(100, 100 + n))
    nb = harary_neighbours(ids, degree=k, seed=seed)
    degrees = {len(v) for v in nb.values()}
    assert len(degrees) == 1
    d = degrees.pop()
    assert d >= min(k, n - 1)
    assert d <= min(k + 1, n - 1)
    for i, ns in nb.items():
        assert i not in ns
        assert all(i in nb[j] for j in ns)


def test_check_safe_refuses_low_thresholds_and_degrees() -> None:
    assert check_safe(num_clients=100, degree=7, threshold=5) == 7
    with pytest.raises(ValueError, match="threshold must be >"):
        check_safe(num_clients=100, degree=7, threshold=4)
    with pytest.raises(ValueError, match="threshold must be <="):
        check_safe(num_clients=100, degree=8, threshold=10)
    with pytest.raises(ValueError, match="degree must be >= 2"):
        check_safe(num_clients=100, degree=1, threshold=1)
    with pytest.raises(ValueError, match="colluders"):
        check_safe(num_clients=100, degree=8, threshold=5, colluders=1)
    # k > c: two colluding neighbours of a degree-2 client know all of its pairwise masks
    with pytest.raises(ValueError, match="degree must be > colluders"):
        check_safe(num_clients=10, degree=2, threshold=3, colluders=2)
    assert min_safe_threshold(99) == 51  # complete graph on 100: t > n/2


# ------------------------------------------------------------------ ring, rounding, rotation
@settings(max_examples=40, deadline=None)
@given(bits=st.integers(16, 32), vals=st.lists(st.integers(-(2**15), 2**15 - 1), min_size=1))
def test_ring_roundtrip(bits: int, vals: list[int]) -> None:
    q = np.array(vals, dtype=np.int64)
    assert np.array_equal(from_ring(to_ring(q, modulus_bits=bits), modulus_bits=bits), q)


def test_stochastic_rounding_is_unbiased_and_within_one() -> None:
    rng = RandomSource.seeded(3)
    x = np.full(200_000, 0.3)
    r = stochastic_round(x, rng=rng)
    assert set(np.unique(r)) <= {0, 1}
    assert abs(r.mean() - 0.3) < 5 * np.sqrt(0.21 / x.size)


def test_headroom_refuses_wrapping_configurations_with_reason() -> None:
    check_headroom(num_clients=100, clip_norm=1.0, scale=2**20, modulus_bits=32)
    with pytest.raises(ValueError, match="could wrap mod 2\\^32.*worst case"):
        check_headroom(num_clients=3000, clip_norm=1.0, scale=2**20, modulus_bits=32)
    with pytest.raises(ValueError, match="noise tail"):
        check_headroom(num_clients=10, clip_norm=1.0, scale=100.0, modulus_bits=16, dim=1000,
                       rotated=True, noise_variance_total=1e8)
    h = check_headroom(num_clients=100, clip_norm=1.0, scale=2**22, modulus_bits=32, dim=2**20,
                       rotated=True, noise_variance_total=1e6)
    assert h.bound < h.limit


def test_fwht_matches_hadamard_matrix_and_rotation_inverts() -> None:
    rng = RandomSource.seeded(1)
    x = rng.uniform(size=16)
    assert np.allclose(fwht(x), hadamard(16) @ x / 4.0)
    v = rng.uniform(size=1000) - 0.5
    seed = b"s" * 32
    r = rotate(v, seed=seed)
    assert r.shape == (1024,)
    assert np.isclose(np.linalg.norm(r), np.linalg.norm(v))
    assert np.allclose(inverse_rotate(r, seed=seed, dim=1000), v)
