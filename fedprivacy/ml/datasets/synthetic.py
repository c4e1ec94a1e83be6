"""``"synthetic"``: FedProx's Synthetic(alpha, beta) federated data set, generated per client.

Li et al. 2020, "Federated Optimization in Heterogeneous Networks" (MLSys), section 5.1 and appendix C.1;
``num_clients`` clients, 60 features, 10 classes. Each client keeps ``test_fraction`` of its samples for
the pooled server test set. ``Split.groups`` holds each example's client id (the natural partition,
always used: pooling and re-splitting it would destroy the heterogeneity it exists for).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedprivacy.ml.data import Split, check_fraction, register_dataset

__all__ = ["SYNTHETIC_DIM", "SYNTHETIC_CLASSES", "SyntheticOptions", "make_synthetic"]

SYNTHETIC_DIM = 60
SYNTHETIC_CLASSES = 10


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticOptions:
    """Options of ``"synthetic"`` (run-config keys ``synthetic-alpha``, ``synthetic-beta``)."""

    alpha: float = field(default=1.0, metadata={"config_key": "synthetic-alpha"})
    beta: float = field(default=1.0, metadata={"config_key": "synthetic-beta"})
    iid: bool = False

    def __post_init__(self) -> None:
        if not (self.alpha >= 0 and self.beta >= 0):
            raise ValueError(
                f"alpha and beta must be >= 0, got alpha={self.alpha}, beta={self.beta}"
            )


def make_synthetic(
    *,
    num_clients: int,
    seed: int,
    test_fraction: float,
    alpha: float = 1.0,
    beta: float = 1.0,
    iid: bool = False,
    lognormal_mean: float = 4.0,
    lognormal_sigma: float = 2.0,
    min_samples: int = 50,
    max_samples: int | None = 1000,
) -> tuple[Split, Split]:
    """Generate FedProx's Synthetic(alpha, beta) federated data set.

    Li et al. 2020, "Federated Optimization in Heterogeneous Networks" (MLSys), section 5.1: for client
    k, ``u_k ~ N(0, alpha)``, ``W_k ~ N(u_k, 1)`` (10x60), ``b_k ~ N(u_k, 1)`` (10); ``B_k ~ N(0, beta)``,
    ``v_k ~ N(B_k, 1)`` (60); ``x ~ N(v_k, Sigma)`` with diagonal ``Sigma_jj = j^-1.2``; label
    ``y = argmax(softmax(W_k x + b_k))``. As in the authors' generator, ``N(0, alpha)`` uses alpha as
    the standard deviation, and the number of samples of client k is ``floor(LogNormal(4, 2)) + 50``
    (a power law). ``iid=True`` gives the paper's Synthetic-IID: one shared W, b and ``v = 0``.

    Deviation from the paper: client sizes are capped at ``max_samples`` (default 1000; None = no cap)
    so that a 1000-client set stays small; the paper's draw has a heavy tail (e^10 at 3 sigma).

    Args:
        num_clients: number of clients (>= 1).
        seed: generation seed; the same seed gives the same data in every process.
        test_fraction: fraction of *each client's* samples pooled into the server's test set.
        alpha: how much client models differ (std of u_k), >= 0.
        beta: how much client input distributions differ (std of B_k), >= 0.
        iid: Synthetic-IID variant (alpha and beta ignored).
        lognormal_mean, lognormal_sigma, min_samples, max_samples: client-size distribution.

    Returns:
        ``(train, test)``; x is ``(N, 60)`` float32, y int64 in [0, 10), ``groups`` the client id.
        Every client has at least one training and one test example.
    """
    _check_arguments(num_clients=num_clients, test_fraction=test_fraction, alpha=alpha, beta=beta,
                     min_samples=min_samples, max_samples=max_samples)
    rng = np.random.Generator(np.random.PCG64(seed))  # one stream, drawn in the authors' order
    sizes = (
        rng.lognormal(lognormal_mean, lognormal_sigma, num_clients).astype(np.int64) + min_samples
    )
    if max_samples is not None:
        sizes = np.minimum(sizes, max_samples)
    shared = (rng.normal(0.0, 1.0, (SYNTHETIC_CLASSES, SYNTHETIC_DIM)),
              rng.normal(0.0, 1.0, SYNTHETIC_CLASSES)) if iid else None
    train_parts, test_parts = [], []
    for k in range(num_clients):
        x, y = _client_samples(rng, n=int(sizes[k]), alpha=alpha, beta=beta, shared=shared)
        n_test = min(max(1, int(round(test_fraction * len(y)))), len(y) - 1)
        perm = rng.permutation(len(y))
        te, tr = np.sort(perm[:n_test]), np.sort(perm[n_test:])
        train_parts.append((x[tr], y[tr], k))
        test_parts.append((x[te], y[te], k))
    return _pooled(train_parts), _pooled(test_parts)


def _check_arguments(*, num_clients: int, test_fraction: float, alpha: float, beta: float,
                     min_samples: int, max_samples: int | None) -> None:
    if isinstance(num_clients, bool) or not isinstance(num_clients, int):
        raise TypeError(f"num_clients must be an int, got {type(num_clients).__name__}")
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    check_fraction(test_fraction)
    if alpha < 0 or beta < 0:
        raise ValueError(f"alpha and beta must be >= 0, got alpha={alpha}, beta={beta}")
    if min_samples < 2:
        raise ValueError(f"min_samples must be >= 2, got {min_samples}")
    if max_samples is not None and max_samples < min_samples:
        raise ValueError(f"max_samples must be >= min_samples, got {max_samples}")


def _client_samples(
    rng: np.random.Generator, *, n: int, alpha: float, beta: float,
    shared: tuple[np.ndarray, np.ndarray] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """One client's ``n`` samples: its model (W, b) and input mean v (or the shared IID ones), then
    ``x ~ N(v, Sigma)``, ``Sigma_jj = j^-1.2``, and ``y = argmax(W x + b)``."""
    dim = SYNTHETIC_DIM
    if shared is not None:
        (w, b), v = shared, np.zeros(dim)
    else:
        u_k = rng.normal(0.0, alpha)
        w = rng.normal(u_k, 1.0, (SYNTHETIC_CLASSES, dim))
        b = rng.normal(u_k, 1.0, SYNTHETIC_CLASSES)
        b_k = rng.normal(0.0, beta)
        v = rng.normal(b_k, 1.0, dim)
    cov_sqrt = np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2 / 2.0)  # sqrt(Sigma_jj)
    x = v + rng.standard_normal((n, dim)) * cov_sqrt
    return x, np.argmax(x @ w.T + b, axis=1).astype(np.int64)  # argmax of softmax == argmax of logits


def _pooled(parts: list[tuple[np.ndarray, np.ndarray, int]]) -> Split:
    """The clients' (x, y, client id) pooled into one Split with ``groups`` = client id."""
    return Split(
        x=np.concatenate([x for x, _, _ in parts]).astype(np.float32),
        y=np.concatenate([y for _, y, _ in parts]),
        groups=np.concatenate([np.full(len(y), k, dtype=np.int64) for _, y, k in parts]),
        num_classes=SYNTHETIC_CLASSES,
    )


@register_dataset(
    "synthetic",
    options=SyntheticOptions,
    natural_partition=True,
    per_client=True,
    description="FedProx Synthetic(alpha, beta), generated per client",
)
def _load(
    opts: SyntheticOptions, /, *, name: str, seed: int, test_fraction: float, num_clients: int
) -> tuple[Split, Split]:
    del name
    return make_synthetic(
        num_clients=num_clients,
        seed=seed,
        test_fraction=test_fraction,
        alpha=opts.alpha,
        beta=opts.beta,
        iid=opts.iid,
    )
