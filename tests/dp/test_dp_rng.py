"""RandomSource: modes, reproducibility, exactness of integers and distribution checks."""

import os

import numpy as np
import pytest
from scipy import stats

from fedprivacy.dp.rng import RandomSource, default_source

KEY = bytes(range(32))  # fixed key: exercises the secure pipeline reproducibly
N = 200_000
ALPHA = 1e-4  # generous, but a wrong distribution at these sizes fails by many orders of magnitude


def sources() -> list[RandomSource]:
    return [RandomSource._from_key(KEY), RandomSource.seeded(11)]


def test_default_source_and_describe() -> None:
    s = default_source()
    assert s.mode == "secure" and s.seed is None and s.is_private
    assert "secure" in s.describe()
    r = default_source(3)
    assert r.mode == "seeded" and r.seed == 3 and not r.is_private
    assert "NOT private" in r.describe()


def test_secure_sources_differ_across_instances_and_children() -> None:
    a, b = RandomSource.secure(), RandomSource.secure()
    assert a.random_bytes(32) != b.random_bytes(32)
    assert not np.array_equal(a.normal(std=1.0, size=8), b.normal(std=1.0, size=8))
    assert a.child(1).random_bytes(32) != a.child(1).random_bytes(32)


def test_seeded_is_reproducible_and_children_are_stable() -> None:
    a, b = RandomSource.seeded(5), RandomSource.seeded(5)
    np.testing.assert_array_equal(a.normal(std=2.0, size=10), b.normal(std=2.0, size=10))
    c1 = RandomSource.seeded(5).child("client", 3).integers(0, 10**9, size=5)
    # deriving a child does not depend on what the parent drew before
    p = RandomSource.seeded(5)
    p.uniform(100)
    c2 = p.child("client", 3).integers(0, 10**9, size=5)
    np.testing.assert_array_equal(c1, c2)
    c3 = RandomSource.seeded(5).child("client", 4).integers(0, 10**9, size=5)
    c4 = RandomSource.seeded(6).child("client", 3).integers(0, 10**9, size=5)
    assert not np.array_equal(c1, c3) and not np.array_equal(c1, c4)
    # int and str labels live in separate domains; nested == flat
    assert not np.array_equal(
        RandomSource.seeded(5).child(1).uniform(4), RandomSource.seeded(5).child("1").uniform(4)
    )
    np.testing.assert_array_equal(
        RandomSource.seeded(5).child("a").child(2).uniform(4),
        RandomSource.seeded(5).child("a", 2).uniform(4),
    )
    assert "labels=['a', 2]" in RandomSource.seeded(5).child("a", 2).describe()


def test_fixed_key_secure_pipeline_is_deterministic() -> None:
    x = RandomSource._from_key(KEY).random_bytes(16)
    assert x == RandomSource._from_key(KEY).random_bytes(16)
    # AES-256-CTR of zeros with a zero counter block = AES-256_K(0^128) (FIPS-197 primitive)
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    ecb = Cipher(algorithms.AES(KEY), modes.ECB()).encryptor()
    assert x == ecb.update(bytes(16)) + ecb.finalize()


@pytest.mark.parametrize("src", sources(), ids=["secure", "seeded"])
def test_normal_ks_and_moments(src: RandomSource) -> None:
    z = src.normal(std=3.0, size=N)
    assert z.shape == (N,) and z.dtype == np.float64
    assert stats.kstest(z / 3.0, "norm").pvalue > ALPHA
    assert abs(z.mean()) < 6 * 3.0 / np.sqrt(N)
    assert abs(z.var() / 9.0 - 1) < 6 * np.sqrt(2 / N)
    assert abs(stats.kurtosis(z)) < 6 * np.sqrt(24 / N)


@pytest.mark.parametrize("src", sources(), ids=["secure", "seeded"])
def test_laplace_exponential_gumbel_uniform_ks(src: RandomSource) -> None:
    lap = src.laplace(scale=2.0, size=N)
    assert stats.kstest(lap, "laplace", args=(0, 2.0)).pvalue > ALPHA
    assert abs(lap.var() / 8.0 - 1) < 0.05
    assert stats.kstest(src.exponential(scale=0.5, size=N), "expon", args=(0, 0.5)).pvalue > ALPHA
    assert stats.kstest(src.gumbel(N), "gumbel_r").pvalue > ALPHA
    u = src.uniform(N)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert stats.kstest(u, "uniform").pvalue > ALPHA
    assert abs(src.bernoulli(0.3, N).mean() - 0.3) < 6 * np.sqrt(0.21 / N)


@pytest.mark.parametrize("src", sources(), ids=["secure", "seeded"])
@pytest.mark.parametrize(("low", "high"), [(0, 2), (-3, 4), (5, 17), (0, 1000)])
def test_integers_chi_square_uniform(src: RandomSource, low: int, high: int) -> None:
    x = src.integers(low, high, size=50 * (high - low) + 10_000)
    assert x.dtype == np.int64 and x.min() >= low and x.max() < high
    counts = np.bincount(x - low, minlength=high - low)
    assert stats.chisquare(counts).pvalue > ALPHA


def test_integers_no_modulo_bias_for_range_just_above_a_power_of_two() -> None:
    # r = 3 * 2**61: a modulo reduction of 64-bit words would make the lowest third 1.5x as likely
    src = RandomSource._from_key(KEY)
    r = 3 * 2**61
    x = src.integers(0, r, size=60_000)
    counts = np.bincount((x // 2**61).astype(np.int64), minlength=3)
    assert stats.chisquare(counts).pvalue > ALPHA
    full = src.integers(-(2**63), 2**63, size=1000)
    assert (full < 0).any() and (full > 0).any()


def test_random_bits_and_randbelow() -> None:
    src = RandomSource._from_key(KEY)
    b = src.random_bits(bits=5, size=64_000)
    assert b.dtype == np.uint64 and int(b.max()) < 32
    assert stats.chisquare(np.bincount(b.astype(np.int64), minlength=32)).pvalue > ALPHA
    assert src.random_bits(bits=64, size=4).dtype == np.uint64
    big = 10**40 + 7
    vals = [src.randbelow(big) for _ in range(2000)]
    assert all(0 <= v < big for v in vals)
    # top decile frequencies of a huge range
    counts = np.bincount([v * 10 // big for v in vals], minlength=10)
    assert stats.chisquare(counts).pvalue > ALPHA
    assert src.randbelow(1) == 0


def test_permutation_is_uniform_over_s3() -> None:
    src = RandomSource._from_key(KEY)
    perms = [tuple(src.permutation(3)) for _ in range(6000)]
    _, counts = np.unique(np.array(perms), axis=0, return_counts=True)
    assert len(counts) == 6 and stats.chisquare(counts).pvalue > ALPHA
    x = np.arange(10)
    src.shuffle(x)
    assert sorted(x.tolist()) == list(range(10))


def test_shapes_and_scalars() -> None:
    for src in sources():
        assert src.normal(std=1.0, size=(2, 3)).shape == (2, 3)
        assert np.ndim(src.uniform()) == 0
        assert src.integers(0, 5, size=(4, 1)).shape == (4, 1)
        assert src.normal(std=1.0, size=0).shape == (0,)


def test_errors_name_the_parameter() -> None:
    src = RandomSource.seeded(0)
    with pytest.raises(ValueError, match="std must be"):
        src.normal(std=0.0, size=3)
    with pytest.raises(ValueError, match="scale must be"):
        src.laplace(scale=-1.0, size=3)
    with pytest.raises(ValueError, match="high must be > low"):
        src.integers(3, 3)
    with pytest.raises(ValueError, match="bits must be in"):
        src.random_bits(bits=65)
    with pytest.raises(ValueError, match="p must be in"):
        src.bernoulli(1.5)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        RandomSource.seeded(-1)
    with pytest.raises(TypeError, match="seed must be an int"):
        RandomSource.seeded(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="child labels"):
        src.child(1.0)  # type: ignore[arg-type]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_secure_source_rekeys_in_a_forked_child() -> None:
    src = RandomSource.secure()
    src.randbelow(1000)  # fills the small-request pool before the fork
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report its next draws, then exit without running pytest teardown
        os.close(r)
        os.write(w, src.random_bytes(32) + src.randbelow(2**64).to_bytes(8, "little"))
        os._exit(0)
    os.close(w)
    child = b""
    while len(child) < 40:
        chunk = os.read(r, 40 - len(child))
        if not chunk:
            break
        child += chunk
    os.close(r)
    os.waitpid(pid, 0)
    parent = src.random_bytes(32) + src.randbelow(2**64).to_bytes(8, "little")
    assert len(child) == 40
    assert child[:32] != parent[:32] and child[32:] != parent[32:]


def test_secure_draws_never_repeat_across_chunks_and_calls() -> None:
    # a reused keystream (e.g. restarting the counter per chunk) would repeat values exactly
    src = RandomSource._from_key(KEY)
    z = np.concatenate([src.normal(std=1.0, size=150_000), src.normal(std=1.0, size=150_000)])
    assert len(np.unique(z)) == len(z)
    w = np.concatenate([src.random_bits(bits=64, size=600_000), src.random_bits(bits=64, size=10)])
    assert len(np.unique(w)) == len(w)


def test_secure_source_refuses_pickling_but_seeded_round_trips() -> None:
    import pickle

    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(RandomSource.secure())
    s = RandomSource.seeded(9).child("x")
    t = pickle.loads(pickle.dumps(s))
    np.testing.assert_array_equal(s.uniform(5), t.uniform(5))
    assert t.describe() == s.describe()
