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
    instr = RoundInstructions(round=1, privacy="central", clip_norm=1.0, client_mechanism="", noise_multiplier=0.0, private=True,
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


def test_the_servers_planned_dpsgd_spend_is_what_the_client_runs() -> None:
    # the server charges each sampled client's DP-SGD spend before it sends instructions,
    # from the partition's size (default_hooks' dpsgd_schedule); it must be what local training reports
    from fedprivacy.fl.task import default_hooks
    from fedprivacy.ml.partition import load_partition

    for epochs, batch in ((1, 16), (2, 50), (1, 10_000)):
        cfg = RunConfig(privacy="central", dpsgd=True, secagg=False, noise_multiplier=1.0,
                        local_epochs=epochs, batch_size=batch)
        schedule = default_hooks(cfg, population=10).dpsgd_schedule
        assert schedule is not None
        instr = RoundInstructions(round=1, privacy="central", clip_norm=1.0, client_mechanism="", noise_multiplier=0.0, private=True,
                                  learning_rate=0.1, local_epochs=epochs, batch_size=batch, num_classes=10,
                                  seed=-1)
        weights = get_weights(build_model(cfg.model, input_shape=(1, 8, 8), num_classes=10,
                                          hidden=cfg.hidden_units, seed=0))
        for pid in (0, 7):
            res = local_training(cfg, partition_id=pid, num_partitions=10, weights=weights, instructions=instr,
                                 seed=1)
            n = len(load_partition(cfg, pid, 10))
            per_epoch = -(-n // min(batch, n))
            assert schedule(pid) == (res.dpsgd_steps, res.dpsgd_sample_rate) == (epochs * per_epoch, 1 / per_epoch)
    assert default_hooks(RunConfig(privacy="central", secagg=False), population=10).dpsgd_schedule is None


def test_a_dpsgd_client_does_not_send_its_un_noised_training_loss() -> None:
    """The example-level claim covers the DP-SGD-noised update only, so the
    client's un-noised training loss is not sent beside it (a plain-SGD client in mode none sends it)."""
    from fedprivacy.fl.client import train_client

    instr = RoundInstructions(round=1, privacy="none", clip_norm=1.0, client_mechanism="", noise_multiplier=0.0, private=False, learning_rate=0.1,
                              local_epochs=1, batch_size=16, num_classes=10, seed=-1)
    for dpsgd in (True, False):
        cfg = RunConfig(privacy="none", dpsgd=dpsgd, secagg=False)
        weights = get_weights(build_model(cfg.model, input_shape=(1, 8, 8), num_classes=10,
                                          hidden=cfg.hidden_units, seed=0))
        update = train_client(cfg, partition_id=0, num_partitions=10, weights=weights, instructions=instr)
        if dpsgd:
            assert update.train_loss is None and update.metrics["dpsgd_steps"] > 0
        else:
            assert update.train_loss is not None and np.isfinite(update.train_loss)
