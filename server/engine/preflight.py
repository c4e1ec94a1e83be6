"""Check a run before anything starts (no SuperLink, no Ray, no client): the same refusals on every engine.

:func:`preflight` is what ``fedprivacy simulate`` (both engines) and ``scripts/flwr_local.py``
call first. It refuses, with one :class:`fedprivacy.config.ConfigError`
line that names the key, the rule, the value and the fix:

* an override key that the app does not define (with "did you mean" and the list of valid keys),
  instead of Flower's ``Key 'foo' is not present in the main dictionary`` or ``[code: 15]``;
* a value :class:`fedprivacy.config.RunConfig` refuses (types, ranges, non-finite numbers,
  combinations such as ``privacy='central'`` under ``secagg=true``);
* what the number of clients decides (``target-delta`` < 1/N, ``cohort-size`` <= N, a secure
  aggregation cohort of at least 3 with its threshold and degree);
* adaptive clipping whose count noise (``adaptive-clip-count-std``) takes the whole round's noise;
* an ``output-dir`` that cannot be created or written, a ``data-dir`` that is not a folder;
* a resumption that cannot be honoured: ``resume=true`` with no checkpoint under ``run-name``, or a
  checkpoint whose population or accounting inputs differ (:func:`fedprivacy.fl.resume.resume_checkpoint`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedprivacy.config import ConfigError, RunConfig, unknown_key_message
from server.engine._flwr_private import fuse_dicts
from server.engine.appspec import AppSpec, absolute_output_dir, load_app_spec, parse_overrides

__all__ = ["Preflight", "check_paths", "preflight"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Preflight:
    """A checked run: the app, the overrides to pass on (``output-dir`` made absolute), the fused
    config Flower will build from them, and its validated :class:`RunConfig`."""

    spec: AppSpec
    overrides: dict[str, Any]
    fused: dict[str, Any]
    config: RunConfig


def preflight(run_config: Mapping[str, Any] | str, *, app_dir: str | Path = ".",
              num_supernodes: int | None = None) -> Preflight:
    """Validate ``run_config`` overrides for ``num_supernodes`` clients (None: unknown yet).

    Raises:
        ConfigError: one line naming the key, the rule, the value and how to fix it.
        FileNotFoundError: ``app_dir`` has no ``pyproject.toml``.
    """
    spec = load_app_spec(app_dir)
    try:
        overrides = parse_overrides(run_config)
    except ValueError as exc:
        raise ConfigError(f"--run-config: {exc}") from exc
    known = list(spec.default_config)
    for key in overrides:
        if key not in spec.default_config:
            raise ConfigError(unknown_key_message(key, known))
    fused = fuse_dicts(spec.default_config, overrides)
    overrides = absolute_output_dir(overrides, fused)
    fused = fuse_dicts(spec.default_config, overrides)
    cfg = RunConfig.from_mapping(fused)
    check_paths(cfg)
    if num_supernodes is not None:
        from fedprivacy.fl.privacy import check_population
        from fedprivacy.fl.resume import resume_checkpoint

        check_population(cfg, population=num_supernodes)
        check_population_data(cfg, population=num_supernodes)
        _check_adaptive_clip(cfg, population=num_supernodes)
        if cfg.secagg:
            from fedprivacy.fl.secure.params import secagg_parameters

            try:
                secagg_parameters(cfg, population=num_supernodes)
            except ValueError as exc:
                raise ConfigError(f"{exc}; use more clients, or secagg=false with privacy='central' "
                                  "or 'none'") from exc
        if cfg.run_name:
            resume_checkpoint(cfg, Path(cfg.output_dir) / cfg.run_name, population=num_supernodes)
    return Preflight(spec=spec, overrides=overrides, fused=fused, config=cfg)


EAGER_CLIENTS = 100_000  # above this, a data set made for every client up front is refused
SIZE_CHECK_CLIENTS = 1000  # above this, a pooled data set is loaded to check it has an example a client


def check_population_data(cfg: RunConfig, *, population: int) -> None:
    """Refuse a population the data set cannot give a partition to every client, before start-up.

    A data set generated for every client up front (``synthetic``) is refused above ``EAGER_CLIENTS``
    clients, and a pooled one (``digits``, ``fashion-mnist``) with fewer training examples than clients;
    ``synthetic-lazy`` makes each client when it is sampled and has no limit.
    """
    from fedprivacy.ml.data import dataset_entry

    entry = dataset_entry(cfg.dataset)
    if entry.client_loader is not None or entry.prefix:
        return
    if entry.per_client and population > EAGER_CLIENTS:
        raise ConfigError(f"dataset {cfg.dataset!r} generates all {population} clients before round 1 "
                          f"(at most {EAGER_CLIENTS} here); use dataset='synthetic-lazy', which makes each "
                          "client when it is sampled")
    if not entry.per_client and population > SIZE_CHECK_CLIENTS:
        from fedprivacy.ml.data import load_dataset
        from fedprivacy.ml.partition import data_spec

        spec = data_spec(cfg)
        train, _ = load_dataset(spec.dataset, seed=spec.seed, test_fraction=spec.test_fraction,
                                options=spec.options)
        if population > len(train):
            raise ConfigError(f"dataset {cfg.dataset!r} has {len(train)} training examples for {population} "
                              "clients (one each at least); use fewer clients or dataset='synthetic-lazy'")


def _check_adaptive_clip(cfg: RunConfig, *, population: int) -> None:
    """Adaptive clipping's count noise must leave the update a share of the round's noise (the run
    checks it again with the plan); refused here so that the user sees it before start-up."""
    if not cfg.adaptive_clip or cfg.noise_multiplier <= 0 or cfg.privacy == "none":
        return
    from fedprivacy.fl.adaptive_clip import adaptive_clip_spec
    from fedprivacy.fl.privacy import denominator_of

    try:
        adaptive_clip_spec(cfg, noise_multiplier=cfg.noise_multiplier,
                           denominator=denominator_of(cfg, population=population))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def check_paths(cfg: RunConfig) -> None:
    """Refuse an ``output-dir`` the run could not create or write and a ``data-dir`` that is not a
    folder, before anything starts; nothing is created here.

    Raises:
        ConfigError: one line naming the key and the path.
    """
    if cfg.data_dir and not Path(cfg.data_dir).is_dir():
        raise ConfigError(f"data-dir {cfg.data_dir!r} is not a folder; give the folder that holds the "
                          "data set's files, or data-dir=\"\" for the default places")
    out = Path(cfg.output_dir).absolute()
    probe = out
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        what = "is not a folder" if probe == out else f"cannot be created: {str(probe)!r} is not a folder"
        raise ConfigError(f"output-dir {cfg.output_dir!r} {what}; choose another output-dir")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"output-dir {cfg.output_dir!r} cannot be written: no write permission on "
                          f"{str(probe)!r}; choose another output-dir")
