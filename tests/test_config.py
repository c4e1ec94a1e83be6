"""RunConfig: every key typed and validated; errors name the kebab-case key."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedprivacy.config import RunConfig

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _pyproject_defaults() -> dict:
    with PYPROJECT.open("rb") as fh:
        return tomllib.load(fh)["tool"]["flwr"]["app"]["config"]


# The Flower app runs secure aggregation with distributed DP by default (issue 4). The library's
# RunConfig() keeps central DP as its default, so transport-free loops (run_federated) work without a
# secure channel. Every other default is the same on both sides.
APP_DEFAULTS = {"privacy": "distributed", "secagg": True}


def test_pyproject_defaults_are_exactly_the_config_defaults() -> None:
    defaults = _pyproject_defaults()
    cfg = RunConfig.from_mapping(defaults)
    assert cfg == dataclasses.replace(RunConfig(), **APP_DEFAULTS)
    assert cfg.to_mapping() == defaults  # same key set, same values: no key is missing on either side


def test_unknown_key_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'num-rounds'"):
        RunConfig.from_mapping({"num-rounds": 3})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num-server-rounds", 0),
        ("num-server-rounds", 2.5),
        ("num-server-rounds", "many"),
        ("dataset", "mnist"),
        ("dataset", "hf:"),
        ("partitioner", "random"),
        ("dirichlet-alpha", 0.0),
        ("test-fraction", 1.0),
        ("model", "resnet"),
        ("learning-rate", -0.1),
        ("batch-size", 0),
        ("privacy", "strong"),
        ("clip-norm", -1.0),
        ("noise-multiplier", -0.5),
        ("target-epsilon", -1.0),
        ("target-delta", 0.0),
        ("target-delta", 1.5),
        ("sampling", "uniform"),
        ("sample-rate", 0.0),
        ("sample-rate", 1.5),
        ("neighbouring", "swap"),
        ("accountant", "gdp"),
        ("dpsgd", "maybe"),
        ("dpsgd-noise-multiplier", 0.0),
        ("secagg-bits", 8),
        ("secagg-bits", 40),
        ("seed", -2),
        ("client-timeout", 0.0),
        ("run-name", "a/b"),
        ("output-dir", ""),
    ],
)
def test_bad_value_is_refused_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=key):
        RunConfig.from_mapping({key: value})


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"sampling": "fixed", "cohort-size": 5}, "neighbouring"),  # fixed cohort + add-remove
        ({"sampling": "fixed", "neighbouring": "replace-one"}, "cohort-size"),
        ({"privacy": "distributed"}, "secagg"),
        ({"privacy": "central", "noise-multiplier": 0.0}, "noise-multiplier"),
        ({"privacy": "local", "clip-norm": 0.0}, "clip-norm"),
        ({"privacy": "none", "target-epsilon": 3.0}, "target-epsilon"),
        ({"resume": True}, "run-name"),
    ],
)
def test_combinations_that_cannot_be_accounted_are_refused(overrides: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        RunConfig.from_mapping(overrides)


def test_values_are_coerced_to_the_field_types() -> None:
    cfg = RunConfig.from_mapping(
        {"learning-rate": 1, "num-server-rounds": 4.0, "dpsgd": "true", "seed": "7", "clip-norm": "0.5"}
    )
    assert (cfg.learning_rate, cfg.num_server_rounds, cfg.dpsgd, cfg.seed, cfg.clip_norm) == (
        1.0, 4, True, 7, 0.5,
    )
    assert isinstance(cfg.learning_rate, float) and isinstance(cfg.num_server_rounds, int)


def test_bool_is_not_accepted_as_a_number() -> None:
    with pytest.raises(ValueError, match="num-server-rounds"):
        RunConfig.from_mapping({"num-server-rounds": True})


def test_direct_construction_checks_types() -> None:
    with pytest.raises(TypeError, match="clip-norm"):
        RunConfig(clip_norm="1")  # type: ignore[arg-type]


def test_calibration_request_and_none_mode_are_valid() -> None:
    calibrate = RunConfig.from_mapping({"noise-multiplier": 0.0, "target-epsilon": 4.0})
    assert calibrate.noise_multiplier == 0.0 and calibrate.target_epsilon == 4.0
    baseline = RunConfig.from_mapping({"privacy": "none", "clip-norm": 0.0})
    assert not baseline.is_dp


def test_seed_modes() -> None:
    assert not RunConfig().seeded and RunConfig().data_seed == 0
    assert RunConfig(seed=5).seeded and RunConfig(seed=5).data_seed == 5


@given(
    rounds=st.integers(1, 10_000),
    lr=st.floats(1e-6, 10, allow_nan=False),
    q=st.floats(1e-6, 1.0, allow_nan=False),
    sigma=st.floats(0.01, 100, allow_nan=False),
    seed=st.integers(-1, 2**31),
)
def test_to_mapping_round_trips(rounds: int, lr: float, q: float, sigma: float, seed: int) -> None:
    cfg = RunConfig(num_server_rounds=rounds, learning_rate=lr, sample_rate=q, noise_multiplier=sigma, seed=seed)
    assert RunConfig.from_mapping(cfg.to_mapping()) == cfg
