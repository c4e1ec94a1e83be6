"""What a run does besides training, as callbacks: console lines, checkpoints, output files.

:class:`fedprivacy.fl.run.FederatedRun` calls every callback's ``on_run_start`` after it has set up
(plan, accountant, weights), ``on_round_end`` after each round's record exists (its privacy already
charged), and ``on_run_end`` with the :class:`fedprivacy.fl.run.RunResult`. Order matters and is the
list's: the default (:func:`default_callbacks`) checkpoints a round before it prints it, and writes
the outputs before it prints where they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedprivacy.accounting.events import PrivacyEvent
    from fedprivacy.fl.run import FederatedRun, RunResult
    from fedprivacy.fl.types import RoundRecord

__all__ = ["CheckpointCallback", "ConsoleCallback", "OutputsCallback", "RunCallback", "default_callbacks"]


class RunCallback:
    """Base class: every hook does nothing."""

    def on_run_start(self, run: FederatedRun) -> None:
        """After set-up, before round 1 (or the first resumed round)."""

    def on_charged(self, run: FederatedRun, round: int, event: PrivacyEvent) -> None:
        """The round's release is charged (on disk, when the run has a folder) and not yet released."""

    def on_released(self, run: FederatedRun, round: int, event: PrivacyEvent | None) -> None:
        """The round's release happened (unmasked, noised, sent; ``event`` is what was charged for it,
        None without DP); not yet applied or checkpointed."""

    def on_round_end(self, run: FederatedRun, record: RoundRecord) -> None:
        """After a round: its release is charged, the model updated, the record complete."""

    def on_run_end(self, run: FederatedRun, result: RunResult) -> None:
        """After the last round (or the budget stop)."""


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"  # not evaluated this round (eval-every)


def _fmt_eps(eps: float | None) -> str:
    return "n/a (no DP)" if eps is None else f"{eps:.3f}"


class ConsoleCallback(RunCallback):
    """One line per round and a closing line, to ``log``."""

    def __init__(self, log: Callable[[str], None] = print) -> None:
        self.log = log

    def on_round_end(self, run: FederatedRun, record: RoundRecord) -> None:
        sample_level = ""
        # the worst client's figure moves with the cohorts: printed only where the counts are
        if record.dpsgd is not None and record.dpsgd.epsilon is not None and run.publishes_participation:
            sample_level = f"  (example-level DP-SGD ε {record.dpsgd.epsilon:.3f}, worst client)"
        # with counts private the round's wall time goes to the private log too: it grows with the
        # cohort
        clients, seconds = ((f"clients {record.clients_aggregated}/{record.clients_sampled}",
                             f"  {record.seconds:.2f}s") if run.publishes_participation
                            else ("clients (private)", ""))
        self.log(f"round {record.round:3d}/{run.cfg.num_server_rounds}  accuracy {_fmt(record.test_accuracy)}  "
                 f"loss {_fmt(record.test_loss)}  ε {_fmt_eps(record.epsilon)}  {clients}"
                 f"{seconds}{sample_level}")

    def on_run_end(self, run: FederatedRun, result: RunResult) -> None:
        acc = _fmt(result.records[-1].test_accuracy) if result.records else "n/a"
        where = run.run_dir / "results.json" if run.run_dir is not None else "memory (no run folder)"
        privacy = result.results["privacy"]
        self.log(f"{'done' if result.status == 'completed' else result.status}: {len(result.records)} "
                 f"rounds, accuracy {acc}, ε {_fmt_eps(privacy.get('epsilon'))}; "
                 f"results in {where}")
        dpsgd = result.results.get("dpsgd") or {}
        if dpsgd.get("epsilon") is not None:
            self.log(f"example-level DP-SGD ε {_fmt_eps(dpsgd['epsilon'])} at δ={dpsgd['delta']:g} "
                     f"({dpsgd.get('epsilon_basis', 'worst client')})")
        aud = (privacy.get("distributed") or {}).get("audiences")
        if aud:  # distributed DP: who each figure is against (the server's is never amplified)
            part = aud["participants"]
            how = "amplified where not in the round" if part.get("amplification") else "no amplification"
            self.log(f"ε by audience: server {_fmt_eps(aud['server']['epsilon'])}, participating "
                     f"clients {_fmt_eps(part['epsilon'])} ({how}), the public "
                     f"(takes part in no round) {_fmt_eps(aud['observers']['epsilon'])} "
                     f"({aud['observers']['sampling']})")


class CheckpointCallback(RunCallback):
    """After every round, the model, the ledger and the records, atomically (``<run dir>/checkpoint``).

    A run without a folder (``run_dir=None``) is not checkpointed.
    """

    def on_round_end(self, run: FederatedRun, record: RoundRecord) -> None:
        from fedprivacy.fl.checkpoint import save_checkpoint

        if run.run_dir is None:  # a run without a folder keeps nothing on disk
            return
        save_checkpoint(run.run_dir / "checkpoint", round=record.round, weights=run.weights,
                        accountant=run.accountant, rows=[r.to_json() for r in run.records],
                        config=run.cfg.to_mapping(), extra=run.checkpoint_extra() or None)


class OutputsCallback(RunCallback):
    """At the end: results.json, rounds.csv, privacy_report.md and the plot (``<run dir>/``).

    A run without a folder writes nothing; its results are in the returned RunResult.
    """

    def on_run_end(self, run: FederatedRun, result: RunResult) -> None:
        from fedprivacy.fl.outputs import write_outputs
        from fedprivacy.report import privacy_report_md

        if run.run_dir is None:  # the results stay in the RunResult
            return
        covers_for = getattr(run.mode, "covers_for", None)  # a mode whose lines depend on the config
        covers = covers_for(run.cfg) if callable(covers_for) else run.mode.covers
        write_outputs(run.run_dir, result.results, report_md=privacy_report_md(result.results, covers=covers))


def default_callbacks(log: Callable[[str], None] = print) -> list[RunCallback]:
    """Checkpoint, then outputs, then the console (the order the hooks run in)."""
    return [CheckpointCallback(), OutputsCallback(), ConsoleCallback(log)]
