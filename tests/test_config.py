"""RunConfig: every key typed and validated; errors name the kebab-case key."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedprivacy.config import (
    APP_DEFAULTS,
    SECTIONS,
    ConfigSections,
    DataConfig,
    PrivacyConfig,
    RunConfig,
    RunOptions,
    ServerOptConfig,
)

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _pyproject_defaults() -> dict:
    with PYPROJECT.open("rb") as fh:
        return tomllib.load(fh)["tool"]["flwr"]["app"]["config"]


def test_pyproject_defaults_are_exactly_the_config_defaults() -> None:
    # The app's deliberate differences are config.APP_DEFAULTS (the one place); every other default is
    # the same on both sides.
    defaults = _pyproject_defaults()
    cfg = RunConfig.from_mapping(defaults)
    assert cfg == dataclasses.replace(RunConfig(), **APP_DEFAULTS)
    assert cfg.to_mapping() == defaults  # same key set, same values: no key is missing on either side
    assert {k: v for k, v in RunConfig().to_mapping().items() if defaults[k] != v} == {
        k.replace("_", "-"): getattr(RunConfig(), k) for k in APP_DEFAULTS
    }


def test_flat_fields_are_exactly_the_sections_fields() -> None:
    flat = {f.name: f for f in dataclasses.fields(RunConfig)}
    seen: list[str] = []
    for section in SECTIONS.values():
        for f in dataclasses.fields(section):
            seen.append(f.name)
            assert f.name in flat, f"{section.__name__}.{f.name} is not a RunConfig field"
            assert (flat[f.name].type, flat[f.name].default) == (f.type, f.default), f.name
    assert sorted(seen) == sorted(flat)  # every flat key in exactly one section
    assert len(seen) == len(set(seen))


def test_sections_round_trip_and_build_a_config() -> None:
    cfg = RunConfig(privacy="local", clip_norm=2.0, dataset="synthetic", seed=4, server_optimizer="fedadam")
    assert RunConfig.from_sections(cfg.sections) == cfg
    assert cfg.sections.privacy.clip_norm == 2.0 and cfg.sections.data.dataset == "synthetic"
    built = RunConfig.from_sections(privacy=PrivacyConfig(noise_multiplier=2.0), run=RunOptions(seed=3))
    assert built == RunConfig(noise_multiplier=2.0, seed=3)
    assert RunConfig.from_sections() == RunConfig() and RunConfig().sections == ConfigSections()


@pytest.mark.parametrize(
    ("make", "key"),
    [
        (lambda: DataConfig(dataset="cifar"), "dataset"),
        (lambda: DataConfig(partitioner="random"), "partitioner"),
        (lambda: PrivacyConfig(accountant="gdp"), "accountant"),
        (lambda: PrivacyConfig(privacy="strong"), "privacy"),
        (lambda: ServerOptConfig(server_optimizer="sgd"), "server-optimizer"),
        (lambda: RunOptions(seed=-2), "seed"),
    ],
)
def test_a_section_checks_its_own_keys(make, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        make()


def test_choices_come_from_the_registries() -> None:
    from fedprivacy.fl import server_opt

    with pytest.raises(ValueError, match="server-optimizer"):
        RunConfig(server_optimizer="test-registry-opt")
    server_opt.register_server_optimizer("test-registry-opt", server_opt.SERVER_OPTIMIZERS["fedavg"])
    try:
        assert RunConfig(server_optimizer="test-registry-opt").sections.server.server_optimizer == (
            "test-registry-opt")
    finally:
        del server_opt.SERVER_OPTIMIZERS["test-registry-opt"]


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


def test_default_reads_the_sections() -> None:
    from fedprivacy.config import default

    assert default("clip-norm") == RunConfig().clip_norm == PrivacyConfig().clip_norm
    assert default("secagg_bits") == RunConfig().secagg_bits
    with pytest.raises(ValueError, match="'num-rounds'"):
        default("num-rounds")


def test_copies_of_the_defaults_agree_with_the_run_config() -> None:
    # The data layer's DataSpec is the source of the data defaults; the benchmark spec and the
    # membership targets take the defaults they share with a run from the sections. Their other
    # defaults are their own experiment settings (documented in their docstrings).
    from fedprivacy.attacks.membership import FederatedTargetConfig
    from fedprivacy.ml.partition import DataSpec
    from fedprivacy_bench.spec import BenchSpec

    shared = {
        DataSpec: {"dataset": "dataset", "partitioner": "partitioner", "dirichlet_alpha": "dirichlet_alpha",
                   "classes_per_partition": "classes_per_partition", "min_partition_size": "min_partition_size",
                   "test_fraction": "test_fraction"},
        BenchSpec: {"model": "model", "partitioner": "partitioner", "dirichlet_alpha": "dirichlet_alpha",
                    "min_partition_size": "min_partition_size", "batch_size": "batch_size",
                    "delta": "target_delta"},
        FederatedTargetConfig: {"target_delta": "target_delta", "sample_rate": "sample_rate"},
    }
    lib = RunConfig()
    for cls, names in shared.items():
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        for name, key in names.items():
            assert defaults[name] == getattr(lib, key), f"{cls.__name__}.{name}"
