"""What a run publishes about who took part, and what it keeps in the server's private log.

With client sampling the number of clients in a round is itself a disclosure (at N = 10, q = 0.5 a
full cohort has probability ~1e-3, far above δ) that a central ε does not cover, and a distributed
run's amplified ε for the public assumes the cohorts secret. Where the counts are private, so is
everything that follows them: a secure round's roster, survivors and noise level, the rounds' wall
times (a round's time grows with its cohort), the worst client's DP-SGD ε (it moves with the
cohorts) and, where the mode says so, the train loss (the mean of the clients' un-noised losses).
They go to ``<run dir>/private/participation.jsonl`` (owner-only) instead. What is published is the
mode's call (:meth:`fedprivacy.fl.modes.PrivacyMode.disclosure`); this module applies it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fedprivacy.fl.run_files import PARTICIPATION_LOG
from fedprivacy.fl.types import RoundRecord

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig
    from fedprivacy.fl.modes import PrivacyMode
    from fedprivacy.fl.modes.base import Disclosure

__all__ = ["PARTICIPATION_KEYS", "SECURE_COUNT_KEYS", "TIMING_KEYS", "UNNOISED_KEYS", "RunDisclosure"]

PARTICIPATION_KEYS = ("clients_sampled", "clients_aggregated")
#: Row keys of a secure round that depend on its counts (distributed runs with private counts).
SECURE_COUNT_KEYS = ("secagg_roster", "secagg_survivors", "secagg_degree", "noise_std_sum", "aborted",
                     "secagg_late", "secagg_max_abs_error")  # a fixed-point sum's error bound is n/s
#: Per-round figures computed from clients' un-noised values (central mode): private with the counts.
UNNOISED_KEYS = ("train_loss",)
#: A round's wall time grows with its cohort (in-process, clients run one after another), so it is
#: private with the counts; the run's total ``seconds`` stays published.
TIMING_KEYS = ("seconds",)
_DPSGD_KEYS = ("dpsgd_epsilon",)


class RunDisclosure:
    """A run's published rows, private log lines and participation block, as its mode's
    :meth:`~fedprivacy.fl.modes.PrivacyMode.disclosure` says."""

    def __init__(self, cfg: RunConfig, mode: PrivacyMode) -> None:
        self.cfg, self.mode = cfg, mode

    @property
    def rules(self) -> Disclosure:
        return self.mode.disclosure(self.cfg)

    @property
    def publishes_participation(self) -> bool:
        """Whether the published outputs carry per-round client counts (else only the private log)."""
        return self.rules.participation

    def published_rows(self, records: Sequence[RoundRecord]) -> list[dict[str, Any]]:
        """The ``rounds`` of ``results.json``: each record's row, less what is private."""
        rows = [r.to_json() for r in records]
        if not self.publishes_participation:
            # the mode says whether the un-noised train loss is published
            hidden = PARTICIPATION_KEYS + SECURE_COUNT_KEYS + TIMING_KEYS + _DPSGD_KEYS + (
                () if self.rules.unnoised else UNNOISED_KEYS)
            for row in rows:
                for key in hidden:
                    row.pop(key, None)
        return rows

    def private_line(self, record: RoundRecord, left_out: dict[str, str]) -> dict[str, Any]:
        """The round's line of the private participation log (the counts, and what follows them)."""
        counts: dict[str, Any] = {"round": record.round, "clients_sampled": record.clients_sampled,
                                  "clients_aggregated": record.clients_aggregated}
        row = record.to_json()
        counts.update({k: row[k] for k in SECURE_COUNT_KEYS + UNNOISED_KEYS + TIMING_KEYS + _DPSGD_KEYS
                       if k in row})
        if left_out:
            counts["left_out"] = left_out
        return counts

    def participation_block(self) -> dict[str, Any]:
        """The ``privacy.participation`` block of ``results.json``."""
        rules = self.rules
        if rules.participation:
            return {"published": True, "covered_by_epsilon": False, "note": rules.note}
        return {"published": False, "covered_by_epsilon": False, "private_log": f"private/{PARTICIPATION_LOG}",
                "note": rules.note}
