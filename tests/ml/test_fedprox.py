"""FedProx (Li et al. 2020): the proximal term in local training, against an autograd reference, and a
real run whose ε is FedAvg's (the clipped update is still what is released)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from fedprivacy.config import RunConfig
from fedprivacy.errors import ConfigError
from fedprivacy.ml.partition import Split
from fedprivacy.ml.train import train_local
from server.engine import run_inprocess


def _split(n: int, seed: int) -> Split:
    g = np.random.default_rng(seed)
    return Split(x=g.normal(size=(n, 4)).astype(np.float32), y=g.integers(0, 3, size=n).astype(np.int64))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))


def _reference(model: nn.Module, split: Split, *, mu: float, lr: float, epochs: int, bs: int, seed: int) -> None:
    """Flower's FedProx client: autograd on loss + mu/2 ||w - w0||^2, the same batches as train_local."""
    x, y = torch.from_numpy(split.x), torch.from_numpy(split.y)
    gen = torch.Generator()
    gen.manual_seed(seed)
    w0 = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=gen)
        for start in range(0, len(y), bs):
            idx = perm[start:start + bs]
            prox = sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), w0, strict=True))
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx]) + mu / 2 * prox
            opt.zero_grad()
            loss.backward()
            opt.step()


@settings(max_examples=15, deadline=None)
@given(mu=st.sampled_from([0.0, 0.01, 0.5, 2.0]), n=st.integers(3, 25), epochs=st.integers(1, 3),
       bs=st.integers(1, 8), lr=st.sampled_from([0.05, 0.3]))
def test_the_proximal_step_is_the_gradient_of_the_proximal_loss(mu: float, n: int, epochs: int, bs: int,
                                                                lr: float) -> None:
    split = _split(n, n)
    ours, ref = _model(), _model()
    train_local(ours, split, epochs=epochs, lr=lr, batch_size=bs, seed=7, proximal_mu=mu)
    _reference(ref, split, mu=mu, lr=lr, epochs=epochs, bs=min(bs, n), seed=7)
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_larger_mu_keeps_the_local_model_nearer_the_global_one() -> None:
    split = _split(40, 1)
    moved = []
    for mu in (0.0, 1.0, 10.0):
        model = _model()
        start = [p.detach().clone() for p in model.parameters()]
        train_local(model, split, epochs=3, lr=0.05, batch_size=8, seed=3, proximal_mu=mu)
        moved.append(float(sum(((p.detach() - s) ** 2).sum() for p, s in zip(model.parameters(), start, strict=True))))
    assert moved[0] > moved[1] > moved[2] > 0


def test_fedprox_with_dpsgd_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="proximal-mu > 0 with dpsgd=true is not implemented"):
        RunConfig.from_mapping({"proximal-mu": 0.1, "dpsgd": True})
    with pytest.raises(ConfigError, match="proximal-mu must be >= 0"):
        RunConfig.from_mapping({"proximal-mu": -1.0})


def test_a_fedprox_run_trains_differently_and_reports_fedavgs_epsilon(tmp_path: Path) -> None:
    base = {"num-server-rounds": 2, "seed": 5, "local-epochs": 1, "dataset": "digits", "secagg": False,
            "privacy": "central", "sample-rate": 0.5, "noise-multiplier": 1.0, "client-timeout": 30.0,
            "output-dir": str(tmp_path)}
    out = {}
    for name, mu in (("fedavg", 0.0), ("fedprox", 1.0)):
        run_inprocess(run_config={**base, "run-name": name, "proximal-mu": mu}, num_supernodes=6,
                      app_dir=Path(__file__).resolve().parents[2], node_id_seed=3)
        out[name] = json.loads((tmp_path / name / "results.json").read_text(encoding="utf-8"))
    assert out["fedprox"]["privacy"]["epsilon"] == out["fedavg"]["privacy"]["epsilon"] > 0
    assert out["fedprox"]["rounds"][-1]["test_loss"] != out["fedavg"]["rounds"][-1]["test_loss"]
