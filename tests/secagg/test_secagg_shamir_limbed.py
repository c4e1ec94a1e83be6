"""The limbed Shamir scheme over GF(2^31 - 1): known answers, reconstruction, secrecy, refusals."""

from __future__ import annotations

import secrets
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivacy.secagg import shamir

Q = shamir.LIMB_PRIME


def _fixed_bytes(words: list[int]) -> Callable[[int], bytes]:
    """A ``random_bytes`` stand-in that hands out the given 32-bit words in order."""
    stream = b"".join(w.to_bytes(4, "little") for w in words)
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        out = stream[pos : pos + n]
        pos += n
        assert len(out) == n, "the test supplied too few words"
        return out

    return take


def _limbs(secret: bytes) -> list[int]:
    v = int.from_bytes(secret, "little")
    return [(v >> (30 * j)) & (2**30 - 1) for j in range(shamir.limbs_per_secret(len(secret)))]


def _eval(coeffs: list[int], x: int) -> int:
    """Plain Python: sum_j c_j x^j mod q."""
    return sum(c * pow(x, j, Q) for j, c in enumerate(coeffs)) % Q


def _interpolate(points: list[tuple[int, int]], at: int) -> int:
    """Plain Python Lagrange interpolation over GF(q)."""
    total = 0
    for i, (xi, yi) in enumerate(points):
        num, den = 1, 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                num = num * (at - xj) % Q
                den = den * (xi - xj) % Q
        total = (total + yi * num * pow(den, Q - 2, Q)) % Q
    return total


# ----------------------------------------------------------------------------- known answers
def test_known_answer_one_limb_threshold_two() -> None:
    # secret 5, f(x) = 5 + 7 x: shares 12, 19, 26
    shares = shamir.split_secrets([b"\x05"], threshold=2, xs=[1, 2, 3], random_bytes=_fixed_bytes([7]))
    assert shares.shape == (3, 1, 1)
    assert shares[:, 0, 0].tolist() == [12, 19, 26]
    assert shamir.reconstruct_secrets([[2, 3]], shares[None, 1:], secret_bytes=1) == [[b"\x05"]]


def test_known_answer_32_byte_secrets_match_plain_python_evaluation() -> None:
    secret_a, secret_b = bytes(range(32)), bytes(range(100, 132))
    t, xs = 4, [1, 2, 5, 9, 1000]
    limbs = shamir.limbs_per_secret(32)
    assert limbs == 9
    words = [(i * 2654435761) % Q for i in range(1, (t - 1) * 2 * limbs + 1)]
    shares = shamir.split_secrets([secret_a, secret_b], threshold=t, xs=xs,
                                  random_bytes=_fixed_bytes(words))
    # coefficients are drawn as one (t-1, S, L) block, degree 1 first
    coeff = np.array(words, dtype=np.int64).reshape(t - 1, 2, limbs)
    for s, secret in enumerate((secret_a, secret_b)):
        for j, limb in enumerate(_limbs(secret)):
            poly = [limb] + [int(coeff[d, s, j]) for d in range(t - 1)]
            assert [int(shares[h, s, j]) for h in range(len(xs))] == [_eval(poly, x) for x in xs]


def test_coefficient_equal_to_q_is_rejected_and_redrawn() -> None:
    # 2^31 - 1 (== q) is not a field element: the sampler must redraw it, not use it as 0
    shares = shamir.split_secrets([b"\x01"], threshold=2, xs=[1, 2], random_bytes=_fixed_bytes([Q, 3]))
    assert shares[:, 0, 0].tolist() == [4, 7]  # f(x) = 1 + 3 x


# ----------------------------------------------------------------------------- properties
@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 20), num=st.integers(1, 4), nbytes=st.sampled_from([1, 16, 32, 48]),
       data=st.data())
def test_any_t_shares_reconstruct_every_secret(n: int, num: int, nbytes: int, data: st.DataObject) -> None:
    t = data.draw(st.integers(1, n))
    secrets_ = [data.draw(st.binary(min_size=nbytes, max_size=nbytes)) for _ in range(num)]
    xs = data.draw(st.lists(st.integers(1, Q - 1), min_size=n, max_size=n, unique=True))
    shares = shamir.split_secrets(secrets_, threshold=t, xs=xs)
    subset = data.draw(st.lists(st.sampled_from(range(n)), min_size=t, max_size=t, unique=True))
    got = shamir.reconstruct_secrets([[xs[i] for i in subset]], shares[subset][None],
                                     secret_bytes=nbytes)
    assert got == [secrets_]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(3, 12), data=st.data())
def test_t_minus_1_shares_fit_every_secret(n: int, data: st.DataObject) -> None:
    """For every limb, t-1 shares and ANY candidate limb value lie on exactly one polynomial of degree
    < t (Lagrange through t points), whose other shares differ from the true ones unless the candidate
    is the secret: the t-1 shares carry no information about the limb, and limbs are independent."""
    t = data.draw(st.integers(2, n))
    secret = data.draw(st.binary(min_size=32, max_size=32))
    candidate = data.draw(st.binary(min_size=32, max_size=32))
    xs = list(range(1, n + 1))
    shares = shamir.split_secrets([secret], threshold=t, xs=xs)
    for j, (true_limb, cand_limb) in enumerate(zip(_limbs(secret), _limbs(candidate), strict=True)):
        known = [(xs[i], int(shares[i, 0, j])) for i in range(t - 1)]
        poly_pts = [(0, cand_limb), *known]
        assert all(_interpolate(poly_pts, x) == y for x, y in known)
        if cand_limb != true_limb:
            assert _interpolate(poly_pts, xs[t - 1]) != int(shares[t - 1, 0, j])


def test_t_minus_1_shares_of_two_secrets_have_the_same_distribution() -> None:
    """Empirical check of the same fact: with t = 2 each single share is uniform on GF(q) whatever
    the secret (chi-square over 16 buckets for two very different secrets)."""
    for secret in (bytes(32), b"\xff" * 32):
        draws = np.stack([shamir.split_secrets([secret], threshold=2, xs=[1, 2])[0, 0]
                          for _ in range(2000)])
        counts = np.bincount((draws.astype(np.int64).ravel() * 16) // Q, minlength=16)
        expected = draws.size / 16
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        # 15 degrees of freedom: P[chi2 > 73.6] = 1e-9 for uniform shares (typical values 8-22), so the
        # check does not fail by chance (it did at the 1e-4 quantile, 45); a real bias of a few percent in
        # one bucket over these 18,000 limbs gives a chi-square in the hundreds
        assert chi2 < 73.6


def test_batched_reconstruction_of_many_groups_with_different_holders() -> None:
    rng = np.random.default_rng(0)
    t, groups = 5, 30
    xs_all, shares_all, want = [], [], []
    for _ in range(groups):
        xs = [int(v) for v in rng.choice(np.arange(1, 200), size=8, replace=False)]
        secrets_ = [secrets.token_bytes(32) for _ in range(3)]
        sh = shamir.split_secrets(secrets_, threshold=t, xs=xs)
        pick = rng.choice(8, size=t, replace=False)
        xs_all.append([xs[i] for i in pick])
        shares_all.append(sh[pick])
        want.append(secrets_)
    assert shamir.reconstruct_secrets(np.array(xs_all), np.stack(shares_all), secret_bytes=32) == want


def test_inconsistent_shares_are_reported_not_reconstructed() -> None:
    # every share equal to 2^30: the constant polynomial 2^30, not a 30-bit limb
    bad = np.full((1, 3, 1, 9), 2**30, dtype=np.uint32)
    with pytest.raises(shamir.ShareError, match="inconsistent"):
        shamir.reconstruct_secrets([[1, 2, 3]], bad, secret_bytes=32)
    # a valid limb pattern but bits beyond 256 in the top limb (it holds 256 - 240 = 16 bits)
    top = np.zeros((1, 3, 1, 9), dtype=np.uint32)
    top[..., 8] = 1 << 16
    with pytest.raises(shamir.ShareError):
        shamir.reconstruct_secrets([[1, 2, 3]], top, secret_bytes=32)


def test_encoding_round_trips_and_refuses_non_field_values() -> None:
    shares = shamir.split_secrets([secrets.token_bytes(32)] * 2, threshold=3, xs=[1, 2, 3])
    data = shamir.encode_shares(shares[0])
    assert len(data) == 4 * 2 * 9  # 72 bytes for two 32-byte secrets (the reference scheme: 132)
    assert np.array_equal(shamir.decode_shares(data, num_secrets=2, secret_bytes=32), shares[0])
    with pytest.raises(ValueError, match="not an element"):
        shamir.decode_shares(b"\xff" * 72, num_secrets=2, secret_bytes=32)
    with pytest.raises(ValueError, match="72 bytes"):
        shamir.decode_shares(data[:-1], num_secrets=2, secret_bytes=32)


@settings(max_examples=60, deadline=None)
@given(num=st.integers(0, 3), nbytes=st.sampled_from([1, 16, 32]), data=st.data())
def test_decode_many_is_decode_shares_of_each_item(num: int, nbytes: int, data: st.DataObject) -> None:
    """The one-pass decode: the stacked decodings, or the error decode_shares raises for the
    first item it refuses (wrong length, out of the field, not bytes)."""
    limbs = shamir.limbs_per_secret(nbytes)
    good = st.lists(st.integers(0, shamir.LIMB_PRIME - 1), min_size=num * limbs, max_size=num * limbs).map(
        lambda v: np.asarray(v, dtype="<u4").tobytes())
    bad = st.sampled_from([b"\x01", b"\xff" * (4 * num * limbs), "text", None, memoryview(bytes(4 * num * limbs))])
    items = data.draw(st.lists(st.one_of(good, good.map(bytearray), bad), max_size=6))
    try:
        want = [shamir.decode_shares(d, num_secrets=num, secret_bytes=nbytes) for d in items]  # type: ignore[arg-type]
    except ValueError as exc:
        with pytest.raises(ValueError) as got:
            shamir.decode_many(items, num_secrets=num, secret_bytes=nbytes)  # type: ignore[arg-type]
        assert str(got.value) == str(exc)
        return
    out = shamir.decode_many(items, num_secrets=num, secret_bytes=nbytes)  # type: ignore[arg-type]
    assert out.dtype == np.uint32 and out.shape == (len(items), num, limbs)
    for row, w in zip(out, want, strict=True):
        assert np.array_equal(row, w)


@pytest.mark.parametrize(("xs", "error"), [([0, 1], ValueError), ([1, Q], ValueError),
                                           ([2, 2], ValueError), ([True, 2], TypeError)])
def test_abscissae_are_checked_and_the_error_names_them(xs: list[int], error: type) -> None:
    with pytest.raises(error, match="xs"):
        shamir.split_secrets([b"\x01"], threshold=1, xs=xs)


def test_threshold_and_secret_lengths_are_checked() -> None:
    with pytest.raises(ValueError, match="threshold"):
        shamir.split_secrets([b"\x01"], threshold=3, xs=[1, 2])
    with pytest.raises(ValueError, match="one length"):
        shamir.split_secrets([b"\x01", b"\x01\x02"], threshold=1, xs=[1])
    with pytest.raises(ValueError, match="distinct"):
        shamir.reconstruct_secrets([[1, 1]], np.zeros((1, 2, 1, 1), dtype=np.uint32), secret_bytes=1)
