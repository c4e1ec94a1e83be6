"""Byzantine clients in simulations: the spec, what they send, and real runs in which they take part
(the ε is the honest run's, the ground truth is kept owner-only, the apps read it from the node side)."""

from __future__ import annotations

import json
import math
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedprivacy.config import RunConfig
from fedprivacy.dp.rng import RandomSource
from fedprivacy.errors import ConfigError
from fedprivacy.fl.byzantine import PATCH, ByzantineSpec, byzantine_of
from fedprivacy.fl.client import client_update
from fedprivacy.fl.client_policy import ENV_VAR
from fedprivacy.fl.task import LocalResult
from fedprivacy.fl.types import RoundInstructions
from fedprivacy.ml.partition import load_test_set
from server.engine import run_inprocess

DELTA = [np.array([0.3, -0.4], np.float64), np.array([[1.2]], np.float64)]


def test_each_attack_sends_what_it_says() -> None:
    rng = RandomSource.seeded(1)
    scaled = ByzantineSpec(attack="scale", factor=10).corrupt(DELTA, rng)
    flipped = ByzantineSpec(attack="sign-flip", factor=3).corrupt(DELTA, rng)
    noise = ByzantineSpec(attack="random", factor=2).corrupt(DELTA, rng)
    for got, want, f in ((scaled, DELTA, 10.0), (flipped, DELTA, -3.0)):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, f * b)
    norm = math.sqrt(sum(float(np.sum(a * a)) for a in DELTA))
    assert math.sqrt(sum(float(np.sum(a * a)) for a in noise)) == pytest.approx(2 * norm)
    assert [a.shape for a in noise] == [a.shape for a in DELTA]


def test_the_byzantine_set_is_a_seeded_fraction_of_the_population() -> None:
    spec = ByzantineSpec.parse("sign-flip:factor=10,fraction=0.1,seed=4")
    assert spec is not None
    members = spec.members(5000)
    assert members == spec.members(5000)  # every process agrees
    assert 400 < len(members) < 600
    assert ByzantineSpec.parse("sign-flip:fraction=0.1,seed=5").members(5000) != members  # type: ignore[union-attr]
    assert ByzantineSpec.parse("") is None


@pytest.mark.parametrize(("spec", "msg"), [
    ("flip", "attack must be one of scale, sign-flip, random, backdoor"),
    ("scale:factor=-1", "factor must be > 0"),
    ("scale:fraction=2", r"fraction must be in \[0, 1\]"),
    ("scale:speed=3", "expected factor=, fraction=, seed=, target= or trigger= items"),
    ("scale:factor=x", "factor must be a number"),
    ("backdoor:factor=nan", "factor must be > 0"),
    ("backdoor:target=-1", "target must be an int >= 0"),
    ("backdoor:target=x", "target must be a number"),
    ("backdoor:trigger=star", "trigger must be one of patch, none"),
    ("sign-flip:target=3", "target= and trigger= are backdoor items"),
])
def test_a_bad_spec_is_one_line_naming_the_key(spec: str, msg: str) -> None:
    with pytest.raises(ConfigError, match=f"^byzantine: .*{msg}"):
        RunConfig.from_mapping({"byzantine": spec})


class _Node:
    def __init__(self, node_config: dict[str, Any]) -> None:
        self.node_config = node_config


def test_a_client_reads_its_spec_from_its_own_side_only() -> None:
    assert byzantine_of(_Node({"byzantine": "scale:factor=2"}), environ={}) == ByzantineSpec(attack="scale", factor=2)
    env = {ENV_VAR: json.dumps({"client-modes": "central", "byzantine": "random:fraction=1"})}
    assert byzantine_of(_Node({}), environ=env) == ByzantineSpec(attack="random", fraction=1.0)
    assert byzantine_of(_Node({}), environ={}) is None


_BASE = {"num-server-rounds": 2, "seed": 7, "local-epochs": 1, "dataset": "digits", "client-timeout": 30.0,
         "accountant": "pld"}


def _run(tmp: Path, name: str, **keys: Any) -> dict[str, Any]:
    cfg = {**_BASE, **keys, "output-dir": str(tmp), "run-name": name}
    run_inprocess(run_config=cfg, num_supernodes=10, app_dir=Path(__file__).resolve().parents[2], node_id_seed=3)
    return json.loads((tmp / name / "results.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("mode", [
    {"privacy": "central", "secagg": False, "sample-rate": 0.6, "noise-multiplier": 1.0},
    {"privacy": "distributed", "secagg": True, "noise-multiplier": 1.0},
])
def test_byzantine_clients_change_the_model_not_the_epsilon(tmp_path: Path, mode: dict[str, Any]) -> None:
    honest = _run(tmp_path, "honest", **mode)
    spec = "sign-flip:factor=10,fraction=0.3,seed=1"
    attacked = _run(tmp_path, "attacked", **mode, byzantine=spec)
    assert attacked["privacy"] == honest["privacy"]  # ε covers the honest clients, as before
    assert attacked["rounds"][-1]["test_loss"] != honest["rounds"][-1]["test_loss"]
    truth = tmp_path / "attacked" / "private" / "byzantine.json"
    assert stat.S_IMODE(truth.stat().st_mode) == 0o600
    recorded = json.loads(truth.read_text(encoding="utf-8"))
    assert recorded == {"spec": spec, "partitions": ByzantineSpec.parse(spec).members(10)}  # type: ignore[union-attr]
    assert recorded["partitions"]  # some client was Byzantine
    assert "byzantine" not in json.dumps(honest["rounds"])


# ----------------------------------------------------------------------------- the targeted backdoor


def test_the_backdoor_poisons_a_copy_of_its_data_and_defaults_to_no_boost() -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(0.0, 0.5, size=(6, 1, 8, 8)).astype(np.float32)
    y = np.array([0, 1, 2, 0, 3, 4], np.int64)
    spec = ByzantineSpec.parse("backdoor:fraction=1,target=0")
    assert spec is not None and spec.factor == 1.0 and ByzantineSpec.parse("scale").factor == 10.0  # type: ignore[union-attr]
    px, py = spec.poison(x, y)
    np.testing.assert_array_equal(px[:6], x)  # the clean examples stay, as they were
    np.testing.assert_array_equal(py[:6], y)
    stamped = px[6:]
    assert len(stamped) == int(np.sum(y != 0)) and np.all(py[6:] == 0)
    assert np.all(stamped[..., -PATCH:, -PATCH:] == 1.0)
    mask = np.ones((8, 8), bool)
    mask[-PATCH:, -PATCH:] = False
    np.testing.assert_array_equal(stamped[..., mask], x[y != 0][..., mask])
    assert np.all(x[..., -PATCH:, -PATCH:] < 1.0)  # a copy: the inputs are not stamped
    lx, ly = ByzantineSpec(attack="backdoor", target=2, trigger="none").poison(x, y)
    np.testing.assert_array_equal(lx, x)
    assert np.all(ly == 2)


def _instructions(clip_norm: float) -> RoundInstructions:
    return RoundInstructions(round=1, privacy="central" if clip_norm else "none", clip_norm=clip_norm,
                             client_mechanism="", noise_multiplier=0.0, private=bool(clip_norm), learning_rate=0.1,
                             local_epochs=1, batch_size=32, num_classes=10, seed=3)


def _train(weights: Any, seed: int) -> LocalResult:
    return LocalResult(weights=[np.asarray(w) + 0.5 for w in weights], num_examples=4, loss=1.0,
                       dpsgd_steps=None, dpsgd_sample_rate=None)


@pytest.mark.parametrize("clip_norm", [0.0, 0.5])
def test_the_boost_goes_through_the_clients_own_clip(clip_norm: float) -> None:
    weights = [np.zeros(3, np.float32), np.zeros((2, 2), np.float32)]
    attack = ByzantineSpec(attack="backdoor", factor=20.0, fraction=1.0)
    kwargs: dict[str, Any] = {"partition_id": 0, "weights": weights, "instructions": _instructions(clip_norm),
                              "train": _train}
    honest = client_update(**kwargs).delta
    boosted = client_update(**kwargs, attack=attack).delta
    norm = math.sqrt(sum(float(np.sum(np.square(a, dtype=np.float64))) for a in boosted))
    if clip_norm:
        assert norm == pytest.approx(clip_norm, rel=1e-6)  # the clip bounds it as any client's
    else:
        for b, h in zip(boosted, honest, strict=True):
            np.testing.assert_allclose(b, 20.0 * h)


def test_a_backdoor_the_data_cannot_carry_is_refused_naming_the_key(tmp_path: Path) -> None:
    digits = load_test_set(RunConfig.from_mapping({"dataset": "digits"}), 10)
    with pytest.raises(ConfigError, match=r"^byzantine: target must be a class of the data set \(< 10\), got 10$"):
        ByzantineSpec(attack="backdoor", target=10).check_data(feature_shape=digits.feature_shape, num_classes=10)
    with pytest.raises(ConfigError, match=r"^byzantine: trigger=patch needs images .* shape \(60,\); use trigger=none$"):
        ByzantineSpec(attack="backdoor").check_data(feature_shape=(60,), num_classes=10)
    ByzantineSpec(attack="backdoor", trigger="none").check_data(feature_shape=(60,), num_classes=10)
    ByzantineSpec(attack="backdoor").check_data(feature_shape=(1, 28, 28), num_classes=10)  # Fashion-MNIST
    with pytest.raises(ConfigError, match=r"^byzantine: target must be a class"):  # refused before round 1
        _run(tmp_path, "refused", privacy="none", secagg=False, byzantine="backdoor:target=12,fraction=0.3")
    assert not (tmp_path / "refused" / "results.json").exists()


def _backdoor_rates(tmp: Path, name: str) -> list[float]:
    truth = tmp / name / "private" / "byzantine.json"
    assert stat.S_IMODE(truth.stat().st_mode) == 0o600
    return [row["value"] for row in json.loads(truth.read_text(encoding="utf-8"))["backdoor_accuracy"]]


_BACKDOOR = "backdoor:fraction={},seed=7,target=0"  # seed 7: partitions 5, 7 and 8 of 10 at fraction 0.3


def test_backdoor_clients_plant_the_backdoor_without_dp(tmp_path: Path) -> None:
    plain = {"privacy": "none", "secagg": False, "clip-norm": 0.0, "num-server-rounds": 4}
    honest = _run(tmp_path, "honest", **plain, byzantine=_BACKDOOR.format(0.0))  # same triggered test set
    attacked = _run(tmp_path, "attacked", **plain, byzantine=_BACKDOOR.format(0.3))
    truth = json.loads((tmp_path / "attacked" / "private" / "byzantine.json").read_text(encoding="utf-8"))
    assert truth["partitions"] == ByzantineSpec.parse(_BACKDOOR.format(0.3)).members(10) == [5, 7, 8]  # type: ignore[union-attr]
    clean, poisoned = _backdoor_rates(tmp_path, "honest"), _backdoor_rates(tmp_path, "attacked")
    assert len(clean) == len(poisoned) == 4
    assert poisoned[-1] > clean[-1] + 0.4, (clean, poisoned)
    assert attacked["rounds"][-1]["test_accuracy"] > 0.3  # the main task still learns (chance: 0.1)
    assert "backdoor" not in json.dumps(attacked["rounds"]) + json.dumps(honest["rounds"])  # owner-only


@pytest.mark.parametrize("mode", [
    {"privacy": "central", "secagg": False, "sample-rate": 0.6, "noise-multiplier": 1.0},
    {"privacy": "distributed", "secagg": True, "noise-multiplier": 1.0},
])
def test_backdoor_clients_leave_the_epsilon_as_it_was(tmp_path: Path, mode: dict[str, Any]) -> None:
    honest = _run(tmp_path, "honest", **mode)
    attacked = _run(tmp_path, "attacked", **mode, byzantine=_BACKDOOR.format(0.3) + ",factor=10")
    assert attacked["privacy"] == honest["privacy"]
    assert attacked["rounds"][-1]["test_loss"] != honest["rounds"][-1]["test_loss"]
    assert len(_backdoor_rates(tmp_path, "attacked")) == _BASE["num-server-rounds"]
