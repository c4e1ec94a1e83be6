"""The ``prv`` backend, a cross-check.

The privacy random variable accountant of Gopi, Lee & Wutschitz 2021 (package
``prv_accountant``, imported lazily), reported as its upper bound; Poisson-subsampled Gaussian under
add/remove only. ``prv_accountant`` composes only the "remove" direction, so the figure is the
maximum of its upper bound and the PLD's (which covers "add"). A cross-check, not the default.
"""

from __future__ import annotations

from typing import Any, ClassVar

from fedprivacy.accounting.backend_base import (
    Backend,
)
from fedprivacy.accounting.events import (
    GaussianEvent,
    Neighbouring,
    PoissonSampling,
    PrivacyEvent,
)
from fedprivacy.accounting.pld_backend import PldBackend

__all__ = ["PrvBackend"]


_PLD = PldBackend()  # the add direction (stateless)


class PrvBackend(Backend):
    name = "prv"
    description = (
        "privacy random variables (Gopi et al. 2021, prv_accountant), upper bound, "
        "with the PLD's add direction"
    )
    eps_error: ClassVar[float] = 0.01

    def _unsupported_reason(self, event: PrivacyEvent, neighbouring: Neighbouring) -> str | None:
        if not isinstance(event.mechanism, GaussianEvent) or not isinstance(
            event.sampling, PoissonSampling
        ):
            return "the prv accountant supports only the Poisson-sampled Gaussian"
        if neighbouring is not Neighbouring.ADD_REMOVE:
            return "the prv accountant supports only neighbouring=add-remove"
        return None

    def run_state(self, event: PrivacyEvent, count: int, neighbouring: Neighbouring) -> Any:
        if not isinstance(event.mechanism, GaussianEvent):
            raise ValueError(self.unsupported_reason(event, neighbouring) or "unsupported event")
        return ((event.with_count(1), count),)

    def compose(self, first: Any, second: Any) -> Any:
        return first + second

    def epsilon(self, state: Any, *, delta: float) -> float:
        """max(PRV upper bound, PLD): prv_accountant bounds only the remove direction.

        Its ``PoissonSubsampledGaussianMechanism`` is the privacy random variable of the pair
        (q N(1, r^2) + (1-q) N(0, r^2), N(0, r^2)) alone; add/remove DP also needs the reverse pair
        (Zhu, Dong & Wang 2022, Theorem 11). The PLD backend composes both directions (each
        composed on its own, valid because a pair's direction is fixed under add/remove), so the
        maximum of the two is an upper bound for both.
        """
        import prv_accountant  # lazily: a cross-check only

        prvs = []
        for ev, _ in state:
            mech = ev.mechanism
            if not isinstance(mech, GaussianEvent):
                raise ValueError(f"the prv accountant cannot account {mech.kind}")
            prvs.append(
                prv_accountant.PoissonSubsampledGaussianMechanism(
                    sampling_probability=ev.sampling.rate,
                    noise_multiplier=mech.effective_noise_multiplier(Neighbouring.ADD_REMOVE),
                )
            )
        counts = [c for _, c in state]
        acc = prv_accountant.PRVAccountant(
            prvs=prvs,
            max_self_compositions=counts,
            eps_error=self.eps_error,
            delta_error=delta / 1000.0,
        )
        _, _, eps_upper = acc.compute_epsilon(delta=delta, num_self_compositions=counts)
        pld = _PLD.epsilon_of_runs(list(state), Neighbouring.ADD_REMOVE, delta=delta)
        return max(float(eps_upper), pld)
