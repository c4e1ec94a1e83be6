"""``distributed``: secure aggregation with distributed discrete Gaussian noise (Kairouz, Liu & Steinke
2021), the mode whose server only ever unmasks a sum that already carries the survivors' noise.

Plan: each client adds ``N_Z(0, (zCs)^2/t)`` (:mod:`fedprivacy.secagg.ddp`), so any ``t`` or more
survivors carry at least the target noise; the budget check before a round uses the worst case,
``t`` survivors, with the encoding sized for the model dimension the run really sends (``dim``). The
round (:class:`fedprivacy.fl.secure.SecureRound`) reports the event of the survivors that really
completed it. The summary states the noise they added, round by round, and ε against central DP with
the same σ.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fedprivacy.accounting.events import Neighbouring
from fedprivacy.fl.aggregation import Aggregator
from fedprivacy.fl.modes.base import Transport, privacy_block, secure_round
from fedprivacy.fl.privacy import PrivacyPlan, denominator_of, sampling_description
from fedprivacy.fl.secure.params import make_encoding, secagg_parameters
from fedprivacy.fl.types import RoundFn, RoundRecord

if TYPE_CHECKING:
    from fedprivacy.accounting.accountant import Accountant
    from fedprivacy.config import RunConfig
    from fedprivacy.dp.rng import RandomSource

__all__ = ["DistributedMode", "distributed_summary"]


def _adjacency(cfg: RunConfig) -> str:
    # KLS 2021's theorem covers neighbouring sums that differ in one client's update while every
    # survivor's noise share is present in both (fedprivacy.accounting.distributed): say so.
    if Neighbouring.parse(cfg.neighbouring) is Neighbouring.ADD_REMOVE:
        return ("zero-out: one client's update replaced by 0, every survivor's noise share present "
                "(KLS 2021); removing a client together with its noise share is not claimed")
    return ("replace-one: one client's update replaced (sensitivity doubled); every survivor's "
            "noise share present (KLS 2021)")


class DistributedMode:
    """Distributed DP under SecAgg+ (needs ``secagg = true`` and the ``rdp`` accountant)."""

    name = "distributed"

    def plan(self, cfg: RunConfig, *, population: int, dim: int | None) -> PrivacyPlan:
        """The plan; ``event`` is the worst case (``t`` survivors) for a ``dim``-parameter model."""
        from fedprivacy.accounting.distributed import round_event

        if cfg.privacy != "distributed":
            raise ValueError(f"the distributed plan needs privacy='distributed', got {cfg.privacy!r}")
        if dim is None or dim < 1:
            raise ValueError(f"dim (the model's number of parameters) must be >= 1 for "
                             f"privacy='distributed', got {dim}")
        t, _ = secagg_parameters(cfg, population=population)
        enc = make_encoding(cfg, population=population, dim=dim, threshold=t)
        worst = enc.ddp().privacy(num_survivors=t, neighbouring=cfg.neighbouring)
        desc = sampling_description(cfg, population=population, replacement_note=False)
        return PrivacyPlan(
            mode="distributed", population=population, denominator=denominator_of(cfg, population=population),
            clip_norm=cfg.clip_norm, noise_multiplier=cfg.noise_multiplier, calibrated=False,
            central_noise_std=0.0, local_noise_std=0.0, unit="user (all data of one client)",
            neighbouring=cfg.neighbouring, adjacency=_adjacency(cfg),
            sampling_description=desc + f"; no amplification claimed; secagg threshold t={t}",
            event=round_event(worst), target_delta=cfg.target_delta, target_epsilon=cfg.target_epsilon,
            mechanism=(f"distributed discrete Gaussian under SecAgg+ (Kairouz, Liu & Steinke 2021): each "
                       f"client adds N_Z(0, (zCs)^2/t), t={t}; the server only sees the noised sum"),
        )

    def round_fn(self, cfg: RunConfig, plan: PrivacyPlan, transport: Transport, *,
                 aggregator: Aggregator | None = None, log: Callable[[str], None] = print) -> RoundFn:
        return secure_round(cfg, plan, transport, aggregator=aggregator, log=log)

    def summary(self, cfg: RunConfig, plan: PrivacyPlan, records: Sequence[RoundRecord], *,
                accountant: Accountant | None, rng: RandomSource) -> dict[str, Any]:
        block = privacy_block(cfg, plan, accountant, rng)
        if accountant is not None:
            block.update(distributed_summary(cfg, records, epsilon=block["epsilon"]))
        return block


def distributed_summary(cfg: RunConfig, records: Sequence[RoundRecord], *,
                        epsilon: float | None) -> dict[str, Any]:
    """The noise the survivors really added, and ε of central DP with the same σ on the same rounds.

    The central reference is a continuous Gaussian on the sum, no sampling, RDP accountant: with
    ``σ = z C`` (the target), and with the std the survivors really added, ``z C sqrt(n/t)``.
    """
    from fedprivacy.accounting.accountant import Accountant, epsilon_for
    from fedprivacy.accounting.events import GaussianEvent, PrivacyEvent

    done = [(r, r.secagg) for r in records if r.secagg is not None and r.secagg.survivors
            and r.aborted is None]
    central = central_actual = None
    if done:
        central = epsilon_for(noise_multiplier=cfg.noise_multiplier, sample_rate=1.0, steps=len(done),
                              delta=cfg.target_delta, backend="rdp", neighbouring=cfg.neighbouring)
        acc = Accountant(backend="rdp", neighbouring=Neighbouring.parse(cfg.neighbouring))
        for _, s in done:  # the Gaussian with the std the survivors' noise really had
            z = cfg.noise_multiplier * math.sqrt(int(s.survivors or 0) / int(s.threshold))
            acc.spend(PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=z)))
        central_actual = acc.epsilon(delta=cfg.target_delta)
    threshold = done[0][1].threshold if done else None
    return {"distributed": {
        "threshold": threshold,
        "per_client_noise_std": (cfg.clip_norm * cfg.noise_multiplier / math.sqrt(threshold)
                                 if threshold else None),
        "completed_rounds": [r.round for r, _ in done],
        "survivors_per_round": [int(s.survivors or 0) for _, s in done],
        "noise_std_of_sum_per_round": [s.noise_std_sum for _, s in done],
        "rho_per_round": [s.rho for _, s in done],
        "aborted_rounds": [r.round for r in records if r.aborted],
        "epsilon": epsilon,
        "central_dp_epsilon_same_sigma": central,
        "central_dp_epsilon_survivors_sigma": central_actual,
        "central_dp_reference": ("continuous Gaussian on the sum, no sampling, same completed rounds "
                                 "and δ, RDP accountant: with σ = z·C (the target), and with the "
                                 "std the survivors really added, z·C·sqrt(n/t) per round"),
    }}
