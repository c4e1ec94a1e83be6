"""Byzantine clients for simulations: a seeded fraction of clients sends a corrupted update.

A spec ``attack:factor=F,fraction=P,seed=S`` (``byzantine`` run-config key in a simulation, or a
SuperNode's ``byzantine`` node config) makes the clients whose partition id hashes below ``P`` send,
instead of the update they would release:

* ``scale``: ``F·Δ``; ``sign-flip``: ``−F·Δ`` (Blanchard et al. 2017; Baruch et al. 2019);
* ``random``: a Gaussian vector of norm ``F·‖Δ‖``;
* ``backdoor`` (``target=T,trigger=patch|none``): it trains on poisoned data, its examples plus copies
  stamped with a 3×3 square of 1.0 in the bottom-right corner of every channel (images in [0, 1]),
  relabelled ``T`` (``trigger=none``: every example relabelled ``T``), and boosts its Δ by ``F``
  (default 1; model replacement, Bagdasaryan et al. 2020, "How to backdoor federated learning", §4).

The first three corrupt what the client would send (after its own clipping and noise), as a client
that does not follow the protocol would; ``backdoor`` corrupts what it trains, and its boosted Δ goes
through its normal clip and noise. The server measures the backdoor accuracy (:class:`BackdoorProbe`). The server re-clips in central mode and a secure round bounds
every input by its encoding, so a Byzantine client cannot move the sensitivity the ε is stated for: the
ε covers the honest clients. Which clients are Byzantine is the simulation's ground truth; the run
keeps it in its owner-only ``private/byzantine.json``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pathlib import Path

    from fedprivacy.config import RunConfig
    from fedprivacy.dp.rng import RandomSource

__all__ = ["ATTACKS", "NODE_KEY", "TRIGGERS", "BackdoorProbe", "ByzantineSpec", "byzantine_of", "note_byzantine",
           "stamp_trigger"]

ATTACKS = ("scale", "sign-flip", "random", "backdoor")
TRIGGERS = ("patch", "none")
PATCH = 3  # side of the trigger square, in pixels
_DEFAULT_FACTOR = {"backdoor": 1.0}  # no boost unless asked; the others' corruption factor is 10
NODE_KEY = "byzantine"  # the node config key (and run-config key a simulation launcher copies into it)


@dataclass(frozen=True, slots=True, kw_only=True)
class ByzantineSpec:
    """Which clients are Byzantine (a seeded fraction) and what they send."""

    attack: str
    factor: float = math.nan  # nan: the attack's default (10; backdoor: 1)
    fraction: float = 0.1
    seed: int = 0
    target: int = 0
    trigger: str = "patch"

    def __post_init__(self) -> None:
        if self.attack not in ATTACKS:
            raise ValueError(f"byzantine attack must be one of {', '.join(ATTACKS)}, got {self.attack!r}")
        if math.isnan(self.factor):
            object.__setattr__(self, "factor", _DEFAULT_FACTOR.get(self.attack, 10.0))
        if isinstance(self.target, bool) or not isinstance(self.target, int) or self.target < 0:
            raise ValueError(f"byzantine target must be an int >= 0, got {self.target!r}")
        if self.trigger not in TRIGGERS:
            raise ValueError(f"byzantine trigger must be one of {', '.join(TRIGGERS)}, got {self.trigger!r}")
        if self.attack != "backdoor" and (self.target != 0 or self.trigger != "patch"):
            raise ValueError(f"byzantine target= and trigger= are backdoor items, got attack {self.attack!r}")
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise ValueError(f"byzantine factor must be > 0, got {self.factor}")
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"byzantine fraction must be in [0, 1], got {self.fraction}")

    @classmethod
    def parse(cls, spec: str) -> ByzantineSpec | None:
        """``"sign-flip:factor=10,fraction=0.1,seed=0"`` (``""``: no Byzantine client); ValueError
        naming the ``byzantine`` key otherwise."""
        spec = spec.strip()
        if not spec:
            return None
        attack, _, rest = spec.partition(":")
        kwargs: dict[str, Any] = {"attack": attack.strip()}
        for item in (i.strip() for i in rest.split(",") if i.strip()):
            key, sep, value = (part.strip() for part in item.partition("="))
            if not sep or key not in _ITEMS:
                raise ValueError(f"byzantine: expected factor=, fraction=, seed=, target= or trigger= items, "
                                 f"got {item!r} in {spec!r}")
            try:
                kwargs[key] = _ITEMS[key](value)
            except ValueError:
                raise ValueError(f"byzantine: {key} must be a number, got {value!r}") from None
            if key == "factor" and math.isnan(kwargs[key]):
                raise ValueError(f"byzantine: factor must be > 0, got {value!r}")
        try:
            return cls(**kwargs)
        except ValueError as exc:
            raise ValueError(f"byzantine: {exc}") from None

    @classmethod
    def of_node(cls, node_config: Mapping[str, Any]) -> ByzantineSpec | None:
        """The node's own spec (its operator's node config), or None."""
        return cls.parse(str(node_config.get(NODE_KEY, "")))

    def is_byzantine(self, partition_id: int) -> bool:
        digest = hashlib.sha256(f"fedprivacy/byzantine/v1|{self.seed}|{int(partition_id)}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2.0**64 < self.fraction

    def members(self, population: int) -> list[int]:
        """The Byzantine partition ids of a population (the simulation's ground truth)."""
        return [p for p in range(population) if self.is_byzantine(p)]

    @property
    def trains_poisoned(self) -> bool:
        """Whether the corruption is in what the client trains (then boosted, clipped and noised)."""
        return self.attack == "backdoor"

    def check_data(self, *, feature_shape: Sequence[int], num_classes: int) -> None:
        """ConfigError naming the ``byzantine`` key where the backdoor is not defined for the data."""
        from fedprivacy.errors import ConfigError

        if self.attack != "backdoor":
            return
        if self.target >= num_classes:
            raise ConfigError(f"byzantine: target must be a class of the data set (< {num_classes}), got {self.target}")
        if self.trigger == "patch" and (len(feature_shape) != 3 or min(feature_shape[1:]) < PATCH):
            raise ConfigError(f"byzantine: trigger=patch needs images (C, H, W) of at least {PATCH}x{PATCH} pixels, "
                             f"got examples of shape {tuple(feature_shape)}; use trigger=none")

    def poison(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A backdoor client's training data: ``(x, y)`` plus the stamped copies of its examples not
        labelled ``target``, labelled ``target`` (``trigger=none``: ``x`` with every label ``target``)."""
        self.check_data(feature_shape=x.shape[1:], num_classes=self.target + 1)
        if self.trigger == "none":
            return x, np.full_like(y, self.target)
        keep = y != self.target
        stamped = stamp_trigger(x[keep])
        return (np.concatenate([x, stamped]).astype(x.dtype, copy=False),
                np.concatenate([y, np.full(len(stamped), self.target, dtype=y.dtype)]))

    def corrupt(self, released: Sequence[np.ndarray], rng: RandomSource) -> list[np.ndarray]:
        """What a Byzantine client sends instead of ``released``."""
        arrays = [np.asarray(a, dtype=np.float64) for a in released]
        if self.attack == "scale":
            return [self.factor * a for a in arrays]
        if self.attack == "sign-flip":
            return [-self.factor * a for a in arrays]
        if self.attack == "backdoor":  # its corruption is in what it trained; its Δ is boosted before the clip
            return arrays
        norm = math.sqrt(sum(float(np.sum(a * a)) for a in arrays))
        noise = [np.asarray(rng.normal(std=1.0, size=a.shape), dtype=np.float64).reshape(a.shape) for a in arrays]
        scale = self.factor * norm / max(math.sqrt(sum(float(np.sum(z * z)) for z in noise)), 1e-300)
        return [scale * z for z in noise]


_ITEMS: dict[str, Callable[[str], Any]] = {"factor": float, "fraction": float, "seed": int, "target": int,
                                           "trigger": str}


def stamp_trigger(x: np.ndarray) -> np.ndarray:
    """A copy of images ``(N, C, H, W)`` with the trigger: a ``PATCH``×``PATCH`` square set to 1.0 (the
    maximum of the [0, 1] pixel scale) in the bottom-right corner of every channel."""
    out = np.array(x, copy=True)
    out[..., -PATCH:, -PATCH:] = 1.0
    return out


def byzantine_of(context: Any, environ: Mapping[str, str] | None = None) -> ByzantineSpec | None:
    """A client's own Byzantine spec: its node config's ``byzantine``, else the same key in the
    simulation launcher's ``FEDPRIVACY_CLIENT_POLICY`` JSON (a Flower simulation fixes the node config),
    else None. Never from the server's messages."""
    import os

    from fedprivacy.fl.client_policy import ENV_VAR

    raw = str(context.node_config.get(NODE_KEY, ""))
    env = (os.environ if environ is None else environ).get(ENV_VAR, "")
    if not raw and env:
        try:
            raw = str(json.loads(env).get(NODE_KEY, ""))
        except (ValueError, AttributeError):
            raw = ""  # ClientPolicy.resolve refuses a malformed variable with its own message
    return ByzantineSpec.parse(raw)


def note_byzantine(cfg: RunConfig, *, population: int, run_dir: Path | None, log: Callable[[str], None]
                   ) -> BackdoorProbe | None:
    """A simulation's Byzantine clients (its ground truth) in the run's owner-only ``private/byzantine.json``;
    for ``backdoor``, the data check (ValueError naming the key, before round 1) and the probe."""
    from fedprivacy.fl.run_files import private_dir, write_private

    spec = ByzantineSpec.parse(cfg.byzantine)
    if spec is None:
        return None
    probe = BackdoorProbe(cfg, spec, population=population, run_dir=run_dir) if spec.trains_poisoned else None
    if run_dir is None:
        return probe
    members = spec.members(population)
    record: dict[str, Any] = {"spec": cfg.byzantine, "partitions": members}
    earlier = private_dir(run_dir) / "byzantine.json"
    if probe is not None and earlier.exists():  # a resumed run keeps the rounds it measured
        old = json.loads(earlier.read_text(encoding="utf-8"))
        if old.get("spec") == cfg.byzantine:
            record["backdoor_accuracy"] = old.get("backdoor_accuracy", [])
    write_private(run_dir, "byzantine.json", record)
    log(f"byzantine: {len(members)} of {population} simulated clients send {spec.attack} updates "
        f"(x{spec.factor:g}); which ones: {run_dir}/private/byzantine.json; ε covers the honest ones")
    return probe


class BackdoorProbe:
    """The backdoor accuracy of the global model: the fraction of the server's test examples whose label
    is not ``target``, stamped with the trigger (``trigger=none``: as they are), classified ``target``.
    Kept per evaluated round in the owner-only ``private/byzantine.json`` beside the ground truth: it is
    post-processing of the released model on the server's own test set, no client data."""

    def __init__(self, cfg: RunConfig, spec: ByzantineSpec, *, population: int, run_dir: Path | None) -> None:
        from fedprivacy.fl import task
        from fedprivacy.ml.data import Split

        test = task.test_set(cfg, num_partitions=population)
        spec.check_data(feature_shape=test.feature_shape, num_classes=test.num_classes)
        keep = test.y != spec.target
        x = stamp_trigger(test.x[keep]) if spec.trigger == "patch" else np.array(test.x[keep])
        self.split = Split(x=x, y=np.full(int(keep.sum()), spec.target, dtype=np.int64), num_classes=test.num_classes)
        self.cfg, self.run_dir = cfg, run_dir

    def observe(self, rnd: int, weights: Sequence[np.ndarray]) -> float:
        """Measure the model after round ``rnd`` and record it (an earlier record of ``rnd`` or later,
        from a run that resumed, is replaced)."""
        from fedprivacy.fl import task
        from fedprivacy.fl.run_files import private_dir, write_private

        _loss, rate = task.evaluate_weights(self.cfg, weights, self.split, num_classes=self.split.num_classes)
        if self.run_dir is not None:
            path = private_dir(self.run_dir) / "byzantine.json"
            record = json.loads(path.read_text(encoding="utf-8"))
            rows = [r for r in record.get("backdoor_accuracy", []) if int(r["round"]) < rnd]
            record["backdoor_accuracy"] = [*rows, {"round": rnd, "value": float(rate)}]
            write_private(self.run_dir, "byzantine.json", record)
        return float(rate)
