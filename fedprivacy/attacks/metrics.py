"""Metrics for attack success: image similarity (MSE, PSNR, SSIM) and membership-inference ROC figures.

Image metrics take arrays of values in ``[0, data_range]``; batches are compared image by image. ROC
figures follow Carlini et al. 2022 ("Membership Inference Attacks From First Principles", S&P 2022,
Sec. III-B): report the AUC and the true-positive rate at a low false-positive rate, read off the
empirical ROC curve as the largest TPR over thresholds whose FPR is at most the target.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

__all__ = [
    "auc",
    "gaussian_window",
    "label_accuracy",
    "match_images",
    "mse",
    "psnr",
    "roc_curve",
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


def roc_curve(
    member_scores: np.ndarray, nonmember_scores: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Empirical ROC of the rule "member iff score >= t", over every distinct threshold t.

    Higher scores must mean "more likely a member". Returns ``(fpr, tpr)``, both starting at 0 and
    ending at 1, non-decreasing.
    """
    pos = np.asarray(member_scores, dtype=np.float64).ravel()
    neg = np.asarray(nonmember_scores, dtype=np.float64).ravel()
    if pos.size == 0 or neg.size == 0:
        raise ValueError("member_scores and nonmember_scores must both be non-empty")
    if not (np.all(np.isfinite(pos)) and np.all(np.isfinite(neg))):
        raise ValueError("scores must be finite")
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
