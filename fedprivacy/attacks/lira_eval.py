"""Membership inference over many trained models: every model is the target in turn.

Carlini, Chien, Nasr, Song, Terzis & Tramer 2022 ("Membership Inference Attacks From First Principles",
S&P, Sec. V-A) evaluate LiRA by training K models, each on a random half of the candidate pool, and
attacking each model with the other K - 1 as its shadow models; scores are pooled over the K targets, so
K models give K x (pool size) (target, candidate) pairs — what TPR at 0.1% FPR needs (at least a few
thousand non-member pairs for the rate to be resolved). This module does that bookkeeping on the
statistics the models produce (no torch here): per (model, candidate) logit confidence ``phi`` and loss,
and whether the candidate was in that model's training data.

**User level** (was this *client* in the federation?): a client's score under a target is the mean of its
examples' scores (all examples of a client share its membership). Under user-level DP the whole client is
the unit of privacy, so this is the attack the guarantee speaks about; the example-level attack is the
usual one.

Attacks: ``"loss"`` (Yeom et al. 2018, score = -loss, no shadows), ``"lira-online"`` and
``"lira-offline"`` (:func:`fedprivacy.attacks.membership.lira_online_scores` /
:func:`~fedprivacy.attacks.membership.lira_offline_scores`, fixed variance), and the same two with a
per-example variance, ``"lira-online-exvar"`` / ``"lira-offline-exvar"`` (Carlini et al. 2022, Sec. IV:
each candidate's own IN / OUT spread, :data:`EXVAR_ATTACKS`). A per-example spread needs a dozen or so
shadows on each side: they are refused below :data:`EXVAR_MIN_MODELS` models (24 shadows, ~12 IN and ~12
OUT per candidate), and a pair is scored only with at least 2 shadows on each side it uses. With fewer
models the few pairs that have 2-3 shadows on a side get near-zero spreads and set the low-FPR
thresholds, so TPR at 0.1% FPR comes out below what the attack does with more shadows (a review
found, in a two-spread test world at K = 17, TPR@0.1% 0.05-0.12 against 0.25 at K = 26), which would flatter the
defence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedprivacy.attacks.membership import (
    MembershipScores,
    attack_rows,
    lira_offline_scores,
    lira_online_scores,
    loss_threshold_scores,
)

__all__ = ["ATTACKS", "EXVAR_ATTACKS", "EXVAR_MIN_MODELS", "leave_one_out_scores", "user_level", "pooled", "pooled_ids", "membership_table"]

ATTACKS = ("loss", "lira-online", "lira-offline")
EXVAR_ATTACKS = ("lira-online-exvar", "lira-offline-exvar")
EXVAR_MIN_MODELS = 25  # a per-example variance: 24 shadows, ~12 IN and ~12 OUT per candidate
_EXVAR = "-exvar"


def _check(stat: np.ndarray, member: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(stat, dtype=np.float64)
    m = np.asarray(member)
    if m.dtype != bool:
        raise TypeError(f"member must be a bool array, got {m.dtype}")
    if s.ndim != 2 or s.shape != m.shape:
        raise ValueError(f"{name} and member must both be (K, N), got {s.shape} and {m.shape}")
    if not np.all(np.isfinite(s)):
        raise ValueError(f"{name} must be finite")
    return s, m


def leave_one_out_scores(
    stat: np.ndarray, member: np.ndarray, *, attack: str, fixed_variance: bool = True
) -> np.ndarray:
    """Attack scores of every (target model, candidate) pair, the other models being the shadows.

    Args:
        stat: ``(K, N)``: ``phi`` (logit confidence) for LiRA, the loss for ``"loss"``.
        member: ``(K, N)`` bool, whether candidate n was in model k's training data.
        attack: one of :data:`ATTACKS` or :data:`EXVAR_ATTACKS` (the latter set ``fixed_variance=False``).
        fixed_variance: LiRA's global-variance variant (Carlini et al. Sec. VI-A), right for K < 64.

    Returns:
        ``(K, N)`` scores, higher = more likely a member; NaN where the candidate has no IN (online) or
        no OUT shadow among the other K - 1 models, or fewer than 2 of either with a per-example
        variance (such pairs are left out by :func:`pooled`).
    """
    s, m = _check(stat, member, "stat")
    if attack == "loss":
        return loss_threshold_scores(s)
    if attack not in ATTACKS + EXVAR_ATTACKS:
        raise ValueError(f"attack must be one of {ATTACKS + EXVAR_ATTACKS}, got {attack!r}")
    if attack in EXVAR_ATTACKS:
        attack, fixed_variance = attack.removesuffix(_EXVAR), False
    k = s.shape[0]
    if k < 2:
        raise ValueError(f"LiRA needs at least 2 models (1 target + shadows), got {k}")
    if not fixed_variance and k < EXVAR_MIN_MODELS:
        raise ValueError(f"a per-example variance needs at least {EXVAR_MIN_MODELS} models (24 shadows), got {k}")
    need = 1 if fixed_variance else 2  # a per-example spread needs two shadows on a side
    out = np.full(s.shape, np.nan)
    for t in range(k):
        others = np.arange(k) != t
        sp, si = s[others], m[others]
        ok = (~si).sum(axis=0) >= need
        if attack == "lira-online":
            ok &= si.sum(axis=0) >= need
        if not ok.any():
            continue
        fn = lira_online_scores if attack == "lira-online" else lira_offline_scores
        out[t, ok] = fn(s[t, ok], sp[:, ok], si[:, ok], fixed_variance=fixed_variance)
    return out


def user_level(
    scores: np.ndarray, member: np.ndarray, groups: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per-client scores: the mean score of a client's examples, and the client's membership.

    Args:
        scores: ``(K, N)`` example scores (NaN allowed: a client with any NaN example gets NaN).
        member: ``(K, N)`` bool membership of the examples.
        groups: ``(N,)`` int client id of every example.

    Returns:
        ``(K, U)`` client scores and ``(K, U)`` client membership, clients in sorted-id order.

    Raises:
        ValueError: the examples of one client do not share its membership under some model.
    """
    sc = np.asarray(scores, dtype=np.float64)
    m = np.asarray(member, dtype=bool)
    g = np.asarray(groups)
    if sc.shape != m.shape or sc.ndim != 2 or g.shape != (sc.shape[1],):
        raise ValueError(
            f"scores and member must be (K, N) and groups (N,), got {sc.shape}, {m.shape}, {g.shape}"
        )
    ids, inverse = np.unique(g, return_inverse=True)
    counts = np.bincount(inverse, minlength=len(ids))
    sums = np.stack([np.bincount(inverse, weights=row, minlength=len(ids)) for row in sc])
    user_scores = sums / counts.astype(np.float64)
    share = np.stack([np.bincount(inverse, weights=row.astype(float), minlength=len(ids)) for row in m])
    if not np.all((share == 0) | (share == counts)):
        raise ValueError("every example of a client must share the client's membership")
    return user_scores, share == counts


def pooled(scores: np.ndarray, member: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All finite (target, candidate) scores of members and of non-members, pooled over targets."""
    sc = np.asarray(scores, dtype=np.float64)
    m = np.asarray(member, dtype=bool)
    ok = np.isfinite(sc)
    return sc[ok & m], sc[ok & ~m]


def pooled_ids(scores: np.ndarray, member: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray],
                                                                 tuple[np.ndarray, np.ndarray]]:
    """The (candidate, target model) ids of :func:`pooled`'s member and non-member scores, in its order.

    Returns ``((member_candidates, nonmember_candidates), (member_models, nonmember_models))``: the
    clusters and strata of :func:`fedprivacy.attacks.metrics.roc_summary`.
    """
    sc = np.asarray(scores, dtype=np.float64)
    m = np.asarray(member, dtype=bool)
    ok = np.isfinite(sc)
    model = np.broadcast_to(np.arange(sc.shape[0])[:, None], sc.shape)
    cand = np.broadcast_to(np.arange(sc.shape[1])[None, :], sc.shape)
    return (cand[ok & m], cand[ok & ~m]), (model[ok & m], model[ok & ~m])


def membership_table(
    *,
    phi: np.ndarray,
    loss: np.ndarray,
    member: np.ndarray,
    groups: np.ndarray | None,
    model: str,
    epsilon: float | None,
    attacks: Sequence[str] = ATTACKS,
    statistics: bool = False,
) -> list[dict[str, Any]]:
    """Rows (AUC, TPR at 1% and 0.1% FPR, pair counts) per attack, at example and (if ``groups``) user level.

    Every row also states ``fpr_resolution`` = 1 / non-member pairs: a TPR at an FPR below it is not
    measured by the data (it is the TPR at FPR 0). ``statistics``: also the
    :func:`~fedprivacy.attacks.metrics.roc_summary` figures of every row (95% intervals by a bootstrap of
    whole candidate clients, permutation p-values relabelling within each target model, ``at_chance_5pct``),
    under its keys (``tpr_at_fpr_0.01_ci95``, ``auc_p_value``, ...).
    """
    from fedprivacy.attacks.metrics import roc_summary

    rows: list[dict[str, Any]] = []
    for attack in attacks:
        stat = loss if attack == "loss" else phi  # every LiRA variant scores phi
        sc = leave_one_out_scores(stat, member, attack=attack)
        levels = [("example", sc, member)]
        if groups is not None:
            us, um = user_level(sc, member, groups)
            levels.append(("user", us, um))
        for level, s, m in levels:
            pos, neg = pooled(s, m)
            (row,) = attack_rows(
                [MembershipScores(model=model, epsilon=epsilon, attack=attack, members=pos, nonmembers=neg)]
            )
            row["level"] = level
            row["fpr_resolution"] = 1.0 / neg.size
            if statistics:
                (cp, cn), (mp, mn) = pooled_ids(s, m)
                if level == "example" and groups is not None:  # a client's examples share its data
                    cp, cn = np.asarray(groups)[cp], np.asarray(groups)[cn]
                summary = roc_summary(pos, neg, member_clusters=cp, nonmember_clusters=cn,
                                      member_strata=mp, nonmember_strata=mn)
                row.update(summary.to_row())
            rows.append(row)
    return rows
