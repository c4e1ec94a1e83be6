"""A run's user-level ledger, charged write-ahead: every charge is on disk before its release.

:class:`WriteAheadJournal` owns the run's accountant and its
:class:`fedprivacy.accounting.journal.ChargeJournal` (``<run dir>/privacy-journal.jsonl``, fsync'd).
Charges come from the round's release point (:mod:`fedprivacy.fl.charging`: :meth:`before_release`),
or after the round for a round function without one (:meth:`settle`), which also charges an event
that differs from the one charged: never less than what was released. What was charged stays: a
released event is charged whatever the budget (the run then stops), a round charged and cut off by a
crash may have been seen, and its repetition is charged again. An observers run that loses its
public amplification charges every released round unamplified (:meth:`void_amplification`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedprivacy.fl.run_files import JOURNAL_NAME
from fedprivacy.fl.types import RoundOutcome, RoundRecord

if TYPE_CHECKING:
    from fedprivacy.accounting.accountant import Accountant
    from fedprivacy.accounting.events import PrivacyEvent
    from fedprivacy.accounting.journal import ChargeJournal
    from fedprivacy.config import RunConfig
    from fedprivacy.fl.privacy import PrivacyPlan
    from fedprivacy.fl.resume import ResumePolicy

__all__ = ["WriteAheadJournal"]


class WriteAheadJournal:
    """The run's accountant (None without DP) and the journal its charges go through.

    Args:
        cfg: the run's config.
        plan: the run's privacy plan (its worst-case event is charged when a round names none).
        accountant: the run's fresh (or checkpointed) accountant.
        policy: the run's resume checks (a journal left by a run that did not checkpoint).
        on_charged: called with the round and the event after each charge at a round's release point.
    """

    def __init__(self, cfg: RunConfig, plan: PrivacyPlan, accountant: Accountant | None, *,
                 policy: ResumePolicy, on_charged: Callable[[int, PrivacyEvent], None]) -> None:
        self.cfg, self.plan, self.accountant, self.policy = cfg, plan, accountant, policy
        self.journal: ChargeJournal | None = None
        self.round_charge: PrivacyEvent | None = None  # what the current round was charged
        self.void_reason: str | None = None  # the public's amplification was voided: stop after this round
        self._on_charged = on_charged

    @property
    def path(self) -> Path | None:
        """The journal's file (``<run dir>/privacy-journal.jsonl``); None without a run folder."""
        run_dir = self.policy.run_dir
        return None if run_dir is None else run_dir / JOURNAL_NAME

    def open(self, *, checkpointed: Accountant | None, journal_expected: bool = False) -> None:
        """Create the journal, or recover it and reconcile it with the checkpoint.

        The journal is the authority: every charge in it stays, so the resumed ledger is the
        journal's, which must extend the checkpoint's. A journal without a checkpoint (killed before
        round 1 was checkpointed) needs ``resume = true``, like a checkpoint does. A checkpoint
        written with a journal (``journal_expected``) whose journal is gone is refused: recreating it
        from the checkpoint would refund every charge made after the checkpoint. The journal's header
        holds the plan its charges were computed from; a resumed run must have the same. The budget
        is the current plan's (a distributed run's budget reserves the slack of ``num-server-rounds``
        rounds, which may change on resume).
        """
        from fedprivacy.accounting.journal import ChargeJournal

        path = self.path
        if self.accountant is None or path is None:
            return
        if not path.exists():
            self._create(path, checkpointed=checkpointed, journal_expected=journal_expected)
            return
        if checkpointed is None and not self.cfg.resume:
            from fedprivacy.errors import ConfigError

            raise ConfigError(
                f"run-name {self.cfg.run_name!r}: {self.policy.run_dir} holds the privacy journal of a run "
                "that was charged and did not checkpoint; set resume=true to continue it (its charges stay) "
                "or choose another run-name")
        journal = ChargeJournal.recover(path)
        if checkpointed is None and journal.plan is not None and "config" in journal.plan:
            # a journal-only resume (killed before the first checkpoint): the same checks as a checkpoint's
            self.policy.check_same_run(journal.plan["config"], journal.plan.get("population"))
            self.policy.from_journal("privacy journal", "population, sampling, privacy, accountant and "
                                     "data settings")
        self.policy.check_plan(self.plan, journal.plan, f"privacy journal {path}")
        self._adopt(journal, path, checkpointed=checkpointed)

    def _create(self, path: Path, *, checkpointed: Accountant | None, journal_expected: bool) -> None:
        from fedprivacy.accounting.journal import ChargeJournal
        from fedprivacy.errors import ConfigError

        assert self.accountant is not None
        run_dir = self.policy.run_dir
        if journal_expected:
            raise ConfigError(
                f"privacy journal {path} is missing, but the checkpoint in {run_dir}/checkpoint "
                "was written with it: resuming without it would drop every charge made after that "
                "checkpoint (a round charged and cut off may have been seen); restore the file, or "
                "start a new run (another run-name)")
        if checkpointed is not None:
            self.policy.log(f"privacy journal: none in {run_dir} (checkpoint older than the journal); "
                            "starting one from the checkpoint's ledger")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.journal = ChargeJournal.create(path, self.accountant, plan=self.policy.saved_plan(self.plan))

    def _adopt(self, journal: ChargeJournal, path: Path, *, checkpointed: Accountant | None) -> None:
        """Take the recovered journal's ledger, at the current plan's budget, if it extends the checkpoint's."""
        assert self.accountant is not None
        fresh = {k: v for k, v in self.accountant.to_json().items() if k not in ("entries", "budget")}
        saved = {k: v for k, v in journal.accountant.to_json().items() if k not in ("entries", "budget")}
        if fresh != saved:
            raise ValueError(f"privacy journal {path} was written for another accountant ({saved}); "
                             f"this run has {fresh}")
        kept = [e.to_dict() for e in journal.accountant.ledger]
        if journal.accountant.budget != self.accountant.budget:  # the current plan's budget
            from fedprivacy.accounting.accountant import Accountant

            journal.accountant = Accountant.from_json({**self.accountant.to_json(), "entries": kept})
        if checkpointed is not None:  # the journal keeps no wall-clock time: compare without it
            ckpt_entries = [_untimed(e.to_dict()) for e in checkpointed.ledger]
            if [_untimed(e) for e in kept[: len(ckpt_entries)]] != ckpt_entries:
                raise ValueError(f"privacy journal {path} does not extend the checkpoint's ledger: "
                                 "refusing to resume with either")
        if journal.unfinished_rounds:
            self.policy.log(f"privacy journal: rounds {list(journal.unfinished_rounds)} were charged and did "
                            "not finish; their charges stay (their release may have been seen)")
        self.journal = journal
        self.accountant = journal.accountant

    def spend(self, event: PrivacyEvent, rnd: int, *, released: bool = False) -> None:
        """The charge itself: on disk first when the run has a journal (then in the ledger)."""
        assert self.accountant is not None
        if self.journal is not None:
            self.journal.charge(event, round=rnd, released=released)
        else:
            self.accountant.spend(event, round=rnd, released=released)

    def before_release(self, rnd: int, event: PrivacyEvent | None) -> None:
        """:func:`fedprivacy.fl.charging.before_release` of round ``rnd`` (once per round)."""
        if self.round_charge is not None:
            return
        ev = event if event is not None else self.plan.event
        if self.accountant is None or ev is None:
            return
        self.spend(ev, rnd)
        self.round_charge = ev
        self._on_charged(rnd, ev)

    def charge_before_release(self, rnd: int, outcome: RoundOutcome, *, records: Sequence[RoundRecord],
                              cohort_size: int, public: bool, log: Callable[[str], None]) -> str | None:
        """Make sure round ``rnd``'s release is charged before its aggregate is applied, saved or shown.

        A round that aborted before its release point released nothing and spends nothing; one that
        aborted after it keeps its charge (``public``: whether the abort's reason, which names counts,
        may be logged). Otherwise :meth:`settle`, then :meth:`void_amplification`. Returns why the
        round is discarded (a charge exceeds the budget: its aggregate is never applied or
        published), or None.
        """
        from fedprivacy.accounting.accountant import PrivacyBudgetExhausted

        if outcome.aborted is not None:  # secagg: nothing released, model unchanged
            why = outcome.aborted if public else "reason in the private log"
            rounds = f"round {rnd:3d}/{self.cfg.num_server_rounds}"
            if self.round_charge is not None:
                log(f"{rounds}  ABORTED after its release was charged: {why}; the charge stays, global "
                    "model unchanged")
            else:
                log(f"{rounds}  ABORTED: {why}; nothing released, no ε spent, global model unchanged")
            self.void_amplification(rnd, outcome, records=records, cohort_size=cohort_size)
            return None
        if self.accountant is None:
            return None
        try:
            self.settle(rnd, outcome.event, log=log)
        except PrivacyBudgetExhausted as exc:
            return f"round {rnd} discarded, its event exceeds the budget: {exc}"
        if self.void_amplification(rnd, outcome, records=records, cohort_size=cohort_size):
            eps, budget = self.over_budget(), self.accountant.budget
            if eps is not None and budget is not None:
                # already seen by the server, not yet by the public: discarded, never published
                return (f"round {rnd} discarded: {self.void_reason}; ε {eps:.3f} exceeds the budget "
                        f"{budget.epsilon:g} at δ={budget.delta:g}")
        return None

    def settle(self, rnd: int, released: PrivacyEvent | None, *, log: Callable[[str], None]) -> None:
        """After the round: charge it if its round function had no release point (with ``released``,
        the event the outcome reports, else the plan's); if ``released`` differs from what was charged,
        charge it as well, whatever the budget (it was released: never refunded).

        Raises:
            PrivacyBudgetExhausted: a charge exceeds the budget (the round's aggregate is then
                discarded, never applied or published).
        """
        from fedprivacy.accounting.accountant import PrivacyBudgetExhausted

        assert self.accountant is not None
        event = released if released is not None else self.plan.event
        assert event is not None  # a plan with an accountant has an event
        if self.round_charge is None:
            self.spend(event, rnd)
            self.round_charge = event
            self._on_charged(rnd, event)
        elif released is not None and released != self.round_charge:
            log(f"round {rnd}: released {released} differs from the charged {self.round_charge}; "
                "charging it as well")
            self.spend(released, rnd, released=True)
            if self.over_budget() is not None:
                budget = self.accountant.budget
                assert budget is not None
                raise PrivacyBudgetExhausted(
                    f"the released event {released} was charged after the fact and takes ε above "
                    f"the budget {budget.epsilon:g} at δ={budget.delta:g}")

    def over_budget(self) -> float | None:
        """The ledger's ε at the budget's δ when it exceeds the budget's ε, else None."""
        budget = self.accountant.budget if self.accountant is not None else None
        if budget is None:
            return None
        assert self.accountant is not None
        eps = self.accountant.epsilon(delta=budget.delta)
        return eps if eps > budget.epsilon else None

    def budget_stop(self, rnd: int) -> str | None:
        """Why round ``rnd`` must not start (its worst-case event would overspend the budget), or None."""
        plan, acc, cfg = self.plan, self.accountant, self.cfg
        if acc is None or plan.event is None or not acc.would_exceed(plan.event):
            return None
        eps_next = acc.epsilon_if(plan.event, delta=cfg.target_delta)
        eps_now = acc.epsilon(delta=cfg.target_delta)
        return (f"budget: stopped before round {rnd}, nothing released in it: the projected ε after "
                f"it (its planned, worst-case event) is {eps_next:.3f} > target-epsilon "
                f"{cfg.target_epsilon:g} at δ={cfg.target_delta:g}; ε spent so far {eps_now:.3f}")

    def void_amplification(self, rnd: int, outcome: RoundOutcome, *, records: Sequence[RoundRecord],
                           cohort_size: int) -> bool:
        """Void the public's amplification for the whole run if this round is outside its pair; why.

        Distributed, ``privacy-audience=observers`` (:func:`fedprivacy.fl.modes.distributed.
        amplification_void`): an abort of a round whose cohort could complete (dropouts, a protocol
        violation), or a completed round that lost sampled clients after its cohort was chosen (its
        completion then also depended on the survivors). Every completed round (and this one, if its
        release was charged) is then charged the server's unamplified event as well, as already
        released (never refused): the ledger then dominates the unamplified composition, which is
        valid against the public for every data-independent dropout pattern (the public's view is a
        post-processing of the server's, and given the cohort and the survivors each round is a
        Gaussian of sensitivity ``Delta`` or nothing for client ``i``: Zhu, Dong & Wang 2022, Theorem
        10), so the budget check, every later row's ε and the headline stay valid. The run stops
        after this round (its remaining rounds could only be charged unamplified, which the budget
        was not calibrated for: :attr:`void_reason`). Returns whether it voided.
        """
        plan = self.plan  # only the distributed plan of an observers run has an unamplified event
        if plan.unamplified_event is None or self.accountant is None:
            return False
        from fedprivacy.fl.modes.distributed import unmodelled_round

        aggregated = len(outcome.aggregate.aggregated) if outcome.aborted is None else None
        late = outcome.secagg.late if outcome.secagg is not None else None
        why = unmodelled_round(self.cfg, outcome.aborted, cohort_size, aggregated,
                               population=self.policy.population, late=late)
        if why is None:
            return False
        count = sum(1 for r in records if r.aborted is None) + (self.round_charge is not None)
        if count:  # one durable charge of the count-fold event
            event = plan.unamplified_event
            self.spend(dataclasses.replace(event, count=event.count * count), rnd, released=True)
        what = ("an abort the public's pair does not model" if why == "aborted" else
                "sampled clients lost after the cohort was chosen (dropouts), which the public's pair "
                "does not model,")
        self.void_reason = (f"round {rnd}: {what} voids its amplification: "
                            f"{count} released round(s) charged the server's unamplified event as well; "
                            "run stopped")
        return True

    def row_epsilon(self) -> float | None:
        """A round's published ε (None without DP): the ledger's at ``target-delta``; for a distributed
        run the ledger's at the plan's reduced δ plus the slack ``2H'`` of the run's worst case for
        ``num-server-rounds`` rounds, or for every release the ledger holds when a re-charge made them
        more (the headline's formula: the ledger alone is up to ~1e-7 per round below the valid figure)."""
        acc = self.accountant
        if acc is None:
            return None
        if not self.plan.epsilon_slack:
            return acc.epsilon(delta=self.cfg.target_delta)
        from fedprivacy.fl.modes.distributed import row_epsilon

        return row_epsilon(acc, self.cfg, self.plan)

    def mark_completed(self, rnd: int) -> None:
        if self.journal is not None:
            self.journal.mark_completed(rnd)

    def checkpoint_extra(self) -> dict[str, Any]:
        """What a resumed run needs to reconcile with this journal (its plan; that a journal exists)."""
        extra: dict[str, Any] = {}
        if self.plan.event is not None:
            extra["plan"] = self.policy.saved_plan(self.plan)
        if self.journal is not None:  # a resume without it would refund the charges after this checkpoint
            extra["journal"] = JOURNAL_NAME
        return extra

    def summary(self) -> dict[str, Any] | None:
        """The ``privacy.write_ahead`` block of ``results.json`` (None without a journal)."""
        if self.journal is None:
            return None
        return {
            "journal": JOURNAL_NAME, "charged_rounds": list(self.journal.charged_rounds),
            "unfinished_rounds": list(self.journal.unfinished_rounds),
            "note": "every charge was on disk before its release; a round charged and cut off by a "
                    "crash stays charged, and its repetition is charged again",
        }


def _untimed(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "timestamp"}
