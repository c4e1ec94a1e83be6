"""The client's floor against the real ClientApp: a server that tampers with its instructions gets a
refusal or the client's own floor, whatever the run config says (the server chooses that too)."""

from __future__ import annotations

import dataclasses
import itertools
import os

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from clients.client_app import train
from fedprivacy.config import RunConfig
from fedprivacy.fl.client_policy import PolicyRefusal
from fedprivacy.fl.types import RoundInstructions
from fedprivacy_flwr import codec
from server.engine._flwr_private import TaskIdentityScope

CFG = RunConfig(privacy="local", secagg=False, clip_norm=0.5, noise_multiplier=1.0, model="mlp")


@pytest.fixture(autouse=True)
def _task_identity():
    with TaskIdentityScope(1):  # Flower messages need a run id, as inside an engine
        yield


_NODES = itertools.count()


def _context(**client_keys: object) -> Context:
    """A node of its own: its own durable memory (in this test's directory, :mod:`tests.conftest`)."""
    own = os.path.join(os.environ["FEDPRIVACY_CLIENT_MEMORY_DIR"], f"node-{next(_NODES)}")
    return Context(run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 3,
                                                     "client-memory-dir": own, **client_keys},
                   state=RecordDict(), run_config=CFG.to_mapping())


def _weights() -> list[np.ndarray]:
    from fedprivacy.fl.task import default_hooks

    return [np.asarray(w) for w in default_hooks(CFG, population=3).init(0)]


def _message(**changes: object):
    instr = RoundInstructions(round=1, privacy="local", clip_norm=0.5, client_mechanism="gaussian", noise_multiplier=1.0, private=True, learning_rate=0.1,
                              local_epochs=1, batch_size=32, num_classes=10, seed=-1)
    instr = dataclasses.replace(instr, **changes)
    return codec.train_message(7, instr, codec.arrays_to_record(_weights())), instr


def _released(reply) -> np.ndarray:
    update = codec.decode_train_reply(reply, 0)
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in update.delta])


def test_local_mode_noise_is_the_clients_own_when_the_server_asks_for_almost_none() -> None:
    # item 4: the server asks for std 1e-12; with no client-* keys the client's code default applies:
    # z = max(requested, 0.5, sqrt(2 / max_rho = 2)) = 1, so std = z C = 0.5
    msg, _ = _message(noise_multiplier=2e-12)
    released = _released(train(msg, _context()))
    assert released.size > 2_000
    assert 0.45 < float(np.std(released)) < 0.55  # the update itself is clipped to norm 0.5: tiny per coordinate
    # an operator who asks for more noise gets it
    msg, _ = _message(noise_multiplier=2e-12)
    released = _released(train(msg, _context(**{"client-min-noise-multiplier": 3.0})))
    assert 1.35 < float(np.std(released)) < 1.65


@pytest.mark.parametrize("changes, reason", [
    ({"seed": 0}, "client-allow-seeded"),  # item 2: server-seeded noise would be removable
    ({"privacy": "central"}, "client-privacy-modes"),  # item 4: the raw clipped update
    ({"privacy": "none"}, "client-privacy-modes"),
])
def test_requests_outside_the_floor_are_refused(changes: dict, reason: str) -> None:
    msg, _ = _message(**changes)
    with pytest.raises(PolicyRefusal, match=reason):
        train(msg, _context())


def test_metrics_are_disclosed_only_when_the_client_allows_it() -> None:
    # item 4: a trusted-server mode the operator allowed (its update leaves un-noised: rho = inf, so
    # the operator also lifts the total), but no metric disclosure configured
    trusted = {"client-privacy-modes": "none", "client-max-rho-total": "inf"}
    msg, _ = _message(privacy="none", client_mechanism="", noise_multiplier=0.0, private=False)
    update = codec.decode_train_reply(train(msg, _context(**trusted)), 0)
    assert update.num_examples is None and update.train_loss is None
    msg, _ = _message(privacy="none", client_mechanism="", noise_multiplier=0.0, private=False)
    update = codec.decode_train_reply(train(msg, _context(**trusted, **{"client-disclose": "num-examples"})), 0)
    assert update.num_examples is not None and update.train_loss is None


@pytest.mark.parametrize("floor", [{}, {"client-privacy-modes": "distributed"}])
def test_a_distributed_round_on_the_plain_train_path_is_refused(floor: dict) -> None:
    # a server that skips the secagg stages and sends the plain train message with
    # privacy="distributed" would read the clipped update itself (no noise is added on this path);
    # whatever the floor admits, the client refuses before it trains
    msg, _ = _message(privacy="distributed", client_mechanism="xnoise")
    with pytest.raises(PolicyRefusal, match="plain train path"):
        train(msg, _context(**floor))
    # nor may it relabel the round: distributed's mechanism is xnoise in the client's own registry
    for mechanism in ("", "gaussian"):
        msg, _ = _message(privacy="distributed", client_mechanism=mechanism)
        with pytest.raises(PolicyRefusal, match="that mode's is 'xnoise'"):
            train(msg, _context(**floor))
    # local mode on the same path still works (the client adds its own noise)
    msg, _ = _message(privacy="local")
    assert _released(train(msg, _context())).size > 2_000


def test_a_client_takes_part_in_a_round_once_on_the_plain_path() -> None:
    # a server that sends local-mode round 1 again and again would average the client's
    # fresh noise away (40 replies: noise std / sqrt(40)); the node's round record refuses a repeat
    from fedprivacy.secagg.messages import ProtocolViolation

    ctx = _context()
    msg, _ = _message(privacy="local", round=1)
    first = _released(train(msg, ctx))
    with pytest.raises(ProtocolViolation, match="twice"):
        train(msg, ctx)
    msg2, _ = _message(privacy="local", round=2)
    assert _released(train(msg2, ctx)).size == first.size
    with pytest.raises(ProtocolViolation, match="twice"):
        train(msg, ctx)  # and no going back
