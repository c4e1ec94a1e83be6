"""Caches of pure secagg functions: the same values as the uncached code, and no caller
can change what the next caller gets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fedprivacy.secagg import graph
from fedprivacy.secagg.ddp import DistributedDPConfig


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(0, 2**64 - 1), min_size=2, max_size=40, unique=True),
       degree=st.integers(1, 45), seed=st.binary(min_size=0, max_size=32))
def test_cached_harary_graph_is_the_uncached_one_and_a_private_copy(
        ids: list[int], degree: int, seed: bytes) -> None:
    k = graph.effective_degree(len(ids), degree)
    want = graph._harary.__wrapped__(tuple(ids), k, seed)
    got = graph.harary_neighbours(ids, degree=degree, seed=seed)
    assert got == want and list(got) == list(want)
    got.clear()  # a caller's change stays its own
    assert graph.harary_neighbours(ids, degree=degree, seed=seed) == want


def test_cached_release_is_the_uncached_one_for_every_count() -> None:
    for xnoise in (True, False):
        cfg = DistributedDPConfig(dim=1000, clip_norm=0.5, noise_multiplier=1.0, min_survivors=6,
                                  scale=64.0, modulus_bits=24, max_clients=20, xnoise=xnoise)
        for roster in (6, 9, 20):
            for survivors in range(6, roster + 1, 3):
                first = cfg.release(roster=roster, survivors=survivors)
                assert first == cfg._release(roster, survivors)
                assert cfg.release(roster=roster, survivors=survivors) is first  # cached
