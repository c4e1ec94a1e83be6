"""One benchmark configuration and the record a run of it produces.

A ``BenchSpec`` fixes everything that must be equal between the rows that are compared: data set,
population, cohort, model width, local training and the DP parameters. The runners
(``fedprivacy_bench.torch_loop``, ``fedprivacy_bench.flower_baselines``, ``fedprivacy_bench.fedprivacy_runner``) all
take a spec and return a ``RunRecord`` as a plain dict, so that the worker process can ship it as
JSON.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedprivacy.config import default
from fedprivacy_bench import heldout as _heldout  # noqa: F401  (registers "fashion-mnist-holdout")

FRAMEWORKS = ("fedprivacy", "flower", "torch")
# fedprivacy modes (DESIGN.md) plus "dpsgd" (sample-level DP-SGD on each client, no user-level noise)
# and Flower's own combinations.
MODES = ("none", "central", "local", "distributed", "dpsgd", "secagg+central")
ENGINES = ("inprocess", "ray", "loop")


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchSpec:
    """One configuration of the sweep.

    Attributes:
        dataset: "digits" or "synthetic".
        framework: "fedprivacy", "flower" or "torch" (the single-process reference loop).
        mode: privacy mode, see ``MODES``.
        engine: "inprocess" (fedprivacy's engine), "ray" (Flower's simulation engine) or "loop".
        num_clients: population size N.
        clients_per_round: expected cohort qN (Poisson in fedprivacy, fixed in Flower's FedAvg).
        rounds: server rounds to run.
        hidden: width of the model (``hidden-units``: the MLP's hidden layer, the convnet's channels).
        model: a registered fedprivacy model (``"mlp"``, ``"convnet"``, ...).
        partitioner: ``"iid"`` or ``"dirichlet"`` (``dirichlet_alpha``; every client gets at least
            ``min_partition_size`` examples).
        lr, local_epochs, batch_size: local SGD.
        clip_norm: L2 clip C of each client's update (user-level DP).
        noise_multiplier: sigma; the noise std on the sum is sigma * C.
        target_epsilon: if set, the sweep resolved ``noise_multiplier`` from it (for the record).
        delta: delta at which epsilon is reported.
        seed: seed for data, partitions, model init and sampling (seeded research mode).
        workers: processes for fedprivacy's in-process engine.
        eval_every: fedprivacy rows evaluate the global model every k rounds and after the last
            (run-config ``eval-every``); the final accuracy is the same, the curve is sparser.
        server_optimizer, server_learning_rate, server_momentum, server_beta_1, server_beta_2,
            server_tau: fedprivacy rows' server step on the released mean update (the run-config
            keys of the same names; post-processing, no privacy cost). ``server_learning_rate`` 0
            is the optimizer's default.
        label: free text shown in the table (e.g. "100k params").

    Defaults: the fields a run config also has take its defaults (``fedprivacy.config.default``):
    model, partitioner, dirichlet_alpha, min_partition_size, batch_size, delta (``target-delta``).
    The benchmark's own settings differ on purpose and are written here: ``lr`` 0.1 and
    ``local_epochs`` 1 (the same local step in every compared framework), ``clip_norm`` 1.0 and
    ``noise_multiplier`` 0 (the sweep sets sigma from its epsilon target), ``seed`` 0 (rows are
    reproducible: seeded research mode).
    """

    dataset: str
    framework: str
    mode: str
    engine: str
    num_clients: int
    clients_per_round: int
    rounds: int
    hidden: int
    model: str = default("model")
    partitioner: str = default("partitioner")
    dirichlet_alpha: float = default("dirichlet_alpha")
    min_partition_size: int = default("min_partition_size")
    lr: float = 0.1
    local_epochs: int = 1
    batch_size: int = default("batch_size")
    clip_norm: float = 1.0
    noise_multiplier: float = 0.0
    target_epsilon: float | None = None
    delta: float = default("target_delta")
    seed: int = 0
    workers: int = 1
    eval_every: int = 1
    server_optimizer: str = default("server_optimizer")
    server_learning_rate: float = default("server_learning_rate")
    server_momentum: float = default("server_momentum")
    server_beta_1: float = default("server_beta_1")
    server_beta_2: float = default("server_beta_2")
    server_tau: float = default("server_tau")
    label: str = ""
    extra: tuple[tuple[str, Any], ...] = field(default=())

    def __post_init__(self) -> None:
        from fedprivacy.ml.data import dataset_entry  # the registry; no torch

        dataset_entry(self.dataset)  # ValueError naming the registered data sets
        if self.framework not in FRAMEWORKS:
            raise ValueError(f"framework must be one of {FRAMEWORKS}, got {self.framework!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        for name in ("num_clients", "clients_per_round", "rounds", "hidden", "local_epochs",
                     "batch_size", "workers", "eval_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.clients_per_round > self.num_clients:
            raise ValueError(
                f"clients_per_round must be <= num_clients, got {self.clients_per_round} > "
                f"{self.num_clients}"
            )
        if self.server_learning_rate < 0:
            raise ValueError(f"server_learning_rate must be >= 0, got {self.server_learning_rate}")
        if self.noise_multiplier < 0:
            raise ValueError(f"noise_multiplier must be >= 0, got {self.noise_multiplier}")
        if self.clip_norm <= 0:
            raise ValueError(f"clip_norm must be > 0, got {self.clip_norm}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")

    @property
    def sample_rate(self) -> float:
        return self.clients_per_round / self.num_clients

    @property
    def is_private(self) -> bool:
        return self.mode != "none"

    def option(self, key: str, default: Any = None) -> Any:
        """Look up a free-form option from ``extra``."""
        return dict(self.extra).get(key, default)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["extra"] = [list(kv) for kv in self.extra]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BenchSpec:
        kw = dict(d)
        kw["extra"] = tuple((str(k), v) for k, v in kw.get("extra", ()))
        return cls(**kw)

    def key(self) -> str:
        """A short identifier for logs and file names."""
        tag = f"{self.dataset}-{self.framework}-{self.engine}-{self.mode}-h{self.hidden}"
        if self.model != "mlp":
            tag += f"-{self.model}"
        if self.partitioner != "iid":
            tag += f"-{self.partitioner}{self.dirichlet_alpha:g}-n{self.num_clients}"
        if self.server_optimizer != "fedavg":
            tag += f"-{self.server_optimizer}"
        if self.option("flower_clipping"):
            tag += f"-{self.option('flower_clipping')}clip"
        if self.seed:
            tag += f"-s{self.seed}"
        if self.target_epsilon is not None:
            tag += f"-eps{self.target_epsilon:g}"
        return f"{tag}-r{self.rounds}"


def steady_state_seconds(round_seconds: Sequence[float], *, warmup: int = 1) -> float | None:
    """Median seconds of a round after the first ``warmup`` rounds (start-up, JIT, actor spawn).

    With fewer than ``warmup + 1`` rounds the median of all rounds is returned; ``None`` if empty.
    """
    values = [float(s) for s in round_seconds]
    if not values:
        return None
    steady = values[warmup:] if len(values) > warmup else values
    return float(statistics.median(steady))


def count_parameters(*, input_dim: int, hidden: int, num_classes: int) -> int:
    """Parameters of the benchmark MLP: Linear(in, h) -> ReLU -> Linear(h, classes)."""
    return input_dim * hidden + hidden + hidden * num_classes + num_classes


def make_record(spec: BenchSpec, **values: Any) -> dict[str, Any]:
    """The JSON record a runner returns for ``spec``; missing figures are ``None``."""
    record: dict[str, Any] = {
        "dataset": spec.dataset,
        "mode": spec.mode,
        "framework": spec.framework,
        "engine": spec.engine,
        "label": spec.label,
        "num_clients": spec.num_clients,
        "clients_per_round": spec.clients_per_round,
        "sample_rate": spec.sample_rate,
        "model": spec.model,
        "partitioner": spec.partitioner,
        "seed": spec.seed,
        "hidden": spec.hidden,
        "params": None,
        "noise_multiplier": spec.noise_multiplier if spec.is_private else 0.0,
        "clip_norm": spec.clip_norm,
        "target_epsilon": spec.target_epsilon,
        "delta": spec.delta,
        "epsilon": None,
        "epsilon_note": "",
        "test_accuracy": None,
        "rounds": 0,
        "seconds_per_round": None,
        "round_seconds": [],
        "accuracy_by_round": [],
        "epsilon_by_round": [],
        "startup_seconds": None,
        "wall_seconds": None,
        "peak_memory_mb": None,
        "status": "ok",
        "note": "",
        "spec": spec.to_dict(),
    }
    record.update(values)
    if record["seconds_per_round"] is None and record["round_seconds"]:
        record["seconds_per_round"] = steady_state_seconds(record["round_seconds"])
    return record


@dataclass(frozen=True, slots=True, kw_only=True)
class FashionSetup:
    """A named, reproducible recipe (``--setup NAME``): everything but mode, ε and seed.

    Attributes:
        name: the ``--setup`` name.
        summary: one line for the page (what the recipe is).
        rounds: T, the server rounds (σ is calibrated for them).
        training: ``BenchSpec`` fields of every row (data, population, cohort, model, local and
            server optimisation, clip, δ, evaluation).
        label: the rows' setup label (default ``fashion iid NAME``: the Fashion-MNIST curves).
        data: where the data comes from, for the page.
    """

    name: str
    summary: str
    rounds: int
    training: Mapping[str, Any]
    label: str = ""
    data: str = ("Fashion-MNIST from Debian's `dataset-fashion-mnist` (the official 60,000 training "
                 "images split over the clients, the official 10,000 test images as the server's test "
                 "set)")

    def spec(self, *, mode: str, seed: int, sigma: Callable[[float, float, int, str], float],
             rounds: int | None = None, target_epsilon: float | None = None) -> BenchSpec:
        """One row: ``mode`` none / central / distributed (σ of central at ``target_epsilon``) / local
        (σ calibrated without amplification: every client in every round, the worst case).

        ``sigma(target_epsilon, sample_rate, rounds, neighbouring)`` is the calibration (the
        benchmark's: PLD, Poisson, δ of the setup; ``replace-one`` for local rows, as fedprivacy
        accounts them).
        """
        t = rounds or self.rounds
        fields = dict(self.training, rounds=t, label=self.label or f"fashion iid {self.name}", seed=seed)
        fields["eval_every"] = min(int(fields.get("eval_every", 1)), t)
        if mode != "none":
            if target_epsilon is None:
                raise ValueError(f"target_epsilon is required for mode {mode!r}")
            q = 1.0 if mode == "local" else fields["clients_per_round"] / fields["num_clients"]
            # fedprivacy accounts local DP under replace-one (fl.privacy.neighbouring_of)
            fields["noise_multiplier"] = sigma(target_epsilon, q, t,
                                               "replace-one" if mode == "local" else "add-remove")
            fields["target_epsilon"] = target_epsilon
        return BenchSpec(framework="fedprivacy", engine="inprocess", mode=mode, **fields)
