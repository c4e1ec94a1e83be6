"""Adaptive clipping in distributed mode: the clipped-count bit inside secure aggregation.

The bit is one extra integer coordinate ``k_b (2b - 1)`` of each client's vector, noised by the client's
own XNoise components like every coordinate; the release is accounted as the two discrete-Gaussian
releases composed (joint sensitivity ``hypot(Delta_2, k_b)``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant

from fedprivacy.accounting.accountant import Accountant
from fedprivacy.accounting.audiences import audience_epsilons
from fedprivacy.config import RunConfig
from fedprivacy.dp.adaptive_clipping import reachable_clip_range, update_noise_multiplier
from fedprivacy.dp.rng import RandomSource
from fedprivacy.fl.adaptive_clip import (
    AdaptiveClipSpec,
    adaptive_clip_spec,
    distributed_spec,
    round_encoding,
    worst_cut_off_clip_norm_candidates,
)
from fedprivacy.fl.checkpoint import load_checkpoint
from fedprivacy.fl.client_policy import ClientPolicy, PolicyRefusal
from fedprivacy.fl.secure.client import check_encoding
from fedprivacy.fl.secure.params import make_encoding
from fedprivacy.fl.types import ClipRoundInfo
from fedprivacy.secagg.encoding import EncodingSpec, largest_scale_encoding
from fedprivacy.secagg.messages import SetupRequest
from fedprivacy.secagg.xnoise import ComponentSeeds
from server.engine import run_inprocess

APP_DIR = Path(__file__).resolve().parents[2]
DELTA = 1e-5


def _enc(*, count_noise_std: float = 1.0, clip_norm: float = 0.5, z: float = 1.2, bits: int = 32,
         population: int = 8, dim: int = 300, t: int = 5) -> EncodingSpec:
    return largest_scale_encoding(kind="ddgauss", dim=dim, clip_norm=clip_norm, modulus_bits=bits,
                                  population=population, noise_multiplier=z, threshold=t,
                                  rotation_seed=b"\x07" * 32, xnoise=True, count_noise_std=count_noise_std)


def _released_sum(enc: EncodingSpec, updates: list[np.ndarray], seed: int) -> np.ndarray:
    """What secure aggregation reveals when every client survives: the sum of the vectors mod 2^b."""
    design = enc.ddp().design(roster=len(updates))
    total = np.zeros(enc.padded_dim, dtype=np.uint64)
    for i, u in enumerate(updates):
        rng = RandomSource.seeded(seed * 1000 + i)
        seeds = ComponentSeeds.fresh(design, round=1, node_id=i, rng=rng.child("seeds"))
        total = (total + enc.encode(u, rng=rng, components=seeds)) % (1 << enc.modulus_bits)
    return total.astype(np.uint32)


def _updates(clip_norm: float, *, unclipped: int, clipped: int, dim: int = 300) -> list[np.ndarray]:
    gen = np.random.default_rng(3)
    out = []
    for i in range(unclipped + clipped):
        v = gen.normal(size=dim)
        out.append(v / np.linalg.norm(v) * clip_norm * (0.5 if i < unclipped else 3.0))
    return out


# ----------------------------------------------------------------------------- encoder
def test_the_count_coordinate_carries_the_centred_count_with_at_least_sigma_b_of_noise() -> None:
    enc = _enc(count_noise_std=1.0)
    ups = _updates(enc.clip_norm, unclipped=3, clipped=5)
    assert enc.padded_dim == 512 + 1 and enc.count_scale == math.floor(
        enc.noise_multiplier * enc.clip_norm * enc.scale / 2.0)
    counts, errors = [], []
    clipped_sum = sum(u * min(1.0, enc.clip_norm / np.linalg.norm(u)) for u in ups)
    for seed in range(30):
        total = _released_sum(enc, ups, seed)
        counts.append(enc.decode_count(total))
        errors.append(enc.decode(total) - clipped_sum)
    # Σ (b_i − ½) = 3·½ − 5·½ = −1; all 8 clients keep all their components here (no excess removed):
    # the noise is the design's n·(client variance) >= σ², in bit units sqrt(that)/(2 k_b) >= σ_b
    var = enc.ddp().design(roster=8).client_variance * 8
    want_std = math.sqrt(var) / (2 * enc.count_scale)
    assert want_std >= 1.0
    assert np.mean(counts) == pytest.approx(-1.0, abs=4 * want_std / math.sqrt(30))
    assert np.std(counts) == pytest.approx(want_std, rel=0.35)
    # the update block decodes as before: Σ clipped updates + noise of std sqrt(var)/s per coordinate
    assert np.std(np.concatenate(errors)) == pytest.approx(math.sqrt(var) / enc.scale, rel=0.05)


def test_without_count_noise_the_encoding_is_unchanged() -> None:
    plain = _enc(count_noise_std=0.0)
    assert plain.count_scale == 0 and plain.padded_dim == 512
    assert EncodingSpec.from_record(_enc().to_record()) == _enc()
    with pytest.raises(ValueError, match="count"):
        plain.decode_count(np.zeros(512, dtype=np.uint32))
    with pytest.raises(ValueError, match="ddgauss"):
        largest_scale_encoding(kind="fixed-point", dim=10, clip_norm=1.0, modulus_bits=32, population=4,
                               count_noise_std=1.0)


# ----------------------------------------------------------------------------- accounting
def _pair_events(enc: EncodingSpec, *, roster: int, survivors: int) -> tuple[float, float, float]:
    rel = enc.ddp().release(roster=roster, survivors=survivors)
    z_update = rel.continuous_std / enc.ddp().norm_bound
    z_count = rel.continuous_std / enc.count_scale
    return rel.noise_multiplier, z_update, z_count


@pytest.mark.parametrize("count_noise_std", [0.6, 1.0, 3.0])
def test_the_event_is_dp_accountings_composition_of_the_two_discrete_gaussian_releases(
        count_noise_std: float) -> None:
    enc = _enc(count_noise_std=count_noise_std)
    z, z_u, z_b = _pair_events(enc, roster=8, survivors=5)
    rounds = 20
    pair = dpa.ComposedDpEvent([dpa.GaussianDpEvent(z_u), dpa.GaussianDpEvent(z_b)])
    rdp_ref = dpa.rdp.RdpAccountant()
    rdp_ref.compose(dpa.SelfComposedDpEvent(pair, rounds))
    pld_ref = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    pld_ref.compose(dpa.SelfComposedDpEvent(pair, rounds))
    rel = enc.ddp().release(roster=8, survivors=5)
    ours = {}
    for backend in ("rdp", "pld"):
        acc = Accountant(backend=backend)
        acc.spend(rel.event().with_count(rounds))
        ours[backend] = acc.epsilon(delta=DELTA)

    # one Gaussian of hypot sensitivity = the two composed (Theorem 1 in integer units)
    assert z == pytest.approx((z_u**-2 + z_b**-2) ** -0.5, rel=1e-12)
    assert ours["rdp"] == pytest.approx(rdp_ref.get_epsilon(DELTA), rel=1e-9)
    assert ours["pld"] <= pld_ref.get_epsilon(DELTA)  # exact analytic vs dp-accounting's pessimistic PLD
    assert ours["pld"] == pytest.approx(pld_ref.get_epsilon(DELTA), rel=5e-3)
    # the count is charged: the update's release alone would print a lower ε
    alone = Accountant()
    alone.spend(dataclasses.replace(rel.event(), mechanism=dpa_gauss(z_u)).with_count(rounds))
    assert alone.epsilon(delta=DELTA) < ours["pld"]
    # the RDP cross-check: the two discrete Gaussians' Rényi divergences (CKS 2020, Thm 14: α Δ²/(2V) for
    # the update block, α k_b²/(2V) for the count) added (composition), plus the sum lemma's slack
    orders = [2.0, 8.0, 32.0]
    curve = rel.rdp(orders, neighbouring="add-remove")
    v, d2 = rel.honest_variance, enc.ddp().norm_bound
    ref_curve = [a * d2**2 / (2 * v) + a * enc.count_scale**2 / (2 * v) for a in orders]
    assert all(c >= r for c, r in zip(curve, ref_curve, strict=True))
    assert curve == pytest.approx(ref_curve, rel=1e-6)


def dpa_gauss(z: float):  # our GaussianEvent of multiplier z (helper for the test above)
    from fedprivacy.accounting.events import GaussianEvent

    return GaussianEvent(noise_multiplier=z)


def _cfg(**kw) -> RunConfig:
    base = dict(privacy="distributed", secagg=True, adaptive_clip=True, clip_norm=0.5, noise_multiplier=1.0,
                adaptive_clip_count_std=1.0, target_delta=1e-3)
    return RunConfig(**{**base, **kw})


@pytest.mark.parametrize("bits", [32, 20])
def test_the_split_makes_the_pair_at_least_the_fixed_clips_gaussian(bits: int) -> None:
    cfg = _cfg(secagg_bits=bits)
    fixed = make_encoding(cfg, population=8, dim=300, threshold=5).ddp().release(roster=8, survivors=5)
    spec, worst = distributed_spec(cfg, noise_multiplier=1.0, target=fixed.noise_multiplier, population=8,
                                   dim=300, threshold=5, roster=8, denominator=8)
    # Theorem 1's z_Δ (raised only as far as the rounding needs), and the requested z = 1 for the pair
    assert spec.update_noise_multiplier >= update_noise_multiplier(noise_multiplier=1.0, count_noise_std=1.0)
    assert spec.update_noise_multiplier == pytest.approx(
        update_noise_multiplier(noise_multiplier=1.0, count_noise_std=1.0), rel=1e-3)
    assert worst.noise_multiplier >= fixed.noise_multiplier
    assert worst.noise_multiplier == pytest.approx(1.0, rel=2e-3)
    for c in (0.5, 0.41, 0.3, 0.26):  # any round's clip norm: within one octave of C s
        enc = round_encoding(cfg, spec, clip_norm=c, population=8, dim=300, threshold=5)
        assert enc.ddp().release(roster=8, survivors=5).noise_multiplier >= fixed.noise_multiplier * (1 - 1e-6)


def test_a_cut_off_round_is_accounted_at_a_clip_norm_it_can_have_used() -> None:
    spec = AdaptiveClipSpec(initial_clip_norm=0.5, target_quantile=0.5, learning_rate=0.2, count_noise_std=1.0,
                            update_noise_multiplier=1.2, expected_cohort=8)
    assert worst_cut_off_clip_norm_candidates(spec, []) == [0.5]
    clips = [ClipRoundInfo(clip_norm=0.5, unclipped_fraction=0.25), ClipRoundInfo(clip_norm=0.52,
                                                                                   unclipped_fraction=1.0)]
    assert worst_cut_off_clip_norm_candidates(spec, clips) == pytest.approx([0.5, 0.52, 0.52 * math.exp(-0.1)])


# ----------------------------------------------------------------------------- adversarial server
def _setup(enc: EncodingSpec, *, round: int = 1) -> SetupRequest:
    return SetupRequest(round=round, threshold=5, degree=7, dim=enc.padded_dim, modulus_bits=enc.modulus_bits,
                        active=True)


def test_a_server_asking_for_a_tiny_count_noise_is_refused_and_would_have_read_the_bits() -> None:
    cfg = _cfg(noise_multiplier=1.2, adaptive_clip_count_std=1.0)
    honest = _enc(count_noise_std=1.0)
    forged = dataclasses.replace(honest, count_scale=honest.count_scale * 16)  # σ_b / 16
    policy = ClientPolicy()

    rho = policy.check_distributed(honest.ddp(), setup=_setup(honest), roster=8)
    check_encoding(cfg, forged, _setup(forged))  # the run config's checks do not see the count noise
    with pytest.raises(PolicyRefusal, match="clipped-count coordinate"):
        policy.check_distributed(forged.ddp(), setup=_setup(forged), roster=8)
    # even a client that allowed any count multiplier refuses on its rho floor: the pair is accounted
    with pytest.raises(PolicyRefusal, match="rho"):
        ClientPolicy(min_noise_multiplier=0.0).check_distributed(forged.ddp(), setup=_setup(forged), roster=8)
    assert rho < ClientPolicy().max_rho_per_round
    # what the refusal prevents: with the forged scale the server reads Σ bits to ±0.1 (honest: ±1.4)
    ups = _updates(honest.clip_norm, unclipped=3, clipped=5)
    forged_counts = [forged.decode_count(_released_sum(forged, ups, s)) for s in range(12)]
    assert np.std(forged_counts) < 0.2 and np.round(np.mean(forged_counts)) == -1
    honest_counts = [honest.decode_count(_released_sum(honest, ups, s)) for s in range(12)]
    assert np.std(honest_counts) > 0.7


def test_a_forged_clip_norm_is_refused_outside_the_rule_and_gains_nothing_inside_it() -> None:
    cfg = _cfg()
    lo, hi = reachable_clip_range(initial_clip_norm=0.5, target_quantile=0.5, learning_rate=0.2, round=3)
    assert (lo, hi) == pytest.approx((0.5 * math.exp(-0.2), 0.5 * math.exp(0.2)), rel=1e-8)
    spec = adaptive_clip_spec(cfg, noise_multiplier=1.0, denominator=8)
    policy = ClientPolicy()
    rhos = {}
    for c in (0.5, 0.6):
        enc = round_encoding(cfg, spec, clip_norm=c, population=8, dim=300, threshold=5,
                             rotation_seed=b"\x01" * 32)
        check_encoding(cfg, enc, _setup(enc, round=3))
        rhos[c] = policy.check_distributed(enc.ddp(), setup=_setup(enc, round=3), roster=8)
        # the noise on the sum scales with the clip norm the client uses: the victim's z is the same
        assert math.sqrt(enc.ddp().target_variance) / enc.scale == pytest.approx(
            spec.update_noise_multiplier * c, rel=1e-12)
    assert rhos[0.6] == pytest.approx(rhos[0.5], rel=1e-4)
    for forged in (5.0, 0.05):
        enc = round_encoding(cfg, spec, clip_norm=forged, population=8, dim=300, threshold=5,
                             rotation_seed=b"\x01" * 32)
        with pytest.raises(ValueError, match="outside"):
            check_encoding(cfg, enc, _setup(enc, round=3))
    # different clip norms to different clients: different noise designs, so no honest client signs the
    # view (the consistency check compares every survivor's design fingerprint)
    a, b = (round_encoding(cfg, spec, clip_norm=c, population=8, dim=300, threshold=5).ddp()
            for c in (0.5, 0.6))
    assert a.design(roster=8).fingerprint() != b.design(roster=8).fingerprint()
    with pytest.raises(ValueError, match="adaptive-clip=false"):
        check_encoding(cfg.replace(adaptive_clip=False), a_enc := round_encoding(
            cfg, spec, clip_norm=0.5, population=8, dim=300, threshold=5), _setup(a_enc))


def test_config_accepts_distributed_and_refuses_local_and_plain_secagg() -> None:
    assert _cfg().adaptive_clip
    with pytest.raises(ValueError, match="local"):
        RunConfig(privacy="local", adaptive_clip=True, clip_norm=0.5, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="distributed"):
        RunConfig(privacy="none", secagg=True, adaptive_clip=True, clip_norm=0.5)


# ----------------------------------------------------------------------------- real engine
def test_engine_distributed_run_moves_the_clip_norm_by_the_papers_rule_and_charges_the_pair(
        tmp_path: Path) -> None:
    # Arrange: 6 clients, 3 rounds, digits; the first clip norm is far below the update norms
    run_config = {"num-server-rounds": 3, "seed": 4, "output-dir": str(tmp_path), "run-name": "ada",
                  "local-epochs": 1, "client-timeout": 30.0, "privacy": "distributed", "secagg": True,
                  "adaptive-clip": True, "clip-norm": 0.1, "noise-multiplier": 1.0,
                  "adaptive-clip-count-std": 1.0, "target-delta": 1e-3}
    # Act
    run_inprocess(run_config=run_config, num_supernodes=6, app_dir=APP_DIR, node_id_seed=7)
    res = json.loads((tmp_path / "ada" / "results.json").read_text())
    # Assert: the clip norm follows the paper's geometric rule on the fraction read from the sum
    rows = res["rounds"]
    clips = [r["clip_norm"] for r in rows]
    assert clips[0] == 0.1 and len(set(clips)) == 3
    # the next round's encoding follows this round's count: only its advertise rides ahead (docs/SECAGG.md)
    assert [r["secagg_exchanges"] for r in rows] == [5, 4, 4]
    for a, b in zip(rows, rows[1:], strict=False):
        assert b["clip_norm"] == pytest.approx(
            a["clip_norm"] * math.exp(-0.2 * (a["clip_unclipped_fraction"] - 0.5)), rel=1e-12)
    report = (tmp_path / "ada" / "privacy_report.md").read_text()
    assert "## Adaptive clipping" in report and f"| 3 | {clips[-1]:.4g} |" in report
    block = res["privacy"]["adaptive_clip"]
    assert block["count_noise_std"] == 1.0 and block["update_noise_multiplier"] >= update_noise_multiplier(
        noise_multiplier=1.0, count_noise_std=1.0)
    # the ledger charged each round's pair: dp-accounting's composition of the two Gaussians per round,
    # from each round's own encoding (its clip norm), equals the ledger's ε (the summary adds the slack)
    cfg = RunConfig(privacy="distributed", secagg=True, adaptive_clip=True, clip_norm=0.1, noise_multiplier=1.0,
                    adaptive_clip_count_std=1.0, target_delta=1e-3)
    spec = AdaptiveClipSpec(**{k: block[k] for k in ("initial_clip_norm", "target_quantile", "learning_rate",
                                                     "count_noise_std", "update_noise_multiplier",
                                                     "expected_cohort")})
    dim = int(sum(np.size(w) for w in load_checkpoint(tmp_path / "ada" / "checkpoint").weights))
    events = []
    for c in clips:
        enc = round_encoding(cfg, spec, clip_norm=c, population=6, dim=dim,
                             threshold=res["privacy"]["distributed"]["threshold"])
        assert enc.padded_dim == rows[0]["secagg_dim"]
        _, z_u, z_b = _pair_events(enc, roster=6, survivors=6)
        events.append(dpa.ComposedDpEvent([dpa.GaussianDpEvent(z_u), dpa.GaussianDpEvent(z_b)]))
    ref = dpa.rdp.RdpAccountant()
    ref.compose(dpa.ComposedDpEvent(events))
    ledger = res["privacy"]["distributed"]["ledger_epsilon"]
    assert ledger <= ref.get_epsilon(1e-3)  # ours is the exact PLD of the same Gaussians, below RDP
    pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dpa.ComposedDpEvent(events))
    assert ledger == pytest.approx(pld.get_epsilon(1e-3), rel=2e-3)
    assert res["privacy"]["epsilon"] >= ledger  # the reported figure adds the accounting slack
    # ... and is the audiences' figure: each round charged the run's worst case of its own encoding
    rels = [round_encoding(cfg, spec, clip_norm=c, population=6, dim=dim, threshold=4).ddp()
            .worst_release(max_roster=6) for c in clips]
    assert res["privacy"]["epsilon"] == pytest.approx(audience_epsilons(rels, delta=1e-3).server, rel=1e-12)



def test_a_calibrated_plan_gives_the_pair_at_least_the_fixed_clips_noise() -> None:
    from fedprivacy.fl.modes.distributed import DistributedMode

    base = dict(privacy="distributed", secagg=True, clip_norm=0.5, noise_multiplier=0.0, target_epsilon=8.0,
                target_delta=1e-3, num_server_rounds=5)
    fixed = DistributedMode().plan(RunConfig(**base), population=8, dim=300)
    ada = DistributedMode().plan(RunConfig(**base, adaptive_clip=True, adaptive_clip_count_std=2.0),
                                 population=8, dim=300)
    assert ada.calibrated and ada.noise_multiplier == fixed.noise_multiplier  # the requested z
    assert ada.adaptive_clip is not None and ada.adaptive_clip.update_noise_multiplier > ada.noise_multiplier
    assert ada.event.mechanism.noise_multiplier >= fixed.event.mechanism.noise_multiplier
    assert ada.event.mechanism.noise_multiplier == pytest.approx(fixed.event.mechanism.noise_multiplier,
                                                                 rel=1e-3)


def test_the_secure_round_keeps_its_estimate_across_a_checkpoint() -> None:
    from fedprivacy.fl.adaptive_clip import AdaptiveSecureRound

    cfg = _cfg()
    spec = adaptive_clip_spec(cfg, noise_multiplier=1.0, denominator=8)
    first = AdaptiveSecureRound(cfg, transport=None, population=8, spec=spec)  # type: ignore[arg-type]
    first._fraction = 0.9  # a released round, then charged
    first.after_release(None)  # type: ignore[arg-type]
    assert first.clip_norm == pytest.approx(0.5 * math.exp(-0.2 * 0.4), rel=1e-12)
    resumed = AdaptiveSecureRound(cfg, transport=None, population=8, spec=spec)  # type: ignore[arg-type]
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert resumed.clip_norm == first.clip_norm and resumed.state_dict() == first.state_dict()
    with pytest.raises(ValueError, match="clip_norm"):
        resumed.load_state_dict({"clip_norm": -1.0, "rounds": 1, "last_fraction": None})
    assert resumed.clip_norm == first.clip_norm  # a refused state changes nothing
    with pytest.raises(ValueError, match="distributed"):
        AdaptiveSecureRound(cfg.replace(privacy="none"), transport=None, population=8,  # type: ignore[arg-type]
                            spec=spec)


def test_the_dominating_release_of_a_cut_off_round_is_above_each_candidate() -> None:
    from fedprivacy.fl.modes.distributed import _dominating

    cfg = _cfg(secagg_bits=16)
    spec = adaptive_clip_spec(cfg, noise_multiplier=1.0, denominator=8)
    rels = [round_encoding(cfg, spec, clip_norm=c, population=8, dim=300, threshold=5).ddp()
            .worst_release(max_roster=8) for c in (0.5, 0.36, 0.27)]
    dom = _dominating(rels)
    orders = [1.5, 4.0, 64.0]
    assert dom.noise_multiplier == min(r.noise_multiplier for r in rels)
    assert dom.eta >= max(r.eta for r in rels) and dom.sampler_tv >= max(r.sampler_tv for r in rels)
    for r in rels:
        assert all(a >= b for a, b in zip(dom.rdp(orders, neighbouring="add-remove"),
                                          r.rdp(orders, neighbouring="add-remove"), strict=True))
