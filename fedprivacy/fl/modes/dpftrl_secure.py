"""``privacy = "dpftrl"`` with ``secagg = true``: the server adds the correlated noise to a sum it only sees whole.

The clients of round t's group mask fixed-point encodings of their clipped updates (no noise of their
own); the server unmasks the exact sum and adds round t's ``w_t = (C^{-1} z)_t`` on the ring's torus
before decoding (:class:`fedprivacy.fl.secure.noise.CorrelatedSumNoise`). One client's encoded
contribution is within ``Delta = C + sqrt(d)/s`` per round; the matrix mechanism's sensitivity is
linear in that per-round bound (Denisov et al. 2022, Thm. 2.1; Choquette-Choo et al. 2023, arXiv
2306.08153), so innovations of std ``z sens Delta`` give plain dpftrl's horizon event at the same z,
band and groups. It is charged at the first round that reaches its release point (before the unmask
requests go out), :class:`fedprivacy.accounting.events.ChargedAhead` afterwards; draw t is round t's,
so an aborted round leaves its draw unreleased (a projection of the output) and every client keeps
the separation of its group.

Completion: with ``sample-rate = 1`` each round's cohort is its whole public group, so whether the
round completes depends on no client's data (dropouts assumed data-independent; for that bit a client
is compared with itself sending a zero update, the zero-out relation of
:mod:`fedprivacy.accounting.completion`). With ``sample-rate < 1`` the cohort's size is private, a
round below the threshold aborts in public, and the cyclic-Poisson amplification (Choquette-Choo et
al. 2023, Thm. 4) does not model that bit: refused.

Audiences: against the server, no differential privacy (it sees the exact sum; single updates stay
hidden). Against observers of the released models, plain dpftrl's ε.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from fedprivacy.fl.privacy import PrivacyPlan

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig
    from fedprivacy.fl.secure.noise import CorrelatedSumNoise

__all__ = ["COVERS", "SAMPLE_RATE_REFUSAL", "secure_dpftrl_plan", "server_noise"]

SAMPLE_RATE_REFUSAL = (
    "sample-rate must be 1 with privacy='dpftrl' and secagg=true: a Poisson-sampled group's secure round "
    "aborts below its threshold and whether it completed is public, which the cyclic-Poisson amplification "
    "does not model; set sample-rate=1 or secagg=false")

COVERS: tuple[str, ...] = (
    "- Covers: the sequence of released global models (and anything computed from them), against anyone "
     "who sees them but the server, for the unit above: one ε for the whole horizon of num-server-rounds "
     "rounds, charged at the first release and reported by every round.",
    "- Against the server: no differential privacy. Secure aggregation hides each client's update; the "
     "server sees their exact sum and adds the correlated noise to it (trusted for the noise and its "
     "state, not for single updates).",
    "- Does not cover: the train loss, per-round counts and timing (kept in the server's private log).",
    "- Assumes: the groups (partition id mod dpftrl-groups) are public, each round trains its whole group, "
    "and whether a round completes does not depend on the clients' data (dropouts independent of it; for "
    "that bit a client is compared with itself sending a zero update).",
)


def server_noise(plan: PrivacyPlan, *, num_rounds: int) -> CorrelatedSumNoise:
    """The plan's correlated noise on the unmasked sum (innovations' multiplier ``z sens``)."""
    from fedprivacy.accounting.events import ChargedAhead, PrivacyEvent
    from fedprivacy.fl.secure.noise import CorrelatedSumNoise

    if plan.correlated is None or plan.event is None:
        raise ValueError("a dpftrl plan must carry its matrix mechanism and horizon event")
    covered = PrivacyEvent(mechanism=ChargedAhead(covers=plan.event, horizon=num_rounds))
    return CorrelatedSumNoise(plan.correlated.strategy, innovation_multiplier=plan.correlated.noise_std(1.0),
                              horizon=plan.event, covered=covered)


def secure_dpftrl_plan(cfg: RunConfig, plan: PrivacyPlan, *, population: int, dim: int | None) -> PrivacyPlan:
    """Plain dpftrl's plan (same event, same ε) with the secure round's threshold and noise std."""
    from fedprivacy.fl.secure.noise import encoded_bound
    from fedprivacy.fl.secure.params import make_encoding, secagg_parameters

    if dim is None or dim < 1:
        raise ValueError(f"dim (the model's number of parameters) must be >= 1 for privacy='dpftrl' with "
                         f"secagg=true, got {dim}")
    try:
        t, _ = secagg_parameters(cfg, population=population)
    except ValueError as exc:
        raise ValueError(f"dpftrl-groups={cfg.dpftrl_groups} leaves groups too small for secure aggregation "
                         f"({population} clients): {exc}") from None
    noise = server_noise(plan, num_rounds=cfg.num_server_rounds)
    try:  # the scale leaves room for the largest round's noise too (no wrap at probability 1e-9)
        enc = make_encoding(cfg, population=population, dim=dim, threshold=t,
                            server_noise_multiplier=noise.headroom_multiplier)
    except ValueError as exc:
        raise ValueError(f"secagg-bits={cfg.secagg_bits} is too small for correlated noise over secure "
                         f"aggregation: {exc}") from None
    std = noise.noise_std(enc)
    from fedprivacy.fl.modes.central_secure import ZERO_OUT

    return dataclasses.replace(
        plan, adjacency=ZERO_OUT if cfg.neighbouring == "add-remove" else plan.adjacency,
        sampling_description=(plan.sampling_description + f"; secagg threshold t={t}; ε against "
                                    "observers (the server sees the exact sum)"),
        mechanism=(f"{plan.mechanism}, added by the server to the secure-aggregation sum on the ring's torus "
                   f"with innovations' std z*sens*(C + sqrt(d)/s) = {std:.6g} (the fixed-point rounding's "
                   f"bound {encoded_bound(enc):.6g} in place of C)"))
