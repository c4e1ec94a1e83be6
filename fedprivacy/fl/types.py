"""The contracts of a federated round: a leaf module (numpy only; privacy types for annotations).

Everything the parts of :mod:`fedprivacy.fl` hand each other is defined here, so that none of them
imports another for a type:

* :class:`RoundInstructions`: what the server tells a sampled client (travels as a flat record);
* :class:`ClientUpdate`: one client's reply (Δ and the metadata its privacy mode lets it disclose);
* :class:`AggregateResult`: the released mean update of a round and who is in it;
* :class:`RoundOutcome`: what one round produced, including the privacy event that really ran;
* :class:`SecureRoundInfo`, :class:`DpsgdRoundInfo` and :class:`RoundRecord`: the typed row of
  ``results.json["rounds"]`` (:meth:`RoundRecord.to_json` gives exactly the published keys);
* :class:`ModelHooks`: the ML operations the run needs (init, central evaluation);
* ``Exchange`` and ``RoundFn``: the transport seams (one exchange of train messages; a whole round).
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from fedprivacy.accounting.events import PrivacyEvent
    from fedprivacy.dp.rng import RandomSource

__all__ = [
    "AggregateResult",
    "ClientUpdate",
    "ClipRoundInfo",
    "CorrelatedDraw",
    "DpsgdRoundInfo",
    "Exchange",
    "ModelHooks",
    "RoundFn",
    "RoundInstructions",
    "RoundOutcome",
    "RoundRecord",
    "SecureRoundInfo",
    "from_flat_record",
]


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected a bool, got {value!r}")
    return value


_SCALARS: dict[Any, Callable[[Any], Any]] = {int: int, float: float, str: str, bytes: bytes, bool: _flag}


def from_flat_record(cls: type, record: Mapping[str, Any], *, what: str) -> dict[str, Any]:
    """The keyword arguments of dataclass ``cls`` from a flat record, each cast to its field's type.

    The field list and types come from the dataclass itself (no second, hand-written table to keep in
    step). Raises ValueError naming the missing fields.
    """
    casts = _field_casts(cls)
    missing = sorted(set(casts) - set(record))
    if missing:
        raise ValueError(f"{what} miss {missing}")
    return {n: cast(record[n]) for n, cast in casts.items()}


@functools.lru_cache(maxsize=32)
def _field_casts(cls: type) -> dict[str, Callable[[Any], Any]]:
    """Field name -> scalar cast of a flat dataclass, in field order (``get_type_hints`` evaluates the
    string annotations, ~70 µs: once per class, not once per message)."""
    hints = typing.get_type_hints(cls)
    return {f.name: _SCALARS[hints[f.name]] for f in fields(cls)}


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundInstructions:
    """What the server tells a sampled client (travels as a flat ConfigRecord).

    ``client_mechanism`` names the noise the client adds to its clipped update (``""``: none), resolved
    in the client's own registry (:mod:`fedprivacy.fl.mechanisms`), with ``noise_multiplier`` its scale
    over ``clip_norm``. ``private`` says the round is part of a DP release (its update is then never
    released as a non-finite value). The client's policy decides what of this it obeys.
    """

    round: int
    privacy: str
    clip_norm: float
    client_mechanism: str
    noise_multiplier: float
    private: bool
    learning_rate: float
    local_epochs: int
    batch_size: int
    num_classes: int
    seed: int  # -1 = secure randomness
    proximal_mu: float = 0.0  # FedProx's proximal term on local training (training only: ε unchanged)
    scaffold: bool = False  # SCAFFOLD: the arrays are x ++ c, the reply Δy ++ Δc clipped jointly (ε unchanged)

    def __post_init__(self) -> None:
        if not self.proximal_mu >= 0:
            raise ValueError(f"proximal_mu must be >= 0, got {self.proximal_mu}")
        if self.round < 1:
            raise ValueError(f"round must be >= 1, got {self.round}")
        if self.clip_norm < 0:
            raise ValueError(f"clip_norm must be >= 0, got {self.clip_norm}")
        if not self.noise_multiplier >= 0:
            raise ValueError(f"noise_multiplier must be >= 0, got {self.noise_multiplier}")
        if self.client_mechanism and not (self.clip_norm > 0 and self.noise_multiplier > 0):
            raise ValueError(f"client mechanism {self.client_mechanism!r} needs clip_norm > 0 and "
                             f"noise_multiplier > 0, got {self.clip_norm} and {self.noise_multiplier}")

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> RoundInstructions:
        return cls(**from_flat_record(cls, record, what="round instructions"))


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientUpdate:
    """One client's reply to a training round.

    Attributes:
        partition_id: the client's partition id (stable across transports).
        delta: the (clipped, and in ``local`` mode noised) model update Δ = w_local − w_global.
        num_examples: local examples used, or None when not disclosed (DP modes other than central).
        train_loss: mean local training loss, or None when not disclosed.
        metrics: further scalar metrics (e.g. ``dpsgd_steps``).
    """

    partition_id: int
    delta: tuple[np.ndarray, ...]
    num_examples: int | None = None
    train_loss: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class AggregateResult:
    """The released aggregate of one round.

    Attributes:
        mean_update: noisy sum divided by the fixed denominator (same shapes as the model weights).
        aggregated: partition ids whose updates are in the sum, ascending.
        dropped: partition id -> reason for every update left out.
        noise_std: std of the noise in each coordinate of the released sum (0 if none).
        denominator: the fixed denominator used.
        sensitivity_ratio: the rule's L2 sensitivity over the clipped sum's (:mod:`fedprivacy.fl.robust`);
            the release is charged as noise ``noise_std / sensitivity_ratio`` on the sum.
        correlated_draw: for correlated noise, which draw of the stream the noise is and the horizon
            event the stream was charged as (a zero-loss round must carry a later draw of it).
    """

    mean_update: tuple[np.ndarray, ...]
    aggregated: tuple[int, ...]
    dropped: dict[int, str]
    noise_std: float
    denominator: float
    sensitivity_ratio: float = 1.0
    correlated_draw: CorrelatedDraw | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CorrelatedDraw:
    """Draw ``index`` (1-based) of a correlated noise stream charged as ``covers`` before its first draw."""

    covers: PrivacyEvent
    index: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SecureRoundInfo:
    """Per-round figures of a secure-aggregation round (``secagg_*`` keys of the results row).

    Attributes:
        threshold: the round's Shamir threshold ``t``.
        exchanges: message exchanges the round took (its key stages riding on the previous round's
            exchanges: 3 on the active schedule, 2 on the semi-honest one; ``docs/SECAGG.md``).
        degree: the masking graph's degree ``k`` (None if the round aborted before choosing it).
        pipelined: the round's key advertisement (and share stage) rode on the previous round's exchanges.
        survivors: clients whose masked input is in the released sum (None if aborted).
        rho: zCDP ρ of the released sum (privacy ``distributed``).
        max_abs_error: bound on the fixed-point decoding error per coordinate (privacy ``none``).
        noise_std_sum: std of the noise in the released sum (0 without DP).
        roster: clients in the round's roster (the XNoise design's ``n``; None if aborted early).
        dim: the padded dimension the clients encoded (the accounting's ``m``).
        late: survivors (in the sum) that missed a later stage (consistency, unmask), None if none: the
            round's completion then also depended on the other survivors' shares.
    """

    threshold: int
    exchanges: int = 0
    degree: int | None = None
    pipelined: bool = False
    survivors: int | None = None
    rho: float | None = None
    max_abs_error: float | None = None
    noise_std_sum: float | None = None
    roster: int | None = None
    dim: int | None = None
    late: int | None = None

    _KEYS = {"threshold": "secagg_threshold", "exchanges": "secagg_exchanges",
             "degree": "secagg_degree", "pipelined": "secagg_pipelined",
             "survivors": "secagg_survivors", "rho": "rho", "max_abs_error": "secagg_max_abs_error",
             "noise_std_sum": "noise_std_sum", "roster": "secagg_roster", "dim": "secagg_dim",
             "late": "secagg_late"}

    def to_json(self) -> dict[str, Any]:
        """The row keys (a figure that does not apply is left out, as is ``pipelined=False``)."""
        out: dict[str, Any] = {}
        for name, key in self._KEYS.items():
            value = getattr(self, name)
            if value is not None and value is not False:
                out[key] = value
        return out

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> SecureRoundInfo | None:
        if "secagg_threshold" not in row:
            return None
        return cls(**{n: row[k] for n, k in cls._KEYS.items() if k in row})


@dataclass(frozen=True, slots=True, kw_only=True)
class DpsgdRoundInfo:
    """Sample-level DP-SGD on the clients: the worst client's ε so far (None before any step)."""

    epsilon: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClipRoundInfo:
    """Adaptive clipping: the round's clip norm and the released (noised) fraction of unclipped updates."""

    clip_norm: float
    unclipped_fraction: float

    def to_json(self) -> dict[str, Any]:
        return {"clip_norm": self.clip_norm, "clip_unclipped_fraction": self.unclipped_fraction}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> ClipRoundInfo | None:
        if "clip_norm" not in row:
            return None
        return cls(clip_norm=row["clip_norm"], unclipped_fraction=row["clip_unclipped_fraction"])


_RECORD_KEYS = ("round", "clients_sampled", "clients_aggregated", "train_loss", "test_loss",
                "test_accuracy", "epsilon", "delta", "seconds")


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundRecord:
    """One row of ``results.json["rounds"]`` (and of ``rounds.csv``), typed.

    ``epsilon``/``delta`` are the run's cumulative user-level guarantee after the round (None without
    DP). ``test_loss``/``test_accuracy`` are None in rounds the global model was not evaluated in
    (``eval-every``; the last round is always evaluated). ``aborted`` says why a secure round released nothing; ``secagg`` and ``dpsgd`` hold the figures
    of those features when they are on.
    """

    round: int
    clients_sampled: int
    clients_aggregated: int
    train_loss: float | None
    test_loss: float | None
    test_accuracy: float | None
    epsilon: float | None
    delta: float | None
    seconds: float
    dpsgd: DpsgdRoundInfo | None = None
    secagg: SecureRoundInfo | None = None
    aborted: str | None = None
    clip: ClipRoundInfo | None = None

    def to_json(self) -> dict[str, Any]:
        """The published row: the fixed keys, then ``dpsgd_epsilon``, the secagg figures, ``aborted``."""
        row: dict[str, Any] = {k: getattr(self, k) for k in _RECORD_KEYS}
        if self.dpsgd is not None:
            row["dpsgd_epsilon"] = self.dpsgd.epsilon
        if self.secagg is not None:
            row.update(self.secagg.to_json())
        if self.aborted is not None:
            row["aborted"] = self.aborted
        if self.clip is not None:
            row.update(self.clip.to_json())
        return row

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> RoundRecord:
        """Inverse of :meth:`to_json` (a checkpoint's rows); ValueError on an unknown key."""
        known = (set(_RECORD_KEYS) | {"dpsgd_epsilon", "aborted", "clip_norm", "clip_unclipped_fraction"}
                 | set(SecureRoundInfo._KEYS.values()))
        unknown = sorted(set(row) - known)
        if unknown:
            raise ValueError(f"round record has unknown keys {unknown}")
        return cls(**{k: row[k] for k in _RECORD_KEYS},
                   dpsgd=DpsgdRoundInfo(epsilon=row["dpsgd_epsilon"]) if "dpsgd_epsilon" in row else None,
                   secagg=SecureRoundInfo.from_json(row), aborted=row.get("aborted"),
                   clip=ClipRoundInfo.from_json(row))


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundOutcome:
    """What one round produced.

    Attributes:
        aggregate: the released mean update and who is in it.
        failures: partition id -> reason, for sampled clients that crashed or timed out.
        updates: the (metadata of the) updates received, for loss and DP-SGD bookkeeping.
        event: the privacy event that really ran, if it differs from the plan (None = the plan's). It
            must be no worse than the plan's event, which the budget check used before the round.
        aborted: why the round released nothing (secure aggregation below threshold), else None:
            nothing is spent and the model stays unchanged (``aggregate.mean_update`` is all zeros).
        secagg: the figures of a secure-aggregation round, for the results row.
        clip: adaptive clipping's clip norm and released fraction for the round, for the results row.
    """

    aggregate: AggregateResult
    failures: dict[int, str] = field(default_factory=dict)
    updates: tuple[ClientUpdate, ...] = ()
    event: PrivacyEvent | None = None
    aborted: str | None = None
    secagg: SecureRoundInfo | None = None
    clip: ClipRoundInfo | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelHooks:
    """The ML operations the run needs (defaults: :func:`fedprivacy.fl.task.default_hooks`).

    Attributes:
        init: initial global weights from an integer seed.
        evaluate: ``(loss, accuracy)`` of weights on the server's held-out test set.
        num_classes: number of classes (sent to the clients in the round instructions).
        dpsgd_schedule: ``partition id -> (steps, sample rate)`` of the DP-SGD that client's local
            training runs in one round (:func:`fedprivacy.ml.train.dpsgd_schedule` of its partition's
            size); the server charges it before the instructions leave. None:
            DP-SGD spends are journaled when the replies arrive.
    """

    init: Callable[[int], list[np.ndarray]]
    evaluate: Callable[[Sequence[np.ndarray]], tuple[float, float]]
    num_classes: int
    dpsgd_schedule: Callable[[int], tuple[int, float]] | None = None


Exchange = Callable[[RoundInstructions, Sequence[int], Sequence[np.ndarray]],
                    tuple[Sequence[ClientUpdate], dict[int, str]]]
"""Sends train instructions to a cohort; returns ``(updates, failures)``."""

RoundFn = Callable[[RoundInstructions, Sequence[int], Sequence[np.ndarray], "RandomSource"], RoundOutcome]
"""Runs one whole round: ``(instructions, cohort, global weights, server rng) -> RoundOutcome``."""
