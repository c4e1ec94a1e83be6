"""Exact XNoise designs: noise components whose honest kept part is ``sigma^2`` for every survivor count.

Dordis (Jiang, Wang & Chen, EuroSys 2024, Sec. 4, "XNoise") lets every client add more noise than it
needs and the server remove, from seeds revealed once the survivors are agreed, what the actual
survivors over-provided. The designs here are exact: for every agreed count ``s >= t`` the honest
noise left has discrete-Gaussian parameters summing to exactly ``sigma^2`` (``n`` roster, ``t``
fewest survivors, ``c`` colluders who know their own noise).

* ``binary`` (``c = 0``): unit ``b = sigma^2/n``; component 0 is ``N_Z(0, b)`` (never removed),
  components ``j = 1..B`` (``B = bit_length(ceil((n - t)/t))``) are ``N_Z(0, b 2^(j-1))``; the
  survivor of rank ``r`` keeps ``k_r = (n-s)//s + [r < (n-s) mod s]`` units, ``sum_r (1 + k_r) b = sigma^2``.
* ``levels`` (any ``c``): telescoping components ``sigma^2/(n-c)`` and ``sigma^2/h - sigma^2/(h+1)``
  for ``h = t-c .. n-c-1``; at count ``s`` a client keeps exactly ``sigma^2/(s-c)``.

Assumptions: ``s`` is the survivor set certified by secure aggregation's consistency check, and all
survivors agree on the design (:meth:`XNoiseDesign.fingerprint`). Why exact, and the malicious-server
argument: docs/DISTRIBUTED_DP.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedprivacy.accounting.events import _check_int as _int_arg

__all__ = ["DESIGNS", "MAX_SEEDED_COMPONENTS", "XNoiseDesign"]

#: Seeded components one client may be asked to draw (a client-side cap; ``levels`` needs n - t).
MAX_SEEDED_COMPONENTS = 64

DESIGNS = ("binary", "levels")


@dataclass(frozen=True, slots=True, kw_only=True)
class XNoiseDesign:
    """The noise components every client of one round adds, and which of them survive removal.

    Exact: for every agreed survivor count ``s`` in ``[min_survivors, roster]`` the honest kept noise
    has parameters summing to exactly ``total_variance`` (module docstring). Component 0 is never
    removed (drawn from the client's own secure source); components ``1..`` are seeded and removable.

    Attributes:
        total_variance: ``sigma^2``, the target variance of the released sum (integer units squared).
        roster: ``n``, clients in the round's roster (the most survivors there can be).
        min_survivors: ``t``, the fewest survivors of a completed round.
        colluders: ``c``, clients assumed to collude with the adversary (their noise is not counted).
        kind: ``"binary"`` (``c = 0`` only) or ``"levels"``; empty picks ``binary`` for ``c = 0``.
        max_components: refuse designs with more seeded components than this (client-side cap).
    """

    total_variance: float
    roster: int
    min_survivors: int
    colluders: int = 0
    kind: str = ""
    max_components: int = MAX_SEEDED_COMPONENTS

    def __post_init__(self) -> None:
        v = self.total_variance
        if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and v > 0):
            raise ValueError(f"total_variance must be a finite number > 0, got {v!r}")
        object.__setattr__(self, "total_variance", float(v))
        n = _int_arg("roster", self.roster, 1)
        t = _int_arg("min_survivors", self.min_survivors, 1)
        c = _int_arg("colluders", self.colluders, 0)
        _int_arg("max_components", self.max_components, 0)
        if t > n:
            raise ValueError(f"min_survivors must be <= roster={n}, got {t}")
        if c >= t:
            raise ValueError(f"colluders must be < min_survivors={t} (some honest noise must "
                             f"remain), got {c}")
        kind = self.kind or ("binary" if c == 0 else "levels")
        if kind not in DESIGNS:
            raise ValueError(f"kind must be one of {DESIGNS}, got {self.kind!r}")
        if kind == "binary" and c:
            raise ValueError("kind='binary' is exact only without colluders (colluders=0); "
                             "use kind='levels'")
        object.__setattr__(self, "kind", kind)
        if self.num_seeded > self.max_components:
            raise ValueError(
                f"the {kind} design needs {self.num_seeded} seeded noise components "
                f"(roster={n}, min_survivors={t}, colluders={c}), more than max_components="
                f"{self.max_components}; raise min_survivors or max_components")

    # ------------------------------------------------------------------ structure
    @property
    def _bits(self) -> int:
        n, t = self.roster, self.min_survivors
        return (-(-(n - t) // t)).bit_length()  # bit_length(ceil((n - t)/t))

    @property
    def num_seeded(self) -> int:
        """Removable (seeded) components per client."""
        if self.kind == "binary":
            return self._bits
        return self.roster - self.min_survivors

    @property
    def unit(self) -> float:
        """Variance of component 0 (``sigma^2/n`` binary, ``sigma^2/(n-c)`` levels)."""
        return self.total_variance / (self.roster - self.colluders)

    @property
    def variances(self) -> tuple[float, ...]:
        """Variance parameter of each component (index 0: the kept base)."""
        b = self.unit
        if self.kind == "binary":
            return (b,) + tuple(b * float(1 << j) for j in range(self._bits))
        s2, top = self.total_variance, self.roster - self.colluders
        # component j (j >= 1) is the level h = top - j: sigma^2/h - sigma^2/(h+1)
        return (b,) + tuple(s2 / h - s2 / (h + 1) for h in range(top - 1, self.min_survivors
                                                                   - self.colluders - 1, -1))

    @property
    def client_variance(self) -> float:
        """Total variance one client draws (all components)."""
        return math.fsum(self.variances)

    def _check_count(self, survivors: int) -> int:
        s = _int_arg("survivors", survivors, 1)
        if not self.min_survivors <= s <= self.roster:
            raise ValueError(f"survivors must be in [min_survivors={self.min_survivors}, "
                             f"roster={self.roster}], got {s}")
        return s

    def kept(self, *, survivors: int, rank: int) -> tuple[int, ...]:
        """Components the survivor of ``rank`` (0-based, by node id) keeps among ``survivors``."""
        s = self._check_count(survivors)
        r = _int_arg("rank", rank, 0)
        if r >= s:
            raise ValueError(f"rank must be < survivors={s}, got {r}")
        if self.kind == "binary":
            q, rem = divmod(self.roster - s, s)
            k = q + (1 if r < rem else 0)
            return (0,) + tuple(j + 1 for j in range(self._bits) if (k >> j) & 1)
        return tuple(range(0, self.roster - s + 1))  # levels h >= s - c

    def removable(self, *, survivors: int, rank: int) -> tuple[int, ...]:
        """Components whose seeds are revealed for this survivor (the excess; never component 0)."""
        keep = set(self.kept(survivors=survivors, rank=rank))
        return tuple(j for j in range(1, self.num_seeded + 1) if j not in keep)

    def honest_kept_variances(self, *, survivors: int) -> tuple[float, ...]:
        """Component variances of the honest survivors' kept noise (worst case over colluders)."""
        s = self._check_count(survivors)
        var = self.variances
        if self.kind == "binary":  # c = 0: every survivor is honest
            return tuple(var[j] for r in range(s) for j in self.kept(survivors=s, rank=r))
        one = tuple(var[j] for j in self.kept(survivors=s, rank=0))
        return one * (s - self.colluders)  # equal shares: any s - c survivors hold the same

    def honest_variance(self, *, survivors: int) -> float:
        """Sum of the honest kept parameters: ``total_variance`` (up to rounding) for every ``s``."""
        return math.fsum(self.honest_kept_variances(survivors=survivors))

    def released_variance(self, *, survivors: int) -> float:
        """Variance parameter of all noise left in the released sum (colluders' included)."""
        s = self._check_count(survivors)
        var = self.variances
        return math.fsum(var[j] for r in range(s) for j in self.kept(survivors=s, rank=r))

    def fingerprint(self) -> bytes:
        """Canonical bytes of the design, for the survivors' consistency check (all must agree)."""
        return (f"fedprivacy/v1/xnoise|{self.kind}|n={self.roster}|t={self.min_survivors}|"
                f"c={self.colluders}|var={self.total_variance.hex()}").encode()

