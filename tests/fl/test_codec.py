"""Wire format: what a client discloses per privacy mode, and lossless array transport."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from fedprivacy.fl.types import ClientUpdate, RoundInstructions
from fedprivacy_flwr import codec
from server.engine._flwr_private import TaskIdentityScope as _TaskIdentityScope


@pytest.fixture(autouse=True)
def _run_identity() -> Iterator[None]:
    """Messages need Flower's process-wide run identity, as inside a ServerApp."""
    with _TaskIdentityScope(12345):
        yield


def _instr(privacy: str) -> RoundInstructions:
    return RoundInstructions(round=2, privacy=privacy, clip_norm=1.0,
                             client_mechanism="gaussian" if privacy == "local" else "",
                             noise_multiplier=0.5 if privacy == "local" else 0.0, private=privacy != "none",
                             learning_rate=0.1,
                             local_epochs=1, batch_size=8, num_classes=10, seed=-1)


def test_train_message_round_trips_weights_and_instructions() -> None:
    weights = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([0.5, -1.0], np.float32)]
    msg = codec.train_message(7, _instr("central"), codec.arrays_to_record(weights))
    instr, got = codec.decode_train(msg)
    assert instr == _instr("central") and msg.metadata.group_id == "2"
    for a, b in zip(got, weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_reply_carries_only_what_the_mode_discloses() -> None:
    msg = codec.train_message(7, _instr("central"), codec.arrays_to_record([np.zeros(3, np.float32)]))
    trusted = ClientUpdate(partition_id=4, delta=(np.ones(3, np.float32),), num_examples=12, train_loss=0.7,
                           metrics={"dpsgd_steps": 5.0})
    reply = codec.train_reply(msg, trusted)
    update = codec.decode_train_reply(reply, 4)
    assert (update.num_examples, update.train_loss, update.metrics) == (12, 0.7, {"dpsgd_steps": 5.0})
    private = ClientUpdate(partition_id=4, delta=(np.ones(3, np.float32),))
    reply = codec.train_reply(msg, private)
    assert dict(reply.content.metric_records["metrics"]) == {}
    update = codec.decode_train_reply(reply, 4)
    assert update.num_examples is None and update.train_loss is None
    np.testing.assert_array_equal(update.delta[0], np.ones(3, np.float32))


def test_query_reply_names_the_partition() -> None:
    msg = codec.query_message(9)
    assert codec.decode_query_reply(codec.query_reply(msg, partition_id=3, num_partitions=10)) == (3, 10)


def test_one_metrics_encoder_for_plain_and_secagg_replies_drops_non_finite_losses() -> None:
    # D7: the SecAgg masked reply used to send a non-finite train-loss that the plain reply filtered out;
    # both now go through codec.metrics_record
    import math

    from flwr.app import RecordDict

    for loss in (math.nan, math.inf):
        upd = ClientUpdate(partition_id=4, delta=(), num_examples=7, train_loss=loss,
                           metrics={"dpsgd_steps": 3.0})
        record = codec.metrics_record(upd)
        assert dict(record) == {"num-examples": 7, "dpsgd-steps": 3.0}
        back = codec.update_metadata(RecordDict({"metrics": record}), 4)
        assert (back.num_examples, back.train_loss, back.metrics) == (7, None, {"dpsgd_steps": 3.0})
    quiet = ClientUpdate(partition_id=1, delta=())  # distributed/local modes disclose nothing
    assert dict(codec.metrics_record(quiet)) == {}
    import inspect

    from clients import secagg_handlers

    assert "codec.metrics_record(" in inspect.getsource(secagg_handlers.masked)


def test_a_rounds_shared_records_decode_once_and_any_change_decodes_again() -> None:
    # Arrange: a round's messages share one config and one arrays record (train_message)
    from flwr.app import Array, ConfigRecord

    weights = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([0.5, -1.0], np.float32)]
    arrays = codec.arrays_to_record(weights)
    config = codec.instructions_record(_instr("central"))
    msgs = [codec.train_message(n, _instr("central"), arrays, config=config) for n in (1, 2)]
    # Act
    i1, w1 = codec.decode_train(msgs[0])
    i2, w2 = codec.decode_train(msgs[1])
    # Assert: the same decoded objects (read-only views), a fresh list each time
    assert i2 is i1 and w2 is not w1 and all(a is b for a, b in zip(w1, w2, strict=True))
    assert not any(w.flags.writeable for w in w2)

    # a value replaced in the shared config record: decoded again
    config["seed"] = 5
    i3, _ = codec.decode_train(msgs[1])
    assert i3.seed == 5 and i3 is not i1
    # an array's bytes replaced: decoded again
    arrays["1"] = codec.arrays_to_record([np.array([7.0, 8.0], np.float32)])["0"]
    _, w4 = codec.decode_train(msgs[1])
    np.testing.assert_array_equal(w4[1], [7.0, 8.0])
    # an Array field reassigned in place (same Array object): decoded again
    arr: Array = arrays["1"]
    arr.data = codec.arrays_to_record([np.array([9.0, 1.0], np.float32)])["0"].data
    _, w5 = codec.decode_train(msgs[1])
    np.testing.assert_array_equal(w5[1], [9.0, 1.0])
    # a record with a mutable value (a list) is never memoised: decoded afresh every time
    listy = ConfigRecord({**dict(config.items()), "extra": [1, 2]})
    m = codec.train_message(3, _instr("central"), arrays, config=listy)
    assert codec.decode_train(m)[0] is not codec.decode_train(m)[0]
