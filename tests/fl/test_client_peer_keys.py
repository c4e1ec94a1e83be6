"""A server that substitutes a peer's advertised keys, against the real ClientApp handlers on the
in-process engine (real crypto, real files).

Each node has a long-term Ed25519 key (``client-identity-key``); with ``client-peer-directory`` it checks
the roster against the operator's directory, without one it pins each peer's key on first use beside its
durable memory (``client-memory-dir``). The adversary rewrites the share request node 0 receives: node 1's
keys replaced by the server's own. Node 0 refuses the round (a dropout: it shares nothing); the honest run
completes with every node in the sum.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import Message, RecordDict
from flwr.clientapp import ClientApp

from clients import client_app as real
from fedprivacy.secagg.client_session import ClientSession
from fedprivacy.secagg.messages import ProtocolViolation
from fedprivacy.secagg.peers import PeerAuth, generate_identity
from fedprivacy_flwr.secagg_records import from_records, to_records
from server.engine import run_inprocess

REPO = Path(__file__).resolve().parents[2]
BASE = {"num-server-rounds": 1, "accountant": "rdp", "client-timeout": 120.0, "local-epochs": 1,
        "privacy": "distributed", "secagg": True, "noise-multiplier": 1.0, "clip-norm": 1.0,
        "target-delta": 1e-3, "max-failed-fraction": 1.0, "seed": -1}
NODES = 5


def _identities(tmp_path: Path) -> tuple[dict[int, str], str]:
    keys = {pid: tmp_path / f"id-{pid}.pem" for pid in range(NODES)}
    directory = {str(pid): generate_identity(p).hex() for pid, p in keys.items()}
    (tmp_path / "peers.json").write_text(json.dumps(directory))
    return {pid: str(p) for pid, p in keys.items()}, str(tmp_path / "peers.json")


def _substituted(msg: Message, seen: dict[str, Any], *, forge: bool) -> Message:
    """The share request with node 1's advertised keys replaced by fresh ones the server holds (``forge``:
    signed by a long-term key of the server's own, over the round's real setup and run)."""
    request = from_records(msg.content, stage="share")
    fake = ClientSession(node_id=1, setup=seen["setup"]).advertise_keys()
    if forge:
        fake = PeerAuth(Ed25519PrivateKey.generate(), directory={}).sign(fake, run_id=seen["run"],
                                                                         setup=seen["setup"])
    at = request.node_ids.index(1)
    cols = {name: list(getattr(request, name)) for name in (
        "enc_publics", "mask_publics", "sign_publics", "identity_publics", "identity_signatures")}
    for name, value in (("enc_publics", fake.enc_public), ("mask_publics", fake.mask_public),
                        ("sign_publics", fake.sign_public)):
        cols[name][at] = value
    if forge:
        cols["identity_publics"][at], cols["identity_signatures"][at] = fake.identity_public, fake.identity_signature
    content = {**dict(msg.content.items()), **to_records("share", dataclasses.replace(request, **cols))}
    return Message(RecordDict(content), dst_node_id=msg.metadata.dst_node_id,
                   message_type=msg.metadata.message_type, group_id=msg.metadata.group_id)


def _app(tmp_path: Path, *, directory: str, attack: str, seen: dict[str, Any]) -> ClientApp:
    """The real handlers; ``attack`` ("", "swap" or "forge"): node 0's share request is rewritten."""
    keys = {pid: str(tmp_path / f"id-{pid}.pem") for pid in range(NODES)}

    def wrap(stage: str | None, handler):
        def run(msg: Message, context):
            pid = int(context.node_config["partition-id"])
            context.node_config = {**context.node_config, "client-identity-key": keys[pid],
                                   "client-peer-directory": directory,
                                   "client-memory-dir": str(tmp_path / "memory")}
            if stage == "advertise" and pid == 1:
                seen["setup"], seen["run"] = from_records(msg.content, stage="advertise"), int(context.run_id)
            if stage == "share" and pid == 0 and attack:
                msg = _substituted(msg, seen, forge=attack == "forge")
                try:
                    return handler(msg, context)
                except ProtocolViolation as exc:
                    seen["refused"] = str(exc)
                    raise
            reply = handler(msg, context)
            if stage == "share":
                seen.setdefault("shared", set()).add(pid)
            return reply
        return run

    app = ClientApp()
    app.query()(wrap(None, real.query))
    app.query("secagg_advertise")(wrap("advertise", real.secagg_advertise))
    app.query("secagg_share")(wrap("share", real.secagg_share))
    app.train("secagg_masked")(wrap(None, real.secagg_masked))
    app.query("secagg_consistency")(wrap(None, real.secagg_consistency))
    app.query("secagg_unmask")(wrap(None, real.secagg_unmask))
    return app


def _run(tmp_path: Path, app: ClientApp, name: str) -> dict[str, Any]:
    run_inprocess(run_config={**BASE, "output-dir": str(tmp_path / "out"), "run-name": name},
                  num_supernodes=NODES, app_dir=REPO, node_id_seed=1, client_app=app)
    return json.loads((tmp_path / "out" / name / "results.json").read_text())


def test_with_a_directory_the_honest_round_completes_and_a_substitution_is_refused(tmp_path: Path) -> None:
    _, directory = _identities(tmp_path)
    seen: dict[str, Any] = {}
    res = _run(tmp_path, _app(tmp_path, directory=directory, attack="", seen=seen), "honest")
    assert res["status"] == "completed" and seen["shared"] == set(range(NODES))
    seen = {}
    _run(tmp_path, _app(tmp_path, directory=directory, attack="swap", seen=seen), "attacked")
    assert "peer 1's advertised keys are not signed by its long-term key" in seen["refused"]
    assert 0 not in seen["shared"]  # the victim shared nothing: a dropout to the server


def test_without_a_directory_a_substitution_after_first_contact_is_refused(tmp_path: Path) -> None:
    _identities(tmp_path)
    seen: dict[str, Any] = {}
    res = _run(tmp_path, _app(tmp_path, directory="", attack="", seen=seen), "first-contact")
    assert res["status"] == "completed"
    pins = json.loads((tmp_path / "memory" / "partition-0.peers.json").read_text())
    assert sorted(map(int, pins)) == [1, 2, 3, 4]  # every peer pinned on first use, beside its memory
    seen = {}
    _run(tmp_path, _app(tmp_path, directory="", attack="forge", seen=seen), "substituted")
    assert "peer 1's long-term key is not the one pinned" in seen["refused"]
    assert 0 not in seen["shared"]
