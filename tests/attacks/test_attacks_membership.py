"""Membership-inference scores: closed forms, and a LiRA that finds a planted signal."""

import numpy as np
import pytest
from scipy import special, stats

from fedprivacy.attacks.membership import (
    FederatedTargetConfig,
    MembershipScores,
    attack_rows,
    example_loss,
    lira_offline_scores,
    lira_online_scores,
    logit_confidence,
    loss_threshold_scores,
)
from fedprivacy.dp.rng import RandomSource


def test_logit_confidence_equals_log_odds_of_the_true_class() -> None:
    z = np.array([[2.0, 0.5, -1.0], [0.0, 3.0, 1.0]])
    y = np.array([0, 2])
    p = special.softmax(z, axis=1)[np.arange(2), y]
    np.testing.assert_allclose(logit_confidence(z, y), np.log(p / (1 - p)), rtol=1e-12)


def test_loss_threshold_ranks_low_loss_as_member() -> None:
    scores = loss_threshold_scores(np.array([0.1, 2.0]))
    assert scores[0] > scores[1]


def test_lira_online_matches_the_gaussian_likelihood_ratio() -> None:
    # 4 shadows, 2 candidates; candidate 0 IN for shadows 0,1, candidate 1 IN for shadows 2,3
    shadow_phi = np.array([[3.0, 0.0], [5.0, 1.0], [1.0, 4.0], [-1.0, 6.0]])
    shadow_in = np.array([[True, False], [True, False], [False, True], [False, True]])
    target = np.array([4.0, 2.0])
    got = lira_online_scores(target, shadow_phi, shadow_in, fixed_variance=False)
    # candidate 0: IN {3, 5} mean 4 std 1; OUT {1, -1} mean 0 std 1
    expected0 = stats.norm.logpdf(4.0, 4.0, 1.0) - stats.norm.logpdf(4.0, 0.0, 1.0)
    # candidate 1: IN {4, 6} mean 5 std 1; OUT {0, 1} mean 0.5 std 0.5
    expected1 = stats.norm.logpdf(2.0, 5.0, 1.0) - stats.norm.logpdf(2.0, 0.5, 0.5)
    np.testing.assert_allclose(got, [expected0, expected1], rtol=1e-12)
    off = lira_offline_scores(target, shadow_phi, shadow_in, fixed_variance=False)
    np.testing.assert_allclose(off[0], -stats.norm.logsf(4.0, 0.0, 1.0), rtol=1e-12)


def test_lira_separates_a_planted_membership_signal_and_not_a_null_one() -> None:
    rng = RandomSource.seeded(0)
    k, n = 16, 2000
    shadow_in = rng.bernoulli(0.5, (k, n)).astype(bool)
    base = rng.normal(std=2.0, size=n)  # per-example difficulty, shared by all models
    shift = 1.0  # membership raises phi by 1, model noise std 0.5
    shadow_phi = base + shift * shadow_in + rng.normal(std=0.5, size=(k, n))
    target_in = rng.bernoulli(0.5, n).astype(bool)
    target_phi = base + shift * target_in + rng.normal(std=0.5, size=n)
    s = lira_online_scores(target_phi, shadow_phi, shadow_in)
    rows = attack_rows(
        [
            MembershipScores(
                model="m",
                epsilon=None,
                attack="lira",
                members=s[target_in],
                nonmembers=s[~target_in],
            )
        ]
    )
    # optimal test between N(0, 0.5^2) and N(1, 0.5^2): AUC = Phi(1 / (0.5 * sqrt(2))) = 0.921
    assert rows[0]["auc"] == pytest.approx(stats.norm.cdf(1 / (0.5 * np.sqrt(2))), abs=0.03)
    null = lira_online_scores(base + rng.normal(std=0.5, size=n), shadow_phi, shadow_in)
    a = attack_rows(
        [
            MembershipScores(
                model="m",
                epsilon=None,
                attack="lira",
                members=null[target_in],
                nonmembers=null[~target_in],
            )
        ]
    )[0]["auc"]
    assert abs(a - 0.5) < 0.05


def test_target_config_validates() -> None:
    with pytest.raises(ValueError, match="target_epsilon"):
        FederatedTargetConfig(target_epsilon=-1.0)


@pytest.mark.slow
def test_membership_experiment_runs_through_the_federated_loop() -> None:
    from sklearn.datasets import load_digits

    from fedprivacy.attacks.membership import membership_experiment

    d = load_digits()
    idx = np.arange(0, 1797, 15)
    x, y = (d.data[idx] / 16.0).astype(np.float32), d.target[idx].astype(np.int64)
    cfg = FederatedTargetConfig(clients=2, rounds=2, local_epochs=5, model="mlp", hidden_units=32)
    scores, summary = membership_experiment(x, y, config=cfg, models=3, seed=1)
    rows = attack_rows(scores)
    assert {r["attack"] for r in rows} == {
        "loss-threshold",
        "lira-online-fixed-var",
        "lira-offline-fixed-var",
    }
    assert summary["train_accuracy"] >= summary["test_accuracy"] - 0.1
    assert all(0.0 <= r["auc"] <= 1.0 for r in rows)


def test_example_loss_is_cross_entropy_and_ranks_confident_examples() -> None:
    from scipy import special

    rng = np.random.default_rng(0)
    z, y = rng.normal(0, 3, (200, 10)), rng.integers(0, 10, 200)
    np.testing.assert_allclose(example_loss(z, y), -special.log_softmax(z, axis=1)[np.arange(200), y],
                               rtol=1e-12, atol=1e-14)
    # margins 40, 50, 60: -log_softmax is exactly 0.0 for all three (a tie); the loss keeps e^-margin
    confident = np.zeros((3, 10))
    confident[:, 0] = [40.0, 50.0, 60.0]
    assert np.all(-special.log_softmax(confident, axis=1)[:, 0] == 0.0)
    loss = example_loss(confident, np.zeros(3, dtype=np.int64))
    np.testing.assert_allclose(loss, 9 * np.exp(-np.array([40.0, 50.0, 60.0])), rtol=1e-12)
    assert loss[0] > loss[1] > loss[2] > 0.0
