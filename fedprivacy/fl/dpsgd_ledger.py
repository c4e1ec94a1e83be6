"""Example-level DP-SGD ledgers: one accountant per client, written ahead of each round.

For the example-level unit the server is in the audience: each client's reply (its DP-SGD-noised
update) is the release, visible to the server from the moment it arrives. So the spend of every client
sent instructions is planned from its partition's size and the round's instructions
(:func:`fedprivacy.ml.train.dpsgd_schedule`) and fsync'd to the run's DP-SGD journal
(``<run dir>/private/privacy-journal-dpsgd.jsonl``, owner-only: its lines name each round's cohort)
before the instructions leave. DP-SGD composes adaptively like any sequence of Poisson-subsampled
Gaussians (Abadi et al. 2016, Thm. 1; Mironov 2017, Prop. 1); a client's ledger is dp-accounting's PLD
under replace-one with its n public (Zhu, Dong & Wang 2022).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedprivacy.fl.run_files import (
    DPSGD_JOURNAL_NAME,
    PRIVATE_DIR,
    append_line,
    private_dir,
    read_json_lines,
)
from fedprivacy.fl.types import ClientUpdate

if TYPE_CHECKING:
    from fedprivacy.accounting.accountant import Accountant
    from fedprivacy.accounting.events import PrivacyEvent
    from fedprivacy.config import RunConfig
    from fedprivacy.fl.resume import ResumePolicy

__all__ = ["DpsgdLedger", "Schedule"]

Schedule = Callable[[int], tuple[int, float]]
"""A client's planned DP-SGD spend of one round, ``(steps, rate)``, from its partition id."""


def _example_accountant() -> Accountant:
    """A client's example-level ledger: replace-one with n public (q = 1/ceil(n/B), the steps and Opacus'
    noise scale all follow n, so add/remove of an example is visible; only replace-one keeps n fixed).
    dp-accounting's PLD composes Poisson subsampling under replace-one (Zhu, Dong & Wang 2022)."""
    from fedprivacy.accounting.accountant import Accountant

    return Accountant(backend="pld", neighbouring="replace-one", unit="example")


class DpsgdLedger:
    """Per-client sample-level accountants for DP-SGD (unit: one training example).

    Write-ahead: every sampled client's planned spend is written (fsync) before the instructions leave
    (:meth:`plan_round`); when the replies arrive, a client reporting another spend than planned is
    charged that too (:meth:`spend_round`: never less than what ran). A planned round that never
    finished stays charged: its replies may have been seen.

    Attributes:
        schedule: the planned spend of each client (set by the run where the clients report their
            steps to the server, modes none/central); None: spends are charged as reported.
    """

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.accountants: dict[int, Accountant] = {}
        self.journal: Path | None = None
        self._planned: dict[int, dict[int, tuple[int, float]]] = {}  # round -> pid -> (steps, rate)
        # rounds whose instructions were planned (a repeat after a crash counts again): with the
        # partition sizes, all the cohort-independent bound needs (None: unknown, an old journal)
        self.attempts: int | None = 0
        self.beyond_plan = False  # a reply reported a spend the plan did not foresee
        # the population's schedule classes, by (schedule, population): asked once, not at every summary
        self._classes: tuple[Schedule, int, frozenset[tuple[int, float]]] | None = None
        self.schedule: Schedule | None = None

    def open_in(self, run_dir: Path, policy: ResumePolicy, *, expected: bool, checkpointed: bool) -> None:
        """Replay or create the run's journal (``<run dir>/private/privacy-journal-dpsgd.jsonl``).

        One left in the run folder itself by an older version is moved there first. A checkpoint
        written with a journal (``expected``) whose journal is gone is refused. Without a checkpoint
        (killed before the first one) an existing journal needs ``resume = true``, and the run must be
        the one that wrote it (:func:`fedprivacy.fl.resume.check_same_run` against its first line): its
        lines are replayed at this run's ``dpsgd-noise-multiplier``, so another one would re-account
        spends at noise they did not carry (relaunched at z = 4 after a crash at z = 0.5: ε 0.744
        published for charges worth 12.444). A checkpointed resume was checked against the checkpoint.
        """
        from fedprivacy.errors import ConfigError

        path = private_dir(run_dir) / DPSGD_JOURNAL_NAME
        old = run_dir / DPSGD_JOURNAL_NAME
        if old.exists() and not path.exists():
            os.chmod(old, 0o600)
            os.replace(old, path)
        if expected and not path.exists():
            raise ConfigError(
                f"DP-SGD journal {path} is missing, but the checkpoint in {run_dir}/checkpoint was "
                "written with it: resuming without it would drop the DP-SGD steps spent after that "
                "checkpoint; restore the file, or start a new run (another run-name)")
        if not checkpointed and path.exists():
            self._check_run(path, policy)
        self.open_journal(path, run={"config": self.cfg.to_mapping(), "population": policy.population})

    def _check_run(self, path: Path, policy: ResumePolicy) -> None:
        """Refuse to replay, without a checkpoint, a DP-SGD journal another run (or no resume) wrote."""
        from fedprivacy.errors import ConfigError

        if not self.cfg.resume:
            raise ConfigError(
                f"run-name {self.cfg.run_name!r}: {path} holds the DP-SGD journal of a run that was charged "
                "and did not checkpoint; set resume=true to continue it (its charges stay) or choose another "
                "run-name")
        lines = read_json_lines(path, what="DP-SGD journal")
        saved = lines[0].get("run") if lines and lines[0].get("kind") == "snapshot" else None
        if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict):
            raise ConfigError(
                f"resume=true: the DP-SGD journal {path} (no checkpoint yet) does not record the run that "
                "wrote it (an older version): its spends cannot be checked against this run's "
                "dpsgd-noise-multiplier; start a new run (another run-name)")
        policy.check_same_run(saved["config"], saved.get("population"))
        policy.from_journal("DP-SGD journal", "the run's settings")

    def open_journal(self, path: Path, *, run: dict[str, Any] | None = None) -> None:
        """Replay ``path`` (every spend written so far; a torn last line is dropped) or create it.

        Every line is a charge that stays: ``planned`` (written before the round's instructions left)
        and ``spends`` (reported beyond the plan, or, without a plan, as soon as the replies
        arrived); a round repeated after a crash is charged again. The lines hold steps and rates,
        not the noise multiplier they ran at: a new journal's first line keeps ``run`` (the run's
        config and population), against which a run that replays it without a checkpoint is checked
        (:meth:`open_in`).
        """
        if path.exists():
            self.accountants = {}
            self.attempts, self.beyond_plan = 0, False
            for rec in read_json_lines(path, what="DP-SGD journal"):
                if rec.get("kind") == "snapshot" and isinstance(rec.get("ledgers"), dict):
                    self.load(rec["ledgers"])
                    known = rec.get("attempts")
                    if isinstance(known, int):
                        self.attempts = known
                elif rec.get("kind") in ("planned", "spends") and isinstance(rec.get("spends"), list):
                    if rec["kind"] == "planned" and self.attempts is not None:
                        self.attempts += 1
                    elif rec["kind"] == "spends":
                        self.beyond_plan = True
                    for pid, steps, rate in rec["spends"]:
                        self.spend(int(pid), steps=int(steps), rate=float(rate), round=int(rec["round"]))
                else:
                    raise ValueError(f"DP-SGD journal {path}: unknown line {rec!r}")
        else:
            append_line(path, {"kind": "snapshot", "ledgers": self.to_json(), "attempts": self.attempts,
                                **({"run": run} if run is not None else {})}, create=True)
        self.journal = path

    def plan(self, cohort: Sequence[int], *, round: int) -> None:
        """:meth:`plan_round` with :attr:`schedule` (nothing without one)."""
        if self.schedule is not None:
            self.plan_round(cohort, self.schedule, round=round)

    def book_replies(self, updates: Sequence[ClientUpdate], *, round: int, public: bool,
                     log: Callable[[str], None]) -> None:
        """:meth:`spend_round`, and with a plan a line for each spend beyond it (``public``: naming
        the client; else the private DP-SGD journal names it)."""
        for pid, steps, rate in self.spend_round(updates, round=round):
            if self.schedule is None:
                continue
            if public:
                log(f"  round {round}: client {pid} reports DP-SGD {steps} steps at rate {rate:g}, "
                    "not the planned spend; charged as well")
            else:  # who took part is private
                log(f"  round {round}: a client reports another DP-SGD spend than planned; charged as "
                    "well (the private DP-SGD journal names it)")

    def checkpoint_extra(self) -> dict[str, Any]:
        """The ledgers, and where their journal is (a resume without it would refund its spends)."""
        extra: dict[str, Any] = {"dpsgd": self.to_json()}
        if self.journal is not None:
            extra["dpsgd_journal"] = f"{PRIVATE_DIR}/{DPSGD_JOURNAL_NAME}"
        return extra

    def plan_round(self, cohort: Sequence[int], schedule: Schedule, *,
                   round: int) -> None:
        """Charge the planned DP-SGD spend of every client in ``cohort`` (on disk first), before
        the round's instructions are sent."""
        spends = [(int(pid), *schedule(int(pid))) for pid in cohort]
        if self.journal is not None:  # an empty cohort too: the attempt count must not depend on them
            append_line(self.journal, {"kind": "planned", "round": round,
                                        "spends": [[p, int(s), float(q)] for p, s, q in spends]})
        if self.attempts is not None:
            self.attempts += 1
        self._planned[round] = {p: (int(s), float(q)) for p, s, q in spends}
        for pid, steps, rate in spends:
            self.spend(pid, steps=int(steps), rate=float(rate), round=round)

    def spend(self, pid: int, *, steps: int, rate: float, round: int) -> None:
        if steps < 1 or not 0 < rate <= 1:
            return
        acc = self.accountants.get(pid)
        if acc is None:
            acc = self.accountants[pid] = _example_accountant()
        acc.spend(self._event(rate=rate, count=steps), round=round)

    def _event(self, *, rate: float, count: int) -> PrivacyEvent:
        """``count`` DP-SGD steps: the Poisson-subsampled Gaussian at the run's DP-SGD noise multiplier."""
        from fedprivacy.accounting.events import GaussianEvent, PoissonSampling, PrivacyEvent

        return PrivacyEvent(mechanism=GaussianEvent(noise_multiplier=self.cfg.dpsgd_noise_multiplier),
                            sampling=PoissonSampling(rate=rate), count=count)

    def spend_round(self, updates: Sequence[ClientUpdate], *, round: int) -> list[tuple[int, int, float]]:
        """Charge what the replies report beyond the round's plan (every reply received, aggregated or
        not: the server saw it); returns those extra spends. Without a plan every report is charged."""
        planned = self._planned.pop(round, None)
        reported = [(u.partition_id, int(u.metrics["dpsgd_steps"]), float(u.metrics.get("dpsgd_sample_rate", 0.0)))
                    for u in updates if "dpsgd_steps" in u.metrics]
        extra = [(pid, steps, rate) for pid, steps, rate in reported
                 if planned is None or not _same_spend(planned.get(pid), (steps, rate))]
        if extra and self.journal is not None:  # on disk first
            append_line(self.journal, {"kind": "spends", "round": round, "spends": [list(x) for x in extra]})
        self.beyond_plan = self.beyond_plan or bool(extra)
        for pid, steps, rate in extra:
            self.spend(pid, steps=steps, rate=rate, round=round)
        return extra

    def epsilon(self) -> float | None:
        """The worst client's figure: a function of the cohorts (private when the counts are)."""
        if not self.accountants:
            return None
        return max(a.epsilon(delta=self.cfg.target_delta) for a in self.accountants.values())

    def cohort_independent_bound(self, schedule: Schedule | None, *,
                                 population: int) -> float | None:
        """An upper bound on every client's example-level ε that does not depend on who was sampled.

        Each client's ledger composes its class's per-round spend ``(steps, rate)`` (a function of its
        public partition size) once per round it was sent instructions in, at most once per planned
        round (:attr:`attempts`, repeats after a crash included). Composing more Poisson-subsampled
        Gaussians cannot lower ε (the PLD of a composition dominates that of its prefix), so the
        maximum over the population's classes of ``attempts`` rounds bounds every client. The worst
        client's actual figure is a function of the cohorts: a jump that only one client's class can
        make says that it took part, which the central ε assumes secret. None when the
        bound is unknown (no schedule, or a journal from before the attempt count).
        """
        if schedule is None or self.attempts is None:
            return None
        if self.attempts == 0:
            return 0.0
        worst = 0.0
        classes = self._population_classes(schedule, population)
        for steps, rate in sorted(classes):
            if steps < 1 or not 0 < rate <= 1:
                continue
            acc = _example_accountant()
            # one event of count steps x attempts: the same composition as a client's per-round spends (the
            # accountant self-composes identical events by their total count: the same ε, bit for bit),
            # at one PLD self-composition instead of one per round (120 rounds: 0.3 s, not 24 s)
            acc.spend(self._event(rate=float(rate), count=int(steps) * self.attempts), round=self.attempts)
            worst = max(worst, acc.epsilon(delta=self.cfg.target_delta))
        return worst

    def _population_classes(self, schedule: Schedule, population: int) -> frozenset[tuple[int, float]]:
        """Every partition's ``(steps, rate)`` (a public function of its size), kept for the next call."""
        memo = self._classes
        if memo is None or memo[0] is not schedule or memo[1] != population:
            memo = (schedule, population, frozenset(schedule(pid) for pid in range(population)))
            self._classes = memo
        return memo[2]

    def to_json(self) -> dict[str, Any]:
        return {str(k): v.to_json() for k, v in self.accountants.items()}

    def load(self, data: dict[str, Any]) -> None:
        from fedprivacy.accounting.accountant import Accountant

        self.accountants = {int(k): Accountant.from_json(v) for k, v in data.items()}
        # ledgers from a checkpoint carry no attempt count (the journal replay sets it): unknown until then
        self.attempts = None if self.accountants else 0

    def summary(self, *, counts_private: bool = False,
                schedule: Schedule | None = None, population: int = 0) -> dict[str, Any]:
        """The ``dpsgd`` block of results.json. With the counts private the figure is the cohort-independent
        bound (:meth:`cohort_independent_bound`), never the worst client's: that one goes to the private log."""
        cfg = self.cfg
        epsilon, basis = self.epsilon(), "the worst client's ledger (the counts are published)"
        if counts_private:
            bound = self.cohort_independent_bound(schedule, population=population)
            if bound is None:
                epsilon, basis = None, ("not published: a bound that does not depend on the cohorts needs the "
                                        "partition sizes and the attempt count (see the private log)")
            elif self.beyond_plan:  # a client reported more than its class: the bound alone would be too low
                epsilon = max(bound, epsilon or 0.0)
                basis = ("the larger of the cohort-independent bound and the worst client's ledger: a reply "
                         "reported a spend beyond the plan, so this figure depends on the cohorts")
            else:
                epsilon = bound
                basis = (f"cohort-independent bound: every client's class (steps, rate from its public n) as if "
                         f"sent instructions in each of the {self.attempts} planned rounds; the worst client's "
                         "actual figure is a function of who was sampled and stays in the private log")
        return {
            "unit": "example (one training example of one client), per client, worst client",
            "adjacency": ("replace-one: one training example of the client replaced by another; its number "
                          "of examples n is public (the rate, the steps and the noise scale are functions of n, "
                          "and the client reports them to the server with its update), so add/remove of an "
                          "example is not claimed"),
            "mechanism": ("DP-SGD: Poisson-subsampled Gaussian on per-example clipped gradients (Abadi et "
                          "al. 2016, Alg. 1), composed over every step of every round the client was sent "
                          "instructions in"),
            "sampling": ("Poisson, per client: rate q = 1/ceil(n/B), local-epochs x ceil(n/B) steps per "
                         f"round (B = batch-size {cfg.batch_size}, local-epochs {cfg.local_epochs})"),
            "epsilon": epsilon, "epsilon_basis": basis, "delta": cfg.target_delta,
            "noise_multiplier": cfg.dpsgd_noise_multiplier, "max_grad_norm": cfg.dpsgd_max_grad_norm,
            "accountant": "pld (dp-accounting's PLD under replace-one, whatever the run's accountant)",
            "note": ("Composed over every round the client took part in, Poisson sampling at the "
                     "client's DP-SGD rate; only disclosed in modes none/central."),
        }


def _same_spend(planned: tuple[int, float] | None, reported: tuple[int, float]) -> bool:
    return planned is not None and planned[0] == reported[0] and math.isclose(planned[1], reported[1],
                                                                             rel_tol=1e-12, abs_tol=0.0)
