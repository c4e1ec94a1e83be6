"""fedprivacy.attacks.user_membership: whole clients in or out, attacked through the shipped run loop.

Small real runs on digits (8x8): the pool, the halves, the pair counts at each level, the DP
calibration, and the attack's signal on an overfitting target against chance with strong noise.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedprivacy.attacks.lira_eval import ATTACKS
from fedprivacy.attacks.membership import FederatedTargetConfig
from fedprivacy.attacks.user_membership import user_membership_experiment, user_pool


def _digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    return x, d.target.astype(np.int64)


def test_pool_is_disjoint_clients_of_equal_size() -> None:
    index, groups = user_pool(1000, clients=10, per_client=30, seed=3)
    assert len(set(index.tolist())) == 300 and index.max() < 1000
    assert np.bincount(groups).tolist() == [30] * 10
    again, _ = user_pool(1000, clients=10, per_client=30, seed=3)
    assert np.array_equal(index, again)
    with pytest.raises(ValueError, match=r"clients \* per_client must be <= the data set's 100"):
        user_pool(100, clients=10, per_client=11, seed=0)
    with pytest.raises(ValueError, match="clients must be >= 4"):
        user_pool(100, clients=3, per_client=1, seed=0)


def _run(eps: float | None, *, models: int = 3, rounds: int = 3, attacks: tuple[str, ...] = ATTACKS):
    x, y = _digits()
    config = FederatedTargetConfig(clients=4, rounds=rounds, local_epochs=10, learning_rate=0.1,
                                   batch_size=8, model="mlp", hidden_units=64, clip_norm=1.0,
                                   target_epsilon=eps, sample_rate=1.0, target_delta=1e-3)
    return user_membership_experiment(x[:1400], y[:1400], x[1400:], y[1400:], config=config,
                                      clients=8, per_client=20, models=models, seed=1,
                                      attacks=attacks)


def test_overfit_target_leaks_membership_and_strong_noise_hides_it() -> None:
    no_dp = _run(None)
    rows = {(r["attack"], r["level"]): r for r in no_dp["rows"]}
    # K=3 models, 4 of 8 clients each: 12 member and 12 non-member clients, 240 examples each side
    assert (rows["loss", "user"]["members"], rows["loss", "user"]["nonmembers"]) == (12, 12)
    assert (rows["loss", "example"]["members"], rows["loss", "example"]["nonmembers"]) == (240, 240)
    assert rows["loss", "user"]["fpr_resolution"] == pytest.approx(1 / 12)
    assert no_dp["summary"]["train_accuracy"] > no_dp["summary"]["test_accuracy"]
    assert rows["loss", "user"]["auc"] > 0.8  # 20 examples per client make a small gap decisive (0.98 measured)
    dp = _run(1.0)
    assert dp["summary"]["epsilon"] == pytest.approx(1.0, rel=0.01)
    assert dp["summary"]["noise_multiplier"] > 3.0 and dp["summary"]["delta"] == 1e-3
    dp_rows = {(r["attack"], r["level"]): r for r in dp["rows"]}
    assert dp_rows["loss", "user"]["auc"] < rows["loss", "user"]["auc"]


def test_too_few_models_are_refused() -> None:
    with pytest.raises(ValueError, match="models must be >= 3"):
        _run(None, models=2)
    # a per-example variance from fewer than ~12 shadows a side flatters the defence at low FPR; refused
    # before any training
    with pytest.raises(ValueError, match="models must be >= 25 for a per-example variance"):
        _run(None, models=24, attacks=("loss", "lira-offline-exvar"))


def test_server_momentum_is_post_processing_of_the_same_release() -> None:
    from fedprivacy.attacks.membership import calibrated_noise_multiplier, train_on_clients

    x, y = _digits()
    parts = [np.arange(c * 20, (c + 1) * 20) for c in range(6)]

    def train(opt: str, rounds: int, eps: float | None = None):
        cfg = FederatedTargetConfig(rounds=rounds, local_epochs=2, model="mlp", hidden_units=8,
                                    target_epsilon=eps, sample_rate=1.0, target_delta=1e-3,
                                    server_optimizer=opt, server_momentum=0.9)
        return train_on_clients(x, y, parts, config=cfg, seed=4, noise_multiplier=calibrated_noise_multiplier(cfg))

    # FedAvgM's first step is FedAvg's (v = g, x - 1.0 v); from the second round on the momentum moves it
    for a, b in zip(train("fedavg", 1)[0], train("fedavgm", 1)[0], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    two_avg, two_m = train("fedavg", 2)[0], train("fedavgm", 2)[0]
    assert max(float(np.abs(a - b).max()) for a, b in zip(two_avg, two_m, strict=True)) > 1e-3
    # under DP the server optimizer acts on the released noised mean: same σ, same ε
    (_, eps_avg, sigma_avg), (_, eps_m, sigma_m) = train("fedavg", 2, 2.0), train("fedavgm", 2, 2.0)
    assert sigma_avg == sigma_m and eps_avg == pytest.approx(eps_m) and eps_m == pytest.approx(2.0, rel=0.01)
    with pytest.raises(ValueError, match="server_optimizer must be 'fedavg' or 'fedavgm'"):
        FederatedTargetConfig(server_optimizer="fedadam")


def test_dp_ceiling_is_gaussian_dp_for_one_round_and_tightens_with_noise() -> None:
    from scipy import stats

    from fedprivacy.attacks.user_membership import dp_roc_ceiling

    for sigma in (0.8, 2.0):  # one full-batch round: the trade-off is Φ(Φ⁻¹(FPR) + 1/σ), AUC Φ(1/(σ√2))
        c = dp_roc_ceiling(noise_multiplier=sigma, sample_rate=1.0, rounds=1)
        for f in (0.01, 0.001):
            assert c["tpr_at_fpr"][f] == pytest.approx(stats.norm.cdf(stats.norm.ppf(f) + 1 / sigma), rel=1e-3)
        assert c["auc"] == pytest.approx(stats.norm.cdf(1 / (sigma * np.sqrt(2))), abs=1e-4)
    # the pools' ε = 2 and ε = 4 (q = 0.4, T = 30, δ = 1e-5): below e^ε·FPR + δ, above chance
    two = dp_roc_ceiling(noise_multiplier=4.586517892165504, sample_rate=0.4, rounds=30)
    four = dp_roc_ceiling(noise_multiplier=2.594006525108257, sample_rate=0.4, rounds=30)
    assert 0.01 < two["tpr_at_fpr"][0.01] < four["tpr_at_fpr"][0.01] < np.exp(4) * 0.01
    assert two["tpr_at_fpr"][0.01] == pytest.approx(0.0332, abs=5e-4) and 0.5 < two["auc"] < four["auc"] < 0.75
    with pytest.raises(ValueError, match="noise_multiplier must be > 0"):
        dp_roc_ceiling(noise_multiplier=0.0, sample_rate=0.4, rounds=3)
