"""The DP-FedAvg run, transport-free: :class:`FederatedRun`, the loop over its seams.

The Flower ServerApp (``server/loop.py``) supplies only the transport; the same run works under
Flower's simulation, the Deployment Engine, the in-process engine or plain functions in a test or a
notebook. Seams, each an object that can be swapped:

* ``mode`` (:class:`fedprivacy.fl.modes.PrivacyMode`): the plan, the round function, the claim;
* ``aggregator`` (:class:`fedprivacy.fl.aggregation.Aggregator`): the aggregation rule of plain rounds;
* ``server_optimizer`` (:class:`fedprivacy.fl.server_opt.ServerOptimizer`): FedAvg's ``w + Δ̄`` by default;
* ``hooks`` (:class:`fedprivacy.fl.types.ModelHooks`): model init and central evaluation;
* ``callbacks`` (:mod:`fedprivacy.fl.callbacks`): console lines, checkpoints, output files.

The run's parts: the write-ahead ledger (:mod:`fedprivacy.fl.journal`), the resume checks
(:mod:`fedprivacy.fl.resume`), the disclosure rules (:mod:`fedprivacy.fl.disclosure`), the DP-SGD
ledgers (:mod:`fedprivacy.fl.dpsgd_ledger`) and the results (:mod:`fedprivacy.fl.results`).
Per round ``r`` (McMahan et al. 2018, Alg. 1 "DP-FedAvg", with the noise placement of the mode):

1. budget check *before* any release: if the round's event would overspend ``(target-epsilon,
   target-delta)``, stop cleanly and say so;
2. sample partition ids with ``RandomSource(...).child("server", r)`` exactly as the plan reports;
   with DP-SGD (modes none/central) every sampled client's planned example-level spend is written to
   the private DP-SGD journal before any instruction is sent;
3. run the round; at its release point (:mod:`fedprivacy.fl.charging`) the event is charged through
   the write-ahead journal (fsync'd) before anything can be seen;
4. :meth:`FederatedRun.charge_before_release`: the fallback charge for a round function without a
   release point, and a check that what ran (``RoundOutcome.event``) is what was charged;
5. the server optimizer updates the global model; central evaluation; the round's record;
6. callbacks (checkpoint, console line).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedprivacy.fl.aggregation import Aggregator
from fedprivacy.fl.byzantine import BackdoorProbe, note_byzantine
from fedprivacy.fl.callbacks import RunCallback, default_callbacks
from fedprivacy.fl.disclosure import RunDisclosure
from fedprivacy.fl.dpsgd_ledger import DpsgdLedger
from fedprivacy.fl.journal import WriteAheadJournal
from fedprivacy.fl.mechanisms import check_release
from fedprivacy.fl.modes import PrivacyMode, Transport, get_mode, plan_privacy
from fedprivacy.fl.privacy import PrivacyPlan, make_accountant
from fedprivacy.fl.results import Results, RunResult, RunStatus
from fedprivacy.fl.resume import ResumePolicy
from fedprivacy.fl.round_end import failure_stop, left_out, weighted_loss
from fedprivacy.fl.round_inputs import Inputs, RoundInputs, root_source
from fedprivacy.fl.run_files import (
    append_participation,
    read_participation,
    resolve_run_dir,
    round_seconds,
)
from fedprivacy.fl.scaffold import ScaffoldServer
from fedprivacy.fl.server_opt import ServerOptimizer, make_server_optimizer
from fedprivacy.fl.tracking import tracking_callbacks
from fedprivacy.fl.types import (
    DpsgdRoundInfo,
    Exchange,
    ModelHooks,
    RoundFn,
    RoundOutcome,
    RoundRecord,
)

if TYPE_CHECKING:
    from fedprivacy.accounting.accountant import Accountant
    from fedprivacy.accounting.events import PrivacyEvent
    from fedprivacy.config import RunConfig
    from fedprivacy.fl.checkpoint import Checkpoint

__all__ = ["FederatedRun", "RunResult", "read_participation", "resolve_run_dir", "round_seconds", "run_federated"]


class FederatedRun:
    """One federated training run, stepped round by round (or all at once with :meth:`run`).

    Args:
        cfg: the validated run config.
        population: number of partitions N; partition ids are ``0..N-1``.
        transport: how the server reaches the clients (the mode builds its round function on it).
        exchange: shorthand for ``transport=Transport(exchange=exchange)``.
        round_fn: a whole round function (overrides the mode's; the mode still plans and reports).
        hooks: model init and central evaluation (default: the configured model and data).
        mode: the privacy mode object (default: the registered mode named ``cfg.privacy``).
        aggregator: the aggregation rule of plain rounds (default: the mode's).
        server_optimizer: the global update (default: the one ``cfg.server_optimizer`` names,
            :func:`fedprivacy.fl.server_opt.make_server_optimizer`).
        callbacks: default :func:`fedprivacy.fl.callbacks.default_callbacks` (console, checkpoint,
            outputs), then the trackers ``cfg.tracking`` names
            (:func:`fedprivacy.fl.tracking.tracking_callbacks`); ``[]`` for a run that writes nothing.
        run_dir: the run folder (checkpoints, outputs, resumption); None: no folder.
        log: where the run's own lines go (start, resumption, left-out clients, stops).
    """

    def __init__(self, cfg: RunConfig, *, population: int, transport: Transport | None = None,
                 exchange: Exchange | None = None, round_fn: RoundFn | None = None,
                 hooks: ModelHooks | None = None, mode: PrivacyMode | None = None,
                 aggregator: Aggregator | None = None, server_optimizer: ServerOptimizer | None = None,
                 callbacks: Sequence[RunCallback] | None = None, run_dir: Path | None = None,
                 log: Callable[[str], None] = print) -> None:
        if transport is None and exchange is not None:
            transport = Transport(exchange=exchange)
        if transport is None and round_fn is None:
            raise ValueError("give a transport (or an exchange) or a round_fn")
        self.cfg, self.population, self.log, self.run_dir = cfg, population, log, run_dir
        self.mode = mode or get_mode(cfg.privacy)
        self.hooks = hooks
        self.aggregator = aggregator
        self.server_optimizer = server_optimizer or make_server_optimizer(cfg)
        # SCAFFOLD's server control variate: sent with the model, moved by the released Δc only
        self.scaffold = ScaffoldServer(population=population, mode=self.mode.name) if cfg.scaffold else None
        self.callbacks = (list(callbacks) if callbacks is not None
                          else default_callbacks(log) + tracking_callbacks(cfg, run_dir))
        self.root = root_source(cfg)
        self.dpsgd = DpsgdLedger(cfg) if cfg.dpsgd else None
        self.disclosure = RunDisclosure(cfg, self.mode)
        self.policy = ResumePolicy(cfg, population=population, run_dir=run_dir, log=log)
        self._transport, self._round_fn = transport, round_fn
        self.plan: PrivacyPlan | None = None
        self.ledger: WriteAheadJournal | None = None  # the run's accountant and journal, from start()
        self.inputs: RoundInputs | None = None  # each round's instructions, cohort and source, from start()
        self._round_cohort: Sequence[int] = ()
        self._left_out: dict[str, str] = {}  # the last round's left-out clients (private log)
        self.weights: list[np.ndarray] = []
        self.records: list[RoundRecord] = []
        self.next_round = 1
        self.status = RunStatus.PENDING
        self.stopped: str | None = None
        self._backdoor: BackdoorProbe | None = None
        self._started = 0.0

    @property
    def accountant(self) -> Accountant | None:
        """The run's user-level accountant (None without DP, or before :meth:`start`)."""
        return self.ledger.accountant if self.ledger is not None else None

    @property
    def publishes_participation(self) -> bool:
        """Whether the published outputs carry per-round client counts (:mod:`fedprivacy.fl.disclosure`)."""
        return self.disclosure.publishes_participation

    # ------------------------------------------------------------------ set-up
    def start(self) -> None:
        """Initialise (or resume from the run folder's checkpoint), plan, and build the round."""
        cfg = self.cfg
        self._started = time.perf_counter()
        if self.hooks is None:
            from fedprivacy.fl.task import default_hooks

            self.hooks = default_hooks(cfg, population=self.population)
        # the ground truth, and a backdoor's data check (refused here, before round 1) and probe
        self._backdoor = note_byzantine(cfg, population=self.population, run_dir=self.run_dir, log=self.log)
        if self.dpsgd is not None and self.mode.trusted_server:  # charged before the instructions leave
            self.dpsgd.schedule = self.hooks.dpsgd_schedule
        ckpt = self.policy.checkpoint()
        if ckpt is None:
            init_seed = int(self.root.child("server", "init").integers(0, 2**31 - 1))
            self.weights = [np.asarray(w) for w in self.hooks.init(init_seed)]
        self.plan = plan = self._plan(ckpt)
        self.ledger = WriteAheadJournal(cfg, plan, None, policy=self.policy, on_charged=self._charged)
        self.inputs = RoundInputs(cfg, population=self.population, root=self.root, plan=plan, mode=self.mode,
                                  num_classes=self.hooks.num_classes)
        self._build_round(plan)
        if ckpt is not None:
            self._resume(ckpt)
        else:
            self.ledger.accountant = make_accountant(cfg, plan)
            self.ledger.open(checkpointed=None)
            self._open_dpsgd_journal(expected=False, checkpointed=False)
        self.log(f"fedprivacy: {self.population} clients, {cfg.num_server_rounds} rounds, "
                 f"dataset={cfg.dataset}, model={cfg.model}, output={self.run_dir}")
        self.log(plan.describe())
        if self.accountant is not None:
            budget = (f"target ε {cfg.target_epsilon:g}" if cfg.target_epsilon > 0 else "no ε budget")
            self.log(f"accounting: {cfg.accountant} accountant, ε reported at δ={cfg.target_delta:g}, {budget}")
        self.log(f"randomness: {self.root.describe()}")
        self.status = RunStatus.RUNNING
        for cb in self.callbacks:
            cb.on_run_start(self)

    def _plan(self, ckpt: Checkpoint | None) -> PrivacyPlan:
        """The mode's plan; one that cannot be honoured is a configuration error (refused before round 1)."""
        from fedprivacy.errors import ConfigError

        dim = int(sum(np.size(w) for w in (ckpt.weights if ckpt else self.weights)))
        if self.scaffold is not None:  # the clients release Δy ++ Δc: one vector of twice the length
            dim *= 2
        try:
            return plan_privacy(self.cfg, population=self.population, dim=dim, mode=self.mode)
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc

    def _build_round(self, plan: PrivacyPlan) -> None:
        if self._round_fn is None:
            assert self._transport is not None  # checked in __init__
            self._round_fn = self.mode.round_fn(self.cfg, plan, self._transport, aggregator=self.aggregator,
                                                log=self.log)
        set_lookahead = getattr(self._round_fn, "set_lookahead", None)
        if set_lookahead is not None:  # a secure round runs the next round's key stages ahead
            set_lookahead(self.round_inputs)

    def _resume(self, ckpt: Checkpoint) -> None:
        """Continue from ``ckpt``: its model, records, ledger (reconciled with the journal) and state."""
        self.weights = [np.asarray(w) for w in ckpt.weights]
        self.records = [RoundRecord.from_json(r) for r in ckpt.rows]
        self.next_round = ckpt.round + 1
        assert self.plan is not None and self.ledger is not None
        if self.plan.event is not None:
            from fedprivacy.accounting.accountant import Accountant

            if ckpt.ledger_path is None:
                raise ValueError(f"checkpoint in {self.run_dir}/checkpoint has no privacy ledger")
            self.policy.check_plan(self.plan, ckpt.extra.get("plan"), f"the checkpoint in {self.run_dir}/checkpoint")
            self.ledger.accountant = Accountant.load(ckpt.ledger_path)
            self.ledger.open(checkpointed=self.ledger.accountant, journal_expected=bool(ckpt.extra.get("journal")))
        if self.dpsgd is not None:
            self.dpsgd.load(ckpt.extra.get("dpsgd", {}))
            self._open_dpsgd_journal(expected=bool(ckpt.extra.get("dpsgd_journal")), checkpointed=True)
        self.server_optimizer.load_state_dict(ckpt.extra.get("server_optimizer", {}))
        if self.scaffold is not None:
            self.scaffold.load_state_dict(ckpt.extra.get("scaffold", {}))
        load_round = getattr(self._round_fn, "load_state_dict", None)
        if load_round is not None:  # a round function with state (adaptive clipping's estimate)
            load_round(ckpt.extra.get("round", {}))
        self.policy.refuse_voided(self.plan, self.accountant, self.records)
        self.policy.from_checkpoint(ckpt)

    def _open_dpsgd_journal(self, *, expected: bool, checkpointed: bool) -> None:
        if self.dpsgd is not None and self.run_dir is not None:
            self.dpsgd.open_in(self.run_dir, self.policy, expected=expected, checkpointed=checkpointed)

    def _charged(self, rnd: int, event: PrivacyEvent) -> None:
        for cb in self.callbacks:
            cb.on_charged(self, rnd, event)

    def checkpoint_extra(self) -> dict[str, Any]:
        """State beyond weights and ledger that a resumed run needs (DP-SGD ledgers, optimizer)."""
        extra: dict[str, Any] = {"population": self.population}
        if self.ledger is not None:
            extra.update(self.ledger.checkpoint_extra())
        if self.policy.resumes:
            extra["resumes"] = self.policy.resumes
        if self.dpsgd is not None:
            extra.update(self.dpsgd.checkpoint_extra())
        state = self.server_optimizer.state_dict()
        if state:
            extra["server_optimizer"] = state
        if self.scaffold is not None:
            extra["scaffold"] = self.scaffold.state_dict()
        round_state = getattr(self._round_fn, "state_dict", None)
        if round_state is not None:
            extra["round"] = round_state()
        return extra

    # ------------------------------------------------------------------ rounds
    def step(self) -> RoundRecord | None:
        """Run the next round; its record, or None when the run is over (done or stopped)."""
        if self.status is RunStatus.PENDING:
            self.start()
        rnd = self.next_round
        if self.status is not RunStatus.RUNNING or rnd > self.cfg.num_server_rounds:
            return None
        t0 = time.perf_counter()
        if self._budget_stops(rnd):
            return None
        cohort, outcome = self._run_round(rnd)
        if outcome is None or not self.charge_before_release(rnd, outcome):
            return None
        return self._conclude(rnd, cohort, outcome, t0)

    def _run_round(self, rnd: int) -> tuple[list[int], RoundOutcome | None]:
        """Round ``rnd``'s cohort and outcome (None: its charge exceeded the budget, nothing released)."""
        from fedprivacy.accounting.accountant import PrivacyBudgetExhausted
        from fedprivacy.fl.charging import charging

        assert self._round_fn is not None and self.ledger is not None and self.inputs is not None
        assert self.plan is not None
        instructions, cohort, round_rng = self.inputs.take(rnd)
        self.ledger.round_charge = None
        if self.dpsgd is not None:  # on disk before the instructions leave
            self.dpsgd.plan(cohort, round=rnd)
        self._round_cohort = cohort
        try:
            with charging(functools.partial(self.ledger.before_release, rnd)):
                arrays = self.weights if self.scaffold is None else self.scaffold.broadcast(self.weights)
                outcome = self._round_fn(instructions, cohort, arrays, round_rng)
        except PrivacyBudgetExhausted as exc:  # raised at the release point: nothing was released
            self._stop(f"round {rnd} not released, its event exceeds the budget: {exc}")
            return cohort, None
        check_release(self.mode, self.plan, outcome, charged=self.ledger.round_charge)  # less noise than charged: refused, nothing applied
        if self.dpsgd is not None:  # the server holds the replies: what they report beyond the plan
            self.dpsgd.book_replies(outcome.updates, round=rnd, public=self.publishes_participation, log=self.log)
        return cohort, outcome

    def _conclude(self, rnd: int, cohort: list[int], outcome: RoundOutcome, t0: float) -> RoundRecord:
        """Apply a charged round: the global update, its record, the callbacks, the stop rules."""
        assert self.ledger is not None
        if outcome.aborted is None:
            for cb in self.callbacks:
                cb.on_released(self, rnd, self.ledger.round_charge)
        after_release = getattr(self._round_fn, "after_release", None)
        if after_release is not None:  # round state that follows released values only
            after_release(outcome)
        mean = outcome.aggregate.mean_update if self.scaffold is None else self.scaffold.update(outcome.aggregate)
        self.weights = self.server_optimizer.step(self.weights, mean)
        record = self._record(rnd, cohort, outcome, t0)
        if self._backdoor is not None and record.test_accuracy is not None:  # owner-only attack metric
            self._backdoor.observe(rnd, self.weights)
        if self.run_dir is not None:
            append_participation(self.run_dir, self.disclosure.private_line(record, self._left_out))
        self.records.append(record)
        self.next_round = rnd + 1
        for cb in self.callbacks:
            cb.on_round_end(self, record)
        failed = failure_stop(self.cfg, rnd, cohort, outcome, public=self.publishes_participation)
        if failed is not None:
            self.status, self.stopped = RunStatus.CLIENTS_FAILED, failed
            self.log(failed)
        self.ledger.mark_completed(rnd)
        void = self.ledger.void_reason
        if void is not None and self.status is RunStatus.RUNNING:
            if rnd < self.cfg.num_server_rounds:
                self._stop(void)
            else:  # the last round: nothing left to stop, the run completed (its summary says why)
                self.log(void.replace("; run stopped", ""))
        return record

    def _budget_stops(self, rnd: int) -> bool:
        """Stop before a round whose worst-case event would overspend the budget."""
        assert self.ledger is not None
        reason = self.ledger.budget_stop(rnd)
        if reason is not None:
            self._stop(reason)
        return reason is not None

    def _stop(self, reason: str) -> None:
        self.status, self.stopped = RunStatus.BUDGET_EXHAUSTED, reason
        self.log(reason)

    def round_inputs(self, rnd: int) -> Inputs | None:
        """Round ``rnd``'s instructions, cohort and source, drawn once (:meth:`RoundInputs.ahead`)."""
        assert self.inputs is not None
        return self.inputs.ahead(rnd)

    def charge_before_release(self, rnd: int, outcome: RoundOutcome) -> bool:
        """Make sure the round's release is charged before its aggregate is applied, saved or shown.

        The round function normally charged already, durably, at its release point
        (:mod:`fedprivacy.fl.charging`); one without a release point (a custom ``round_fn``) is
        charged here, and an outcome that reports another event than the one charged is charged that
        too (:meth:`fedprivacy.fl.journal.WriteAheadJournal.charge_before_release`). Returns False when
        a charge exceeds the budget (the aggregate is then discarded, never applied or published).
        """
        assert self.ledger is not None
        discarded = self.ledger.charge_before_release(rnd, outcome, records=self.records,
                                                      cohort_size=len(self._round_cohort),
                                                      public=self.publishes_participation, log=self.log)
        if discarded is not None:
            self._stop(discarded)
        return discarded is None

    def _record(self, rnd: int, cohort: Sequence[int], outcome: RoundOutcome, t0: float) -> RoundRecord:
        """Evaluate the new model (every ``eval-every`` rounds and after the last), log who was left
        out, book DP-SGD, and build the round's record."""
        assert self.hooks is not None and self.ledger is not None
        test_loss: float | None = None
        test_acc: float | None = None
        if rnd % self.cfg.eval_every == 0 or rnd == self.cfg.num_server_rounds:
            test_loss, test_acc = (float(v) for v in self.hooks.evaluate(self.weights))
        agg = outcome.aggregate
        self._left_out = left_out(rnd, outcome, public=self.publishes_participation, log=self.log)
        in_sum = set(agg.aggregated)
        train_loss = weighted_loss([u for u in outcome.updates if u.partition_id in in_sum])
        return RoundRecord(
            round=rnd, clients_sampled=len(cohort), clients_aggregated=len(agg.aggregated),
            train_loss=train_loss, test_loss=test_loss, test_accuracy=test_acc,
            epsilon=self.ledger.row_epsilon(),
            delta=self.cfg.target_delta if self.accountant is not None else None,
            seconds=time.perf_counter() - t0,
            dpsgd=DpsgdRoundInfo(epsilon=self.dpsgd.epsilon()) if self.dpsgd is not None else None,
            secagg=outcome.secagg, aborted=outcome.aborted, clip=outcome.clip)

    # ------------------------------------------------------------------ end
    def finish(self) -> RunResult:
        """The result (and the callbacks' ``on_run_end``: outputs, closing line)."""
        if self.status is RunStatus.RUNNING:
            self.status = RunStatus.COMPLETED
        assert self.plan is not None
        self._evaluate_last()
        result = RunResult(status=self.status, stopped=self.stopped, weights=tuple(self.weights),
                           accountant=self.accountant, records=tuple(self.records), plan=self.plan,
                           results=self._results().to_json())
        for cb in self.callbacks:
            cb.on_run_end(self, result)
        return result

    def _evaluate_last(self) -> None:
        """A run that stopped between evaluations (budget, failures) still reports its final model."""
        import dataclasses

        last = self.records[-1] if self.records else None
        if last is None or last.test_accuracy is not None or last.round != self.next_round - 1:
            return
        assert self.hooks is not None
        loss, acc = self.hooks.evaluate(self.weights)
        self.records[-1] = dataclasses.replace(last, test_loss=float(loss), test_accuracy=float(acc))

    def run(self) -> RunResult:
        """Every remaining round, then :meth:`finish`."""
        while self.step() is not None:
            pass
        return self.finish()

    def _results(self) -> Results:
        cfg, plan, ledger = self.cfg, self.plan, self.ledger
        assert plan is not None and ledger is not None
        rows = self.disclosure.published_rows(self.records)
        privacy = self.mode.summary(cfg, plan, self.records, accountant=self.accountant, rng=self.root)
        seconds = time.perf_counter() - self._started
        if self.accountant is not None:
            privacy["participation"] = self.disclosure.participation_block()
        write_ahead = ledger.summary()
        if write_ahead is not None:
            privacy["write_ahead"] = write_ahead
        dpsgd = None if self.dpsgd is None else self.dpsgd.summary(
            counts_private=not self.publishes_participation, population=plan.population,
            schedule=self.dpsgd.schedule)
        return Results(
            run_name=self.run_dir.name if self.run_dir is not None else cfg.run_name,
            run_dir=str(self.run_dir) if self.run_dir is not None else None,
            status=self.status, stopped=self.stopped, population=plan.population,
            resumed=list(self.policy.resumes), config=cfg.to_mapping(),
            resolved={"noise_multiplier": plan.noise_multiplier, "calibrated": plan.calibrated,
                      "denominator": plan.denominator, "population": plan.population},
            rounds=rows, privacy=privacy, seconds=seconds, dpsgd=dpsgd)


def run_federated(cfg: RunConfig, *, population: int, round_fn: RoundFn | None = None,
                  exchange: Exchange | None = None, transport: Transport | None = None,
                  hooks: ModelHooks | None = None, log: Callable[[str], None] = print,
                  **seams: Any) -> dict[str, Any]:
    """Run (or resume) the whole training in ``<output-dir>/<run-name>``; returns the results dict.

    A convenience over :class:`FederatedRun` with the default callbacks (checkpoint, outputs, console);
    ``seams`` are the other :class:`FederatedRun` arguments (``mode``, ``aggregator``,
    ``server_optimizer``, ``callbacks``).
    """
    run = FederatedRun(cfg, population=population, round_fn=round_fn, exchange=exchange,
                       transport=transport, hooks=hooks, log=log, run_dir=resolve_run_dir(cfg), **seams)
    return run.run().results
