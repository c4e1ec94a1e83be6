"""Server optimizers (fedprivacy/fl/server_optimizers.py) against Flower's strategies and torch.optim.

Reference: Flower 1.42's FedAvgM / FedAdam / FedYogi run for real on the in-process engine with clients
that return prescribed updates Δ_r(pid); ``evaluate_fn`` records Flower's global arrays after every
round. fedprivacy's optimizer replays the same mean updates and must follow the same trajectory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivacy.config import RunConfig
from fedprivacy.fl.server_optimizers import (
    FedAdagrad,
    FedAdam,
    FedAvgM,
    FedYogi,
    decode_arrays,
    encode_arrays,
)

REPO = Path(__file__).resolve().parents[2]
SHAPES = [(4, 3), (3,)]
NODES, ROUNDS = 3, 6


def _delta(rnd: int, pid: int) -> list[np.ndarray]:
    rng = np.random.default_rng([rnd, pid])
    return [rng.normal(scale=0.5, size=s) + 0.1 * (pid - 1) for s in SHAPES]


def _initial() -> list[np.ndarray]:
    rng = np.random.default_rng(99)
    return [rng.normal(size=s) for s in SHAPES]


def _flower_trajectory(strategy: Any) -> list[list[np.ndarray]]:
    """Global arrays after rounds 1..ROUNDS of ``strategy`` with clients returning w + Δ_r(pid)."""
    from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp

    from server.engine import run_inprocess

    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        arrays = msg.content["arrays"]
        rnd = int(msg.content["config"]["server-round"])
        pid = int(context.node_config["partition-id"])
        new = [w + d for w, d in zip(arrays.to_numpy_ndarrays(), _delta(rnd, pid), strict=True)]
        return Message(RecordDict({
            "arrays": ArrayRecord({k: Array(v) for k, v in zip(arrays.keys(), new, strict=True)}),
            "metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)

    seen: list[list[np.ndarray]] = []
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        def record(rnd: int, arrays: ArrayRecord) -> MetricRecord | None:
            if rnd > 0:
                seen.append(arrays.to_numpy_ndarrays())
            return None

        initial = ArrayRecord({f"a{i}": Array(a) for i, a in enumerate(_initial())})
        strategy.start(grid=grid, initial_arrays=initial, num_rounds=ROUNDS, evaluate_fn=record)

    run_inprocess(num_supernodes=NODES, app_dir=REPO, client_app=client, server_app=server)
    assert len(seen) == ROUNDS
    return seen


def _ours(opt: Any) -> list[list[np.ndarray]]:
    w, out = _initial(), []
    for rnd in range(1, ROUNDS + 1):
        deltas = [_delta(rnd, pid) for pid in range(NODES)]
        mean = [np.mean([d[i] for d in deltas], axis=0) for i in range(len(SHAPES))]
        w = opt.step(w, mean)
        out.append(w)
    return out


def _flower(name: str, **kw: Any) -> Any:
    from flwr.serverapp import strategy as fs

    common = {"fraction_evaluate": 0.0, "min_train_nodes": NODES, "min_available_nodes": NODES}
    return getattr(fs, name)(**common, **kw)


@pytest.mark.parametrize("ours,theirs", [
    (lambda: FedAvgM(learning_rate=0.7, momentum=0.9),
     lambda: _flower("FedAvgM", server_learning_rate=0.7, server_momentum=0.9)),
    (lambda: FedAvgM(learning_rate=1.3, momentum=0.0),
     lambda: _flower("FedAvgM", server_learning_rate=1.3, server_momentum=0.0)),
    (lambda: FedAdam(), lambda: _flower("FedAdam")),
    (lambda: FedAdam(learning_rate=0.03, beta_1=0.5, beta_2=0.9, tau=1e-2),
     lambda: _flower("FedAdam", eta=0.03, beta_1=0.5, beta_2=0.9, tau=1e-2)),
    (lambda: FedYogi(), lambda: _flower("FedYogi")),
    (lambda: FedYogi(learning_rate=0.05, beta_1=0.0, beta_2=0.5, tau=1e-4),
     lambda: _flower("FedYogi", eta=0.05, beta_1=0.0, beta_2=0.5, tau=1e-4)),
    (lambda: FedAdagrad(), lambda: _flower("FedAdagrad")),
    (lambda: FedAdagrad(learning_rate=0.02, tau=1e-2), lambda: _flower("FedAdagrad", eta=0.02, tau=1e-2)),
], ids=["fedavgm", "fedavgm-no-momentum", "fedadam", "fedadam-hp", "fedyogi", "fedyogi-hp", "fedadagrad",
        "fedadagrad-hp"])
def test_same_trajectory_as_flowers_strategy(ours: Any, theirs: Any) -> None:
    expected = _flower_trajectory(theirs())

    got = _ours(ours())

    for rnd, (a, b) in enumerate(zip(got, expected, strict=True), start=1):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12, err_msg=f"round {rnd}")


def test_fedavgm_is_torch_sgd_with_momentum() -> None:
    import torch

    params = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in _initial()]
    sgd = torch.optim.SGD(params, lr=0.7, momentum=0.9)
    ours = FedAvgM(learning_rate=0.7, momentum=0.9)
    w = _initial()
    for rnd in range(1, ROUNDS + 1):
        delta = _delta(rnd, 0)
        for p, d in zip(params, delta, strict=True):
            p.grad = torch.tensor(-d)
        sgd.step()
        w = ours.step(w, delta)

    for p, x in zip(params, w, strict=True):
        np.testing.assert_allclose(p.detach().numpy(), x, rtol=1e-13)


@pytest.mark.parametrize("make", [lambda: FedAvgM(), lambda: FedAdam(), lambda: FedYogi(), lambda: FedAdagrad()],
                         ids=["fedavgm", "fedadam", "fedyogi", "fedadagrad"])
def test_state_round_trips_through_json_and_resumes_bit_for_bit(make: Any) -> None:
    a, b = make(), make()
    w = _initial()
    for rnd in (1, 2, 3):
        w = a.step(w, _delta(rnd, 0))
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))

    wa, wb = a.step(w, _delta(4, 0)), b.step(w, _delta(4, 0))

    for x, y in zip(wa, wb, strict=True):
        assert np.array_equal(x, y)
    assert make().state_dict() == {}


@pytest.mark.parametrize("make,state,match", [
    (lambda: FedAdam(), {"step": 1, "m": ["!!"], "v": ["!!"]}, "base64"),
    (lambda: FedAdam(), {"step": 0, "m": [], "v": []}, "step"),
    (lambda: FedAdam(), {"m": []}, "keys"),
    (lambda: FedYogi(), {"step": True, "m": [], "v": []}, "step"),
    (lambda: FedAvgM(), {"velocity": [1.0]}, "base64 .npy strings"),
])
def test_bad_state_is_refused(make: Any, state: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make().load_state_dict(state)


@pytest.mark.parametrize("call,match", [
    (lambda: FedAvgM(momentum=1.0), r"momentum must be in \[0, 1\)"),
    (lambda: FedAvgM(learning_rate=0.0), r"learning_rate must be in \(0, inf\)"),
    (lambda: FedAdam(beta_2=-0.1), "beta_2"),
    (lambda: FedYogi(tau=0.0), "tau"),
    (lambda: FedAdam(learning_rate=float("nan")), "learning_rate"),
])
def test_bad_hyper_parameters_name_the_parameter(call: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_shape_mismatch_is_refused_and_changes_nothing() -> None:
    opt = FedAdam()
    opt.step(_initial(), _delta(1, 0))
    before = opt.state_dict()

    with pytest.raises(ValueError, match="shape"):
        opt.step(_initial(), [np.zeros((2, 2)), np.zeros(3)])

    assert opt.state_dict() == before


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=6))
def test_float32_weights_stay_float32_and_arrays_encode_exactly(values: list[float]) -> None:
    w = [np.asarray(values, dtype=np.float32)]
    for opt in (FedAvgM(), FedAdam(), FedYogi()):
        assert opt.step(w, [np.ones_like(w[0])])[0].dtype == np.float32
    arrays = [np.asarray(values), np.asarray(values, dtype=np.float32).reshape(1, -1)]
    back = decode_arrays(encode_arrays(arrays), what="x")
    assert back is not None and all(np.array_equal(a, b) and a.dtype == b.dtype
                                    for a, b in zip(arrays, back, strict=True))


def test_the_reference_can_tell_the_rules_apart() -> None:
    adam, yogi, avgm = _ours(FedAdam()), _ours(FedYogi()), _ours(FedAvgM())

    assert not np.allclose(adam[-1][0], yogi[-1][0], rtol=1e-6)
    assert not np.allclose(adam[-1][0], avgm[-1][0], rtol=1e-6)


@pytest.mark.parametrize(("opt", "key", "reads"), [
    ("fedadagrad", "server-beta-1", "server-learning-rate, server-tau"),
    ("fedadam", "server-momentum", "server-beta-1, server-beta-2, server-learning-rate, server-tau"),
    ("fedavg", "server-tau", "server-learning-rate"),
])
def test_an_optimizer_refuses_a_key_it_does_not_read(opt: str, key: str, reads: str) -> None:
    from fedprivacy.errors import ConfigError

    with pytest.raises(ConfigError, match=f"^{key} is not read by server-optimizer='{opt}' \\(it reads {reads}\\)"):
        RunConfig.from_mapping({"server-optimizer": opt, key: 0.5})


def test_a_registered_optimizer_declares_the_keys_it_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedprivacy.errors import ConfigError
    from fedprivacy.fl import server_opt

    monkeypatch.setattr(server_opt, "SERVER_OPTIMIZERS", dict(server_opt.SERVER_OPTIMIZERS))
    monkeypatch.setattr(server_opt, "SERVER_OPTIMIZER_KEYS", dict(server_opt.SERVER_OPTIMIZER_KEYS))
    server_opt.register_server_optimizer(
        "test-heavy-ball", lambda cfg: server_opt.FedAvgM(momentum=cfg.server_momentum),
        reads=("server-momentum",))
    cfg = RunConfig.from_mapping({"server-optimizer": "test-heavy-ball", "server-momentum": 0.5})
    assert server_opt.make_server_optimizer(cfg).momentum == 0.5  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="server-learning-rate is not read"):
        RunConfig.from_mapping({"server-optimizer": "test-heavy-ball", "server-learning-rate": 0.5})
