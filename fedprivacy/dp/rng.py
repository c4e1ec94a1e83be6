"""One source of randomness for every privacy-relevant draw in fedprivacy.

Two modes:

* ``secure`` (the default): a cryptographic keystream, AES-256 in counter mode (pyca/cryptography,
  OpenSSL) keyed with 32 bytes from :func:`secrets.token_bytes`, is turned into uniform 53-bit doubles,
  exact bounded integers, Gaussians (Marsaglia polar method) and Laplace variates with numpy. An
  adversary who sees any number of outputs learns nothing about the others as long as AES-256 is a
  pseudo-random permutation and the key stays in this process.
* ``seeded``: numpy's PCG64 (:class:`numpy.random.Generator`) seeded from an integer. Reproducible,
  predictable from its outputs, and therefore NOT private; every ``describe()`` says so.

Threat model and caveats:

* Continuous samplers (``normal``, ``laplace``, ``uniform``) return IEEE doubles. Floating-point
  noise is open to Mironov's (2012) least-significant-bit attack when a raw noisy value is
  published; use the exact integer samplers in :mod:`fedprivacy.dp.discrete` when that matters.
  The polar method is exact in distribution up to double rounding; the largest Gaussian it can emit
  is about 8.6 std (probability of a larger true value < 1e-17).
* ``integers``, ``random_bits`` and ``randbelow`` are exact: rejection sampling, no modulo bias.
* A ``RandomSource`` is not thread-safe; give each thread its own (``child``). A secure source
  used in a forked child process re-keys itself from ``secrets`` on first use, so parent and child
  never share keystream.
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
from collections.abc import Sequence
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

__all__ = ["RandomSource", "default_source"]

Size = int | Sequence[int] | None

_TWO_POW_M53 = 2.0**-53
_CHUNK_BYTES = 1 << 22  # keystream is produced in 4 MiB pieces into a preallocated buffer
_ZEROS = memoryview(bytes(_CHUNK_BYTES))  # sliced without copying
_NORMAL_CHUNK = 1 << 16  # Gaussians produced per pass of the polar method


def _shape(size: Size) -> tuple[int, ...]:
    if size is None:
        return ()
    if isinstance(size, bool):
        raise TypeError(f"size must be an int or a tuple of ints, got {size!r}")
    if isinstance(size, int | np.integer):
        dims: tuple[int, ...] = (int(size),)
    else:
        try:
            dims = tuple(int(d) for d in size)
        except TypeError as exc:
            raise TypeError(f"size must be an int or a tuple of ints, got {size!r}") from exc
    for d in dims:
        if d < 0:
            raise ValueError(f"size must be non-negative, got {size!r}")
    return dims


def _out(arr: np.ndarray, size: Size) -> Any:
    """Reshape a flat draw to ``size``; a scalar (size None) comes back as a numpy scalar."""
    if size is None:
        return arr[0]
    return arr.reshape(_shape(size))


def _check_positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def _label_words(labels: Sequence[int | str]) -> tuple[int, ...]:
    """Map labels to non-negative ints, domain-separating ints from strings (stable, no ``hash``)."""
    words: list[int] = []
    for lab in labels:
        if isinstance(lab, bool):
            raise TypeError(f"child labels must be int or str, got {lab!r}")
        if isinstance(lab, int | np.integer):
            if int(lab) < 0:
                raise ValueError(f"child labels must be >= 0 when int, got {lab!r}")
            words.extend((0, int(lab)))
        elif isinstance(lab, str):
            digest = hashlib.sha256(b"fedprivacy/v1/rng-label/" + lab.encode("utf-8")).digest()
            words.extend((1, int.from_bytes(digest[:16], "little")))
        else:
            raise TypeError(f"child labels must be int or str, got {type(lab).__name__}")
    return tuple(words)


class _Keystream:
    """AES-256-CTR keystream (encryption of zeros), read sequentially, never reused."""

    __slots__ = ("_enc",)

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError(f"key must be 32 bytes, got {len(key)}")
        # A fresh random key per source, so a fixed all-zero initial counter block is safe.
        self._enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()

    def __reduce__(self) -> Any:
        raise TypeError(
            "a secure RandomSource cannot be pickled: its key must stay in this process; "
            "create a source per process (RandomSource.secure()) instead"
        )

    def fill(self, buf: np.ndarray) -> None:
        """Overwrite the C-contiguous array ``buf`` with keystream bytes."""
        view = buf.reshape(-1).view(np.uint8).data
        total = len(view)
        pos = 0
        while pos < total:
            k = min(_CHUNK_BYTES, total - pos)
            self._enc.update_into(_ZEROS[:k], view[pos : pos + k])
            pos += k


class RandomSource:
    """All randomness in fedprivacy flows through one of these.

    Build with :meth:`secure` (default, private) or :meth:`seeded` (reproducible, NOT private), or
    :func:`default_source`. Methods mirror :class:`numpy.random.Generator` where they overlap; numeric
    parameters of distributions are keyword-only.

    Attributes:
        mode: ``"secure"`` or ``"seeded"``.
        seed: the integer seed in seeded mode, ``None`` in secure mode.
        labels: the ``child`` labels leading to this source (empty for a root source).
    """

    __slots__ = ("_gen", "_ks", "_pid", "_pool", "_pool_pos", "labels", "mode", "seed")

    def __init__(
        self,
        *,
        _mode: str,
        _seed: int | None,
        _labels: tuple[int | str, ...],
        _key: bytes | None = None,
    ) -> None:
        self.mode = _mode
        self.seed = _seed
        self.labels = _labels
        self._gen: np.random.Generator | None = None
        self._ks: _Keystream | None = None
        self._pool = b""  # small-request byte pool for randbelow (secure mode)
        self._pool_pos = 0
        self._pid = os.getpid()
        if _mode == "secure":
            self._ks = _Keystream(_key if _key is not None else secrets.token_bytes(32))
        elif _mode == "seeded" and _seed is not None:
            _label_words(_labels)  # validated now; the generator is built at its first draw (a root or
            # intermediate source, e.g. client_rng's, often only makes children: ~0.1 ms saved each)
        else:  # pragma: no cover - internal
            raise ValueError(f"mode must be 'secure' or 'seeded' (with a seed), got {_mode!r}")

    # ------------------------------------------------------------------ construction
    @classmethod
    def secure(cls) -> RandomSource:
        """A private source: AES-256-CTR keystream keyed by ``secrets.token_bytes(32)``."""
        return cls(_mode="secure", _seed=None, _labels=())

    @classmethod
    def seeded(cls, seed: int) -> RandomSource:
        """A reproducible numpy PCG64 source. NOT private: for research and tests only."""
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        if int(seed) < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        return cls(_mode="seeded", _seed=int(seed), _labels=())

    @classmethod
    def keyed(cls, key: bytes) -> RandomSource:
        """The secure pipeline keyed with a caller's secret 32-byte ``key``: every holder of the key
        draws the same values (XNoise components the server regenerates from a revealed seed).

        As private as the key: derive it with HKDF from a secret seed, one key per purpose.
        """
        if not isinstance(key, bytes | bytearray) or len(key) != 32:
            raise ValueError("key must be 32 bytes")
        return cls(_mode="secure", _seed=None, _labels=(), _key=bytes(key))

    @classmethod
    def _from_key(cls, key: bytes) -> RandomSource:
        """Secure-mode pipeline with a caller-chosen key. For known-answer tests only."""
        return cls(_mode="secure", _seed=None, _labels=(), _key=bytes(key))

    def child(self, *labels: int | str) -> RandomSource:
        """An independent source for a sub-task (a client, a round, a layer).

        Seeded mode: deterministic in (seed, parent labels, labels), independent of call order,
        via ``numpy.random.SeedSequence(entropy=seed, spawn_key=...)``; string labels are mapped with
        SHA-256, never Python's salted ``hash``. Secure mode: a fresh, independently keyed source.
        """
        words = _label_words(labels)  # validates
        del words
        new_labels = self.labels + tuple(labels)
        if self.mode == "secure":
            return RandomSource(_mode="secure", _seed=None, _labels=new_labels)
        return RandomSource(_mode="seeded", _seed=self.seed, _labels=new_labels)

    @property
    def is_private(self) -> bool:
        """True only in secure mode."""
        return self.mode == "secure"

    def describe(self) -> str:
        """A one-line statement of the mode, fit to be written into run outputs."""
        if self.mode == "secure":
            return "secure (AES-256-CTR keystream keyed from secrets.token_bytes)"
        lab = f", labels={list(self.labels)}" if self.labels else ""
        return f"seeded(seed={self.seed}{lab}, numpy PCG64) - NOT private, NOT for deployment"

    def __repr__(self) -> str:
        return f"RandomSource<{self.describe()}>"

    # ------------------------------------------------------------------ raw bits
    def _keystream(self) -> _Keystream | None:
        """The secure keystream, re-keyed from ``secrets`` if this process is a fork of its owner.

        Without this, a forked worker would replay the parent's keystream (identical noise/masks).
        """
        if self._ks is not None and os.getpid() != self._pid:
            self._ks = _Keystream(secrets.token_bytes(32))
            self._pool, self._pool_pos, self._pid = b"", 0, os.getpid()
        return self._ks

    def _generator(self) -> np.random.Generator:
        """Seeded mode's PCG64 generator, from ``SeedSequence(entropy=seed, spawn_key=labels)`` (built
        at the first draw: the same generator as one built with the source)."""
        if self._gen is None:
            if self.mode != "seeded":  # pragma: no cover - internal invariant
                raise RuntimeError("no numpy generator in secure mode")
            ss = np.random.SeedSequence(entropy=self.seed, spawn_key=_label_words(self.labels))
            self._gen = np.random.Generator(np.random.PCG64(ss))
        return self._gen

    def _words(self, n: int) -> np.ndarray:
        """``n`` uniformly random uint64 words."""
        ks = self._keystream()
        if ks is not None:
            out = np.empty(n, dtype=np.uint64)
            ks.fill(out)
            return out
        return self._generator().integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)

    def random_bytes(self, n: int) -> bytes:
        """``n`` uniformly random bytes."""
        if isinstance(n, bool) or not isinstance(n, int | np.integer):
            raise TypeError(f"n must be an int, got {type(n).__name__}")
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        ks = self._keystream()
        if ks is not None:
            buf = np.empty(int(n), dtype=np.uint8)
            ks.fill(buf)
            return buf.tobytes()
        return self._generator().bytes(int(n))

    def random_bits(self, *, bits: int, size: Size = None) -> Any:
        """Uniform uint64 values in ``[0, 2**bits)``, ``1 <= bits <= 64`` (exact: masking)."""
        if isinstance(bits, bool) or not isinstance(bits, int | np.integer):
            raise TypeError(f"bits must be an int, got {type(bits).__name__}")
        if not 1 <= bits <= 64:
            raise ValueError(f"bits must be in [1, 64], got {bits}")
        n = math.prod(_shape(size)) if size is not None else 1
        w = self._words(n)
        if bits < 64:
            w &= np.uint64((1 << int(bits)) - 1)
        return _out(w, size)

    def randbelow(self, n: int) -> int:
        """One exactly uniform Python int in ``[0, n)`` for any ``n >= 1`` (rejection sampling)."""
        if isinstance(n, bool) or not isinstance(n, int | np.integer):
            raise TypeError(f"n must be an int, got {type(n).__name__}")
        n = int(n)
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if n == 1:
            return 0
        k = (n - 1).bit_length()
        nbytes = (k + 7) // 8
        mask = (1 << k) - 1
        while True:  # acceptance probability > 1/2
            v = int.from_bytes(self._small_bytes(nbytes), "little") & mask
            if v < n:
                return v

    def _small_bytes(self, k: int) -> bytes:
        """``k`` fresh random bytes, served from a 4 KiB pool to save per-call overhead."""
        self._keystream()  # drops a pool inherited through fork
        if self._pool_pos + k > len(self._pool):
            self._pool = self.random_bytes(max(4096, k))
            self._pool_pos = 0
        out = self._pool[self._pool_pos : self._pool_pos + k]
        self._pool_pos += k
        return out

    def integers(self, low: int, high: int, size: Size = None) -> Any:
        """Exactly uniform int64 values in ``[low, high)``.

        Secure mode masks keystream words to the bit length of ``high - low - 1`` and rejects values
        ``>= high - low`` (acceptance > 1/2), so there is no modulo bias. Seeded mode uses numpy's
        unbiased Lemire sampler.
        """
        for name, v in (("low", low), ("high", high)):
            if isinstance(v, bool) or not isinstance(v, int | np.integer):
                raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        low, high = int(low), int(high)
        if not -(2**63) <= low < 2**63 or not -(2**63) < high <= 2**63:
            raise ValueError(f"low and high must lie in the int64 range, got [{low}, {high})")
        r = high - low
        if r < 1:
            raise ValueError(f"high must be > low, got low={low}, high={high}")
        shape = _shape(size)
        n = math.prod(shape) if size is not None else 1
        if self._ks is None:  # seeded
            arr = self._generator().integers(low, high, size=n, dtype=np.int64)
            return _out(arr, size)
        vals = self._bounded(r, n)
        res = (vals + np.uint64(low % 2**64)).view(np.int64)  # wraps mod 2**64 -> exact result
        return _out(res, size)

    def _bounded(self, r: int, n: int) -> np.ndarray:
        """``n`` exact uniform uint64 values in ``[0, r)``, ``1 <= r <= 2**64``."""
        if r == 1:
            return np.zeros(n, dtype=np.uint64)
        k = (r - 1).bit_length()
        if r == 1 << k:  # a power of two: masking alone is exact
            w = self._words(n)
            if k < 64:
                w &= np.uint64(r - 1)
            return w
        mask = np.uint64((1 << k) - 1)
        bound = np.uint64(r)  # r < 2**64 here
        out = np.empty(n, dtype=np.uint64)
        filled = 0
        accept = r / float(1 << k)  # > 1/2
        while filled < n:
            need = n - filled
            w = self._words(int(need / accept * 1.01 + 6 * math.sqrt(need)) + 16)
            w &= mask
            w = w[w < bound]
            take = min(len(w), need)
            out[filled : filled + take] = w[:take]
            filled += take
        return out

    # ------------------------------------------------------------------ continuous
    def _unit_open(self, n: int) -> np.ndarray:
        """``n`` doubles uniform on the grid ``{1, 2, ..., 2**53} * 2**-53``, i.e. in (0, 1]."""
        w = self._words(n)
        w >>= np.uint64(11)
        u = w.astype(np.float64)
        u += 1.0
        u *= _TWO_POW_M53
        return u

    def uniform(self, size: Size = None) -> Any:
        """Doubles uniform on ``[0, 1)`` with 53 random bits (multiples of 2**-53)."""
        n = math.prod(_shape(size)) if size is not None else 1
        if self._ks is None:  # seeded
            return _out(self._generator().random(n), size)
        w = self._words(n)
        w >>= np.uint64(11)
        u = w.astype(np.float64)
        u *= _TWO_POW_M53
        return _out(u, size)

    def _std_normal_polar(self, n: int) -> np.ndarray:
        """Marsaglia & Bray (1964) polar method, vectorised; exact up to double rounding.

        Works in cache-sized chunks (~64k outputs): with fresh 1M-element temporaries the page
        faults and memory traffic cost more than the arithmetic.
        """
        out = np.empty(n, dtype=np.float64)
        filled = 0
        while filled < n:
            need = min(n - filled, _NORMAL_CHUNK)
            # acceptance pi/4 per pair, two outputs per accepted pair; ~25 sd of slack
            pairs = int(need / 2 / (math.pi / 4) * 1.01) + 32
            w = self._words(2 * pairs).view(np.int64)
            w >>= 10  # signed 54-bit ints -> exact doubles in [-1, 1) after scaling
            f = w.astype(np.float64)
            f *= _TWO_POW_M53
            x = f[:pairs]
            y = f[pairs:]
            s = x * x
            s += y * y
            idx = np.flatnonzero((s < 1.0) & (s > 0.0))
            k = len(idx)
            ss = s[idx]
            fac = np.log(ss)
            fac *= -2.0
            fac /= ss
            np.sqrt(fac, out=fac)
            kx = min(k, n - filled)
            dst = out[filled : filled + kx]
            np.take(x, idx[:kx], out=dst)
            dst *= fac[:kx]
            filled += kx
            ky = min(k, n - filled)
            if ky > 0:
                dst = out[filled : filled + ky]
                np.take(y, idx[:ky], out=dst)
                dst *= fac[:ky]
                filled += ky
        return out

    def normal(self, *, std: float = 1.0, size: Size = None) -> Any:
        """Gaussian N(0, std^2) doubles (secure: polar method on the keystream)."""
        sd = _check_positive("std", std)
        n = math.prod(_shape(size)) if size is not None else 1
        if self._ks is None:  # seeded
            return _out(self._generator().normal(0.0, sd, size=n), size)
        z = self._std_normal_polar(n)
        z *= sd
        return _out(z, size)

    def exponential(self, *, scale: float = 1.0, size: Size = None) -> Any:
        """Exponential(scale) doubles: ``-scale * log(u)``, ``u`` in (0, 1]."""
        sc = _check_positive("scale", scale)
        n = math.prod(_shape(size)) if size is not None else 1
        if self._ks is None:  # seeded
            return _out(self._generator().exponential(sc, size=n), size)
        e = np.log(self._unit_open(n))
        e *= -sc
        return _out(e, size)

    def laplace(self, *, scale: float, size: Size = None) -> Any:
        """Laplace(0, scale) doubles: a random sign times an Exponential(scale)."""
        sc = _check_positive("scale", scale)
        n = math.prod(_shape(size)) if size is not None else 1
        if self._ks is None:  # seeded
            return _out(self._generator().laplace(0.0, sc, size=n), size)
        w = self._words(n)
        sign_bits = w & np.uint64(1 << 63)  # the top bit is the sign
        w &= np.uint64((1 << 53) - 1)  # the 53 low bits, independent of the sign bit
        u = w.astype(np.float64)
        u += 1.0
        u *= _TWO_POW_M53
        e = np.log(u)
        e *= -sc
        # a set top bit gives log(u) * sc = -(log(u) * -sc) exactly: flip the float's sign bit
        ev = e.view(np.uint64)
        ev ^= sign_bits
        return _out(e, size)

    def gumbel(self, size: Size = None) -> Any:
        """Standard Gumbel doubles ``-log(-log(u))`` with ``u`` in (0, 1) (used for report-noisy-max)."""
        n = math.prod(_shape(size)) if size is not None else 1
        if self._ks is None:  # seeded
            return _out(self._generator().gumbel(0.0, 1.0, size=n), size)
        u = self._unit_open(n)
        # u == 1 would give +inf; map it to the largest double below 1 (probability 2**-53)
        np.minimum(u, 1.0 - 2.0**-53, out=u)
        g = -np.log(-np.log(u))
        return _out(g, size)

    def bernoulli(self, p: float, size: Size = None) -> Any:
        """Bernoulli(p) booleans, ``u < p`` with a 53-bit uniform ``u`` (p rounded to 2**-53)."""
        if isinstance(p, bool) or not isinstance(p, int | float | np.integer | np.floating):
            raise TypeError(f"p must be a real number, got {type(p).__name__}")
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p!r}")
        u = self.uniform(size)
        return u < float(p)

    def permutation(self, n: int) -> np.ndarray:
        """A uniformly random permutation of ``range(n)`` (Fisher–Yates with exact integers)."""
        if isinstance(n, bool) or not isinstance(n, int | np.integer):
            raise TypeError(f"n must be an int, got {type(n).__name__}")
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        n = int(n)
        if self._ks is None:  # seeded
            return self._generator().permutation(n).astype(np.int64)
        perm = np.arange(n, dtype=np.int64)
        if n < 2:
            return perm
        # j_i uniform in [0, i] for i = n-1, ..., 1, drawn exactly per position
        bounds = np.arange(n, 1, -1, dtype=np.uint64)  # i + 1
        js = self._bounded_vec(bounds)
        p = perm.tolist()
        for i, j in zip(range(n - 1, 0, -1), js.tolist(), strict=True):
            p[i], p[j] = p[j], p[i]
        return np.asarray(p, dtype=np.int64)

    def shuffle(self, x: np.ndarray) -> None:
        """Shuffle ``x`` in place along its first axis."""
        if not isinstance(x, np.ndarray):
            raise TypeError(f"x must be a numpy array, got {type(x).__name__}")
        x[...] = x[self.permutation(len(x))]

    def _bounded_vec(self, bounds: np.ndarray) -> np.ndarray:
        """Exact uniform values in ``[0, bounds[i])`` per element (bounds >= 1, < 2**63)."""
        m = len(bounds)
        bits = np.ceil(np.log2(bounds.astype(np.float64))).astype(np.int64)
        # make bits exact: smallest k with 2**k >= bound
        pw = np.left_shift(np.uint64(1), bits.astype(np.uint64))
        too_small = pw < bounds
        bits[too_small] += 1
        masks = (np.left_shift(np.uint64(1), bits.astype(np.uint64))) - np.uint64(1)
        out = np.empty(m, dtype=np.uint64)
        todo = np.arange(m)
        while len(todo):
            w = self._words(len(todo)) & masks[todo]
            ok = w < bounds[todo]
            out[todo[ok]] = w[ok]
            todo = todo[~ok]
        return out


def default_source(seed: int | None = None) -> RandomSource:
    """``None`` -> a secure source; an int -> a seeded (reproducible, NOT private) source."""
    if seed is None:
        return RandomSource.secure()
    return RandomSource.seeded(seed)
