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
from fedprivacy.fl.byzantine import ByzantineSpec, byzantine_of
from fedprivacy.fl.client_policy import ENV_VAR
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
    ("flip", "attack must be one of scale, sign-flip, random"),
    ("scale:factor=-1", "factor must be > 0"),
    ("scale:fraction=2", r"fraction must be in \[0, 1\]"),
    ("scale:speed=3", "expected factor=, fraction= or seed= items"),
    ("scale:factor=x", "factor must be a number"),
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
