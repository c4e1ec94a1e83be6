"""A server that substitutes a peer's advertised keys, against the real ClientApp handlers on the
in-process engine (real crypto, real files).

Each node has a long-term Ed25519 key: the operator's (``client-identity-key``) or, by default, one it
makes itself on first use beside its durable memory (``partition-<id>.identity.pem``). With
``client-peer-directory`` it checks the roster against the operator's directory; without one it pins
each peer's key on first use (``partition-<id>.peers.json``). The adversary rewrites the share request
node 0 receives: node 1's keys replaced by the server's own. Node 0 refuses the round (a dropout: it
shares nothing); the honest run completes with every node in the sum. ``client-peer-auth = "relay"``
(the weaker opt-out) is the negative control: node 0 seals its shares to the server's key."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import Message, RecordDict
from flwr.clientapp import ClientApp

from clients import client_app as real
from fedprivacy.fl.client_policy import MEMORY_ENV_VAR, ClientPolicy
from fedprivacy.fl.secure import forget_peer_auth
from fedprivacy.secagg.client_session import ClientSession
from fedprivacy.secagg.peers import PeerAuth, generate_identity, load_identity
from fedprivacy_flwr.secagg_records import from_records, to_records
from server.engine import run_inprocess

REPO = Path(__file__).resolve().parents[2]
BASE = {"num-server-rounds": 1, "accountant": "rdp", "client-timeout": 120.0, "local-epochs": 1,
        "privacy": "distributed", "secagg": True, "noise-multiplier": 1.0, "clip-norm": 1.0,
        "target-delta": 1e-3, "max-failed-fraction": 1.0, "seed": -1}
NODES = 5
#: a world the default floor joins (ClientPolicy: every released sum holds >= 4 inputs, a roster of >= 5)
WORLD = 6


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


def _app(tmp_path: Path, *, directory: str = "", attack: str, seen: dict[str, Any], floor: str = "keys"
         ) -> ClientApp:
    """The real handlers; ``attack`` ("", "swap" or "forge"): node 0's share request is rewritten.
    ``floor``: "keys" (the operator gave each node its key file, and ``directory``), "default" (a
    SuperNode's default floor: the launcher's ``client-*`` keys dropped, so no identity key and the
    memory in the default directory) or "relay" (that, with ``client-peer-auth = "relay"``)."""
    keys = {pid: str(tmp_path / f"id-{pid}.pem") for pid in range(NODES)}

    def configure(context, pid: int) -> None:
        if floor == "keys":
            context.node_config = {**context.node_config, "client-identity-key": keys[pid],
                                   "client-peer-directory": directory,
                                   "client-memory-dir": str(tmp_path / "memory")}
            return
        own = {k: v for k, v in context.node_config.items() if not str(k).startswith("client-")}
        context.node_config = {**own, **({"client-peer-auth": "relay"} if floor == "relay" else {})}

    def wrap(stage: str | None, handler):
        def run(msg: Message, context):
            pid = int(context.node_config["partition-id"])
            configure(context, pid)
            if stage == "advertise" and pid == 1:
                seen["setup"], seen["run"] = from_records(msg.content, stage="advertise"), int(context.run_id)
            if stage == "share" and pid == 0 and attack:
                msg = _substituted(msg, seen, forge=attack == "forge")
            try:
                reply = handler(msg, context)
            except Exception as exc:
                if pid == 0:
                    seen["refused"] = str(exc)
                raise
            if stage == "advertise" and pid == 0:
                seen["identity"] = from_records(reply.content, stage="advertise").identity_public
            if stage == "share":
                seen.setdefault("shared", set()).add(pid)
                if pid == 0:
                    seen["receivers"] = from_records(reply.content, stage="share").receivers
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


def _run(tmp_path: Path, app: ClientApp, name: str, *, nodes: int = NODES) -> dict[str, Any]:
    run_inprocess(run_config={**BASE, "output-dir": str(tmp_path / "out"), "run-name": name},
                  num_supernodes=nodes, app_dir=REPO, node_id_seed=1, client_app=app)
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


def _supernode_memory() -> Path:
    return Path(os.environ[MEMORY_ENV_VAR])  # the default directory (each test's own, tests/conftest.py)


def test_a_default_supernode_pins_its_peers_and_refuses_a_substitution_after_first_contact(
        tmp_path: Path) -> None:
    # Arrange: the default SuperNode floor (no identity key, no directory, no client-peer-auth)
    assert ClientPolicy().identity_key == "" and ClientPolicy().peer_auth == "pin"
    seen: dict[str, Any] = {}
    # Act: an honest first contact, then (the SuperNode restarted) a run whose server substitutes node 1's
    # keys under a long-term key of its own
    res = _run(tmp_path, _app(tmp_path, attack="", seen=seen, floor="default"), "first-contact", nodes=WORLD)
    forget_peer_auth()
    seen = {}
    _run(tmp_path, _app(tmp_path, attack="forge", seen=seen, floor="default"), "substituted", nodes=WORLD)
    # Assert: the honest run completed and pinned every peer; the substitution is refused before node 0
    # shares anything (a dropout to the server)
    assert res["status"] == "completed"
    pins = json.loads((_supernode_memory() / "partition-0.peers.json").read_text())
    assert sorted(map(int, pins)) == list(range(1, WORLD))
    assert "peer 1's long-term key is not the one pinned" in seen["refused"]
    assert 0 not in seen["shared"]


def test_a_supernodes_own_identity_is_made_once_owner_only_and_kept_across_runs(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    _run(tmp_path, _app(tmp_path, attack="", seen=seen, floor="default"), "one", nodes=WORLD)
    path = _supernode_memory() / "partition-0.identity.pem"
    first, stat = path.read_bytes(), path.stat()
    forget_peer_auth()  # a restarted SuperNode reads its key file again
    again: dict[str, Any] = {}
    _run(tmp_path, _app(tmp_path, attack="", seen=again, floor="default"), "two", nodes=WORLD)
    # the file is the node's long-term key, owner-only, and the same file in the next run
    assert stat.st_mode & 0o777 == 0o600
    assert path.read_bytes() == first and path.stat().st_ino == stat.st_ino
    assert seen["identity"] == again["identity"] == load_identity(path).public_key().public_bytes_raw()
    assert sorted(p.name for p in _supernode_memory().glob("partition-0.*")) == [
        "partition-0.identity.pem", "partition-0.jsonl", "partition-0.peers.json",
        "partition-0.peers.json.lock"]  # no temporary left (the pins' lock file stays, empty)


def test_a_damaged_identity_file_is_refused_with_the_key_named(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    _run(tmp_path, _app(tmp_path, attack="", seen=seen, floor="default"), "one", nodes=WORLD)
    path = _supernode_memory() / "partition-0.identity.pem"
    path.write_bytes(path.read_bytes()[:40])  # truncated
    forget_peer_auth()
    seen = {}
    _run(tmp_path, _app(tmp_path, attack="", seen=seen, floor="default"), "two", nodes=WORLD)
    assert seen["refused"].startswith(f"client-identity-key: cannot read an Ed25519 private key from {str(path)!r}")
    assert "\n" not in seen["refused"] and 0 not in seen.get("shared", set())
    assert len(path.read_bytes()) == 40  # never replaced by a fresh key


def test_the_relay_opt_out_trusts_a_substituted_key(tmp_path: Path) -> None:
    # negative control: with client-peer-auth = "relay" node 0 seals its shares to the server's key for node 1
    seen: dict[str, Any] = {}
    _run(tmp_path, _app(tmp_path, attack="", seen=seen, floor="relay"), "first-contact", nodes=WORLD)
    seen = {}
    _run(tmp_path, _app(tmp_path, attack="swap", seen=seen, floor="relay"), "substituted", nodes=WORLD)
    assert seen["identity"] == b"" and "refused" not in seen
    assert 0 in seen["shared"] and 1 in seen["receivers"]
    assert not list(_supernode_memory().glob("partition-*.identity.pem"))  # no identity was made


def test_the_relay_opt_out_is_refused_beside_keys_it_would_ignore() -> None:
    assert ClientPolicy.from_node_config({"client-peer-auth": "relay"}).peer_auth == "relay"
    with pytest.raises(ValueError, match="client-peer-auth = 'relay'.*client-identity-key"):
        ClientPolicy.from_node_config({"client-peer-auth": "relay", "client-identity-key": "id.pem"})
    with pytest.raises(ValueError, match=r"client-peer-auth\) must be one of"):
        ClientPolicy.from_node_config({"client-peer-auth": "tofu"})
