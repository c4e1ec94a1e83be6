"""Client encoding and server decoding for the distributed discrete Gaussian (privacy mode ``distributed``).

Kairouz, Liu & Steinke 2021 (ICML), Algorithm 1 "DDGauss", per client:

1. clip the flattened update to L2 norm ``C``;
2. scale by ``s`` (integer units per unit; ``1/gamma`` in the paper);
3. randomised Hadamard rotation with a public per-round seed (:mod:`.rotation`), zero-padded to
   ``m = 2^ceil(log2 d)``;
4. conditional stochastic rounding: round (unbiasedly) until the L2 norm is at most
   :func:`fedprivacy.accounting.kls.rounded_l2_norm_bound` (each try succeeds w.p. >= 1-beta);
5. add discrete Gaussian noise. With ``xnoise`` (exact): the components of
   :class:`fedprivacy.accounting.xnoise_design.XNoiseDesign` for the round's roster
   (:mod:`.xnoise`); the server removes the survivors' excess from revealed seeds, so the released
   sum carries exactly ``sigma^2 = (z C s)^2`` for every survivor count. Legacy: ``N_Z(0, sigma_c^2)``
   per coordinate, ``sigma_c = sigma / sqrt(t_min)``, so any ``t_min`` or more survivors together
   add at least ``sigma^2`` (``n/t_min`` times it when all ``n`` survive);
6. reduce mod ``2^b`` (modular clipping) and hand the residues to secure aggregation.

Adaptive clipping (``count_scale = k_b > 0``; Andrew et al. 2021): between steps 4 and 5 the client
appends one integer coordinate ``k_b (2b - 1)`` for its bit ``b = 1[||x|| < C]``, not rotated and noised
in step 5; one client moves the ``m + 1`` coordinates by at most ``hypot(Delta_2, k_b)`` in L2, the
sensitivity :meth:`DistributedDPConfig.release` accounts. The server reads the count with
:func:`decode_count`. Rationale: docs/DISTRIBUTED_DP.md, section "Adaptive clipping".

The server unmasks the sum mod ``2^b``, lifts it to ``[-2^(b-1), 2^(b-1))``, rotates back and divides
by ``s``. It never sees a sum without the clients' noise. The privacy of a completed round is
computed by :func:`fedprivacy.accounting.kls.distributed_round` from the survivors actually
present.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from fedprivacy.accounting.kls import DistributedRound, distributed_round, rounded_l2_norm_bound
from fedprivacy.accounting.release import (
    DistributedRelease,
    legacy_release,
    release_privacy,
    worst_case_release,
)
from fedprivacy.accounting.xnoise_design import XNoiseDesign
from fedprivacy.dp.clipping import l2_norm
from fedprivacy.dp.discrete import sample_discrete_gaussian
from fedprivacy.dp.rng import RandomSource
from fedprivacy.secagg.quantize import (
    Headroom,
    check_headroom,
    from_ring,
    to_ring,
)
from fedprivacy.secagg.rotation import inverse_rotate, padded_dim, rotate
from fedprivacy.secagg.xnoise import ComponentSeeds, client_noise

__all__ = ["MAX_COMPONENT_VARIANCE", "DistributedDPConfig", "decode_count", "decode_sum", "encode_update"]

#: Largest variance of one XNoise component an encoding may use: the exact sampler's table for it has
#: ~620k entries (its build time and memory grow with the std). Far above what 20 bits leave room for;
#: at 32 bits it bounds the scale (the rounding then costs <= ~0.1% of sensitivity at d = 2^20, z = 1).
MAX_COMPONENT_VARIANCE = 2.0**30


@functools.lru_cache(maxsize=256)
def _release(config: DistributedDPConfig, roster: int, survivors: int) -> DistributedRelease:
    return config._release(roster, survivors)


@dataclass(frozen=True, slots=True, kw_only=True)
class DistributedDPConfig:
    """Parameters of the distributed discrete Gaussian for one model of ``dim`` parameters.

    Attributes:
        dim: number of float parameters (before padding).
        clip_norm: L2 clip norm ``C``.
        noise_multiplier: ``z``; the sum of >= ``min_survivors`` clients carries std >= ``z C``.
        min_survivors: ``t_min``, the fewest clients whose noise is in a released sum (the SecAgg
            threshold or more).
        scale: integer units per unit (``1/gamma``).
        modulus_bits: ``b``.
        beta: conditional-rounding parameter (KLS use ``exp(-1/2)``); 0 disables conditioning.
        max_clients: the most clients that can be summed (headroom check).
        wrap_probability: allowed probability that the aggregate wraps (accuracy only).
        xnoise: exact noise components (:mod:`.xnoise`) instead of the legacy ``sigma^2/t_min`` share.
        colluders: ``c``, clients assumed to collude with the adversary (XNoise design and accounting).
        count_scale: ``k_b`` (adaptive clipping): the weight of the client's centred clipped-count bit in
            one extra coordinate; 0 = no count coordinate.
    """

    dim: int
    clip_norm: float
    noise_multiplier: float
    min_survivors: int
    scale: float
    modulus_bits: int = 32
    beta: float = math.exp(-0.5)
    max_clients: int
    wrap_probability: float = 1e-9
    xnoise: bool = False
    colluders: int = 0
    count_scale: int = 0

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")
        if isinstance(self.count_scale, bool) or not isinstance(self.count_scale, int) or self.count_scale < 0:
            raise ValueError(f"count_scale must be an int >= 0, got {self.count_scale!r}")
        for name in ("clip_norm", "noise_multiplier", "scale"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        if not 1 <= self.min_survivors <= self.max_clients:
            raise ValueError(f"min_survivors must be in [1, max_clients={self.max_clients}], "
                             f"got {self.min_survivors}")
        if not 0 <= self.colluders < self.min_survivors:
            raise ValueError(f"colluders must be in [0, min_survivors={self.min_survivors}), "
                             f"got {self.colluders}")
        if not 0 <= self.beta < 1:
            raise ValueError(f"beta must be in [0, 1), got {self.beta}")
        if self.xnoise and self.largest_component_variance > MAX_COMPONENT_VARIANCE:
            raise ValueError(
                f"scale {self.scale:g} makes XNoise components of variance up to "
                f"{self.largest_component_variance:.4g} > {MAX_COMPONENT_VARIANCE:g} (the exact sampler's "
                f"tables); use a smaller scale")
        self.headroom()  # refuses configurations whose sum could wrap

    @property
    def largest_component_variance(self) -> float:
        """Bound on every XNoise component's variance for any roster: ``sigma^2/(t - c)`` (base
        ``sigma^2/n``; binary components ``<= sigma^2 (n-1)/(n t)``; levels ``sigma^2/(h (h+1))``)."""
        return self.target_variance / (self.min_survivors - self.colluders)

    @property
    def rotated_dim(self) -> int:
        """Coordinates of the rotated update: ``m = 2^ceil(log2 dim)``."""
        return padded_dim(self.dim)

    @property
    def padded_dim(self) -> int:
        """Coordinates of the vector sent to secure aggregation: ``m``, plus 1 with a count coordinate."""
        return self.rotated_dim + (1 if self.count_scale else 0)

    @property
    def l2_sensitivity(self) -> float:
        """How far one client moves the integer vector (L2): ``Delta_2`` (rounded update), or
        ``hypot(Delta_2, k_b)`` with the count coordinate."""
        return math.hypot(self.norm_bound, self.count_scale)

    @property
    def local_sigma(self) -> float:
        """Per-client discrete Gaussian std in integer units: ``z C s / sqrt(t_min)``."""
        return self.noise_multiplier * self.clip_norm * self.scale / math.sqrt(self.min_survivors)

    @property
    def target_variance(self) -> float:
        """``sigma^2 = (z C s)^2``: the noise variance of the released sum (integer units)."""
        return (self.noise_multiplier * self.clip_norm * self.scale) ** 2

    def design(self, *, roster: int) -> XNoiseDesign:
        """The exact XNoise design of a round whose roster has ``roster`` clients."""
        return XNoiseDesign(total_variance=self.target_variance, roster=roster,
                            min_survivors=self.min_survivors, colluders=self.colluders)

    def release(self, *, roster: int, survivors: int) -> DistributedRelease:
        """The privacy of a completed round from the noise left in its sum: XNoise
        (:func:`~fedprivacy.accounting.release.release_privacy`) or the legacy share
        (:func:`~fedprivacy.accounting.release.legacy_release`, not exact).

        A pure function of the (frozen) config and the counts, cached: every client of an in-process
        simulation checks the same round's release (``ClientPolicy.check_distributed``), ~1 ms each.
        """
        return _release(self, roster, survivors)

    def _release(self, roster: int, survivors: int) -> DistributedRelease:
        if self.xnoise:
            rel = release_privacy(self.design(roster=roster), survivors=survivors,
                                  clip_norm=self.clip_norm, scale=self.scale, dim=self.padded_dim,
                                  beta=self.beta)
        else:
            rel = legacy_release(local_variance=self.local_sigma**2, survivors=survivors,
                                 colluders=self.colluders, clip_norm=self.clip_norm, scale=self.scale,
                                 dim=self.padded_dim, beta=self.beta)
        return self._with_count(rel)

    def _with_count(self, rel: DistributedRelease) -> DistributedRelease:
        """With a count coordinate the release above covers ``m + 1`` coordinates (eta, sampler); one
        client moves the vector by the joint ``hypot(Delta_2, k_b)`` (:attr:`l2_sensitivity`)."""
        if not self.count_scale:
            return rel
        return dataclasses.replace(rel, l2_sensitivity=self.l2_sensitivity)

    def worst_release(self, *, max_roster: int, participant: bool = False) -> DistributedRelease:
        """One release dominating every completed XNoise round with roster ``<= max_roster`` and any
        survivor count (:func:`~fedprivacy.accounting.release.worst_case_release`): the event and
        the slack a run charges for each completed round, whatever its counts."""
        if not self.xnoise:
            raise ValueError("worst_release needs exact XNoise components (xnoise=True)")
        return self._with_count(worst_case_release(
            total_variance=self.target_variance, min_survivors=self.min_survivors, colluders=self.colluders,
            max_roster=max_roster, clip_norm=self.clip_norm, scale=self.scale, dim=self.padded_dim,
            beta=self.beta, participant=participant))

    def slack_bound(self, *, roster: int) -> tuple[float, float]:
        """Per-round accounting slack ``(h, g)`` (``h = eta + sampler ratio``, ``g`` the sampler's
        truncation TV; the ``H'`` and ``G`` of :mod:`fedprivacy.accounting.audiences`) of
        :meth:`worst_release`: a bound for every roster ``<= roster`` and every survivor count."""
        r = self.worst_release(max_roster=roster)
        return r.eta + r.sampler_ratio, r.sampler_tv

    @property
    def released_variance_bound(self) -> float:
        """Largest noise variance a released sum can carry (headroom): ``sigma^2 t/(t-c)`` with
        XNoise (``sigma^2`` without colluders), ``max_clients sigma^2/t`` for the legacy share."""
        if self.xnoise:
            t = self.min_survivors
            return self.target_variance * t / (t - self.colluders)
        return self.max_clients * self.local_sigma**2

    @property
    def norm_bound(self) -> float:
        """L2 bound of a rounded client vector (integer units)."""
        return rounded_l2_norm_bound(l2_norm=self.clip_norm * self.scale, dim=self.rotated_dim,
                                     beta=self.beta)

    def headroom(self) -> Headroom:
        """:func:`~fedprivacy.secagg.quantize.check_headroom` for ``max_clients`` rotated, noisy inputs;
        with a count coordinate also ``max_clients k_b + sqrt(2 var ln(2/p))`` for it."""
        room = check_headroom(num_clients=self.max_clients, clip_norm=self.clip_norm, scale=self.scale,
                              modulus_bits=self.modulus_bits, dim=self.rotated_dim, rotated=True,
                              noise_variance_total=self.released_variance_bound,
                              failure_probability=self.wrap_probability)
        if self.count_scale:
            tail = math.sqrt(2.0 * self.released_variance_bound * math.log(2.0 / self.wrap_probability))
            bound = self.max_clients * self.count_scale + tail
            if bound > room.limit:
                raise ValueError(f"the count coordinate could wrap mod 2^{self.modulus_bits}: "
                                 f"{self.max_clients}*{self.count_scale} + noise tail {tail:.4g} > "
                                 f"{room.limit}; lower the scale or raise modulus_bits")
        return room

    def privacy(self, *, num_survivors: int, neighbouring: str = "add-remove",
                corrupted: int = 0) -> DistributedRound:
        """The zCDP of a completed round with ``num_survivors`` noisy inputs."""
        if self.count_scale:
            raise ValueError("the legacy zCDP bound does not cover a count coordinate (count_scale > 0); "
                             "use release()")
        return distributed_round(clip_norm=self.clip_norm, scale=self.scale, dim=self.padded_dim,
                                 beta=self.beta, local_sigma=self.local_sigma,
                                 num_survivors=num_survivors, neighbouring=neighbouring,
                                 corrupted=corrupted)


def encode_update(
    update: np.ndarray, *, config: DistributedDPConfig, rotation_seed: bytes, rng: RandomSource,
    max_tries: int = 1000, components: ComponentSeeds | None = None,
) -> np.ndarray:
    """Steps 1-6 above: a flat float update -> uint32 residues mod ``2^b`` of length ``padded_dim``.

    The steps are small functions so that a new noise component slots in between rounding and the
    ring: :func:`_clip_scale_rotate` (1-3), :func:`conditional_round` (4), the discrete Gaussian
    (5) added to the int64 vector in place, and :func:`~fedprivacy.secagg.quantize.to_ring` (6). Output and random draws are
    bit-identical to the plain step-by-step encoder (``tests/secagg/test_secagg_fast_paths.py``).

    With ``config.xnoise`` the client's ``components`` (its own seeds for the round's design) are
    required; their design must be the one this config gives for the same roster.
    """
    if config.xnoise:
        if components is None:
            raise ValueError("components are required when xnoise=True (the client's seeds)")
        if components.design != config.design(roster=components.design.roster):
            raise ValueError("components were drawn for another noise design than this config's")
    elif components is not None:
        raise ValueError("components given but xnoise=False")
    r = _clip_scale_rotate(update, config=config, rotation_seed=rotation_seed)
    q = conditional_round(r, bound=config.norm_bound, rng=rng, beta=config.beta,
                          max_tries=max_tries)
    if config.count_scale:  # the centred clipped-count bit, one integer coordinate (module docstring)
        q = np.append(q, np.int64(config.count_scale * (1 if _unclipped(update, config) else -1)))
    if components is not None:
        q += client_noise(components, size=q.shape[0], rng=rng)
    else:
        q += sample_discrete_gaussian(sigma=config.local_sigma, size=q.shape[0], rng=rng)
    return to_ring(q, modulus_bits=config.modulus_bits)


def _unclipped(update: np.ndarray, config: DistributedDPConfig) -> bool:
    """The adaptive-clipping bit: the update's norm is below ``C (1 - UNCLIPPED_TOLERANCE)``."""
    from fedprivacy.dp.adaptive_clipping import UNCLIPPED_TOLERANCE

    norm = l2_norm(np.asarray(update, dtype=np.float64).reshape(-1))
    return bool(norm < config.clip_norm * (1.0 - UNCLIPPED_TOLERANCE))


def _clip_scale_rotate(update: np.ndarray, *, config: DistributedDPConfig,
                       rotation_seed: bytes) -> np.ndarray:
    """Steps 1-3: clip to ``C``, scale by ``s``, rotate (float64, length ``padded_dim``)."""
    x = np.asarray(update, dtype=np.float64).reshape(-1)
    if x.shape[0] != config.dim:
        raise ValueError(f"update must have {config.dim} entries, got {x.shape[0]}")
    if not np.isfinite(x).all():
        raise ValueError("update must be finite")
    norm = l2_norm(x)  # no BLAS: its thread pool fights torch's (see fedprivacy.dp.clipping)
    x = x * (config.clip_norm / norm) if norm > config.clip_norm else x.copy()
    x *= config.scale  # two roundings, as clip-then-scale: the same floats as before
    return rotate(x, seed=rotation_seed)


_CHUNK = 1 << 15  # doubles per pass of the rounding (256 KiB temporaries stay in cache)
_EXACT = 2.0**52  # sums of integer squares below this are exact in float64, in any order


def conditional_round(r: np.ndarray, *, bound: float, rng: RandomSource, beta: float,
                      max_tries: int = 1000) -> np.ndarray:
    """KLS 2021 conditional randomised rounding: ``floor(r) + Bernoulli(frac)`` until ``||q|| <= bound``.

    One uniform per coordinate per try, drawn in order as by
    :func:`fedprivacy.secagg.quantize.stochastic_round` on the whole vector (a try that already
    exceeds the bound still draws its remaining uniforms, so the stream stays the same). The vector
    is processed in cache-sized chunks; the squared norm of the integer vector is summed chunk by
    chunk, which is exact, and hence the same decision as the plain whole-vector float sum, while the
    bound is below 2^26 (``C s < 2^26``; the engine keeps ``C s <= 2^20``). Larger bounds take the
    plain path. Each try succeeds with probability >= 1 - beta (``rounded_l2_norm_bound``).

    Returns:
        the rounded int64 vector, shaped like ``r``.

    Raises:
        RuntimeError: ``max_tries`` tries failed (probability <= beta**max_tries).
    """
    r = np.asarray(r, dtype=np.float64)
    if not np.isfinite(r).all():
        raise ValueError("x must be finite")
    bound_sq = bound * bound
    if not bound_sq < _EXACT:
        return _conditional_round_whole(r, bound_sq=bound_sq, rng=rng, beta=beta, max_tries=max_tries)
    flat = r.reshape(-1)
    n = flat.shape[0]
    out = np.empty(n, dtype=np.int64)
    for _ in range(max_tries):
        total = 0.0
        for start in range(0, n, _CHUNK):
            if total > bound_sq:  # this try has failed: draw the rest of its uniforms, unused
                rng.uniform(size=n - start)
                break
            part = flat[start : start + _CHUNK]
            q = np.floor(part)
            frac = part - q
            q += rng.uniform(size=part.shape[0]) < frac
            total += float(np.add.reduce(q * q))
            out[start : start + _CHUNK] = q  # integral floats: the cast is exact
        if total <= bound_sq:
            return out.reshape(r.shape)
    raise RuntimeError(f"conditional rounding failed {max_tries} times (beta={beta})")


def _conditional_round_whole(r: np.ndarray, *, bound_sq: float, rng: RandomSource, beta: float,
                             max_tries: int) -> np.ndarray:
    """The plain whole-vector loop (bounds beyond 2^26, where float sums of squares round)."""
    lo = np.floor(r)
    frac = r - lo
    for _ in range(max_tries):
        q = lo + (rng.uniform(size=r.shape) < frac)
        if float(np.add.reduce(q * q)) <= bound_sq:  # no BLAS dot (see fedprivacy.dp.clipping)
            return q.astype(np.int64)
    raise RuntimeError(f"conditional rounding failed {max_tries} times (beta={beta})")


def decode_sum(total: np.ndarray, *, config: DistributedDPConfig, rotation_seed: bytes) -> np.ndarray:
    """The unmasked sum mod ``2^b`` -> the noisy float sum of the clipped updates (length ``dim``)."""
    t = np.asarray(total)
    if t.dtype != np.uint32 or t.shape != (config.padded_dim,):
        raise ValueError(f"total must be uint32 of shape ({config.padded_dim},)")
    lifted = from_ring(t[: config.rotated_dim], modulus_bits=config.modulus_bits).astype(np.float64)
    return inverse_rotate(lifted, seed=rotation_seed, dim=config.dim) / config.scale


def decode_count(total: np.ndarray, *, config: DistributedDPConfig) -> float:
    """The noised centred count ``sum_i (b_i - 1/2) + N`` from the count coordinate (``count_scale``):
    its noise has std ``sqrt(V)/(2 k_b)`` (V the coordinate's noise variance, integer units)."""
    if not config.count_scale:
        raise ValueError("this encoding has no count coordinate (count_scale=0)")
    t = np.asarray(total)
    if t.dtype != np.uint32 or t.shape != (config.padded_dim,):
        raise ValueError(f"total must be uint32 of shape ({config.padded_dim},)")
    lifted = from_ring(t[-1:], modulus_bits=config.modulus_bits).astype(np.float64)
    return float(lifted[0]) / (2.0 * config.count_scale)
