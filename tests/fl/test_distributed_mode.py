"""The distributed privacy mode's plan: dominating-Gaussian events, the audience key, calibration."""

from __future__ import annotations

import math

import pytest

from fedprivacy.accounting.audiences import audience_epsilons
from fedprivacy.accounting.events import GaussianEvent, NoSampling, PoissonSampling
from fedprivacy.config import RunConfig
from fedprivacy.fl.modes import get_mode
from fedprivacy.fl.secure.params import make_encoding, secagg_parameters

DIM = 64 * 32 + 32 + 32 * 10 + 10  # the digits MLP


def _cfg(**kw: object) -> RunConfig:
    base = dict(privacy="distributed", secagg=True, accountant="pld", noise_multiplier=1.0,
                target_delta=1e-4, num_server_rounds=10)
    base.update(kw)
    return RunConfig(**base)  # type: ignore[arg-type]


def test_the_plan_event_is_the_dominating_gaussian_of_t_survivors() -> None:
    cfg = _cfg()
    plan = get_mode("distributed").plan(cfg, population=10, dim=DIM)
    t, _ = secagg_parameters(cfg, population=10)
    ddp = make_encoding(cfg, population=10, dim=DIM, threshold=t).ddp()
    assert isinstance(plan.event.mechanism, GaussianEvent) and isinstance(plan.event.sampling, NoSampling)
    worst = ddp.worst_release(max_roster=10)
    assert plan.event.mechanism.noise_multiplier == worst.noise_multiplier
    # the one worst case is below every realisable round's noise, within the variance margin
    for n in range(t, 11):
        for s in range(t, n + 1):
            z = ddp.release(roster=n, survivors=s).noise_multiplier
            assert worst.noise_multiplier <= z <= worst.noise_multiplier * (1 + 1e-9)
    # the budget the accountant checks is lowered by the run's worst-case slack
    assert plan.target_delta <= cfg.target_delta and plan.target_epsilon == 0.0


def test_observers_get_the_amplification_of_the_sampling_that_ran() -> None:
    # runs use exact XNoise: the released noise does not depend on who survived, so for observers
    # (who do not see the cohort) the round is central DP's Poisson-sampled Gaussian
    observers = get_mode("distributed").plan(_cfg(privacy_audience="observers", sample_rate=0.5),
                                             population=20, dim=DIM)
    server = get_mode("distributed").plan(_cfg(privacy_audience="server", sample_rate=0.5),
                                          population=20, dim=DIM)
    # at the rate given that the round completes (which the public sees)
    from fedprivacy.accounting.completion import CompletedRoundGaussian
    from fedprivacy.fl.secure.params import public_sampling

    cfg = _cfg(privacy_audience="observers", sample_rate=0.5)
    public = public_sampling(cfg, population=20)
    assert observers.event == public.event_for(server.event.mechanism.noise_multiplier)
    mech = observers.event.mechanism
    assert isinstance(mech, CompletedRoundGaussian) and mech.sample_rate == 0.5
    assert 0 < mech.gaussian_weight < 0.5 and public.inclusion_rate > 0.5
    assert isinstance(server.event.sampling, NoSampling)
    assert mech.noise_multiplier == server.event.mechanism.noise_multiplier
    assert "exact XNoise" in observers.mechanism and "legacy" not in observers.mechanism


def test_calibration_for_observers_needs_less_noise_under_sampling() -> None:
    kw = dict(noise_multiplier=0.0, target_epsilon=6.0, sample_rate=0.3, num_server_rounds=20)
    z = {a: get_mode("distributed").plan(_cfg(privacy_audience=a, **kw), population=30,
                                          dim=DIM).noise_multiplier for a in ("server", "observers")}
    assert z["observers"] < 0.8 * z["server"]


@pytest.mark.parametrize("audience", ["server", "observers"])
def test_calibration_meets_the_target_for_the_chosen_audience(audience: str) -> None:
    cfg = _cfg(noise_multiplier=0.0, target_epsilon=6.0, privacy_audience=audience)
    plan = get_mode("distributed").plan(cfg, population=10, dim=DIM)
    assert plan.calibrated and plan.noise_multiplier > 0
    t, _ = secagg_parameters(cfg, population=10)
    ddp = make_encoding(cfg.replace(noise_multiplier=plan.noise_multiplier), population=10, dim=DIM,
                        threshold=t).ddp()
    worst = [ddp.worst_release(max_roster=10)] * cfg.num_server_rounds
    eps = audience_epsilons(worst, delta=cfg.target_delta, sampling=PoissonSampling(rate=1.0))
    assert eps.server <= 6.0
    lower = make_encoding(cfg.replace(noise_multiplier=plan.noise_multiplier / 1.01), population=10,
                          dim=DIM, threshold=t).ddp()
    less = [lower.worst_release(max_roster=10)] * cfg.num_server_rounds
    assert audience_epsilons(less, delta=cfg.target_delta).server > 6.0  # not much more noise
    assert math.isfinite(plan.target_epsilon) and plan.target_epsilon <= 6.0


def test_calibration_for_the_public_meets_the_target_with_the_completed_round_pair() -> None:
    # Poisson q = 0.2 of 40 clients: the public's pair (which rounds completed is public) is what
    # target-epsilon calibrates; its figure (slack included) meets the target and 1% less noise does not
    from fedprivacy.fl.secure.params import public_sampling

    cfg = _cfg(noise_multiplier=0.0, target_epsilon=5.0, privacy_audience="observers", sample_rate=0.2,
               num_server_rounds=10)
    plan = get_mode("distributed").plan(cfg, population=40, dim=DIM)
    sampling = public_sampling(cfg, population=40)
    assert plan.calibrated and plan.event.mechanism.kind == "completed_round_gaussian"
    t, _ = secagg_parameters(cfg, population=40)

    def public(z: float) -> float:
        ddp = make_encoding(cfg.replace(noise_multiplier=z), population=40, dim=DIM, threshold=t).ddp()
        worst = [ddp.worst_release(max_roster=40)] * cfg.num_server_rounds
        return audience_epsilons(worst, delta=cfg.target_delta, sampling=sampling).observers

    assert public(plan.noise_multiplier) <= 5.0 < public(plan.noise_multiplier / 1.01)


def test_a_rows_slack_covers_every_release_the_ledger_holds_after_a_re_charge() -> None:
    # Arrange: a round re-charged after a crash leaves the ledger with more releases than
    # num-server-rounds; the row's slack must then be that of every release, as the headline's is
    from fedprivacy.accounting.accountant import Accountant
    from fedprivacy.fl.modes.distributed import row_epsilon

    cfg = _cfg(num_server_rounds=3)
    plan = get_mode("distributed").plan(cfg, population=10, dim=DIM)
    t, _ = secagg_parameters(cfg, population=10)
    worst = make_encoding(cfg, population=10, dim=DIM, threshold=t).ddp().worst_release(max_roster=10)
    acc = Accountant(backend="pld", neighbouring=cfg.neighbouring)
    rows = []
    for _ in range(5):  # rounds 1, 2, 2 (re-charged), 3 and one more re-charge
        acc.spend(plan.event)
        rows.append(row_epsilon(acc, cfg, plan))
    # Assert: up to num-server-rounds releases the row is the plan's formula (unchanged)...
    assert rows[2] == acc_epsilon_at(plan, 3)
    # ...beyond it, never below the headline's figure for the same releases (audience_epsilons, server)
    for n in (4, 5):
        headline = audience_epsilons([worst] * n, delta=cfg.target_delta, neighbouring=cfg.neighbouring)
        assert rows[n - 1] >= headline.server_pld * (1 - 1e-12)
        assert rows[n - 1] == pytest.approx(headline.server_pld, rel=1e-9)
    assert rows == sorted(rows)


def acc_epsilon_at(plan, rounds: int) -> float:
    """The plan's row formula for ``rounds`` releases of its event."""
    from fedprivacy.accounting.accountant import Accountant

    acc = Accountant(backend="pld", neighbouring=plan.neighbouring)
    acc.spend(plan.event.with_count(rounds))
    return acc.epsilon(delta=plan.target_delta) + plan.epsilon_slack
