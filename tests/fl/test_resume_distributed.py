"""A resumed distributed run never prints less than was released (review-dp F3).

Real secure-aggregation rounds (the real client steps, ``DirectTransport`` of
``tests/fl/test_secure_round.py``) in a transport-free :class:`FederatedRun`, killed after a
checkpoint and resumed. The distributed summary re-accounts every round from the run's plan, so a
resume must not change the plan: a noise multiplier calibrated for ``num-server-rounds`` is refused a
new ``num-server-rounds`` (at the review's setting, 10 clients, target ε 4: T = 10 calibrates
z = 3.42, ten rounds released at it have ε 2.985; recalibrated for T = 20 the same rounds would be
printed as 2.021). Every printed figure is checked against dp-accounting's own composition of the
events the journal charged. A round charged and cut off is accounted at a release whose slack is the
worst of every roster and survivor count (review-dp F6), checked by brute force.
"""

from __future__ import annotations

import math
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from test_secure_round import DirectTransport, _updates

from fedprivacy.accounting import ChargeJournal
from fedprivacy.accounting.audiences import audience_epsilons
from fedprivacy.config import RunConfig
from fedprivacy.errors import ConfigError
from fedprivacy.fl.modes import Transport
from fedprivacy.fl.run import run_federated
from fedprivacy.fl.types import ModelHooks
from fedprivacy.secagg.ddp import DistributedDPConfig

N = 10
LIKE = [np.zeros(6, np.float32)]
UPDATES = _updates(N, LIKE, seed=5)


class _Killed(BaseException):
    pass


def _kill_after(rnd: int):
    def log(line: str) -> None:
        if line.startswith(f"round {rnd:3d}/"):
            raise _Killed

    return log


def _cfg(tmp_path: Path, **kw: object) -> RunConfig:
    base = {"privacy": "distributed", "secagg": True, "accountant": "pld", "output-dir": str(tmp_path),
            "seed": 3, "clip-norm": 0.5, "target-delta": 1e-5, "run-name": "d"}
    return RunConfig.from_mapping({**base, **kw})


def _run(cfg: RunConfig, log=lambda _: None) -> dict:
    hooks = ModelHooks(init=lambda seed: [np.zeros_like(a) for a in LIKE],
                       evaluate=lambda w: (float(np.sum(w[0] ** 2)), 0.5), num_classes=2)
    # the clients' floor is what the run asks for (the user runs both sides)
    return run_federated(cfg, population=N, transport=Transport(secure=DirectTransport(cfg, UPDATES)),
                         hooks=hooks, log=log)


def _dp_accounting_epsilon(journal: ChargeJournal, delta: float) -> float:
    """dp-accounting's PLD of the journal's charged events (each an unsampled Gaussian here), minus
    1e-6 relative: both are pessimistic PLDs, whose discretisations differ at ~1e-8."""
    acc = dp_accounting.pld.PLDAccountant()
    for entry in journal.accountant.ledger:
        assert entry.event.sampling.rate == 1.0  # the server's audience: no amplification
        acc.compose(dp_accounting.GaussianDpEvent(entry.event.mechanism.noise_multiplier),
                    entry.event.count)
    return float(acc.get_epsilon(delta)) * (1 - 1e-6)


def test_a_calibrated_distributed_run_cannot_resume_with_other_rounds(tmp_path: Path) -> None:
    # Arrange: z calibrated for 3 rounds at target ε 4; killed after round 2's checkpoint
    kw = {"noise-multiplier": 0.0, "target-epsilon": 4.0, "num-server-rounds": 3}
    with pytest.raises(_Killed):
        _run(_cfg(tmp_path, **kw), log=_kill_after(2))
    # Act / Assert: T = 6 would recalibrate z and re-account rounds 1-2 at it: refused
    with pytest.raises(ConfigError, match=r"num-server-rounds differs .*\(3 != 6\).*calibrated"):
        _run(_cfg(tmp_path, **{**kw, "num-server-rounds": 6, "resume": True}))
    res = _run(_cfg(tmp_path, **{**kw, "resume": True}))
    journal = ChargeJournal.recover(tmp_path / "d" / "privacy-journal.jsonl")
    assert list(journal.charged_rounds) == [1, 2, 3]
    eps = res["privacy"]["epsilon"]
    assert eps >= _dp_accounting_epsilon(journal, 1e-5)
    assert eps >= res["privacy"]["distributed"]["ledger_epsilon"] and eps <= 4.0


def test_a_distributed_run_resumed_with_more_rounds_prints_at_least_what_ran(tmp_path: Path) -> None:
    # Arrange: a configured z (resuming with more rounds is allowed), a budget; killed after round 1
    kw = {"noise-multiplier": 1.5, "target-epsilon": 60.0, "num-server-rounds": 2}
    with pytest.raises(_Killed):
        _run(_cfg(tmp_path, **kw), log=_kill_after(1))
    # Act: resumed for 4 rounds (the budget now reserves the slack of 4 rounds)
    res = _run(_cfg(tmp_path, **{**kw, "num-server-rounds": 4, "resume": True}))
    # Assert
    journal = ChargeJournal.recover(tmp_path / "d" / "privacy-journal.jsonl")
    assert list(journal.charged_rounds) == [1, 2, 3, 4] and res["status"] == "completed"
    assert res["privacy"]["distributed"]["completed_rounds"] == [1, 2, 3, 4]
    eps = res["privacy"]["epsilon"]
    assert eps >= _dp_accounting_epsilon(journal, 1e-5)
    assert eps >= res["privacy"]["distributed"]["ledger_epsilon"]


def test_a_cut_off_round_is_accounted_at_the_worst_slack_of_every_roster_and_count() -> None:
    # Arrange: review-dp F6 XNoise setting (d=2410, C=0.5, z=1, t=6; scale 2^17, the largest the exact
    # sampler's tables take now), rosters <= 30
    ddp = DistributedDPConfig(dim=2410, clip_norm=0.5, noise_multiplier=1.0, min_survivors=6,
                              scale=2.0**17, modulus_bits=32, max_clients=400, xnoise=True)
    pairs = {(n, s): ddp.release(roster=n, survivors=s) for n in range(6, 31) for s in range(6, n + 1)}

    def slack(r) -> float:
        return r.eta + r.sampler_ratio - math.log1p(-r.sampler_tv)

    # Act: the release every completed or cut-off round is charged at (secagg2's worst_release)
    worst = ddp.worst_release(max_roster=30)
    # Assert, by brute force over every pair: not monotone in the count (t survivors of the largest
    # roster, the old choice for a cut-off round, is not the maximum); the worst release dominates
    top = max(pairs, key=lambda k: slack(pairs[k]))
    assert top[1] > 6 and slack(pairs[top]) > 2 * slack(pairs[(30, 6)])
    assert slack(worst) >= max(slack(r) for r in pairs.values())
    assert worst.noise_multiplier <= min(r.noise_multiplier for r in pairs.values())
    eps_worst = audience_epsilons([worst] * 5, delta=1e-5)
    for r in pairs.values():
        eps = audience_epsilons([r] * 5, delta=1e-5)
        assert eps_worst.server >= eps.server and eps_worst.server_rdp >= eps.server_rdp
