"""Adaptive server optimizers on the released pseudo-gradient: FedAvgM, FedAdagrad, FedAdam, FedYogi.

Each gets the global weights ``x`` and the round's released mean update ``Δ`` (clipped, noised and
averaged by the privacy mode before this step) and returns the next global weights. They only
post-process a released value, so they never change ε (Dwork & Roth 2014, Prop. 2.1), in every privacy
mode. The rules are those of Flower 1.42's strategies, so a fedprivacy run and a Flower run with the
same hyper-parameters follow the same trajectory on the same updates (pinned in
``tests/fl/test_server_optimizers.py`` against ``flwr.serverapp.strategy.{FedAvgM, FedAdagrad, FedAdam,
FedYogi}``):

* **FedAvgM** (Hsu, Qi & Brown 2019): pseudo-gradient ``g = -Δ``, momentum buffer ``v = g`` at the first
  step, then ``v = μ v + g``; ``x ← x - η v``. This is ``torch.optim.SGD(lr=η, momentum=μ)`` (also pinned).
* **FedAdam** (Reddi et al. 2021, Alg. 2): ``m = β1 m + (1-β1) Δ``, ``v = β2 v + (1-β2) Δ²``,
  ``x ← x + η_t m / (√v + τ)`` with Flower's bias-corrected rate
  ``η_t = η √(1-β2^(t+1)) / (1-β1^(t+1))`` at step t = 1, 2, ... (Kingma & Ba 2015, §2; Flower's
  exponent is t+1, and its τ sits outside the correction, so this is not ``torch.optim.Adam``).
* **FedAdagrad** (Reddi et al. 2021, Alg. 2): ``m = Δ`` (β1 = 0, fixed, as Flower's), ``v = v + Δ²``,
  ``x ← x + η m / (√v + τ)``; no second-moment decay, so it has no β.
* **FedYogi** (Reddi et al. 2021, Alg. 2; Zaheer et al. 2018): as FedAdam but
  ``v ← v - (1-β2) Δ² sign(v - Δ²)`` and the plain rate η.

Why written here rather than taken from a library: the library may not import Flower, and torch.optim
has no Yogi and a different Adam correction; each rule is a few numpy lines, pinned against both.
All arithmetic is float64; results are cast back to each weight's dtype. ``state_dict`` is JSON-ready
(arrays as base64 ``.npy`` bytes, exact) so the run's checkpoint restores the state bit for bit.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["FedAdagrad", "FedAdam", "FedAvgM", "FedYogi", "decode_arrays", "encode_arrays"]


def encode_arrays(arrays: Sequence[np.ndarray] | None) -> list[str] | None:
    """Arrays as base64 ``.npy`` strings (exact, JSON-ready); None stays None."""
    if arrays is None:
        return None
    out = []
    for a in arrays:
        buf = io.BytesIO()
        np.save(buf, np.asarray(a), allow_pickle=False)
        out.append(base64.b64encode(buf.getvalue()).decode("ascii"))
    return out


def decode_arrays(data: Any, *, what: str) -> list[np.ndarray] | None:
    """Inverse of :func:`encode_arrays`; ValueError naming ``what`` on anything else."""
    if data is None:
        return None
    if not isinstance(data, list) or not all(isinstance(s, str) for s in data):
        raise ValueError(f"{what} must be a list of base64 .npy strings or null")
    try:
        return [np.load(io.BytesIO(base64.b64decode(s, validate=True)), allow_pickle=False)
                for s in data]
    except (ValueError, OSError) as exc:
        raise ValueError(f"{what} is not valid base64 .npy data: {exc}") from None


def _check(name: str, value: Any, *, low: float, high: float | None = None,
           low_open: bool = False, high_open: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    too_low = v <= low if low_open else v < low
    too_high = high is not None and (v >= high if high_open else v > high)
    if not math.isfinite(v) or too_low or too_high:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        raise ValueError(f"{name} must be in {lo}{low:g}, {'inf' if high is None else f'{high:g}'}{hi}, got {value}")
    return v


def _f64(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def _check_shapes(weights: Sequence[np.ndarray], update: Sequence[np.ndarray],
                  state: Sequence[np.ndarray] | None) -> None:
    if len(weights) != len(update):
        raise ValueError(f"mean_update has {len(update)} arrays, weights have {len(weights)}")
    for i, (w, u) in enumerate(zip(weights, update, strict=True)):
        if np.shape(w) != np.shape(u):
            raise ValueError(f"mean_update array {i} has shape {np.shape(u)}, weights {np.shape(w)}")
    if state is not None and [np.shape(s) for s in state] != [np.shape(w) for w in weights]:
        raise ValueError("the optimizer state does not match the weights' shapes")


def _cast(new: Sequence[np.ndarray], like: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [n.astype(np.asarray(w).dtype) for n, w in zip(new, like, strict=True)]


def _check_state_keys(state: Mapping[str, Any], keys: set[str], name: str) -> None:
    if not isinstance(state, Mapping):
        raise ValueError(f"{name} state must be a mapping, got {type(state).__name__}")
    if state and set(state) != keys:
        raise ValueError(f"{name} state must have keys {sorted(keys)}, got {sorted(state)}")


class FedAvgM:
    """Server momentum: ``v = μ v + (-Δ)``, ``x ← x - η v`` (Hsu, Qi & Brown 2019).

    Args:
        learning_rate: server learning rate η (> 0); 1.0 with μ = 0 is FedAvg.
        momentum: μ in [0, 1).
    """

    name = "fedavgm"

    def __init__(self, *, learning_rate: float = 1.0, momentum: float = 0.9) -> None:
        self.learning_rate = _check("learning_rate", learning_rate, low=0.0, low_open=True)
        self.momentum = _check("momentum", momentum, low=0.0, high=1.0)
        self._velocity: list[np.ndarray] | None = None

    def step(self, weights: Sequence[np.ndarray], mean_update: Sequence[np.ndarray]) -> list[np.ndarray]:
        _check_shapes(weights, mean_update, self._velocity)
        grad = [-u for u in _f64(mean_update)]
        if self.momentum > 0:
            grad = grad if self._velocity is None else [
                self.momentum * v + g for v, g in zip(self._velocity, grad, strict=True)]
            self._velocity = grad
        new = [x - self.learning_rate * g for x, g in zip(_f64(weights), grad, strict=True)]
        return _cast(new, weights)

    def state_dict(self) -> dict[str, Any]:
        return {} if self._velocity is None else {"velocity": encode_arrays(self._velocity)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        _check_state_keys(state, {"velocity"}, self.name)
        self._velocity = decode_arrays(state.get("velocity"), what="fedavgm state velocity")


class _AdaptiveOptimizer:
    """The shared part of FedAdam and FedYogi: first moment m, second moment v, step count t."""

    name = ""

    def __init__(self, *, learning_rate: float, beta_1: float, beta_2: float, tau: float) -> None:
        self.learning_rate = _check("learning_rate", learning_rate, low=0.0, low_open=True)
        self.beta_1 = _check("beta_1", beta_1, low=0.0, high=1.0)
        self.beta_2 = _check("beta_2", beta_2, low=0.0, high=1.0)
        self.tau = _check("tau", tau, low=0.0, low_open=True)
        self._m: list[np.ndarray] | None = None
        self._v: list[np.ndarray] | None = None
        self._t = 0

    def _second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _rate(self, t: int) -> float:
        return self.learning_rate

    def step(self, weights: Sequence[np.ndarray], mean_update: Sequence[np.ndarray]) -> list[np.ndarray]:
        _check_shapes(weights, mean_update, self._m)
        delta = _f64(mean_update)
        m_old = self._m or [np.zeros_like(d) for d in delta]
        v_old = self._v or [np.zeros_like(d) for d in delta]
        m = [self.beta_1 * a + (1.0 - self.beta_1) * d for a, d in zip(m_old, delta, strict=True)]
        v = [self._second_moment(b, d * d) for b, d in zip(v_old, delta, strict=True)]
        rate = self._rate(self._t + 1)
        new = [x + rate * a / (np.sqrt(b) + self.tau)
               for x, a, b in zip(_f64(weights), m, v, strict=True)]
        self._m, self._v, self._t = m, v, self._t + 1  # commit after every computation
        return _cast(new, weights)

    def state_dict(self) -> dict[str, Any]:
        if self._m is None:
            return {}
        return {"step": self._t, "m": encode_arrays(self._m), "v": encode_arrays(self._v)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        _check_state_keys(state, {"step", "m", "v"}, self.name)
        if not state:
            self._m, self._v, self._t = None, None, 0
            return
        step = state["step"]
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"{self.name} state step must be an int >= 1, got {step!r}")
        m = decode_arrays(state["m"], what=f"{self.name} state m")
        v = decode_arrays(state["v"], what=f"{self.name} state v")
        if m is None or v is None or [a.shape for a in m] != [b.shape for b in v]:
            raise ValueError(f"{self.name} state m and v must be arrays of the same shapes")
        self._m, self._v, self._t = m, v, step


class FedAdam(_AdaptiveOptimizer):
    """FedAdam with Flower's bias-corrected rate (module docstring). Flower's defaults."""

    name = "fedadam"

    def __init__(self, *, learning_rate: float = 0.1, beta_1: float = 0.9, beta_2: float = 0.99,
                 tau: float = 1e-3) -> None:
        super().__init__(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, tau=tau)

    def _second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        return self.beta_2 * v + (1.0 - self.beta_2) * d2

    def _rate(self, t: int) -> float:
        return (self.learning_rate * math.sqrt(1.0 - self.beta_2 ** (t + 1))
                / (1.0 - self.beta_1 ** (t + 1)))


class FedYogi(_AdaptiveOptimizer):
    """FedYogi (module docstring). Flower's defaults."""

    name = "fedyogi"

    def __init__(self, *, learning_rate: float = 0.01, beta_1: float = 0.9, beta_2: float = 0.99,
                 tau: float = 1e-3) -> None:
        super().__init__(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, tau=tau)

    def _second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        return v - (1.0 - self.beta_2) * d2 * np.sign(v - d2)


class FedAdagrad(_AdaptiveOptimizer):
    """FedAdagrad (module docstring): β1 = 0 and an accumulated second moment. Flower's defaults."""

    name = "fedadagrad"

    def __init__(self, *, learning_rate: float = 0.1, tau: float = 1e-3) -> None:
        super().__init__(learning_rate=learning_rate, beta_1=0.0, beta_2=0.0, tau=tau)

    def _second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        return v + d2
