"""Local training (plain SGD or sample-level DP-SGD with Opacus) and evaluation.

Plain training shuffles with a seeded ``torch.Generator`` and batches tensors by hand (for these small
data sets a manual loop is several times faster than a ``DataLoader``).

DP-SGD (Abadi et al. 2016, "Deep Learning with Differential Privacy", Algorithm 1) runs through Opacus'
``PrivacyEngine.make_private``: per-example gradients are clipped to ``max_grad_norm``, Gaussian noise of
std ``noise_multiplier * max_grad_norm`` is added to their sum, and batches are Poisson-sampled with
rate ``q = 1 / ceil(n / batch_size)`` (Opacus' rate; about ``batch_size / n``). The privacy unit is
*one training example of this client* under add/remove-one neighbouring, and the epsilon reported is
for the steps of this call only: a client that trains in several rounds composes them (the
``dpsgd_*`` fields of :class:`TrainResult` give the event: Poisson(q) x Gaussian(sigma), ``steps``
times). It is computed with fedprivacy's accountant (PLD) when ``fedprivacy.accounting`` provides
``epsilon_for``, else with Opacus' RDP accountant; ``TrainResult.dpsgd_accountant`` says which.

Randomness warning: with ``secure_mode=False`` (the default) Opacus draws the DP-SGD noise and the
Poisson batches from torch's Mersenne-Twister PRNG, seeded from ``seed``. That is fine for research and
not for deployment: a guess of the generator state undoes the noise. ``secure_mode=True`` is Opacus'
cryptographically secure mode (needs the ``torchcsprng`` package, which is not installed by default,
and is much slower); it cannot be seeded.
"""

from __future__ import annotations

import copy
import functools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedprivacy.ml.data import Split

__all__ = ["DpsgdConfig", "TrainResult", "train_local", "evaluate", "dpsgd_epsilon"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DpsgdConfig:
    """Sample-level DP-SGD settings (Abadi et al. 2016).

    Attributes:
        noise_multiplier: sigma; the noise std is ``noise_multiplier * max_grad_norm``. > 0.
        max_grad_norm: per-example gradient L2 clip norm C. > 0.
        delta: the delta at which the per-example epsilon is reported, in (0, 1).
        secure_mode: use Opacus' secure RNG (needs ``torchcsprng``; unseedable). Default False: noise
            from torch's PRNG, NOT for deployment.
        backend: fedprivacy accountant backend used for the reported epsilon ("pld", "rdp", "prv").
        compute_epsilon: report this call's epsilon in ``TrainResult.dpsgd_epsilon`` (a PLD evaluation
            takes ~1-3 s, cached per (q, steps)); set False when the server composes the per-example
            privacy from ``steps`` and ``dpsgd_sample_rate`` itself.
    """

    noise_multiplier: float
    max_grad_norm: float
    delta: float = 1e-5
    secure_mode: bool = False
    backend: str = "pld"
    compute_epsilon: bool = True

    def __post_init__(self) -> None:
        for name in ("noise_multiplier", "max_grad_norm", "delta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value}")
        if self.noise_multiplier <= 0:
            raise ValueError(f"noise_multiplier must be > 0, got {self.noise_multiplier}")
        if self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainResult:
    """Outcome of :func:`train_local`.

    Attributes:
        num_examples: training examples of the client (the FedAvg weight).
        loss: mean training loss over the last epoch (NaN if no example was seen).
        steps: optimizer steps taken.
        dpsgd_epsilon: per-example epsilon of this call's DP-SGD steps at ``dpsgd_delta``; None without
            DP or with ``compute_epsilon=False``.
        dpsgd_delta: the delta of ``dpsgd_epsilon``.
        dpsgd_sample_rate: Poisson sampling rate q used by DP-SGD.
        dpsgd_noise_multiplier: sigma used by DP-SGD.
        dpsgd_accountant: which accountant computed the epsilon, e.g. "fedprivacy-pld" or "opacus-rdp".
        privacy_unit: "example" with DP-SGD, else None.
    """

    num_examples: int
    loss: float
    steps: int
    dpsgd_epsilon: float | None = None
    dpsgd_delta: float | None = None
    dpsgd_sample_rate: float | None = None
    dpsgd_noise_multiplier: float | None = None
    dpsgd_accountant: str | None = None
    privacy_unit: str | None = None


def _check_training_args(split: Split, epochs: int, lr: float, batch_size: int) -> None:
    if not isinstance(split, Split):
        raise TypeError(f"split must be a Split, got {type(split).__name__}")
    if len(split) == 0:
        raise ValueError("split must hold at least one example")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an int >= 1, got {epochs}")
    if not (isinstance(lr, int | float) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be > 0, got {lr}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size}")


def _tensors(split: Split) -> tuple[torch.Tensor, torch.Tensor]:
    # copy: cached splits are read-only numpy arrays, which torch.from_numpy refuses to share silently
    return torch.from_numpy(np.array(split.x, copy=True)), torch.from_numpy(
        np.array(split.y, copy=True)
    )


def dpsgd_epsilon(
    *, noise_multiplier: float, sample_rate: float, steps: int, delta: float, backend: str = "pld"
) -> tuple[float, str]:
    """Per-example epsilon of ``steps`` Poisson-sampled Gaussian steps, and the accountant's label.

    Uses ``fedprivacy.accounting.epsilon_for`` (add/remove neighbouring) when it is available, else
    Opacus' RDP accountant (Mironov 2017; Mironov, Talwar, Zhang 2019 for the sampled Gaussian).
    Cached per process: a PLD evaluation takes seconds, and clients with equally many examples share
    (q, steps).
    """
    return _dpsgd_epsilon_cached(
        float(noise_multiplier), float(sample_rate), int(steps), float(delta), str(backend)
    )


def _fedprivacy_epsilon_for() -> Callable[..., float] | None:
    """``fedprivacy.accounting.epsilon_for`` if that module is available, else None."""
    try:
        from fedprivacy.accounting import accountant
    except ImportError:
        return None
    return getattr(accountant, "epsilon_for", None)


@functools.lru_cache(maxsize=1024)
def _dpsgd_epsilon_cached(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float, backend: str
) -> tuple[float, str]:
    if steps == 0:
        return 0.0, "none"
    epsilon_for = _fedprivacy_epsilon_for()
    if epsilon_for is not None:
        eps = epsilon_for(
            noise_multiplier=noise_multiplier,
            sample_rate=sample_rate,
            steps=steps,
            delta=delta,
            backend=backend,
        )
        return float(eps), f"fedprivacy-{backend}"
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(float(noise_multiplier), float(sample_rate), int(steps))]
    return float(acc.get_epsilon(delta=delta)), "opacus-rdp"


def train_local(
    model: nn.Module,
    split: Split,
    *,
    epochs: int = 1,
    lr: float = 0.1,
    batch_size: int = 32,
    seed: int | None = None,
    dpsgd: DpsgdConfig | None = None,
) -> TrainResult:
    """Train ``model`` in place with SGD (optionally DP-SGD) on ``split``.

    Args:
        model: the model (its weights are updated in place).
        split: the client's training examples.
        epochs: passes over the data (DP-SGD: ``epochs * ceil(n / batch_size)`` Poisson steps).
        lr: SGD learning rate.
        batch_size: mini-batch size (DP-SGD: expected batch size; capped at n).
        seed: seed of the shuffling / Poisson sampling and (non-secure mode) DP-SGD noise;
            None = a fresh non-deterministic seed (still torch's PRNG; see the module docstring).
        dpsgd: DP-SGD settings; None trains without sample-level DP.

    Returns:
        A :class:`TrainResult`.
    """
    _check_training_args(split, epochs, lr, batch_size)
    if dpsgd is not None and not isinstance(dpsgd, DpsgdConfig):
        raise TypeError(f"dpsgd must be a DpsgdConfig or None, got {type(dpsgd).__name__}")
    gen = torch.Generator()
    if seed is not None:
        gen.manual_seed(int(seed) % (2**63))
    else:
        gen.seed()
    if dpsgd is not None:
        return _train_dpsgd(
            model, split, epochs=epochs, lr=lr, batch_size=batch_size, gen=gen, seed=seed, cfg=dpsgd
        )

    x, y = _tensors(split)
    n = len(split)
    bs = min(batch_size, n)
    # Plain SGD (w <- w - lr * grad, no momentum or weight decay) written out: torch.optim.SGD's
    # per-call construction and profiling hooks cost more than the step itself on tiny partitions.
    params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
    model.train()
    steps = 0
    loss_sum, seen = 0.0, 0
    for _ in range(epochs):
        loss_sum, seen = 0.0, 0
        perm = torch.randperm(n, generator=gen)
        for start in range(0, n, bs):
            idx = perm[start : start + bs]
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                torch._foreach_add_(params, grads, alpha=-lr)
            steps += 1
            loss_sum += float(loss.detach()) * len(idx)
            seen += len(idx)
    return TrainResult(num_examples=n, loss=loss_sum / seen if seen else float("nan"), steps=steps)


def _train_dpsgd(
    model: nn.Module,
    split: Split,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    gen: torch.Generator,
    seed: int | None,
    cfg: DpsgdConfig,
) -> TrainResult:
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    x, y = _tensors(split)
    n = len(split)
    # Train a copy: Opacus attaches hooks to the module it wraps; the caller's model gets the weights.
    work = copy.deepcopy(model)
    work.train()
    opt = torch.optim.SGD(work.parameters(), lr=lr)
    loader = DataLoader(TensorDataset(x, y), batch_size=min(batch_size, n), generator=gen)
    noise_gen = None
    if not cfg.secure_mode:
        noise_gen = torch.Generator()
        if seed is not None:
            noise_gen.manual_seed((int(seed) * 2654435761 + 1) % (2**63))
        else:
            noise_gen.seed()
    loss_fn = nn.CrossEntropyLoss()
    steps = 0
    loss_sum, seen = 0.0, 0
    with warnings.catch_warnings():
        # Opacus warns on every engine that secure RNG is off (the module docstring states it), and
        # torch that no *input* requires grad (only parameters do, as intended).
        warnings.filterwarnings("ignore", message="Secure RNG turned off")
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        engine = PrivacyEngine(accountant="rdp", secure_mode=cfg.secure_mode)
        priv_model, priv_opt, priv_loader = engine.make_private(
            module=work,
            optimizer=opt,
            data_loader=loader,
            noise_multiplier=float(cfg.noise_multiplier),
            max_grad_norm=float(cfg.max_grad_norm),
            poisson_sampling=True,
            noise_generator=noise_gen,
        )
        for _ in range(epochs):
            loss_sum, seen = 0.0, 0
            for xb, yb in priv_loader:
                priv_opt.zero_grad(set_to_none=True)
                loss = loss_fn(priv_model(xb), yb)
                loss.backward()
                priv_opt.step()
                steps += 1
                if len(yb):  # Poisson batches may be empty; they still add noise
                    loss_sum += float(loss.detach()) * len(yb)
                    seen += len(yb)
    sample_rate = 1.0 / len(loader)
    model.load_state_dict(work.state_dict())
    eps: float | None = None
    label: str | None = None
    if cfg.compute_epsilon:
        eps, label = dpsgd_epsilon(
            noise_multiplier=cfg.noise_multiplier,
            sample_rate=sample_rate,
            steps=steps,
            delta=cfg.delta,
            backend=cfg.backend,
        )
    return TrainResult(
        num_examples=n,
        loss=loss_sum / seen if seen else float("nan"),
        steps=steps,
        dpsgd_epsilon=eps,
        dpsgd_delta=cfg.delta,
        dpsgd_sample_rate=sample_rate,
        dpsgd_noise_multiplier=cfg.noise_multiplier,
        dpsgd_accountant=label,
        privacy_unit="example",
    )


@torch.no_grad()
def evaluate(model: nn.Module, split: Split, *, batch_size: int = 512) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy of ``model`` on ``split``.

    Returns:
        ``(loss, accuracy)``, accuracy in [0, 1].
    """
    if not isinstance(split, Split):
        raise TypeError(f"split must be a Split, got {type(split).__name__}")
    if len(split) == 0:
        raise ValueError("split must hold at least one example")
    x, y = _tensors(split)
    was_training = model.training
    model.eval()
    loss_sum, correct = 0.0, 0
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    for start in range(0, len(split), batch_size):
        logits = model(x[start : start + batch_size])
        yb = y[start : start + batch_size]
        loss_sum += float(loss_fn(logits, yb))
        correct += int((logits.argmax(dim=1) == yb).sum())
    model.train(was_training)
    return loss_sum / len(split), correct / len(split)
