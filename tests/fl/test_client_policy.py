"""The client's own floor: a server request outside it is refused, whatever
the server sends; the policy comes from node_config keys with safe defaults in code."""

import dataclasses
import math

import numpy as np
import pytest

from fedprivacy.fl.client_policy import NODE_CONFIG_KEYS, ClientPolicy, PolicyRefusal
from fedprivacy.fl.mechanisms import GAUSSIAN
from fedprivacy.secagg.ddp import DistributedDPConfig
from fedprivacy.secagg.messages import SetupRequest


def _encoding(**kw) -> DistributedDPConfig:
    base = dict(dim=1000, clip_norm=1.0, noise_multiplier=1.0, min_survivors=6, scale=2.0**10,
                modulus_bits=32, max_clients=40, xnoise=True)
    return DistributedDPConfig(**{**base, **kw})


def _setup(cfg: DistributedDPConfig, **kw) -> SetupRequest:
    return SetupRequest(**{**dict(round=1, threshold=6, degree=9, dim=cfg.padded_dim, modulus_bits=32,
                                  active=True), **kw})


def test_defaults_refuse_modes_where_the_server_sees_raw_updates_and_the_seeded_mode() -> None:
    policy = ClientPolicy()
    for mode in ("none", "central"):
        with pytest.raises(PolicyRefusal, match="client-privacy-modes"):
            policy.check_mode(mode)
    with pytest.raises(PolicyRefusal, match="client-allow-seeded"):
        policy.seed(0)  # item 2: a server-sent seed would let it regenerate the noise
    assert policy.seed(-1) == -1
    assert ClientPolicy(allow_seeded=True).seed(7) == 7
    assert policy.disclosed({"train-loss": 0.3, "num-examples": 12.0}) == {}  # item 4


def test_local_mode_adds_the_clients_own_noise_whatever_the_server_asks() -> None:
    policy = ClientPolicy(min_noise_multiplier=0.8, max_rho_per_round=4.0)
    # item 4: the server sends std 1e-12; the client uses its own floor z = 0.8
    assert policy.client_noise_multiplier(GAUSSIAN, clip_norm=1.0, requested=1e-12) == 0.8
    assert policy.client_noise_multiplier(GAUSSIAN, clip_norm=2.0, requested=2.0) == 2.0  # more is fine
    # rho = 2 / z^2 (sensitivity 2C): a cap of 2 needs z >= 1, so the client adds that much itself
    assert ClientPolicy(min_noise_multiplier=0.8, max_rho_per_round=2.0).client_noise_multiplier(
        GAUSSIAN, clip_norm=1.0, requested=0.0) == 1.0


def test_distributed_rho_is_computed_from_the_complete_encoding() -> None:
    policy = ClientPolicy()
    cfg = _encoding()
    rho = policy.check_distributed(cfg, setup=_setup(cfg), roster=10)
    z = cfg.worst_release(max_roster=10).noise_multiplier  # the server's ledger charges the same release
    assert math.isclose(rho, 1 / (2 * z * z), rel_tol=1e-12)
    assert math.isclose(ClientPolicy(neighbouring="replace-one", max_rho_per_round=10).check_distributed(
        cfg, setup=_setup(cfg), roster=10), 4 * rho, rel_tol=1e-12)


@pytest.mark.parametrize("tamper", [
    {"scale": 4.0},  # item 3: the server shrinks the fixed-point scale: rounding dominates
    {"scale": 0.25},  # so small the round cannot even be accounted
    {"noise_multiplier": 0.3},
    {"colluders": 0},  # fewer colluders than the client assumes (policy below has c = 1)
])
def test_tampered_encodings_are_refused(tamper) -> None:
    policy = ClientPolicy(colluders=1)
    good = _encoding(colluders=1)
    setup = _setup(good, colluders=1)
    policy.check_distributed(good, setup=setup, roster=10)
    try:
        bad = dataclasses.replace(good, **tamper)
    except ValueError:  # refused by the encoding's own checks already
        return
    with pytest.raises(PolicyRefusal):
        policy.check_distributed(bad, setup=_setup(bad, colluders=1), roster=10)


def test_the_legacy_share_is_refused() -> None:
    # the legacy σ²/t share draws from the float64 rejection sampler, whose deviation the claim
    # cannot bound: a server that asks for it (xnoise=false) is refused, whatever its noise
    legacy = _encoding(xnoise=False, noise_multiplier=5.0)
    with pytest.raises(PolicyRefusal, match="legacy noise share"):
        ClientPolicy().check_distributed(legacy, setup=_setup(legacy), roster=10)


def test_secagg_setup_must_meet_the_schedule_and_colluders_floor() -> None:
    cfg = _encoding()
    with pytest.raises(PolicyRefusal, match="semi-honest"):
        ClientPolicy().check_distributed(cfg, setup=_setup(cfg, active=False), roster=10)
    ClientPolicy(schedule="semi-honest").check_distributed(cfg, setup=_setup(cfg, active=False), roster=10)
    with pytest.raises(PolicyRefusal, match="colluding"):
        ClientPolicy(colluders=2).check_secagg(_setup(cfg, colluders=1))
    with pytest.raises(PolicyRefusal, match="releases sums of"):
        ClientPolicy().check_distributed(cfg, setup=_setup(cfg, threshold=5, degree=8), roster=10)


def test_node_config_round_trip_and_typo_refusal() -> None:
    policy = ClientPolicy(modes=("distributed",), min_noise_multiplier=1.2, max_rho_per_round=0.5,
                          neighbouring="replace-one", colluders=2, schedule="semi-honest",
                          allow_seeded=True, disclose=("num-examples",))
    nc = policy.to_node_config()
    assert set(nc) == set(NODE_CONFIG_KEYS)
    assert ClientPolicy.from_node_config({**nc, "partition-id": 3}) == policy
    # the string form flower-supernode --node-config gives
    as_str = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in nc.items()}
    assert ClientPolicy.from_node_config(as_str) == policy
    with pytest.raises(ValueError, match="unknown client policy key"):
        ClientPolicy.from_node_config({"client-min-noise-multipler": 2.0})
    # a typo names no mode: that client takes part in none of that name (safe), and says so on refusal
    typo = ClientPolicy.from_node_config({"client-privacy-modes": "distributed,centrel"})
    with pytest.raises(PolicyRefusal, match="takes part only in"):
        typo.check_mode("central")
    assert ClientPolicy.from_node_config({}) == ClientPolicy()


def test_policy_resolution_order_node_config_over_environment_over_defaults() -> None:
    import json

    from fedprivacy.fl.client_policy import ENV_VAR

    env = {ENV_VAR: json.dumps({"client-min-noise-multiplier": 1.5, "client-secagg-colluders": 1})}
    got = ClientPolicy.resolve({"partition-id": 0, "client-secagg-colluders": 2}, env)
    assert (got.min_noise_multiplier, got.colluders, got.modes) == (1.5, 2, ClientPolicy().modes)
    assert ClientPolicy.resolve({}, {}) == ClientPolicy()
    with pytest.raises(ValueError, match=ENV_VAR):
        ClientPolicy.resolve({}, {ENV_VAR: "not json"})


def test_simulation_policy_is_what_the_user_asked_for() -> None:
    from fedprivacy.config import RunConfig

    cfg = RunConfig(privacy="distributed", secagg=True, accountant="rdp", noise_multiplier=1.2, seed=3)
    p = ClientPolicy.for_simulation(cfg)
    assert p.modes == ("distributed",) and p.min_noise_multiplier == 1.2 and p.allow_seeded
    assert p.disclose == () and p.max_rho_per_round == math.inf
    assert ClientPolicy.for_simulation(RunConfig(privacy="central")).disclose  # the server is trusted
    # SecAgg is run against the server: nothing goes beside the masked vector, even without DP
    assert ClientPolicy.for_simulation(RunConfig(privacy="none", secagg=True)).disclose == ()
    # the round trip through the launcher's environment variable keeps it
    import json

    from fedprivacy.fl.client_policy import ENV_VAR

    env = {ENV_VAR: json.dumps(p.to_node_config())}
    assert ClientPolicy.resolve({}, env) == p


def test_a_client_whose_exp_is_off_refuses_before_sharing(monkeypatch: pytest.MonkeyPatch) -> None:
    # review F7: the client checks its own platform's exp at the share stage, before any secret leaves
    from fedprivacy.dp import tabulated

    cfg = _encoding()
    real_exp = np.exp
    monkeypatch.setattr(tabulated.np, "exp", lambda x: real_exp(x) * (1.0 + 2.0**-40))
    tabulated.check_exp_accuracy.cache_clear()
    try:
        with pytest.raises(PolicyRefusal, match="exp"):
            ClientPolicy().check_distributed(cfg, setup=_setup(cfg), roster=10)
    finally:
        monkeypatch.undo()
        tabulated.check_exp_accuracy.cache_clear()
    ClientPolicy().check_distributed(cfg, setup=_setup(cfg), roster=10)


@pytest.mark.parametrize("dim, roster, survivors, scale", [(1000, 10, 6, 2.0**10), (100_000, 15, 8, 2.0**8),
                                                           (28_938, 60, 40, 2.0**6)])
def test_the_charged_release_dominates_every_sum_the_server_can_finish_the_round_with(
        dim: int, roster: int, survivors: int, scale: float) -> None:
    # Arrange: the server picks the survivor set after the client has charged the round, so the
    # client's rho and its discrete slack must bound the release for every survivor count it may choose
    cfg = _encoding(dim=dim, min_survivors=survivors, scale=scale, max_clients=max(40, roster))
    # Act
    charged = ClientPolicy.distributed_release(cfg, roster=roster)
    # Assert: no less noise and no smaller slack than any completed round of this roster (or a smaller one)
    for r in range(survivors, roster + 1):
        for s in range(survivors, r + 1):
            real = cfg.release(roster=r, survivors=s)
            assert charged.noise_multiplier <= real.noise_multiplier
            assert charged.eta + charged.sampler_ratio >= real.eta + real.sampler_ratio
            assert charged.sampler_tv >= real.sampler_tv
    assert charged.eta + charged.sampler_ratio > 0 and charged.sampler_tv > 0  # there is a slack to charge


def test_the_secure_round_cost_carries_the_slack_of_the_release_it_charges() -> None:
    # Arrange: the encoding a server sends for a distributed round (the real one of a 10-client run)
    from clients.budget_log import secagg_cost
    from fedprivacy.config import RunConfig
    from fedprivacy.fl.secure.params import make_encoding

    cfg = RunConfig(privacy="distributed", secagg=True, noise_multiplier=1.0, target_delta=1e-4)
    spec = make_encoding(cfg, population=10, dim=2410, threshold=6)
    ddp = spec.ddp()
    # Act
    setup = _setup(ddp, modulus_bits=ddp.modulus_bits)
    rho, (slack, tv) = secagg_cost(ClientPolicy(), spec, setup, roster=10)
    # Assert: the rho the floor checks, and the slack of the same (worst) release, both nonzero
    rel = ddp.worst_release(max_roster=10)
    assert rho == ClientPolicy().check_distributed(ddp, setup=setup, roster=10) == 1 / (2 * rel.noise_multiplier**2)
    assert (slack, tv) == (rel.eta + rel.sampler_ratio, rel.sampler_tv) and slack > 0 and tv > 0


def _secure_cost(policy: ClientPolicy, dim: int, clip: float, scale: float, z: float, roster: int, t: int):
    """What the share stage runs on an encoding the server chose (every field is the server's)."""
    from clients.budget_log import secagg_cost
    from fedprivacy.secagg.encoding import EncodingSpec

    enc = EncodingSpec(kind="ddgauss", dim=dim, clip_norm=clip, scale=scale, modulus_bits=32, max_clients=roster,
                       noise_multiplier=z, min_survivors=t, rotation_seed=b"\x01" * 32, xnoise=True)
    setup = SetupRequest(round=1, threshold=t, degree=roster - 1, modulus_bits=32, dim=enc.padded_dim,
                         min_survivors=t, active=True)
    policy.check_secagg(setup)
    return secagg_cost(policy, enc, setup, roster=roster)


def test_an_encoding_whose_discrete_slack_is_not_negligible_is_refused_before_any_secret_leaves() -> None:
    # Arrange: C x scale tiny under a large roster: the XNoise components fall below the smoothing
    # variance, so the domination lemma's slack is ~6.6 per round while rho stays under the per-round cap
    deviating = (1000, 0.01, 1024.0, 1.0, 100, 51)
    digits_size = (650, 1.0, 8.0, 1.3, 100, 51)
    honest = (2**20, 1.0, 2.0**10, 1.0, 10, 6)  # the README's 10^6 coordinates: slack ~4e-7
    # Act / Assert: refused by the default floor, naming the key; the honest encoding passes with its slack
    for server in (deviating, digits_size):
        with pytest.raises(PolicyRefusal, match="client-max-slack-per-round"):
            _secure_cost(ClientPolicy(), *server)
    rho, (slack, tv) = _secure_cost(ClientPolicy(), *honest)
    assert rho < 2.0 and 1e-7 < slack < 1e-6 and 0 < tv < 1e-64
    # an operator may lift the per-round cap; the total's cap then still bounds the sum (test_client_budget.py)
    lifted = ClientPolicy(max_slack_per_round=10.0)
    assert _secure_cost(lifted, *deviating)[1][0] > 1.0


_ALL_METRICS = ("num-examples", "train-loss", "dpsgd-steps", "dpsgd-sample-rate")


@pytest.mark.parametrize("disclose", [(), ("num-examples",), ("train-loss", "dpsgd-steps"), _ALL_METRICS])
@pytest.mark.parametrize("fields", [
    dict(num_examples=None, train_loss=None, metrics={}),
    dict(num_examples=12, train_loss=0.4, metrics={}),
    dict(num_examples=12, train_loss=None, metrics={"dpsgd_steps": 3.0, "dpsgd_sample_rate": 0.1}),
])
def test_filter_update_keeps_exactly_the_disclosed_metadata(disclose, fields) -> None:
    from fedprivacy.fl.types import ClientUpdate

    update = ClientUpdate(partition_id=2, delta=(np.ones(3, np.float32),), **fields)
    out = ClientPolicy(modes=("none",), disclose=disclose).filter_update(update)
    assert out.delta is update.delta and out.partition_id == 2
    assert out.num_examples == (fields["num_examples"] if "num-examples" in disclose else None)
    assert out.train_loss == (fields["train_loss"] if "train-loss" in disclose else None)
    assert out.metrics == {k: v for k, v in fields["metrics"].items() if k.replace("_", "-") in disclose}


@pytest.mark.parametrize("privacy, seed, allow_seeded", [
    ("none", 3, True), ("none", -1, False), ("none", -7, False), ("central", 5, True), ("local", 2, True),
    ("local", -1, False)])
def test_apply_returns_the_instructions_with_only_the_floor_applied(privacy, seed, allow_seeded) -> None:
    from fedprivacy.fl.types import RoundInstructions

    instr = RoundInstructions(round=4, privacy=privacy, clip_norm=1.0,
                              client_mechanism="gaussian" if privacy == "local" else "",
                             noise_multiplier=0.5 if privacy == "local" else 0.0, private=privacy != "none",
                             learning_rate=0.1,
                              local_epochs=1, batch_size=8, num_classes=3, seed=seed)
    policy = ClientPolicy(modes=(privacy,), allow_seeded=allow_seeded, min_noise_multiplier=2.0)
    out = policy.apply(instr)
    want = {"seed": seed if seed >= 0 else -1}
    if privacy == "local":
        want["noise_multiplier"] = 2.0  # the client's floor z = 2 on C = 1, above the 0.5 asked
    assert out == dataclasses.replace(instr, **want)
