"""What a client's floor refuses with, and the sampler-truncation limits it accepts (shared by the
policy, :mod:`fedprivacy.fl.client_policy`, and the budget file, :mod:`fedprivacy.fl.client_budget`)."""

from __future__ import annotations

__all__ = ["MAX_TV_PER_ROUND", "MAX_TV_TOTAL", "PolicyRefusal"]

#: a distributed round's sampler-truncation term (total variation) the client accepts, and their total (honest
#: encodings: ~4e-69 a round at 10⁶ coordinates); the total keeps e^ε ΣG ≤ 1e-6 δ for every ε ≤ 96 at δ ≥ 1e-12
MAX_TV_PER_ROUND = 1e-64
MAX_TV_TOTAL = 1e-60


class PolicyRefusal(ValueError):
    """The server asked for something outside this client's own floor."""
