"""Membership inference against the federated global model: loss threshold and LiRA.

Threat model: after training, the adversary holds the released global model (white-box weights, but
the attacks use only its outputs on a candidate example) and candidate examples from the same
distribution; it must tell training members from non-members. It can train shadow models with the
same training procedure on data it controls.

Attacks:
- Loss threshold (Yeom, Giacomelli, Fredrikson & Jha 2018, "Privacy Risk in Machine Learning", Sec. 3.2
  / Alg. 1): score = ``-loss(model, x, y)``; members have lower loss when the model overfits.
- LiRA (Carlini, Chien, Nasr, Song, Terzis & Tramer 2022, "Membership Inference Attacks From First
  Principles", S&P, Alg. 1). Per example, the logit-scaled confidence
  ``phi = log(p_y / (1 - p_y)) = z_y - logsumexp_{j != y} z_j`` is approximately Gaussian over
  training randomness. Online: ``score = log N(phi; mu_in, s_in^2) - log N(phi; mu_out, s_out^2)``
  with ``mu`` from shadow models trained with/without the example. Offline: ``score = -log
  P[N(mu_out, s_out^2) > phi]`` (one-sided test against OUT models only). With few shadow models the
  paper's fixed-variance variant (Sec. VI-A) is used: one global variance per IN/OUT over all examples.

The targets here are trained by fedprivacy's own round loop (``fedprivacy.fl.run.run_federated``:
sampling, clipping, central Gaussian noise, PLD accounting with noise calibrated to a target epsilon),
with an exchange that trains each client on the examples the experiment assigns to it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import special, stats

from fedprivacy.attacks.metrics import auc, roc_curve, tpr_at_fpr

__all__ = [
    "FederatedTargetConfig",
    "MembershipScores",
    "attack_rows",
    "lira_offline_scores",
    "calibrated_noise_multiplier",
    "lira_online_scores",
    "logit_confidence",
    "loss_threshold_scores",
    "train_federated_model",
    "membership_experiment",
]


# ------------------------------------------------------------------------------------------ scores
def logit_confidence(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``phi = log(p_y / (1 - p_y)) = z_y - logsumexp_{j != y} z_j``, computed stably."""
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if z.ndim != 2 or y.shape != (z.shape[0],):
        raise ValueError(f"logits must be (N, C) and labels (N,), got {z.shape} and {y.shape}")
    zy = z[np.arange(len(y)), y]
    others = z.copy()
    others[np.arange(len(y)), y] = -np.inf
    m = np.max(others, axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.sum(np.exp(others - m), axis=1))
    return zy - lse


def loss_threshold_scores(losses: np.ndarray) -> np.ndarray:
    """Yeom et al. 2018: higher score = lower loss = more likely a member."""
    return -np.asarray(losses, dtype=np.float64)


def _fixed_or_per_example_std(
    values: np.ndarray, mask: np.ndarray, *, fixed_variance: bool
) -> np.ndarray:
    """Std of phi over the masked shadow models: per example, or one global value (fixed variance)."""
    masked = np.where(mask, values, np.nan)
    if fixed_variance:
        centred = masked - np.nanmean(masked, axis=0, keepdims=True)
        s = float(np.sqrt(np.nanmean(centred**2)))
        return np.full(values.shape[1], max(s, 1e-6))
    return np.maximum(np.nanstd(masked, axis=0), 1e-6)


def lira_online_scores(
    target_phi: np.ndarray,
    shadow_phi: np.ndarray,
    shadow_in: np.ndarray,
    *,
    fixed_variance: bool = True,
) -> np.ndarray:
    """Online LiRA (Carlini et al. 2022, Alg. 1): Gaussian likelihood ratio of IN vs OUT shadows.

    Args:
        target_phi: ``(N,)`` logit confidence of the target model on each candidate.
        shadow_phi: ``(K, N)`` the same for K shadow models.
        shadow_in: ``(K, N)`` bool, whether candidate n was in shadow k's training data.
        fixed_variance: one global variance per IN/OUT (recommended with few shadows).
    """
    phi, sp, si = _check_shadows(target_phi, shadow_phi, shadow_in)
    if not (si.any(axis=0).all() and (~si).any(axis=0).all()):
        raise ValueError("every candidate needs at least one IN and one OUT shadow model")
    mu_in = np.nanmean(np.where(si, sp, np.nan), axis=0)
    mu_out = np.nanmean(np.where(~si, sp, np.nan), axis=0)
    s_in = _fixed_or_per_example_std(sp, si, fixed_variance=fixed_variance)
    s_out = _fixed_or_per_example_std(sp, ~si, fixed_variance=fixed_variance)
    return stats.norm.logpdf(phi, mu_in, s_in) - stats.norm.logpdf(phi, mu_out, s_out)


def lira_offline_scores(
    target_phi: np.ndarray,
    shadow_phi: np.ndarray,
    shadow_in: np.ndarray,
    *,
    fixed_variance: bool = True,
) -> np.ndarray:
    """Offline LiRA (Carlini et al. 2022, Sec. VI-C): ``-log P[Z > phi]`` with Z ~ N(mu_out, s_out^2)."""
    phi, sp, si = _check_shadows(target_phi, shadow_phi, shadow_in)
    if not (~si).any(axis=0).all():
        raise ValueError("every candidate needs at least one OUT shadow model")
    mu_out = np.nanmean(np.where(~si, sp, np.nan), axis=0)
    s_out = _fixed_or_per_example_std(sp, ~si, fixed_variance=fixed_variance)
    return -stats.norm.logsf(phi, mu_out, s_out)


def _check_shadows(
    target_phi: np.ndarray, shadow_phi: np.ndarray, shadow_in: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    phi = np.asarray(target_phi, dtype=np.float64)
    sp = np.asarray(shadow_phi, dtype=np.float64)
    si = np.asarray(shadow_in, dtype=bool)
    if sp.ndim != 2 or sp.shape != si.shape or sp.shape[1] != phi.shape[0]:
        raise ValueError(
            f"shadow_phi and shadow_in must be (K, N) with N = len(target_phi), got {sp.shape}, "
            f"{si.shape}, {phi.shape}"
        )
    return phi, sp, si


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipScores:
    """Pooled attack scores for members and non-members of one target setting."""

    model: str
    epsilon: float | None
    attack: str
    members: np.ndarray
    nonmembers: np.ndarray


def attack_rows(scores: Sequence[MembershipScores]) -> list[dict[str, Any]]:
    """One JSON row per (model, epsilon, attack): AUC and TPR at FPR 1% and 0.1%."""
    rows = []
    for s in scores:
        rows.append(
            {
                "model": s.model,
                "epsilon": s.epsilon,
                "attack": s.attack,
                "auc": auc(s.members, s.nonmembers),
                "tpr_at_fpr_1pct": tpr_at_fpr(s.members, s.nonmembers, fpr=0.01),
                "tpr_at_fpr_01pct": tpr_at_fpr(s.members, s.nonmembers, fpr=0.001),
                "members": int(s.members.size),
                "nonmembers": int(s.nonmembers.size),
            }
        )
    return rows


def roc_points(s: MembershipScores) -> tuple[np.ndarray, np.ndarray]:
    """The ROC curve (fpr, tpr) of one score set, for plotting."""
    return roc_curve(s.members, s.nonmembers)


# ------------------------------------------------------------------------------------------ targets
@dataclass(frozen=True, slots=True, kw_only=True)
class FederatedTargetConfig:
    """How each target/shadow model is trained (FedAvg through ``fedprivacy.fl.run.run_federated``).

    ``target_epsilon`` None trains without DP; otherwise central DP with the noise multiplier
    calibrated by the accountant to (target_epsilon, target_delta) over ``rounds`` rounds.
    """

    clients: int = 20
    rounds: int = 10
    local_epochs: int = 15
    learning_rate: float = 0.1
    batch_size: int = 8
    model: str = "mlp-large"
    hidden_units: int = 256
    clip_norm: float = 1.0
    target_epsilon: float | None = None
    target_delta: float = 1e-5
    sample_rate: float = 1.0

    def __post_init__(self) -> None:
        if self.clients < 1 or self.rounds < 1 or self.local_epochs < 1:
            raise ValueError(
                f"clients, rounds and local_epochs must be >= 1, got {self.clients}, {self.rounds}, "
                f"{self.local_epochs}"
            )
        if self.target_epsilon is not None and self.target_epsilon <= 0:
            raise ValueError(f"target_epsilon must be > 0 or None, got {self.target_epsilon}")

    @property
    def label(self) -> str:
        return (
            "no-dp" if self.target_epsilon is None else f"central-dp(eps={self.target_epsilon:g})"
        )


def train_federated_model(
    x: np.ndarray,
    y: np.ndarray,
    member_idx: np.ndarray,
    *,
    config: FederatedTargetConfig,
    seed: int,
    noise_multiplier: float | None = None,
    output_dir: Path | None = None,
) -> tuple[list[np.ndarray], float | None, float]:
    """Train one global model with fedprivacy's round loop on the members ``member_idx`` of (x, y).

    The members are dealt round-robin (after a seeded shuffle) to ``config.clients`` clients. Returns
    ``(weights, epsilon_spent, noise_multiplier)``; epsilon is None without DP. ``noise_multiplier``
    skips the loop's calibration (pass :func:`calibrated_noise_multiplier` once for many models).
    """
    from fedprivacy.config import RunConfig
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.fl.checkpoint import load_checkpoint
    from fedprivacy.fl.client import client_rng, privatize_update
    from fedprivacy.fl.run import run_federated
    from fedprivacy.fl.types import ClientUpdate, ModelHooks, RoundInstructions
    from fedprivacy.ml.data import Split
    from fedprivacy.ml.models import build_model, get_weights, set_weights
    from fedprivacy.ml.train import evaluate, train_local

    xs = np.asarray(x, dtype=np.float32)
    ys = np.asarray(y, dtype=np.int64)
    order = RandomSource.seeded(seed).child("deal").permutation(len(member_idx))
    dealt = np.asarray(member_idx)[order]
    parts = [dealt[c :: config.clients] for c in range(config.clients)]
    num_classes = int(ys.max()) + 1
    shape = xs.shape[1:]

    dp = config.target_epsilon is not None
    tmp = tempfile.TemporaryDirectory() if output_dir is None else None
    out = Path(tmp.name) if tmp is not None else Path(output_dir)  # type: ignore[arg-type]
    cfg = RunConfig.from_mapping(
        {
            "num-server-rounds": config.rounds,
            "model": config.model,
            "hidden-units": config.hidden_units,
            "local-epochs": config.local_epochs,
            "learning-rate": config.learning_rate,
            "batch-size": config.batch_size,
            "privacy": "central" if dp else "none",
            "clip-norm": config.clip_norm if dp else 0.0,
            "noise-multiplier": noise_multiplier if (dp and noise_multiplier) else 0.0,
            "target-epsilon": config.target_epsilon if (dp and not noise_multiplier) else 0.0,
            "target-delta": config.target_delta,
            "sampling": "poisson",
            "sample-rate": config.sample_rate,
            "seed": seed,
            "output-dir": str(out),
            "run-name": f"mia-{seed}",
        }
    )

    def new_model() -> Any:
        return build_model(
            config.model, input_shape=shape, num_classes=num_classes, hidden=config.hidden_units
        )

    def init(init_seed: int) -> list[np.ndarray]:
        return get_weights(
            build_model(
                config.model,
                input_shape=shape,
                num_classes=num_classes,
                hidden=config.hidden_units,
                seed=init_seed,
            )
        )

    def evaluate_fn(weights: Sequence[np.ndarray]) -> tuple[float, float]:
        m = new_model()
        set_weights(m, weights)
        return evaluate(m, Split(x=xs, y=ys))

    def exchange(
        instr: RoundInstructions, cohort: Sequence[int], weights: Sequence[np.ndarray]
    ) -> tuple[list[ClientUpdate], dict[int, str]]:
        updates = []
        for pid in cohort:
            idx = parts[pid]
            if len(idx) == 0:
                continue
            m = new_model()
            set_weights(m, weights)
            rng = client_rng(seed=instr.seed, partition_id=pid, round=instr.round)
            res = train_local(
                m,
                Split(x=xs[idx], y=ys[idx]),
                epochs=instr.local_epochs,
                lr=instr.learning_rate,
                batch_size=instr.batch_size,
                seed=int(rng.child("train").integers(0, 2**31 - 1)),
            )
            delta = [
                np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
                for a, b in zip(get_weights(m), weights, strict=True)
            ]
            released = privatize_update(
                delta,
                privacy=instr.privacy,
                clip_norm=instr.clip_norm,
                local_noise_std=instr.local_noise_std,
                rng=rng.child("noise"),
            )
            updates.append(
                ClientUpdate(
                    partition_id=pid,
                    delta=tuple(released),
                    num_examples=len(idx),
                    train_loss=res.loss,
                )
            )
        return updates, {}

    hooks = ModelHooks(init=init, evaluate=evaluate_fn, num_classes=num_classes)
    try:
        results = run_federated(
            cfg, population=config.clients, exchange=exchange, hooks=hooks, log=lambda _m: None
        )
        ckpt = load_checkpoint(out / f"mia-{seed}" / "checkpoint")
        if ckpt is None:
            raise RuntimeError("the federated run left no checkpoint")
        weights = [np.asarray(w) for w in ckpt.weights]
    finally:
        if tmp is not None:
            tmp.cleanup()
    privacy = results.get("privacy", {})
    eps = privacy.get("epsilon") if dp else None
    sigma = float(privacy.get("noise_multiplier") or 0.0)
    return weights, (None if eps is None else float(eps)), sigma


def calibrated_noise_multiplier(config: FederatedTargetConfig) -> float | None:
    """The noise multiplier the accountant calibrates for the config's (target_epsilon, delta)."""
    if config.target_epsilon is None:
        return None
    from fedprivacy.accounting import PoissonSampling, calibrate_noise_multiplier

    return float(
        calibrate_noise_multiplier(
            target_epsilon=config.target_epsilon,
            target_delta=config.target_delta,
            sampling=PoissonSampling(rate=config.sample_rate),
            steps=config.rounds,
        )
    )


def _logits(
    config: FederatedTargetConfig, weights: Sequence[np.ndarray], x: np.ndarray
) -> np.ndarray:
    import torch

    from fedprivacy.ml.models import build_model, set_weights

    m = build_model(
        config.model, input_shape=x.shape[1:], num_classes=10, hidden=config.hidden_units
    )
    set_weights(m, weights)
    m.eval()
    with torch.no_grad():
        return m(torch.as_tensor(np.asarray(x, dtype=np.float32))).double().numpy()


def membership_experiment(
    x: np.ndarray,
    y: np.ndarray,
    *,
    config: FederatedTargetConfig,
    models: int,
    seed: int,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[MembershipScores], dict[str, float | None]]:
    """Train ``models`` federated models, each on a random half of (x, y); attack each in turn with the
    others as shadow models (leave-one-out, Carlini et al. 2022 Sec. V) and pool the scores.

    Returns the pooled scores per attack and a summary (mean train/test accuracy, epsilon, sigma).
    """
    from fedprivacy.dp.rng import RandomSource

    if models < 3:
        raise ValueError(f"models must be >= 3 (a target plus IN and OUT shadows), got {models}")
    n = len(y)
    rng = RandomSource.seeded(seed).child("membership")
    masks = np.zeros((models, n), dtype=bool)
    for k in range(models):
        masks[k, rng.permutation(n)[: n // 2]] = True
    phis, losses, eps_values, sigmas, train_acc, test_acc = [], [], [], [], [], []
    sigma_dp = calibrated_noise_multiplier(config)
    for k in range(models):
        weights, eps, sigma = train_federated_model(
            x,
            y,
            np.flatnonzero(masks[k]),
            config=config,
            seed=seed * 1000 + k,
            noise_multiplier=sigma_dp,
        )
        z = _logits(config, weights, x)
        phis.append(logit_confidence(z, y))
        logp = special.log_softmax(z, axis=1)
        losses.append(-logp[np.arange(n), y])
        correct = np.argmax(z, axis=1) == y
        train_acc.append(float(correct[masks[k]].mean()))
        test_acc.append(float(correct[~masks[k]].mean()))
        if eps is not None:
            eps_values.append(eps)
        sigmas.append(sigma)
        if progress is not None:
            progress(
                f"{config.label}: model {k + 1}/{models} train acc {train_acc[-1]:.3f} "
                f"test acc {test_acc[-1]:.3f}" + ("" if eps is None else f" eps {eps:.3g}")
            )
    phi = np.stack(phis)
    loss = np.stack(losses)
    pooled: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {
        "loss-threshold": ([], []),
        "lira-online-fixed-var": ([], []),
        "lira-offline-fixed-var": ([], []),
    }
    others_all = np.arange(models)
    for k in range(models):
        others = others_all[others_all != k]
        usable = masks[others].any(axis=0) & (~masks[others]).any(axis=0)
        score_sets = {
            "loss-threshold": loss_threshold_scores(loss[k]),
            "lira-online-fixed-var": np.full(n, np.nan),
            "lira-offline-fixed-var": np.full(n, np.nan),
        }
        score_sets["lira-online-fixed-var"][usable] = lira_online_scores(
            phi[k, usable], phi[others][:, usable], masks[others][:, usable]
        )
        score_sets["lira-offline-fixed-var"][usable] = lira_offline_scores(
            phi[k, usable], phi[others][:, usable], masks[others][:, usable]
        )
        for name, s in score_sets.items():
            keep = usable if name != "loss-threshold" else np.ones(n, dtype=bool)
            pooled[name][0].append(s[keep & masks[k]])
            pooled[name][1].append(s[keep & ~masks[k]])
    epsilon = float(np.mean(eps_values)) if eps_values else None
    scores = [
        MembershipScores(
            model=config.label,
            epsilon=epsilon,
            attack=name,
            members=np.concatenate(mem),
            nonmembers=np.concatenate(non),
        )
        for name, (mem, non) in pooled.items()
    ]
    summary = {
        "train_accuracy": float(np.mean(train_acc)),
        "test_accuracy": float(np.mean(test_acc)),
        "noise_multiplier": float(np.mean(sigmas)),
        "epsilon": epsilon,
    }
    return scores, summary
