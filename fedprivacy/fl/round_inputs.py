"""What each round starts from: its instructions, its cohort and its randomness, drawn once.

Round ``r``'s source is ``root.child("server", r)``: its cohort is sampled from ``.child("sampling")``
exactly as the plan reports (Poisson at ``sample-rate``, a fixed cohort without replacement, or the
mode's own ``sample_cohort`` where its schema fixes the cohorts: ``dpftrl``'s groups), and
the round function gets ``.child("aggregate")``. The inputs depend on no data, so a round function may
ask for the next round's while the current one runs (the secure round sends round r+1's key stages
with round r's exchanges); the run then uses exactly those.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fedprivacy.fl.sampling import fixed_cohort_sample, poisson_sample
from fedprivacy.fl.types import RoundInstructions

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.fl.modes import PrivacyMode
    from fedprivacy.fl.privacy import PrivacyPlan

__all__ = ["RoundInputs", "root_source", "sample_cohort"]

Inputs = tuple[RoundInstructions, list[int], "RandomSource"]


def root_source(cfg: RunConfig) -> RandomSource:
    """The run's root source: seeded (research mode, marked as such in every output) or secure."""
    from fedprivacy.dp.rng import RandomSource

    return RandomSource.seeded(cfg.seed) if cfg.seeded else RandomSource.secure()


def sample_cohort(cfg: RunConfig, population: Sequence[int], rng: RandomSource) -> list[int]:
    if cfg.sampling == "fixed":
        return fixed_cohort_sample(population, cohort_size=cfg.cohort_size, rng=rng)
    return poisson_sample(population, sample_rate=cfg.sample_rate, rng=rng)


class RoundInputs:
    """Each round's ``(instructions, cohort, source)``, drawn once.

    Args:
        cfg: the run's config.
        population: the number of partitions N (ids ``0..N-1``).
        root: the run's root source (:func:`root_source`).
        plan: the run's privacy plan (the clients' noise multiplier; whether the run is private).
        mode: the run's privacy mode (its client-side mechanism travels by name).
        num_classes: the model's number of classes (sent with the instructions).
    """

    def __init__(self, cfg: RunConfig, *, population: int, root: RandomSource, plan: PrivacyPlan,
                 mode: PrivacyMode, num_classes: int) -> None:
        self.cfg, self.population, self.root, self.plan, self.mode = cfg, population, root, plan, mode
        self.num_classes = num_classes
        self._drawn: dict[int, Inputs] = {}

    def take(self, rnd: int) -> Inputs:
        """Round ``rnd``'s inputs for running it: those drawn ahead, else drawn now."""
        return self._drawn.pop(rnd) if rnd in self._drawn else self._draw(rnd)

    def ahead(self, rnd: int) -> Inputs | None:
        """Round ``rnd``'s inputs, drawn once (None past the last round)."""
        if rnd > self.cfg.num_server_rounds:
            return None
        if rnd not in self._drawn:
            self._drawn[rnd] = self._draw(rnd)
        return self._drawn[rnd]

    def instructions(self, rnd: int) -> RoundInstructions:
        cfg, plan, mechanism = self.cfg, self.plan, self.mode.client_mechanism
        return RoundInstructions(
            round=rnd, privacy=cfg.privacy, clip_norm=cfg.clip_norm,
            client_mechanism=mechanism.name if mechanism is not None else "",
            noise_multiplier=plan.noise_multiplier if mechanism is not None else 0.0,
            private=plan.event is not None, learning_rate=cfg.learning_rate, local_epochs=cfg.local_epochs,
            batch_size=cfg.batch_size, num_classes=self.num_classes, seed=cfg.seed, proximal_mu=cfg.proximal_mu,
            scaffold=cfg.scaffold)

    def _draw(self, rnd: int) -> Inputs:
        rng = self.root.child("server", rnd)
        sampler = getattr(self.mode, "sample_cohort", None)  # a mode whose schema fixes the cohorts
        cohort = (sampler(self.cfg, population=self.population, round=rnd, rng=rng.child("sampling"))
                  if callable(sampler) else
                  sample_cohort(self.cfg, range(self.population), rng.child("sampling")))
        return self.instructions(rnd), cohort, rng.child("aggregate")
