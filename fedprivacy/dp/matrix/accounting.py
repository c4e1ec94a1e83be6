"""Participation schemas and the privacy of the Gaussian matrix mechanism under each.

``MatrixMechanism`` releases ``C x + z`` with ``z ~ N(0, (noise_multiplier * clip_norm * s)^2 I)``
where ``s`` is the schema's sensitivity of C in clip-norm units; neighbouring = one client added or
removed (its clipped contributions, norm <= clip_norm, in the rounds it took part in). Adaptively
chosen contributions are covered for lower-triangular C (Denisov et al. 2022, Theorem 2.1).

* :class:`SingleParticipation` / :class:`MinSeparation`: no sampling is assumed; the release is one
  Gaussian mechanism with multiplier ``noise_multiplier`` (a ``GaussianDpEvent``; PLD is exact for it,
  Balle & Wang 2018). The sensitivity and its basis come from :mod:`.sensitivity`.
* :class:`CyclicPoisson`: clients are split into ``num_groups`` fixed groups; round t Poisson-samples
  group ``t mod num_groups`` with ``sample_rate``. For a C with band <= num_groups, whose column norms
  are at most s, the mechanism is as private as DP-SGD with Poisson rate ``sample_rate``, multiplier
  ``noise_multiplier`` and ``ceil(n / num_groups)`` steps (Choquette-Choo et al. 2023, "(Amplified)
  Banded Matrix Factorization", arXiv 2306.08153, Theorem 4 with Algorithm 2). Band 1 is DP-SGD.

A schema whose hypotheses do not hold for the strategy is refused with ValueError.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import dp_accounting

from fedprivacy.dp.matrix.sensitivity import (
    Sensitivity,
    min_sep_sensitivity,
    single_participation_sensitivity,
)
from fedprivacy.dp.matrix.strategies import BandedToeplitz, Blt

__all__ = ["CyclicPoisson", "MatrixMechanism", "MinSeparation", "Schema", "SingleParticipation"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SingleParticipation:
    """Every client contributes to at most one round."""

    def describe(self) -> str:
        return "single participation"


@dataclass(frozen=True, slots=True, kw_only=True)
class MinSeparation:
    """Any two participations of a client are >= ``min_separation`` rounds apart, at most k in all."""

    min_separation: int
    max_participations: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.min_separation, bool) or not isinstance(self.min_separation, int) \
                or self.min_separation < 1:
            raise ValueError(f"min_separation must be an integer >= 1, got {self.min_separation!r}")
        k = self.max_participations
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"max_participations must be an integer >= 1 or None, got {k!r}")

    def describe(self) -> str:
        k = "any number of" if self.max_participations is None else f"<= {self.max_participations}"
        return f"{self.min_separation}-min-separation, {k} participations"


@dataclass(frozen=True, slots=True, kw_only=True)
class CyclicPoisson:
    """Fixed groups; round t Poisson-samples each client of group ``t mod num_groups``."""

    num_groups: int
    sample_rate: float

    def __post_init__(self) -> None:
        if isinstance(self.num_groups, bool) or not isinstance(self.num_groups, int) or self.num_groups < 1:
            raise ValueError(f"num_groups must be an integer >= 1, got {self.num_groups!r}")
        if not 0.0 < float(self.sample_rate) <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate!r}")

    def describe(self) -> str:
        return f"cyclic Poisson: {self.num_groups} groups, rate {self.sample_rate:g} within a group"


Schema = SingleParticipation | MinSeparation | CyclicPoisson


@dataclass(frozen=True, slots=True, kw_only=True)
class MatrixMechanism:
    """A strategy C, a participation schema and the noise multiplier; refuses what it cannot prove."""

    strategy: BandedToeplitz | Blt
    schema: Schema
    noise_multiplier: float
    sensitivity: Sensitivity = Sensitivity(value=math.nan, basis="")

    def __post_init__(self) -> None:
        if not math.isfinite(self.noise_multiplier) or self.noise_multiplier <= 0:
            raise ValueError(f"noise_multiplier must be finite and > 0, got {self.noise_multiplier!r}")
        object.__setattr__(self, "sensitivity", _sensitivity(self.strategy, self.schema))

    def noise_std(self, clip_norm: float) -> float:
        """Std of z: ``noise_multiplier * clip_norm * sensitivity``."""
        if not math.isfinite(clip_norm) or clip_norm <= 0:
            raise ValueError(f"clip_norm must be finite and > 0, got {clip_norm!r}")
        return self.noise_multiplier * clip_norm * self.sensitivity.value

    def dp_event(self) -> dp_accounting.DpEvent:
        """The dp-accounting event this release is at least as private as."""
        gauss = dp_accounting.GaussianDpEvent(noise_multiplier=self.noise_multiplier)
        if not isinstance(self.schema, CyclicPoisson):
            return gauss
        steps = -(-self.strategy.num_rounds // self.schema.num_groups)
        sampled = dp_accounting.PoissonSampledDpEvent(sampling_probability=self.schema.sample_rate,
                                                      event=gauss)
        return dp_accounting.SelfComposedDpEvent(event=sampled, count=steps)

    def epsilon(self, delta: float) -> float:
        """epsilon at ``delta`` by dp-accounting's PLD accountant (add/remove neighbours)."""
        if not 0.0 < delta < 1.0:
            raise ValueError(f"target_delta must be in (0, 1), got {delta!r}")
        acc = dp_accounting.pld.PLDAccountant()
        acc.compose(self.dp_event())
        return float(acc.get_epsilon(delta))

    def claim(self) -> dict[str, Any]:
        """What a report must state: factorization, band, schema, sensitivity and its basis."""
        s = self.strategy
        return {"factorization": s.name, "band": s.band if isinstance(s, BandedToeplitz) else None,
                "buffers": s.num_buffers if isinstance(s, Blt) else None, "num_rounds": s.num_rounds,
                "schema": self.schema.describe(), "sensitivity": self.sensitivity.value,
                "sensitivity_basis": self.sensitivity.basis, "noise_multiplier": self.noise_multiplier}


def _sensitivity(strategy: BandedToeplitz | Blt, schema: Schema) -> Sensitivity:
    if isinstance(schema, SingleParticipation):
        return single_participation_sensitivity(strategy)
    if isinstance(schema, MinSeparation):
        return min_sep_sensitivity(strategy, min_sep=schema.min_separation,
                                   max_participations=schema.max_participations)
    if isinstance(schema, CyclicPoisson):
        if strategy.band > schema.num_groups:
            raise ValueError(f"cyclic Poisson amplification needs band <= num_groups, got band "
                             f"{strategy.band} > num_groups {schema.num_groups}")
        base = single_participation_sensitivity(strategy)
        return Sensitivity(value=base.value, basis=(
            f"cyclic Poisson, band {strategy.band} <= {schema.num_groups} groups: max column norm, "
            "reduced to DP-SGD (Choquette-Choo et al. 2023, arXiv 2306.08153, Theorem 4)"))
    raise TypeError(f"schema must be SingleParticipation, MinSeparation or CyclicPoisson, got {schema!r}")
