"""A client's DP-SGD randomness in a run: secure unless the run is in the seeded research mode."""

from __future__ import annotations

import numpy as np

from fedprivacy.config import RunConfig
from fedprivacy.fl.task import local_training
from fedprivacy.fl.types import RoundInstructions
from fedprivacy.ml.models import build_model, get_weights


def _train(instruction_seed: int, train_seed: int) -> list[np.ndarray]:
    cfg = RunConfig(privacy="central", dpsgd=True, dpsgd_noise_multiplier=1.0, secagg=False,
                    seed=instruction_seed, noise_multiplier=1.0)
    instr = RoundInstructions(round=1, privacy="central", clip_norm=1.0, local_noise_std=0.0,
                              learning_rate=0.1, local_epochs=1, batch_size=16, num_classes=10,
                              seed=instruction_seed)
    weights = get_weights(build_model(cfg.model, input_shape=(1, 8, 8), num_classes=10,
                                      hidden=cfg.hidden_units, seed=0))
    return local_training(cfg, partition_id=0, num_partitions=10, weights=weights, instructions=instr,
                          seed=train_seed).weights


def test_secure_run_draws_fresh_dpsgd_noise_seeded_run_repeats() -> None:
    # secure (seed = -1): the same integer seed does not repeat the noise or the batches
    a, b = _train(-1, 5), _train(-1, 5)
    assert any(not np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    # seeded research mode: the round's seed repeats them exactly
    c, d = _train(3, 5), _train(3, 5)
    assert all(np.array_equal(x, y) for x, y in zip(c, d, strict=True))
