"""fedprivacy.attacks.lira_eval: leave-one-out LiRA over K models, example and user level.

Reference: a Gaussian model of the attack statistic where the optimal test is known. Candidate n has
difficulty mu_n ~ N(0, 3^2); under model k, phi = mu_n + d * member + N(0, 1). Knowing mu_n (which LiRA
estimates from the shadows), the Neyman-Pearson test has TPR = Phi(d - z_{1 - FPR}); a global threshold
that ignores mu_n only gets Phi(d / sqrt(10) - z_{1 - FPR}).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fedprivacy.attacks.lira_eval import (
    EXVAR_MIN_MODELS,
    leave_one_out_scores,
    membership_table,
    pooled,
    pooled_ids,
    user_level,
)
from fedprivacy.attacks.metrics import auc, roc_summary, tpr_at_fpr


def _world(*, k: int, n: int, d: float, per_user: int = 1, seed: int = 0):
    rng = np.random.default_rng(seed)
    users = n // per_user
    groups = np.repeat(np.arange(users), per_user)
    member_users = np.stack([rng.permutation(users) < users // 2 for _ in range(k)])  # random halves
    member = member_users[:, groups]
    mu = rng.normal(0.0, 3.0, n)
    phi = mu + d * member + rng.normal(0.0, 1.0, (k, n))
    return phi, member, groups


def test_lira_online_reaches_the_neyman_pearson_rate_and_beats_a_global_threshold() -> None:
    phi, member, _ = _world(k=16, n=4000, d=1.0)

    lira = pooled(leave_one_out_scores(phi, member, attack="lira-online"), member)
    naive = pooled(leave_one_out_scores(-phi, member, attack="loss"), member)  # score = phi

    optimal = stats.norm.cdf(1.0 - stats.norm.ppf(0.99))  # 0.092
    global_rule = stats.norm.cdf(1.0 / np.sqrt(10) - stats.norm.ppf(0.99))  # 0.022
    # 15 shadows (~7 IN, ~8 OUT per candidate) estimate mu_n with error: at least half the oracle's rate
    assert optimal * 0.5 < tpr_at_fpr(*lira, fpr=0.01) < optimal * 1.1
    assert tpr_at_fpr(*naive, fpr=0.01) < 2 * global_rule
    assert tpr_at_fpr(*lira, fpr=0.01) > 2.5 * tpr_at_fpr(*naive, fpr=0.01)
    # at K = 16 almost every pair has IN and OUT shadows (a pair lacks one with probability 2^-14)
    assert lira[0].size + lira[1].size > 0.999 * 16 * 4000


def test_without_a_membership_signal_every_attack_is_at_chance() -> None:
    phi, member, groups = _world(k=8, n=3000, d=0.0, per_user=10, seed=1)

    rows = membership_table(phi=phi, loss=-phi, member=member, groups=groups, model="toy", epsilon=None)

    assert {(r["attack"], r["level"]) for r in rows} == {
        (a, lv) for a in ("loss", "lira-online", "lira-offline") for lv in ("example", "user")
    }
    for r in rows:
        assert 0.46 < r["auc"] < 0.54, r
        assert r["tpr_at_fpr_1pct"] < 0.03, r
        assert r["fpr_resolution"] == 1.0 / r["nonmembers"]


def test_user_level_pools_a_clients_examples() -> None:
    phi, member, groups = _world(k=16, n=4000, d=0.3, per_user=10, seed=2)
    scores = leave_one_out_scores(phi, member, attack="lira-online")

    user_scores, user_member = user_level(scores, member, groups)

    assert user_scores.shape == user_member.shape == (16, 400)
    np.testing.assert_allclose(user_scores[3, 7], scores[3, 70:80].mean())
    example = tpr_at_fpr(*pooled(scores, member), fpr=0.01)
    user = tpr_at_fpr(*pooled(user_scores, user_member), fpr=0.01)
    assert user > 1.5 * example  # ten examples per client: a larger separation
    assert auc(*pooled(user_scores, user_member)) > auc(*pooled(scores, member))


def test_pairs_without_shadows_on_both_sides_are_left_out() -> None:
    phi = np.zeros((2, 3))
    member = np.array([[True, True, False], [True, False, False]])

    online = leave_one_out_scores(phi, member, attack="lira-online")
    offline = leave_one_out_scores(phi, member, attack="lira-offline")

    # each target's only shadow is the other model, IN or OUT for a candidate, never both: online LiRA
    # has nothing to compare; offline needs only an OUT shadow
    assert np.isnan(online).all()
    assert np.isnan(offline).tolist() == [[True, False, False], [True, True, False]]
    pos, neg = pooled(online, member)
    assert pos.size + neg.size == int(np.isfinite(online).sum())


def test_a_per_example_variance_finds_the_quiet_candidates_a_global_one_misses() -> None:
    # Half the candidates have spread 0.25, half 2.0 (Carlini et al. 2022 Sec. IV: per-example variances
    # differ). A member's shift d = 1 is 4 sds for a quiet candidate: the likelihood ratio with its own
    # variance flags nearly all quiet members at 1% FPR (oracle: 0.5 * Phi(4 - z_0.98) = 0.49); the
    # global variance ranks a quiet member's +1 below a loud non-member's noise.
    rng = np.random.default_rng(5)
    k, n = 25, 3000
    member = np.stack([rng.permutation(n) < n // 2 for _ in range(k)])
    spread = np.where(rng.random(n) < 0.5, 0.25, 2.0)
    phi = rng.normal(0.0, 3.0, n) + 1.0 * member + spread * rng.normal(0.0, 1.0, (k, n))

    for attack in ("lira-online", "lira-offline"):
        fixed = pooled(leave_one_out_scores(phi, member, attack=attack), member)
        own = pooled(leave_one_out_scores(phi, member, attack=f"{attack}-exvar"), member)
        assert 0.3 < tpr_at_fpr(*own, fpr=0.01) < 0.5
        assert tpr_at_fpr(*fixed, fpr=0.01) < 0.05
        assert tpr_at_fpr(*own, fpr=0.001) > 5 * tpr_at_fpr(*fixed, fpr=0.001)
        assert own[0].size + own[1].size == k * n  # 24 shadows: every pair has >= 2 on each side


def test_a_per_example_variance_needs_two_shadows_on_each_side_and_enough_models() -> None:
    k = EXVAR_MIN_MODELS
    phi = np.arange(k * 3.0).reshape(k, 3)
    member = np.zeros((k, 3), bool)
    member[0, 0] = True  # candidate 0: IN for model 0 only
    member[:2, 1] = True  # candidate 1: IN for models 0 and 1
    member[2:, 2] = True  # candidate 2: OUT for models 0 and 1 only

    fixed = leave_one_out_scores(phi, member, attack="lira-online")
    own = leave_one_out_scores(phi, member, attack="lira-online-exvar")
    offline = leave_one_out_scores(phi, member, attack="lira-offline-exvar")

    # candidate 0: every target sees at most one IN shadow (model 0): no per-example IN spread
    assert np.isnan(own[:, 0]).all() and np.isfinite(fixed[1:, 0]).all()
    # candidate 1: targets 0-1 see one IN shadow, the others two
    assert np.isnan(own[:2, 1]).all() and np.isfinite(own[2:, 1]).all()
    # offline needs two OUT shadows only: candidate 2 under target 0 has one (model 1), under target 2 two
    assert np.isnan(offline[0, 2]) and np.isfinite(offline[2, 2]) and np.isfinite(offline[:, 0]).all()
    # fewer models than EXVAR_MIN_MODELS: refused where the scores are made, the fixed variance is not
    with pytest.raises(ValueError, match=f"at least {EXVAR_MIN_MODELS} models"):
        leave_one_out_scores(phi[:-1], member[:-1], attack="lira-offline-exvar")
    assert np.isfinite(leave_one_out_scores(phi[:-1], member[:-1], attack="lira-offline")[:, 0]).all()


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(TypeError, match="bool"):
        leave_one_out_scores(np.zeros((2, 2)), np.zeros((2, 2)), attack="loss")
    with pytest.raises(ValueError, match="attack must be one of"):
        leave_one_out_scores(np.zeros((2, 2)), np.zeros((2, 2), bool), attack="shadow")
    with pytest.raises(ValueError, match="share the client's membership"):
        user_level(np.zeros((1, 2)), np.array([[True, False]]), np.array([0, 0]))


def test_pooled_ids_name_each_pooled_score_and_the_table_tests_within_models() -> None:
    phi, member, groups = _world(k=6, n=1200, d=0.4, per_user=10, seed=4)
    scores = leave_one_out_scores(phi, member, attack="lira-offline")
    (cp, cn), (mp, mn) = pooled_ids(scores, member)
    pos, neg = pooled(scores, member)
    np.testing.assert_array_equal(scores[mp, cp], pos)
    np.testing.assert_array_equal(scores[mn, cn], neg)
    assert member[mp, cp].all() and not member[mn, cn].any()

    rows = membership_table(phi=phi, loss=-phi, member=member, groups=groups, model="toy", epsilon=None,
                            attacks=("lira-offline",), statistics=True)
    user = next(r for r in rows if r["level"] == "user")
    us, um = user_level(scores, member, groups)
    (ucp, ucn), (ump, umn) = pooled_ids(us, um)
    expect = roc_summary(*pooled(us, um), member_clusters=ucp, nonmember_clusters=ucn, member_strata=ump,
                         nonmember_strata=umn)
    assert user["auc"] == pytest.approx(expect.auc) and user["auc_p_value"] == expect.auc_p_value
    assert user["tpr_at_fpr_0.01_ci95"] == list(expect.tpr_intervals[0])
    assert user["at_chance_5pct"] is False and user["tpr_at_fpr_0.01_resolved"] is True
    example = next(r for r in rows if r["level"] == "example")
    assert example["at_chance_5pct"] is False  # d = 0.4 per example, 6 x 600 non-member pairs

    null_phi, null_member, null_groups = _world(k=6, n=1200, d=0.0, per_user=10, seed=4)
    (null_user,) = [r for r in membership_table(phi=null_phi, loss=-null_phi, member=null_member,
                                                groups=null_groups, model="toy", epsilon=None,
                                                attacks=("loss",), statistics=True) if r["level"] == "user"]
    assert null_user["auc_ci95"][0] < 0.5 < null_user["auc_ci95"][1]
