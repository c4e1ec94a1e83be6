"""Empirical privacy auditing: lower bounds on epsilon from the success of a distinguishing attack.

Threat model: the auditor is the strongest adversary DP speaks about. It chooses a canary (a record or a
client whose contribution is maximal), sees the mechanism's output, and must guess whether the canary was
present. If a mechanism is (epsilon, delta)-DP, every test with false-positive rate FPR and
false-negative rate FNR satisfies ``FPR + e^eps FNR >= 1 - delta`` and ``FNR + e^eps FPR >= 1 - delta``
(Kairouz, Oh & Viswanath 2015, Thm. 2.1). Measured rates therefore give

    eps_lower = max( ln((1 - delta - FPR_hi) / FNR_hi), ln((1 - delta - FNR_hi) / FPR_hi) )

where ``FPR_hi``/``FNR_hi`` are one-sided Clopper-Pearson upper confidence bounds (Jagielski, Ullman &
Oprea 2020, "Auditing Differentially Private Machine Learning", Sec. 3; Nasr et al. 2021, "Adversary
Instantiation", Sec. 4.2). The two bounds share the confidence budget (union bound), and a search over
several thresholds is paid for with a Bonferroni correction (:func:`epsilon_lower_from_scores`; the
audits choose the threshold on half of the trials and certify it on the other half), so the stated
confidence holds for the reported maximum.

The one-run audit (Steinke, Nasr & Jagielski 2023, "Privacy Auditing with One (1) Training Run",
Thm. 3.1 and the (eps, delta) bound of their Sec. 5 / Algorithm 2) inserts m canaries, each
independently with probability 1/2, runs the mechanism once, and lets the auditor guess r of the
inclusion bits; eps_lower is the largest eps whose p-value for v right guesses
(:func:`one_run_p_value`) is below 1 - confidence.

Targets: the Gaussian mechanism alone (white-box worst case: the canary moves the output by exactly the
sensitivity), and the DP-FedAvg aggregation with a canary client whose update is a fixed vector of norm
``clip_norm`` (test statistic: projection of the noisy aggregate on the canary's direction). An
``epsilon_lower`` above the claimed epsilon at the stated confidence is evidence that the claim is false.

Rationale: docs/ATTACKS.md, section "The bounds the audit uses".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import stats

if TYPE_CHECKING:
    from fedprivacy.dp.rng import RandomSource

__all__ = [
    "AuditResult",
    "audit_dp_fedavg",
    "audit_gaussian_mechanism",
    "clopper_pearson_upper",
    "clopper_pearson_interval",
    "dp_fedavg_canary_statistics",
    "epsilon_lower_from_counts",
    "epsilon_lower_from_scores",
    "gaussian_canary_statistics",
    "one_run_audit_dp_fedavg",
    "one_run_audit_gaussian",
    "one_run_epsilon_lower",
    "one_run_guesses",
    "one_run_p_value",
    "select_threshold",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditResult:
    """One audit: the claimed epsilon, the empirical lower bound and how it was obtained."""

    target: str
    method: str
    epsilon_claimed: float
    epsilon_lower: float
    delta: float
    confidence: float
    trials: int
    details: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        if self.trials < 1:
            raise ValueError(f"trials must be >= 1, got {self.trials}")

    @property
    def broken(self) -> bool:
        """True when the lower bound exceeds the claim: the privacy claim is refuted."""
        return self.epsilon_lower > self.epsilon_claimed

    def to_row(self) -> dict[str, object]:
        row: dict[str, object] = {
            "target": self.target,
            "method": self.method,
            "epsilon_claimed": self.epsilon_claimed,
            "epsilon_lower": self.epsilon_lower,
            "delta": self.delta,
            "confidence": self.confidence,
            "trials": self.trials,
            "broken": self.broken,
        }
        row.update(dict(self.details))
        return row


# ------------------------------------------------------------------------------------------ statistics
def _check_count(k: int, n: int) -> None:
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 <= k <= n:
        raise ValueError(f"k must be in [0, n], got k={k}, n={n}")


def clopper_pearson_upper(k: int, n: int, *, alpha: float) -> float:
    """One-sided upper (1 - alpha) Clopper-Pearson bound on a binomial rate from k successes in n.

    ``p_hi = Beta^{-1}(1 - alpha; k + 1, n - k)`` and ``p_hi = 1`` when ``k = n`` (Clopper & Pearson
    1934); for ``k = 0`` this is ``1 - alpha^(1/n)``.
    """
    _check_count(k, n)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if k == n:
        return 1.0
    return float(stats.beta.ppf(1.0 - alpha, k + 1, n - k))


def clopper_pearson_interval(k: int, n: int, *, alpha: float) -> tuple[float, float]:
    """Two-sided (1 - alpha) Clopper-Pearson interval ``[Beta^{-1}(a/2; k, n-k+1), Beta^{-1}(1-a/2; k+1, n-k)]``."""
    _check_count(k, n)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    lo = 0.0 if k == 0 else float(stats.beta.ppf(alpha / 2.0, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1.0 - alpha / 2.0, k + 1, n - k))
    return lo, hi


def _eps_from_rates(fpr_hi: float, fnr_hi: float, delta: float) -> float:
    best = 0.0
    for num, den in ((1.0 - delta - fpr_hi, fnr_hi), (1.0 - delta - fnr_hi, fpr_hi)):
        if num > 0.0 and den > 0.0:
            best = max(best, math.log(num / den))
    return best


def epsilon_lower_from_counts(
    *,
    false_positives: int,
    negatives: int,
    false_negatives: int,
    positives: int,
    delta: float,
    confidence: float,
) -> float:
    """eps_lower from one test's error counts (Jagielski et al. 2020, Alg. 2; Nasr et al. 2021).

    ``negatives`` trials ran without the canary (``false_positives`` of them were called "present"),
    ``positives`` with it (``false_negatives`` called "absent"). Each rate gets a one-sided
    Clopper-Pearson upper bound at level ``(1 - confidence) / 2`` so that both hold jointly with
    probability ``confidence``; then ``max(ln((1-delta-FPR_hi)/FNR_hi), ln((1-delta-FNR_hi)/FPR_hi), 0)``.
    """
    _check_delta_conf(delta, confidence)
    alpha = (1.0 - confidence) / 2.0
    fpr_hi = clopper_pearson_upper(false_positives, negatives, alpha=alpha)
    fnr_hi = clopper_pearson_upper(false_negatives, positives, alpha=alpha)
    return _eps_from_rates(fpr_hi, fnr_hi, delta)


def _check_delta_conf(delta: float, confidence: float) -> None:
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def epsilon_lower_from_scores(
    in_scores: np.ndarray,
    out_scores: np.ndarray,
    *,
    thresholds: Sequence[float],
    delta: float,
    confidence: float,
) -> tuple[float, float]:
    """eps_lower for the tests "present iff score >= t", maximised over the given thresholds.

    The maximum over ``len(thresholds)`` tests is paid for with a Bonferroni correction (each test at
    level ``(1 - confidence) / len(thresholds)``), so the returned bound holds with probability at least
    ``confidence``. Pick the thresholds on data independent of ``in_scores``/``out_scores`` (see
    :func:`select_threshold`). Returns ``(eps_lower, best_threshold)``.
    """
    _check_delta_conf(delta, confidence)
    ts = [float(t) for t in thresholds]
    if not ts:
        raise ValueError("thresholds must not be empty")
    pos = np.sort(np.asarray(in_scores, dtype=np.float64).ravel())
    neg = np.sort(np.asarray(out_scores, dtype=np.float64).ravel())
    if pos.size == 0 or neg.size == 0:
        raise ValueError("in_scores and out_scores must both be non-empty")
    per_test_conf = 1.0 - (1.0 - confidence) / len(ts)
    best, best_t = 0.0, ts[0]
    for t in ts:
        fp = int(neg.size - np.searchsorted(neg, t, side="left"))  # out-trials called present
        fn = int(np.searchsorted(pos, t, side="left"))  # in-trials called absent
        eps = epsilon_lower_from_counts(
            false_positives=fp,
            negatives=int(neg.size),
            false_negatives=fn,
            positives=int(pos.size),
            delta=delta,
            confidence=per_test_conf,
        )
        if eps > best:
            best, best_t = eps, t
    return best, best_t


def select_threshold(
    in_scores: np.ndarray,
    out_scores: np.ndarray,
    *,
    delta: float,
    confidence: float,
    candidates: int = 200,
) -> float:
    """Choose the threshold that maximises the Clopper-Pearson eps bound on calibration data.

    Candidates are quantiles of the pooled scores, evenly spaced plus log-spaced into both tails
    (the tight thresholds of a DP audit sit where one error rate is tiny). Use the result on fresh
    trials.
    """
    pooled = np.concatenate([np.ravel(in_scores), np.ravel(out_scores)]).astype(np.float64)
    tail = np.logspace(-7, -1, candidates // 2)
    probs = np.clip(np.concatenate([np.linspace(0.0, 1.0, candidates), tail, 1.0 - tail]), 0.0, 1.0)
    qs = np.quantile(pooled, probs)
    best, best_t = -1.0, float(qs[len(qs) // 2])
    pos = np.sort(np.ravel(in_scores))
    neg = np.sort(np.ravel(out_scores))
    alpha = (1.0 - confidence) / 2.0
    for t in np.unique(qs):
        fp = int(neg.size - np.searchsorted(neg, t, side="left"))
        fn = int(np.searchsorted(pos, t, side="left"))
        fpr_hi = clopper_pearson_upper(fp, int(neg.size), alpha=alpha)
        fnr_hi = clopper_pearson_upper(fn, int(pos.size), alpha=alpha)
        eps = _eps_from_rates(fpr_hi, fnr_hi, delta)
        if eps > best:
            best, best_t = eps, float(t)
    return best_t


# ------------------------------------------------------------------------------------------ one run
def one_run_p_value(*, m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Upper bound on P[at least v of r guesses correct] under (epsilon, delta)-DP.

    Steinke, Nasr & Jagielski 2023, Thm. 3.1 (delta = 0: ``P[Binomial(r, q) >= v]``) and its
    (eps, delta) extension (their Sec. 5, Algorithm 2): add
    ``2 m delta max_{1<=i<=v} P[v - i <= Binomial(r, q) < v] / i`` with ``q = e^eps / (1 + e^eps)``.
    """
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got m={m}, r={r}, v={v}")
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must be in [0, 1], got {delta}")
    q = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(stats.binom.sf(v - 1, r, q))
    if delta == 0.0 or v == 0:
        return min(1.0, tail)
    pmf = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[B = v-1], P[B = v-2], ..., P[B = 0]
    partial = np.cumsum(pmf)  # partial[i-1] = P[v - i <= B < v]
    ratio = float(np.max(partial / np.arange(1, v + 1)))
    return min(1.0, tail + 2.0 * m * delta * ratio)


def one_run_epsilon_lower(*, m: int, r: int, v: int, delta: float, confidence: float) -> float:
    """Largest epsilon rejected at level ``1 - confidence`` by the one-run audit (bisection to 1e-6)."""
    _check_delta_conf(delta, confidence)
    alpha = 1.0 - confidence
    if one_run_p_value(m=m, r=r, v=v, epsilon=0.0, delta=delta) >= alpha:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m=m, r=r, v=v, epsilon=hi, delta=delta) < alpha:
        lo, hi = hi, hi * 2.0
        if hi > 1e3:
            return lo
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2.0
        if one_run_p_value(m=m, r=r, v=v, epsilon=mid, delta=delta) < alpha:
            lo = mid
        else:
            hi = mid
    return lo


def one_run_guesses(
    scores: np.ndarray, included: np.ndarray, *, k_pos: int, k_neg: int
) -> tuple[int, int]:
    """Guess "included" for the ``k_pos`` highest scores, "excluded" for the ``k_neg`` lowest, abstain
    on the rest (Steinke et al. 2023, Sec. 6). Returns ``(r, v)``: guesses made and guesses correct."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    inc = np.asarray(included, dtype=bool).ravel()
    if s.shape != inc.shape:
        raise ValueError(f"scores and included must have the same length, got {s.size}, {inc.size}")
    if k_pos < 0 or k_neg < 0 or k_pos + k_neg > s.size:
        raise ValueError(f"need k_pos, k_neg >= 0 and k_pos + k_neg <= m, got {k_pos}, {k_neg}")
    order = np.argsort(s, kind="stable")
    neg_idx = order[:k_neg]
    pos_idx = order[s.size - k_pos :] if k_pos > 0 else order[:0]
    v = int(np.sum(inc[pos_idx])) + int(np.sum(~inc[neg_idx]))
    return k_pos + k_neg, v


def _check_canaries(canaries: int) -> None:
    if canaries < 2:
        raise ValueError(f"canaries must be >= 2, got {canaries}")


def _best_one_run(
    scores: np.ndarray,
    included: np.ndarray,
    *,
    delta: float,
    confidence: float,
    k_grid: Sequence[int],
) -> tuple[float, int, int]:
    """One-run bound maximised over a grid of symmetric guess counts (k, k), Bonferroni-corrected."""
    m = scores.size
    conf = 1.0 - (1.0 - confidence) / len(k_grid)
    best = (0.0, 0, 0)
    for k in k_grid:
        r, v = one_run_guesses(scores, included, k_pos=k, k_neg=k)
        eps = one_run_epsilon_lower(m=m, r=r, v=v, delta=delta, confidence=conf)
        if eps > best[0]:
            best = (eps, r, v)
    return best


# ------------------------------------------------------------------------------------------ targets
def _gaussian_std(*, epsilon: float, delta: float, sensitivity: float) -> float:
    from fedprivacy.dp.mechanisms import analytic_gaussian_std

    return float(analytic_gaussian_std(sensitivity=sensitivity, epsilon=epsilon, delta=delta))


def gaussian_canary_statistics(
    *, noise_std: float, sensitivity: float, trials: int, rng: RandomSource
) -> tuple[np.ndarray, np.ndarray]:
    """Outputs of ``M(D) = f(D) + N(0, noise_std^2)`` with the canary absent (f = 0) and present
    (f = sensitivity), ``trials`` of each: the white-box worst case for one Gaussian release."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    out_scores = rng.normal(std=noise_std, size=trials)
    in_scores = sensitivity + rng.normal(std=noise_std, size=trials)
    return np.asarray(in_scores), np.asarray(out_scores)


def _split_audit(
    statistic: Callable[[int], tuple[np.ndarray, np.ndarray]],
    *,
    trials: int,
    delta: float,
    confidence: float,
) -> tuple[float, float]:
    """Half of the trials choose the threshold, the other half certify it."""
    if trials < 2:
        raise ValueError(f"trials must be >= 4 (two per world and half), got {2 * trials}")
    cal = max(1, trials // 2)
    cal_in, cal_out = statistic(cal)
    t = select_threshold(cal_in, cal_out, delta=delta, confidence=confidence)
    ev_in, ev_out = statistic(trials - cal)
    return epsilon_lower_from_scores(
        ev_in, ev_out, thresholds=[t], delta=delta, confidence=confidence
    )


def audit_gaussian_mechanism(
    *,
    epsilon: float,
    delta: float,
    trials: int,
    confidence: float = 0.95,
    rng: RandomSource,
    noise_scale: float = 1.0,
) -> AuditResult:
    """Audit one Gaussian release calibrated by the analytic Gaussian mechanism (Balle & Wang 2018).

    ``noise_scale`` < 1 simulates a broken implementation that adds less noise than it claims.
    ``trials`` counts both worlds together: half select the threshold, half certify it.
    """
    if noise_scale <= 0:
        raise ValueError(f"noise_scale must be > 0, got {noise_scale}")
    std = _gaussian_std(epsilon=epsilon, delta=delta, sensitivity=1.0) * noise_scale

    def statistic(n: int) -> tuple[np.ndarray, np.ndarray]:
        return gaussian_canary_statistics(noise_std=std, sensitivity=1.0, trials=n, rng=rng)

    eps_lower, t = _split_audit(statistic, trials=trials // 2, delta=delta, confidence=confidence)
    return AuditResult(
        target="gaussian" if noise_scale == 1.0 else f"gaussian-noise-x{noise_scale:g}",
        method="clopper-pearson",
        epsilon_claimed=epsilon,
        epsilon_lower=eps_lower,
        delta=delta,
        confidence=confidence,
        trials=trials,
        details=(("noise_std", std), ("threshold", t)),
    )


def one_run_audit_gaussian(
    *,
    epsilon: float,
    delta: float,
    canaries: int,
    confidence: float = 0.95,
    rng: RandomSource,
    noise_scale: float = 1.0,
) -> AuditResult:
    """One-run audit of the Gaussian mechanism: m canaries, each a unit vector e_i included with
    probability 1/2 in the released sum ``sum_i S_i e_i + N(0, sigma^2 I_m)``; score i = coordinate i."""
    _check_canaries(canaries)
    std = _gaussian_std(epsilon=epsilon, delta=delta, sensitivity=1.0) * noise_scale
    included = rng.bernoulli(0.5, canaries).astype(bool)
    scores = included.astype(np.float64) + rng.normal(std=std, size=canaries)
    k_grid = sorted({max(1, int(canaries * f)) for f in (0.01, 0.02, 0.05, 0.1, 0.2)})
    eps, r, v = _best_one_run(scores, included, delta=delta, confidence=confidence, k_grid=k_grid)
    return AuditResult(
        target="gaussian" if noise_scale == 1.0 else f"gaussian-noise-x{noise_scale:g}",
        method="one-run",
        epsilon_claimed=epsilon,
        epsilon_lower=eps,
        delta=delta,
        confidence=confidence,
        trials=1,
        details=(("canaries", float(canaries)), ("guesses", float(r)), ("correct", float(v))),
    )


def _aggregate_round(
    updates: Sequence[np.ndarray], *, clip_norm: float, noise_std: float, rng: RandomSource
) -> np.ndarray:
    """The shipped DP-FedAvg aggregation (:class:`fedprivacy.fl.aggregation.PlainAggregator`, central
    mode): every update re-clipped to ``clip_norm``, summed in client order, plus one Gaussian draw
    ``N(0, noise_std^2 I)`` on the sum (denominator 1: the audit scores the noisy sum)."""
    from fedprivacy.fl.aggregation import PlainAggregator
    from fedprivacy.fl.types import ClientUpdate

    like = [np.zeros(np.shape(updates[0]), dtype=np.float64)]
    batch = [ClientUpdate(partition_id=i, delta=(np.asarray(u, dtype=np.float64),))
             for i, u in enumerate(updates)]
    agg = PlainAggregator(clip_norm=clip_norm, noise_std=noise_std).aggregate(
        batch, like=like, denominator=1.0, rng=rng)
    if agg.dropped:
        raise ValueError(f"audit updates were left out: {agg.dropped}")
    return np.asarray(agg.mean_update[0], dtype=np.float64)


def dp_fedavg_canary_statistics(
    *,
    num_clients: int,
    dim: int,
    clip_norm: float,
    noise_multiplier: float,
    rounds: int,
    trials: int,
    rng: RandomSource,
    noise_scale: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Projections of the noisy DP-FedAvg aggregate on a canary client's direction, over ``rounds``.

    Each round ``num_clients`` honest clients send random updates of norm ~2 C (clipped to C); the canary
    client, when present, sends ``C u`` for a fixed unit vector u. The statistic is
    ``sum_rounds <aggregate, u>``, the likelihood-ratio test for T Gaussian rounds.
    """
    if min(num_clients, dim, rounds, trials) < 1:
        raise ValueError("num_clients, dim, rounds and trials must all be >= 1")
    direction = np.zeros(dim)
    direction[0] = 1.0
    canary = clip_norm * direction
    noise_std = noise_multiplier * clip_norm * noise_scale
    results = []
    for present in (True, False):
        stat = np.empty(trials)
        for k in range(trials):
            s = 0.0
            for _ in range(rounds):
                honest = rng.normal(std=2.0 * clip_norm / math.sqrt(dim), size=(num_clients, dim))
                updates = list(honest) + ([canary] if present else [])
                agg = _aggregate_round(updates, clip_norm=clip_norm, noise_std=noise_std, rng=rng)
                s += float(agg @ direction)
            stat[k] = s
        results.append(stat)
    return results[0], results[1]


def _claimed_epsilon_fedavg(*, noise_multiplier: float, rounds: int, delta: float) -> float:
    from fedprivacy.accounting import NoSampling, epsilon_for

    return float(
        epsilon_for(
            noise_multiplier=noise_multiplier, sampling=NoSampling(), steps=rounds, delta=delta
        )
    )


def audit_dp_fedavg(
    *,
    noise_multiplier: float,
    delta: float,
    trials: int,
    rounds: int = 1,
    num_clients: int = 5,
    dim: int = 64,
    clip_norm: float = 1.0,
    confidence: float = 0.95,
    rng: RandomSource,
    noise_scale: float = 1.0,
    epsilon_claimed: float | None = None,
) -> AuditResult:
    """Audit DP-FedAvg (full participation, central Gaussian noise) with a canary client.

    The claim is the accountant's epsilon for ``rounds`` Gaussian releases with ``noise_multiplier``
    and no sampling (``fedprivacy.accounting.epsilon_for``) unless ``epsilon_claimed`` is given.
    """
    claimed = (
        _claimed_epsilon_fedavg(noise_multiplier=noise_multiplier, rounds=rounds, delta=delta)
        if epsilon_claimed is None
        else float(epsilon_claimed)
    )

    def statistic(n: int) -> tuple[np.ndarray, np.ndarray]:
        return dp_fedavg_canary_statistics(
            num_clients=num_clients,
            dim=dim,
            clip_norm=clip_norm,
            noise_multiplier=noise_multiplier,
            rounds=rounds,
            trials=n,
            rng=rng,
            noise_scale=noise_scale,
        )

    eps_lower, t = _split_audit(statistic, trials=trials // 2, delta=delta, confidence=confidence)
    return AuditResult(
        target="dp-fedavg" if noise_scale == 1.0 else f"dp-fedavg-noise-x{noise_scale:g}",
        method="clopper-pearson",
        epsilon_claimed=claimed,
        epsilon_lower=eps_lower,
        delta=delta,
        confidence=confidence,
        trials=trials,
        details=(
            ("noise_multiplier", noise_multiplier),
            ("rounds", float(rounds)),
            ("threshold", t),
        ),
    )


def one_run_audit_dp_fedavg(
    *,
    noise_multiplier: float,
    delta: float,
    canaries: int,
    rounds: int = 1,
    num_clients: int = 5,
    clip_norm: float = 1.0,
    confidence: float = 0.95,
    rng: RandomSource,
    noise_scale: float = 1.0,
) -> AuditResult:
    """One-run audit of DP-FedAvg: ``canaries`` canary clients, canary i sends ``C e_i`` and joins with
    probability 1/2; one training run of ``rounds`` rounds; score i = ``sum_rounds aggregate[i]``.

    All canaries are mutually orthogonal, so each sees exactly one Gaussian of std ``sigma C`` per round
    in its coordinate (Steinke et al. 2023, Sec. 6, "gradient canaries").
    """
    _check_canaries(canaries)
    dim = canaries
    claimed = _claimed_epsilon_fedavg(noise_multiplier=noise_multiplier, rounds=rounds, delta=delta)
    included = rng.bernoulli(0.5, canaries).astype(bool)
    noise_std = noise_multiplier * clip_norm * noise_scale
    scores = np.zeros(dim)
    for _ in range(rounds):
        honest = rng.normal(std=2.0 * clip_norm / math.sqrt(dim), size=(num_clients, dim))
        updates = list(honest) + [
            clip_norm * np.eye(1, dim, int(i))[0] for i in np.flatnonzero(included)
        ]
        scores += _aggregate_round(updates, clip_norm=clip_norm, noise_std=noise_std, rng=rng)
    k_grid = sorted({max(1, int(canaries * f)) for f in (0.01, 0.02, 0.05, 0.1, 0.2)})
    eps, r, v = _best_one_run(scores, included, delta=delta, confidence=confidence, k_grid=k_grid)
    return AuditResult(
        target="dp-fedavg" if noise_scale == 1.0 else f"dp-fedavg-noise-x{noise_scale:g}",
        method="one-run",
        epsilon_claimed=claimed,
        epsilon_lower=eps,
        delta=delta,
        confidence=confidence,
        trials=1,
        details=(("canaries", float(canaries)), ("guesses", float(r)), ("correct", float(v))),
    )
