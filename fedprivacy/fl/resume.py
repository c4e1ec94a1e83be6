"""When a run may continue the one its run folder holds, and what it must match.

A resumed run continues the accounting of the rounds already released, so everything that
accounting depends on must be the same: the config except :data:`RESUMABLE_CHANGES`, the
population N, and the privacy plan the charges were computed from (:func:`plan_fingerprint`: a
noise multiplier calibrated for another ``num-server-rounds``, or an encoding another fedprivacy
version computes, would re-account released rounds at noise they did not carry). A folder that holds
a run is continued only with ``resume = true``, and ``resume = true`` with nothing to continue is
refused (a mistyped ``run-name`` would otherwise start a fresh run at ε = 0). An observers run whose
public amplification was voided is final (:func:`voided_resume_message`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedprivacy.fl.run_files import DPSGD_JOURNAL_NAME, JOURNAL_NAME, PRIVATE_DIR
from fedprivacy.fl.types import RoundRecord

if TYPE_CHECKING:
    from fedprivacy.accounting.accountant import Accountant
    from fedprivacy.config import RunConfig
    from fedprivacy.fl.checkpoint import Checkpoint
    from fedprivacy.fl.privacy import PrivacyPlan

__all__ = ["RESUMABLE_CHANGES", "ResumePolicy", "check_resume", "check_same_run", "missing_run_message",
           "plan_fingerprint", "resume_checkpoint", "voided_resume_message"]

# Config keys that may differ between a run and its resumption.
# Everything else (population, sampling, privacy parameters, accountant, data and partition seed) is
# what the accounting of the rounds already run depends on, and must match.
RESUMABLE_CHANGES = frozenset({"resume", "num-server-rounds", "client-timeout", "max-failed-fraction",
                               "eval-every",
                               # where the published values are also logged (fedprivacy.fl.tracking)
                               "tracking", "tracking-dir", "tracking-uri", "tracking-experiment",
                               "tracking-run-name"})


class ResumePolicy:
    """The resume checks of one run, and its history of resumptions (``results.json["resumed"]``).

    Args:
        cfg: the run's config.
        population: the run's number of partitions N.
        run_dir: its run folder (None: nothing to resume).
        log: where the resumption lines go.
    """

    def __init__(self, cfg: RunConfig, *, population: int, run_dir: Path | None,
                 log: Callable[[str], None]) -> None:
        self.cfg, self.population, self.run_dir, self.log = cfg, population, run_dir, log
        self.resumes: list[dict[str, Any]] = []  # one entry per resumption: after which round, when

    def checkpoint(self) -> Checkpoint | None:
        """The run folder's checkpoint to resume from, if any (see :func:`resume_checkpoint`)."""
        if self.run_dir is None:
            return None
        return resume_checkpoint(self.cfg, self.run_dir, population=self.population)

    def from_checkpoint(self, ckpt: Checkpoint) -> None:
        """Record a resumption after the checkpoint's round (its earlier resumptions kept)."""
        self.resumes = [*ckpt.extra.get("resumes", []), _entry(ckpt.round)]
        self.log(f"resuming {self.run_dir} after round {ckpt.round} (population, sampling, privacy, "
                 "accountant and data settings checked against the checkpoint)")

    def from_journal(self, journal: str, checked: str) -> None:
        """Record a resumption from ``journal`` alone (killed before the first checkpoint), once."""
        if self.resumes:
            return
        self.resumes = [_entry(0)]
        self.log(f"resuming {self.run_dir} from its {journal} alone (no checkpoint yet; {checked} checked "
                 "against the journal)")

    def check_same_run(self, saved: dict[str, Any], saved_population: Any) -> None:
        """:func:`check_same_run` for this run."""
        check_same_run(saved, saved_population, self.cfg, population=self.population)

    def saved_plan(self, plan: PrivacyPlan) -> dict[str, Any]:
        """:func:`plan_fingerprint` and the ``num-server-rounds`` it was made for (journal, checkpoint)."""
        return {**plan_fingerprint(plan), "num_server_rounds": self.cfg.num_server_rounds,
                "config": self.cfg.to_mapping(), "population": self.population}

    def check_plan(self, plan: PrivacyPlan, saved: Any, where: str) -> None:
        """Refuse to resume when the plan differs from the one the charged rounds ran with.

        The charges, the rows and the mode's summary (which re-accounts the rounds, e.g. a
        distributed run's survivors) all assume the run's one plan: ten rounds released at z = 3.42
        (ε 2.985) would print ε 2.021 after a resume with T = 20 and a recalibrated z. ``saved`` is
        :meth:`saved_plan` of the run that wrote ``where`` (None: written before plans were saved).
        """
        from fedprivacy.errors import ConfigError

        if saved is None:
            return
        if not isinstance(saved, dict):
            raise ValueError(f"{where}: the saved privacy plan must be a JSON object, got {saved!r}")
        fresh = self.saved_plan(plan)
        saved_rounds = saved.get("num_server_rounds")
        keys = sorted((set(saved) | set(fresh)) - {"num_server_rounds", "config", "population"})
        diff = [k for k in keys if not _json_equal(saved.get(k), fresh.get(k))]
        if not diff:
            return
        if fresh["calibrated"] and saved_rounds is not None and saved_rounds != fresh["num_server_rounds"]:
            raise ConfigError(
                f"num-server-rounds differs from the checkpointed run ({saved_rounds!r} != "
                f"{fresh['num_server_rounds']!r}) and the noise multiplier was calibrated for it "
                f"(noise-multiplier=0: z={saved.get('noise_multiplier')!r} ran, "
                f"{fresh['noise_multiplier']!r} would be used now); the rounds already released carry "
                f"the old noise: set num-server-rounds={saved_rounds!r}, or start a new run")
        raise ConfigError(
            f"the privacy plan differs from the one {where} was charged with ({', '.join(diff)}: "
            f"{ {k: saved.get(k) for k in diff} } != { {k: fresh.get(k) for k in diff} }); the rounds "
            "already released would be accounted from noise they did not carry: resume with the "
            "config and fedprivacy version that started the run, or start a new run")

    def refuse_voided(self, plan: PrivacyPlan, accountant: Accountant | None,
                      records: Sequence[RoundRecord]) -> None:
        """Refuse to resume an observers run whose public amplification was voided.

        A void charged every released round unamplified and stopped the run: its later rounds could
        only be charged unamplified, while the plan, the budget check and every round's charge are the
        amplified pair. Detected from the records (an abort or a completed round the pair does not
        model) and from the ledger (the void's re-charge, also when the round that voided it has no
        record: discarded, or cut off by a crash).
        """
        if plan.unamplified_event is None or accountant is None:
            return
        from fedprivacy.fl.modes.distributed import amplification_void, voided_in_ledger

        if (amplification_void(self.cfg, records, population=self.population)
                or voided_in_ledger(accountant, plan)):
            from fedprivacy.errors import ConfigError

            raise ConfigError(voided_resume_message(self.run_dir))


def _entry(after_round: int) -> dict[str, Any]:
    return {"after_round": after_round, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def plan_fingerprint(plan: PrivacyPlan) -> dict[str, Any]:
    """What a run's charges and its summary are computed from (saved in the journal's header and the
    checkpoint; a resumed run must have the same, :meth:`ResumePolicy.check_plan`).

    The worst-case event (for ``distributed`` it carries the encoding: scale, Δ₂, the noise of ``t``
    survivors), the noise multiplier, whether it was calibrated, and the claim's unit, relation,
    clip norm and denominator. Not the budget: a distributed run's budget reserves the slack of
    ``num-server-rounds`` rounds, which may change on resume.
    """
    return {
        "mode": plan.mode, "noise_multiplier": plan.noise_multiplier, "calibrated": plan.calibrated,
        "event": plan.event.to_dict() if plan.event is not None else None,
        "clip_norm": plan.clip_norm, "denominator": plan.denominator, "unit": plan.unit,
        "neighbouring": plan.neighbouring,
        "adaptive_clip": plan.adaptive_clip.to_json() if plan.adaptive_clip is not None else None,
    }


def _json_equal(a: Any, b: Any) -> bool:
    """Equality after a JSON round trip (a saved float reads back exactly; tuples become lists)."""
    return bool(json.loads(json.dumps(a)) == json.loads(json.dumps(b)))


def resume_checkpoint(cfg: RunConfig, run_dir: Path, *, population: int) -> Checkpoint | None:
    """The checkpoint in ``run_dir`` a run with ``cfg`` continues from, or None for a fresh run.

    Refuses (ValueError, one line saying how to fix it): a folder that holds a run without
    ``resume=true``; ``resume=true`` with no checkpoint there (a mistyped ``run-name`` would otherwise
    start a fresh run at ε = 0); a checkpoint whose accounting inputs differ (:func:`check_resume`).
    """
    from fedprivacy.errors import ConfigError
    from fedprivacy.fl.checkpoint import load_checkpoint

    ckpt = load_checkpoint(run_dir / "checkpoint") if (run_dir / "checkpoint").exists() else None
    if ckpt is None:
        # A privacy journal without a checkpoint: killed after round 1 was charged, before it was
        # checkpointed; resume=true continues it from round 1 with that charge kept.
        journals = (run_dir / JOURNAL_NAME, run_dir / PRIVATE_DIR / DPSGD_JOURNAL_NAME, run_dir / DPSGD_JOURNAL_NAME)
        if cfg.resume and not any(p.exists() for p in journals):
            raise ConfigError(missing_run_message(run_dir))
        return None
    if not cfg.resume:
        raise ConfigError(f"run-name {cfg.run_name!r}: {run_dir} already holds a run; set resume=true to "
                         "continue it or choose another run-name")
    check_resume(ckpt, cfg, population=population)
    if cfg.mode.secure_noise and cfg.privacy_audience == "observers":  # the public's amplification (preflight too)
        from fedprivacy.fl.modes.distributed import amplification_void
        from fedprivacy.fl.secure.params import public_sampling

        records = [RoundRecord.from_json(r) for r in ckpt.rows]
        if (public_sampling(cfg, population=population).rate < 1.0
                and amplification_void(cfg, records, population=population)):
            raise ConfigError(voided_resume_message(run_dir))
    return ckpt


def voided_resume_message(run_dir: Path | None) -> str:
    """The refusal of ``resume=true`` for an observers run whose public amplification was voided."""
    return (f"resume=true: run {run_dir} is final: the public's amplification was voided (a round lost "
            "sampled clients or aborted in a way the public's pair does not model), every round it "
            "released is charged unamplified and it stopped there; the rounds a resume would run could "
            "only be charged unamplified, which its budget for privacy-audience='observers' was not "
            "calibrated for. Its results stand; start a new run (another run-name), e.g. with "
            "privacy-audience='server'")


def missing_run_message(run_dir: Path) -> str:
    """The refusal of ``resume=true`` for a run folder that holds no checkpoint (one line)."""
    base = run_dir.parent
    runs = sorted(p.name for p in base.iterdir() if (p / "checkpoint").is_dir()) if base.is_dir() else []
    shown = ", ".join(runs[:10]) + (", ..." if len(runs) > 10 else "") if runs else "none"
    return (f"resume=true but run-name {run_dir.name!r} has no checkpoint in {run_dir} (runs that can be "
            f"resumed under {base}: {shown}); check run-name, or set resume=false to start a new run")


def check_resume(ckpt: Checkpoint, cfg: RunConfig, *, population: int) -> None:
    """Refuse to resume with anything the accounting of the finished rounds depends on changed.

    The whole config except :data:`RESUMABLE_CHANGES` (sampling, privacy parameters, accountant, data
    set, partitioner and seed, ...) and the population N (saved in the checkpoint since it is not a
    config key: the sampling rate and δ < 1/N are relative to it).

    Raises:
        ConfigError: naming the first key that differs, both values and how to fix it.
    """
    check_same_run(ckpt.config, ckpt.extra.get("population"), cfg, population=population)


def check_same_run(saved: dict[str, Any], saved_population: Any, cfg: RunConfig, *, population: int) -> None:
    """:func:`check_resume` against a saved config and population (a checkpoint's or a journal's)."""
    from fedprivacy.errors import ConfigError

    if saved_population is not None and int(saved_population) != population:
        raise ConfigError(
            f"the number of clients differs from the checkpointed run ({saved_population} != {population}); "
            f"resume with {saved_population} clients (e.g. --num-supernodes {saved_population})")
    current = cfg.to_mapping()
    for key in sorted(set(saved) | set(current)):
        if key in RESUMABLE_CHANGES:
            continue
        if saved.get(key) != current.get(key):
            raise ConfigError(
                f"{key} differs from the checkpointed run ({saved.get(key)!r} != {current.get(key)!r}); "
                f"a resumed run must use the same config: set {key}={saved.get(key)!r}"
            )
