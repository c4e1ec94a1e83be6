"""``privacy = "central"`` with ``secagg = true``: the server adds the noise to a sum it only sees whole.

The clients mask fixed-point encodings of their clipped updates (no noise of their own); the server
unmasks the exact sum and adds ``N(0, (z Delta)^2)`` to it on the ring's torus, before decoding
(:class:`fedprivacy.fl.secure.SecureRound`). ``Delta = C + sqrt(d)/s`` bounds one client's encoded
contribution (stochastic rounding moves each of the ``d`` coordinates by less than ``1/s``), so the
release is a Gaussian mechanism of multiplier ``z`` on the integer sum, whatever the other inputs are:
``(S + Z) mod 2^b`` moves by exactly one client's encoding, wrap or not (post-processing of the
Gaussian on the integers; Dwork & Roth 2014, Thm. A.1 and Prop. 2.1).

Audiences: against the server, no differential privacy (it sees the exact sum; single updates stay
hidden, as with ``privacy = "none"``). Against observers of the released models, the central ε; with
Poisson sampling and private counts, the completion of a round is public, so each completed round is
the labelled mixture of :mod:`fedprivacy.accounting.completion` (as distributed mode's public
figure), and an abort it does not model voids the amplification
(:meth:`fedprivacy.fl.journal.WriteAheadJournal.void_amplification`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedprivacy.fl.privacy import PrivacyPlan, denominator_of, sampling_description

if TYPE_CHECKING:
    from fedprivacy.accounting.accountant import Accountant
    from fedprivacy.accounting.completion import CohortRuleSampling
    from fedprivacy.accounting.events import PrivacyEvent, Sampling
    from fedprivacy.config import RunConfig

__all__ = ["COVERS", "ZERO_OUT", "secure_central_plan", "secure_central_summary"]

COVERS: tuple[str, ...] = (
    "- Covers: the sequence of released global models (and anything computed from them, such as the "
     "test accuracy), against observers who take part in no round, for the unit above.",
    "- Against the server: no differential privacy. Secure aggregation hides each client's update; the "
     "server sees their exact sum and adds the noise to it (trusted for the noise, not for single updates).",
    "- Against participating clients: a client in a round sees its roster and survivors, so the rounds "
     "it is in are unamplified for it; `participants_epsilon` (every round unamplified) bounds them all.",
    "- Does not cover: who took part in a round, the train loss, and timing. With Poisson sampling the "
     "ε claims amplification only while the server keeps the cohorts and counts private (the run "
     "folder's owner-only `private/`); whether a round completed is public and is accounted.",
)

# Removing a client changes the survivor count, hence whether a secure round completes (public): only
# a client that stays in the protocol with its update replaced is claimed (as in distributed mode)
ZERO_OUT = ("zero-out: one client's update replaced by 0 while it stays in the protocol (whether a secure "
             "round completes then does not depend on it); removing a client from the population is not "
             "claimed")


def _events(sampling: Sampling | CohortRuleSampling, z: float) -> tuple[PrivacyEvent, PrivacyEvent | None]:
    """The per-round event (observers) and, when it claims amplification, the unamplified one."""
    from fedprivacy.accounting.completion import CohortRuleSampling
    from fedprivacy.accounting.events import GaussianEvent, PrivacyEvent

    unamplified = PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=z))
    if isinstance(sampling, CohortRuleSampling):
        return sampling.event_for(z), unamplified
    event = PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=z), sampling=sampling)
    # fixed cohorts are amplified too: an unmodelled abort or dropout voids it (the journal's void)
    return event, (unamplified if event != unamplified else None)


def _calibrated(cfg: RunConfig, sampling: Sampling | CohortRuleSampling) -> tuple[float, bool]:
    from fedprivacy.accounting.calibration import calibrate_completed, calibrate_noise_multiplier
    from fedprivacy.accounting.completion import CohortRuleSampling
    from fedprivacy.accounting.events import Neighbouring

    if cfg.noise_multiplier > 0:
        return cfg.noise_multiplier, False
    if isinstance(sampling, CohortRuleSampling):
        return calibrate_completed(target_epsilon=cfg.target_epsilon, target_delta=cfg.target_delta,
                                   sampling=sampling, steps=cfg.num_server_rounds, backend=cfg.accountant), True
    return float(calibrate_noise_multiplier(
        target_epsilon=cfg.target_epsilon, target_delta=cfg.target_delta, sampling=sampling,
        steps=cfg.num_server_rounds, backend=cfg.accountant,
        neighbouring=Neighbouring.parse(cfg.neighbouring))), True


def secure_central_plan(cfg: RunConfig, *, population: int, dim: int | None, mechanism: str) -> PrivacyPlan:
    """The plan of a central run over secure aggregation (see the module docstring)."""
    from fedprivacy.fl.secure.noise import encoded_bound
    from fedprivacy.fl.secure.params import make_encoding, public_sampling, secagg_parameters

    if dim is None or dim < 1:
        raise ValueError(f"dim (the model's number of parameters) must be >= 1 for privacy='central' with "
                         f"secagg=true, got {dim}")
    sampling = public_sampling(cfg, population=population)  # the public's, with the completion bit
    z, calibrated = _calibrated(cfg, sampling)
    event, unamplified = _events(sampling, z)
    t, _ = secagg_parameters(cfg, population=population)
    try:  # the scale leaves room for the server's noise too (no wrap at probability 1e-9)
        enc = make_encoding(cfg.replace(noise_multiplier=z), population=population, dim=dim, threshold=t)
    except ValueError as exc:
        raise ValueError(f"secagg-bits={cfg.secagg_bits} is too small for central noise over secure "
                         f"aggregation: {exc}") from None
    delta = encoded_bound(enc)
    from fedprivacy.accounting.events import NoSampling

    claimed = unamplified is not None or not isinstance(event.sampling, NoSampling)
    amplified = "" if claimed else "; no amplification claimed"
    return PrivacyPlan(
        mode="central", population=population, denominator=denominator_of(cfg, population=population),
        clip_norm=cfg.clip_norm, noise_multiplier=z, calibrated=calibrated,
        central_noise_std=z * cfg.clip_norm, local_noise_std=0.0, unit="user (all data of one client)",
        neighbouring=cfg.neighbouring, adjacency=ZERO_OUT if cfg.neighbouring == "add-remove" else "",
        sampling_description=(sampling_description(cfg, population=population) + amplified
                              + f"; secagg threshold t={t}; ε against observers (the server sees the exact sum)"),
        event=event, target_delta=cfg.target_delta, target_epsilon=cfg.target_epsilon,
        mechanism=(f"{mechanism}, added by the server to the secure-aggregation sum on the ring's torus "
                   f"with std z*(C + sqrt(d)/s) = {z * delta:.6g} (the fixed-point rounding's bound)"),
        unamplified_event=unamplified,
    )


def secure_central_summary(block: dict[str, Any], cfg: RunConfig, plan: PrivacyPlan,
                           accountant: Accountant | None) -> dict[str, Any]:
    """The claim block plus the participants' bound: every release as the unamplified Gaussian(z)
    (valid for a client that sees the rosters of the rounds it is in); ``rounds`` counts releases, not
    a void's re-charges."""
    from fedprivacy.accounting.accountant import Accountant
    from fedprivacy.accounting.events import Neighbouring
    from fedprivacy.fl.modes.distributed import charged_releases

    if accountant is None or plan.event is None:
        return block
    releases = charged_releases(accountant, plan)
    block["rounds"] = releases
    if plan.unamplified_event is None or not releases:
        block["participants_epsilon"] = block["epsilon"]
        return block
    worst = Accountant(backend=cfg.accountant, neighbouring=Neighbouring.parse(cfg.neighbouring), unit="user")
    worst.spend(plan.unamplified_event.with_count(releases))
    block["participants_epsilon"] = max(worst.epsilon(delta=cfg.target_delta), block["epsilon"])
    return block
