"""The DP-FedAvg round loop, transport-free: sampling, budget check, round, accounting, outputs.

The Flower ServerApp (``server/loop.py``) supplies only the transport: a function that runs one round
for a cohort of partition ids and returns a :class:`RoundOutcome`. The same loop therefore runs under
Flower's simulation, the Deployment Engine, the in-process engine or a plain function in a test.

Per round ``r`` (McMahan et al. 2018, Alg. 1 "DP-FedAvg", with the noise placement of the privacy mode):

1. budget check *before* any release: if the round's event would overspend ``(target-epsilon,
   target-delta)``, stop cleanly and say so;
2. sample partition ids with ``RandomSource(...).child("server", r)`` exactly as the plan reports;
3. run the round (clients train, clip, maybe noise; the aggregator sums, maybe noises, divides by the
   fixed denominator);
4. spend the event that really ran (``RoundOutcome.event`` overrides the plan, e.g. distributed DP with
   the survivors' noise), update the global model, evaluate on the server's held-out test set;
5. checkpoint (model + ledger + rows) atomically; one console line.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedprivacy.fl.aggregation import AggregateResult, Aggregator, ClientUpdate, make_aggregator
from fedprivacy.fl.checkpoint import load_checkpoint, save_checkpoint
from fedprivacy.fl.client import RoundInstructions
from fedprivacy.fl.outputs import write_outputs
from fedprivacy.fl.privacy import PrivacyPlan, make_accountant, plan_privacy
from fedprivacy.fl.sampling import fixed_cohort_sample, poisson_sample

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig
    from fedprivacy.dp.rng import RandomSource

# Config keys that may differ between a run and its resumption.
RESUMABLE_CHANGES = frozenset({"resume", "num-server-rounds", "client-timeout"})


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
        info: extra per-round figures for the results row (e.g. secagg survivors, noise of the sum).
    """

    aggregate: AggregateResult
    failures: dict[int, str] = field(default_factory=dict)
    updates: tuple[ClientUpdate, ...] = ()
    event: Any = None
    aborted: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


Exchange = Callable[[RoundInstructions, Sequence[int], Sequence[np.ndarray]],
                    tuple[Sequence[ClientUpdate], dict[int, str]]]
RoundFn = Callable[[RoundInstructions, Sequence[int], Sequence[np.ndarray], "RandomSource"], RoundOutcome]


def plain_round(exchange: Exchange, aggregator: Aggregator, *, denominator: float) -> RoundFn:
    """A round = one exchange of train messages, then aggregation in the clear (or with server noise)."""

    def run(instr: RoundInstructions, cohort: Sequence[int], weights: Sequence[np.ndarray],
            rng: RandomSource) -> RoundOutcome:
        updates, failures = exchange(instr, cohort, weights)
        agg = aggregator.aggregate(updates, like=weights, denominator=denominator, rng=rng)
        return RoundOutcome(aggregate=agg, failures=dict(failures), updates=tuple(updates))

    return run


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelHooks:
    """The ML operations the loop needs (defaults: :mod:`fedprivacy.fl.task`)."""

    init: Callable[[int], list[np.ndarray]]
    evaluate: Callable[[Sequence[np.ndarray]], tuple[float, float]]
    num_classes: int


def default_hooks(cfg: RunConfig, *, population: int) -> ModelHooks:
    from fedprivacy.fl import task

    test = task.test_set(cfg, num_partitions=population)
    k = task.num_classes_for(cfg, num_partitions=population)
    return ModelHooks(
        init=lambda seed: task.initial_weights(cfg, input_shape=test.feature_shape, num_classes=k, seed=seed),
        evaluate=lambda w: task.evaluate_weights(cfg, w, test, num_classes=k),
        num_classes=k,
    )


def root_source(cfg: RunConfig) -> RandomSource:
    from fedprivacy.dp.rng import RandomSource

    return RandomSource.seeded(cfg.seed) if cfg.seeded else RandomSource.secure()


def sample_cohort(cfg: RunConfig, population: Sequence[int], rng: RandomSource) -> list[int]:
    if cfg.sampling == "fixed":
        return fixed_cohort_sample(population, cohort_size=cfg.cohort_size, rng=rng)
    return poisson_sample(population, sample_rate=cfg.sample_rate, rng=rng)


def resolve_run_dir(cfg: RunConfig) -> Path:
    base = Path(cfg.output_dir)
    if cfg.run_name:
        return base / cfg.run_name
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate, i = base / stamp, 1
    while candidate.exists():
        candidate, i = base / f"{stamp}-{i}", i + 1
    return candidate


def _fmt_eps(eps: float | None) -> str:
    return "n/a (no DP)" if eps is None else f"{eps:.3f}"


class _DpsgdLedger:
    """Per-client sample-level accountants for DP-SGD (unit: one training example)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.accountants: dict[int, Any] = {}

    def spend(self, pid: int, *, steps: int, rate: float, round: int) -> None:
        from fedprivacy.accounting.accountant import Accountant
        from fedprivacy.accounting.events import GaussianEvent, PoissonSampling, PrivacyEvent

        if steps < 1 or not 0 < rate <= 1:
            return
        acc = self.accountants.get(pid)
        if acc is None:
            acc = self.accountants[pid] = Accountant(backend=self.cfg.accountant, unit="example")
        event = PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=self.cfg.dpsgd_noise_multiplier),
                             sampling=PoissonSampling(rate=rate), count=steps)
        acc.spend(event, round=round)

    def epsilon(self) -> float | None:
        if not self.accountants:
            return None
        return max(a.epsilon(delta=self.cfg.target_delta) for a in self.accountants.values())

    def to_json(self) -> dict[str, Any]:
        return {str(k): v.to_json() for k, v in self.accountants.items()}

    def load(self, data: dict[str, Any]) -> None:
        from fedprivacy.accounting.accountant import Accountant

        self.accountants = {int(k): Accountant.from_json(v) for k, v in data.items()}


def run_federated(
    cfg: RunConfig,
    *,
    population: int,
    round_fn: RoundFn | None = None,
    exchange: Exchange | None = None,
    hooks: ModelHooks | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run (or resume) the whole federated training; returns the results dict (also written to disk).

    Args:
        cfg: the validated run config.
        population: number of partitions N; partition ids are ``0..N-1``.
        round_fn: runs one round (takes precedence over ``exchange``).
        exchange: sends train instructions to a cohort and returns ``(updates, failures)``; the loop
            wraps it with the mode's aggregator (:func:`plain_round`).
        hooks: model init/evaluation (defaults to :mod:`fedprivacy.fl.task` on the configured data).
        log: where the per-round console lines go.
    """
    started = time.perf_counter()
    plan = plan_privacy(cfg, population=population)
    if round_fn is None:
        if exchange is None:
            raise ValueError("give either round_fn or exchange")
        if cfg.secagg:  # never fall back to sending updates in the clear
            raise ValueError("secagg=true needs the secure round function (fedprivacy.fl.secure.SecureRound)")
        aggregator = make_aggregator(cfg.privacy, clip_norm=cfg.clip_norm,
                                     noise_multiplier=plan.noise_multiplier, cfg=cfg)
        round_fn = plain_round(exchange, aggregator, denominator=plan.denominator)
    hooks = hooks or default_hooks(cfg, population=population)
    root = root_source(cfg)
    run_dir = resolve_run_dir(cfg)
    ckpt_dir = run_dir / "checkpoint"
    ids = list(range(population))
    dpsgd = _DpsgdLedger(cfg) if cfg.dpsgd else None

    ckpt = load_checkpoint(ckpt_dir) if ckpt_dir.exists() else None
    if ckpt is not None and not cfg.resume:
        raise ValueError(
            f"run-name {cfg.run_name!r}: {run_dir} already holds a run; set resume=true to continue it "
            "or choose another run-name"
        )
    if ckpt is not None:
        _check_resume_config(ckpt.config, cfg)
        weights = [np.asarray(w) for w in ckpt.weights]
        rows = list(ckpt.rows)
        start = ckpt.round + 1
        accountant = None
        if plan.event is not None:
            from fedprivacy.accounting.accountant import Accountant

            if ckpt.ledger_path is None:
                raise ValueError(f"checkpoint in {ckpt_dir} has no privacy ledger")
            accountant = Accountant.load(ckpt.ledger_path)
        if dpsgd is not None:
            dpsgd.load(ckpt.extra.get("dpsgd", {}))
        log(f"resuming {run_dir} after round {ckpt.round}")
    else:
        init_seed = int(root.child("server", "init").integers(0, 2**31 - 1))
        weights = [np.asarray(w) for w in hooks.init(init_seed)]
        rows = []
        start = 1
        accountant = make_accountant(cfg, plan)

    log(f"fedprivacy: {population} clients, {cfg.num_server_rounds} rounds, dataset={cfg.dataset}, "
        f"model={cfg.model}, output={run_dir}")
    log(plan.describe())
    log(f"randomness: {root.describe()}")

    status, stopped = "completed", None
    for rnd in range(start, cfg.num_server_rounds + 1):
        t0 = time.perf_counter()
        if accountant is not None and accountant.would_exceed(plan.event):
            eps_next = accountant.epsilon_if(plan.event, delta=cfg.target_delta)
            stopped = (f"stopped before round {rnd}: it would raise ε to {eps_next:.4f} > target-epsilon "
                       f"{cfg.target_epsilon:g} at δ={cfg.target_delta:g}")
            status = "budget-exhausted"
            log(stopped)
            break
        rng = root.child("server", rnd)
        cohort = sample_cohort(cfg, ids, rng.child("sampling"))
        instr = RoundInstructions(
            round=rnd, privacy=cfg.privacy, clip_norm=cfg.clip_norm,
            local_noise_std=plan.local_noise_std, learning_rate=cfg.learning_rate,
            local_epochs=cfg.local_epochs, batch_size=cfg.batch_size,
            num_classes=hooks.num_classes, seed=cfg.seed,
        )
        outcome = round_fn(instr, cohort, weights, rng.child("aggregate"))
        if outcome.aborted is not None:  # secagg: nothing released, nothing spent, model unchanged
            log(f"round {rnd:3d}/{cfg.num_server_rounds}  ABORTED: {outcome.aborted}; nothing released, "
                "no ε spent, global model unchanged")
        elif accountant is not None:
            from fedprivacy.accounting.accountant import PrivacyBudgetExhausted

            try:
                accountant.spend(outcome.event if outcome.event is not None else plan.event, round=rnd)
            except PrivacyBudgetExhausted as exc:
                # Only reachable if a round function reports an event worse than the plan's worst case
                # (a contract violation): the aggregate is discarded, never applied or published.
                stopped = f"round {rnd} discarded, its event exceeds the budget: {exc}"
                status = "budget-exhausted"
                log(stopped)
                break
        agg = outcome.aggregate
        weights = [(np.asarray(w, dtype=np.float64) + np.asarray(u, dtype=np.float64)).astype(np.asarray(w).dtype)
                   for w, u in zip(weights, agg.mean_update, strict=True)]
        test_loss, test_acc = hooks.evaluate(weights)
        for pid, reason in sorted({**outcome.failures, **agg.dropped}.items()):
            log(f"  round {rnd}: client {pid} left out: {reason}")
        in_sum = set(agg.aggregated)
        train_loss = _weighted_loss([u for u in outcome.updates if u.partition_id in in_sum])
        if dpsgd is not None:
            for u in outcome.updates:
                if u.partition_id in in_sum and "dpsgd_steps" in u.metrics:
                    dpsgd.spend(u.partition_id, steps=int(u.metrics["dpsgd_steps"]),
                                rate=float(u.metrics.get("dpsgd_sample_rate", 0.0)), round=rnd)
        eps = accountant.epsilon(delta=cfg.target_delta) if accountant is not None else None
        row: dict[str, Any] = {
            "round": rnd,
            "clients_sampled": len(cohort),
            "clients_aggregated": len(agg.aggregated),
            "train_loss": train_loss,
            "test_loss": float(test_loss),
            "test_accuracy": float(test_acc),
            "epsilon": eps,
            "delta": cfg.target_delta if accountant is not None else None,
            "seconds": time.perf_counter() - t0,
        }
        if dpsgd is not None:
            row["dpsgd_epsilon"] = dpsgd.epsilon()
        row.update(outcome.info)  # secagg figures (survivors, noise of the sum, aborted)
        rows.append(row)
        save_checkpoint(ckpt_dir, round=rnd, weights=weights, accountant=accountant, rows=rows,
                        config=cfg.to_mapping(),
                        extra={"dpsgd": dpsgd.to_json()} if dpsgd is not None else None)
        sample_level = ""
        if dpsgd is not None and row.get("dpsgd_epsilon") is not None:
            sample_level = f"  (example-level DP-SGD ε {row['dpsgd_epsilon']:.3f}, worst client)"
        log(f"round {rnd:3d}/{cfg.num_server_rounds}  accuracy {test_acc:.4f}  loss {test_loss:.4f}  "
            f"ε {_fmt_eps(eps)}  clients {len(agg.aggregated)}/{len(cohort)}  {row['seconds']:.2f}s"
            f"{sample_level}")

    results = build_results(cfg, plan=plan, rows=rows, accountant=accountant, rng=root, status=status,
                            stopped=stopped, run_dir=run_dir, dpsgd=dpsgd,
                            seconds=time.perf_counter() - started)
    from fedprivacy.report import privacy_report_md

    paths = write_outputs(run_dir, results, report_md=privacy_report_md(results))
    final = rows[-1] if rows else {}
    log(f"done: {len(rows)} rounds, accuracy {final.get('test_accuracy', float('nan')):.4f}, "
        f"ε {_fmt_eps(results['privacy'].get('epsilon'))}; results in {paths['results']}")
    return results


def _weighted_loss(updates: Sequence[ClientUpdate]) -> float | None:
    pairs = [(u.train_loss, u.num_examples or 1) for u in updates
             if u.train_loss is not None and math.isfinite(u.train_loss)]
    if not pairs:
        return None
    total = sum(n for _, n in pairs)
    return float(sum(loss * n for loss, n in pairs) / total)


def _check_resume_config(saved: dict[str, Any], cfg: RunConfig) -> None:
    current = cfg.to_mapping()
    for key in sorted(set(saved) | set(current)):
        if key in RESUMABLE_CHANGES:
            continue
        if saved.get(key) != current.get(key):
            raise ValueError(
                f"{key} differs from the checkpointed run ({saved.get(key)!r} != {current.get(key)!r}); "
                "a resumed run must use the same config"
            )


def build_results(
    cfg: RunConfig,
    *,
    plan: PrivacyPlan,
    rows: list[dict[str, Any]],
    accountant: Any,
    rng: RandomSource,
    status: str,
    stopped: str | None,
    run_dir: Path,
    dpsgd: _DpsgdLedger | None,
    seconds: float,
) -> dict[str, Any]:
    rng_mode = "seeded" if cfg.seeded else "secure"
    if accountant is None:
        privacy: dict[str, Any] = {"mode": "none", "epsilon": None, "delta": None, "unit": "none",
                                   "rng_mode": rng_mode, "rng": rng.describe()}
    else:
        eps = accountant.epsilon(delta=cfg.target_delta)
        steps = accountant.steps
        privacy = {
            "mode": plan.mode,
            "unit": plan.unit,
            "adjacency": plan.adjacency_label,
            "mechanism": plan.mechanism or (
                "Gaussian on the sum of clipped updates (server-side noise)" if plan.mode == "central"
                else "Gaussian on each clipped update (client-side noise)"),
            "clip_norm": plan.clip_norm,
            "noise_multiplier": plan.noise_multiplier,
            "noise_std": plan.noise_multiplier * plan.clip_norm,
            "calibrated": plan.calibrated,
            "sampling": plan.sampling_description,
            "sample_rate": cfg.sample_rate if cfg.sampling == "poisson" else None,
            "cohort_size": cfg.cohort_size if cfg.sampling == "fixed" else None,
            "population": plan.population,
            "denominator": plan.denominator,
            "rounds": steps,
            "accountant": cfg.accountant,
            "epsilon": eps,
            "delta": cfg.target_delta,
            "budget": (f"ε ≤ {cfg.target_epsilon:g} at δ = {cfg.target_delta:g}" if cfg.target_epsilon > 0
                       else None),
            "rng_mode": rng_mode,
            "rng": rng.describe(),
        }
        try:
            privacy["accountant_claim"] = accountant.claim(delta=cfg.target_delta)
        except Exception as exc:  # the claim is a convenience; never lose the results over it
            privacy["accountant_claim"] = {"error": str(exc)}
        if plan.mode == "distributed":  # the noise the survivors really added (fedprivacy.fl.secure)
            from fedprivacy.fl.secure import distributed_privacy_summary

            privacy.update(distributed_privacy_summary(cfg, plan, rows, epsilon=eps))
    results: dict[str, Any] = {
        "run_name": run_dir.name,
        "run_dir": str(run_dir),
        "status": status,
        "stopped": stopped,
        "population": plan.population,
        "config": cfg.to_mapping(),
        "resolved": {"noise_multiplier": plan.noise_multiplier, "calibrated": plan.calibrated,
                     "denominator": plan.denominator, "population": plan.population},
        "rounds": rows,
        "privacy": privacy,
        "seconds": seconds,
    }
    if dpsgd is not None:
        results["dpsgd"] = {
            "unit": "example (one training example of one client), per client, worst client",
            "epsilon": dpsgd.epsilon(),
            "delta": cfg.target_delta,
            "noise_multiplier": cfg.dpsgd_noise_multiplier,
            "max_grad_norm": cfg.dpsgd_max_grad_norm,
            "accountant": cfg.accountant,
            "note": ("Composed over every round the client took part in, Poisson sampling at the "
                     "client's DP-SGD rate; only disclosed in modes none/central."),
        }
    return results
