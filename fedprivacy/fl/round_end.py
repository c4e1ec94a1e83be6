"""What the run makes of a round's outcome: who was left out, the failure rule, the train loss.

A sampled client is left out of a round when it crashed, timed out, or sent a malformed or
non-finite update (``RoundOutcome.failures`` and ``aggregate.dropped``). The run stops after a round
in which every sampled client was left out, or more than ``max-failed-fraction`` of them. Who was
left out is itself a disclosure where the counts are private (:mod:`fedprivacy.fl.disclosure`): the
console and the stop reason then name neither ids nor counts, which go to the private log.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from fedprivacy.fl.types import ClientUpdate, RoundOutcome

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig

__all__ = ["failure_stop", "left_out", "weighted_loss"]


def left_out(rnd: int, outcome: RoundOutcome, *, public: bool, log: Callable[[str], None]) -> dict[str, str]:
    """The round's left-out clients (id -> reason, for the private log), logged as far as ``public``."""
    out = sorted({**outcome.failures, **outcome.aggregate.dropped}.items())
    if public:
        for pid, reason in out:
            log(f"  round {rnd}: client {pid} left out: {reason}")
    elif out:  # who took part is private: the ids and reasons go to the private log
        log(f"  round {rnd}: clients left out (ids and reasons in the private log)")
    return {str(pid): str(reason) for pid, reason in out}


def failure_stop(cfg: RunConfig, rnd: int, cohort: Sequence[int], outcome: RoundOutcome, *,
                 public: bool) -> str | None:
    """Why the run stops after round ``rnd`` (every sampled client failed, or more than
    ``max-failed-fraction`` of them), or None."""
    failed = set(outcome.failures) | set(outcome.aggregate.dropped)
    if not cohort or not failed:
        return None
    share = len(failed) / len(cohort)
    if len(failed) < len(cohort) and share <= cfg.max_failed_fraction:
        return None
    pid, reason = sorted({**outcome.aggregate.dropped, **outcome.failures}.items())[0]
    rule = ("every one of them" if len(failed) == len(cohort)
            else f"more than max-failed-fraction={cfg.max_failed_fraction:g}")
    if public:
        return (f"stopped after round {rnd}: {len(failed)} of {len(cohort)} sampled clients failed "
                f"({rule}); first: client {pid}: {_short_reason(reason)}")
    # counts and who took part are private: they stay in the private log
    return (f"stopped after round {rnd}: sampled clients failed ({rule}); first reason: "
            f"{_short_reason(reason)} (counts and client ids in the private log)")


def _short_reason(reason: str) -> str:
    """One short line of a client's failure (Flower wraps the exception's message in a long repr)."""
    text = str(reason)
    if "Message: " in text:
        text = text.rsplit("Message: ", 1)[1].rstrip("'>\n ")
    return " ".join(text.split())[:200]


def weighted_loss(updates: Sequence[ClientUpdate]) -> float | None:
    """The example-weighted mean of the updates' finite train losses (None: none)."""
    pairs = [(u.train_loss, u.num_examples or 1) for u in updates
             if u.train_loss is not None and math.isfinite(u.train_loss)]
    if not pairs:
        return None
    total = sum(n for _, n in pairs)
    return float(sum(loss * n for loss, n in pairs) / total)
