"""The fast encoder paths give bit-identical outputs to the plain step-by-step code.

The plain versions below are the implementations main had before the speed work (8cd920e), kept
here verbatim in substance as the reference: a speed-up must not change one bit of any output or the
random draws it consumes, so seeded runs give the same results and ε before and after.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivacy.dp.clipping import l2_norm
from fedprivacy.dp.discrete import _acceptance, sample_discrete_gaussian
from fedprivacy.dp.rng import RandomSource
from fedprivacy.secagg.ddp import DistributedDPConfig, conditional_round, decode_sum, encode_update
from fedprivacy.secagg.quantize import encode_fixed_point, from_ring, stochastic_round, to_ring
from fedprivacy.secagg.rotation import BLOCK, fwht, inverse_rotate, padded_dim, random_signs, rotate

KEY = bytes(range(32))


# ----------------------------------------------------------------------------- plain references
def _fwht_plain(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    y = np.array(x, dtype=np.float64, copy=True)
    h = 1
    while h < n:
        v = y.reshape(-1, 2, h)
        a = v[:, 0, :].copy()
        v[:, 0, :] += v[:, 1, :]
        np.subtract(a, v[:, 1, :], out=v[:, 1, :])
        h *= 2
    y *= 1.0 / math.sqrt(n)
    return y


def _rotate_plain(x: np.ndarray, seed: bytes) -> np.ndarray:
    m = padded_dim(x.shape[0])
    padded = np.zeros(m, dtype=np.float64)
    padded[: x.shape[0]] = x
    padded *= np.array(random_signs(seed, m))
    return _fwht_plain(padded)


def _inverse_rotate_plain(y: np.ndarray, seed: bytes, dim: int) -> np.ndarray:
    out = _fwht_plain(y)
    out *= np.array(random_signs(seed, y.shape[0]))
    return out[:dim]


def _laplace_plain(src: RandomSource, scale: float, n: int) -> np.ndarray:
    w = src._words(n)
    sign = np.where((w >> np.uint64(63)).astype(bool), -scale, scale)
    w &= np.uint64((1 << 53) - 1)
    u = (w.astype(np.float64) + 1.0) * 2.0**-53
    e = np.log(u)
    e *= -sign
    return e


def _discrete_gaussian_plain(sigma: float, n: int, src: RandomSource) -> np.ndarray:
    t = math.floor(sigma) + 1
    var = sigma * sigma
    shift = var / t
    out = np.empty(n, dtype=np.int64)
    filled = 0
    p_est = _acceptance(sigma, t)
    while filled < n:
        need = min(n - filled, 1 << 16)
        m = int(need / p_est * 1.01 + 6 * math.sqrt(need)) + 64
        lap = src.laplace(scale=float(t), size=m)
        neg = lap < 0
        g = np.floor(np.abs(lap))
        keep = ~(neg & (g == 0.0))
        d = g - shift
        d *= d
        d /= -2.0 * var
        np.exp(d, out=d)
        keep &= src.uniform(m) < d
        y = np.where(neg, -g, g)[keep]
        take = min(len(y), need)
        out[filled : filled + take] = y[:take].astype(np.int64)
        filled += take
        p_est = max(0.05, len(y) / m)
    return out


def _encode_plain(update: np.ndarray, config: DistributedDPConfig, seed: bytes,
                  rng: RandomSource) -> np.ndarray:
    x = np.asarray(update, dtype=np.float64).reshape(-1)
    norm = l2_norm(x)
    if norm > config.clip_norm:
        x = x * (config.clip_norm / norm)
    r = _rotate_plain(x * config.scale, seed)
    bound_sq = config.norm_bound**2
    while True:
        q = _stochastic_round_plain(r, rng)
        qf = q.astype(np.float64)
        if float(np.add.reduce(qf * qf)) <= bound_sq:
            break
    q += _discrete_gaussian_plain(config.local_sigma, q.shape[0], rng)
    return _to_ring_plain(q, config.modulus_bits)


def _stochastic_round_plain(x: np.ndarray, rng: RandomSource) -> np.ndarray:
    lo = np.floor(x)
    up = rng.uniform(size=x.shape) < x - lo
    return lo.astype(np.int64) + up.astype(np.int64)


def _to_ring_plain(q: np.ndarray, bits: int) -> np.ndarray:
    return (q.astype(np.int64) & np.int64((1 << bits) - 1)).astype(np.uint32)


def _encode_fixed_point_plain(x: np.ndarray, clip: float, scale: float, bits: int,
                              rng: RandomSource) -> np.ndarray:
    v = np.asarray(x, dtype=np.float64).reshape(-1)
    norm = l2_norm(v)
    if norm > clip:
        v = v * (clip / norm)
    return _to_ring_plain(_stochastic_round_plain(v * scale, rng), bits)


def _bits(a: np.ndarray) -> np.ndarray:
    """The raw bytes of a float64 array (tells -0.0 from 0.0)."""
    return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)


# ----------------------------------------------------------------------------- rotation
@settings(max_examples=40, deadline=None)
@given(log_n=st.integers(0, 14), seed=st.integers(0, 2**32 - 1))
def test_fwht_is_bit_identical_to_the_plain_loop(log_n: int, seed: int) -> None:
    x = RandomSource.seeded(seed).normal(std=1e3, size=1 << log_n)
    assert np.array_equal(_bits(fwht(x)), _bits(_fwht_plain(x)))


def test_fwht_beyond_one_cache_block_is_bit_identical() -> None:
    x = RandomSource.seeded(1).normal(std=1.0, size=4 * BLOCK)
    assert np.array_equal(_bits(fwht(x)), _bits(_fwht_plain(x)))


@settings(max_examples=30, deadline=None)
@given(dim=st.integers(1, 5000), seed=st.integers(0, 2**32 - 1))
def test_rotation_and_inverse_are_bit_identical_to_the_plain_code(dim: int, seed: int) -> None:
    src = RandomSource.seeded(seed)
    x = src.normal(std=100.0, size=dim)
    rseed = src.random_bytes(32)
    r = rotate(x, seed=rseed)
    assert np.array_equal(_bits(r), _bits(_rotate_plain(x, rseed)))  # incl. -0.0 in the padding
    assert np.array_equal(_bits(inverse_rotate(r, seed=rseed, dim=dim)),
                          _bits(_inverse_rotate_plain(r, rseed, dim)))


def test_rotation_beyond_one_cache_block_with_padding_is_bit_identical() -> None:
    for dim in (BLOCK + 100, 2 * BLOCK + 1, 3 * BLOCK):  # padding inside a block, whole padded blocks
        src = RandomSource.seeded(dim)
        x = src.normal(std=10.0, size=dim)
        rseed = src.random_bytes(32)
        r = rotate(x, seed=rseed)
        assert np.array_equal(_bits(r), _bits(_rotate_plain(x, rseed))), dim
        assert np.array_equal(_bits(inverse_rotate(r, seed=rseed, dim=dim)),
                              _bits(_inverse_rotate_plain(r, rseed, dim))), dim


def test_cached_signs_are_read_only() -> None:
    s = random_signs(KEY, 64)
    assert not s.flags.writeable
    assert random_signs(KEY, 64) is s


# ----------------------------------------------------------------------------- samplers
@settings(max_examples=20, deadline=None)
@given(scale=st.floats(1e-3, 1e6), n=st.integers(1, 3000))
def test_secure_laplace_is_bit_identical_to_the_plain_formula(scale: float, n: int) -> None:
    got = RandomSource._from_key(KEY).laplace(scale=scale, size=n)
    want = _laplace_plain(RandomSource._from_key(KEY), scale, n)
    assert np.array_equal(_bits(got), _bits(want))


def test_discrete_gaussian_is_bit_identical_to_the_plain_sampler() -> None:
    for sigma in (0.3, 1.0, 2.5, 100.0, 1365.33, 5e4):
        for n in (1, 1000, 70_000, 1 << 17):
            for make in (lambda: RandomSource._from_key(KEY), lambda: RandomSource.seeded(4)):
                got = sample_discrete_gaussian(sigma=sigma, size=n, rng=make())
                assert np.array_equal(got, _discrete_gaussian_plain(sigma, n, make())), (sigma, n)


# ----------------------------------------------------------------------------- encoder
def _config(dim: int, *, scale: float, bits: int = 32, beta: float = math.exp(-0.5)) -> DistributedDPConfig:
    return DistributedDPConfig(dim=dim, clip_norm=1.0, noise_multiplier=1.0, min_survivors=5,
                               scale=scale, modulus_bits=bits, max_clients=10, beta=beta)


@settings(max_examples=25, deadline=None)
@given(dim=st.integers(1, 3000), log_scale=st.integers(4, 20), bits=st.sampled_from([20, 24, 32]),
       norm=st.floats(0.01, 10.0), seed=st.integers(0, 2**32 - 1))
def test_encode_update_is_bit_identical_to_the_plain_encoder(dim: int, log_scale: int, bits: int,
                                                             norm: float, seed: int) -> None:
    src = RandomSource.seeded(seed)
    x = src.normal(std=1.0, size=dim)
    x *= norm / max(float(np.linalg.norm(x)), 1e-300)
    rseed = src.random_bytes(32)
    try:
        cfg = _config(dim, scale=2.0**log_scale, bits=bits)
    except ValueError:  # this (scale, bits) could wrap: refused, nothing to compare
        return
    got = encode_update(x, config=cfg, rotation_seed=rseed, rng=RandomSource.seeded(seed + 1))
    want = _encode_plain(x, cfg, rseed, RandomSource.seeded(seed + 1))
    assert got.dtype == np.uint32 and np.array_equal(got, want)
    assert np.array_equal(_bits(decode_sum(got, config=cfg, rotation_seed=rseed)),
                          _bits(_inverse_rotate_plain(from_ring(want, modulus_bits=bits)
                                                      .astype(np.float64), rseed, dim) / cfg.scale))


def test_encode_update_large_model_secure_and_seeded_sources_match_the_plain_encoder() -> None:
    dim = 100_000
    x = RandomSource.seeded(2).normal(std=1.0, size=dim)
    cfg = _config(dim, scale=2.0**12)
    for make in (lambda: RandomSource._from_key(KEY), lambda: RandomSource.seeded(9)):
        got = encode_update(x, config=cfg, rotation_seed=KEY, rng=make())
        assert np.array_equal(got, _encode_plain(x, cfg, KEY, make()))


def test_conditional_round_matches_the_plain_loop_at_large_norms() -> None:
    # C s = 2^27: squared norms beyond 2^53, where float sums round
    r = RandomSource.seeded(3).normal(std=2.0**27 / 32, size=1024)
    bound = float(np.linalg.norm(r)) + 32.0
    got = conditional_round(r, bound=bound, rng=RandomSource.seeded(5), beta=0.5)
    src = RandomSource.seeded(5)
    while True:
        q = stochastic_round(r, rng=src)
        if float(np.add.reduce(q.astype(np.float64) ** 2)) <= bound * bound:
            break
    assert np.array_equal(got, q)


def test_conditional_round_refuses_after_max_tries() -> None:
    r = np.full(16, 0.5)
    try:
        conditional_round(r, bound=0.0, rng=RandomSource.seeded(1), beta=0.5, max_tries=3)
    except RuntimeError as exc:
        assert "3 times" in str(exc)
    else:  # pragma: no cover - the test fails here
        raise AssertionError("conditional_round accepted a norm above the bound")


# ----------------------------------------------------------------------------- fixed point, ring
@settings(max_examples=30, deadline=None)
@given(dim=st.integers(1, 4000), norm=st.floats(0.01, 10.0), log_scale=st.integers(0, 24),
       bits=st.integers(16, 32), seed=st.integers(0, 2**32 - 1))
def test_fixed_point_encoding_is_bit_identical_to_the_plain_code(dim: int, norm: float, log_scale: int,
                                                                 bits: int, seed: int) -> None:
    x = RandomSource.seeded(seed).normal(std=1.0, size=dim)
    x *= norm / max(float(np.linalg.norm(x)), 1e-300)
    got = encode_fixed_point(x, clip_norm=1.0, scale=2.0**log_scale, modulus_bits=bits,
                             rng=RandomSource.seeded(seed + 1))
    want = _encode_fixed_point_plain(x, 1.0, 2.0**log_scale, bits, RandomSource.seeded(seed + 1))
    assert got.dtype == np.uint32 and np.array_equal(got, want)


@settings(max_examples=40, deadline=None)
@given(bits=st.integers(16, 32), vals=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=50),
       dtype=st.sampled_from([np.int64, np.int32, np.uint64, np.uint8]))
def test_to_ring_is_the_plain_reduction_for_every_integer_dtype(bits: int, vals: list[int], dtype: type) -> None:
    info = np.iinfo(dtype)
    q = np.array([v for v in vals if info.min <= v <= info.max] or [0], dtype=dtype)
    assert np.array_equal(to_ring(q, modulus_bits=bits), _to_ring_plain(q, bits))
    assert np.array_equal(stochastic_round(np.array([0.25, -1.5, 3.0]), rng=RandomSource.seeded(1)),
                          _stochastic_round_plain(np.array([0.25, -1.5, 3.0]), RandomSource.seeded(1)))


def test_conditional_round_with_retries_across_chunks_draws_the_same_stream() -> None:
    # a bound near the median norm: about half the tries fail, some fail in their first chunk
    from fedprivacy.secagg.ddp import _CHUNK

    r = RandomSource.seeded(11).uniform(size=3 * _CHUNK + 5) * 4.0 - 2.0
    lo = np.floor(r)
    frac = r - lo
    mean_sq = float(np.sum(lo * lo + frac * (2 * lo + 1)))
    retried = 0
    for seed in range(12):
        src = RandomSource.seeded(seed)
        tries = 0
        while True:
            tries += 1
            q = _stochastic_round_plain(r, src)
            if float(np.add.reduce(q.astype(np.float64) ** 2)) <= mean_sq:
                break
        retried += tries > 1
        got = conditional_round(r, bound=math.sqrt(mean_sq), rng=RandomSource.seeded(seed), beta=0.5)
        assert np.array_equal(got, q), seed
        # and the stream after the call is where the plain loop left it
        after = RandomSource.seeded(seed)
        conditional_round(r, bound=math.sqrt(mean_sq), rng=after, beta=0.5)
        assert after.uniform() == src.uniform()
    assert retried >= 3  # the retry path really ran


def test_a_try_that_fails_in_its_first_chunk_still_draws_all_its_uniforms() -> None:
    from fedprivacy.secagg.ddp import _CHUNK

    r = np.full(2 * _CHUNK + 7, 3.5)
    src = RandomSource.seeded(2)
    try:
        conditional_round(r, bound=1.0, rng=src, beta=0.5, max_tries=3)
    except RuntimeError:
        pass
    else:  # pragma: no cover - the test fails here
        raise AssertionError("a norm of ~3.5 sqrt(n) passed a bound of 1")
    plain = RandomSource.seeded(2)
    plain.uniform(size=3 * r.shape[0])
    assert src.uniform() == plain.uniform()


def _world_id_plain(setup, roster) -> bytes:  # type: ignore[no-untyped-def]
    """protocol.world_id as written before the glue pass (one hash update per field)."""
    import hashlib
    import struct

    h = hashlib.sha256(b"fedprivacy/v1/world")
    h.update(struct.pack(">QQQQQQQ?", setup.round, setup.threshold, setup.degree, setup.modulus_bits,
                         setup.dim, setup.min_survivors, setup.colluders, setup.active))
    entries = sorted(zip(roster.node_ids, roster.enc_publics, roster.mask_publics, roster.sign_publics,
                         roster.seed_commitments, strict=True))
    h.update(struct.pack(">Q", len(entries)))
    for node_id, *keys in entries:
        h.update(struct.pack(">Q", node_id))
        for k in keys:
            h.update(struct.pack(">H", len(k)) + bytes(k))
    return h.digest()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 2), min_size=1, max_size=40, unique=True), st.randoms(use_true_random=False))
def test_world_id_is_the_plain_hash(ids: list[int], rnd) -> None:  # type: ignore[no-untyped-def]
    from fedprivacy.secagg.messages import SetupRequest, ShareKeysRequest
    from fedprivacy.secagg.transcript import world_id

    def key() -> bytes:
        return bytes(rnd.getrandbits(8) for _ in range(rnd.choice([0, 1, 32, 33])))

    n = len(ids)
    setup = SetupRequest(round=rnd.randint(1, 99), threshold=max(1, n // 2), degree=max(1, n - 1), dim=8,
                         active=rnd.random() < 0.5)
    roster = ShareKeysRequest(round=setup.round, node_ids=ids, enc_publics=[key() for _ in ids],
                              mask_publics=[key() for _ in ids], sign_publics=[key() for _ in ids],
                              seed_commitments=[key() for _ in ids])
    assert world_id(setup, roster) == _world_id_plain(setup, roster)


@settings(max_examples=200, deadline=None)
@given(num=st.integers(1, 10), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_share_rows_are_the_reencoded_rows_of_an_accepted_encoding(num: int, seed: int, data) -> None:
    from fedprivacy.secagg import shamir
    from fedprivacy.secagg.transcript import _share_rows

    xs = list(range(1, 4))
    secrets_ = [np.random.default_rng(seed + i).bytes(32) for i in range(num)]
    blob = shamir.encode_shares(shamir.split_secrets(secrets_, threshold=2, xs=xs)[1])
    rows = shamir.decode_shares(blob, num_secrets=num, secret_bytes=32)
    a = data.draw(st.integers(0, num))
    b = data.draw(st.integers(a, num))
    for holder in (blob, bytearray(blob)):
        got = _share_rows(holder, a, b)
        assert type(got) is bytes and got == shamir.encode_shares(rows[a:b])
