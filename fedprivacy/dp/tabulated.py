"""A discrete Gaussian sampler whose output distribution is known exactly (inversion of an integer CDF).

Why. The privacy analysis of the distributed discrete Gaussian
(:mod:`fedprivacy.accounting.release`) is about exact ``N_Z(0, v)`` noise. The vectorised
rejection sampler (:func:`fedprivacy.dp.discrete.sample_discrete_gaussian`) decides with float64
``log``/``exp`` and 53-bit uniforms, so its output law is only approximately the discrete Gaussian and
its deviation has no rigorous bound. This sampler's output law ``q`` is an explicit table of integers,
so ``q`` is known exactly and its distance to ``N_Z(0, v)`` is bounded from the table itself.

Construction (:class:`TabulatedDiscreteGaussian`). Support ``|x| <= K`` with
``K = ceil(sqrt(2 v TAIL_BITS ln 2))`` (so ``exp(-K^2/(2v)) <= 2^-TAIL_BITS``). Weights
``w_x = exp(-x^2/(2v))`` in float64 (relative error ``<= EXP_ERROR`` each; numpy documents at most
4 ULP for float64 ``exp``, and ``tests/dp/test_dp_tabulated.py`` checks this platform against
``decimal`` on the arguments used), ``W = math.fsum(w)`` (correctly rounded), masses
``M_x = 2^S fl(w_x / (W (1 + 2^-40)))`` with ``S = PRECISION_BITS`` (exact integers; their total
``M`` is just below ``2^S``). The output law is exactly ``q(x) = M_x / M``: a uniform ``U`` on
``[0, 2^S)`` (from the caller's :class:`~fedprivacy.dp.rng.RandomSource`: AES-256-CTR keystream in
secure mode) is rejected if ``U >= M`` (probability ~2^-40) and otherwise mapped to the ``x`` with
``C_(x) <= U < C_(x+1)`` (cumulative sums). Vectorised: the top 64 bits of ``U`` against the top
64 bits of ``C`` (``numpy.searchsorted``); a sample whose top word equals a table top word (probability
``< (2K+2) 2^-64``) draws the rest of ``U`` and is resolved with exact Python integers.

Guarantee (:meth:`TabulatedDiscreteGaussian.ratio_bound`, :attr:`tail_mass`). With ``p`` the exact
``N_Z(0, v)`` and ``p~`` the exact ``N_Z(0, v)`` conditioned on ``|x| <= K``:
``|q(x)/p~(x) - 1| <= r`` for every ``|x| <= K`` (same support), ``r`` computed from ``EXP_ERROR``,
the rounded exponent (``|x^2/2v| u``) and the float division and normalisation; and
``TV(p~, p) <= tail_mass``. The accounting turns ``r`` into a density-ratio slack and the tail into an
additive delta term (:func:`fedprivacy.accounting.audiences.slack_epsilon`).
"""

from __future__ import annotations

import decimal
import functools
import itertools
import math

import numpy as np

from fedprivacy.dp.rng import RandomSource

__all__ = ["EXP_ERROR", "PRECISION_BITS", "TAIL_BITS", "TabulatedDiscreteGaussian", "check_exp_accuracy",
           "law_bounds", "law_bounds_sup", "sample_tabulated_discrete_gaussian"]

#: Assumed bound on the relative error of numpy's float64 ``exp`` (4 ULP = 2^-50; checked in tests).
EXP_ERROR = 2.0**-50
#: The table's tail: ``exp(-K^2/(2v)) <= 2^-TAIL_BITS`` (its mass is far below any delta).
TAIL_BITS = 256
#: Bits of the uniform integer and of the table's masses.
PRECISION_BITS = TAIL_BITS + 128
_U = 2.0**-53  # unit roundoff of float64
_MAX_ENTRIES = 1 << 23
_GUIDE_BITS = 20  # at most: 2^20 buckets (4 MB of int32)


def _guide_bits(entries: int) -> int:
    """Guide-table size for a table of ``entries``: ~8 buckets per entry, 2^14..2^20 buckets.

    Only a speed trade-off (the located index is the same for any size, tested): a small guide stays
    in cache (2^20 buckets for 379 entries made every lookup a cache miss, ~2x slower), while too few
    buckets send more draws to the bisection.
    """
    return min(_GUIDE_BITS, max(14, (entries - 1).bit_length() + 3))


class TabulatedDiscreteGaussian:
    """``N_Z(0, variance)`` by inversion of an exact integer CDF (module docstring). Immutable; cached."""

    __slots__ = ("_frac", "_guide", "_next", "_shift", "_top", "_total", "k", "ratio_bound", "tail_mass",
                 "variance")

    def __init__(self, variance: float) -> None:
        v = float(variance)
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"variance must be a finite number > 0, got {variance!r}")
        k = _support(v)
        if 2 * k + 1 > _MAX_ENTRIES:
            raise ValueError(f"variance {v:g} needs a table of {2 * k + 1} entries (> {_MAX_ENTRIES})")
        xs = np.arange(-k, k + 1, dtype=np.float64)
        arg = (xs * xs) / (2.0 * v)  # x^2 exact (|x| < 2^26), one rounding in the division
        w = np.exp(-arg)
        check_exp_accuracy()  # this platform's exp, once per process
        _spot_check(arg, w)  # and the very weights of this table, at a few entries
        # scaled just below 1 so that the exact integer total stays below 2^S (rejection ~2^-40)
        frac = w / (math.fsum(w.tolist()) * (1.0 + 2.0**-40))
        s = PRECISION_BITS
        masses = [int(math.ldexp(f, s)) for f in frac.tolist()]  # exact: every f 2^S is an integer
        cum = list(itertools.accumulate(masses, initial=0))
        self.variance, self.k = v, k
        self._frac = frac
        self._total = cum[-1]
        if not self._total < 1 << s:  # pragma: no cover - guaranteed by the 2^-40 scaling
            raise ArithmeticError("table total exceeds 2^S")
        self._top = np.array([c >> (s - 64) for c in cum[:-1]], dtype=np.uint64)
        # guide table (indexed search): the entry holding the start of each of 2^GUIDE_BITS buckets
        bits = _guide_bits(2 * k + 1)
        self._shift = np.uint64(64 - bits)
        starts = np.arange(1 << bits, dtype=np.uint64) << self._shift
        guide = np.searchsorted(self._top, starts, side="right") - 1
        self._next = np.append(self._top[1:], np.uint64(2**64 - 1))  # C_top[i+1] (last: +inf)
        self._guide = _flag_mixed(guide, starts, top=self._top, nxt=self._next, shift=int(self._shift),
                                  total_top=self._total >> (s - 64))
        self.ratio_bound, self.tail_mass = law_bounds(v)

    def __repr__(self) -> str:
        return (f"TabulatedDiscreteGaussian(variance={self.variance:g}, support=±{self.k}, "
                f"ratio_bound={self.ratio_bound:.3g}, tail_mass={self.tail_mass:.3g})")

    def _cum(self, i: int) -> int:
        """Exact ``C_i = sum_{j < i} M_j`` (only for the rare ties)."""
        return sum(int(math.ldexp(f, PRECISION_BITS)) for f in self._frac[:i].tolist())

    def pmf(self, x: int) -> float:
        """``q(x) = M_x / total`` (float of the exact rational)."""
        i = int(x) + self.k
        if not 0 <= i <= 2 * self.k:
            return 0.0
        return int(math.ldexp(float(self._frac[i]), PRECISION_BITS)) / self._total

    def _resolve(self, u_top: int, rng: RandomSource) -> int | None:
        """Exact index for a draw whose top word ties with the table (None: U >= total, redraw)."""
        rest = PRECISION_BITS - 64
        return self._index_of((u_top << rest) | int.from_bytes(rng.random_bytes(rest // 8), "big"))

    def _index_of(self, u: int) -> int | None:
        """The ``i`` with ``C_i <= u < C_(i+1)`` for an exact ``u`` (None if ``u >= total``)."""
        if u >= self._total:
            return None
        lo, hi = 0, 2 * self.k + 1  # invariant C_lo <= u < C_hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._cum(mid) <= u:
                lo = mid
            else:
                hi = mid
        return lo

    def _locate(self, top: np.ndarray) -> np.ndarray:
        """Largest ``i`` with ``C_top[i] <= top``: guide table, one step, bisection for the rest."""
        g = self._bucket_entries(top)
        return self._settle(np.where(g < 0, ~g, g), top).astype(np.int64)

    def _bucket_entries(self, top: np.ndarray) -> np.ndarray:
        """The guide's entry for each word's bucket. ``np.take`` with an int64 view of the bucket numbers
        (< 2^GUIDE_BITS, so the view is exact): indexing with the uint64 array made numpy convert the
        131k indices first (the same values, ~25% of a component's sampling)."""
        return np.take(self._guide, (top >> self._shift).view(np.int64))

    def _settle(self, idx: np.ndarray, top: np.ndarray) -> np.ndarray:
        """``idx`` (the entry holding each word's bucket start) moved to the largest ``i`` with
        ``C_top[i] <= top``: one step, bisection for a bucket holding more than one boundary."""
        more = np.flatnonzero(self._next[idx] <= top)  # rare
        if more.size:
            idx[more] = np.searchsorted(self._top, top[more], side="right") - 1
        return idx

    def sample(self, size: int, *, rng: RandomSource) -> np.ndarray:
        """``size`` draws (int64) from ``q``: one 64-bit word per draw, more for rare ties/rejections.

        A draw in a clean bucket (no table word in it, below the rejection point: ~98% of them, see
        :func:`_flag_mixed`) is its bucket's entry, read off the guide alone; the others are located
        and checked for ties and rejection as a whole-table search would (same index, tested).
        """
        n = int(size)
        if n < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        total_top = np.uint64(self._total >> (PRECISION_BITS - 64))
        top = np.asarray(rng.random_bits(bits=64, size=n), dtype=np.uint64).reshape(-1)
        g = self._bucket_entries(top)
        out = np.subtract(g, self.k, dtype=np.int64)
        mixed = np.flatnonzero(g < 0)
        if mixed.size:
            words = top[mixed]
            idx = self._settle(~g[mixed], words)
            out[mixed] = idx - self.k
            odd = mixed[np.flatnonzero((self._top[idx] == words) | (words >= total_top))]
            for j in odd.tolist():  # ties with a table word (probability < (2k+2) 2^-64) or U >= total
                out[j] = self._draw_slow(int(top[j]), rng)
        return out

    def _draw_slow(self, u_top: int, rng: RandomSource) -> int:
        """One draw that starts with top word ``u_top`` and needs exact integers (ties, rejections)."""
        while True:
            if u_top <= self._total >> (PRECISION_BITS - 64):
                i = self._resolve(u_top, rng)
                if i is not None:
                    return i - self.k
            u_top = int(np.asarray(rng.random_bits(bits=64, size=1), dtype=np.uint64)[0])
            i = int(self._locate(np.array([u_top], dtype=np.uint64))[0])
            if int(self._top[i]) != u_top and u_top < self._total >> (PRECISION_BITS - 64):
                return i - self.k


#: Arguments of the platform check: the range the tables use (``x^2/2v <= ~178``), dense and uneven.
_CHECK_ARGS = 4097


@functools.lru_cache(maxsize=1)
def check_exp_accuracy() -> float:
    """The largest relative error of this platform's numpy float64 ``exp`` on ``_CHECK_ARGS``
    arguments in ``[-180, 0]``, against ``decimal`` (34 digits); raises ArithmeticError above
    :data:`EXP_ERROR`, the bound the sampler's law (:func:`law_bounds`) assumes.

    Why here: the client's platform draws the noise, so the client checks its own ``exp``
    before it builds a table (cached once per process: ~0.2 s), instead of trusting a test run on the
    developers' machine. A failing platform refuses to encode rather than add noise whose law is
    outside the charged bound.
    """
    args = -np.linspace(0.0, 180.0, _CHECK_ARGS) * (1.0 + np.sin(np.arange(_CHECK_ARGS)) * 1e-3)
    args = np.maximum(args, -180.0)
    worst = _worst_relative_error(args, np.exp(args))
    if not worst <= EXP_ERROR:
        raise ArithmeticError(f"numpy exp has relative error {worst:.3g} > {EXP_ERROR:.3g} on this "
                              "platform; the exact sampler's bound does not hold, refusing to sample")
    return worst


def _worst_relative_error(args: np.ndarray, got: np.ndarray) -> float:
    with decimal.localcontext() as ctx:
        ctx.prec = 34
        worst = max(abs(decimal.Decimal(float(g)) / decimal.Decimal(float(a)).exp() - 1)
                    for a, g in zip(args.tolist(), got.tolist(), strict=True))
    return float(worst)


def _spot_check(arg: np.ndarray, w: np.ndarray, *, points: int = 64) -> None:
    """``exp`` of a table's own arguments, at ``points`` evenly spaced entries, against ``decimal``."""
    idx = np.unique(np.linspace(0, arg.shape[0] - 1, points).astype(np.int64))
    worst = _worst_relative_error(-arg[idx], w[idx])
    if not worst <= EXP_ERROR:
        raise ArithmeticError(f"numpy exp has relative error {worst:.3g} > {EXP_ERROR:.3g} on this "
                              "table's weights; refusing to sample")


def _flag_mixed(guide: np.ndarray, starts: np.ndarray, *, top: np.ndarray, nxt: np.ndarray, shift: int,
                total_top: int) -> np.ndarray:
    """The guide as int32, with ``~entry`` (negative) for a *mixed* bucket.

    A bucket ``[start, end]`` is clean when no table word lies in it (``C_top[g] < start`` and
    ``C_top[g+1] > end`` for its entry ``g``) and ``end < total_top``: every word in it then locates
    to ``g``, ties with no table word and is not rejected, so a draw there is ``g`` with no further
    check. Every other bucket is mixed and takes the full search. Only a speed-up (the located
    index, the tie and rejection tests are those of the whole-table search for every word).
    """
    ends = starts | np.uint64((1 << shift) - 1)
    clean = (top[guide] < starts) & (nxt[guide] > ends) & (ends < np.uint64(total_top))
    out = guide.astype(np.int32)
    np.invert(out, out=out, where=~clean)
    return out


def _support(v: float) -> int:
    return math.ceil(math.sqrt(2.0 * v * TAIL_BITS * math.log(2.0)))


def law_bounds(variance: float) -> tuple[float, float]:
    """``(r, tail)`` of the table for ``variance`` without building it (module docstring).

    ``r``: ``|q(x)/p~(x) - 1| <= r`` on the support. ``w_x`` has relative error
    ``<= EXP_ERROR + a_max u`` (``exp`` and its rounded argument ``a = x^2/2v <= a_max``),
    ``W = fsum(w)`` inherits it (+u), ``fl(w/W')`` adds u; the ``1 + 2^-40`` cancels in
    ``q = f_x / sum f`` (exact integers). First-order terms, with 1% for their products.
    ``tail``: ``P[|X| > K] <= 2 e^{-(K+1)^2/2v} / (1 - e^{-(K+1)/v})`` (``rho(Z) >= 1``).
    """
    v = float(variance)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"variance must be a finite number > 0, got {variance!r}")
    k = _support(v)
    a_max = k * k / (2.0 * v) * (1.0 + _U)
    e_w = EXP_ERROR + a_max * _U * 1.01
    r = (2.0 * e_w + 3.0 * _U) * 1.01
    a = (k + 1.0) ** 2 / (2.0 * v)
    return r, 2.0 * math.exp(-a) / -math.expm1(-(k + 1.0) / v)


def law_bounds_sup(*, min_variance: float, max_variance: float) -> tuple[float, float]:
    """``(r, tail)`` valid for every table of variance in ``[min_variance, max_variance]``.

    ``r`` grows with ``a_max = K^2/(2v)``, and ``K = ceil(sqrt(2 v T ln 2)) < sqrt(2 v T ln 2) + 1``
    gives ``a_max < (sqrt(T ln 2) + 1/sqrt(2v))^2``, decreasing in ``v``: its value at ``min_variance``.
    ``tail``: ``(K+1)^2/(2v) > T ln 2`` and ``(K+1)/v > sqrt(2 T ln 2/v)``, decreasing in ``v``: at
    ``max_variance`` (``T = TAIL_BITS``).
    """
    lo, hi = float(min_variance), float(max_variance)
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
        raise ValueError(f"need 0 < min_variance <= max_variance (finite), got {min_variance!r}, "
                         f"{max_variance!r}")
    tl = TAIL_BITS * math.log(2.0)
    a_max = (math.sqrt(tl) + 1.0 / math.sqrt(2.0 * lo)) ** 2 * (1.0 + _U) ** 2
    e_w = EXP_ERROR + a_max * _U * 1.01
    r = (2.0 * e_w + 3.0 * _U) * 1.01
    return r, 2.0 * 2.0**-TAIL_BITS / -math.expm1(-math.sqrt(2.0 * tl / hi))


@functools.lru_cache(maxsize=32)
def _table(variance: float) -> TabulatedDiscreteGaussian:
    return TabulatedDiscreteGaussian(variance)


def sample_tabulated_discrete_gaussian(*, variance: float, size: int,
                                       rng: RandomSource) -> np.ndarray:
    """``size`` draws of :class:`TabulatedDiscreteGaussian` ``(variance)`` (tables cached per variance)."""
    return _table(float(variance)).sample(size, rng=rng)
