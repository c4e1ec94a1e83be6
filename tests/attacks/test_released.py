"""Membership inference against a released model (fedprivacy.attacks.released) and its statistics.

The metric code is checked against Mann-Whitney (scipy), hand-computed values and closed forms, with
hypothesis properties; the attacks run on real Fashion-MNIST images and real models trained in the test
in seconds: an overfit model is found out, a model trained on disjoint data is at chance, and the
reference calibration creates no signal of its own (while an IN-calibrated one, the mistake it avoids,
would).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fedprivacy.attacks.metrics import auc, roc_curve, roc_summary, tpr_at_fpr
from fedprivacy.attacks.released import (
    ATTACKS,
    Candidates,
    attack_scores,
    evaluate_released_model,
    model_statistics,
    pseudo_clients,
    reference_statistics,
    user_scores,
)

scores = st.lists(st.integers(-5, 5).map(float) | st.floats(-3, 3, allow_nan=False, width=32),
                  min_size=1, max_size=40)


# ------------------------------------------------------------------------------------------ metrics
@settings(max_examples=60, deadline=None)
@given(pos=scores, neg=scores)
def test_summary_auc_is_mann_whitney_and_tprs_match_the_roc(pos: list[float], neg: list[float]) -> None:
    s = roc_summary(pos, neg, fprs=(0.0, 0.1, 0.5, 1.0), bootstrap=0, permutations=0)
    u = stats.mannwhitneyu(pos, neg, alternative="two-sided").statistic
    assert s.auc == pytest.approx(u / (len(pos) * len(neg)), abs=1e-12)
    assert s.auc == pytest.approx(auc(np.array(pos), np.array(neg)), abs=1e-12)
    for f, t in zip(s.fprs, s.tpr, strict=True):
        assert t == pytest.approx(tpr_at_fpr(np.array(pos), np.array(neg), fpr=f), abs=1e-12)
    assert list(s.tpr) == sorted(s.tpr) and s.tpr[-1] == 1.0  # TPR at a larger FPR is never smaller
    fpr, tpr = roc_curve(np.array(pos), np.array(neg))
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)


@settings(max_examples=40, deadline=None)
@given(pos=scores, neg=scores, data=st.data())
def test_weighted_figures_equal_the_figures_of_the_repeated_scores(pos: list[float], neg: list[float],
                                                                   data: st.DataObject) -> None:
    """The bootstrap reuses one sort with multiplicities: that must equal repeating the scores."""
    from fedprivacy.attacks.metrics import _SortedScores

    wp = np.array(data.draw(st.lists(st.integers(0, 3), min_size=len(pos), max_size=len(pos))))
    wn = np.array(data.draw(st.lists(st.integers(0, 3), min_size=len(neg), max_size=len(neg))))
    if wp.sum() == 0 or wn.sum() == 0:
        return
    a, t = _SortedScores(np.array(pos), np.array(neg)).figures(wp.astype(float), wn.astype(float), (0.0, 0.2))
    rp, rn = np.repeat(pos, wp), np.repeat(neg, wn)
    assert a == pytest.approx(auc(rp, rn), abs=1e-12)
    assert t == pytest.approx([tpr_at_fpr(rp, rn, fpr=0.0), tpr_at_fpr(rp, rn, fpr=0.2)], abs=1e-12)


def test_summary_reference_values() -> None:
    # pairs (3,2) (3,0) (2,2)=1/2 (2,0) (1,2)=0 (1,0): AUC = 4.5 / 6
    s = roc_summary([3.0, 2.0, 1.0], [2.0, 0.0], fprs=(0.0, 0.5), bootstrap=50, permutations=50)
    assert s.auc == pytest.approx(0.75)
    assert s.tpr == pytest.approx((1 / 3, 1.0))
    assert s.false_positives_allowed == (0, 1) and s.fpr_resolution == 0.5
    # Clopper-Pearson of 0 of 10 (two-sided 95%): upper = 1 - 0.025^(1/10) = 0.30850
    z = roc_summary([0.0] * 10, [1.0] * 10, fprs=(0.0,), bootstrap=10, permutations=10)
    assert z.tpr == (0.0,) and z.tpr_exact_intervals[0][0] == 0.0
    assert z.tpr_exact_intervals[0][1] == pytest.approx(1 - 0.025 ** 0.1, abs=1e-6)


def test_permutation_p_values_tell_a_signal_from_none() -> None:
    rng = np.random.default_rng(3)
    separated = roc_summary(rng.normal(3, 1, 300), rng.normal(0, 1, 300), bootstrap=100, permutations=199)
    assert separated.auc_p_value == pytest.approx(1 / 200) and separated.tpr_p_values[0] == pytest.approx(1 / 200)
    assert not separated.at_chance()
    lo, hi = separated.auc_interval
    assert lo < separated.auc < hi and hi - lo < 0.05
    # 0.1% of 300 non-members allows no false positive: that TPR is not resolved and is not judged
    assert separated.false_positives_allowed == (3, 0)
    null = roc_summary(rng.normal(0, 1, 300), rng.normal(0, 1, 300), bootstrap=100, permutations=199)
    assert null.auc_interval[0] < 0.5 < null.auc_interval[1]
    assert null.at_chance() and null.auc_p_value > 0.05
    # under no signal the p-value is uniform: about 5% of null experiments fall below 0.05
    ps = [roc_summary(rng.normal(0, 1, 100), rng.normal(0, 1, 100), bootstrap=0, permutations=99).auc_p_value
          for _ in range(100)]
    assert 1 <= sum(p < 0.05 for p in ps) <= 12


def test_summary_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="must both be non-empty"):
        roc_summary([], [1.0])
    with pytest.raises(ValueError, match="fprs must be in"):
        roc_summary([1.0], [0.0], fprs=(1.5,))
    with pytest.raises(ValueError, match="bootstrap and permutations must be >= 0"):
        roc_summary([1.0], [0.0], bootstrap=-1)
    with pytest.raises(ValueError, match="finite"):
        roc_summary([np.nan], [0.0])


# ------------------------------------------------------------------------------------ bookkeeping
def test_pseudo_clients_and_user_scores() -> None:
    ids = pseudo_clients(103, per_client=20, seed=1)
    assert np.bincount(ids[ids >= 0]).tolist() == [20] * 5 and np.sum(ids < 0) == 3
    assert np.array_equal(ids, pseudo_clients(103, per_client=20, seed=1))
    assert not np.array_equal(ids, pseudo_clients(103, per_client=20, seed=2))
    assert user_scores(np.array([1.0, 3.0, 5.0, 7.0, 100.0]), np.array([1, 0, 1, 0, -1])).tolist() == [5.0, 3.0]
    with pytest.raises(ValueError, match="per_client must be in"):
        pseudo_clients(10, per_client=11, seed=0)
    with pytest.raises(ValueError, match="needs the reference statistics"):
        attack_scores("calibrated-phi", np.zeros(2), np.zeros(2))
    with pytest.raises(ValueError, match="attack must be one of"):
        attack_scores("lira", np.zeros(2), np.zeros(2))


def test_candidates_from_a_partition_keep_whole_clients() -> None:
    x, y = np.zeros((60, 1, 2, 2), np.float32), np.arange(60) % 10
    parts = [np.arange(10 * k, 10 * k + 10)[::-1] for k in range(6)]
    c = Candidates.from_partition(x, y, parts, x[:25], y[:25], per_client=10, seed=0, member_clients=3)
    assert len(np.unique(c.member_clients)) == 3 and len(c.y_members) == 30
    for k in np.unique(c.member_clients):
        assert sorted(c.member_index[c.member_clients == k].tolist()) == sorted(parts[k].tolist())
    assert np.bincount(c.nonmember_clients[c.nonmember_clients >= 0]).tolist() == [10, 10]
    with pytest.raises(ValueError, match="belong to one client only"):
        Candidates.from_partition(x, y, [np.arange(5), np.arange(3, 8)], x, y, per_client=5, seed=0)
    with pytest.raises(ValueError, match="member_clients must be in"):
        Candidates.from_partition(x, y, parts, x, y, per_client=5, seed=0, member_clients=7)


# --------------------------------------------------------------------- real data, real small models
@pytest.fixture(scope="module")
def fashion():
    from fedprivacy.ml.data import load_dataset

    train, test = load_dataset("fashion-mnist", seed=0, test_fraction=0.2)
    return train.x[:800].copy(), train.y[:800].copy(), test.x[:1000].copy(), test.y[:1000].copy()


def _mlp(seed: int):
    from fedprivacy.ml.models import build_model

    return build_model("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=128, seed=seed)


def _trained(x: np.ndarray, y: np.ndarray, *, epochs: int, seed: int):
    import torch

    from fedprivacy.ml.data import Split
    from fedprivacy.ml.train import train_local

    torch.set_num_threads(1)
    m = _mlp(seed)
    train_local(m, Split(x=x, y=y), epochs=epochs, lr=0.1, batch_size=16, seed=seed)
    return m


def _candidates(fashion, members: np.ndarray) -> Candidates:
    xt, yt, xs, ys = fashion
    parts = [members[i::20] for i in range(20)]  # 20 clients of 10 training images
    return Candidates.from_partition(xt, yt, parts, xs, ys, per_client=10, seed=0)


@pytest.fixture(scope="module")
def references(fashion):
    xt, yt, xs, ys = fashion
    return reference_statistics(xt, yt, xs, ys, _mlp, count=1, train_size=300, epochs=20, learning_rate=0.1,
                                batch_size=16, seed=0)


def test_an_overfit_model_is_found_out_at_both_levels(fashion, references) -> None:
    xt, yt, _, _ = fashion
    members = np.arange(200)
    target = _trained(xt[members], yt[members], epochs=40, seed=1)
    res = evaluate_released_model(target, _candidates(fashion, members), references=references,
                                  bootstrap=50, permutations=99)
    assert res["train_accuracy"] > 0.98 and res["test_accuracy"] < 0.85
    rows = {(r["attack"], r["level"]): r for r in res["rows"]}
    assert set(rows) == {(a, lv) for a in ATTACKS for lv in ("example", "user")}
    assert rows["loss", "example"]["members"] == 200 and rows["loss", "example"]["nonmembers"] == 1000
    assert rows["loss", "user"]["members"] == 20 and rows["loss", "user"]["nonmembers"] == 100
    # the references never saw a candidate: only the train/test split's own difference (measured 0.543)
    assert rows["reference-only", "example"]["auc"] < 0.6
    for attack in ("loss", "calibrated-loss", "calibrated-phi"):  # measured: example AUC 0.67-0.73, user 0.88-0.99
        ex, us = rows[attack, "example"], rows[attack, "user"]
        assert ex["auc"] > 0.65 and ex["auc_ci95"][0] > 0.6 and not ex["at_chance_5pct"]
        assert us["auc"] > 0.85 and us["auc_p_value"] < 0.05  # a client's 10 examples add up
    # the calibrated attacks know which test images are hard: they beat the raw loss at low FPR here
    # (TPR at 1% FPR: loss 0.015, calibrated 0.03-0.05)
    for attack in ("calibrated-loss", "calibrated-phi"):
        assert rows[attack, "example"]["tpr_at_fpr_0.01"] > max(0.02, rows["loss", "example"]["tpr_at_fpr_0.01"])


def test_a_model_trained_on_disjoint_data_is_at_chance_and_calibration_adds_no_signal(fashion, references) -> None:
    xt, yt, xs, ys = fashion
    target = _trained(xt[600:800], yt[600:800], epochs=40, seed=2)  # candidates 0..199 never seen
    cands = _candidates(fashion, np.arange(200))
    res = evaluate_released_model(target, cands, references=references, bootstrap=50, permutations=199)
    for r in res["rows"]:  # measured: example AUC 0.47-0.52, user 0.44-0.57, every p-value >= 0.22
        if r["attack"] == "reference-only":  # the split's difference, the same for every target
            assert r["auc"] < (0.6 if r["level"] == "example" else 0.7)  # measured 0.543 / 0.607
            continue
        if r["level"] == "example":
            assert abs(r["auc"] - 0.5) < 0.07, r
        assert r["at_chance_5pct"], r
    # the mistake the halves avoid: a reference that trained on the non-members it scores (IN for them,
    # OUT for the members) makes the members look like members on a model that never saw them
    inside = _trained(xs, ys, epochs=20, seed=3)
    il, ip, _ = model_statistics(inside, cands.x_members, cands.y_members)
    nl, np_, _ = model_statistics(inside, cands.x_nonmembers, cands.y_nonmembers)
    tl, tp, _ = model_statistics(target, cands.x_members, cands.y_members)
    sl, sp, _ = model_statistics(target, cands.x_nonmembers, cands.y_nonmembers)
    broken = roc_summary(attack_scores("calibrated-loss", tl, tp, ref_loss=il, ref_phi=ip),
                         attack_scores("calibrated-loss", sl, sp, ref_loss=nl, ref_phi=np_),
                         bootstrap=0, permutations=99)
    assert broken.auc > 0.55 and broken.tpr[0] > 0.03 and not broken.at_chance()  # measured 0.588, 0.065


def test_held_out_training_clients_as_non_members_have_no_split_floor(fashion, references) -> None:
    """A federation that left training clients out: its non-members come from the training split, so the
    models that saw no candidate (reference-only) are at chance, while the overfit target is found out."""
    xt, yt, _, _ = fashion
    members = np.arange(200)
    target = _trained(xt[members], yt[members], epochs=40, seed=1)
    parts = [members[i::20] for i in range(20)]
    cands = Candidates.from_partition(xt, yt, parts, xt[:0], yt[:0], per_client=10, seed=0, nonmembers="held-out")
    assert cands.nonmembers_from == "train" and np.array_equal(cands.nonmember_index, np.arange(200, 800))
    res = evaluate_released_model(target, cands, references=references, bootstrap=50, permutations=99)
    assert res["test_accuracy"] is None and res["nonmember_accuracy"] < 0.85
    rows = {(r["attack"], r["level"]): r for r in res["rows"]}
    assert rows["loss", "example"]["nonmembers"] == 600 and rows["loss", "user"]["nonmembers"] == 60
    assert rows["reference-only", "example"]["at_chance_5pct"]  # measured AUC 0.533, p 0.13 (200 vs 600)
    assert rows["reference-only", "user"]["at_chance_5pct"]  # measured 0.578, p 0.12 (20 vs 60)
    assert abs(rows["reference-only", "example"]["auc"] - 0.5) < 0.07
    assert rows["loss", "example"]["auc"] > 0.65 and rows["loss", "user"]["auc"] > 0.85
    with pytest.raises(ValueError, match="use every training example"):
        Candidates.from_partition(xt[:200], yt[:200], parts, xt[:0], yt[:0], per_client=10, seed=0,
                                  nonmembers="held-out")
    with pytest.raises(ValueError, match="nonmembers must be"):
        Candidates.from_partition(xt, yt, parts, xt, yt, per_client=10, seed=0, nonmembers="train")


def test_references_are_out_for_every_example_they_score(fashion, references) -> None:
    """A reference fits what it trains on (median loss < 0.3x a test image's); every training example's
    reference loss is nevertheless like a test image's: each was scored only by references that never saw it."""
    xt, yt, xs, ys = fashion
    assert references.count == 1 and len(references.test_accuracy) == 2
    seen = _trained(xt[:300], yt[:300], epochs=20, seed=5)
    in_loss, _, _ = model_statistics(seen, xt[:300], yt[:300])
    out_test = float(np.median(references.test_loss))
    assert np.median(in_loss) < 0.3 * out_test  # what an IN reference would report
    ratio = float(np.median(references.train_loss)) / out_test
    assert 0.7 < ratio < 1.4, ratio
    with pytest.raises(ValueError, match="train_size must be in"):
        reference_statistics(xt, yt, xs, ys, _mlp, count=1, train_size=401, epochs=1, learning_rate=0.1,
                             batch_size=16, seed=0)
    with pytest.raises(ValueError, match="count must be >= 1"):
        reference_statistics(xt, yt, xs, ys, _mlp, count=0, train_size=10, epochs=1, learning_rate=0.1,
                             batch_size=16, seed=0)


def test_stratified_permutation_keeps_a_model_effect_from_faking_a_signal() -> None:
    # Two target models ("strata") with no membership signal inside either, but model 0 has most of the
    # members and scores everything higher: pooled relabelling reads the model effect as membership.
    def world(rng: np.random.Generator, d: float) -> tuple[np.ndarray, ...]:
        pos = np.concatenate([rng.normal(1 + d, 1, 270), rng.normal(d, 1, 30)])
        neg = np.concatenate([rng.normal(1, 1, 30), rng.normal(0, 1, 270)])
        sp = np.repeat([0, 1], [270, 30])
        sn = np.repeat([0, 1], [30, 270])
        return pos, neg, sp, sn

    rng = np.random.default_rng(11)
    plain, strat = [], []
    for _ in range(40):
        pos, neg, sp, sn = world(rng, 0.0)
        plain.append(roc_summary(pos, neg, bootstrap=0, permutations=49).auc_p_value)
        strat.append(roc_summary(pos, neg, bootstrap=0, permutations=49, member_strata=sp,
                                 nonmember_strata=sn).auc_p_value)
    assert max(plain) == pytest.approx(1 / 50)  # every null experiment "significant" without strata
    assert sum(p < 0.05 for p in strat) <= 7  # ~5% of 40 under the stratified (exact) test
    assert np.mean(strat) > 0.3
    pos, neg, sp, sn = world(rng, 0.5)  # a real signal inside each model is still found
    s = roc_summary(pos, neg, bootstrap=0, permutations=99, member_strata=sp, nonmember_strata=sn)
    assert s.auc_p_value == pytest.approx(1 / 100) and not s.at_chance()


def test_cluster_bootstrap_carries_a_candidate_scored_by_many_models() -> None:
    # 200 members and 200 non-members, each scored identically by 10 "models": 4000 pairs that carry the
    # information of 400. The pair bootstrap's interval shrinks ~sqrt(10); the cluster bootstrap's does not.
    rng = np.random.default_rng(5)
    pos, neg = rng.normal(0.5, 1, 200), rng.normal(0, 1, 200)
    one = roc_summary(pos, neg, bootstrap=300, permutations=0)
    pos10, neg10 = np.repeat(pos, 10), np.repeat(neg, 10)
    pairs = roc_summary(pos10, neg10, bootstrap=300, permutations=0)
    clustered = roc_summary(pos10, neg10, bootstrap=300, permutations=0,
                            member_clusters=np.repeat(np.arange(200), 10),
                            nonmember_clusters=np.repeat(np.arange(200, 400), 10))
    width = lambda s: s.auc_interval[1] - s.auc_interval[0]  # noqa: E731
    assert clustered.auc == pytest.approx(one.auc) and pairs.auc == pytest.approx(one.auc)
    assert width(pairs) < 0.5 * width(one)
    assert 0.7 < width(clustered) / width(one) < 1.4
    lo, hi = clustered.tpr_intervals[0]
    assert lo <= clustered.tpr[0] <= hi


def test_clusters_and_strata_are_checked() -> None:
    with pytest.raises(ValueError, match="member_clusters and nonmember_clusters must be given together"):
        roc_summary([1.0, 2.0], [0.0], member_clusters=[0, 1])
    with pytest.raises(ValueError, match="one id per score"):
        roc_summary([1.0, 2.0], [0.0], member_strata=[0], nonmember_strata=[0])
