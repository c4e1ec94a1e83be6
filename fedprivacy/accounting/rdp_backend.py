"""The ``rdp`` backend: Renyi DP.

dp-accounting's Renyi-DP formulas (Mironov 2017; Mironov, Talwar & Zhang 2019 for the
Poisson-subsampled Gaussian; Wang, Balle & Kasiviswanathan 2019, Theorem 27, for sampling without
replacement under replace-one), converted with dp-accounting's ``compute_epsilon``. Every formula
used bounds the Renyi divergence of *both* orders of every neighbouring pair (one vector for both
directions), and RDP composes adaptively (Mironov 2017, Proposition 1): no direction pitfall.
dp-accounting's RDP of ``GaussianDpEvent`` ignores the neighbouring relation, so the accounted
noise multiplier is converted here (``z/(2s)`` under replace-one). Counts are applied here by
multiplying one release's RDP vector, never left to the library (it ignores ``count`` for some
events, ANCHORS.md).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from fedprivacy.accounting.backend_base import (
    Backend,
    _registered_rdp,
    _to_relation,
    is_builtin,
    to_dp_event,
)
from fedprivacy.accounting.events import (
    ExponentialEvent,
    FixedCohortSampling,
    GaussianEvent,
    Neighbouring,
    PoissonSampling,
    PrivacyEvent,
)

__all__ = ["RdpBackend"]


class RdpBackend(Backend):
    name = "rdp"
    description = "Renyi DP (dp-accounting formulas), looser than PLD"
    orders: ClassVar[np.ndarray] = np.asarray(rdp_lib.DEFAULT_RDP_ORDERS, dtype=np.float64)

    def _unsupported_reason(self, event: PrivacyEvent, neighbouring: Neighbouring) -> str | None:
        mech, sampling = event.mechanism, event.sampling
        if isinstance(sampling, PoissonSampling) and neighbouring is Neighbouring.REPLACE_ONE:
            return "the rdp accountant supports Poisson sampling only under add-remove"
        if isinstance(sampling, PoissonSampling | FixedCohortSampling) and not isinstance(
            mech, GaussianEvent
        ):
            return f"the rdp accountant supports sampling only for the Gaussian, not {mech.kind}"
        return None

    def _registered_reason(self, event: PrivacyEvent, neighbouring: Neighbouring) -> str | None:
        try:
            curve = _registered_rdp(event, self.orders, neighbouring)
        except (TypeError, ValueError, ArithmeticError) as exc:  # supports() never raises
            return f"the registered mechanism {event.mechanism.kind!r} has no valid RDP curve: {exc}"
        if curve is None:
            return (
                f"the registered mechanism {event.mechanism.kind!r} gives no RDP bound with "
                f"{event.sampling.describe()} under neighbouring={neighbouring.value}"
            )
        return None

    def run_state(self, event: PrivacyEvent, count: int, neighbouring: Neighbouring) -> Any:
        if not is_builtin(event):
            curve = _registered_rdp(event, self.orders, neighbouring)
            if curve is None:
                raise ValueError(self.unsupported_reason(event, neighbouring) or "unsupported event")
            return curve * count  # RDP composes additively (Mironov 2017, Prop. 1)
        one = to_dp_event(event.with_count(1), neighbouring)
        relation = _to_relation(neighbouring)
        if isinstance(event.mechanism, ExponentialEvent):
            relation = (
                NeighboringRelation.REPLACE_ONE
            )  # randomized response pair, see ExponentialEvent
        acc = rdp_lib.RdpAccountant(orders=list(self.orders), neighboring_relation=relation)
        acc.compose(one)
        # RDP composes additively: count releases have count times the RDP of one (Mironov 2017, Prop. 1).
        return np.asarray(acc.rdp, dtype=np.float64) * count

    def compose(self, first: Any, second: Any) -> Any:
        return first + second

    def epsilon(self, state: Any, *, delta: float) -> float:
        eps, _ = rdp_lib.compute_epsilon(self.orders, state, delta)
        return float(eps)

    def delta(self, state: Any, *, epsilon: float) -> float:
        delta, _ = rdp_lib.compute_delta(self.orders, state, epsilon)
        return min(1.0, float(delta))
