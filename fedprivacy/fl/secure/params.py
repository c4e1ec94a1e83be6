"""A run config's secure-aggregation parameters: threshold, degree and encoding (wrappers over the
pure :mod:`fedprivacy.secagg.encoding`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedprivacy.secagg.encoding import EncodingSpec, largest_scale_encoding, round_parameters

if TYPE_CHECKING:
    from fedprivacy.accounting.events import Sampling
    from fedprivacy.config import RunConfig

__all__ = ["counts_private", "encoding_kind", "public_sampling", "expected_cohort_size", "largest_roster", "make_encoding",
           "secagg_parameters"]


def expected_cohort_size(cfg: RunConfig, *, population: int) -> int:
    """The cohort the round parameters are sized for (``cohort-size`` or ``round(q N)``)."""
    if cfg.sampling == "fixed":
        return int(cfg.cohort_size)
    return max(1, int(round(cfg.sample_rate * population)))


def largest_roster(cfg: RunConfig, *, population: int) -> int:
    """The largest roster a round can have: ``cohort-size`` (fixed cohorts), else the population
    (Poisson sampling may pick everyone). Runs account every round at this worst case (review F6)."""
    if cfg.sampling == "fixed":
        return int(cfg.cohort_size)
    return int(population)


def counts_private(cfg: RunConfig) -> bool:
    """Whether a distributed run keeps its per-round counts out of the published outputs (review F2):
    when the public's figure claims amplification, i.e. clients are sampled, the noise is exact
    (no colluders) and ``publish-participation`` is off."""
    sampled = cfg.sampling == "fixed" or cfg.sample_rate < 1.0
    return (cfg.privacy == "distributed" and sampled and cfg.secagg_colluders == 0
            and not cfg.publish_participation)


def public_sampling(cfg: RunConfig, *, population: int) -> Sampling:
    """The sampling the public's figure may claim: none unless :func:`counts_private`; else the run's,
    with a Poisson rate raised to the inclusion rate *given that the round completed* (review2 R8).

    Which rounds completed is public (the model moves or not). A Poisson round aborts before anything
    is released when its cohort is below ``m0 = max(t, 3)`` (the threshold, and secure aggregation's
    minimum), so given completion ``P[i in S] = P[i in S, n >= m0] / P[n >= m0] <= q / P[n >= m0]``
    (``n ~ Bin(N, q)``): every completed round is accounted at ``q' = min(1, q / P[n >= m0])``.
    (A round that aborts after its cohort was chosen, e.g. on dropouts, is handled by the summary: the
    public's figure then claims no amplification.)
    """
    from fedprivacy.accounting.events import NoSampling, PoissonSampling
    from fedprivacy.fl.privacy import sampling_object

    if not counts_private(cfg):
        return NoSampling()
    sampling = sampling_object(cfg, population)
    if not isinstance(sampling, PoissonSampling):
        return sampling  # fixed cohorts: every round has the same size (>= t, checked by the config)
    from scipy import stats

    t, _ = secagg_parameters(cfg, population=population)
    complete = float(stats.binom.sf(max(t, 3) - 1, population, sampling.rate))  # P[n >= m0]
    return PoissonSampling(rate=min(1.0, sampling.rate / complete)) if complete > 0 else NoSampling()


def secagg_parameters(cfg: RunConfig, *, population: int) -> tuple[int, int]:
    """``(threshold t, degree k)`` of the run, sized for the expected cohort ``n``
    (:func:`fedprivacy.secagg.encoding.round_parameters`)."""
    n = expected_cohort_size(cfg, population=population)
    if n < 3:
        raise ValueError(f"secagg needs an expected cohort of >= 3 clients, got {n} "
                         f"(population {population}, sampling {cfg.sampling})")
    return round_parameters(cohort=n, neighbours=cfg.secagg_neighbours, threshold=cfg.secagg_threshold,
                            colluders=cfg.secagg_colluders)


def encoding_kind(cfg: RunConfig) -> str:
    """``ddgauss`` for privacy ``distributed``, else ``fixed-point``."""
    return "ddgauss" if cfg.privacy == "distributed" else "fixed-point"


def make_encoding(cfg: RunConfig, *, population: int, dim: int, threshold: int,
                  rotation_seed: bytes = b"\x00" * 32, count_noise_std: float = 0.0) -> EncodingSpec:
    """The run's encoding: the largest power-of-two scale whose sum over ``population`` cannot wrap
    (:func:`fedprivacy.secagg.encoding.largest_scale_encoding`). Distributed DP always uses exact
    XNoise components (the legacy ``σ²/t`` share is not run: clients refuse it). ``count_noise_std``
    (adaptive clipping, :mod:`fedprivacy.fl.adaptive_clip`): the clipped-count coordinate's noise σ_b."""
    distributed = cfg.privacy == "distributed"
    return largest_scale_encoding(kind=encoding_kind(cfg), dim=dim, clip_norm=cfg.clip_norm,
                                  modulus_bits=cfg.secagg_bits, population=population,
                                  noise_multiplier=cfg.noise_multiplier, threshold=threshold,
                                  rotation_seed=rotation_seed, xnoise=distributed,
                                  colluders=cfg.secagg_colluders if distributed else 0,
                                  count_noise_std=count_noise_std)
