"""fedprivacy's ledger behind Flower's ``PrivacyAccountant`` protocol (server/flower_accountant.py).

Against Flower's protocol (every member, runtime and signatures), against reference values
(fedprivacy's own accountant, the analytic Gaussian's closed-form delta, Flower's RdpAccountant on the
same events), and the check-first / refusal rules. The end-to-end runs in Flower's strategies are in
``test_flower_accountant_e2e.py``.
"""

from __future__ import annotations

import inspect
import json
import math
import random
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pytest
from flwr.serverapp import (
    GaussianPrivacyEvent,
    NeighboringRelation,
    PrivacyAccountant,
    PrivacyConfig,
    PrivacySpent,
    RdpAccountant,
    SamplingMethod,
)
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from fedprivacy.accounting import FixedCohortSampling, NoSampling, epsilon_for
from server.flower_accountant import FedprivacyAccountant, SecureCohortFedAvg, attach_accountant

DELTA = 1e-5
N = 50


def _config(method: SamplingMethod = SamplingMethod.NO_AMPLIFICATION, *, population: int = N,
            max_epsilon: float | None = None) -> PrivacyConfig:
    relation = (NeighboringRelation.REPLACE_ONE if method is SamplingMethod.WITHOUT_REPLACEMENT
                else NeighboringRelation.ADD_OR_REMOVE_ONE)
    return PrivacyConfig(target_delta=DELTA, population_size=population,
                         neighboring_relation=relation, sampling_method=method,
                         max_epsilon=max_epsilon)


def _event(z: float = 1.0, m: int = 10, n: int = N) -> GaussianPrivacyEvent:
    return GaussianPrivacyEvent(noise_multiplier=z, sample_size=m, population_size=n)


class _Nodes:
    """The one Grid method SecureCohortFedAvg.configure_train reads: the connected node ids."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def get_node_ids(self) -> list[int]:
        return list(self.ids)


def _sampler(m: int = 10, n: int = N, **kw: Any) -> SecureCohortFedAvg:
    return SecureCohortFedAvg(cohort_size=m, population_size=n, fraction_evaluate=0.0, **kw)


def _draw(sampler: SecureCohortFedAvg, rnd: int, nodes: list[int] | None = None) -> list[int]:
    grid = _Nodes(nodes if nodes is not None else list(range(100, 100 + sampler.population_size)))
    return sampler.draw_cohort(rnd, grid)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ Flower's protocol
@runtime_checkable
class _CheckedProtocol(PrivacyAccountant, Protocol):
    """Flower's protocol made runtime-checkable without touching Flower's class."""


_MEMBERS = ["config", "num_releases", "compose", "get_epsilon", "get_delta", "get_privacy_spent",
            "would_exceed", "state_dict", "load_state_dict"]


def test_every_protocol_member_is_listed() -> None:
    declared = {n for n in vars(PrivacyAccountant) if not n.startswith("_")}
    assert declared == set(_MEMBERS)


def test_adapter_satisfies_the_protocol_at_runtime() -> None:
    acc = FedprivacyAccountant(_config())

    assert isinstance(acc, _CheckedProtocol)
    assert not isinstance(object(), _CheckedProtocol)  # the check can fail
    assert isinstance(RdpAccountant(_config()), _CheckedProtocol)


@pytest.mark.parametrize("name", _MEMBERS)
def test_each_member_has_flowers_signature(name: str) -> None:
    ours, theirs = getattr(FedprivacyAccountant, name), getattr(PrivacyAccountant, name)

    if isinstance(theirs, property):
        assert isinstance(ours, property)
        return
    a, b = inspect.signature(ours), inspect.signature(theirs)
    assert [(p.name, p.kind, p.default) for p in a.parameters.values()] == [
        (p.name, p.kind, p.default) for p in b.parameters.values()
    ]


@pytest.mark.parametrize("wrapper", [DifferentialPrivacyClientSideFixedClipping,
                                     DifferentialPrivacyServerSideFixedClipping])
def test_flowers_dp_strategies_accept_the_unamplified_adapter(wrapper: type) -> None:
    acc = FedprivacyAccountant(_config())

    dp = wrapper(FedAvg(), noise_multiplier=1.0, clipping_norm=1.0, num_sampled_clients=10,
                 accountant=acc)

    assert dp.accountant is acc and dp.privacy_spent() == acc.get_privacy_spent()


# ------------------------------------------------------------------------------ reference values
@settings(max_examples=15, deadline=None)
@given(z=st.floats(0.5, 4.0), steps=st.integers(1, 200))
def test_unamplified_epsilon_is_fedprivacys_and_below_flowers_rdp(z: float, steps: int) -> None:
    # zero-out (Flower's own figure, sensitivity C) and replace-one (2C, the default)
    ours, flowers = FedprivacyAccountant(_config(), adjacency="zero-out"), RdpAccountant(_config())
    replace_one = FedprivacyAccountant(_config())

    for acc in (ours, flowers, replace_one):
        acc.compose(_event(z), steps)

    ref = epsilon_for(noise_multiplier=z, sampling=NoSampling(), steps=steps, delta=DELTA)
    assert ours.get_epsilon(DELTA) == ref
    assert ours.get_epsilon(DELTA) < flowers.get_epsilon(DELTA)
    assert ours.num_releases == flowers.num_releases == replace_one.num_releases == steps
    # one client's data replaced moves the fixed-size mean's sum by up to 2C
    assert replace_one.get_epsilon(DELTA) == epsilon_for(noise_multiplier=z, sampling=NoSampling(), steps=steps,
                                                        delta=DELTA, neighbouring="replace-one")
    assert replace_one.get_epsilon(DELTA) == pytest.approx(
        epsilon_for(noise_multiplier=z / 2, sampling=NoSampling(), steps=steps, delta=DELTA), rel=1e-9)
    assert (replace_one.adjacency, ours.adjacency) == ("replace-one", "zero-out")


def test_rdp_backend_agrees_with_flowers_rdp_accountant() -> None:
    # Same events, same dp-accounting orders: fedprivacy's RDP backend reproduces Flower's.
    ours, flowers = FedprivacyAccountant(_config(), backend="rdp", adjacency="zero-out"), RdpAccountant(_config())
    for z, count in [(1.1, 30), (0.7, 5), (2.0, 100)]:
        ours.compose(_event(z), count)
        flowers.compose(_event(z), count)

    assert ours.get_epsilon(DELTA) == pytest.approx(flowers.get_epsilon(DELTA), rel=1e-9)
    assert ours.get_privacy_spent().accounting_method == "fedprivacy-rdp"


def test_composition_of_different_events_counts_each() -> None:
    ours = FedprivacyAccountant(_config(), adjacency="zero-out")
    ours.compose(_event(1.0), 10)
    ours.compose(_event(2.0), 40)

    # Gaussians compose to one Gaussian with mu^2 = sum of mu_i^2 (Dong, Roth & Su 2022, Cor. 3.3).
    z_eq = 1.0 / math.sqrt(10 / 1.0**2 + 40 / 2.0**2)
    ref = epsilon_for(noise_multiplier=z_eq, sampling=NoSampling(), steps=1, delta=DELTA)
    assert ours.get_epsilon(DELTA) == pytest.approx(ref, rel=1e-9)
    assert ours.num_releases == 50


def _analytic_gaussian_delta(mu: float, eps: float) -> float:
    """Balle & Wang 2018, Theorem 8: delta(eps) of a Gaussian with sensitivity/std = mu."""
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))


@pytest.mark.parametrize("eps", [0.5, 2.0, 8.0])
def test_get_delta_matches_the_closed_form(eps: float) -> None:
    ours, replace_one = FedprivacyAccountant(_config(), adjacency="zero-out"), FedprivacyAccountant(_config())
    ours.compose(_event(3.0), 16)  # one Gaussian with mu = sqrt(16)/3 (sensitivity C)
    replace_one.compose(_event(3.0), 16)  # sensitivity 2C: mu = 8/3

    got = ours.get_delta(eps)

    assert got == pytest.approx(_analytic_gaussian_delta(4.0 / 3.0, eps), rel=1e-6)
    assert ours.get_epsilon(got) <= eps  # an upper bound: (eps, got)-DP holds
    assert replace_one.get_delta(eps) == pytest.approx(_analytic_gaussian_delta(8.0 / 3.0, eps), rel=1e-6)


def test_get_delta_is_tighter_than_flowers_and_consistent_with_epsilon() -> None:
    ours, flowers = FedprivacyAccountant(_config(), adjacency="zero-out"), RdpAccountant(_config())
    ours.compose(_event(1.2), 50)
    flowers.compose(_event(1.2), 50)
    eps = ours.get_epsilon(DELTA)

    assert ours.get_delta(eps) == pytest.approx(DELTA, rel=1e-4)
    assert ours.get_delta(eps) < flowers.get_delta(eps)
    assert FedprivacyAccountant(_config()).get_delta(1.0) == 0.0  # nothing released


def test_get_privacy_spent_reports_target_delta_by_default() -> None:
    ours = FedprivacyAccountant(_config())
    ours.compose(_event(1.0), 3)

    spent = ours.get_privacy_spent()

    assert spent == PrivacySpent(epsilon=ours.get_epsilon(DELTA), delta=DELTA, num_releases=3,
                                 accounting_method="fedprivacy-pld", optimal_order=None)
    assert ours.get_privacy_spent(1e-3).epsilon < spent.epsilon


def test_would_exceed_predicts_compose_and_changes_nothing() -> None:
    ours = FedprivacyAccountant(_config(max_epsilon=10.0))
    ours.compose(_event(1.0), 4)
    before = ours.state_dict()
    after_one = epsilon_for(noise_multiplier=1.0, sampling=NoSampling(), steps=5, delta=DELTA,
                            neighbouring="replace-one")

    assert ours.would_exceed(_event(1.0)) is (after_one > 10.0)
    assert ours.would_exceed(_event(1.0), max_epsilon=after_one * 0.999) is True
    assert ours.would_exceed(_event(1.0), max_epsilon=after_one * 1.001) is False
    assert ours.would_exceed(_event(1.0), max_epsilon=100.0, count=1000) is True
    assert ours.state_dict() == before
    with pytest.raises(ValueError, match="max_epsilon"):
        FedprivacyAccountant(_config()).would_exceed(_event())
    with pytest.raises(ValueError, match="max_epsilon must be > 0"):
        ours.would_exceed(_event(), max_epsilon=-1.0)


# ------------------------------------------------------------------------------ state, refusals
def test_state_dict_is_json_and_restores_the_same_epsilon() -> None:
    ours = FedprivacyAccountant(_config())
    ours.compose(_event(0.9), 7)
    ours.compose(_event(1.3), 2)

    state = json.loads(json.dumps(ours.state_dict()))
    fresh = FedprivacyAccountant(_config())
    fresh.load_state_dict(state)

    assert fresh.get_epsilon(DELTA) == ours.get_epsilon(DELTA) and fresh.num_releases == 9


@pytest.mark.parametrize("tamper,match", [
    (lambda s: s.update(schema_version=1), "schema_version"),
    (lambda s: s.update(adjacency="zero-out"), "adjacency"),
    (lambda s: s.update(backend="rdp"), "backend"),
    (lambda s: s["config"].update(population_size=51), "does not match"),
    (lambda s: s.pop("ledger"), "fields"),
    (lambda s: s["ledger"]["entries"][0]["event"]["mechanism"].update(noise_multiplier=-1), "noise"),
    (lambda s: s["ledger"].update(neighbouring="add-remove"), "relation"),
    (lambda s: s["ledger"]["entries"][0]["event"].update(
        sampling={"kind": "poisson", "rate": 0.1}), "sampling"),
])
def test_load_state_dict_refuses_bad_state_and_keeps_the_old(tamper: Any, match: str) -> None:
    ours = FedprivacyAccountant(_config())
    ours.compose(_event(1.0), 3)
    state = json.loads(json.dumps(ours.state_dict()))
    tamper(state)
    target = FedprivacyAccountant(_config())
    target.compose(_event(2.0), 1)
    eps = target.get_epsilon(DELTA)

    with pytest.raises(ValueError, match=match):
        target.load_state_dict(state)

    assert target.get_epsilon(DELTA) == eps and target.num_releases == 1


@pytest.mark.parametrize("call,exc,match", [
    (lambda a: a.compose(object()), TypeError, "GaussianPrivacyEvent"),
    (lambda a: a.compose(_event(n=N + 1)), ValueError, "population_size"),
    (lambda a: a.compose(_event(), 0), ValueError, "count must be >= 1"),
    (lambda a: a.compose(_event(), True), TypeError, "count must be an int"),
    (lambda a: a.get_epsilon(0.0), ValueError, "delta"),
    (lambda a: a.get_delta(-1.0), ValueError, "epsilon must be >= 0"),
])
def test_bad_calls_raise_and_change_nothing(call: Any, exc: type, match: str) -> None:
    ours = FedprivacyAccountant(_config())
    ours.compose(_event(), 2)
    before = ours.state_dict()

    with pytest.raises(exc, match=match):
        call(ours)

    assert ours.state_dict() == before


def test_poisson_is_refused() -> None:
    with pytest.raises(ValueError, match="poisson"):
        FedprivacyAccountant(_config(SamplingMethod.POISSON))


def test_without_replacement_needs_a_secure_sampler_of_the_population() -> None:
    cfg = _config(SamplingMethod.WITHOUT_REPLACEMENT)
    with pytest.raises(ValueError, match="SecureCohortFedAvg"):
        FedprivacyAccountant(cfg)
    with pytest.raises(ValueError, match="population_size"):
        FedprivacyAccountant(cfg, sampler=_sampler(n=N + 1))
    with pytest.raises(ValueError, match="seeded"):
        FedprivacyAccountant(cfg, sampler=_sampler(rng=random.Random(0)))
    with pytest.raises(ValueError, match="only used"):
        FedprivacyAccountant(_config(), sampler=_sampler())


# ------------------------------------------------------------------------------ the sampler
def test_sampler_draws_exactly_m_distinct_members_uniformly() -> None:
    sampler = _sampler(m=3, n=10, rng=random.Random(7))
    counts = np.zeros(10)
    for rnd in range(1, 2001):
        cohort = _draw(sampler, rnd)
        assert len(set(cohort)) == 3 and set(cohort) <= set(range(100, 110))
        counts[np.asarray(cohort) - 100] += 1

    # each member is in a cohort with probability m/n = 0.3: chi-square, 9 dof, p > 0.001
    expected = 2000 * 0.3
    assert float(((counts - expected) ** 2 / expected).sum()) < 27.9
    assert len(sampler.draws) == 2000


def test_sampler_refuses_a_population_that_is_not_the_accounted_one() -> None:
    sampler = _sampler(m=2, n=5, node_wait=0.3)
    with pytest.raises(RuntimeError, match="6 nodes are connected"):
        _draw(sampler, 1, nodes=list(range(6)))
    with pytest.raises(RuntimeError, match="only 4 of population_size=5"):
        _draw(sampler, 1, nodes=list(range(4)))
    _draw(sampler, 1, nodes=list(range(5)))
    with pytest.raises(RuntimeError, match="changed since the first round"):
        _draw(sampler, 2, nodes=[0, 1, 2, 3, 9])


def test_sampler_refuses_flowers_sampling_keys() -> None:
    with pytest.raises(ValueError, match="fraction_train"):
        SecureCohortFedAvg(cohort_size=2, population_size=5, fraction_train=0.5)
    with pytest.raises(ValueError, match="cohort_size must be <= population_size"):
        SecureCohortFedAvg(cohort_size=6, population_size=5)


def test_amplified_accounting_is_the_fixed_cohort_replace_one_ledger() -> None:
    sampler = _sampler(m=10, n=N)
    ours = FedprivacyAccountant(_config(SamplingMethod.WITHOUT_REPLACEMENT), sampler=sampler)
    for rnd in range(1, 4):
        _draw(sampler, rnd)
        assert ours.would_exceed(_event(1.0), max_epsilon=1e-3) is True  # checks, never consumes
        ours.compose(_event(1.0))

    ref = epsilon_for(noise_multiplier=1.0, sampling=FixedCohortSampling(cohort=10, population=N),
                      steps=3, delta=DELTA, neighbouring="replace-one")
    assert ours.get_epsilon(DELTA) == pytest.approx(ref, rel=1e-12)
    assert [e.round for e in ours.ledger.ledger] == [1, 2, 3]


def test_amplified_release_needs_its_own_matching_draw() -> None:
    sampler = _sampler(m=10, n=N)
    ours = FedprivacyAccountant(_config(SamplingMethod.WITHOUT_REPLACEMENT), sampler=sampler)
    with pytest.raises(ValueError, match="no pending cohort draw"):
        ours.compose(_event())
    _draw(sampler, 1)
    with pytest.raises(ValueError, match="sample_size must equal the drawn cohort"):
        ours.compose(_event(m=9))
    with pytest.raises(ValueError, match="count must be 1"):
        ours.compose(_event(), 2)
    ours.compose(_event())
    with pytest.raises(ValueError, match="no pending cohort draw"):
        ours.compose(_event())  # one release per draw

    assert ours.num_releases == 1


def test_attach_accountant_repeats_flowers_checks() -> None:
    sampler = _sampler(m=10, n=N)
    acc = FedprivacyAccountant(_config(SamplingMethod.WITHOUT_REPLACEMENT), sampler=sampler)
    with pytest.raises(ValueError, match="sampling_method='no-amplification'"):
        DifferentialPrivacyClientSideFixedClipping(sampler, 1.0, 1.0, 10, accountant=acc)

    with pytest.raises(ValueError, match="must wrap the SecureCohortFedAvg"):
        attach_accountant(DifferentialPrivacyClientSideFixedClipping(_sampler(), 1.0, 1.0, 10), acc)
    with pytest.raises(ValueError, match="num_sampled_clients"):
        attach_accountant(DifferentialPrivacyClientSideFixedClipping(sampler, 1.0, 1.0, 9), acc)
    with pytest.raises(ValueError, match="noise_multiplier must be > 0"):
        attach_accountant(DifferentialPrivacyClientSideFixedClipping(sampler, 0.0, 1.0, 10), acc)
    with pytest.raises(ValueError, match="not amplified"):
        attach_accountant(DifferentialPrivacyClientSideFixedClipping(sampler, 1.0, 1.0, 10),
                          FedprivacyAccountant(_config()))
    dp = DifferentialPrivacyServerSideFixedClipping(sampler, 1.0, 1.0, 10)
    attach_accountant(dp, acc)
    assert dp.accountant is acc
    with pytest.raises(ValueError, match="already has an accountant"):
        attach_accountant(dp, acc)


def test_the_documented_example_runs() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "FLOWER_ACCOUNTANT.md").read_text(encoding="utf-8")
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict[str, Any] = {}

    exec(compile(code, "FLOWER_ACCOUNTANT.md", "exec"), scope)  # noqa: S102

    assert scope["dp"].accountant is scope["acc"] and scope["acc"].config.population_size == 100


def test_the_adjacency_is_one_the_sampling_can_claim() -> None:
    # whether Flower's wrapper releases at all depends on the number of connected nodes (it raises
    # unless exactly num_sampled_clients are sampled), so no add/remove claim is offered
    with pytest.raises(ValueError, match="adjacency must be one of 'replace-one', 'zero-out'"):
        FedprivacyAccountant(_config(), adjacency="add-remove")
    sampler = SecureCohortFedAvg(cohort_size=10, population_size=N)
    with pytest.raises(ValueError, match="adjacency must be one of 'replace-one'"):
        FedprivacyAccountant(_config(SamplingMethod.WITHOUT_REPLACEMENT), sampler=sampler, adjacency="zero-out")
    assert FedprivacyAccountant(_config(SamplingMethod.WITHOUT_REPLACEMENT), sampler=sampler).adjacency == "replace-one"


def test_the_saved_state_names_the_relation_each_figure_holds_under() -> None:
    # the zero-out figure is composed at sensitivity C by the ledger's add-remove setting,
    # but the state a reader sees must not call it add-remove
    for adjacency, label in [("zero-out", "zero-out"), ("replace-one", "replace-one")]:
        acc = FedprivacyAccountant(_config(), adjacency=adjacency)
        acc.compose(_event(1.0), 4)
        state = json.loads(json.dumps(acc.state_dict()))
        assert (state["adjacency"], state["ledger"]["neighbouring"]) == (adjacency, label)
        fresh = FedprivacyAccountant(_config(), adjacency=adjacency)
        fresh.load_state_dict(state)
        assert fresh.get_epsilon(DELTA) == acc.get_epsilon(DELTA)
    zero = FedprivacyAccountant(_config(), adjacency="zero-out")
    zero.compose(_event(1.0), 1)
    state = zero.state_dict()
    state["ledger"]["neighbouring"] = "add-remove"  # a ledger labelled add/remove is not this claim
    with pytest.raises(ValueError, match="relation"):
        FedprivacyAccountant(_config(), adjacency="zero-out").load_state_dict(state)
