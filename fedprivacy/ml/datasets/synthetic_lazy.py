"""``"synthetic-lazy"``: FedProx's Synthetic(alpha, beta), each client generated on demand.

The same generative model as ``"synthetic"`` (Li et al. 2020, "Federated Optimization in Heterogeneous
Networks", MLSys, section 5.1; :func:`fedprivacy.ml.datasets.synthetic.make_synthetic`), but client k
draws from its own stream, ``PCG64(SeedSequence(seed, spawn_key=(k,)))`` (numpy's independent child
streams), in the order size, model, samples, held-out split. Client k's data are therefore a function of
the seed and k alone: a run over a million clients generates only the clients it samples, and the same
client is the same in every process and at every population size. The draws differ from ``"synthetic"``
(one stream for all clients in turn), hence the separate name.

The server's test set pools the held-out samples of the first ``min(N, EVAL_CLIENTS)`` clients, so
every population of at least ``EVAL_CLIENTS`` clients is evaluated on the same examples.
"""

from __future__ import annotations

import numpy as np

from fedprivacy.ml.data import Split, check_fraction, register_dataset
from fedprivacy.ml.datasets.synthetic import (
    SYNTHETIC_CLASSES,
    SYNTHETIC_DIM,
    SyntheticOptions,
    _client_samples,
)

__all__ = ["EVAL_CLIENTS", "synthetic_client", "synthetic_client_size"]

EVAL_CLIENTS = 1000
_SIZE_MEAN, _SIZE_SIGMA, _MIN_SAMPLES, _MAX_SAMPLES = 4.0, 2.0, 50, 1000  # as make_synthetic's defaults


def synthetic_client(opts: SyntheticOptions, /, *, seed: int, test_fraction: float,
                     client_id: int) -> tuple[Split, Split]:
    """Client ``client_id``'s ``(train, test)``: ``floor(LogNormal(4, 2)) + 50`` samples (at most 1000)
    of its own Synthetic(alpha, beta) model (``iid``: the model shared by every client, drawn from the
    seed's own stream), ``test_fraction`` of them held out; ``groups`` is the client id."""
    rng, n = _stream_and_size(seed=seed, test_fraction=test_fraction, client_id=client_id)
    shared = None
    if opts.iid:
        common = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))
        shared = (common.normal(0.0, 1.0, (SYNTHETIC_CLASSES, SYNTHETIC_DIM)),
                  common.normal(0.0, 1.0, SYNTHETIC_CLASSES))
    x, y = _client_samples(rng, n=n, alpha=opts.alpha, beta=opts.beta, shared=shared)
    n_test = _held_out(n, test_fraction)
    perm = rng.permutation(n)
    te, tr = np.sort(perm[:n_test]), np.sort(perm[n_test:])
    return _split(x[tr], y[tr], int(client_id)), _split(x[te], y[te], int(client_id))


def synthetic_client_size(opts: SyntheticOptions, /, *, seed: int, test_fraction: float, client_id: int) -> int:
    """``len(synthetic_client(...)[0])`` from the client's first draw alone (its size), no samples made."""
    del opts
    _, n = _stream_and_size(seed=seed, test_fraction=test_fraction, client_id=client_id)
    return n - _held_out(n, test_fraction)


def _stream_and_size(*, seed: int, test_fraction: float, client_id: int) -> tuple[np.random.Generator, int]:
    check_fraction(test_fraction)
    if isinstance(client_id, bool) or not isinstance(client_id, int | np.integer) or client_id < 0:
        raise ValueError(f"client_id must be an int >= 0, got {client_id!r}")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(int(client_id),))))
    return rng, min(int(rng.lognormal(_SIZE_MEAN, _SIZE_SIGMA)) + _MIN_SAMPLES, _MAX_SAMPLES)


def _held_out(n: int, test_fraction: float) -> int:
    return min(max(1, int(round(test_fraction * n))), n - 1)


def _split(x: np.ndarray, y: np.ndarray, k: int) -> Split:
    return Split(x=x.astype(np.float32), y=y, groups=np.full(len(y), k, dtype=np.int64),
                 num_classes=SYNTHETIC_CLASSES)


def _pool(parts: list[Split]) -> Split:
    return Split(x=np.concatenate([p.x for p in parts]), y=np.concatenate([p.y for p in parts]),
                 groups=np.concatenate([p.groups for p in parts if p.groups is not None]),
                 num_classes=SYNTHETIC_CLASSES)


@register_dataset(
    "synthetic-lazy",
    options=SyntheticOptions,
    natural_partition=True,
    per_client=True,
    description="FedProx Synthetic(alpha, beta), each client generated on demand from (seed, client id)",
    client_loader=synthetic_client,
    client_size=synthetic_client_size,
)
def _load(
    opts: SyntheticOptions, /, *, name: str, seed: int, test_fraction: float, num_clients: int
) -> tuple[Split, Split]:
    """The pool of the first ``min(num_clients, EVAL_CLIENTS)`` clients (the server's test set)."""
    del name
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    clients = [synthetic_client(opts, seed=seed, test_fraction=test_fraction, client_id=k)
               for k in range(min(num_clients, EVAL_CLIENTS))]
    return _pool([tr for tr, _ in clients]), _pool([te for _, te in clients])
