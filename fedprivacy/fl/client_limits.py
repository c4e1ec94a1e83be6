"""What a client's floor refuses with, the sampler-truncation limits it accepts (shared by the policy,
:mod:`fedprivacy.fl.client_policy`, and the budget file, :mod:`fedprivacy.fl.client_budget`), and the
crowd floor: the smallest aggregate a secure round may release with this client's input in it.

The crowd floor holds in every mode, ``privacy = none`` included: secure aggregation hides an input
only in a sum of enough others, and t, the required survivors and the roster are the server's choice
(a world of 3 with a colluder of the server's releases the exact sum of two honest inputs)."""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_TV_PER_ROUND", "MAX_TV_TOTAL", "PolicyRefusal", "check_crowd"]

#: a distributed round's sampler-truncation term (total variation) the client accepts, and their total (honest
#: encodings: ~4e-69 a round at 10⁶ coordinates); the total keeps e^ε ΣG ≤ 1e-6 δ for every ε ≤ 96 at δ ≥ 1e-12
MAX_TV_PER_ROUND = 1e-64
MAX_TV_TOTAL = 1e-60


class PolicyRefusal(ValueError):
    """The server asked for something outside this client's own floor."""


def check_crowd(floor: Any, *, threshold: int | None = None, survivors: int | None = None, colluders: int = 0,
                roster: int | None = None) -> None:
    """Refuse (:class:`PolicyRefusal`) a secure round below ``floor``'s ``min_threshold``,
    ``min_survivors`` (counted without the ``colluders``) or ``min_roster``; ``None``: not checked."""
    if threshold is not None and threshold < floor.min_threshold:
        raise PolicyRefusal(f"server's secure round has threshold {threshold} < {floor.min_threshold} "
                            "(node config client-min-threshold)")
    if survivors is not None and survivors - colluders < floor.min_survivors:
        raise PolicyRefusal(f"server's secure round may release a sum of {survivors} inputs, {colluders} of "
                            f"them assumed the server's: fewer than {floor.min_survivors} others (node config "
                            "client-min-survivors)")
    if roster is not None and roster < floor.min_roster:
        raise PolicyRefusal(f"server's secure round has a roster of {roster} < {floor.min_roster} "
                            "(node config client-min-roster)")
