"""The privacy plan of a run: what is released each round and how it is accounted.

Each privacy mode (:mod:`fedprivacy.fl.modes`: ``none``, ``central``, ``local``, ``distributed``) states
its own mechanism, unit, adjacency and event in its plan.

The denominator of the mean is fixed (:func:`fedprivacy.fl.sampling.expected_cohort`).

Each mode's plan lives with the mode (:mod:`fedprivacy.fl.modes`, the one registry); this module holds
the plan's type and what every mode shares: the population checks, the denominator, the sampling as
the accountant and the claim see it, and the accountant.

Calibration: with ``target-epsilon > 0`` and ``noise-multiplier = 0`` the smallest σ with
ε(σ, sampling, T rounds, δ) ≤ target is found by :func:`fedprivacy.accounting.calibration.
calibrate_noise_multiplier` (never overshoots).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedprivacy.fl.sampling import expected_cohort

if TYPE_CHECKING:
    from fedprivacy.accounting.accountant import Accountant
    from fedprivacy.accounting.events import PrivacyEvent, Sampling
    from fedprivacy.config import RunConfig
    from fedprivacy.dp.matrix import MatrixMechanism
    from fedprivacy.fl.adaptive_clip import AdaptiveClipSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class PrivacyPlan:
    """What one round releases and how it is accounted (``event`` is None without DP)."""

    mode: str
    population: int
    denominator: float
    clip_norm: float
    noise_multiplier: float
    calibrated: bool
    central_noise_std: float
    local_noise_std: float
    unit: str
    neighbouring: str
    sampling_description: str
    event: PrivacyEvent | None
    target_delta: float
    target_epsilon: float
    mechanism: str = ""
    adjacency: str = ""  # how the claim states the adjacency, when it says more than ``neighbouring``
    adaptive_clip: AdaptiveClipSpec | None = None  # clip norm follows a private quantile
    # the server's (unamplified) event of a completed round, when ``event`` claims the public's
    # amplification (distributed, privacy-audience=observers): charged for every completed round if an
    # abort the public's pair does not model voids that amplification
    unamplified_event: PrivacyEvent | None = None
    # what a row's epsilon adds to the ledger's (evaluated at ``target_delta``) to be a valid bound: the
    # distributed encoding's accounting slack 2H' of ``num-server-rounds`` worst-case rounds
    epsilon_slack: float = 0.0
    # one worst-case round's slack ``(eta + A, G)``, for a ledger holding more releases than
    # ``num-server-rounds`` (a round re-charged after a crash)
    slack_per_round: tuple[float, float] = (0.0, 0.0)
    # correlated noise (privacy ``dpftrl``): the matrix mechanism (strategy C, schema, z) whose whole
    # horizon ``event`` charges; ``central_noise_std`` is then the std of its innovations z_t
    correlated: MatrixMechanism | None = None

    @property
    def adjacency_label(self) -> str:
        return self.adjacency or self.neighbouring

    def describe(self) -> str:
        if self.event is None:
            return "privacy: none (no differential privacy; updates clipped only)"
        origin = "calibrated" if self.calibrated else "configured"
        if self.correlated is not None:
            claim = self.correlated.claim()
            return (f"privacy: {self.mode} DP, unit={self.unit}, {self.adjacency_label}, C={self.clip_norm:g}, "
                    f"z={self.noise_multiplier:.4g} ({origin}), correlated noise {claim['factorization']} "
                    f"(innovation std {self.central_noise_std:.4g}, sensitivity {claim['sensitivity']:.4g}), "
                    f"schema={claim['schema']}, denominator={self.denominator:g}")
        where = {
            "central": "server adds it to the sum",
            "local": "each client adds it",
            # KLS 2021 + XNoise (Dordis): each client over-provides, the survivors' excess is removed.
            "distributed": "on the sum, whatever the survivors: exact XNoise components (excess removed)",
        }.get(self.mode, "each client adds it")
        return (
            f"privacy: {self.mode} DP, unit={self.unit}, {self.adjacency_label}, C={self.clip_norm:g}, "
            f"σ={self.noise_multiplier:.4g} ({origin}, noise std {self.noise_multiplier * self.clip_norm:.4g}, "
            f"{where}), sampling={self.sampling_description}, denominator={self.denominator:g}"
        )


def check_population(cfg: RunConfig, *, population: int) -> None:
    """Refuse a population the config cannot be honoured for (:class:`fedprivacy.config.ConfigError`,
    a ValueError, naming the key and the fix)."""
    from fedprivacy.errors import ConfigError

    if population < 1:
        raise ConfigError(f"the number of clients must be >= 1, got {population}")
    if cfg.sampling == "fixed" and cfg.cohort_size > population:
        raise ConfigError(f"cohort-size must be <= the number of clients ({population}), got "
                          f"{cfg.cohort_size}; set cohort-size <= {population} or add clients")
    if cfg.is_dp and cfg.target_delta >= 1.0 / population:
        raise ConfigError(
            f"target-delta must be < 1/number of clients = 1/{population} = {1.0 / population:.3g} for a "
            f"meaningful user-level guarantee (δ well below 1/N), got {cfg.target_delta:g}; set e.g. "
            "target-delta=1e-5"
        )


def denominator_of(cfg: RunConfig, *, population: int) -> float:
    """The fixed aggregation denominator (:func:`fedprivacy.fl.sampling.expected_cohort`)."""
    return expected_cohort(sampling=cfg.sampling, population=population,
                           sample_rate=cfg.sample_rate, cohort_size=cfg.cohort_size)


def sampling_description(cfg: RunConfig, *, population: int, replacement_note: bool = True) -> str:
    """How clients are sampled, as the claim states it."""
    if cfg.sampling == "poisson":
        return f"poisson(q={cfg.sample_rate:g}, N={population})"
    tail = ", without replacement" if replacement_note else ""
    return f"fixed cohort (m={cfg.cohort_size} of N={population}{tail})"


def sampling_object(cfg: RunConfig, population: int) -> Sampling:
    """The accountant's sampling of the clients the server draws (a mode that claims no amplification
    uses none instead: its own ``sampling``)."""
    from fedprivacy.accounting.events import FixedCohortSampling, NoSampling, PoissonSampling

    if cfg.sampling == "fixed":
        return FixedCohortSampling(cohort=cfg.cohort_size, population=population)
    if cfg.sample_rate >= 1.0:
        return NoSampling()
    return PoissonSampling(rate=cfg.sample_rate)


def make_accountant(cfg: RunConfig, plan: PrivacyPlan) -> Accountant | None:
    """A fresh accountant for the plan (None without DP); refuses an event it cannot account for."""
    if plan.event is None:
        return None
    from fedprivacy.accounting.accountant import Accountant, Budget
    from fedprivacy.accounting.events import Neighbouring

    # the plan's target: a mode may lower it by its accounting slack (distributed)
    budget = (Budget(epsilon=plan.target_epsilon, delta=plan.target_delta)
              if cfg.target_epsilon > 0 and plan.target_epsilon > 0 else None)
    accountant = Accountant(backend=cfg.accountant, neighbouring=Neighbouring.parse(plan.neighbouring),
                            budget=budget, unit="user")
    if not accountant.supports(plan.event):
        raise ValueError(
            f"accountant={cfg.accountant!r} cannot account for {plan.sampling_description} under "
            f"{plan.neighbouring}; choose another accountant, sampling or neighbouring"
        )
    return accountant
