"""Write-ahead charging: a round function marks the point after which its release can be seen.

A round's privacy cost must be on disk before anyone can observe what the round releases.
Where that point is depends on the mode, and only the round function knows it:

* central (and none): after the updates arrived, before the server adds its noise and the aggregate
  exists (:func:`fedprivacy.fl.modes.base.plain_round`, ``release="aggregate"``);
* local: before the train messages go out, since each client's noised update is itself the release
  (``release="exchange"``);
* distributed (secure aggregation): after the masked inputs arrived, when the survivors and hence
  the event are known, before the unmask requests go out
  (:meth:`fedprivacy.fl.secure.server.SecureRound._protocol`).

The round function calls :func:`before_release` there. :class:`fedprivacy.fl.run.FederatedRun` runs
every round inside :func:`charging` with a hook that writes the charge to its
:class:`fedprivacy.accounting.journal.ChargeJournal` (fsync) and only then returns; if the hook
raises (budget), the exception leaves the round function before anything is released. Outside
:func:`charging` (a round function used on its own) :func:`before_release` does nothing, and
``FederatedRun.charge_before_release`` charges after the round, before anything is applied or shown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedprivacy.accounting.events import PrivacyEvent

__all__ = ["ChargeHook", "before_release", "charging"]

ChargeHook = Callable[["PrivacyEvent | None"], None]
"""Charges the round's release: the event that will be released (None: the plan's)."""

_HOOK: ContextVar[ChargeHook | None] = ContextVar("fedprivacy_charge_hook", default=None)


def before_release(event: PrivacyEvent | None = None) -> None:
    """Charge the current round's release now (durably), before it can be observed.

    Call it once per round, right before the first point at which anything the round releases can
    be seen, with the event that will be released (None: the plan's). Raises whatever the hook
    raises (``PrivacyBudgetExhausted``): then release nothing.
    """
    hook = _HOOK.get()
    if hook is not None:
        hook(event)


@contextmanager
def charging(hook: ChargeHook) -> Iterator[None]:
    """Make :func:`before_release` call ``hook`` while the block runs (one round)."""
    token = _HOOK.set(hook)
    try:
        yield
    finally:
        _HOOK.reset(token)
