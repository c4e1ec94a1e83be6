"""User-level membership inference against federated models: was this *client* in the federation?

Setting ("a non-DP setting where the attack clearly succeeds"): a pool of ``U`` candidate
clients with ``n`` examples each is drawn from a data set; ``K`` federated models are trained, each on
a random half of the clients (whole clients: every example of a member client is a member), through
fedprivacy's own run loop and client pipeline (:func:`fedprivacy.attacks.membership.train_on_clients`:
``FederatedRun``, ``client_update``: local SGD, update clipping, central noise when DP is on). Every
model is attacked in turn with the other ``K - 1`` as its shadows (Carlini et al. 2022, Sec. V-A,
leave-one-out; :mod:`fedprivacy.attacks.lira_eval`), at example level and at user level (a client's
score is the mean of its examples' scores). Under user-level DP (McMahan et al. 2018) the client is the
unit of privacy, so the user-level attack is the one the guarantee bounds: for an (ε, δ)-DP training
run, any test has TPR <= e^ε FPR + δ (Kairouz, Oh & Viswanath 2015, Thm. 2.1), so the attack must fall
toward chance as ε shrinks.

Assumptions: the attacker knows the candidate clients' data and the training recipe (it trains the
shadows the same way), and sees only the final global model (a black-box loss / logit query).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fedprivacy.attacks.lira_eval import ATTACKS, EXVAR_ATTACKS, EXVAR_MIN_MODELS, membership_table
from fedprivacy.attacks.membership import (
    FederatedTargetConfig,
    _logits,
    calibrated_noise_multiplier,
    example_loss,
    logit_confidence,
    train_on_clients,
)

__all__ = ["EXVAR_MIN_MODELS", "dp_roc_ceiling", "user_membership_experiment", "user_pool"]


def user_pool(num_examples: int, *, clients: int, per_client: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The candidate clients: ``clients`` disjoint random groups of ``per_client`` example indices.

    Returns:
        ``(index, groups)``: ``index`` (``clients * per_client``,) into the data set and ``groups`` the
        client id (0..clients-1) of each of those examples.
    """
    from fedprivacy.dp.rng import RandomSource

    if clients < 4 or per_client < 1:
        raise ValueError(f"clients must be >= 4 and per_client >= 1, got {clients} and {per_client}")
    if clients * per_client > num_examples:
        raise ValueError(
            f"clients * per_client must be <= the data set's {num_examples} examples, got "
            f"{clients} * {per_client}")
    index = RandomSource.seeded(seed).child("user-pool").permutation(num_examples)[: clients * per_client]
    return np.asarray(index), np.repeat(np.arange(clients), per_client)


def dp_roc_ceiling(*, noise_multiplier: float, sample_rate: float, rounds: int,
                   fprs: Sequence[float] = (0.01, 0.001), grid: int = 2001) -> dict[str, Any]:
    """The most any test can achieve against one client under the run's mechanism: TPR at each FPR, and AUC.

    The mechanism is the run's (Poisson-subsampled Gaussian of multiplier ``noise_multiplier`` at rate
    ``sample_rate``, composed ``rounds`` times, add/remove of one client), through its privacy loss
    distribution (dp-accounting's PLD, the accountant's own): every (ε, δ(ε)) it satisfies bounds the
    trade-off, TPR <= min(e^ε FPR + δ(ε), 1 - e^-ε (1 - δ(ε) - FPR)) (Kairouz, Oh & Viswanath 2015,
    Thm. 2.1; Dong, Roth & Su 2022, Prop. 2.12: the minimum over the whole privacy profile). For one
    un-subsampled round this is Gaussian DP's Φ(Φ⁻¹(FPR) + 1/σ) (Dong et al. 2022, Sec. 2.3). Pooled
    (model, client) pairs of a random-halves experiment with one threshold are an average of such
    tests, so the bound is concave in FPR and holds for the pooled rates as well (Jensen).

    Returns ``{"tpr_at_fpr": {fpr: bound}, "auc": bound}`` (AUC = the area under the bound's curve).
    """
    from dp_accounting.pld import privacy_loss_distribution as pld

    if not noise_multiplier > 0 or not 0 < sample_rate <= 1 or rounds < 1:
        raise ValueError(f"noise_multiplier must be > 0, sample_rate in (0, 1] and rounds >= 1, got "
                         f"{noise_multiplier}, {sample_rate}, {rounds}")
    loss = pld.from_gaussian_mechanism(standard_deviation=noise_multiplier, sampling_prob=sample_rate,
                                       value_discretization_interval=1e-3)
    if rounds > 1:
        loss = loss.self_compose(rounds)
    eps = np.linspace(0.0, 30.0, 6001)
    delta = np.asarray(loss.get_delta_for_epsilon(eps), dtype=np.float64)

    def ceiling(f: np.ndarray) -> np.ndarray:
        a = np.exp(eps)[None, :] * f[:, None] + delta[None, :]
        b = 1.0 - np.exp(-eps)[None, :] * (1.0 - delta[None, :] - f[:, None])
        return np.clip(np.minimum(a, b).min(axis=1), f, 1.0)

    x = np.linspace(0.0, 1.0, grid)
    return {"tpr_at_fpr": {float(f): float(ceiling(np.array([float(f)]))[0]) for f in fprs},
            "auc": float(np.trapezoid(ceiling(x), x))}


def _check_models(models: int, attacks: Sequence[str]) -> None:
    if models < 3:
        raise ValueError(f"models must be >= 3 (a target plus IN and OUT shadows), got {models}")
    if models < EXVAR_MIN_MODELS and set(attacks) & set(EXVAR_ATTACKS):
        raise ValueError(f"models must be >= {EXVAR_MIN_MODELS} for a per-example variance "
                         f"({EXVAR_MIN_MODELS - 1} shadows, about half IN and half OUT per candidate), got {models}")


def _random_halves(*, models: int, clients: int, seed: int) -> np.ndarray:
    """``(models, clients)`` membership: each model's members are a seeded uniformly random half."""
    from fedprivacy.dp.rng import RandomSource

    rng = RandomSource.seeded(seed).child("user-halves")
    user_member = np.zeros((models, clients), dtype=bool)
    for k in range(models):
        user_member[k, rng.child(k).permutation(clients)[: clients // 2]] = True
    return user_member


def user_membership_experiment(
    x: np.ndarray,
    y: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    *,
    config: FederatedTargetConfig,
    clients: int,
    per_client: int,
    models: int,
    seed: int,
    progress: Callable[[str], None] | None = None,
    statistics: bool = False,
    attacks: Sequence[str] = ATTACKS,
) -> dict[str, Any]:
    """Train ``models`` federated models on random halves of ``clients`` candidate clients and attack them.

    Args:
        x, y: the data set the candidate clients are drawn from.
        x_test, y_test: held-out data for the models' test accuracy (utility at this ε).
        config: the training recipe (``target_epsilon`` None = no DP; else central DP with σ calibrated
            for (ε, δ, ``sample_rate``, ``rounds``) by the accountant); ``config.clients`` is ignored:
            each model's population is ``clients // 2``.
        clients, per_client: the candidate pool (U clients of n examples).
        models: K >= 3 (a target, and IN and OUT shadows among the others).
        seed: seeds the pool, the halves and every model's run (seeded research mode).
        statistics: add intervals and permutation p-values to every row
            (:func:`fedprivacy.attacks.lira_eval.membership_table`'s ``statistics``).
        attacks: the attacks of every row (:data:`fedprivacy.attacks.lira_eval.ATTACKS`, plus
            ``EXVAR_ATTACKS`` for LiRA with a per-example variance when K - 1 shadows allow it).

    Returns:
        ``{"rows": membership_table rows (loss, LiRA online/offline; example and user level),
        "summary": {test/train accuracy (mean, min, max over models), epsilon, noise_multiplier, ...}}``.
    """
    _check_models(models, attacks)
    index, groups = user_pool(len(y), clients=clients, per_client=per_client, seed=seed)
    px, py = np.asarray(x, dtype=np.float32)[index], np.asarray(y, dtype=np.int64)[index]
    user_member = _random_halves(models=models, clients=clients, seed=seed)
    sigma_dp = calibrated_noise_multiplier(config)
    phis: list[np.ndarray] = []
    losses: list[np.ndarray] = []
    stats: list[dict[str, Any]] = []
    for k in range(models):
        parts = [np.flatnonzero(groups == u) for u in np.flatnonzero(user_member[k])]
        weights, eps, sigma = train_on_clients(px, py, parts, config=config, seed=seed * 1000 + k,
                                               noise_multiplier=sigma_dp)
        z = _logits(config, weights, px)
        phis.append(logit_confidence(z, py))
        losses.append(example_loss(z, py))
        member = user_member[k, groups]
        test_acc = float(np.mean(np.argmax(_logits(config, weights, x_test), axis=1) == y_test))
        stats.append({"train_accuracy": float(np.mean(np.argmax(z[member], axis=1) == py[member])),
                      "test_accuracy": test_acc, "epsilon": eps, "noise_multiplier": sigma})
        if progress is not None:
            progress(f"{config.label}: model {k + 1}/{models} train acc {stats[-1]['train_accuracy']:.3f} "
                     f"test acc {test_acc:.3f}" + ("" if eps is None else f" eps {eps:.3g}"))
    eps_values = [s["epsilon"] for s in stats if s["epsilon"] is not None]
    epsilon = float(np.mean(eps_values)) if eps_values else None
    rows = membership_table(phi=np.stack(phis), loss=np.stack(losses), member=user_member[:, groups],
                            groups=groups, model=config.label, epsilon=epsilon, statistics=statistics,
                            attacks=attacks)
    test = [s["test_accuracy"] for s in stats]
    summary = {
        "label": config.label, "target_epsilon": config.target_epsilon, "epsilon": epsilon,
        "delta": config.target_delta if config.target_epsilon is not None else None,
        "noise_multiplier": float(stats[0]["noise_multiplier"]), "sample_rate": config.sample_rate,
        "rounds": config.rounds, "clip_norm": config.clip_norm if config.target_epsilon is not None else None,
        "accountant": "pld, Poisson" if config.target_epsilon is not None else "no privacy",
        "server_optimizer": config.server_optimizer,
        "test_accuracy": float(np.mean(test)), "test_accuracy_min": min(test),
        "test_accuracy_max": max(test),
        "train_accuracy": float(np.mean([s["train_accuracy"] for s in stats])),
        "models": models, "clients": clients, "per_client": per_client,
        "dp_ceiling": None if sigma_dp is None else dp_roc_ceiling(
            noise_multiplier=sigma_dp, sample_rate=config.sample_rate, rounds=config.rounds),
        "config": dataclasses.asdict(config),
    }
    return {"rows": rows, "summary": summary}
