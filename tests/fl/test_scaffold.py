"""SCAFFOLD (Karimireddy et al. 2020, Alg. 1 option II): the client step against a plain-torch reference,
the joint clipped release of (Δy, Δc), the server's control variate, FedAvg's ε, and the refusals."""

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
from fedprivacy.fl.client import client_update, train_client
from fedprivacy.fl.scaffold import ClientControl, ScaffoldServer
from fedprivacy.fl.task import LocalResult
from fedprivacy.fl.types import AggregateResult, RoundInstructions
from fedprivacy.ml.models import get_weights, set_weights
from fedprivacy.ml.partition import Split
from fedprivacy.ml.train import train_local
from server.engine import run_inprocess

ROOT = Path(__file__).resolve().parents[2]


def _split(n: int, seed: int) -> Split:
    g = np.random.default_rng(seed)
    return Split(x=g.normal(size=(n, 4)).astype(np.float32), y=g.integers(0, 3, size=n).astype(np.int64))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))


def _instructions(*, clip_norm: float = 0.0, lr: float = 0.1, epochs: int = 1, bs: int = 4,
                  private: bool = False, rnd: int = 1) -> RoundInstructions:
    return RoundInstructions(round=rnd, privacy="central" if private else "none", clip_norm=clip_norm,
                             client_mechanism="", noise_multiplier=0.0, private=private, learning_rate=lr,
                             local_epochs=epochs, batch_size=bs, num_classes=3, seed=11, scaffold=True)


def _trainer(split: Split, instr: RoundInstructions, seeds: list[int]):
    """The ML step: fedprivacy's train_local on the tiny model (records the shuffle seed it is given)."""

    def train(w, seed, *, correction=None) -> LocalResult:
        seeds.append(seed)
        model = _model()
        set_weights(model, w)
        res = train_local(model, split, epochs=instr.local_epochs, lr=instr.learning_rate,
                          batch_size=instr.batch_size, seed=seed, correction=correction)
        return LocalResult(weights=get_weights(model), num_examples=res.num_examples, loss=res.loss,
                           dpsgd_steps=None, dpsgd_sample_rate=None, steps=res.steps)

    return train


def _reference(x, c, c_i, split: Split, *, lr: float, epochs: int, bs: int, seed: int):
    """Alg. 1 option II in plain torch: SGD on f(y) + <c - c_i, y> (its gradient is g - c_i + c), the
    same batches as train_local; then c_i+ = c_i - c + (x - y) / (K lr)."""
    model = _model()
    with torch.no_grad():
        for p, w in zip(model.parameters(), x, strict=True):
            p.copy_(torch.from_numpy(w))
    lin = [torch.from_numpy((cc - ci).astype(np.float32)) for cc, ci in zip(c, c_i, strict=True)]
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    xs, ys = torch.from_numpy(split.x), torch.from_numpy(split.y)
    gen = torch.Generator()
    gen.manual_seed(seed)
    steps = 0
    for _ in range(epochs):
        perm = torch.randperm(len(ys), generator=gen)
        for start in range(0, len(ys), min(bs, len(ys))):
            idx = perm[start:start + bs]
            loss = nn.functional.cross_entropy(model(xs[idx]), ys[idx])
            loss = loss + sum((p * d).sum() for p, d in zip(model.parameters(), lin, strict=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
    y = [p.detach().numpy().astype(np.float64) for p in model.parameters()]
    c_new = [ci - cc + (w - yy) / (steps * lr) for ci, cc, w, yy in zip(c_i, c, x, y, strict=True)]
    return [yy - w for yy, w in zip(y, x, strict=True)], [a - b for a, b in zip(c_new, c_i, strict=True)], c_new


@settings(max_examples=12, deadline=None)
@given(n=st.integers(3, 20), epochs=st.integers(1, 3), bs=st.integers(1, 8), lr=st.sampled_from([0.05, 0.3]),
       scale=st.sampled_from([0.0, 0.1, 1.0]), seed=st.integers(0, 1000))
def test_the_client_step_is_alg1_option_ii_of_a_plain_torch_reference(n, epochs, bs, lr, scale, seed) -> None:
    g = np.random.default_rng(seed)
    split = _split(n, seed)
    x = get_weights(_model())
    c = [(scale * g.normal(size=w.shape)).astype(np.float32) for w in x]
    c_i = [(scale * g.normal(size=w.shape)).astype(np.float32) for w in x]
    instr = _instructions(lr=lr, epochs=epochs, bs=bs)
    control, seeds = ClientControl(value=tuple(c_i)), []
    update = client_update(partition_id=0, weights=[*x, *c], instructions=instr,
                           train=_trainer(split, instr, seeds), control=control)
    dy, dc, c_new = _reference([w.astype(np.float64) for w in x], [a.astype(np.float64) for a in c],
                               [a.astype(np.float64) for a in c_i], split, lr=lr, epochs=epochs, bs=bs,
                               seed=seeds[0])
    assert len(update.delta) == 2 * len(x)
    for got, want in zip(update.delta, [*dy, *dc], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)
    assert control.value is not None
    for got, want in zip(control.value, c_new, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)


@settings(max_examples=10, deadline=None)
@given(clip=st.sampled_from([0.01, 0.1, 0.5, 2.0]), rounds=st.integers(1, 3), lr=st.sampled_from([0.05, 0.5]))
def test_the_released_vector_is_dy_and_dc_clipped_jointly_to_c(clip, rounds, lr) -> None:
    split = _split(24, 3)
    x = get_weights(_model())
    c = [np.full(w.shape, 0.05, dtype=np.float32) for w in x]
    control = ClientControl()
    for rnd in range(1, rounds + 1):
        instr = _instructions(clip_norm=clip, lr=lr, private=True, rnd=rnd)
        update = client_update(partition_id=2, weights=[*x, *c], instructions=instr,
                               train=_trainer(split, instr, []), control=control)
        flat = np.concatenate([np.ravel(a).astype(np.float64) for a in update.delta])
        assert len(update.delta) == 2 * len(x)
        assert np.linalg.norm(flat) <= clip * (1 + 1e-6)
        dc = np.concatenate([np.ravel(a) for a in update.delta[len(x):]])
        assert np.linalg.norm(dc) > 0  # Δc is inside the clipped release, not beside it
    # nothing else leaves: the same metadata fields as a FedAvg update
    assert set(update.metrics) == set() and control.value is not None


def test_a_digits_client_keeps_its_control_variate_and_releases_one_clipped_vector() -> None:
    cfg = RunConfig.from_mapping({"dataset": "digits", "privacy": "central", "scaffold": True, "clip-norm": 0.3,
                                  "seed": 4})
    from fedprivacy.fl.task import initial_weights, test_set

    test = test_set(cfg, num_partitions=5)
    x = initial_weights(cfg, input_shape=test.feature_shape, num_classes=10, seed=0)
    c = [np.zeros_like(w) for w in x]
    control = ClientControl()
    base = dict(privacy="central", clip_norm=0.3, client_mechanism="", noise_multiplier=0.0, private=True,
                learning_rate=cfg.learning_rate, local_epochs=1, batch_size=32, num_classes=10, seed=4, scaffold=True)
    first = train_client(cfg, partition_id=1, num_partitions=5, weights=[*x, *c],
                         instructions=RoundInstructions(round=1, **base), control=control)
    kept = control.value
    second = train_client(cfg, partition_id=1, num_partitions=5, weights=[*x, *c],
                          instructions=RoundInstructions(round=2, **base), control=control)
    for upd in (first, second):
        assert np.linalg.norm(np.concatenate([np.ravel(a) for a in upd.delta])) <= 0.3 * (1 + 1e-6)
    assert kept is not None and any(np.any(k != 0) for k in kept)
    assert control.value is not kept  # c_i moved again in round 2


def test_the_server_control_variate_moves_by_the_released_sum_over_n() -> None:
    server = ScaffoldServer(population=10)
    x = [np.zeros((2, 3), np.float32), np.zeros(3, np.float32)]
    sent = server.broadcast(x)
    assert len(sent) == 4 and all(np.all(a == 0) for a in sent[2:])
    g = np.random.default_rng(0)
    mean = tuple(g.normal(size=a.shape).astype(np.float32) for a in sent)
    agg = AggregateResult(mean_update=mean, aggregated=(1, 2, 3), dropped={}, noise_std=0.0, denominator=4.0)
    dy = server.update(agg)
    assert [np.shape(a) for a in dy] == [(2, 3), (3,)] and all(a is b for a, b in zip(dy, mean[:2], strict=True))
    for got, d in zip(server.control or [], mean[2:], strict=True):  # (1/N) Σ Δc = (denominator/N) mean
        np.testing.assert_allclose(got, 4.0 / 10 * d.astype(np.float64))
    restored = ScaffoldServer(population=10)
    restored.load_state_dict(json.loads(json.dumps(server.state_dict())))
    for a, b in zip(restored.control or [], server.control or [], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("extra", "key"), [
    ({"privacy": "dpftrl"}, "privacy"),
    ({"dpsgd": True}, "dpsgd=true"),
    ({"aggregation": "median"}, "aggregation='median'"),
    ({"adaptive-clip": True}, "adaptive-clip=true"),
    ({"batched-training": "on"}, "batched-training='on'"),
    ({"proximal-mu": 0.1}, "proximal-mu=0.1"),
    # the exact secure sum's dc half is sum_i dy_i/K_i: unequal step counts would reveal single updates
    ({"privacy": "none", "secagg": True}, "secagg=true"),
    ({"privacy": "central", "secagg": True}, "secagg=true"),
])
def test_unsupported_combinations_are_refused_in_one_line_naming_the_key(extra, key) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_mapping({"scaffold": True, **extra})
    text = str(err.value)
    assert "\n" not in text and key in text and "scaffold=true" in text


def _run(tmp_path: Path, name: str, **extra) -> dict:
    base = {"num-server-rounds": 2, "seed": 5, "local-epochs": 1, "dataset": "digits", "secagg": False,
            "privacy": "central", "sample-rate": 0.5, "noise-multiplier": 1.0, "client-timeout": 30.0,
            "output-dir": str(tmp_path)}
    run_inprocess(run_config={**base, "run-name": name, **extra}, num_supernodes=6, app_dir=ROOT, node_id_seed=3)
    return json.loads((tmp_path / name / "results.json").read_text(encoding="utf-8"))


def test_a_central_scaffold_run_reports_exactly_fedavgs_privacy_and_trains_another_model(tmp_path: Path) -> None:
    fedavg = _run(tmp_path, "fedavg")
    scaffold = _run(tmp_path, "scaffold", scaffold=True)
    assert scaffold["privacy"]["epsilon"] > 0
    assert scaffold["privacy"] == fedavg["privacy"]
    assert scaffold["rounds"][-1]["test_loss"] != fedavg["rounds"][-1]["test_loss"]


def test_a_scaffold_run_without_dp_moves_the_server_control_variate(tmp_path: Path) -> None:
    out = _run(tmp_path, "plain", scaffold=True, privacy="none", **{"sample-rate": 1.0})
    assert out["privacy"]["epsilon"] is None and out["status"] == "completed"
    state = json.loads((tmp_path / "plain" / "checkpoint" / "state.json").read_text(encoding="utf-8"))
    server = ScaffoldServer(population=6)
    server.load_state_dict(state["extra"]["scaffold"])
    assert server.control is not None and any(np.any(c != 0) for c in server.control)


def test_the_clientapp_keeps_c_i_across_rounds_as_the_in_process_loop_does(tmp_path: Path) -> None:
    # the Flower ClientApp keeps c_i in its node state; fedprivacy's local exchange keeps it in a dict:
    # the same clients and seeds give the same model only if round 2 starts from round 1's c_i
    from fedprivacy.fl.client import local_exchange
    from fedprivacy.fl.run import run_federated

    extra = {"scaffold": True, "privacy": "none", "sample-rate": 1.0, "num-server-rounds": 3}
    engine = _run(tmp_path, "engine", **extra)
    cfg = RunConfig.from_mapping({"num-server-rounds": 3, "seed": 5, "local-epochs": 1, "dataset": "digits",
                                  "secagg": False, "privacy": "none", "sample-rate": 1.0, "scaffold": True,
                                  "output-dir": str(tmp_path), "run-name": "loop"})
    loop = run_federated(cfg, population=6, exchange=local_exchange(cfg, population=6), log=lambda _: None)
    assert [r["test_loss"] for r in engine["rounds"]] == [r["test_loss"] for r in loop["rounds"]]
    stateless = RunConfig.from_mapping({**cfg.to_mapping(), "run-name": "stateless"})

    def forgetful(instr, cohort, weights):  # a client that loses c_i between rounds
        return local_exchange(stateless, population=6)(instr, cohort, weights)

    lost = run_federated(stateless, population=6, exchange=forgetful, log=lambda _: None)
    assert lost["rounds"][-1]["test_loss"] != loop["rounds"][-1]["test_loss"]


def test_the_central_noise_covers_the_control_variate_half_of_the_sum() -> None:
    # the real central round on the broadcast x ++ c: the released mean's Δc coordinates carry
    # N(0, (zC)^2) / denominator like the model's; two aggregate sources differ by sqrt(2) zC / D
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.fl.client import local_exchange
    from fedprivacy.fl.modes import Transport, get_mode, plan_privacy
    from fedprivacy.fl.round_inputs import RoundInputs
    from fedprivacy.fl.task import initial_weights, test_set

    cfg = RunConfig.from_mapping({"dataset": "digits", "privacy": "central", "scaffold": True, "seed": 2,
                                  "noise-multiplier": 0.7, "clip-norm": 0.4, "local-epochs": 1})
    n = 4
    x = initial_weights(cfg, input_shape=test_set(cfg, num_partitions=n).feature_shape, num_classes=10, seed=0)
    dim = 2 * sum(w.size for w in x)
    mode = get_mode("central")
    plan = plan_privacy(cfg, population=n, dim=dim, mode=mode)
    instr = RoundInputs(cfg, population=n, root=RandomSource.seeded(2), plan=plan, mode=mode,
                        num_classes=10).instructions(1)
    arrays = ScaffoldServer(population=n).broadcast(x)
    means = []
    for source in (1, 2):
        round_fn = mode.round_fn(cfg, plan, Transport(exchange=local_exchange(cfg, population=n)))
        out = round_fn(instr, list(range(n)), arrays, RandomSource.seeded(source))
        means.append(np.concatenate([np.ravel(a) for a in out.aggregate.mean_update[len(x):]]).astype(np.float64))
    std = float(np.std(means[0] - means[1]))
    want = np.sqrt(2) * 0.7 * 0.4 / plan.denominator
    assert abs(std / want - 1) < 0.1


def test_a_run_with_another_mode_object_is_refused_before_it_starts() -> None:
    from fedprivacy.fl.client import local_exchange
    from fedprivacy.fl.modes import get_mode
    from fedprivacy.fl.run import FederatedRun

    cfg = RunConfig.from_mapping({"dataset": "digits", "privacy": "central", "scaffold": True})
    with pytest.raises(ValueError, match="scaffold=true is implemented for privacy modes"):
        FederatedRun(cfg, population=4, exchange=local_exchange(cfg, population=4), mode=get_mode("dpftrl"),
                     callbacks=[])


def _secure_run(tmp_path: Path, name: str, **extra) -> dict:
    base = {"num-server-rounds": 2, "seed": 5, "local-epochs": 1, "dataset": "digits", "secagg": True,
            "client-timeout": 30.0, "output-dir": str(tmp_path), "run-name": name}
    run_inprocess(run_config={**base, **extra}, num_supernodes=10, app_dir=ROOT, node_id_seed=3)
    return json.loads((tmp_path / name / "results.json").read_text(encoding="utf-8"))


def test_a_distributed_scaffold_run_reports_fedavgs_privacy_at_the_same_released_dimension(tmp_path: Path) -> None:
    # the discrete-Gaussian bound depends on the encoded (padded) dimension: hidden 64 gives a dy ++ dc of
    # 2 x 4810 = 9620 coordinates, hidden 128 a FedAvg update of 9610; both encode in 2^14
    dp = {"privacy": "distributed", "noise-multiplier": 1.0}
    fedavg = _secure_run(tmp_path, "fedavg", **dp, **{"hidden-units": 128})
    scaffold = _secure_run(tmp_path, "scaffold", **dp, scaffold=True, **{"hidden-units": 64})
    small = _secure_run(tmp_path, "small", **dp, **{"hidden-units": 64})
    assert scaffold["privacy"]["epsilon"] > 0
    assert scaffold["privacy"] == fedavg["privacy"]
    assert scaffold["privacy"]["epsilon"] > small["privacy"]["epsilon"]  # the longer vector is charged
    assert scaffold["rounds"][-1]["test_loss"] != small["rounds"][-1]["test_loss"]


def test_a_local_client_noises_the_dc_half_of_its_own_vector() -> None:
    # the same client and seed with and without its Gaussian: the difference is the noise, N(0, (zC)^2)
    # on every coordinate of dy ++ dc
    split = _split(30, 8)
    x = get_weights(_model())
    c = [np.full(w.shape, 0.02, dtype=np.float32) for w in x]
    released = []
    for mechanism, z in (("", 0.0), ("gaussian", 0.8)):
        instr = RoundInstructions(round=1, privacy="local", clip_norm=0.5, client_mechanism=mechanism,
                                  noise_multiplier=z, private=True, learning_rate=0.1, local_epochs=1,
                                  batch_size=4, num_classes=3, seed=11, scaffold=True)
        update = client_update(partition_id=1, weights=[*x, *c], instructions=instr,
                               train=_trainer(split, instr, []), control=ClientControl())
        released.append(np.concatenate([np.ravel(a) for a in update.delta[len(x):]]).astype(np.float64))
    noise = released[1] - released[0]
    assert abs(float(np.std(noise)) / (0.8 * 0.5) - 1) < 0.15 and abs(float(np.mean(noise))) < 0.1


def test_a_local_scaffold_run_reports_exactly_fedavgs_privacy(tmp_path: Path) -> None:
    local = {"privacy": "local", "noise-multiplier": 2.0}
    fedavg = _run(tmp_path, "fedavg", **local)
    scaffold = _run(tmp_path, "scaffold", scaffold=True, **local)
    assert scaffold["privacy"]["epsilon"] > 0
    assert scaffold["privacy"] == fedavg["privacy"]
    assert scaffold["rounds"][-1]["test_loss"] != fedavg["rounds"][-1]["test_loss"]


def test_a_resumed_scaffold_run_continues_from_the_checkpointed_control_variate(tmp_path: Path) -> None:
    from fedprivacy.fl.client import local_exchange
    from fedprivacy.fl.run import FederatedRun, resolve_run_dir, run_federated

    keys = {"dataset": "digits", "privacy": "central", "secagg": False, "scaffold": True, "seed": 3,
            "sample-rate": 0.5, "local-epochs": 1, "output-dir": str(tmp_path), "run-name": "r"}
    first = RunConfig.from_mapping({**keys, "num-server-rounds": 2})
    run_federated(first, population=6, exchange=local_exchange(first, population=6), log=lambda _: None)
    state = json.loads((tmp_path / "r" / "checkpoint" / "state.json").read_text(encoding="utf-8"))
    saved = ScaffoldServer(population=6)
    saved.load_state_dict(state["extra"]["scaffold"])
    again = RunConfig.from_mapping({**keys, "num-server-rounds": 3, "resume": True})
    run = FederatedRun(again, population=6, exchange=local_exchange(again, population=6), log=lambda _: None,
                       run_dir=resolve_run_dir(again))
    run.start()
    assert run.scaffold is not None and run.next_round == 3
    for a, b in zip(run.scaffold.control or [], saved.control or [], strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(np.any(c != 0) for c in saved.control or [])
    assert run.run().status.value == "completed"


def test_a_control_variate_beyond_float32s_range_keeps_the_old_one() -> None:
    """A c_i+ finite in float64 but not in float32 would poison every later round's correction."""
    from fedprivacy.fl.client import _scaffold_delta
    from fedprivacy.fl.scaffold import ClientControl
    from fedprivacy.fl.task import LocalResult
    from fedprivacy.fl.types import RoundInstructions

    # Arrange: one step of lr 1e-39 moves y by 1, so (x - y)/(K lr) = -1e39 (float32's max is 3.4e38)
    x, c = [np.zeros(3, np.float32)], [np.zeros(3, np.float32)]
    old = (np.full(3, 0.25, np.float32),)
    control = ClientControl(value=old)

    def train(weights: list[np.ndarray], seed: int, *, correction: list[np.ndarray]) -> LocalResult:
        return LocalResult(weights=[w + 1.0 for w in weights], num_examples=1, loss=0.0, dpsgd_steps=None,
                           dpsgd_sample_rate=None, steps=1)

    instr = RoundInstructions(round=1, privacy="none", clip_norm=1.0, client_mechanism="", noise_multiplier=0.0,
                              private=False, learning_rate=1e-39, local_epochs=1, batch_size=1, num_classes=2,
                              seed=0)
    # Act
    joint, _ = _scaffold_delta([*x, *c], train, 0, instr, control)
    # Assert: the release is the float64 step (clipped later); the kept c_i is the old, finite one
    assert np.all(np.isfinite(np.concatenate(joint)))
    assert control.value is old
