"""Metrics for attack success: image similarity (MSE, PSNR, SSIM) and membership-inference ROC figures.

Image metrics take arrays of values in ``[0, data_range]``; batches are compared image by image. ROC
figures follow Carlini et al. 2022 ("Membership Inference Attacks From First Principles", S&P 2022,
Sec. III-B): report the AUC and the true-positive rate at a low false-positive rate, read off the
empirical ROC curve as the largest TPR over thresholds whose FPR is at most the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

__all__ = [
    "RocSummary",
    "auc",
    "gaussian_window",
    "label_accuracy",
    "match_images",
    "mse",
    "psnr",
    "roc_curve",
    "roc_summary",
    "ssim",
    "tpr_at_fpr",
]


def _as_pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"images must have the same shape, got {x.shape} and {y.shape}")
    return x, y


def mse(a: np.ndarray, b: np.ndarray) -> float:
    """Mean squared error over all pixels."""
    x, y = _as_pair(a, b)
    return float(np.mean((x - y) ** 2))


def psnr(a: np.ndarray, b: np.ndarray, *, data_range: float = 1.0, max_db: float = 200.0) -> float:
    """Peak signal-to-noise ratio ``10 log10(data_range^2 / MSE)`` in dB, capped at ``max_db``.

    An exact reconstruction has MSE 0 and would be +inf; it is reported as ``max_db`` so that JSON
    output stays finite.
    """
    if data_range <= 0:
        raise ValueError(f"data_range must be > 0, got {data_range}")
    err = mse(a, b)
    if err <= 0.0:
        return float(max_db)
    return float(min(max_db, 10.0 * np.log10(data_range**2 / err)))


def gaussian_window(*, size: int, sigma: float) -> np.ndarray:
    """A normalised ``size x size`` Gaussian window (weights sum to 1)."""
    if size < 1 or size % 2 == 0:
        raise ValueError(f"size must be an odd integer >= 1, got {size}")
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    r = np.arange(size, dtype=np.float64) - (size - 1) / 2.0
    g = np.exp(-(r**2) / (2.0 * sigma**2))
    w = np.outer(g, g)
    return w / w.sum()


def _filter_valid(img: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted local sums of ``img`` under window ``w`` at every fully contained position."""
    k = w.shape[0]
    h, wd = img.shape
    out = np.empty((h - k + 1, wd - k + 1))
    for i in range(h - k + 1):
        for j in range(wd - k + 1):
            out[i, j] = float(np.sum(img[i : i + k, j : j + k] * w))
    return out


def ssim(
    a: np.ndarray,
    b: np.ndarray,
    *,
    data_range: float = 1.0,
    win_size: int = 5,
    sigma: float = 1.0,
    k1: float = 0.01,
    k2: float = 0.03,
) -> float:
    """Structural similarity index (Wang, Bovik, Sheikh & Simoncelli 2004, IEEE TIP 13(4), Eq. 13).

    ``SSIM(x, y) = (2 mu_x mu_y + C1)(2 sigma_xy + C2) / ((mu_x^2 + mu_y^2 + C1)(sigma_x^2 + sigma_y^2
    + C2))`` with ``C1 = (k1 L)^2``, ``C2 = (k2 L)^2`` and local statistics weighted by a Gaussian window
    (Sec. III-C), averaged over every window position that lies inside the image (Eq. 17). The paper
    uses an 11x11 window with sigma 1.5 for natural images; for 8x8 digits we default to a 5x5 window with
    sigma 1.0 (16 positions per image). A 2-D image or a batch ``(..., H, W)`` is accepted; a batch
    returns the mean over images.
    """
    x, y = _as_pair(a, b)
    if x.ndim < 2:
        raise ValueError(f"images must have at least 2 dimensions, got shape {x.shape}")
    if min(x.shape[-2:]) < win_size:
        raise ValueError(f"win_size must be <= image side, got {win_size} for shape {x.shape}")
    w = gaussian_window(size=win_size, sigma=sigma)
    c1 = (k1 * data_range) ** 2
    c2 = (k2 * data_range) ** 2
    xs = x.reshape(-1, *x.shape[-2:])
    ys = y.reshape(-1, *y.shape[-2:])
    values = []
    for xi, yi in zip(xs, ys, strict=True):
        mx = _filter_valid(xi, w)
        my = _filter_valid(yi, w)
        vx = _filter_valid(xi * xi, w) - mx**2
        vy = _filter_valid(yi * yi, w) - my**2
        cxy = _filter_valid(xi * yi, w) - mx * my
        s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
        values.append(float(np.mean(s)))
    return float(np.mean(values))


def match_images(originals: np.ndarray, reconstructions: np.ndarray) -> np.ndarray:
    """Order reconstructions to match originals (Hungarian assignment on per-image MSE).

    Attacks on a batch recover the images in an arbitrary order; before scoring we pair each original
    with the reconstruction closest to it. Returns ``perm`` so that ``reconstructions[perm[i]]`` is the
    match of ``originals[i]``.
    """
    o = np.asarray(originals, dtype=np.float64).reshape(len(originals), -1)
    r = np.asarray(reconstructions, dtype=np.float64).reshape(len(reconstructions), -1)
    if o.shape != r.shape:
        raise ValueError(f"batches must have the same shape, got {o.shape} and {r.shape}")
    cost = ((o[:, None, :] - r[None, :, :]) ** 2).mean(axis=2)
    rows, cols = linear_sum_assignment(cost)
    perm = np.empty(len(o), dtype=np.int64)
    perm[rows] = cols
    return perm


def label_accuracy(true_labels: Sequence[int], guessed_labels: Sequence[int]) -> float:
    """Fraction of labels recovered, as multisets (the order inside a batch is unknown to the server)."""
    t = [int(v) for v in true_labels]
    g = [int(v) for v in guessed_labels]
    if len(t) == 0:
        raise ValueError("true_labels must not be empty")
    remaining = list(g)
    hits = 0
    for v in t:
        if v in remaining:
            remaining.remove(v)
            hits += 1
    return hits / len(t)


def _score_pair(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pos = np.asarray(member_scores, dtype=np.float64).ravel()
    neg = np.asarray(nonmember_scores, dtype=np.float64).ravel()
    if pos.size == 0 or neg.size == 0:
        raise ValueError("member_scores and nonmember_scores must both be non-empty")
    if not (np.all(np.isfinite(pos)) and np.all(np.isfinite(neg))):
        raise ValueError("scores must be finite")
    return pos, neg


def roc_curve(
    member_scores: np.ndarray, nonmember_scores: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Empirical ROC of the rule "member iff score >= t", over every distinct threshold t.

    Higher scores must mean "more likely a member". Returns ``(fpr, tpr)``, both starting at 0 and
    ending at 1, non-decreasing.
    """
    pos, neg = _score_pair(member_scores, nonmember_scores)
    thresholds = np.unique(np.concatenate([pos, neg]))[::-1]
    pos_sorted = np.sort(pos)
    neg_sorted = np.sort(neg)
    # count of scores >= t  ==  n - (number of scores < t)
    tp = pos.size - np.searchsorted(pos_sorted, thresholds, side="left")
    fp = neg.size - np.searchsorted(neg_sorted, thresholds, side="left")
    tpr = np.concatenate([[0.0], tp / pos.size])
    fpr = np.concatenate([[0.0], fp / neg.size])
    return fpr, tpr


def auc(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> float:
    """Area under the ROC curve = P(member score > non-member score) + 0.5 P(tie) (Mann-Whitney U)."""
    fpr, tpr = roc_curve(member_scores, nonmember_scores)
    return float(np.trapezoid(tpr, fpr))


def tpr_at_fpr(member_scores: np.ndarray, nonmember_scores: np.ndarray, *, fpr: float) -> float:
    """Largest TPR among thresholds whose empirical FPR is <= ``fpr`` (Carlini et al. 2022)."""
    if not 0.0 <= fpr <= 1.0:
        raise ValueError(f"fpr must be in [0, 1], got {fpr}")
    f, t = roc_curve(member_scores, nonmember_scores)
    ok = f <= fpr + 1e-12
    return float(np.max(t[ok]))


# ------------------------------------------------------------------ intervals and a test against chance
class _SortedScores:
    """Members' and non-members' scores sorted once (descending), grouped by tied value.

    Every ROC figure below is a function of the per-group member and non-member *weights*: weights 1
    give the empirical curve, bootstrap multiplicities give a resampled one, and a permuted labelling
    gives the curve of an attack with no signal. So one sort serves every replicate.
    """

    def __init__(self, members: np.ndarray, nonmembers: np.ndarray) -> None:
        pos, neg = _score_pair(members, nonmembers)
        values = np.concatenate([pos, neg])
        uniq, inverse = np.unique(-values, return_inverse=True)  # ascending in -score = descending score
        self.groups = int(uniq.size)
        self.group_of = inverse.astype(np.int64)  # group of every score, members first
        self.n_pos, self.n_neg = int(pos.size), int(neg.size)

    def figures(self, w_pos: np.ndarray, w_neg: np.ndarray, fprs: Sequence[float]) -> tuple[float, list[float]]:
        """AUC and TPR at each FPR of the weighted scores (member weights ``w_pos``, non-member ``w_neg``)."""
        p = np.bincount(self.group_of[: self.n_pos], weights=w_pos, minlength=self.groups)
        n = np.bincount(self.group_of[self.n_pos :], weights=w_neg, minlength=self.groups)
        return _weighted_figures(p, n, fprs)

    def permuted(self, rng: Any, fprs: Sequence[float],
                 strata: np.ndarray | None = None) -> tuple[float, list[float]]:
        """The figures when the member labels are given to a random subset of the same size.

        ``strata`` (one id per score, members first): relabel within each stratum only, keeping its
        member count (the design's own randomization when each stratum is one model's random half).
        """
        is_pos = np.zeros(self.n_pos + self.n_neg, dtype=bool)
        if strata is None:
            is_pos[rng.permutation(self.n_pos + self.n_neg)[: self.n_pos]] = True
        else:
            for idx, k in zip(*_strata_members(strata, self.n_pos), strict=True):
                is_pos[idx[rng.permutation(idx.size)[:k]]] = True
        p = np.bincount(self.group_of[is_pos], minlength=self.groups).astype(np.float64)
        n = np.bincount(self.group_of[~is_pos], minlength=self.groups).astype(np.float64)
        return _weighted_figures(p, n, fprs)


def _strata_members(strata: np.ndarray, n_pos: int) -> tuple[list[np.ndarray], list[int]]:
    """Each stratum's score positions and its member count (members are the first ``n_pos`` scores)."""
    ids = np.unique(strata)
    members = [np.flatnonzero(strata == i) for i in ids]
    return members, [int(np.sum(idx < n_pos)) for idx in members]


def _labels(name: str, n_pos: int, n_neg: int, given: tuple[np.ndarray | None, np.ndarray | None]) -> np.ndarray | None:
    """Concatenate the members' and non-members' ids (``given``), both or neither, checked."""
    pos, neg = given
    if pos is None and neg is None:
        return None
    if pos is None or neg is None:
        raise ValueError(f"member_{name} and nonmember_{name} must be given together")
    a, b = np.asarray(pos).ravel(), np.asarray(neg).ravel()
    if a.size != n_pos or b.size != n_neg:
        raise ValueError(f"member_{name} / nonmember_{name} must have one id per score: got {a.size} / "
                         f"{b.size} for {n_pos} / {n_neg} scores")
    return np.concatenate([a, b])


def _weighted_figures(p: np.ndarray, n: np.ndarray, fprs: Sequence[float]) -> tuple[float, list[float]]:
    """AUC (Mann-Whitney, ties count 1/2) and max TPR with FPR <= each target, from per-group weights.

    Groups are in descending score order; ``p[g]`` / ``n[g]`` are the member / non-member weights tied at
    group g. The rule "member iff score >= t" at group g's value has TP = cumsum(p)[g], FP = cumsum(n)[g].
    """
    wp, wn = float(p.sum()), float(n.sum())
    tp, fp = np.cumsum(p), np.cumsum(n)
    auc_value = float(np.sum(n * (tp - p + 0.5 * p)) / (wp * wn))
    tprs = []
    for f in fprs:
        ok = fp <= f * wn + 1e-9 * max(wn, 1.0)
        tprs.append(float(tp[ok].max() / wp) if ok.any() else 0.0)
    return auc_value, tprs


@dataclass(frozen=True, slots=True, kw_only=True)
class RocSummary:
    """AUC and TPR at low FPR of one attack, each with a 95% interval and a p-value against chance.

    Attributes:
        auc, tpr: the empirical figures (``tpr[i]`` at ``fprs[i]``, Carlini et al. 2022's rule).
        auc_interval, tpr_intervals: bootstrap percentile intervals (members and non-members resampled
            separately, ``bootstrap`` replicates; Efron & Tibshirani 1993, Ch. 13).
        tpr_exact_intervals: Clopper-Pearson (1934) intervals of the TPR at the chosen threshold, taking
            the threshold as given (the members' binomial part of the error only).
        auc_p_value, tpr_p_values: one-sided permutation p-values (Good 2005): the share of ``permutations``
            random relabellings (same counts, so no membership signal) whose figure is >= the observed
            one, with the +1 correction (Phipson & Smyth 2010), so never 0.
        false_positives_allowed: floor(fpr * non-members) per target FPR; 0 means the target FPR is below
            the resolution 1 / non-members and the TPR there is the TPR at FPR 0 (not resolved).
    """

    auc: float
    auc_interval: tuple[float, float]
    auc_p_value: float
    fprs: tuple[float, ...]
    tpr: tuple[float, ...]
    tpr_intervals: tuple[tuple[float, float], ...]
    tpr_exact_intervals: tuple[tuple[float, float], ...]
    tpr_p_values: tuple[float, ...]
    false_positives_allowed: tuple[int, ...]
    members: int
    nonmembers: int
    bootstrap: int
    permutations: int

    @property
    def fpr_resolution(self) -> float:
        return 1.0 / self.nonmembers

    def at_chance(self, *, level: float = 0.05) -> bool:
        """No figure beats chance at this level: every p-value (AUC, each resolved TPR) is >= ``level``."""
        ps = [self.auc_p_value] + [p for p, k in zip(self.tpr_p_values, self.false_positives_allowed,
                                                      strict=True) if k >= 1]
        return all(p >= level for p in ps)

    def to_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"auc": self.auc, "auc_ci95": list(self.auc_interval),
                               "auc_p_value": self.auc_p_value}
        for f, t, ci, cp, pv, k in zip(self.fprs, self.tpr, self.tpr_intervals, self.tpr_exact_intervals,
                                       self.tpr_p_values, self.false_positives_allowed, strict=True):
            key = f"tpr_at_fpr_{f:g}"
            row.update({key: t, f"{key}_ci95": list(ci), f"{key}_clopper_pearson95": list(cp),
                        f"{key}_p_value": pv, f"{key}_false_positives_allowed": k,
                        f"{key}_resolved": k >= 1})
        row.update({"members": self.members, "nonmembers": self.nonmembers,
                    "fpr_resolution": self.fpr_resolution, "bootstrap": self.bootstrap,
                    "permutations": self.permutations, "at_chance_5pct": self.at_chance()})
        return row


def _bootstrap(s: _SortedScores, targets: tuple[float, ...], bootstrap: int, bsrc: Any,
               clusters: np.ndarray | None) -> np.ndarray:
    """``bootstrap`` resamples' (AUC, TPRs) (:func:`roc_summary`): pairs, or whole clusters when given."""
    boot = np.empty((bootstrap, 1 + len(targets)))
    if clusters is not None:
        cluster_ids, cluster_of = np.unique(clusters, return_inverse=True)
    for b in range(bootstrap):
        if clusters is None:
            wp = np.bincount(bsrc.integers(0, s.n_pos, size=s.n_pos), minlength=s.n_pos).astype(np.float64)
            wn = np.bincount(bsrc.integers(0, s.n_neg, size=s.n_neg), minlength=s.n_neg).astype(np.float64)
        else:
            wp = wn = np.ones(0)
            while wp.sum() == 0 or wn.sum() == 0:  # redraw a resample with no member / non-member pair
                draws = np.bincount(bsrc.integers(0, cluster_ids.size, size=cluster_ids.size),
                                    minlength=cluster_ids.size).astype(np.float64)
                w = draws[cluster_of]
                wp, wn = w[: s.n_pos], w[s.n_pos :]
        a, t = s.figures(wp, wn, targets)
        boot[b] = [a, *t]
    return boot


def roc_summary(
    member_scores: np.ndarray,
    nonmember_scores: np.ndarray,
    *,
    fprs: Sequence[float] = (0.01, 0.001),
    bootstrap: int = 200,
    permutations: int = 200,
    rng: Any = None,
    member_clusters: np.ndarray | None = None,
    nonmember_clusters: np.ndarray | None = None,
    member_strata: np.ndarray | None = None,
    nonmember_strata: np.ndarray | None = None,
) -> RocSummary:
    """AUC and TPR at each FPR, with bootstrap and Clopper-Pearson intervals and permutation p-values.

    Higher scores mean "more likely a member". ``rng``: a :class:`fedprivacy.dp.rng.RandomSource` for the
    resampling (default: seeded 0, so figures repeat; this is statistics, not privacy noise).

    Pooled (target model, candidate) pairs are not independent: one candidate is scored by every model
    (member of some, non-member of others), so its difficulty is shared. ``*_clusters`` (one id per
    score, e.g. the candidate; the same id may be a member and a non-member) make the bootstrap resample
    whole clusters (the cluster bootstrap, Davison & Hinkley 1997, Sec. 3.8: every pair of a drawn
    cluster enters with the cluster's multiplicity), so the intervals carry that dependence.
    ``*_strata`` (one id per score, e.g. the target model) make the permutation test relabel within each
    stratum, keeping its member count: when each model's members are a uniformly random half of the
    candidates, that is the experiment's own randomization, so the p-value is exact under "the model
    says nothing about membership" (a randomization test, Fisher 1935; Good 2005, Ch. 3) whatever the
    dependence between pairs. Clopper-Pearson intervals still treat the members' pairs as independent.
    """
    from fedprivacy.attacks.audit import clopper_pearson_interval
    from fedprivacy.dp.rng import RandomSource

    if bootstrap < 0 or permutations < 0:
        raise ValueError(f"bootstrap and permutations must be >= 0, got {bootstrap} and {permutations}")
    targets = tuple(float(f) for f in fprs)
    for f in targets:
        if not 0.0 <= f <= 1.0:
            raise ValueError(f"fprs must be in [0, 1], got {f}")
    src = RandomSource.seeded(0) if rng is None else rng
    s = _SortedScores(member_scores, nonmember_scores)
    clusters = _labels("clusters", s.n_pos, s.n_neg, (member_clusters, nonmember_clusters))
    strata = _labels("strata", s.n_pos, s.n_neg, (member_strata, nonmember_strata))
    auc0, tpr0 = s.figures(np.ones(s.n_pos), np.ones(s.n_neg), targets)
    boot = _bootstrap(s, targets, bootstrap, src.child("bootstrap"), clusters)
    perm = np.empty((permutations, 1 + len(targets)))
    psrc = src.child("permutation")
    for b in range(permutations):
        a, t = s.permuted(psrc, targets, strata)
        perm[b] = [a, *t]
    observed = np.array([auc0, *tpr0])

    def interval(j: int) -> tuple[float, float]:
        if bootstrap == 0:
            return (float("nan"), float("nan"))
        lo, hi = np.quantile(boot[:, j], [0.025, 0.975])
        return (float(lo), float(hi))

    def p_value(j: int) -> float:
        return float((1 + np.sum(perm[:, j] >= observed[j] - 1e-12)) / (1 + permutations))

    exact = tuple(clopper_pearson_interval(int(round(t * s.n_pos)), s.n_pos, alpha=0.05) for t in tpr0)
    return RocSummary(
        auc=auc0, auc_interval=interval(0), auc_p_value=p_value(0), fprs=targets, tpr=tuple(tpr0),
        tpr_intervals=tuple(interval(1 + i) for i in range(len(targets))),
        tpr_exact_intervals=exact, tpr_p_values=tuple(p_value(1 + i) for i in range(len(targets))),
        false_positives_allowed=tuple(int(np.floor(f * s.n_neg + 1e-9)) for f in targets),
        members=s.n_pos, nonmembers=s.n_neg, bootstrap=bootstrap, permutations=permutations)
