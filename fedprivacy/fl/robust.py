"""Robust aggregation rules with the L2 sensitivity each has under clipping: trimmed mean, median, Krum.

Each rule re-clips every finite update to ``C`` (as :class:`fedprivacy.fl.aggregation.PlainAggregator`)
and declares :meth:`sensitivity_ratio`: its output's L2 sensitivity divided by that of the clipped sum
(``C`` under add-remove, ``2C`` under replace-one). In central mode the server adds
``N(0, (ratio·zC)²)`` to the output, so the round is the Gaussian mechanism of multiplier ``z`` on a
function of that sensitivity and the accounted event is unchanged; with Poisson sampling the
amplification holds for any such function by joint convexity of the hockey-stick divergence (Balle,
Barthe & Gaboardi 2018, Thm. 8; Zhu, Dong & Wang 2022, Prop. 30). The bounds, proved in
docs/ROBUST_AGGREGATION.md and searched adversarially in ``tests/fl/test_robust.py``:

* trimmed mean, ``k`` values cut per coordinate and side (Yin et al. 2018): the trimmed sum of the
  others plus ``clamp(x_j, L_j, U_j)``, so ``1 + √2`` (add-remove) and ``1`` (replace-one);
* coordinate-wise median: every output lies in the ball of radius ``√2·C``, so its diameter
  ``2√2·C`` bounds it: ``2√2`` and ``√2`` on a denominator of 1;
* (multi-)Krum (Blanchard et al. 2017): the mean of selected clipped updates lies in the ``C`` ball:
  ``2`` and ``1`` on a denominator of 1.

q-FedAvg (Li, Sanjabi, Beirami & Smith 2020, "Fair resource allocation in federated learning", Alg. 2)
weighs each update by a power of the client's training loss and divides by a sum of them: a
data-dependent normalizer with no sensitivity bound here, so it declares none and runs without DP only.

Median and Krum pay the whole ball's diameter (no ``1/n``): their noise is about ``n`` times a mean's.
Under secure aggregation the server sees only the sum, so no robust rule can run there; norm-bounded
clipping is the defence that does (Sun et al. 2019).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedprivacy.fl.aggregation import PlainAggregator, clip_to_norm, non_finite_reason
from fedprivacy.fl.types import AggregateResult, ClientUpdate

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.fl.aggregation import Aggregator

__all__ = ["AGGREGATORS", "AGGREGATOR_KEYS", "check_rule", "check_rule_keys", "CoordinateMedian", "MultiKrum", "QFedAvg", "TrimmedMean", "make_aggregator",
           "register_aggregator", "sensitivity_ratio"]


def _stack(updates: Sequence[ClientUpdate], like: Sequence[np.ndarray], clip_norm: float
           ) -> tuple[np.ndarray, list[int], dict[int, str]]:
    """The finite updates, clipped, as rows of one float64 matrix in ascending partition-id order."""
    rows: list[np.ndarray] = []
    kept: list[int] = []
    dropped: dict[int, str] = {}
    for update in sorted(updates, key=lambda u: u.partition_id):
        pid = update.partition_id
        if pid in kept or pid in dropped:
            dropped[pid] = "duplicate reply from this partition"
            continue
        reason = non_finite_reason(update.delta, like)
        if reason is not None:
            dropped[pid] = reason
            continue
        arrays = (clip_to_norm(update.delta, clip_norm=clip_norm) if clip_norm > 0
                  else [np.asarray(a, dtype=np.float64) for a in update.delta])
        rows.append(np.concatenate([a.ravel() for a in arrays]))
        kept.append(pid)
    dim = sum(int(np.size(a)) for a in like)
    return (np.stack(rows) if rows else np.zeros((0, dim))), kept, dropped


def _result(flat: np.ndarray, like: Sequence[np.ndarray], *, kept: list[int], dropped: dict[int, str],
            noise_std: float, denominator: float, rng: RandomSource) -> AggregateResult:
    if noise_std > 0:
        flat = flat + rng.normal(std=noise_std, size=flat.shape)
    mean = flat / denominator
    out, pos = [], 0
    for ref in like:
        size = int(np.size(ref))
        out.append(mean[pos:pos + size].reshape(np.shape(ref)).astype(np.asarray(ref).dtype))
        pos += size
    return AggregateResult(mean_update=tuple(out), aggregated=tuple(kept), dropped=dropped,
                           noise_std=float(noise_std), denominator=float(denominator))


class _Robust:
    """The shared checks: clip norm ``C`` and the noise std on the output's sum scale."""

    name = ""
    _ratios: tuple[float, float] = (math.inf, math.inf)  # (add-remove, replace-one)

    def __init__(self, *, clip_norm: float, noise_std: float) -> None:
        if clip_norm < 0:
            raise ValueError(f"clip_norm must be >= 0, got {clip_norm}")
        if noise_std < 0:
            raise ValueError(f"noise_std must be >= 0, got {noise_std}")
        self.clip_norm = float(clip_norm)
        self.noise_std = float(noise_std)

    def sensitivity_ratio(self, neighbouring: str) -> float:
        """The output's L2 sensitivity over the clipped sum's under ``neighbouring`` (module docstring)."""
        if neighbouring not in ("add-remove", "replace-one"):
            raise ValueError(f"neighbouring must be 'add-remove' or 'replace-one', got {neighbouring!r}")
        return self._ratios[0] if neighbouring == "add-remove" else self._ratios[1]


class TrimmedMean(_Robust):
    """Per coordinate, drop the ``trim`` smallest and largest values and sum the rest; the output is
    ``(sum + noise) / (denominator - 2·trim)``, a fixed denominator (the expected number kept)."""

    name = "trimmed-mean"
    _ratios = (1.0 + math.sqrt(2.0), 1.0)

    def __init__(self, *, trim: int, clip_norm: float, noise_std: float) -> None:
        super().__init__(clip_norm=clip_norm, noise_std=noise_std)
        if isinstance(trim, bool) or not isinstance(trim, int) or trim < 0:
            raise ValueError(f"aggregation-trim must be an int >= 0, got {trim!r}")
        self.trim = trim

    def check_cohort(self, denominator: float) -> None:
        """Refuse (before round 1) a trim that leaves no expected update to average."""
        if not denominator - 2 * self.trim > 0:
            raise ValueError(f"aggregation-trim={self.trim} cuts 2x{self.trim} of an expected cohort of "
                             f"{denominator:g}; choose aggregation-trim < {denominator / 2:g}")

    def aggregate(self, updates: Sequence[ClientUpdate], *, like: Sequence[np.ndarray], denominator: float,
                  rng: RandomSource) -> AggregateResult:
        self.check_cohort(denominator)
        kept_denominator = denominator - 2 * self.trim
        rows, kept, dropped = _stack(updates, like, self.clip_norm)
        n, k = rows.shape[0], self.trim
        total = (np.sort(rows, axis=0)[k:n - k].sum(axis=0) if n > 2 * k else np.zeros(rows.shape[1]))
        return _result(total, like, kept=kept, dropped=dropped, noise_std=self.noise_std,
                       denominator=kept_denominator, rng=rng)


class CoordinateMedian(_Robust):
    """The coordinate-wise median of the clipped updates (0 when none arrived), on a denominator of 1."""

    name = "median"
    _ratios = (2.0 * math.sqrt(2.0), math.sqrt(2.0))

    def aggregate(self, updates: Sequence[ClientUpdate], *, like: Sequence[np.ndarray], denominator: float,
                  rng: RandomSource) -> AggregateResult:
        rows, kept, dropped = _stack(updates, like, self.clip_norm)
        med = np.median(rows, axis=0) if rows.shape[0] else np.zeros(rows.shape[1])
        return _result(med, like, kept=kept, dropped=dropped, noise_std=self.noise_std, denominator=1.0,
                       rng=rng)


class MultiKrum(_Robust):
    """Multi-Krum (Blanchard et al. 2017; El Mhamdi et al. 2018): score each clipped update by the sum
    of squared distances to its ``n - byzantine - 2`` nearest others, average the ``select`` lowest
    (ties by partition id), on a denominator of 1. ``select = 1`` is Krum."""

    name = "krum"
    _ratios = (2.0, 1.0)

    def __init__(self, *, byzantine: int, select: int, clip_norm: float, noise_std: float) -> None:
        super().__init__(clip_norm=clip_norm, noise_std=noise_std)
        if isinstance(byzantine, bool) or not isinstance(byzantine, int) or byzantine < 0:
            raise ValueError(f"krum-byzantine must be an int >= 0, got {byzantine!r}")
        if isinstance(select, bool) or not isinstance(select, int) or select < 1:
            raise ValueError(f"krum-select must be an int >= 1, got {select!r}")
        self.byzantine, self.select = byzantine, select

    def aggregate(self, updates: Sequence[ClientUpdate], *, like: Sequence[np.ndarray], denominator: float,
                  rng: RandomSource) -> AggregateResult:
        rows, kept, dropped = _stack(updates, like, self.clip_norm)
        n = rows.shape[0]
        if n == 0:
            return _result(np.zeros(rows.shape[1]), like, kept=kept, dropped=dropped,
                           noise_std=self.noise_std, denominator=1.0, rng=rng)
        sq = np.sum(rows * rows, axis=1)
        dist = np.maximum(sq[:, None] + sq[None, :] - 2.0 * rows @ rows.T, 0.0)
        near = max(n - self.byzantine - 2, 1)
        scores = np.array([np.sort(np.delete(dist[i], i))[:near].sum() if n > 1 else 0.0 for i in range(n)])
        chosen = np.argsort(scores, kind="stable")[:min(self.select, n)]
        # every kept update shaped the selection, so all of them are in the release
        return _result(rows[chosen].mean(axis=0), like, kept=kept, dropped=dropped,
                       noise_std=self.noise_std, denominator=1.0, rng=rng)



class QFedAvg:
    """q-FedAvg's server step as Flower 1.42's ``QFedAvg`` takes it: with ``L = 1/lr`` (the clients'
    learning rate), ``g_k = -L·Δ_k``, ``δ_k = F_k^q g_k``, ``h_k = q F_k^(q-1) ‖g_k‖² + L F_k^q``, the
    released update is ``-Σδ_k / Σh_k`` (``F_k``: the client's training loss, ``+1e-10`` as Flower).
    It needs every client's loss and declares no sensitivity, so it runs only where nothing is private."""

    name = "qfedavg"

    def __init__(self, *, q: float, client_learning_rate: float, clip_norm: float) -> None:
        if not (math.isfinite(q) and q >= 0):
            raise ValueError(f"qffl-q must be >= 0, got {q}")
        if not client_learning_rate > 0:
            raise ValueError(f"learning-rate must be > 0, got {client_learning_rate}")
        self.q, self.lipschitz, self.clip_norm = float(q), 1.0 / float(client_learning_rate), float(clip_norm)

    def aggregate(self, updates: Sequence[ClientUpdate], *, like: Sequence[np.ndarray], denominator: float,
                  rng: RandomSource) -> AggregateResult:
        rows, kept, dropped = _stack(updates, like, self.clip_norm)
        losses = {u.partition_id: u.train_loss for u in updates}
        missing = [p for p in kept if losses.get(p) is None]
        if missing:
            raise ValueError(f"qfedavg needs each client's training loss; clients {missing} sent none")
        sum_delta, sum_h = np.zeros(rows.shape[1]), 0.0
        for row, pid in zip(rows, kept, strict=True):
            grad = -self.lipschitz * row
            power = float(np.float_power(float(losses[pid]) + 1e-10, self.q))  # type: ignore[arg-type]
            sum_delta += power * grad
            sum_h += (self.q * float(np.float_power(float(losses[pid]) + 1e-10, self.q - 1))  # type: ignore[arg-type]
                      * float(grad @ grad) + self.lipschitz * power)
        step = -sum_delta / sum_h if sum_h > 0 else sum_delta
        return _result(step, like, kept=kept, dropped=dropped, noise_std=0.0, denominator=1.0, rng=rng)


def sensitivity_ratio(aggregator: object, neighbouring: str) -> float:
    """What ``aggregator`` declares (:meth:`TrimmedMean.sensitivity_ratio`); a rule that declares
    nothing cannot carry a server-side DP release (TypeError)."""
    declared = getattr(aggregator, "sensitivity_ratio", None)
    if not callable(declared):
        raise TypeError(f"aggregator {type(aggregator).__name__} declares no sensitivity_ratio(neighbouring); a "
                        "server-side DP release needs its sensitivity under clipping (docs/ROBUST_AGGREGATION.md)")
    ratio = float(declared(neighbouring))
    if not ratio >= 1.0 - 1e-12 or math.isnan(ratio):
        raise ValueError(f"aggregator {type(aggregator).__name__} declares sensitivity ratio {ratio}; it must be "
                         ">= 1 (no rule of clipped updates is less sensitive than the sum's own bound here)")
    return ratio


#: ``aggregation`` name -> factory of (run config, clip norm, noise std on the output's sum scale)
AGGREGATORS: dict[str, Callable[[RunConfig, float, float], Aggregator]] = {
    "plain": lambda cfg, c, std: PlainAggregator(clip_norm=c, noise_std=std),
    "trimmed-mean": lambda cfg, c, std: TrimmedMean(trim=cfg.aggregation_trim, clip_norm=c, noise_std=std),
    "median": lambda cfg, c, std: CoordinateMedian(clip_norm=c, noise_std=std),
    "krum": lambda cfg, c, std: MultiKrum(byzantine=cfg.krum_byzantine, select=cfg.krum_select, clip_norm=c,
                                          noise_std=std),
    "qfedavg": lambda cfg, c, std: QFedAvg(q=cfg.qffl_q, client_learning_rate=cfg.learning_rate, clip_norm=c),
}

#: ``aggregation`` name -> its own keys: (default, lowest value); setting one for another rule is refused
AGGREGATOR_KEYS: dict[str, dict[str, tuple[Any, Any]]] = {
    "trimmed-mean": {"aggregation-trim": (0, 0)}, "krum": {"krum-byzantine": (0, 0), "krum-select": (1, 1)},
    "qfedavg": {"qffl-q": (0.1, 0.0)},
}


def check_rule_keys(section: Any) -> None:
    """Refuse a rule's key set for another rule (``section``: the config's server section)."""
    for rule, keys in AGGREGATOR_KEYS.items():
        for key, (default, low) in keys.items():
            value = getattr(section, key.replace("-", "_"))
            if not value >= low:
                raise ValueError(f"{key} must be >= {low}, got {value}")
            if value != default and section.aggregation != rule:
                raise ValueError(f"{key}={value} is read only by aggregation={rule!r}, got "
                                 f"aggregation={section.aggregation!r}; leave {key} at {default} or set aggregation")


def check_rule(cfg: RunConfig) -> None:
    """The rule's refusals that span keys: any rule but the plain sum under secure aggregation (the
    server sees only the sum) or adaptive clipping (its round sums to its own estimate), and a rule that
    declares no sensitivity in a DP mode."""
    if cfg.aggregation == "plain":
        return
    if cfg.secagg:
        raise ValueError(f"aggregation={cfg.aggregation!r} with secagg=true is refused: under secure aggregation "
                         "the server sees only the sum, so no robust rule can run; norm-bounded clipping "
                         "(clip-norm) is the defence there; set aggregation='plain' or secagg=false")
    if cfg.adaptive_clip:
        raise ValueError(f"aggregation={cfg.aggregation!r} with adaptive-clip=true is refused: the adaptive "
                         "round clips and sums to its own estimate; set aggregation='plain' or adaptive-clip=false")
    rule = AGGREGATORS[cfg.aggregation](cfg, cfg.clip_norm, 0.0)
    if cfg.is_dp and not callable(getattr(rule, "sensitivity_ratio", None)):
        raise ValueError(f"aggregation={cfg.aggregation!r} with privacy={cfg.privacy!r} is refused: the rule declares "
                         "no sensitivity (q-FedAvg weighs by un-noised losses and divides by a data-dependent sum); "
                         "use privacy='none'")


def register_aggregator(name: str, factory: Callable[[RunConfig, float, float], Aggregator]) -> None:
    """Make ``aggregation = name`` select ``factory(cfg, clip_norm, noise_std)``; the rule must declare
    ``sensitivity_ratio`` to run in a mode whose server adds the noise."""
    if not name or name in AGGREGATORS:
        raise ValueError(f"aggregation {name!r} is empty or already registered")
    AGGREGATORS[name] = factory


def make_aggregator(cfg: RunConfig, *, clip_norm: float, noise_std: float = 0.0,
                    neighbouring: str = "add-remove") -> Aggregator:
    """The rule ``cfg.aggregation`` names; ``noise_std`` (the clipped sum's, ``zC``) is scaled by the
    rule's :func:`sensitivity_ratio` under ``neighbouring``, so the release keeps multiplier ``z``."""
    try:
        factory = AGGREGATORS[cfg.aggregation]
    except KeyError:
        raise ValueError(f"aggregation must be one of {', '.join(AGGREGATORS)}, got {cfg.aggregation!r}") from None
    if noise_std == 0:
        return factory(cfg, clip_norm, 0.0)
    ratio = sensitivity_ratio(factory(cfg, clip_norm, 0.0), neighbouring)
    return factory(cfg, clip_norm, noise_std * ratio)
