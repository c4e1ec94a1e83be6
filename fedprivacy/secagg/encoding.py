"""How a client turns its clipped float update into residues mod ``2^b`` for secure aggregation (pure).

Moved out of ``fedprivacy/fl/secure.py`` with explicit parameters instead of a run config;
:mod:`fedprivacy.fl.secure.params` maps a ``RunConfig`` onto these functions.

Encodings (:class:`EncodingSpec`), both on the client, from the update it already clipped to ``C``:

* ``fixed-point`` (no DP): clip, scale by ``s``, stochastic rounding, mod ``2^b``
  (:func:`fedprivacy.secagg.quantize.encode_fixed_point`). The decoded sum differs from the sum of
  the clipped float updates by less than ``n/s`` per coordinate (``n`` survivors).
* ``ddgauss`` (distributed DP): the distributed discrete Gaussian of Kairouz, Liu & Steinke 2021
  (:mod:`fedprivacy.secagg.ddp`): rotation, conditional rounding, ``N_Z(0, (zCs)^2/t)`` per client,
  modular clipping. Any ``t`` or more survivors carry at least ``(zCs)^2`` of noise variance.
  With ``count_scale = k_b > 0`` (adaptive clipping) one more coordinate carries the client's centred
  clipped-count bit ``k_b (2b - 1)`` under the same noise (:mod:`fedprivacy.secagg.ddp`).

Round parameters: :func:`round_parameters` chooses the threshold ``t`` and graph degree ``k`` for an
expected cohort (Bonawitz et al. 2017; Bell et al. 2020), :func:`round_degree` the degree of one round.
"""

from __future__ import annotations

import functools
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from fedprivacy.secagg.graph import min_safe_threshold

if TYPE_CHECKING:
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.secagg.ddp import DistributedDPConfig
    from fedprivacy.secagg.xnoise import ComponentSeeds

__all__ = ["ENCODINGS", "EncodingSpec", "largest_scale_encoding", "round_degree", "round_parameters"]

ENCODINGS = ("fixed-point", "ddgauss")
_MAX_SCALED_CLIP = 2.0**20  # C*s beyond this adds no precision worth having


def round_parameters(*, cohort: int, neighbours: int = 0, threshold: int = 0,
                     colluders: int = 0) -> tuple[int, int]:
    """``(threshold t, degree k)`` for an expected cohort of ``cohort`` clients.

    Automatic degree (``neighbours = 0``): the complete graph for ``n <= 30`` (Bonawitz et al. 2017),
    else ``2 ceil(log2 n) + 1`` (SecAgg+, Bell et al. 2020; 15 for n = 100, see ``docs/SECAGG.md``
    "Choosing k"). Automatic threshold (``threshold = 0``): the smallest safe one,
    ``t = floor((k + 1)/2) + 1`` (:func:`fedprivacy.secagg.graph.min_safe_threshold`).

    Raises:
        ValueError: the threshold does not fit the cohort or is unsafe for the degree.
    """
    n = cohort
    if neighbours:
        k = min(neighbours, n - 1)
    else:
        k = n - 1 if n <= 30 else min(n - 1, 2 * math.ceil(math.log2(n)) + 1)
    if k <= colluders:
        raise ValueError(f"secagg-neighbours must be > secagg-colluders={colluders}, got {k}")
    t = threshold or min_safe_threshold(k, colluders=colluders)
    if t > n:
        raise ValueError(f"secagg-threshold must be <= the expected cohort {n}, got {t}")
    if 2 * t <= k + 1 + colluders:
        raise ValueError(f"secagg-threshold must be > (secagg-neighbours+1+secagg-colluders)/2 = "
                         f"{(k + 1 + colluders) / 2} (Bonawitz et al. 2017, Sec. 4), got {t}")
    return t, k


def round_degree(*, cohort: int, degree: int, threshold: int, colluders: int = 0) -> int:
    """The degree used for a cohort of ``cohort`` clients: ``min(n-1, k, 2t-2-c)`` keeps ``t`` safe
    (``t > (k+1+c)/2``)."""
    return max(2, min(cohort - 1, degree, 2 * threshold - 2 - colluders))


@dataclass(frozen=True, slots=True, kw_only=True)
class EncodingSpec:
    """How a client turns its clipped float update into ``padded_dim`` residues mod ``2^b`` (public)."""

    kind: str
    dim: int
    clip_norm: float
    scale: float
    modulus_bits: int
    max_clients: int
    noise_multiplier: float = 0.0
    min_survivors: int = 1
    rotation_seed: bytes = b""
    xnoise: bool = False  # exact XNoise components (fedprivacy.secagg.xnoise) instead of the t-share
    colluders: int = 0
    count_scale: int = 0  # adaptive clipping: weight k_b of the centred count bit (extra coordinate)

    def __post_init__(self) -> None:
        if self.kind not in ENCODINGS:
            raise ValueError(f"kind must be one of {ENCODINGS}, got {self.kind!r}")
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")
        if self.max_clients < 1:
            raise ValueError(f"max_clients must be >= 1, got {self.max_clients}")
        if not self.clip_norm > 0:
            raise ValueError(f"clip_norm must be > 0, got {self.clip_norm}")
        if not self.scale > 0:
            raise ValueError(f"scale must be > 0, got {self.scale}")
        if self.kind == "ddgauss":
            if not self.noise_multiplier > 0:
                raise ValueError(f"noise_multiplier must be > 0 for ddgauss, got {self.noise_multiplier}")
            if len(self.rotation_seed) != 32:
                raise ValueError(
                    f"rotation_seed must be 32 bytes for ddgauss, got {len(self.rotation_seed)}")
            self.ddp()  # headroom check
        else:
            from fedprivacy.secagg.quantize import check_headroom

            if self.count_scale:
                raise ValueError("count_scale needs the ddgauss encoding (the count must carry DP noise), "
                                 f"got kind {self.kind!r}")

            check_headroom(num_clients=self.max_clients, clip_norm=self.clip_norm, scale=self.scale,
                           modulus_bits=self.modulus_bits)

    def ddp(self) -> DistributedDPConfig:
        """The distributed-DP parameters of this encoding (immutable; built once per process for equal
        fields of equal types: a client asks ~4 times a round, ~45 µs of checks each)."""
        return _ddp_config(dim=self.dim, clip_norm=self.clip_norm, noise_multiplier=self.noise_multiplier,
                           min_survivors=self.min_survivors, scale=self.scale,
                           modulus_bits=self.modulus_bits, max_clients=self.max_clients,
                           xnoise=self.xnoise, colluders=self.colluders, count_scale=self.count_scale)

    @property
    def padded_dim(self) -> int:
        if self.kind == "ddgauss":
            from fedprivacy.secagg.rotation import padded_dim

            return padded_dim(self.dim) + (1 if self.count_scale else 0)
        return self.dim

    def max_abs_error(self, *, num_clients: int) -> float:
        """Bound on the decoding error per coordinate of a fixed-point sum (``n/s``); ddgauss: noise."""
        return num_clients / self.scale

    def encode(self, flat: np.ndarray, *, rng: RandomSource,
               components: ComponentSeeds | None = None) -> np.ndarray:
        """``components``: the client's XNoise seeds for the round (required when ``xnoise``)."""
        if self.kind == "ddgauss":
            from fedprivacy.secagg.ddp import encode_update

            return encode_update(flat, config=self.ddp(), rotation_seed=self.rotation_seed, rng=rng,
                                 components=components)
        from fedprivacy.secagg.quantize import encode_fixed_point

        return encode_fixed_point(flat, clip_norm=self.clip_norm, scale=self.scale,
                                  modulus_bits=self.modulus_bits, rng=rng)

    def decode(self, total: np.ndarray) -> np.ndarray:
        if self.kind == "ddgauss":
            from fedprivacy.secagg.ddp import decode_sum

            return decode_sum(total, config=self.ddp(), rotation_seed=self.rotation_seed)
        from fedprivacy.secagg.quantize import decode_fixed_point

        return decode_fixed_point(total, scale=self.scale, modulus_bits=self.modulus_bits)

    def decode_count(self, total: np.ndarray) -> float:
        """The noised centred clipped count ``sum (b_i - 1/2) + noise`` (``count_scale > 0`` only)."""
        from fedprivacy.secagg.ddp import decode_count

        return decode_count(total, config=self.ddp())

    def to_record(self) -> dict[str, Any]:
        return {"kind": self.kind, "dim": self.dim, "clip_norm": float(self.clip_norm),
                "scale": float(self.scale), "modulus_bits": self.modulus_bits,
                "max_clients": self.max_clients, "noise_multiplier": float(self.noise_multiplier),
                "min_survivors": self.min_survivors, "rotation_seed": bytes(self.rotation_seed),
                "xnoise": bool(self.xnoise), "colluders": int(self.colluders),
                "count_scale": int(self.count_scale)}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> EncodingSpec:
        """Inverse of :meth:`to_record`; the field types come from the dataclass."""
        casts = _field_casts(cls)  # type: ignore[arg-type]  # (a class is hashable; mypy: dataclass __hash__)
        missing = sorted(set(casts) - set(record))
        if missing:
            raise ValueError(f"encoding record misses {missing}")
        return cls(**{n: cast(record[n]) for n, cast in casts.items()})


@functools.cache
def _field_casts(cls: Any) -> dict[str, Callable[[Any], Any]]:
    """Field name -> its annotated type, in field order (``typing.get_type_hints`` once per class: it
    re-evaluates every annotation string, ~0.1 ms a call)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


@functools.lru_cache(maxsize=64, typed=True)
def _ddp_config(**fields: Any) -> DistributedDPConfig:
    from fedprivacy.secagg.ddp import DistributedDPConfig

    return DistributedDPConfig(**fields)


def _largest_scale(*, clip_norm: float, fits: Callable[[float], bool]) -> float:
    """The largest power of two ``s`` with ``C s <= 2^20`` and ``fits(s)`` (headroom)."""
    s = 2.0 ** math.floor(math.log2(_MAX_SCALED_CLIP / clip_norm))
    while s > 2.0**-30:
        if fits(s):
            return s
        s /= 2.0
    raise ValueError("no fixed-point scale fits the modulus; raise secagg-bits or lower clip-norm")


def largest_scale_encoding(*, kind: str, dim: int, clip_norm: float, modulus_bits: int, population: int,
                           noise_multiplier: float = 0.0, threshold: int = 1,
                           rotation_seed: bytes = b"\x00" * 32, xnoise: bool = False,
                           colluders: int = 0, count_noise_std: float = 0.0,
                           server_noise_multiplier: float = 0.0) -> EncodingSpec:
    """The encoding with the largest power-of-two scale whose sum over ``population`` cannot wrap.

    ``server_noise_multiplier`` (``fixed-point``, central noise over secure aggregation): the sum plus
    the server's ``N(0, (z (C s + sqrt(d)))^2)`` must not wrap either, at probability 1e-9.

    For ``ddgauss`` the headroom check counts the rotated signal and the noise tail at probability
    1e-9; it also keeps a factor 4 of spare range so that the scale (and hence the privacy event) is
    the same in every round. ``count_noise_std`` (``ddgauss``, adaptive clipping) adds the count
    coordinate with ``k_b = count_scale_for(noise_std=z C s, count_noise_std=...)`` at each scale.
    """
    dd = kind == "ddgauss"
    base: dict[str, Any] = dict(kind=kind, dim=dim, clip_norm=clip_norm, modulus_bits=modulus_bits,
                                max_clients=4 * population if dd else population,
                                noise_multiplier=noise_multiplier if dd else 0.0,
                                min_survivors=threshold if dd else 1,
                                rotation_seed=rotation_seed if dd else b"",
                                xnoise=xnoise and dd, colluders=colluders if dd else 0)

    if count_noise_std and not dd:
        raise ValueError("count_noise_std needs kind='ddgauss' (the count must carry DP noise)")

    def count_scale(s: float) -> int:
        if not count_noise_std:
            return 0
        from fedprivacy.dp.adaptive_clipping import count_scale_for

        return count_scale_for(noise_std=noise_multiplier * clip_norm * s, count_noise_std=count_noise_std)

    def fits(s: float) -> bool:
        try:
            EncodingSpec(scale=s, count_scale=count_scale(s), **base)
            if server_noise_multiplier and not dd:
                from fedprivacy.secagg.quantize import check_headroom

                noise_std = server_noise_multiplier * (clip_norm * s + math.sqrt(dim))
                check_headroom(num_clients=population, clip_norm=clip_norm, scale=s, modulus_bits=modulus_bits,
                               dim=dim, noise_variance_total=noise_std**2)
        except ValueError:
            return False
        return True

    s = _largest_scale(clip_norm=clip_norm, fits=fits)
    return EncodingSpec(scale=s, count_scale=count_scale(s), **base)
