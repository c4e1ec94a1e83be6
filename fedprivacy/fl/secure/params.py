"""A run config's secure-aggregation parameters: threshold, degree and encoding (wrappers over the
pure :mod:`fedprivacy.secagg.encoding`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fedprivacy.secagg.encoding import EncodingSpec, largest_scale_encoding, round_parameters

if TYPE_CHECKING:
    from fedprivacy.accounting.completion import CohortRuleSampling
    from fedprivacy.accounting.events import Sampling
    from fedprivacy.config import RunConfig

__all__ = ["COHORT_RULE_ABORT", "completes", "counts_private", "encoding_kind", "is_cohort_rule_abort",
           "public_sampling", "expected_cohort_size", "largest_roster", "make_encoding",
           "secagg_parameters"]


def expected_cohort_size(cfg: RunConfig, *, population: int) -> int:
    """The cohort the round parameters are sized for (``cohort-size`` or ``round(q N)``; ``privacy =
    "dpftrl"`` trains one of ``dpftrl-groups`` g fixed groups a round: ``round(q floor(N / g))``, the
    smallest group's)."""
    if cfg.sampling == "fixed":
        return int(cfg.cohort_size)
    groups = cfg.dpftrl_groups if cfg.privacy == "dpftrl" else 1
    return max(1, int(round(cfg.sample_rate * (population // groups))))


def largest_roster(cfg: RunConfig, *, population: int) -> int:
    """The largest roster a round can have: ``cohort-size`` (fixed cohorts), else the population
    (Poisson sampling may pick everyone). Runs account every round at this worst case."""
    if cfg.sampling == "fixed":
        return int(cfg.cohort_size)
    return int(population)


def counts_private(cfg: RunConfig) -> bool:
    """Whether a distributed run keeps its per-round counts out of the published outputs:
    when the public's figure claims amplification, i.e. clients are sampled, the noise is exact
    (no colluders) and ``publish-participation`` is off."""
    sampled = cfg.sampling == "fixed" or cfg.sample_rate < 1.0
    return sampled and cfg.secagg_colluders == 0 and not cfg.publish_participation


def completes(cfg: RunConfig, *, population: int) -> Callable[[int], bool]:
    """Whether a round whose Poisson cohort has ``n`` clients completes when nobody drops out: the
    rule :class:`fedprivacy.fl.secure.SecureRound` and the protocol apply (``n >= t``, then
    :func:`fedprivacy.secagg.graph.check_safe` for the round's degree, which needs ``n >= 3``)."""
    from fedprivacy.secagg.encoding import round_degree
    from fedprivacy.secagg.graph import check_safe

    t, k = secagg_parameters(cfg, population=population)
    c = cfg.secagg_colluders

    def rule(n: int) -> bool:
        if n < t:
            return False
        try:
            check_safe(num_clients=n, degree=round_degree(cohort=n, degree=k, threshold=t, colluders=c),
                       threshold=t, colluders=c)
        except ValueError:
            return False
        return True

    return rule


#: The reason :class:`fedprivacy.fl.secure.SecureRound` gives for a round aborted by the cohort-size
#: rule (before anything is sent): such aborts are inside the public's figure (:func:`public_sampling`).
COHORT_RULE_ABORT = "cohort of "


def is_cohort_rule_abort(reason: str | None) -> bool:
    """True for an abort by the cohort-size rule alone (modelled); other aborts (dropouts, protocol
    violations, an unsafe roster after dropouts) are not, and cost the public's amplification."""
    return bool(reason) and str(reason).startswith(COHORT_RULE_ABORT)


def public_sampling(cfg: RunConfig, *, population: int) -> Sampling | CohortRuleSampling:
    """The sampling the public's figure may claim: none unless :func:`counts_private`; else the run's,
    with Poisson rounds accounted as the public sees them (the public's audience stream).

    Which rounds completed is public (the model moves or not), and a Poisson round completes only
    for the cohort sizes :func:`completes` accepts. Every completed round is then the labelled
    mixture :class:`fedprivacy.accounting.completion.CompletedRoundGaussian`: with the weight
    ``w_g`` of "client i decided that the round completes" a Gaussian without amplification, else
    the subsampled Gaussian at ``q`` (:func:`fedprivacy.accounting.completion.round_weights`, the
    worse of ``N - 1`` and ``N`` other clients). Its dominating-pair proof covers zero-out
    (``neighbouring = add-remove``); under replace-one no amplification is claimed. Fixed cohorts
    always have the same size (``>= t``, checked by the config): their sampling is the run's.
    """
    from fedprivacy.accounting.completion import CohortRuleSampling, round_weights
    from fedprivacy.accounting.events import Neighbouring, NoSampling, PoissonSampling
    from fedprivacy.fl.privacy import sampling_object

    if not counts_private(cfg):
        return NoSampling()
    sampling = sampling_object(cfg, population)
    if not isinstance(sampling, PoissonSampling):
        return sampling
    if Neighbouring.parse(cfg.neighbouring) is not Neighbouring.ADD_REMOVE:
        return NoSampling()  # the completion-bit pair is proved for zero-out only
    try:
        weights = round_weights(population=population, sample_rate=sampling.rate,
                                completes=completes(cfg, population=population))
    except ValueError:  # no round can complete
        return NoSampling()
    return CohortRuleSampling.of(weights, rate=sampling.rate)


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
    """``ddgauss`` where the mode's noise is added in secure aggregation (``distributed``), else
    ``fixed-point``."""
    return "ddgauss" if cfg.mode.secure_noise else "fixed-point"


def make_encoding(cfg: RunConfig, *, population: int, dim: int, threshold: int,
                  rotation_seed: bytes = b"\x00" * 32, count_noise_std: float = 0.0,
                  server_noise_multiplier: float | None = None) -> EncodingSpec:
    """The run's encoding: the largest power-of-two scale whose sum over ``population`` cannot wrap
    (:func:`fedprivacy.secagg.encoding.largest_scale_encoding`). Distributed DP always uses exact
    XNoise components (the legacy ``σ²/t`` share is not run: clients refuse it). ``count_noise_std``
    (adaptive clipping, :mod:`fedprivacy.fl.adaptive_clip`): the clipped-count coordinate's noise σ_b.
    ``server_noise_multiplier``: the headroom of the server's noise on the sum
    (:attr:`fedprivacy.fl.secure.noise.ServerNoise.headroom_multiplier`); default ``noise-multiplier``
    for a DP mode whose noise is not added in secure aggregation."""
    distributed = cfg.mode.secure_noise
    # a DP mode whose noise is not added in secure aggregation: the server adds it to the sum
    server_z = cfg.noise_multiplier if cfg.is_dp and not distributed else 0.0
    if server_noise_multiplier is not None:
        server_z = server_noise_multiplier
    return largest_scale_encoding(kind=encoding_kind(cfg), dim=dim, clip_norm=cfg.clip_norm,
                                  modulus_bits=cfg.secagg_bits, population=population,
                                  noise_multiplier=cfg.noise_multiplier, threshold=threshold,
                                  rotation_seed=rotation_seed, xnoise=distributed,
                                  colluders=cfg.secagg_colluders if distributed else 0,
                                  count_noise_std=count_noise_std, server_noise_multiplier=server_z)
