"""Byzantine clients for simulations: a seeded fraction of clients sends a corrupted update.

A spec ``attack:factor=F,fraction=P,seed=S`` (``byzantine`` run-config key in a simulation, or a
SuperNode's ``byzantine`` node config) makes the clients whose partition id hashes below ``P`` send,
instead of the update they would release:

* ``scale``: ``F·Δ``; ``sign-flip``: ``−F·Δ`` (Blanchard et al. 2017; Baruch et al. 2019);
* ``random``: a Gaussian vector of norm ``F·‖Δ‖``.

The corruption is applied to what the client would send (after its own clipping and noise), as a client
that does not follow the protocol would. The server re-clips in central mode and a secure round bounds
every input by its encoding, so a Byzantine client cannot move the sensitivity the ε is stated for: the
ε covers the honest clients. Which clients are Byzantine is the simulation's ground truth; the run
keeps it in its owner-only ``private/byzantine.json``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from fedprivacy.config import RunConfig
    from fedprivacy.dp.rng import RandomSource

__all__ = ["ATTACKS", "NODE_KEY", "ByzantineSpec", "byzantine_of", "note_byzantine"]

ATTACKS = ("scale", "sign-flip", "random")
NODE_KEY = "byzantine"  # the node config key (and run-config key a simulation launcher copies into it)


@dataclass(frozen=True, slots=True, kw_only=True)
class ByzantineSpec:
    """Which clients are Byzantine (a seeded fraction) and what they send."""

    attack: str
    factor: float = 10.0
    fraction: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.attack not in ATTACKS:
            raise ValueError(f"byzantine attack must be one of {', '.join(ATTACKS)}, got {self.attack!r}")
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
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in ("factor", "fraction", "seed"):
                raise ValueError(f"byzantine: expected factor=, fraction= or seed= items, got {item!r} in {spec!r}")
            try:
                kwargs[key.strip()] = int(value) if key.strip() == "seed" else float(value)
            except ValueError:
                raise ValueError(f"byzantine: {key.strip()} must be a number, got {value!r}") from None
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

    def corrupt(self, released: Sequence[np.ndarray], rng: RandomSource) -> list[np.ndarray]:
        """What a Byzantine client sends instead of ``released``."""
        arrays = [np.asarray(a, dtype=np.float64) for a in released]
        if self.attack == "scale":
            return [self.factor * a for a in arrays]
        if self.attack == "sign-flip":
            return [-self.factor * a for a in arrays]
        norm = math.sqrt(sum(float(np.sum(a * a)) for a in arrays))
        noise = [np.asarray(rng.normal(std=1.0, size=a.shape), dtype=np.float64).reshape(a.shape) for a in arrays]
        scale = self.factor * norm / max(math.sqrt(sum(float(np.sum(z * z)) for z in noise)), 1e-300)
        return [scale * z for z in noise]


def byzantine_of(context: Any, environ: Mapping[str, str] | None = None) -> ByzantineSpec | None:
    """A client's own Byzantine spec: its node config's ``byzantine``, else the same key in the
    simulation launcher's ``FEDPRIVACY_CLIENT_POLICY`` JSON (a Flower simulation fixes the node config),
    else None. Never from the server's messages."""
    import json
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


def note_byzantine(cfg: RunConfig, *, population: int, run_dir: Path | None, log: Callable[[str], None]) -> None:
    """A simulation's Byzantine clients (its ground truth) in the run's owner-only ``private/byzantine.json``."""
    from fedprivacy.fl.run_files import write_private

    spec = ByzantineSpec.parse(cfg.byzantine)
    if spec is None or run_dir is None:
        return
    members = spec.members(population)
    write_private(run_dir, "byzantine.json", {"spec": cfg.byzantine, "partitions": members})
    log(f"byzantine: {len(members)} of {population} simulated clients send {spec.attack} updates "
        f"(x{spec.factor:g}); which ones: {run_dir}/private/byzantine.json; ε covers the honest ones")
