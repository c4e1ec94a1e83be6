"""fedprivacy's accountant inside Flower's own DP strategies, end to end.

A plain Flower app (``flower_dp_apps``: FedAvg, ``fixedclipping_mod``, softmax regression on digits)
runs on the in-process engine (and, marked slow, on Flower's Ray simulation). The strategy's accountant
is fedprivacy's; in the same run every event the strategy composes is also composed into Flower's own
``RdpAccountant`` (the no-amplification accounting Flower's strategies accept), and the final epsilon is
checked against the ``fedprivacy epsilon`` command for the same configuration.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flower_dp_apps import make_client_app, make_server_app
from flwr.serverapp import (
    GaussianPrivacyEvent,
    NeighboringRelation,
    PrivacyConfig,
    RdpAccountant,
    SamplingMethod,
)
from flwr.serverapp.exception import PrivacyBudgetExhausted
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)
from typer.testing import CliRunner

from fedprivacy.cli import app as cli_app
from server.engine import run_inprocess
from server.flower_accountant import FedprivacyAccountant, SecureCohortFedAvg, attach_accountant

REPO = Path(__file__).resolve().parents[2]
DELTA = 1e-5
Z, CLIP = 1.0, 1.0


class _AlsoFlowersRdp(FedprivacyAccountant):
    """fedprivacy's accountant that also composes every event into Flower's RdpAccountant."""

    def __init__(self, config: PrivacyConfig, **kw: Any) -> None:
        super().__init__(config, **kw)
        self.flowers = RdpAccountant(PrivacyConfig(
            target_delta=config.target_delta, population_size=config.population_size,
            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
            sampling_method=SamplingMethod.NO_AMPLIFICATION))
        self.events: list[GaussianPrivacyEvent] = []

    def compose(self, event: GaussianPrivacyEvent, count: int = 1) -> None:
        super().compose(event, count)
        self.flowers.compose(event, count)
        self.events.append(event)


def _cli_epsilon(*args: str) -> float:
    res = CliRunner().invoke(cli_app, ["epsilon", "--noise-multiplier", str(Z), "--delta",
                                       str(DELTA), *args, "--json"])
    assert res.exit_code == 0, res.output
    return float(json.loads(res.output)["epsilon"])


def _run(build: Any, *, nodes: int, rounds: int, clip_on_client: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {}
    run_inprocess(num_supernodes=nodes, app_dir=REPO,
                  client_app=make_client_app(clip_on_client=clip_on_client),
                  server_app=make_server_app(build, rounds, out))
    return out


def _config(n: int, method: SamplingMethod, max_epsilon: float | None = None) -> PrivacyConfig:
    relation = (NeighboringRelation.REPLACE_ONE if method is SamplingMethod.WITHOUT_REPLACEMENT
                else NeighboringRelation.ADD_OR_REMOVE_ONE)
    return PrivacyConfig(target_delta=DELTA, population_size=n, neighboring_relation=relation,
                         sampling_method=method, max_epsilon=max_epsilon)


@pytest.mark.parametrize("wrapper", [DifferentialPrivacyClientSideFixedClipping,
                                     DifferentialPrivacyServerSideFixedClipping])
def test_flowers_strategy_with_flowers_sampling_gets_unamplified_pld(wrapper: type) -> None:
    # Arrange: Flower's FedAvg draws 5 of 10 with random.sample: no amplification is credited; the zero-out
    # figure is Flower's own (sensitivity C), compared with Flower's RdpAccountant
    acc = _AlsoFlowersRdp(_config(10, SamplingMethod.NO_AMPLIFICATION), adjacency="zero-out")

    def build() -> Any:
        return wrapper(FedAvg(fraction_train=0.5, fraction_evaluate=0.0), noise_multiplier=Z,
                       clipping_norm=CLIP, num_sampled_clients=5, accountant=acc)

    # Act
    out = _run(build, nodes=10, rounds=6,
               clip_on_client=wrapper is DifferentialPrivacyClientSideFixedClipping)

    # Assert: six releases, each the strategy's own event; PLD = `fedprivacy epsilon`, < Flower's RDP
    assert acc.num_releases == 6 and len(acc.events) == 6
    assert {(e.noise_multiplier, e.sample_size, e.population_size) for e in acc.events} == {(Z, 5, 10)}
    ours, flowers = acc.get_epsilon(DELTA), acc.flowers.get_epsilon(DELTA)
    cli = _cli_epsilon("--steps", "6", "--sampling", "none")
    assert ours == pytest.approx(cli, rel=0.01)
    assert ours < flowers
    assert out["strategy"].privacy_spent().epsilon == ours
    # the default replace-one claim of the same releases: sensitivity 2C (no add/remove claim)
    replace_one = FedprivacyAccountant(_config(10, SamplingMethod.NO_AMPLIFICATION))
    for e in acc.events:
        replace_one.compose(e)
    assert replace_one.get_epsilon(DELTA) == pytest.approx(
        _cli_epsilon("--steps", "6", "--sampling", "none", "--neighbouring", "replace-one"), rel=0.01)
    final = out["result"].arrays.to_numpy_ndarrays()
    assert np.abs(final[0]).sum() > 0  # the model was trained


def test_secure_cohort_sampler_gets_fixed_cohort_amplification_in_flowers_strategy() -> None:
    # Arrange: 10 of 100 nodes per round, drawn by fedprivacy's secure sampler; budget checked.
    n, m, rounds = 100, 10, 4
    holder: dict[str, Any] = {}

    def build() -> Any:
        sampler = SecureCohortFedAvg(cohort_size=m, population_size=n, fraction_evaluate=0.0)
        acc = _AlsoFlowersRdp(_config(n, SamplingMethod.WITHOUT_REPLACEMENT, max_epsilon=50.0),
                              sampler=sampler)
        dp = DifferentialPrivacyClientSideFixedClipping(sampler, Z, CLIP, m)
        attach_accountant(dp, acc)
        holder["acc"], holder["sampler"] = acc, sampler
        return dp

    # Act
    _run(build, nodes=n, rounds=rounds)

    # Assert
    acc, sampler = holder["acc"], holder["sampler"]
    assert acc.num_releases == rounds and len(sampler.draws) == rounds
    assert [e.round for e in acc.ledger.ledger] == [1, 2, 3, 4]
    ours, flowers = acc.get_epsilon(DELTA), acc.flowers.get_epsilon(DELTA)
    cli = _cli_epsilon("--steps", str(rounds), "--sampling", "fixed", "--population", str(n),
                       "--cohort", str(m), "--neighbouring", "replace-one")
    assert ours == pytest.approx(cli, rel=0.01)
    assert ours < flowers  # 9.39 < 10.73 here; the gap grows with rounds (12.5 < 19.1 at 10)


def test_budget_stops_flowers_strategy_before_the_release_that_would_exceed_it() -> None:
    three = _cli_epsilon("--steps", "3", "--sampling", "none", "--neighbouring", "replace-one")  # the default: 2C
    acc = FedprivacyAccountant(_config(10, SamplingMethod.NO_AMPLIFICATION, max_epsilon=three * 1.001))

    def build() -> Any:
        return DifferentialPrivacyClientSideFixedClipping(
            FedAvg(fraction_train=0.5, fraction_evaluate=0.0), Z, CLIP, 5, accountant=acc)

    with pytest.raises(PrivacyBudgetExhausted):
        _run(build, nodes=10, rounds=6)

    assert acc.num_releases == 3 and acc.get_epsilon(DELTA) <= three * 1.001


@pytest.mark.slow
def test_flower_ray_simulation_with_fedprivacys_accountant() -> None:
    # Flower's own Simulation Engine (Ray).
    from flwr.simulation import run_simulation

    acc = _AlsoFlowersRdp(_config(6, SamplingMethod.NO_AMPLIFICATION), adjacency="zero-out")
    out: dict[str, Any] = {}

    def build() -> Any:
        # FedAvg's sample size is int(fraction_train * nodes connected *now*), and Ray's nodes
        # register one by one: without min_train_nodes / min_available_nodes the first round drew
        # 2 of the 4-5 nodes then connected, and Flower's strategy refused the mismatch.
        return DifferentialPrivacyClientSideFixedClipping(
            FedAvg(fraction_train=0.5, fraction_evaluate=0.0, min_train_nodes=3,
                   min_available_nodes=6), Z, CLIP, 3, accountant=acc)

    run_simulation(server_app=make_server_app(build, 3, out), client_app=make_client_app(),
                   num_supernodes=6,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})

    assert acc.num_releases == 3
    assert acc.get_epsilon(DELTA) == pytest.approx(
        _cli_epsilon("--steps", "3", "--sampling", "none"), rel=0.01)
    assert acc.get_epsilon(DELTA) < acc.flowers.get_epsilon(DELTA)
