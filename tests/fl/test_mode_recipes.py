"""The recipes on the mode/mechanism model, each as a researcher would write it (one class in this file):
a client-side mechanism runs and is charged as it ran; a mode that forgets its noise cannot report an ε;
a renamed copy of ``central`` keeps what ``central`` keeps private."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedprivacy.accounting.accountant import Accountant
from fedprivacy.accounting.events import LaplaceEvent, NoSampling, PrivacyEvent
from fedprivacy.config import RunConfig
from fedprivacy.dp.rng import RandomSource
from fedprivacy.fl.aggregation import PlainAggregator
from fedprivacy.fl.checkpoint import load_checkpoint
from fedprivacy.fl.client import client_update
from fedprivacy.fl.client_policy import ClientPolicy, PolicyRefusal
from fedprivacy.fl.mechanisms import CLIENT_MECHANISMS, MechanismMismatch, register_client_mechanism
from fedprivacy.fl.modes import MODES, plain_round, register_mode
from fedprivacy.fl.modes.base import exchange_of
from fedprivacy.fl.modes.plain import CentralMode, LocalMode, NoneMode
from fedprivacy.fl.run import run_federated
from fedprivacy.fl.task import LocalResult
from fedprivacy.fl.types import ClientUpdate, ModelHooks, RoundInstructions

N, DIM, C = 6, 6, 1.0
TARGETS = [RandomSource.seeded(5).child(p).normal(std=2.0, size=DIM) for p in range(N)]


# ---------------------------------------------------------------------------- the recipe: one mechanism
@dataclasses.dataclass(frozen=True)
class LaplaceNoise:
    """Laplace(0, zC) per coordinate. Two clipped updates differ by at most 2C in L2, so by at most
    2C·sqrt(d) in L1: one release is (2·sqrt(d)/z)-DP (Dwork et al. 2006)."""

    name: str = "test-laplace"

    def privatize(self, arrays: Sequence[np.ndarray], *, clip_norm: float, noise_multiplier: float,
                  rng: RandomSource) -> list[np.ndarray]:
        return [a + rng.laplace(scale=noise_multiplier * clip_norm, size=a.shape) for a in arrays]

    def event(self, *, noise_multiplier: float, dim: int | None) -> LaplaceEvent:
        if dim is None:
            raise ValueError("the Laplace mechanism's L1 sensitivity needs the dimension")
        return LaplaceEvent(epsilon=2.0 * math.sqrt(dim) / noise_multiplier)


class LocalLaplace(LocalMode):
    name = "test-local-laplace"
    mechanism = "Laplace on each clipped update (client-side noise)"
    client_mechanism = LaplaceNoise()


# ---------------------------------------------------------------------------- modes that forget their noise
class ForgetfulLaplace(NoneMode):
    """The old recipe's mistake: the plan charges a Laplace event, nothing adds the noise."""

    name = "test-forgetful"

    def plan(self, cfg: RunConfig, *, population: int, dim: int | None = None) -> Any:
        plan = super().plan(cfg, population=population, dim=dim)
        return dataclasses.replace(plan, mode=self.name, event=PrivacyEvent(
            mechanism=LaplaceEvent(epsilon=1.0), sampling=NoSampling(), count=1))


class QuietCentral(CentralMode):
    """Names the server's Gaussian, then aggregates without it."""

    name = "test-quiet-central"

    def round_fn(self, cfg: RunConfig, plan: Any, transport: Any, *, aggregator: Any = None,
                 log: Any = print) -> Any:
        return plain_round(exchange_of(transport, cfg), PlainAggregator(clip_norm=cfg.clip_norm, noise_std=0.0),
                           denominator=plan.denominator)


class Central2(CentralMode):
    name = "test-central2"


@pytest.fixture(autouse=True)
def _registered() -> Iterator[None]:
    register_client_mechanism(LaplaceNoise())
    for mode in (LocalLaplace(), ForgetfulLaplace(), QuietCentral(), Central2()):
        register_mode(mode)
    yield
    CLIENT_MECHANISMS.pop("test-laplace")
    for name in ("test-local-laplace", "test-forgetful", "test-quiet-central", "test-central2"):
        MODES.pop(name)


def _hooks() -> ModelHooks:
    return ModelHooks(init=lambda seed: [np.zeros(DIM, np.float32)],
                      evaluate=lambda w: (float(np.sum(np.asarray(w[0]) ** 2)), 0.5), num_classes=2)


def _exchange(received: list[np.ndarray]) -> Any:
    """The real client pipeline (mechanism resolved by name, clip, noise), each client its own policy."""

    def exchange(instr: RoundInstructions, cohort: Sequence[int], weights: Sequence[np.ndarray]) -> Any:
        updates: list[ClientUpdate] = []
        for pid in cohort:
            own = ClientPolicy(modes=(instr.privacy,), min_noise_multiplier=0.0, max_rho_per_round=math.inf,
                               max_rho_total=math.inf, allow_seeded=True)
            followed = own.apply(instr, dim=DIM, mode=MODES[instr.privacy])

            def train(w: Sequence[np.ndarray], seed: int, pid: int = pid) -> LocalResult:
                return LocalResult(weights=[np.asarray(w[0]) + TARGETS[pid]], num_examples=10, loss=1.0,
                                   dpsgd_steps=None, dpsgd_sample_rate=None)

            update = client_update(partition_id=pid, weights=weights, instructions=followed, train=train)
            received.append(np.asarray(update.delta[0], np.float64))
            updates.append(update)
        return updates, {}

    return exchange


def _cfg(tmp_path: Path, privacy: str, **kw: Any) -> RunConfig:
    return RunConfig.from_mapping({"output-dir": str(tmp_path), "run-name": privacy, "seed": 3,
                                   "privacy": privacy, "secagg": False, "accountant": "pld",
                                   "num-server-rounds": 2, "noise-multiplier": 1.0, "clip-norm": C,
                                   "target-delta": 1e-3, **kw})


def test_a_registered_client_mechanism_adds_its_noise_and_is_charged_as_it_ran(tmp_path: Path) -> None:
    # Arrange
    received: list[np.ndarray] = []
    # Act
    res = run_federated(_cfg(tmp_path, "test-local-laplace"), population=N, exchange=_exchange(received),
                        hooks=_hooks(), log=lambda _: None)
    # Assert: the server saw noised updates (clipped ones have norm exactly C = 1) ...
    assert len(received) == 2 * N
    norms = [float(np.linalg.norm(u)) for u in received]
    assert float(np.median(norms)) > 2.5 * C  # Laplace(1) on 6 coordinates: norm ~ sqrt(12) = 3.5
    # ... and the ledger charged the mechanism's own event twice: 2 rounds of (2 sqrt(6))-DP
    eps0 = 2.0 * math.sqrt(DIM)
    want = Accountant(backend="pld", neighbouring="replace-one").epsilon_if(
        PrivacyEvent(mechanism=LaplaceEvent(epsilon=eps0), sampling=NoSampling(), count=2), delta=1e-3)
    assert res["privacy"]["epsilon"] == pytest.approx(want, rel=1e-9)
    assert eps0 < res["privacy"]["epsilon"] <= 2 * eps0 + 1e-9


def test_a_mode_that_charges_an_event_but_names_no_mechanism_cannot_run(tmp_path: Path) -> None:
    received: list[np.ndarray] = []
    with pytest.raises(MechanismMismatch, match="names no mechanism that adds noise"):
        run_federated(_cfg(tmp_path, "test-forgetful", **{"noise-multiplier": 0.0}), population=N,
                      exchange=_exchange(received), hooks=_hooks(), log=lambda _: None)
    assert received == []  # refused before round 1: nothing was sent, no ε printed
    assert not (tmp_path / "test-forgetful" / "results.json").exists()


def test_a_mode_whose_round_forgets_the_server_noise_is_refused_before_anything_is_applied(tmp_path: Path) -> None:
    with pytest.raises(MechanismMismatch, match="carries noise std 0"):
        run_federated(_cfg(tmp_path, "test-quiet-central"), population=N, exchange=_exchange([]), hooks=_hooks(),
                      log=lambda _: None)
    assert load_checkpoint(tmp_path / "test-quiet-central" / "checkpoint") is None
    results = tmp_path / "test-quiet-central" / "results.json"
    assert not results.exists() or json.loads(results.read_text())["rounds"] == []


def test_a_mode_without_the_members_that_say_what_it_means_is_not_registered() -> None:
    class OldRecipe:  # plan, round_fn and summary only: nothing says whether it adds noise
        name = "test-old-recipe"
        plan = round_fn = summary = check = disclosure = staticmethod(lambda *a, **k: None)

    with pytest.raises(TypeError, match="must say its trusted_server"):
        register_mode(OldRecipe())  # type: ignore[arg-type]


def test_a_renamed_copy_of_central_keeps_the_counts_private(tmp_path: Path) -> None:
    # Act
    res = run_federated(_cfg(tmp_path, "test-central2", **{"sample-rate": 0.5}), population=N,
                        exchange=_exchange([]), hooks=_hooks(), log=lambda _: None)
    builtin = run_federated(_cfg(tmp_path, "central", **{"sample-rate": 0.5}), population=N,
                            exchange=_exchange([]), hooks=_hooks(), log=lambda _: None)
    # Assert: the same claim and the same rows as the built-in: no counts, no un-noised loss, no times
    assert res["privacy"]["epsilon"] == builtin["privacy"]["epsilon"]
    assert res["privacy"]["participation"] == builtin["privacy"]["participation"]
    assert res["privacy"]["participation"]["published"] is False
    assert [set(r) for r in res["rounds"]] == [set(r) for r in builtin["rounds"]]
    assert not any("clients_sampled" in r or "train_loss" in r for r in res["rounds"])


def test_a_client_refuses_a_mechanism_it_has_not_registered() -> None:
    instr = RoundInstructions(round=1, privacy="local", clip_norm=1.0, client_mechanism="skellam",
                              noise_multiplier=1.0, private=True, learning_rate=0.1, local_epochs=1,
                              batch_size=1, num_classes=2, seed=-1)
    with pytest.raises(PolicyRefusal, match="'skellam' is not registered here"):
        ClientPolicy().apply(instr)
