"""``privacy = "dpftrl"``: a trusted server adds correlated noise (DP-FTRL, the matrix mechanism).

Round t's released sum is ``sum of clipped updates + w_t`` with ``w_t = (C^{-1} z)_t``
(:class:`fedprivacy.dp.matrix.StreamingNoise`), ``z ~ N(0, (z_mult * clip_norm * s)^2)`` and C the banded
square root of the server optimizer's workload (prefix sums, with ``server-momentum`` for fedavgm;
Kalinin & Lampert 2024) or, with ``dpftrl-factorization = "blt"``, a BLT optimized for it and the
schema (:mod:`fedprivacy.dp.matrix.blt`; sample-rate 1 only, not banded). The released stream ``x + C^{-1} z`` is an invertible function of
``C x + z``, so everything after it (denominator, server optimizer) is post-processing; adaptively
chosen updates are covered for lower-triangular C (Denisov et al. 2022, Theorem 2.1).

Cohorts: clients are split into ``dpftrl-groups`` g fixed groups by partition id (``id mod g``);
round t (1-based) trains group ``(t - 1) mod g``, every client of it at ``sample-rate`` 1
(schema ``MinSeparation(g, ceil(T/g))``), else each Poisson-sampled at q (``CyclicPoisson(g, q)``,
band <= g; Choquette-Choo et al. 2023, arXiv 2306.08153, Theorem 4).

Accounting: the whole horizon's event (:meth:`fedprivacy.dp.matrix.MatrixMechanism.dp_event`, in
fedprivacy's event model) is charged once, before round 1's release; rounds 2..T charge
:class:`fedprivacy.accounting.events.ChargedAhead` (no further loss). Every round therefore reports
ε_T: valid and conservative. A prefix of t < T rounds is not bounded by a share of ε_T (band 1, one
group: round 1 alone has all of it), and a per-round prefix charge would need the prefix sensitivity
of every schema proven: not done. The budget (``target-epsilon``) is checked for the whole horizon
before anything starts; calibration bisects z on the run's own accountant (never overshoots).

Over secure aggregation (``secagg = true``, whole groups only) the server adds ``w_t`` to the unmasked
sum: :mod:`fedprivacy.fl.modes.dpftrl_secure`. Refused: adaptive clipping, robust rules, DP-SGD
clients, fixed cohorts, replace-one, resume (the noise state is a secret this mode does not checkpoint).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedprivacy.dp.clipping import flatten, unflatten
from fedprivacy.fl.aggregation import Aggregator, PlainAggregator
from fedprivacy.fl.mechanisms import ServerMechanism
from fedprivacy.fl.modes.base import Disclosure, Transport, exchange_of, secure_round
from fedprivacy.fl.modes.dpftrl_secure import SAMPLE_RATE_REFUSAL
from fedprivacy.fl.modes.plain import CentralMode
from fedprivacy.fl.privacy import PrivacyPlan
from fedprivacy.fl.types import CorrelatedDraw, RoundFn, RoundInstructions, RoundOutcome

if TYPE_CHECKING:
    from fedprivacy.accounting.events import Mechanism, PrivacyEvent, Sampling
    from fedprivacy.config import RunConfig
    from fedprivacy.dp.matrix import (
        BandedToeplitz,
        Blt,
        MatrixMechanism,
        Schema,
        StreamingNoise,
        Workload,
    )
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.fl.types import Exchange

__all__ = ["BLT_SAMPLE_RATE_REFUSAL", "CORRELATED", "CorrelatedNoise", "DpftrlMode", "DpftrlRound", "cached_blt",
           "matrix_mechanism"]

_PRIVATE = ("per-round client counts, the train loss and the rounds' wall times are left out of the published "
            "outputs (ε covers none of them); the server keeps them in its private log")


@dataclasses.dataclass(frozen=True, slots=True)
class CorrelatedNoise:
    """The server's correlated Gaussian: ``(C^{-1} z)_t`` on round t's clipped sum; its event is the
    whole horizon's ``Gaussian(z)`` (the sensitivity of C under the schema is in the std of z)."""

    name: str = "correlated-gaussian"

    def noise_std(self, *, clip_norm: float, noise_multiplier: float) -> float:
        """Not defined without the strategy: the plan's ``correlated`` mechanism has it."""
        raise ValueError("correlated noise's std depends on the factorization: use required_noise_std(plan)")

    def required_noise_std(self, plan: PrivacyPlan) -> float:
        """The std of the innovations z_t the charged event needs: ``z * clip_norm * sensitivity``."""
        if plan.correlated is None:
            raise ValueError("a correlated-noise plan must carry its matrix mechanism")
        return plan.correlated.noise_std(plan.clip_norm)

    def event(self, *, noise_multiplier: float, clip_norm: float, dim: int | None) -> Mechanism:
        from fedprivacy.accounting.events import GaussianEvent

        return GaussianEvent(noise_multiplier=noise_multiplier)

    def stream(self, plan: PrivacyPlan, *, dim: int, rng: RandomSource) -> StreamingNoise:
        """The noise stream of a run (its state is as secret as the noise)."""
        from fedprivacy.dp.matrix import StreamingNoise

        assert plan.correlated is not None
        return StreamingNoise(plan.correlated.strategy, dim=dim, noise_std=self.required_noise_std(plan), rng=rng)


CORRELATED = CorrelatedNoise()


def schema_of(cfg: RunConfig) -> Schema:
    """The participation schema the cohorts follow (the sampler below enforces it)."""
    from fedprivacy.dp.matrix import CyclicPoisson, MinSeparation

    g, rounds = cfg.dpftrl_groups, cfg.num_server_rounds
    if cfg.sample_rate >= 1.0:
        return MinSeparation(min_separation=g, max_participations=-(-rounds // g))
    return CyclicPoisson(num_groups=g, sample_rate=cfg.sample_rate)


def matrix_mechanism(cfg: RunConfig, noise_multiplier: float) -> MatrixMechanism:
    """The configured strategy, schema and multiplier (ValueError naming the key it cannot honour)."""
    from fedprivacy.dp.matrix import CyclicPoisson, MatrixMechanism, MinSeparation, Workload, bsr

    momentum = cfg.server_momentum if cfg.server_optimizer == "fedavgm" else 0.0
    workload = Workload(num_rounds=cfg.num_server_rounds, momentum=momentum)
    schema = schema_of(cfg)
    if cfg.dpftrl_factorization == "blt":
        if not isinstance(schema, MinSeparation):  # cyclic Poisson: sample-rate < 1
            raise ValueError(BLT_SAMPLE_RATE_REFUSAL)
        strategy: BandedToeplitz | Blt = cached_blt(workload, num_buffers=cfg.dpftrl_buffers,
                                                    min_sep=schema.min_separation,
                                                    max_participations=schema.max_participations)
    else:
        strategy = bsr(workload, cfg.dpftrl_band)
    if isinstance(schema, CyclicPoisson) and cfg.dpftrl_band > cfg.dpftrl_groups:
        raise ValueError(f"dpftrl-band must be <= dpftrl-groups when sample-rate < 1 (cyclic Poisson "
                         f"amplification needs it), got band {cfg.dpftrl_band} > groups {cfg.dpftrl_groups}")
    try:
        return MatrixMechanism(strategy=strategy, schema=schema, noise_multiplier=noise_multiplier)
    except ValueError as exc:
        key = ("dpftrl-factorization='blt'" if cfg.dpftrl_factorization == "blt"
               else f"dpftrl-band={cfg.dpftrl_band}")
        raise ValueError(f"{key}, dpftrl-groups={cfg.dpftrl_groups}: {exc}") from None


BLT_SAMPLE_RATE_REFUSAL = (
    "sample-rate must be 1 with dpftrl-factorization='blt': cyclic Poisson amplification (Choquette-Choo et "
    "al. 2023, Thm. 4) is proven for banded C with band <= dpftrl-groups only, and a BLT is not banded; set "
    "sample-rate=1 or dpftrl-factorization='bsr'")


@functools.lru_cache(maxsize=16)
def cached_blt(workload: Workload, *, num_buffers: int, min_sep: int, max_participations: int | None) -> Blt:
    """:func:`fedprivacy.dp.matrix.blt.optimize_blt`, cached on disk per (T, buffers, workload, schema).

    A cached file only chooses C; the sensitivity and ε are recomputed from the C it gives, and a BLT
    outside its monotone box (:attr:`fedprivacy.dp.matrix.Blt.in_monotone_box`, where the float column is
    the exact C) is recomputed here and refused by the sensitivity, so a stale or altered file can cost
    accuracy, never privacy. Nothing secret is stored.
    """
    import hashlib
    import json

    from fedprivacy.dp.matrix import Blt
    from fedprivacy.dp.matrix.blt import OPTIMIZER_VERSION, optimize_blt
    from fedprivacy.ml import diskcache

    spec = {"optimizer": OPTIMIZER_VERSION, "workload": workload.key(), "num_rounds": workload.num_rounds,
            "num_buffers": num_buffers, "min_sep": min_sep, "max_participations": max_participations,
            "scipy": diskcache.package_version("scipy")}
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    stored = diskcache.read("dpftrl-blt", key)
    if stored is not None and {"buf_decay", "output_scale"} <= set(stored):
        try:
            blt = Blt(num_rounds=workload.num_rounds, buf_decay=tuple(stored["buf_decay"]),
                      output_scale=tuple(stored["output_scale"]), name=f"blt-{num_buffers}")
            col = blt.column()
            if (blt.num_buffers == num_buffers and blt.in_monotone_box and np.all(col >= 0.0)
                    and np.all(np.diff(col) <= 0.0)):
                return blt  # in the box the sensitivity theorem needs; anything else is recomputed
        except (TypeError, ValueError):
            pass
    blt = optimize_blt(workload, num_buffers=num_buffers, min_sep=min_sep, max_participations=max_participations)
    diskcache.write("dpftrl-blt", key, {"buf_decay": np.asarray(blt.buf_decay),
                                        "output_scale": np.asarray(blt.output_scale)})
    return blt


def horizon_event(matrix: MatrixMechanism) -> PrivacyEvent:
    """``matrix.dp_event()`` in fedprivacy's event model: one Gaussian(z), or the DP-SGD it reduces to."""
    from fedprivacy.accounting.events import GaussianEvent, PrivacyEvent

    sampling, steps = _horizon_sampling(matrix)
    return PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=matrix.noise_multiplier),
                        sampling=sampling, count=steps)


def _horizon_sampling(matrix: MatrixMechanism) -> tuple[Sampling, int]:
    from fedprivacy.accounting.events import NoSampling, PoissonSampling
    from fedprivacy.dp.matrix import CyclicPoisson

    schema = matrix.schema
    if not isinstance(schema, CyclicPoisson):
        return NoSampling(), 1
    return PoissonSampling(rate=schema.sample_rate), -(-matrix.strategy.num_rounds // schema.num_groups)


class DpftrlRound:
    """One dpftrl round: exchange, charge, clipped sum plus ``w_t``, fixed denominator."""

    def __init__(self, exchange: Exchange, cfg: RunConfig, plan: PrivacyPlan, *,
                 mechanism: CorrelatedNoise) -> None:
        from fedprivacy.accounting.events import ChargedAhead, PrivacyEvent

        assert plan.event is not None
        self._exchange, self._plan, self._mechanism = exchange, plan, mechanism
        self._sum = PlainAggregator(clip_norm=cfg.clip_norm, noise_std=0.0)
        self._horizon = plan.event
        self._covered = PrivacyEvent(mechanism=ChargedAhead(covers=plan.event, horizon=cfg.num_server_rounds))
        self._stream: StreamingNoise | None = None

    def __call__(self, instr: RoundInstructions, cohort: Sequence[int], weights: Sequence[np.ndarray],
                 rng: RandomSource) -> RoundOutcome:
        from fedprivacy.fl.charging import before_release

        updates, failures = self._exchange(instr, cohort, weights)
        first = self._stream is None or self._stream.round == 0
        event = self._horizon if first else self._covered
        before_release(event)
        plan = self._plan
        clean = self._sum.aggregate(updates, like=weights, denominator=1.0, rng=rng)
        if self._stream is None:
            dim = int(sum(np.size(w) for w in weights))
            self._stream = self._mechanism.stream(plan, dim=dim, rng=rng.child("dpftrl-noise"))
        noised = flatten(clean.mean_update, dtype=np.float64) + self._stream.next()
        mean = unflatten(noised / plan.denominator, like=weights)
        draw = CorrelatedDraw(covers=self._horizon, index=self._stream.round)
        agg = dataclasses.replace(clean, mean_update=tuple(mean), noise_std=self._stream.noise_std,
                                  denominator=plan.denominator, correlated_draw=draw)
        # the event this round charged (a round function used outside a run is charged it afterwards)
        return RoundOutcome(aggregate=agg, failures=dict(failures), updates=tuple(updates), event=event)


_REFUSED: tuple[tuple[str, Callable[[RunConfig], bool], str], ...] = (
    ("sample-rate", lambda c: c.secagg and c.sample_rate < 1.0, SAMPLE_RATE_REFUSAL),
    ("adaptive-clip", lambda c: c.adaptive_clip, "adaptive-clip=true with privacy='dpftrl' is not implemented "
     "(the sensitivity of C is in clip-norm units); set adaptive-clip=false"),
    ("aggregation", lambda c: c.aggregation != "plain", "aggregation must be 'plain' with privacy='dpftrl' "
     "(the sensitivity is the clipped sum's)"),
    ("dpsgd", lambda c: c.dpsgd, "dpsgd=true with privacy='dpftrl' is not implemented; set dpsgd=false"),
    ("sampling", lambda c: c.sampling != "poisson", "sampling must be 'poisson' with privacy='dpftrl' (the "
     "cohorts are the fixed groups, Poisson-sampled at sample-rate)"),
    ("neighbouring", lambda c: c.neighbouring != "add-remove", "neighbouring must be 'add-remove' with "
     "privacy='dpftrl' (the matrix mechanism's sensitivity is one client added or removed)"),
    ("resume", lambda c: c.resume, "resume=true with privacy='dpftrl' is refused: the correlated noise's state "
     "is not checkpointed, and restarting it would reuse or drop noise"),
)


class DpftrlMode(CentralMode):
    """A trusted server adds streamed correlated noise to the sum of clipped updates (DP-FTRL)."""

    name = "dpftrl"
    mechanism = "correlated Gaussian on the sum of clipped updates (DP-FTRL, matrix factorization)"
    server_mechanism: ServerMechanism | None = CORRELATED
    covers: tuple[str, ...] = (
        "- Covers: the sequence of released global models (and anything computed from them), against "
         "anyone who sees them, for the unit above: one ε for the whole horizon of num-server-rounds rounds, "
         "charged before round 1 and reported by every round.",
        "- Trusts: the server. It sees each sampled client's clipped, un-noised update and the noise state.",
        "- Does not cover: the train loss, per-round counts and timing (kept in the server's private log).",
        "- Assumes: the groups (partition id mod dpftrl-groups) are public; with sample-rate < 1 who was "
        "sampled within a group stays secret (the ε uses amplification by that sampling).",
    )

    def check(self, cfg: RunConfig) -> None:
        for _key, refused, line in _REFUSED:
            if refused(cfg):
                raise ValueError(line)
        if cfg.noise_multiplier == 0 and cfg.target_epsilon == 0:
            raise ValueError("noise-multiplier must be > 0 (or target-epsilon > 0 to calibrate it) when "
                             f"privacy='dpftrl', got {cfg.noise_multiplier}")
        if isinstance(cfg.dpftrl_buffers, bool) or not isinstance(cfg.dpftrl_buffers, int) \
                or cfg.dpftrl_buffers < 1:
            raise ValueError(f"dpftrl-buffers must be an integer >= 1, got {cfg.dpftrl_buffers!r}")
        if cfg.dpftrl_factorization == "blt" and cfg.dpftrl_band != 1:
            raise ValueError(f"dpftrl-band applies to dpftrl-factorization='bsr' only, got {cfg.dpftrl_band} with "
                             "'blt' (a BLT is not banded: set dpftrl-buffers, and dpftrl-band=1)")
        if cfg.dpftrl_band > cfg.num_server_rounds:
            raise ValueError(f"dpftrl-band must be <= num-server-rounds={cfg.num_server_rounds}, got "
                             f"{cfg.dpftrl_band}")
        matrix_mechanism(cfg, cfg.noise_multiplier or 1.0)  # the schema's hypotheses, before anything starts

    def covers_for(self, cfg: RunConfig) -> tuple[str, ...]:
        """The report's lines: over secure aggregation the server sees only the exact sum."""
        from fedprivacy.fl.modes.dpftrl_secure import COVERS

        return COVERS if cfg.secagg else self.covers

    def disclosure(self, cfg: RunConfig) -> Disclosure:
        if cfg.publish_participation:
            return super().disclosure(cfg)
        return Disclosure(participation=False, unnoised=False, note=_PRIVATE)

    def sample_cohort(self, cfg: RunConfig, *, population: int, round: int, rng: RandomSource) -> list[int]:
        """Round ``round`` (1-based): group ``(round - 1) mod g``, each member Poisson-sampled at q
        (all of it at q = 1): :func:`fedprivacy.dp.matrix.participation.cyclic_poisson_cohort`."""
        from fedprivacy.dp.matrix import CyclicPoisson
        from fedprivacy.dp.matrix.participation import cyclic_poisson_cohort

        schema = CyclicPoisson(num_groups=cfg.dpftrl_groups, sample_rate=cfg.sample_rate)
        return cyclic_poisson_cohort(range(population), schema=schema, round_index=round - 1, rng=rng)

    def plan(self, cfg: RunConfig, *, population: int, dim: int | None = None) -> PrivacyPlan:
        from fedprivacy.accounting.events import Neighbouring

        if cfg.dpftrl_groups > population:
            raise ValueError(f"dpftrl-groups must be <= the number of clients ({population}), got "
                             f"{cfg.dpftrl_groups}: a group would be empty")
        sigma, calibrated = self._calibrated(cfg)
        matrix = matrix_mechanism(cfg, sigma)
        event = horizon_event(matrix)
        _check_accountant(cfg, event)
        claim = matrix.claim()
        plan = PrivacyPlan(
            mode=self.name, population=population,
            denominator=cfg.sample_rate * population / cfg.dpftrl_groups, clip_norm=cfg.clip_norm,
            noise_multiplier=sigma, calibrated=calibrated, central_noise_std=matrix.noise_std(cfg.clip_norm),
            local_noise_std=0.0, unit="user (all data of one client)",
            neighbouring=Neighbouring.ADD_REMOVE.value,
            sampling_description=f"{claim['schema']} (groups: partition id mod {cfg.dpftrl_groups})",
            event=event, target_delta=cfg.target_delta,
            # the budget is the whole horizon's, checked here; the in-loop check would re-project it
            target_epsilon=0.0, mechanism=f"{self.mechanism}: {claim['factorization']}", correlated=matrix)
        if not cfg.secagg:
            return plan
        from fedprivacy.fl.modes.dpftrl_secure import secure_dpftrl_plan

        return secure_dpftrl_plan(cfg, plan, population=population, dim=dim)

    def _calibrated(self, cfg: RunConfig) -> tuple[float, bool]:
        """z as configured (its ε_T checked against target-epsilon), or the smallest that meets it."""
        from fedprivacy.accounting.accountant import epsilon_for
        from fedprivacy.accounting.calibration import calibrate_noise_multiplier

        sampling, steps = _horizon_sampling(matrix_mechanism(cfg, cfg.noise_multiplier or 1.0))
        if cfg.noise_multiplier > 0:
            if cfg.target_epsilon > 0:
                eps = epsilon_for(noise_multiplier=cfg.noise_multiplier, sampling=sampling, steps=steps,
                                  delta=cfg.target_delta, backend=cfg.accountant)
                if eps > cfg.target_epsilon:
                    raise ValueError(f"target-epsilon {cfg.target_epsilon:g} is below the run's ε {eps:.4g} at "
                                     f"noise-multiplier={cfg.noise_multiplier:g} (charged before round 1); "
                                     "raise noise-multiplier or set it to 0 to calibrate")
            return cfg.noise_multiplier, False
        sigma = calibrate_noise_multiplier(target_epsilon=cfg.target_epsilon, target_delta=cfg.target_delta,
                                           sampling=sampling, steps=steps, backend=cfg.accountant)
        return float(sigma), True

    def round_fn(self, cfg: RunConfig, plan: PrivacyPlan, transport: Transport, *,
                 aggregator: Aggregator | None = None, log: Callable[[str], None] = print) -> RoundFn:
        if aggregator is not None:
            raise ValueError("privacy='dpftrl' sums the clipped updates itself; a custom aggregator is refused")
        mechanism = self.server_mechanism
        if not isinstance(mechanism, CorrelatedNoise):
            raise TypeError(f"privacy mode {self.name!r} needs a CorrelatedNoise server mechanism, got {mechanism!r}")
        if cfg.secagg:  # the server adds w_t to the unmasked sum (fedprivacy.fl.modes.dpftrl_secure)
            from fedprivacy.fl.modes.dpftrl_secure import server_noise

            return secure_round(cfg, plan, transport, aggregator=None, log=log, denominator=plan.denominator,
                                server_noise=server_noise(plan, num_rounds=cfg.num_server_rounds))
        return DpftrlRound(exchange_of(transport, cfg), cfg, plan, mechanism=mechanism)

    def summary(self, cfg: RunConfig, plan: PrivacyPlan, records: Any, *, accountant: Any,
                rng: RandomSource) -> dict[str, Any]:
        from fedprivacy.fl.modes.base import privacy_block

        block = privacy_block(cfg, plan, accountant, rng)
        if plan.correlated is not None:
            block["noise_std"] = plan.central_noise_std  # of the innovations z_t (w_t = (C^-1 z)_t)
            block["correlated"] = {**plan.correlated.claim(), "accounting": (
                "the whole horizon's event charged once before round 1; every round reports that ε")}
        return block


def _check_accountant(cfg: RunConfig, event: PrivacyEvent) -> None:
    """Refuse an accountant that cannot compose the horizon's event and the rounds after it."""
    from fedprivacy.accounting.accountant import Accountant
    from fedprivacy.accounting.events import ChargedAhead, Neighbouring, PrivacyEvent

    acc = Accountant(backend=cfg.accountant, neighbouring=Neighbouring.ADD_REMOVE, unit="user")
    for ev in (event, PrivacyEvent(mechanism=ChargedAhead(covers=event, horizon=cfg.num_server_rounds))):
        reason = acc.unsupported_reason(ev)
        if reason is not None:
            raise ValueError(f"accountant={cfg.accountant!r} cannot account privacy='dpftrl': {reason}")
