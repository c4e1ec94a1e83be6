"""Local training (plain SGD or sample-level DP-SGD on Opacus' per-example clipping) and evaluation.

Plain training shuffles with a seeded ``torch.Generator`` and batches tensors by hand (for these small
data sets a manual loop is several times faster than a ``DataLoader``).

DP-SGD (Abadi et al. 2016, "Deep Learning with Differential Privacy", Algorithm 1) uses Opacus'
``GradSampleModule`` and ``DPOptimizer``: per-example gradients are clipped to ``max_grad_norm``,
Gaussian noise of std ``noise_multiplier * max_grad_norm`` is added to their sum, and batches are
Poisson-sampled with rate ``q = 1 / ceil(n / batch_size)`` (Opacus' rate; about ``batch_size / n``),
``ceil(n / batch_size)`` batches per epoch. The privacy unit is *one training example of this client*
under add/remove-one neighbouring, and the epsilon reported is for the steps of this call only: a
client that trains in several rounds composes them (the ``dpsgd_*`` fields of :class:`TrainResult`
give the event: Poisson(q) x Gaussian(sigma), ``steps`` times), with fedprivacy's accountant.

Randomness. Both privacy-relevant draws of DP-SGD come from a :class:`fedprivacy.dp.rng.RandomSource`,
not from torch's generator: the Gaussian noise (:class:`RandomSourceDPOptimizer` replaces Opacus'
noise step, ``DPOptimizer.add_noise``) and the Poisson batch masks (:class:`PoissonBatchSampler`; the
sampling must be secret for the amplification the accountant claims). The source is the ``rng``
argument, else ``RandomSource.secure()`` (AES-256-CTR keyed from ``secrets``) when ``seed`` is None,
else ``RandomSource.seeded(seed)`` (reproducible research mode, NOT private);
``TrainResult.dpsgd_rng`` names it. Batch masks and noise are drawn from that one source in
execution order (a step's mask, then its noise per parameter), so a seeded run replays exactly. The noise is IEEE doubles rounded to the parameters' dtype, so
Mironov's (2012) floating-point attack applies to a raw noisy gradient; here only the model after
all local steps leaves the client. Opacus' own ``secure_mode`` (torchcsprng) is not used.
"""

from __future__ import annotations

import copy
import functools
import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedprivacy.accounting.accountant import epsilon_for
from fedprivacy.dp.rng import RandomSource
from fedprivacy.ml.data import Split

__all__ = [
    "DpsgdConfig",
    "PoissonBatchSampler",
    "TrainResult",
    "dpsgd_epsilon",
    "dpsgd_schedule",
    "evaluate",
    "train_local",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class DpsgdConfig:
    """Sample-level DP-SGD settings (Abadi et al. 2016).

    Attributes:
        noise_multiplier: sigma; the noise std is ``noise_multiplier * max_grad_norm``. > 0.
        max_grad_norm: per-example gradient L2 clip norm C. > 0.
        delta: the delta at which the per-example epsilon is reported, in (0, 1).
        secure_mode: refuse anything but a private source: with True, ``train_local`` raises if the
            DP-SGD randomness would be seeded (a ``seed`` without a secure ``rng``, or a seeded
            ``rng``). Default False: a seed gives the reproducible research mode.
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
        dpsgd_accountant: which accountant computed the epsilon, e.g. "fedprivacy-pld".
        dpsgd_rng: ``describe()`` of the source of the DP-SGD noise and batch sampling.
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
    dpsgd_rng: str | None = None
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

    fedprivacy's ``epsilon_for`` under add/remove neighbouring. Cached per process: a PLD evaluation
    takes seconds, and clients with equally many examples share (q, steps).
    """
    return _dpsgd_epsilon_cached(
        float(noise_multiplier), float(sample_rate), int(steps), float(delta), str(backend)
    )


@functools.lru_cache(maxsize=1024)
def _dpsgd_epsilon_cached(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float, backend: str
) -> tuple[float, str]:
    if steps == 0:
        return 0.0, "none"
    eps = epsilon_for(
        noise_multiplier=noise_multiplier,
        sample_rate=sample_rate,
        steps=steps,
        delta=delta,
        backend=backend,
    )
    return float(eps), f"fedprivacy-{backend}"


def train_local(
    model: nn.Module,
    split: Split,
    *,
    epochs: int = 1,
    lr: float = 0.1,
    batch_size: int = 32,
    seed: int | None = None,
    dpsgd: DpsgdConfig | None = None,
    rng: RandomSource | None = None,
    proximal_mu: float = 0.0,
    correction: Sequence[np.ndarray] | None = None,
) -> TrainResult:
    """Train ``model`` in place with SGD (optionally DP-SGD) on ``split``.

    Args:
        model: the model (its weights are updated in place).
        split: the client's training examples.
        epochs: passes over the data (DP-SGD: ``epochs * ceil(n / batch_size)`` Poisson steps).
        lr: SGD learning rate.
        batch_size: mini-batch size (DP-SGD: expected batch size; capped at n).
        seed: seed of the plain-SGD shuffling (torch's generator; not privacy-relevant) and, when
            ``rng`` is None, of DP-SGD's research-mode source ``RandomSource.seeded(seed)``;
            None = a fresh shuffle and a secure DP-SGD source.
        dpsgd: DP-SGD settings; None trains without sample-level DP.
        rng: the source of DP-SGD's noise and Poisson batches (a client passes its own); default
            from ``seed`` as above. Ignored without ``dpsgd``.
        proximal_mu: FedProx's μ (Li et al. 2020, Eq. 2): each step descends
            ``loss + μ/2 ‖w − w₀‖²`` with ``w₀`` the starting weights (Flower's FedProx client). Plain
            SGD only; training changes, the released update is clipped as ever (ε unchanged).
        correction: SCAFFOLD's ``c − c_i`` (Karimireddy et al. 2020, Alg. 1 line 10), one array per
            parameter in ``state_dict`` order: each step descends ``g(y) − c_i + c``. Plain SGD only;
            the model's state must be its parameters (no buffers).

    Returns:
        A :class:`TrainResult`.
    """
    _check_training_args(split, epochs, lr, batch_size)
    if dpsgd is not None and not isinstance(dpsgd, DpsgdConfig):
        raise TypeError(f"dpsgd must be a DpsgdConfig or None, got {type(dpsgd).__name__}")
    if rng is not None and not isinstance(rng, RandomSource):
        raise TypeError(f"rng must be a RandomSource or None, got {type(rng).__name__}")
    gen = torch.Generator()
    if seed is not None:
        gen.manual_seed(int(seed) % (2**63))
    else:
        gen.seed()
    if not proximal_mu >= 0:
        raise ValueError(f"proximal_mu must be >= 0, got {proximal_mu}")
    if dpsgd is not None:
        if proximal_mu > 0:
            raise ValueError("proximal_mu > 0 is not implemented with DP-SGD")
        if correction is not None:
            raise ValueError("a SCAFFOLD correction is not implemented with DP-SGD")
        if rng is None:
            rng = RandomSource.secure() if seed is None else RandomSource.seeded(int(seed) % 2**63)
        if dpsgd.secure_mode and not rng.is_private:
            raise ValueError(
                "secure_mode=True needs a private DP-SGD source, got "
                f"{rng.describe()}; pass rng=RandomSource.secure() (or no seed)"
            )
        return _train_dpsgd(
            model, split, epochs=epochs, lr=lr, batch_size=batch_size, rng=rng, cfg=dpsgd
        )

    return _train_sgd(model, split, epochs=epochs, lr=lr, batch_size=batch_size, gen=gen,
                      proximal_mu=proximal_mu, correction=_correction_tensors(model, correction))


def _correction_tensors(model: nn.Module, correction: Sequence[np.ndarray] | None) -> list[torch.Tensor] | None:
    """``correction`` as tensors of the trainable parameters' shapes and dtypes (None: no correction)."""
    if correction is None:
        return None
    state = model.state_dict()
    named = dict(model.named_parameters())
    if list(state) != list(named) or not all(p.requires_grad for p in named.values()):
        raise ValueError("correction (SCAFFOLD) needs a model whose state_dict is exactly its trainable "
                         f"parameters, got state {list(state)} and parameters {list(named)}")
    if len(correction) != len(named):
        raise ValueError(f"correction must hold one array per parameter ({len(named)}), got {len(correction)}")
    out: list[torch.Tensor] = []
    for (name, p), c in zip(named.items(), correction, strict=True):
        arr = np.asarray(c)
        if tuple(arr.shape) != tuple(p.shape) or not np.all(np.isfinite(arr)):
            raise ValueError(f"correction for {name} must be finite of shape {tuple(p.shape)}, got {arr.shape}")
        out.append(torch.from_numpy(np.array(arr, copy=True)).to(dtype=p.dtype, device=p.device))
    return out


def _train_sgd(model: nn.Module, split: Split, *, epochs: int, lr: float, batch_size: int,
               gen: torch.Generator, proximal_mu: float, correction: list[torch.Tensor] | None = None
               ) -> TrainResult:
    """Plain SGD for :func:`train_local`: FedProx's proximal step when ``proximal_mu > 0``, SCAFFOLD's
    corrected step ``g − c_i + c`` when ``correction`` is given."""
    x, y = _tensors(split)
    n = len(split)
    bs = min(batch_size, n)
    # Plain SGD (w <- w - lr * grad, no momentum or weight decay) written out: torch.optim.SGD's
    # per-call construction and profiling hooks cost more than the step itself on tiny partitions.
    params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
    anchor = [p.detach().clone() for p in params] if proximal_mu > 0 else None
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
                if anchor is not None:  # the gradient of μ/2 ‖w − w₀‖²
                    grads = tuple(torch._foreach_add(list(grads), torch._foreach_sub(params, anchor),
                                                     alpha=proximal_mu))
                if correction is not None:  # SCAFFOLD, Alg. 1 line 10: y <- y - lr (g(y) - c_i + c)
                    grads = tuple(torch._foreach_add(list(grads), correction))
                torch._foreach_add_(params, grads, alpha=-lr)
            steps += 1
            loss_sum += float(loss.detach()) * len(idx)
            seen += len(idx)
    return TrainResult(num_examples=n, loss=loss_sum / seen if seen else float("nan"), steps=steps)


class PoissonBatchSampler:
    """Opacus' ``UniformWithReplacementSampler`` with the masks drawn from a ``RandomSource``.

    Each of ``steps`` batches holds every index independently with probability ``sample_rate``
    (Poisson sampling, the sampling of the accounted event); batches may be empty. A batch sampler
    for ``torch.utils.data.DataLoader(batch_sampler=...)``.
    """

    def __init__(self, *, num_samples: int, sample_rate: float, steps: int, rng: RandomSource):
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
        if not 0.0 < sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be an int >= 1, got {steps!r}")
        self.num_samples, self.sample_rate, self.steps, self.rng = num_samples, sample_rate, steps, rng

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            mask = self.rng.bernoulli(self.sample_rate, size=self.num_samples)
            yield np.flatnonzero(mask).tolist()


def _dp_optimizer_class() -> type:
    """``RandomSourceDPOptimizer``, defined on first use so that importing this module stays light."""
    global _RandomSourceDPOptimizer
    if _RandomSourceDPOptimizer is None:
        from opacus.optimizers import DPOptimizer
        from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

        class RandomSourceDPOptimizer(DPOptimizer):  # type: ignore[misc]
            """Opacus' ``DPOptimizer`` whose one noise draw comes from a fedprivacy ``RandomSource``.

            Clipping, accumulation and scaling are Opacus'; ``add_noise`` is replaced: each
            parameter's summed clipped gradient gets ``N(0, (noise_multiplier * max_grad_norm)^2)``
            per coordinate from ``rng.normal`` (secure: AES-256-CTR, Marsaglia polar method) in
            float64, rounded once to the parameter's dtype. Opacus' ``generator`` is never used.
            """

            def __init__(self, optimizer: Any, *, rng: RandomSource, **kwargs: Any) -> None:
                if not isinstance(rng, RandomSource):
                    raise TypeError(f"rng must be a RandomSource, got {type(rng).__name__}")
                super().__init__(optimizer, generator=None, secure_mode=False, **kwargs)
                self.rng = rng

            def add_noise(self) -> None:
                std = self.noise_multiplier * self.max_grad_norm
                for p in self.params:
                    _check_processed_flag(p.summed_grad)
                    ref = p.summed_grad
                    noise = self.rng.normal(std=std, size=tuple(ref.shape))
                    noise_t = torch.from_numpy(np.asarray(noise)).to(device=ref.device, dtype=ref.dtype)
                    p.grad = (ref + noise_t).view_as(p)
                    _mark_as_processed(p.summed_grad)

        _RandomSourceDPOptimizer = RandomSourceDPOptimizer
    return _RandomSourceDPOptimizer


_RandomSourceDPOptimizer: type | None = None


def __getattr__(name: str) -> Any:
    """``from fedprivacy.ml.train import RandomSourceDPOptimizer`` (built lazily: Opacus is slow to
    import)."""
    if name == "RandomSourceDPOptimizer":
        return _dp_optimizer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dpsgd_schedule(*, num_examples: int, batch_size: int, epochs: int) -> tuple[int, float]:
    """The DP-SGD event of one :func:`train_local` call: ``(steps, sample_rate)``.

    ``ceil(n / min(batch_size, n))`` Poisson batches per epoch at rate ``q = 1 / ceil(...)`` (Opacus'
    rate for a loader of that length), ``epochs`` times: the call is ``steps`` compositions of the
    Poisson-subsampled Gaussian of rate ``q`` (Abadi et al. 2016, Alg. 1; Mironov, Talwar & Zhang 2019
    for its RDP). It depends only on the partition's size and the round's instructions, so the server
    can charge it before it sends the instructions.
    """
    for name, value in (("num_examples", num_examples), ("batch_size", batch_size), ("epochs", epochs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    steps_per_epoch = math.ceil(num_examples / min(batch_size, num_examples))
    return epochs * steps_per_epoch, 1.0 / steps_per_epoch


def _train_dpsgd(
    model: nn.Module,
    split: Split,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    rng: RandomSource,
    cfg: DpsgdConfig,
) -> TrainResult:
    from opacus import GradSampleModule
    from opacus.validators import ModuleValidator

    x, y = _tensors(split)
    n = len(split)
    total_steps, sample_rate = dpsgd_schedule(num_examples=n, batch_size=batch_size, epochs=epochs)
    steps_per_epoch = total_steps // epochs
    # Train a copy: Opacus attaches hooks to the module it wraps; the caller's model gets the weights.
    work = copy.deepcopy(model)
    work.train()
    ModuleValidator.validate(work, strict=True)  # what PrivacyEngine.make_private checks
    with warnings.catch_warnings():
        # torch warns that no *input* requires grad (only parameters do, as intended).
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        priv_model = GradSampleModule(work, batch_first=True, loss_reduction="mean")
        priv_model.forbid_grad_accumulation()  # Poisson batches: one backward per step
        priv_opt = _dp_optimizer_class()(
            torch.optim.SGD(priv_model.parameters(), lr=lr),
            rng=rng,
            noise_multiplier=float(cfg.noise_multiplier),
            max_grad_norm=float(cfg.max_grad_norm),
            expected_batch_size=int(n * sample_rate),
            loss_reduction="mean",
        )
        loader = _poisson_loader(x, y, sample_rate=sample_rate, steps=steps_per_epoch, rng=rng)
        steps, loss_sum, seen = _dpsgd_epochs(priv_model, priv_opt, loader, epochs=epochs)
        priv_model.remove_hooks()
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
        dpsgd_rng=rng.describe(),
        privacy_unit="example",
    )


def _poisson_loader(
    x: torch.Tensor, y: torch.Tensor, *, sample_rate: float, steps: int, rng: RandomSource
) -> Any:
    """A loader of ``steps`` Poisson batches (rate ``sample_rate``) drawn from ``rng``; empty ones kept."""
    from opacus.data_loader import CollateFnWithEmpty
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data._utils.collate import default_collate

    return DataLoader(
        TensorDataset(x, y),
        batch_sampler=PoissonBatchSampler(
            num_samples=len(y), sample_rate=sample_rate, steps=steps, rng=rng
        ),
        collate_fn=CollateFnWithEmpty(
            default_collate,
            sample_empty_shapes=[(0, *x.shape[1:]), (0,)],
            dtypes=[x.dtype, y.dtype],
        ),
    )


def _dpsgd_epochs(priv_model: Any, priv_opt: Any, loader: Any, *, epochs: int) -> tuple[int, float, int]:
    """Run ``epochs`` passes of DP-SGD; returns (steps, loss sum, examples) of the last epoch's loss."""
    loss_fn = nn.CrossEntropyLoss()
    steps = 0
    loss_sum, seen = 0.0, 0
    for _ in range(epochs):
        loss_sum, seen = 0.0, 0
        for xb, yb in loader:
            priv_opt.zero_grad(set_to_none=True)
            loss = loss_fn(priv_model(xb), yb)
            loss.backward()
            priv_opt.step()
            steps += 1
            if len(yb):  # Poisson batches may be empty; they still add noise
                loss_sum += float(loss.detach()) * len(yb)
                seen += len(yb)
    return steps, loss_sum, seen


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
