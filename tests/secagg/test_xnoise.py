"""XNoise on the real encoder and a real SecAgg+ round: the released noise is the target under dropout."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

from fedprivacy.accounting.xnoise_design import XNoiseDesign
from fedprivacy.dp.rng import RandomSource
from fedprivacy.secagg.ddp import DistributedDPConfig, decode_sum, encode_update
from fedprivacy.secagg.local import run_round
from fedprivacy.secagg.messages import SetupRequest
from fedprivacy.secagg.xnoise import (
    ComponentSeeds,
    component_noise,
    excess_noise,
    removable_components,
    remove_excess,
)

SEED = bytes(range(32))


def test_component_expansion_known_answer() -> None:
    """Pinned: the server regenerates these vectors, so the expansion must never drift silently."""
    small = component_noise(SEED, variance=1e4, size=8, round=3, node_id=5, index=2)
    assert small.tolist() == [78, -104, 72, 94, -20, -107, -2, 140]
    big = component_noise(SEED, variance=2.5e5, size=1 << 16, round=1, node_id=0, index=1)
    assert hashlib.sha256(big.astype("<i8").tobytes()).hexdigest() == (
        "7f8737c5bf42d8d83fcec158dc0a1ea1ec4944826cf3d4b1275b9abdc9286022")
    assert abs(float(np.std(big)) / 500.0 - 1) < 0.01


def test_components_are_bound_to_round_node_and_index() -> None:
    base = component_noise(SEED, variance=100.0, size=64, round=1, node_id=2, index=1)
    for kw in (dict(round=2, node_id=2, index=1), dict(round=1, node_id=3, index=1),
               dict(round=1, node_id=2, index=2)):
        assert not np.array_equal(base, component_noise(SEED, variance=100.0, size=64, **kw))
    with pytest.raises(ValueError, match="seed"):
        component_noise(b"short", variance=1.0, size=4, round=1, node_id=1, index=1)


def _run(*, n: int, t: int, dropped: int, xnoise: bool, dim: int = 1 << 15, seed: int = 0,
         bits: int = 32) -> float:
    """Released-sum noise std / target, measured from outside: decoded sum minus the clipped sum."""
    cfg = DistributedDPConfig(dim=dim, clip_norm=1.0, noise_multiplier=1.0, min_survivors=t,
                              scale=2.0**10, modulus_bits=bits, max_clients=n, xnoise=xnoise)
    data = RandomSource.seeded(100 + seed)
    updates = {i: (data.uniform(size=dim) - 0.5) * 0.02 for i in range(n)}
    rot = data.random_bytes(32)
    rng = RandomSource.seeded(200 + seed)
    comps = {i: ComponentSeeds.fresh(cfg.design(roster=n), round=1, node_id=i, rng=rng.child("s", i))
             for i in range(n)} if xnoise else {}
    enc = {i: encode_update(u, config=cfg, rotation_seed=rot, rng=rng.child(i),
                            components=comps.get(i)) for i, u in updates.items()}
    setup = SetupRequest(round=1, threshold=t, degree=n - 1, modulus_bits=bits, dim=cfg.padded_dim)
    drop = {i: "masked" for i in range(dropped)}  # vanish before the masked upload
    total, server, _ = run_round(setup, enc, drop_before=drop)
    survivors = sorted(server.u3)
    assert len(survivors) == n - dropped
    if xnoise:  # what the protocol reveals after the consistency check (secagg wires the shares)
        want = removable_components(cfg.design(roster=n), survivors)
        revealed = {i: comps[i].reveal(survivors=len(survivors), rank=r)
                    for r, i in enumerate(survivors)}
        assert {i: tuple(sorted(v)) for i, v in revealed.items()} == want
        excess = excess_noise(cfg.design(roster=n), revealed, survivors=survivors, round=1,
                              size=cfg.padded_dim)
        total = remove_excess(total, excess, modulus_bits=bits)
    noisy = decode_sum(total, config=cfg, rotation_seed=rot)
    clipped = sum(updates[i] * min(1.0, 1.0 / float(np.linalg.norm(updates[i]))) for i in survivors)
    return float(np.std(noisy - clipped)) / (cfg.noise_multiplier * cfg.clip_norm)


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.3])
def test_released_noise_is_the_target_at_0_10_30_percent_dropout(rate: float) -> None:
    n, t = 20, 12
    ratio = _run(n=n, t=t, dropped=int(round(rate * n)), xnoise=True)
    assert abs(ratio - 1) < 0.02, ratio  # estimate's own sd: 1/sqrt(2*32768) = 0.4%


def test_the_legacy_share_inflates_the_noise_by_sqrt_n_over_t() -> None:
    ratio = _run(n=20, t=12, dropped=0, xnoise=False)
    assert abs(ratio / math.sqrt(20 / 12) - 1) < 0.02


def test_sixteen_bits_fit_with_xnoise_but_not_with_the_legacy_share() -> None:
    kw = dict(dim=1 << 15, clip_norm=1.0, noise_multiplier=1.0, min_survivors=12, scale=3000.0,
              modulus_bits=16, max_clients=20)
    DistributedDPConfig(xnoise=True, **kw)
    with pytest.raises(ValueError, match="could wrap"):
        DistributedDPConfig(xnoise=False, **kw)
    assert _run(n=20, t=12, dropped=6, xnoise=True, bits=16, dim=1 << 14) == pytest.approx(1, abs=0.03)


def test_server_removal_refuses_missing_or_extra_seeds() -> None:
    design = XNoiseDesign(total_variance=1e6, roster=10, min_survivors=6)
    rng = RandomSource.seeded(3)
    comps = {i: ComponentSeeds.fresh(design, round=1, node_id=i, rng=rng) for i in range(10)}
    survivors = list(range(9))
    revealed = {i: comps[i].reveal(survivors=9, rank=r) for r, i in enumerate(survivors)}
    excess_noise(design, revealed, survivors=survivors, round=1, size=4)
    with pytest.raises(ValueError, match="cover exactly"):
        excess_noise(design, {i: revealed[i] for i in range(8)}, survivors=survivors, round=1, size=4)
    kept = {**revealed, 0: {1: comps[0].seeds[0], **revealed[0]}}
    if set(kept[0]) != set(revealed[0]):  # rank 0 keeps component 1 at s=9: asking for it is refused
        with pytest.raises(ValueError, match="removable"):
            excess_noise(design, kept, survivors=survivors, round=1, size=4)
    assert "hidden" in repr(comps[0]) and comps[0].seeds[0].hex() not in repr(comps[0])


def test_encoder_refuses_components_of_another_design() -> None:
    cfg = DistributedDPConfig(dim=64, clip_norm=1.0, noise_multiplier=1.0, min_survivors=4,
                              scale=2.0**8, max_clients=8, xnoise=True)
    other = XNoiseDesign(total_variance=1.0, roster=8, min_survivors=4)
    comps = ComponentSeeds.fresh(other, round=1, node_id=0, rng=RandomSource.seeded(1))
    with pytest.raises(ValueError, match="another noise design"):
        encode_update(np.zeros(64), config=cfg, rotation_seed=SEED, rng=RandomSource.seeded(2),
                      components=comps)
    with pytest.raises(ValueError, match="components are required"):
        encode_update(np.zeros(64), config=cfg, rotation_seed=SEED, rng=RandomSource.seeded(2))


def test_the_public_encoding_carries_xnoise_and_colluders_through_its_record() -> None:
    from fedprivacy.secagg.encoding import EncodingSpec, largest_scale_encoding

    enc = largest_scale_encoding(kind="ddgauss", dim=500, clip_norm=1.0, modulus_bits=16,
                                 population=10, noise_multiplier=1.0, threshold=6,
                                 rotation_seed=SEED, xnoise=True)
    legacy = largest_scale_encoding(kind="ddgauss", dim=500, clip_norm=1.0, modulus_bits=16,
                                    population=10, noise_multiplier=1.0, threshold=6,
                                    rotation_seed=SEED)
    assert enc.ddp().xnoise and not legacy.ddp().xnoise
    assert enc.scale >= legacy.scale  # the headroom counts only the released noise
    assert EncodingSpec.from_record(enc.to_record()) == enc
    comps = ComponentSeeds.fresh(enc.ddp().design(roster=10), round=1, node_id=0,
                                 rng=RandomSource.seeded(0))
    assert enc.encode(np.zeros(500), rng=RandomSource.seeded(1), components=comps).dtype == np.uint32


def _excess_node_by_node(design, revealed, *, survivors, round, size):  # type: ignore[no-untyped-def]
    """The server's removal before the component-by-component order (reference)."""
    want = removable_components(design, survivors)
    if set(revealed) != set(want):
        raise ValueError(f"revealed seeds must cover exactly the survivors {sorted(want)}, "
                         f"got {sorted(revealed)}")
    total = np.zeros(size, dtype=np.int64)
    var = design.variances
    for node, idx in want.items():
        got = revealed[node]
        if set(got) != set(idx):
            raise ValueError(f"node {node}: revealed components {sorted(got)} != removable {list(idx)}")
        for j in idx:
            total += component_noise(got[j], variance=var[j], size=size, round=round, node_id=node, index=j)
    return total


@pytest.mark.parametrize("roster,t,c,s", [(10, 6, 0, 9), (12, 5, 0, 7), (9, 6, 1, 8), (20, 12, 0, 20)])
def test_component_by_component_removal_is_the_node_by_node_sum_and_refuses_alike(roster, t, c, s) -> None:
    """The fast path reorders the server's regeneration (each variance's table stays in cache); the sum
    of integers is the same, and a malformed revealed set (bad seed length, missing or extra index,
    a node id out of range) is refused with the error the node-by-node expansion raises first."""
    design = XNoiseDesign(total_variance=4e6, roster=roster, min_survivors=t, colluders=c)
    rng = RandomSource.seeded(7)
    comps = {i: ComponentSeeds.fresh(design, round=2, node_id=i, rng=rng) for i in range(roster)}
    survivors = list(range(s))
    revealed = {i: comps[i].reveal(survivors=s, rank=r) for r, i in enumerate(survivors)}
    got = excess_noise(design, revealed, survivors=survivors, round=2, size=300)
    assert np.array_equal(got, _excess_node_by_node(design, revealed, survivors=survivors, round=2, size=300))
    faulty = [n for n in survivors if revealed[n]]
    bad = []
    if faulty:
        a, b = faulty[0], faulty[-1]
        ja, jb = max(revealed[a]), min(revealed[b])  # a node-major and a component-major order meet them in turn
        bad.append({**revealed, b: {**revealed[b], jb: b"short"}})
        bad.append({**revealed, a: {**revealed[a], ja: b"x" * 31}, b: {**revealed[b], jb: b"y" * 33}})
        bad.append({**revealed, b: {**revealed[b], jb: b"z" * 40}, a: {k: v for k, v in revealed[a].items() if k != ja}})
    bad.append({**revealed, survivors[-1]: {**revealed[survivors[-1]], 99: b"\0" * 32}})
    for rev in bad:
        with pytest.raises(ValueError) as want:
            _excess_node_by_node(design, rev, survivors=survivors, round=2, size=8)
        with pytest.raises(ValueError) as ours:
            excess_noise(design, rev, survivors=survivors, round=2, size=8)
        assert str(ours.value) == str(want.value)
    for kw in ({"round": -1}, {"round": 2**64}):
        if faulty:
            with pytest.raises(ValueError) as want:
                _excess_node_by_node(design, revealed, survivors=survivors, size=8, **kw)
            with pytest.raises(ValueError) as ours:
                excess_noise(design, revealed, survivors=survivors, size=8, **kw)
            assert str(ours.value) == str(want.value)
