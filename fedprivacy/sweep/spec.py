"""A sweep file: run configs x seeds, read from TOML and expanded into named, hashed run plans.

A sweep file has a ``[sweep]`` table (``name``, ``num-supernodes``, ``seeds``, ``jobs``, ``workers``),
a ``[base]`` table of run-config overrides every run gets, and either one ``[grid]`` table or several
``[[grid]]`` tables: in each, a list value is an axis and a scalar is fixed; a table's runs are the
Cartesian product of its axes, and the sweep's runs are the union of its tables, each crossed with
the seeds. Keys are the run-config keys of ``pyproject.toml [tool.flwr.app.config]``. The same plan
can come from the command line (:func:`sweep_from_options`).

A run's identity is its hash (:func:`config_hash`): SHA-256 over the fused run config without the
keys that only say where it writes (``output-dir``, ``run-name``, ``resume``, the ``tracking*``
keys) and the number of SuperNodes. A restarted sweep skips a run whose hash finished before.
A tracked sweep groups its runs (:func:`tracking_overrides`): one TensorBoard folder, one MLflow
experiment, and in each one run per config hash.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedprivacy.config import ConfigError

__all__ = ["RunPlan", "SweepSpec", "config_hash", "load_sweep", "parse_sweep", "sweep_from_options",
           "tracking_overrides"]

SWEEP_KEYS = ("name", "num-supernodes", "seeds", "jobs", "workers")
TABLES = ("sweep", "base", "grid")
WHERE_KEYS = ("output-dir", "run-name", "resume")  # where a run writes, not what it computes
SWEEP_TRACKING_KEYS = ("tracking-dir", "tracking-run-name")  # set by the sweep (tracking_overrides)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPlan:
    """One run of a sweep: its overrides (seed included), a readable name and its varying axes."""

    name: str
    overrides: Mapping[str, Any]
    axes: Mapping[str, Any]
    seed: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepSpec:
    """A parsed sweep (see the module docstring); :meth:`plans` expands it."""

    name: str = "sweep"
    num_supernodes: int = 10
    seeds: tuple[int, ...] = (0,)
    jobs: int = 0  # 0: as many as the cores allow
    workers: int = 1
    base: Mapping[str, Any] = field(default_factory=dict)
    grids: tuple[Mapping[str, Any], ...] = ({},)

    def __post_init__(self) -> None:
        if self.num_supernodes < 1:
            raise ConfigError(f"sweep.num-supernodes must be >= 1, got {self.num_supernodes}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise ConfigError(f"sweep.seeds must be distinct integers >= 0, got {list(self.seeds)}")
        if self.jobs < 0 or self.workers < 1:
            raise ConfigError(f"sweep.jobs must be >= 0 and sweep.workers >= 1, got {self.jobs}, "
                              f"{self.workers}")
        for where, table in (("base", self.base), *(("grid", g) for g in self.grids)):
            for key in ("seed", *WHERE_KEYS, *SWEEP_TRACKING_KEYS):
                if key in table:
                    raise ConfigError(f"{where}.{key}: set by the sweep itself (seeds: sweep.seeds; "
                                      "where runs and their tracking go: --out)")

    def plans(self) -> tuple[RunPlan, ...]:
        """Every run, in file order: grid tables, their product (last axis fastest), then seeds."""
        out: list[RunPlan] = []
        varying = _varying_keys(self.grids)
        for grid in self.grids:
            axes = [(k, v if isinstance(v, list) else [v]) for k, v in grid.items()]
            for values in itertools.product(*(vals for _, vals in axes)):
                point = dict(zip((k for k, _ in axes), values, strict=True))
                shown = {k: v for k, v in point.items() if k in varying}
                label = ",".join(f"{k}={v}" for k, v in shown.items()) or self.name
                for seed in self.seeds:
                    out.append(RunPlan(name=f"{label},seed={seed}", axes=shown, seed=seed,
                                       overrides={**self.base, **point, "seed": seed}))
        return tuple(out)


def _varying_keys(grids: Sequence[Mapping[str, Any]]) -> set[str]:
    """Keys that take more than one value over the whole sweep (the ones a run's name shows)."""
    seen: dict[str, set[str]] = {}
    for grid in grids:
        for k, v in grid.items():
            seen.setdefault(k, set()).update(json.dumps(x) for x in (v if isinstance(v, list) else [v]))
    keys = {k for k, vals in seen.items() if len(vals) > 1}
    return keys | {k for k in seen if any(k not in g for g in grids)}


def config_hash(fused: Mapping[str, Any], *, num_supernodes: int) -> str:
    """The run's identity: 16 hex digits of SHA-256 over what it computes (not where it writes)."""
    what = {k: v for k, v in sorted(fused.items()) if k not in WHERE_KEYS and not k.startswith("tracking")}
    blob = json.dumps({"num-supernodes": num_supernodes, "config": what}, sort_keys=True, allow_nan=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def tracking_overrides(fused: Mapping[str, Any], *, out: Path, sweep: str, digest: str) -> dict[str, Any]:
    """The tracking keys a sweep gives one of its runs: the run is named by its config hash, in
    ``<out>/tensorboard/`` and in the MLflow experiment named after the sweep (in
    ``<out>/mlflow.db`` unless ``tracking-uri`` says where; ``tracking-experiment`` overrides the name)."""
    from fedprivacy.fl.tracking import parse_tracking

    names = parse_tracking(str(fused.get("tracking", "")))
    extra: dict[str, Any] = {"tracking-run-name": digest} if names else {}
    if "tensorboard" in names:
        extra["tracking-dir"] = str((out / "tensorboard").absolute())
    if "mlflow" in names:
        extra["tracking-uri"] = fused.get("tracking-uri") or f"sqlite:///{(out / 'mlflow.db').absolute()}"
        extra["tracking-experiment"] = fused.get("tracking-experiment") or sweep
    return extra


def _grids(raw: Any) -> tuple[dict[str, Any], ...]:
    if raw is None:
        return ({},)
    tables = [raw] if isinstance(raw, dict) else raw
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables) or not tables:
        raise ConfigError("grid: must be one [grid] table or a list of [[grid]] tables")
    for table in tables:
        for key, value in table.items():
            if isinstance(value, dict) or (isinstance(value, list) and not value):
                raise ConfigError(f"grid.{key}: must be a value or a non-empty list of values")
    return tuple(tables)


def parse_sweep(doc: Mapping[str, Any], *, where: str = "sweep file") -> SweepSpec:
    """A :class:`SweepSpec` from a parsed TOML document; ConfigError names the first bad key."""
    for key in doc:
        if key not in TABLES:
            raise ConfigError(f"{where}: unknown table {key!r} (expected {', '.join(TABLES)})")
    head = doc.get("sweep", {})
    for key in head:
        if key not in SWEEP_KEYS:
            raise ConfigError(f"sweep.{key}: unknown key (expected {', '.join(SWEEP_KEYS)})")
    base = doc.get("base", {})
    if not isinstance(base, dict) or any(isinstance(v, dict | list) for v in base.values()):
        raise ConfigError("base: must be a table of single run-config values (axes go in [grid])")
    seeds = head.get("seeds", [0])
    if not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool)
                                              for s in seeds):
        raise ConfigError(f"sweep.seeds: must be a list of integers, got {seeds!r}")
    for key in ("num-supernodes", "jobs", "workers"):
        if key in head and (not isinstance(head[key], int) or isinstance(head[key], bool)):
            raise ConfigError(f"sweep.{key}: must be an integer, got {head[key]!r}")
    return SweepSpec(name=str(head.get("name", "sweep")), num_supernodes=head.get("num-supernodes", 10),
                     seeds=tuple(seeds), jobs=head.get("jobs", 0), workers=head.get("workers", 1),
                     base=dict(base), grids=_grids(doc.get("grid")))


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and check a sweep file (TOML)."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"sweep file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"sweep file {path}: not valid TOML: {exc}") from None
    return parse_sweep(doc, where=str(path))


def _value(text: str) -> Any:
    """A command-line value as TOML reads it (``4``, ``0.5``, ``true``, ``"central"``); bare words
    are strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def sweep_from_options(spec: SweepSpec | None, *, sets: Sequence[str] = (), grid: Sequence[str] = (),
                       seeds: str = "", num_supernodes: int | None = None) -> SweepSpec:
    """``spec`` (or an empty sweep) with command-line changes: ``--set k=v`` into the base,
    ``--grid k=v1,v2`` as an axis of every grid table, ``--seeds 0,1,2``."""
    spec = spec or SweepSpec()
    base = dict(spec.base)
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set: expected key=value, got {item!r}")
        base[key.strip()] = _value(text.strip())
    axes: dict[str, Any] = {}
    for item in grid:
        key, sep, text = item.partition("=")
        if not sep or not key.strip() or not text.strip():
            raise ConfigError(f"--grid: expected key=v1,v2,..., got {item!r}")
        axes[key.strip()] = [_value(t.strip()) for t in text.split(",")]
    try:
        seed_list = tuple(int(s) for s in seeds.split(",")) if seeds.strip() else spec.seeds
    except ValueError:
        raise ConfigError(f"--seeds: expected integers joined by commas, got {seeds!r}") from None
    return SweepSpec(name=spec.name, num_supernodes=num_supernodes or spec.num_supernodes,
                     seeds=seed_list, jobs=spec.jobs, workers=spec.workers, base=base,
                     grids=tuple({**g, **axes} for g in spec.grids))
