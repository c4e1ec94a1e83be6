"""SCAFFOLD (Karimireddy et al. 2020, "SCAFFOLD: Stochastic Controlled Averaging", Alg. 1, option II).

The server keeps the model ``x`` and a control variate ``c`` and sends both; client ``i`` keeps its own
``c_i`` in its own state (never sent), runs ``K`` local steps ``y <- y - lr (g(y) - c_i + c)``, then
``Δy_i = y_i - x``, ``c_i+ = c_i - c + (x - y_i) / (K lr)``, ``Δc_i = c_i+ - c_i``.

Privacy. The client releases ONE vector, the concatenation ``(Δy_i, Δc_i)``, clipped jointly to L2 norm
``C`` (re-clipped by the server in central mode), and the mode's noise covers every coordinate of it:
central ``N(0, (zC)²)`` on the sum, local the client's own Gaussian, distributed the discrete Gaussian
inside secure aggregation (whose mask covers ``Δc`` too). So a round is one release of sensitivity
``C`` (``2C`` replace-one; Dwork & Roth 2014, Thm. A.1; McMahan et al. 2018, Alg. 1) and the event and
ε are FedAvg's at the same ``z``, ``q``, ``T``: the control variates are not a second, uncharged
release. The distributed bound grows with the encoded dimension (Kairouz et al. 2021, Thm. 1), the
length of ``Δy ++ Δc``: its ε is FedAvg's for a model of that length. The server's
``x <- x + mean Δy`` and ``c <- c + (1/N) Σ Δc`` use only the noised sum (post-processing, Dwork &
Roth 2014, Prop. 2.1). ``c_i`` leaves the client only through that release, so keeping it releases
nothing; ``c_i+`` is Alg. 1's un-clipped value, so ``c`` tracks the mean of the clipped, noised ``Δc``.
docs/ROBUST_AGGREGATION.md says what the ε covers.

Refused (one line, naming the key): privacy ``dpftrl``, ``dpsgd``, a robust ``aggregation``,
``adaptive-clip``, ``batched-training = "on"`` and FedProx's ``proximal-mu``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fedprivacy.fl.server_optimizers import decode_arrays, encode_arrays

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig
    from fedprivacy.fl.types import AggregateResult

__all__ = ["ClientControl", "ScaffoldServer", "check_scaffold", "client_step", "split_arrays"]

_MODES = ("none", "central", "local", "distributed")


def check_scaffold(cfg: RunConfig) -> None:
    """Refuse a combination with ``scaffold = true`` this implementation cannot run or account for."""
    if not cfg.scaffold:
        return
    if cfg.privacy not in _MODES:
        raise ValueError(f"scaffold=true is implemented for privacy {', '.join(map(repr, _MODES))}, got "
                         f"{cfg.privacy!r} (the clients' joint (Δy, Δc) vector is not wired into that mode's release)")
    reasons = (  # (refused, key, what was asked, why)
        # Δc_i = -c - Δy_i/(K_i lr): the exact sum also gives sum_i Δy_i/K_i, and with unequal local step
        # counts K_i the server solves the two sums for single updates; only noise in the sum covers that
        (cfg.secagg and not cfg.mode.secure_noise, "secagg", "true",
         f"with privacy={cfg.privacy!r} the server unmasks the exact sum of (Δy, Δc), whose Δc half is "
         "sum_i Δy_i/K_i up to a known term, so unequal local step counts K_i reveal single updates; use "
         "privacy='distributed' (its noise covers the whole vector) or secagg=false"),
        (cfg.dpsgd, "dpsgd", "true", "Opacus would clip the correction c - c_i with each example's gradient"),
        (cfg.aggregation != "plain", "aggregation", repr(cfg.aggregation),
         "SCAFFOLD's server step is the mean of Δc (Alg. 1), which a robust rule does not output"),
        (cfg.adaptive_clip, "adaptive-clip", "true", "the adaptive estimate is not tested on the joint vector"),
        (cfg.batched_training == "on", "batched-training", "'on'",
         "the batched trainer has no per-client correction ('auto' trains SCAFFOLD clients one by one)"),
        (cfg.proximal_mu > 0, "proximal-mu", f"{cfg.proximal_mu:g}",
         "FedProx's term and SCAFFOLD's correction are two algorithms"),
    )
    for refused, key, value, why in reasons:
        if refused:
            raise ValueError(f"{key}={value} with scaffold=true is refused: {why}; "
                             f"set scaffold=false or change {key}")


def split_arrays(arrays: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``(x, c)`` from the broadcast ``x ++ c`` (two halves of equal shapes); ValueError otherwise."""
    n = len(arrays)
    if n == 0 or n % 2:
        raise ValueError(f"a SCAFFOLD round sends the model and its control variate (an even number of "
                         f"arrays), got {n}")
    x, c = list(arrays[: n // 2]), list(arrays[n // 2:])
    for i, (a, b) in enumerate(zip(x, c, strict=True)):
        if np.shape(a) != np.shape(b):
            raise ValueError(f"control variate array {i} has shape {np.shape(b)}, the model's {np.shape(a)}")
    return x, c


@dataclass(slots=True)
class ClientControl:
    """Client ``i``'s control variate ``c_i``, kept in its own state (None: zeros, before its first round)."""

    value: tuple[np.ndarray, ...] | None = None

    def current(self, like: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``c_i`` in float64, zeros of ``like``'s shapes when none is kept (or one of another model)."""
        if self.value is None or [np.shape(v) for v in self.value] != [np.shape(a) for a in like]:
            return [np.zeros(np.shape(a), dtype=np.float64) for a in like]
        return [np.asarray(v, dtype=np.float64) for v in self.value]


def client_step(x: Sequence[np.ndarray], c: Sequence[np.ndarray], c_i: Sequence[np.ndarray],
                y: Sequence[np.ndarray], *, steps: int, learning_rate: float
                ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Alg. 1 option II after ``steps`` local steps: the joint ``Δy ++ Δc`` and the new ``c_i+``.

    ``c_i+ = c_i - c + (x - y) / (K lr)``, ``Δc = c_i+ - c_i``, ``Δy = y - x`` (float64). A client whose
    training diverged (a non-finite ``y``) keeps its ``c_i``; its release is then zeroed by
    :func:`fedprivacy.fl.client.privatize_update` like any non-finite update.
    """
    if steps < 1 or not learning_rate > 0:
        raise ValueError(f"steps must be >= 1 and learning_rate > 0, got {steps} and {learning_rate}")
    f64 = [np.asarray(a, dtype=np.float64) for a in x]
    dy = [np.asarray(b, dtype=np.float64) - a for a, b in zip(f64, y, strict=True)]
    scale = 1.0 / (steps * learning_rate)
    new = [np.asarray(ci, dtype=np.float64) - np.asarray(cc, dtype=np.float64) - d * scale
           for ci, cc, d in zip(c_i, c, dy, strict=True)]
    if not all(np.all(np.isfinite(a)) for a in new):
        new = [np.asarray(ci, dtype=np.float64) for ci in c_i]
    dc = [n - np.asarray(ci, dtype=np.float64) for n, ci in zip(new, c_i, strict=True)]
    return dy + dc, new


class ScaffoldServer:
    """The server's control variate ``c``: sent with the model, moved by the released ``Δc`` only.

    Args:
        population: N, the number of clients (Alg. 1 line 17: ``c <- c + (1/N) Σ_{i∈S} Δc_i``).
        mode: the name of the run's privacy mode object (a custom ``FederatedRun(mode=...)`` included);
            one whose release is not wired for the joint vector is refused.
    """

    def __init__(self, *, population: int, mode: str = "none") -> None:
        if population < 1:
            raise ValueError(f"population must be >= 1, got {population}")
        if mode not in _MODES:
            raise ValueError(f"scaffold=true is implemented for privacy modes {', '.join(map(repr, _MODES))}, "
                             f"got a {mode!r} mode object")
        self.population = int(population)
        self.control: list[np.ndarray] | None = None

    def broadcast(self, weights: Sequence[np.ndarray]) -> list[np.ndarray]:
        """What the clients receive: ``x ++ c`` (``c`` starts at zeros, in the weights' dtypes)."""
        if self.control is None:
            self.control = [np.zeros(np.shape(w), dtype=np.float64) for w in weights]
        return [*weights, *(c.astype(np.asarray(w).dtype) for c, w in zip(self.control, weights, strict=True))]

    def update(self, aggregate: AggregateResult) -> tuple[np.ndarray, ...]:
        """Apply ``c += (denominator / N) · mean Δc`` (= the noised ``Σ Δc`` over N); returns the mean ``Δy``
        for the server optimizer. Uses the released aggregate only (post-processing)."""
        if self.control is None:
            raise ValueError("update() before broadcast(): no control variate to move")
        mean = aggregate.mean_update
        n = len(self.control)
        if len(mean) != 2 * n:
            raise ValueError(f"a SCAFFOLD aggregate holds the model's and Δc's arrays ({2 * n}), got {len(mean)}")
        scale = aggregate.denominator / self.population
        self.control = [c + scale * np.asarray(d, dtype=np.float64) for c, d in zip(self.control, mean[n:], strict=True)]
        return tuple(mean[:n])

    def state_dict(self) -> dict[str, Any]:
        return {} if self.control is None else {"control": encode_arrays(self.control)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        unknown = sorted(set(state) - {"control"})
        if unknown:
            raise ValueError(f"SCAFFOLD state has unknown keys {unknown}")
        control = decode_arrays(state.get("control"), what="SCAFFOLD control variate")
        self.control = None if control is None else [np.asarray(c, dtype=np.float64) for c in control]
