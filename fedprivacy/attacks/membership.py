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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from fedprivacy.attacks.metrics import auc, roc_curve, tpr_at_fpr
from fedprivacy.config import default

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


def example_loss(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Cross-entropy ``-log p_y = log(1 + e^-phi)``, from :func:`logit_confidence`, without underflow.

    ``-log_softmax`` in float64 is exactly 0.0 once the margin passes ~37 (``1 + e^-margin == 1``), so a
    confident model's easiest examples all tie at 0 and a loss threshold cannot rank them (a tie wider
    than the FPR budget makes the TPR read 0); ``logaddexp(0, -phi)`` keeps ``e^-phi`` down to ~1e-308.
    """
    return np.logaddexp(0.0, -logit_confidence(logits, labels))


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

    ``target_delta`` and ``sample_rate`` take the run config's defaults (``fedprivacy.config.default``).
    The other defaults are this experiment's own, on purpose: a membership-inference target is a wide
    model (``mlp-large``, 256 hidden units) trained long (15 local epochs, small batches) on few clients
    so that it overfits and the attack has something to find; clip 1.0.
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
    target_delta: float = default("target_delta")
    sample_rate: float = default("sample_rate")
    server_optimizer: str = "fedavg"
    server_learning_rate: float = 1.0
    server_momentum: float = 0.9

    def __post_init__(self) -> None:
        if self.server_optimizer not in ("fedavg", "fedavgm"):
            raise ValueError(f"server_optimizer must be 'fedavg' or 'fedavgm', got {self.server_optimizer!r}")
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
    """Train one global model with fedprivacy's own run on the members ``member_idx`` of (x, y).

    The members are dealt round-robin (after a seeded shuffle) to ``config.clients`` clients, each of
    which runs the shipped client pipeline (:func:`fedprivacy.fl.client.client_update`: local SGD, Δ,
    clipping) inside a :class:`fedprivacy.fl.run.FederatedRun`. Returns ``(weights, epsilon_spent,
    noise_multiplier)``; epsilon is None without DP. ``noise_multiplier`` skips the run's calibration
    (pass :func:`calibrated_noise_multiplier` once for many models). ``output_dir``: also write the
    run's checkpoint and outputs there (default: nothing is written).
    """
    from fedprivacy.dp.rng import RandomSource

    order = RandomSource.seeded(seed).child("deal").permutation(len(member_idx))
    dealt = np.asarray(member_idx)[order]
    parts = [dealt[c :: config.clients] for c in range(config.clients)]
    return train_on_clients(x, y, parts, config=config, seed=seed, noise_multiplier=noise_multiplier,
                            output_dir=output_dir)


def train_on_clients(
    x: np.ndarray,
    y: np.ndarray,
    parts: Sequence[np.ndarray],
    *,
    config: FederatedTargetConfig,
    seed: int,
    noise_multiplier: float | None = None,
    output_dir: Path | None = None,
) -> tuple[list[np.ndarray], float | None, float]:
    """Like :func:`train_federated_model`, with the clients given: client ``c`` holds ``x[parts[c]]``.

    The population is ``len(parts)`` (``config.clients`` is not used); the user-level attack
    (:func:`fedprivacy.attacks.user_membership.user_membership_experiment`) picks whole clients.
    """
    from fedprivacy.fl.callbacks import default_callbacks
    from fedprivacy.fl.run import FederatedRun

    xs = np.asarray(x, dtype=np.float32)
    ys = np.asarray(y, dtype=np.int64)
    cfg = _target_run_config(config, seed=seed, noise_multiplier=noise_multiplier, output_dir=output_dir)
    hooks, exchange = _target_model(config, xs, ys, parts)
    quiet = lambda _m: None  # noqa: E731
    run = FederatedRun(cfg, population=len(parts), exchange=exchange, hooks=hooks, log=quiet,
                       callbacks=default_callbacks(quiet) if output_dir is not None else [],
                       run_dir=None if output_dir is None else Path(output_dir) / cfg.run_name)
    result = run.run()
    eps = result.results["privacy"].get("epsilon") if config.target_epsilon is not None else None
    return [np.asarray(w) for w in result.weights], (None if eps is None else float(eps)), float(
        result.plan.noise_multiplier)


def _target_run_config(config: FederatedTargetConfig, *, seed: int, noise_multiplier: float | None,
                       output_dir: Path | None) -> Any:
    from fedprivacy.config import RunConfig

    dp = config.target_epsilon is not None
    return RunConfig.from_mapping({
        "num-server-rounds": config.rounds, "model": config.model, "hidden-units": config.hidden_units,
        "local-epochs": config.local_epochs, "learning-rate": config.learning_rate,
        "batch-size": config.batch_size, "privacy": "central" if dp else "none",
        "clip-norm": config.clip_norm if dp else 0.0,
        "noise-multiplier": noise_multiplier if (dp and noise_multiplier) else 0.0,
        "target-epsilon": config.target_epsilon if (dp and not noise_multiplier) else 0.0,
        "target-delta": config.target_delta, "sampling": "poisson", "sample-rate": config.sample_rate,
        "seed": seed, "output-dir": str(output_dir or "runs"), "run-name": f"mia-{seed}",
        # the attack needs the final model only; the hooks evaluate on the whole candidate pool
        "eval-every": config.rounds,
        # FedAvgM (Hsu et al. 2019) acts on the released (noised) mean: post-processing, no privacy cost
        "server-optimizer": config.server_optimizer,
        **({"server-learning-rate": config.server_learning_rate, "server-momentum": config.server_momentum}
           if config.server_optimizer == "fedavgm" else {}),
    })


def _target_model(config: FederatedTargetConfig, xs: np.ndarray, ys: np.ndarray,
                  parts: Sequence[np.ndarray]) -> tuple[Any, Any]:
    """The target's model hooks, and an in-process exchange running the shipped client pipeline."""
    from fedprivacy.fl.client import client_update
    from fedprivacy.fl.task import LocalResult
    from fedprivacy.fl.types import ModelHooks
    from fedprivacy.ml.data import Split
    from fedprivacy.ml.models import build_model, get_weights, set_weights
    from fedprivacy.ml.train import evaluate, train_local

    num_classes, shape = int(ys.max()) + 1, xs.shape[1:]

    def model(weights: Sequence[np.ndarray] | None = None, seed: int | None = None) -> Any:
        m = build_model(config.model, input_shape=shape, num_classes=num_classes,
                        hidden=config.hidden_units, seed=seed)
        if weights is not None:
            set_weights(m, weights)
        return m

    def trainer(idx: np.ndarray, instr: Any) -> Any:
        def train(weights: Sequence[np.ndarray], seed: int) -> LocalResult:
            m = model(weights)
            res = train_local(m, Split(x=xs[idx], y=ys[idx]), epochs=instr.local_epochs,
                              lr=instr.learning_rate, batch_size=instr.batch_size, seed=seed)
            return LocalResult(weights=get_weights(m), num_examples=len(idx), loss=float(res.loss),
                               dpsgd_steps=None, dpsgd_sample_rate=None)
        return train

    def exchange(instr: Any, cohort: Sequence[int], weights: Sequence[np.ndarray]) -> Any:
        return [client_update(partition_id=pid, weights=weights, instructions=instr,
                              train=trainer(parts[pid], instr)) for pid in cohort if len(parts[pid])], {}

    hooks = ModelHooks(init=lambda s: get_weights(model(seed=s)),
                       evaluate=lambda w: evaluate(model(w), Split(x=xs, y=ys)), num_classes=num_classes)
    return hooks, exchange


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


def _pooled_scores(phi: np.ndarray, loss: np.ndarray, masks: np.ndarray
                   ) -> dict[str, tuple[list[np.ndarray], list[np.ndarray]]]:
    """Attack each model with the others as shadows; per attack, the member and non-member scores."""
    models, n = masks.shape
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
        for name, sc in score_sets.items():
            keep = usable if name != "loss-threshold" else np.ones(n, dtype=bool)
            pooled[name][0].append(sc[keep & masks[k]])
            pooled[name][1].append(sc[keep & ~masks[k]])
    return pooled


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
        weights, eps, sigma = train_federated_model(x, y, np.flatnonzero(masks[k]), config=config,
                                                    seed=seed * 1000 + k, noise_multiplier=sigma_dp)
        z = _logits(config, weights, x)
        phis.append(logit_confidence(z, y))
        losses.append(example_loss(z, y))
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
    pooled = _pooled_scores(np.stack(phis), np.stack(losses), masks)
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
