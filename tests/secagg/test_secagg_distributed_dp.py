"""Distributed discrete Gaussian: encoding, end-to-end with SecAgg+, and its accounting."""

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from fedprivacy.accounting.accountant import Accountant
from fedprivacy.accounting.events import DiscreteGaussianEvent
from fedprivacy.accounting.kls import (
    distributed_round,
    round_event,
    rounded_l2_norm_bound,
    sum_divergence_tau,
    zcdp_epsilon,
)
from fedprivacy.dp.rng import RandomSource
from fedprivacy.secagg.ddp import DistributedDPConfig, decode_sum, encode_update
from fedprivacy.secagg.local import run_round
from fedprivacy.secagg.messages import RoundAborted, SetupRequest


def test_tau_closed_form() -> None:
    assert sum_divergence_tau(local_sigma=3.0, num_clients=1) == 0.0
    # n = 2, sigma_c = 1/2: 10 exp(-2 pi^2 / 4 * 1/2)
    assert math.isclose(sum_divergence_tau(local_sigma=0.5, num_clients=2),
                        10 * math.exp(-(math.pi**2) / 4), rel_tol=1e-12)
    assert sum_divergence_tau(local_sigma=2.0, num_clients=1000) < 1e-12


def test_round_rho_tends_to_the_gaussian_value_and_is_never_below_it() -> None:
    r = distributed_round(clip_norm=1.0, scale=1000.0, dim=1024, beta=0.0, local_sigma=100.0,
                          num_survivors=10)
    gauss = DiscreteGaussianEvent(sigma=math.sqrt(10) * 100.0, l2_sensitivity=r.l2_sensitivity).rho
    assert r.rho >= gauss
    assert math.isclose(r.rho, gauss, rel_tol=1e-9)
    small = distributed_round(clip_norm=1.0, scale=2.0, dim=1024, beta=0.0, local_sigma=0.4,
                              num_survivors=10)
    assert small.rho > DiscreteGaussianEvent(sigma=math.sqrt(10) * 0.4,
                                             l2_sensitivity=small.l2_sensitivity).rho
    replace = distributed_round(clip_norm=1.0, scale=1000.0, dim=1024, beta=0.0, local_sigma=100.0,
                                num_survivors=10, neighbouring="replace-one")
    assert math.isclose(replace.rho, 4 * r.rho, rel_tol=1e-9)


def test_fewer_survivors_cost_more_privacy() -> None:
    kw = dict(clip_norm=1.0, scale=1000.0, dim=1024, beta=math.exp(-0.5), local_sigma=300.0)
    rhos = [distributed_round(num_survivors=n, **kw).rho for n in (5, 10, 50)]
    assert rhos[0] > rhos[1] > rhos[2]


def test_zcdp_conversion_matches_dp_accounting() -> None:
    for rho in (0.01, 0.5, 3.0):
        acc = rdp_lib.RdpAccountant()
        acc.compose(dp_event.ZCDpEvent(rho=rho, xi=0.0))
        ref = acc.get_epsilon(1e-5)
        ours = zcdp_epsilon(rho=rho, delta=1e-5)
        assert ours <= ref + 1e-9
        assert ours >= 0.98 * ref
        assert ours <= rho + 2 * math.sqrt(rho * math.log(1e5))  # Bun & Steinke 2016, Prop. 1.3


def test_events_compose_in_the_rdp_accountant_and_aborted_rounds_spend_nothing() -> None:
    r = distributed_round(clip_norm=1.0, scale=1000.0, dim=1024, beta=0.0, local_sigma=800.0,
                          num_survivors=20)
    acc = Accountant(backend="rdp")
    acc.spend(round_event(r), round=1)
    assert round_event(None) is None  # an aborted round has no event
    acc.spend(round_event(r), round=3)
    assert len(acc.ledger) == 2
    ref = rdp_lib.RdpAccountant()
    ref.compose(dp_event.ZCDpEvent(rho=2 * r.rho, xi=0.0))
    assert math.isclose(acc.epsilon(delta=1e-5), ref.get_epsilon(1e-5), rel_tol=1e-6)
    assert not Accountant(backend="pld").supports(round_event(r))


def test_conditional_rounding_respects_the_norm_bound() -> None:
    rng = RandomSource.seeded(5)
    cfg = DistributedDPConfig(dim=300, clip_norm=1.0, noise_multiplier=1e-3, min_survivors=1,
                              scale=50.0, max_clients=1)
    assert cfg.norm_bound == rounded_l2_norm_bound(l2_norm=50.0, dim=512, beta=math.exp(-0.5))
    x = rng.uniform(size=300) - 0.5
    from fedprivacy.secagg.rotation import rotate

    r = rotate(x / np.linalg.norm(x) * 50.0, seed=b"r" * 32)
    from fedprivacy.secagg.quantize import stochastic_round

    norms = [np.linalg.norm(stochastic_round(r, rng=rng)) for _ in range(200)]
    assert np.mean(np.array(norms) > cfg.norm_bound) <= math.exp(-0.5)  # each try fails w.p. <= beta


def test_headroom_refuses_a_scale_that_could_wrap() -> None:
    with pytest.raises(ValueError, match="could wrap mod 2\\^16"):
        DistributedDPConfig(dim=1000, clip_norm=1.0, noise_multiplier=1.0, min_survivors=5,
                            scale=4000.0, modulus_bits=16, max_clients=10)


def test_end_to_end_noisy_sum_with_dropout() -> None:
    n, dim, bits = 8, 500, 32
    cfg = DistributedDPConfig(dim=dim, clip_norm=1.0, noise_multiplier=0.5, min_survivors=5,
                              scale=2.0**14, modulus_bits=bits, max_clients=n)
    data = RandomSource.seeded(11)
    updates = {i: (data.uniform(size=dim) - 0.5) * (0.05 if i % 2 else 1.0) for i in range(1, n + 1)}
    rotation_seed = b"\x07" * 32
    rng = RandomSource.seeded(12)
    encoded = {i: encode_update(u, config=cfg, rotation_seed=rotation_seed, rng=rng.child(i))
               for i, u in updates.items()}
    setup = SetupRequest(round=1, threshold=5, degree=n - 1, modulus_bits=bits, dim=cfg.padded_dim)
    total, server, _ = run_round(setup, encoded, drop_before={3: "masked"})
    noisy = decode_sum(total, config=cfg, rotation_seed=rotation_seed)

    def clip(u):
        nrm = np.linalg.norm(u)
        return u * min(1.0, 1.0 / nrm)

    plain = sum(clip(updates[i]) for i in server.u3)
    err = noisy - plain
    # noise of 7 survivors, each with std z*C/sqrt(t_min), plus rounding (var <= 1/4 per client)
    expected_std = math.sqrt(7 * (cfg.local_sigma**2 + 0.25)) / cfg.scale
    assert 0.8 < float(np.std(err)) / expected_std < 1.2
    assert abs(float(np.mean(err))) < 4 * expected_std / math.sqrt(dim)
    priv = cfg.privacy(num_survivors=len(server.u3))
    assert priv.num_noisy_clients == 7
    assert priv.total_sigma**2 >= (cfg.noise_multiplier * cfg.clip_norm * cfg.scale) ** 2


def test_round_below_min_survivors_aborts_without_any_release() -> None:
    n, dim = 6, 64
    cfg = DistributedDPConfig(dim=dim, clip_norm=1.0, noise_multiplier=1.0, min_survivors=4,
                              scale=2.0**10, max_clients=n)
    rng = RandomSource.seeded(1)
    enc = {i: encode_update(np.ones(dim), config=cfg, rotation_seed=b"s" * 32, rng=rng.child(i))
           for i in range(n)}
    setup = SetupRequest(round=1, threshold=4, degree=n - 1, dim=cfg.padded_dim, min_survivors=4)
    with pytest.raises(RoundAborted):
        run_round(setup, enc, drop_before={0: "masked", 1: "masked", 2: "masked"})
