"""What the secure round's own lines say about the cohort (the V6 class of disclosure)."""

from __future__ import annotations

import numpy as np
import pytest

from fedprivacy.config import RunConfig
from fedprivacy.dp.rng import RandomSource
from fedprivacy.fl.secure import SecureRound
from fedprivacy.fl.secure.params import counts_private
from tests.fl.test_secure_round import DirectTransport, _instr, _updates


@pytest.mark.parametrize("publish", [False, True])
def test_a_client_in_the_sum_that_missed_a_later_stage_is_named_only_where_counts_are_published(
        publish: bool) -> None:
    # Arrange: a sampled distributed run (counts private unless publish-participation); client 4 uploads
    # its masked input, then misses the consistency stage: it stays in the sum
    cfg = RunConfig(privacy="distributed", secagg=True, clip_norm=0.5, noise_multiplier=1.0, num_server_rounds=1,
                    sampling="poisson", sample_rate=0.5, publish_participation=publish)
    assert counts_private(cfg) is not publish
    like = [np.zeros((7, 5), np.float32), np.zeros(5, np.float32)]
    lines: list[str] = []
    rnd = SecureRound(cfg, DirectTransport(cfg, _updates(10, like), {"consistency": {4}}), population=20,
                      log=lines.append)
    # Act
    outcome = rnd(_instr(privacy="distributed"), list(range(10)), like, RandomSource.seeded(0))
    # Assert
    assert outcome.aborted is None and 4 in outcome.aggregate.aggregated
    named = [ln for ln in lines if "client 4" in ln]
    if publish:
        assert named and "missed a later stage" in named[0]
    else:
        assert not named and any("missed a later stage (ids not published)" in ln for ln in lines)
        assert not any(f"client {pid}" in ln for ln in lines for pid in range(10))
