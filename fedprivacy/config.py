"""One typed, validated run configuration for a fedprivacy run.

Every run-config key lives in ``pyproject.toml [tool.flwr.app.config]`` in kebab-case; this module maps
them once, in one place, to the literature's snake_case names (STYLE.md, convention 4) and checks every
value before round 1. An unknown key or a bad value raises ``ValueError`` naming the kebab-case key, so a
bad ``--run-config`` stops the run before any training.

Decisions recorded here (see README "Configuration"):

* ``target-epsilon = 0`` means "no budget". With ``target-epsilon > 0`` and ``noise-multiplier = 0`` the
  server *calibrates* the smallest noise multiplier that keeps ``num-server-rounds`` rounds within
  ``(target-epsilon, target-delta)``; with both set, the budget is enforced and the run stops cleanly
  before the round that would overspend.
* ``seed = -1`` draws all randomness from a secure source (deployment mode); ``seed >= 0`` is a seeded,
  reproducible research mode that is *not* private against anyone who knows the seed, and every output
  says so.
* A fixed-size cohort (``sampling = "fixed"``) is sampling without replacement; it is only accounted under
  replace-one adjacency (``neighbouring = "replace-one"``), so ``fixed`` with ``add-remove`` is refused.
* ``privacy = "none"`` still clips updates to ``clip-norm`` (the modes share one code path and differ only
  in where the noise is added); ``clip-norm = 0`` disables clipping and is only allowed without DP.

The keys fall into typed frozen sections (:class:`DataConfig`, :class:`ModelConfig`, :class:`TrainConfig`,
:class:`PrivacyConfig`, :class:`ServerOptConfig`, :class:`SecAggConfig`, :class:`RunOptions`), each holding
its keys' defaults and per-key checks; :class:`RunConfig` is the flat view every run reads
(``cfg.clip_norm``), builds every section when it is created and then checks the rules that span keys.
Every default is written once; ``pyproject.toml`` equals the library's defaults except for
:data:`APP_DEFAULTS`. Rationale: docs/DESIGN.md, section "The run config (`fedprivacy/config.py`)".
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from fedprivacy.errors import ConfigError

# the data layer owns the data defaults (numpy only at import time)
from fedprivacy.ml.datasets.fashion_mnist import FashionMnistOptions
from fedprivacy.ml.datasets.synthetic import SyntheticOptions
from fedprivacy.ml.partition import PARTITIONERS, DataSpec

if TYPE_CHECKING:
    from fedprivacy.fl.modes.base import PrivacyMode

SAMPLINGS = ("poisson", "fixed")
NEIGHBOURINGS = ("add-remove", "replace-one")
DPFTRL_FACTORIZATIONS = ("bsr", "blt")
PRIVACY_AUDIENCES = ("server", "observers")
BATCHED_TRAINING = ("off", "auto", "on")  # off: per client; auto: models marked batched; on: any batchable
DEVICES = ("auto", "cpu", "cuda", "mps")  # auto: cuda, else mps, when this torch has one; else cpu

# The Flower app's defaults that differ from the library's, and why (the one place; pyproject.toml holds
# the same values and tests/test_config.py pins both). The app runs secure aggregation with distributed
# DP; the library keeps central DP without SecAgg, so transport-free loops
# (``fedprivacy.fl.run_federated``, notebooks, the attacks' targets) need no secure channel.
APP_DEFAULTS: Mapping[str, Any] = MappingProxyType({"privacy": "distributed", "secagg": True})


def unknown_key_message(key: str, known: Sequence[str]) -> str:
    """``unknown run-config key 'x' (did you mean 'y'?); valid keys: ...`` (one line)."""
    close = difflib.get_close_matches(str(key), list(known), n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    return f"unknown run-config key {key!r}{hint}; valid keys: {', '.join(sorted(known))}"


def _key(field_name: str) -> str:
    return field_name.replace("_", "-")


def _default(cls: type, name: str) -> Any:
    """The default of field ``name`` of dataclass ``cls`` (the one place that value is written)."""
    value = cls.__dataclass_fields__[name].default  # type: ignore[attr-defined]
    if value is dataclasses.MISSING:
        raise TypeError(f"{cls.__name__}.{name} has no default")
    return value


def _check_fields(section: Any) -> None:
    for f in dataclasses.fields(section):
        _check_type(_key(f.name), getattr(section, f.name), f.type)


# ---------------------------------------------------------------------- the typed sections
@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Data set, train/test split and partitioner (defaults: the data layer's ``DataSpec`` and options)."""

    dataset: str = _default(DataSpec, "dataset")
    partitioner: str = _default(DataSpec, "partitioner")
    dirichlet_alpha: float = _default(DataSpec, "dirichlet_alpha")
    classes_per_partition: int = _default(DataSpec, "classes_per_partition")
    min_partition_size: int = _default(DataSpec, "min_partition_size")
    data_dir: str = _default(FashionMnistOptions, "data_dir")
    synthetic_alpha: float = _default(SyntheticOptions, "alpha")
    synthetic_beta: float = _default(SyntheticOptions, "beta")
    test_fraction: float = _default(DataSpec, "test_fraction")

    def __post_init__(self) -> None:
        from fedprivacy.ml.data import dataset_entry  # the registry (numpy only at import time)

        _check_fields(self)
        dataset_entry(self.dataset)  # ValueError naming `dataset` and the registered data sets
        _choice("partitioner", self.partitioner, PARTITIONERS)
        _positive("dirichlet-alpha", self.dirichlet_alpha)
        _positive_int("classes-per-partition", self.classes_per_partition)
        _positive_int("min-partition-size", self.min_partition_size)
        _non_negative("synthetic-alpha", self.synthetic_alpha)
        _non_negative("synthetic-beta", self.synthetic_beta)
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test-fraction must be in (0, 1), got {self.test_fraction}")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The model, from the model registry (:func:`fedprivacy.ml.models.register_model`)."""

    model: str = "mlp"
    hidden_units: int = 32

    def __post_init__(self) -> None:
        from fedprivacy.ml.models import model_entry

        _check_fields(self)
        model_entry(self.model)  # ValueError naming `model` and the registered models
        _positive_int("hidden-units", self.hidden_units)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Each client's local training, and sample-level DP-SGD on it (``dpsgd``)."""

    local_epochs: int = 2
    learning_rate: float = 0.3
    batch_size: int = 32
    dpsgd: bool = False
    dpsgd_noise_multiplier: float = 1.0
    dpsgd_max_grad_norm: float = 1.0
    batched_training: str = "auto"
    device: str = "cpu"
    proximal_mu: float = 0.0  # FedProx's μ (Li et al. 2020); 0 = FedAvg's local SGD
    scaffold: bool = False  # SCAFFOLD's control variates (Karimireddy et al. 2020): fedprivacy.fl.scaffold

    def __post_init__(self) -> None:
        _check_fields(self)
        _positive_int("local-epochs", self.local_epochs)
        _non_negative("proximal-mu", self.proximal_mu)
        if self.proximal_mu > 0 and self.dpsgd:
            raise ValueError("proximal-mu > 0 with dpsgd=true is not implemented (Opacus would clip the proximal "
                             "term with each example's gradient); set proximal-mu=0 or dpsgd=false")
        _choice("batched-training", self.batched_training, BATCHED_TRAINING)
        _choice("device", self.device, DEVICES)
        if self.device in ("cuda", "mps"):
            from fedprivacy.ml.batched import device_available

            if not device_available(self.device):
                raise ValueError(f"device must be 'cpu' or 'auto' here: this torch has no {self.device} "
                                 f"device, got {self.device!r}")
        _positive("learning-rate", self.learning_rate)
        _positive_int("batch-size", self.batch_size)
        _positive("dpsgd-noise-multiplier", self.dpsgd_noise_multiplier)
        _positive("dpsgd-max-grad-norm", self.dpsgd_max_grad_norm)


@dataclass(frozen=True, kw_only=True)
class PrivacyConfig:
    """User-level DP (DP-FedAvg): the privacy mode, clipping, noise, budget, sampling and accounting.

    Also the adaptive clip norm (Andrew et al. 2021), which replaces the fixed ``clip_norm`` after
    round 1. ``privacy`` is checked against the privacy-mode registry, ``accountant`` against the
    accounting backends.
    """

    privacy: str = "central"
    clip_norm: float = 0.5
    noise_multiplier: float = 1.0
    target_epsilon: float = 0.0
    target_delta: float = 1e-5
    sampling: str = "poisson"
    sample_rate: float = 1.0
    cohort_size: int = 0
    neighbouring: str = "add-remove"
    accountant: str = "pld"
    privacy_audience: str = "server"
    adaptive_clip: bool = False
    adaptive_clip_quantile: float = 0.5
    adaptive_clip_learning_rate: float = 0.2
    adaptive_clip_count_std: float = 0.0
    dpftrl_factorization: str = "bsr"
    dpftrl_band: int = 1
    dpftrl_groups: int = 1
    dpftrl_buffers: int = 1  # checked by the dpftrl mode

    def __post_init__(self) -> None:
        from fedprivacy.accounting.backends import BACKENDS
        from fedprivacy.fl.modes import mode_names  # the one registry of privacy modes

        _check_fields(self)
        _choice("privacy", self.privacy, mode_names())
        _non_negative("clip-norm", self.clip_norm)
        _non_negative("noise-multiplier", self.noise_multiplier)
        _non_negative("target-epsilon", self.target_epsilon)
        if not 0.0 < self.target_delta < 1.0:
            raise ValueError(f"target-delta must be in (0, 1), got {self.target_delta}")
        _choice("sampling", self.sampling, SAMPLINGS)
        if not 0.0 < self.sample_rate <= 1.0:
            raise ValueError(f"sample-rate must be in (0, 1], got {self.sample_rate}")
        if self.cohort_size < 0:
            raise ValueError(f"cohort-size must be >= 0, got {self.cohort_size}")
        _choice("neighbouring", self.neighbouring, NEIGHBOURINGS)
        _choice("accountant", self.accountant, tuple(BACKENDS))
        _choice("privacy-audience", self.privacy_audience, PRIVACY_AUDIENCES)
        if not 0.0 < self.adaptive_clip_quantile < 1.0:
            raise ValueError(f"adaptive-clip-quantile must be in (0, 1), got {self.adaptive_clip_quantile}")
        _positive("adaptive-clip-learning-rate", self.adaptive_clip_learning_rate)
        _non_negative("adaptive-clip-count-std", self.adaptive_clip_count_std)
        _choice("dpftrl-factorization", self.dpftrl_factorization, DPFTRL_FACTORIZATIONS)
        _positive_int("dpftrl-band", self.dpftrl_band)
        _positive_int("dpftrl-groups", self.dpftrl_groups)


@dataclass(frozen=True, kw_only=True)
class ServerOptConfig:
    """The server's aggregation rule on the clipped updates (its noise scales with the rule's
    sensitivity: :mod:`fedprivacy.fl.robust`) and its optimizer on the released mean update
    (post-processing: no privacy cost)."""

    aggregation: str = "plain"
    aggregation_trim: int = 0
    krum_byzantine: int = 0
    krum_select: int = 1
    qffl_q: float = 0.1  # q-FedAvg's fairness exponent (Flower's default)
    server_optimizer: str = "fedavg"
    server_learning_rate: float = 0.0
    server_momentum: float = 0.9
    server_beta_1: float = 0.9
    server_beta_2: float = 0.99
    server_tau: float = 0.001

    def __post_init__(self) -> None:
        from fedprivacy.fl.robust import AGGREGATORS, check_rule_keys
        from fedprivacy.fl.server_opt import SERVER_OPTIMIZER_KEYS, SERVER_OPTIMIZERS

        _check_fields(self)
        _choice("aggregation", self.aggregation, tuple(AGGREGATORS))
        check_rule_keys(self)
        _choice("server-optimizer", self.server_optimizer, tuple(SERVER_OPTIMIZERS))
        _non_negative("server-learning-rate", self.server_learning_rate)
        for key, rate in (("server-momentum", self.server_momentum),
                           ("server-beta-1", self.server_beta_1),
                           ("server-beta-2", self.server_beta_2)):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"{key} must be in [0, 1), got {rate}")
        _positive("server-tau", self.server_tau)
        reads = SERVER_OPTIMIZER_KEYS.get(self.server_optimizer, frozenset())
        for f in dataclasses.fields(ServerOptConfig):
            key = _key(f.name)
            if (key.startswith("server-") and key != "server-optimizer" and key not in reads
                    and getattr(self, f.name) != f.default):
                raise ValueError(f"{key} is not read by server-optimizer={self.server_optimizer!r} (it reads "
                                 f"{', '.join(sorted(reads)) or 'none'}); leave {key} at {f.default} or choose "
                                 "an optimizer that reads it")


@dataclass(frozen=True, kw_only=True)
class SecAggConfig:
    """Secure aggregation (0 = automatic threshold and neighbour count)."""

    secagg: bool = False
    secagg_threshold: int = 0
    secagg_neighbours: int = 0
    secagg_bits: int = 20
    secagg_colluders: int = 0
    secagg_schedule: str = "active"

    def __post_init__(self) -> None:
        _check_fields(self)
        if self.secagg_threshold < 0:
            raise ValueError(f"secagg-threshold must be >= 0 (0 = automatic), got {self.secagg_threshold}")
        if self.secagg_neighbours < 0:
            raise ValueError(
                f"secagg-neighbours must be >= 0 (0 = automatic), got {self.secagg_neighbours}"
            )
        if not 16 <= self.secagg_bits <= 32:
            raise ValueError(f"secagg-bits must be in [16, 32], got {self.secagg_bits}")
        if self.secagg_colluders < 0:
            raise ValueError(f"secagg-colluders must be >= 0, got {self.secagg_colluders}")
        if self.secagg_schedule not in ("active", "semi-honest"):
            raise ValueError(f"secagg-schedule must be 'active' or 'semi-honest', got {self.secagg_schedule!r}")


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Rounds, randomness mode and where the run's outputs go."""

    num_server_rounds: int = 20
    seed: int = -1
    output_dir: str = "runs"
    run_name: str = ""
    resume: bool = False
    client_timeout: float = 120.0
    max_failed_fraction: float = 0.5
    # per-round participation counts in the published outputs of central mode
    publish_participation: bool = False
    eval_every: int = 1
    # a simulation's Byzantine clients (fedprivacy.fl.byzantine); the launchers give it to the clients
    byzantine: str = ""
    # experiment tracking of what the run publishes (fedprivacy.fl.tracking): "" | tensorboard | mlflow
    tracking: str = ""
    tracking_dir: str = ""
    tracking_uri: str = ""
    tracking_experiment: str = ""
    tracking_run_name: str = ""

    def __post_init__(self) -> None:
        from fedprivacy.fl.byzantine import ByzantineSpec
        from fedprivacy.fl.tracking import check_tracking

        _check_fields(self)
        ByzantineSpec.parse(self.byzantine)
        check_tracking(self)
        _positive_int("num-server-rounds", self.num_server_rounds)
        _positive_int("eval-every", self.eval_every)
        if self.seed < -1:
            raise ValueError(f"seed must be -1 (secure randomness) or >= 0 (seeded), got {self.seed}")
        if not self.output_dir:
            raise ValueError("output-dir must not be empty")
        if any(c in self.run_name for c in "/\\") or self.run_name in (".", ".."):
            raise ValueError(f"run-name must be a plain folder name, got {self.run_name!r}")
        _positive("client-timeout", self.client_timeout)
        if not 0.0 <= self.max_failed_fraction <= 1.0:
            raise ValueError(f"max-failed-fraction must be in [0, 1], got {self.max_failed_fraction}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigSections:
    """The typed sections of one :class:`RunConfig` (``cfg.sections``)."""

    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    privacy: PrivacyConfig = dataclasses.field(default_factory=PrivacyConfig)
    server: ServerOptConfig = dataclasses.field(default_factory=ServerOptConfig)
    secagg: SecAggConfig = dataclasses.field(default_factory=SecAggConfig)
    run: RunOptions = dataclasses.field(default_factory=RunOptions)


# ConfigSections field -> its section class
SECTIONS: Mapping[str, type] = MappingProxyType(
    {f.name: f.default_factory for f in dataclasses.fields(ConfigSections)}  # type: ignore[misc]
)


def default(key: str) -> Any:
    """The library default of run-config key ``key`` (kebab- or snake-case), read from its section.

    For copies of a default elsewhere (benchmark specs, attack targets) without building a config.
    Raises ValueError naming the key if no section has it.
    """
    name = str(key).replace("-", "_")
    for section in SECTIONS.values():
        if name in section.__dataclass_fields__:  # type: ignore[attr-defined]
            return _default(section, name)
    raise ValueError(f"unknown run-config key {key!r}")


@dataclass(frozen=True, kw_only=True)
class RunConfig(RunOptions, SecAggConfig, ServerOptConfig, PrivacyConfig, TrainConfig, ModelConfig, DataConfig):
    """The resolved configuration of one run: the flat view of the typed sections.

    Its fields are the sections' own, inherited with their defaults (no second copy to keep in step);
    field names are the snake_case form of the kebab-case run-config keys.
    """

    def __post_init__(self) -> None:
        self._sections()  # every section: the types and the per-key checks
        self._check_adaptive_clip()
        self._check_combinations()


    # ------------------------------------------------------------------ construction
    @classmethod
    def from_mapping(cls, run_config: Mapping[str, Any]) -> RunConfig:
        """Build a config from a Flower ``context.run_config`` (kebab-case keys).

        Missing keys take the defaults; unknown keys and bad values raise
        :class:`fedprivacy.errors.ConfigError` (a ``ValueError``) naming the key, in one line.
        """
        if not isinstance(run_config, Mapping):
            raise TypeError(f"run_config must be a mapping, got {type(run_config).__name__}")
        names = {_key(f.name): f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in run_config.items():
            field = names.get(str(key))
            if field is None:
                raise ConfigError(unknown_key_message(str(key), list(names)))
            kwargs[field.name] = _coerce(str(key), value, field.type)
        try:
            return cls(**kwargs)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(str(exc)) from exc

    def to_mapping(self) -> dict[str, Any]:
        """The full config with kebab-case keys (round-trips through :meth:`from_mapping`)."""
        return {_key(f.name): getattr(self, f.name) for f in dataclasses.fields(self)}

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ derived values
    @property
    def seeded(self) -> bool:
        """True in the reproducible research mode (``seed >= 0``), which is not private."""
        return self.seed >= 0

    @property
    def data_seed(self) -> int:
        """Seed of data splitting/partitioning (not secret; -1 maps to 0 so all processes agree)."""
        return max(self.seed, 0)

    @property
    def mode(self) -> PrivacyMode:
        """The privacy mode object ``privacy`` names (:mod:`fedprivacy.fl.modes`, the one registry)."""
        from fedprivacy.fl.modes import get_mode

        return get_mode(self.privacy)

    @property
    def is_dp(self) -> bool:
        """Whether the mode adds noise and claims an ε (its mechanisms say so, not its name)."""
        from fedprivacy.fl.modes import is_private

        return is_private(self.mode)

    @property
    def hf_name(self) -> str | None:
        """The Hugging Face dataset name for ``dataset = "hf:<name>"``, else None."""
        return self.dataset[3:] if self.dataset.startswith("hf:") else None

    @property
    def sections(self) -> ConfigSections:
        """The typed sections of this config (built, and so checked, on each access)."""
        return self._sections()

    @classmethod
    def from_sections(cls, sections: ConfigSections | None = None, **parts: Any) -> RunConfig:
        """Build a config from typed sections: ``RunConfig.from_sections(privacy=PrivacyConfig(...))``.

        ``parts`` name :class:`ConfigSections` fields (``data``, ``model``, ``train``, ``privacy``,
        ``server``, ``secagg``, ``run``); a missing one takes its defaults.
        """
        whole = dataclasses.replace(sections or ConfigSections(), **parts)
        flat: dict[str, Any] = {}
        for part in dataclasses.fields(whole):
            section = getattr(whole, part.name)
            flat.update({f.name: getattr(section, f.name) for f in dataclasses.fields(section)})
        return cls(**flat)

    def _sections(self) -> ConfigSections:
        parts = {}
        for part, section_cls in SECTIONS.items():
            names = [f.name for f in dataclasses.fields(section_cls)]
            parts[part] = section_cls(**{name: getattr(self, name) for name in names})
        return ConfigSections(**parts)

    # ------------------------------------------------------------------ validation
    def _check_adaptive_clip(self) -> None:
        """Adaptive clipping's rules across keys (the mode's own are in its ``check``)."""
        if self.adaptive_clip and self.clip_norm <= 0:
            raise ValueError(f"clip-norm (the initial clip norm) must be > 0 when adaptive-clip=true, "
                             f"got {self.clip_norm}")

    def _check_combinations(self) -> None:
        if self.is_dp and self.clip_norm <= 0:
            raise ValueError(
                f"clip-norm must be > 0 when privacy={self.privacy!r} (the sensitivity), got "
                f"{self.clip_norm}; set e.g. clip-norm=0.5, or privacy='none' for no DP"
            )
        self.mode.check(self)
        from fedprivacy.fl.robust import check_rule

        check_rule(self)
        from fedprivacy.fl.scaffold import check_scaffold

        check_scaffold(self)
        self._check_secagg()
        if self.sampling == "fixed":
            if self.cohort_size < 1:
                raise ValueError(f"cohort-size must be >= 1 when sampling='fixed', got {self.cohort_size}; "
                                 "set cohort-size=M (clients per round)")
            if self.is_dp and self.neighbouring != "replace-one":
                raise ValueError(
                    "neighbouring must be 'replace-one' when sampling='fixed': a fixed-size cohort is "
                    "sampling without replacement, which is only accounted under replace-one adjacency "
                    f"(got {self.neighbouring!r}); set neighbouring='replace-one'"
                )
        if self.resume and not self.run_name:
            raise ValueError("run-name must be set when resume=true (the run folder to continue), got ''; "
                             "set run-name to the folder under output-dir, or resume=false")

    def _check_secagg(self) -> None:
        """secagg combinations every mode shares (a mode refuses secagg in its own ``check``)."""
        if not self.secagg:
            return
        if self.clip_norm <= 0:
            raise ValueError(f"clip-norm must be > 0 when secagg=true (fixed-point range), got {self.clip_norm}")
        if self.sampling == "fixed" and self.cohort_size < 3:
            raise ValueError(f"cohort-size must be >= 3 when secagg=true, got {self.cohort_size}")
        k, t = self.secagg_neighbours, self.secagg_threshold
        if k == 1:
            raise ValueError("secagg-neighbours must be 0 (automatic) or >= 2 (one neighbour learns the input)")
        if t == 1 or (k and t and 2 * t <= k + 1):
            raise ValueError(
                f"secagg-threshold must be > (secagg-neighbours+1)/2 = {(k + 1) / 2} so that a server lying "
                f"about dropouts cannot unmask a live client (Bonawitz et al. 2017, Sec. 4), got {t}")
        if k and t and t > k + 1:
            raise ValueError(f"secagg-threshold must be <= secagg-neighbours+1 = {k + 1}, got {t}")


# ---------------------------------------------------------------------- helpers
_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}


def _check_type(key: str, value: Any, type_name: Any) -> None:
    expected = _TYPES[str(type_name)]
    if expected is float:
        ok = isinstance(value, float | int) and not isinstance(value, bool)
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, expected)
    if not ok:
        raise TypeError(f"{key} must be {expected.__name__}, got {type(value).__name__} {value!r}")
    if expected is float and not math.isfinite(value):  # NaN, inf, 1e400 (which TOML reads as inf)
        raise ValueError(f"{key} must be a finite number, got {value!r}")


def _coerce(key: str, value: Any, type_name: Any) -> Any:
    """Convert a run-config value to the field type, or raise ValueError naming the key."""
    expected = _TYPES[str(type_name)]
    if expected is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    elif expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif expected is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif isinstance(value, str):
        return value
    raise ConfigError(f"{key} must be {_KIND[expected]}, got {type(value).__name__} {value!r}")


_KIND = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _choice(key: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ValueError(f"{key} must be one of {', '.join(options)}; got {value!r}")


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{key} must be > 0, got {value}")


def _non_negative(key: str, value: float) -> None:
    if not value >= 0:
        raise ValueError(f"{key} must be >= 0, got {value}")


def _positive_int(key: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{key} must be >= 1, got {value}")
