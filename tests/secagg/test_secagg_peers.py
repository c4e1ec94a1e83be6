"""A server that substitutes peers' advertised keys, against clients with long-term identities.

Real crypto throughout: each client has a long-term Ed25519 key (:mod:`fedprivacy.secagg.peers`), signs
its advertisement, and checks the roster (stage 2) against the operator's directory or its pins. The
server here relays the roster it likes: a peer's keys replaced by its own (key substitution), an
advertisement of another round, run or setup (replay), a missing signature, a peer outside the
directory. Each is refused before the victim shares anything; the honest round gives the exact sum.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedprivacy.secagg.client_session import ClientSession
from fedprivacy.secagg.messages import (
    AdvertiseKeys,
    ProtocolViolation,
    SetupRequest,
    ShareKeysRequest,
)
from fedprivacy.secagg.peers import (
    FilePinStore,
    PeerAuth,
    generate_identity,
    load_directory,
    load_identity,
    own_identity,
)
from fedprivacy.secagg.server_session import ServerSession

RUN = 7
IDS = [10, 11, 12, 13, 14]
VICTIM, IMPERSONATED = 10, 11


def _setup(round_: int = 3) -> SetupRequest:
    return SetupRequest(round=round_, threshold=3, degree=4, dim=8, active=True, min_survivors=3)


def _identities(tmp_path: Path) -> tuple[dict[int, Path], Path]:
    """Each client's key file (its own) and the operator's directory of their public keys."""
    keys = {i: tmp_path / f"id-{i}.pem" for i in IDS}
    directory = {str(i): generate_identity(p).hex() for i, p in keys.items()}
    (tmp_path / "peers.json").write_text(json.dumps(directory))
    return keys, tmp_path / "peers.json"


def _auth(tmp_path: Path, *, tofu: bool) -> dict[int, PeerAuth]:
    keys, directory = _identities(tmp_path)
    return {i: PeerAuth.from_paths(identity=str(p), directory="" if tofu else str(directory),
                                   pins=tmp_path / f"pins-{i}.json") for i, p in keys.items()}  # type: ignore[misc]


def _advertise(setup: SetupRequest, auth: dict[int, PeerAuth], *, run: int = RUN
               ) -> tuple[dict[int, ClientSession], list[AdvertiseKeys]]:
    clients = {i: ClientSession(node_id=i, setup=setup) for i in IDS}
    return clients, [auth[i].sign(c.advertise_keys(), run_id=run, setup=setup) for i, c in clients.items()]


def _share(clients, auth, roster: ShareKeysRequest, setup: SetupRequest, node: int):
    auth[node].check_roster(roster, node_id=node, run_id=RUN, setup=setup)
    return clients[node].share_keys(roster)


def _substitute(roster: ShareKeysRequest, node: int, **columns: bytes) -> ShareKeysRequest:
    at = roster.node_ids.index(node)
    changed = {}
    for name, value in columns.items():
        col = list(getattr(roster, name))
        col[at] = value
        changed[name] = col
    return dataclasses.replace(roster, **changed)


def _attacker_ad(setup: SetupRequest) -> AdvertiseKeys:
    """The server's own fresh keys for the impersonated node (it knows their private halves)."""
    return ClientSession(node_id=IMPERSONATED, setup=setup).advertise_keys()


def test_the_honest_round_with_a_directory_gives_the_exact_sum(tmp_path: Path) -> None:
    setup, auth = _setup(), _auth(tmp_path, tofu=False)
    clients, ads = _advertise(setup, auth)
    server = ServerSession(setup)
    roster = server.receive_keys(ads)
    assert len(roster.identity_signatures) == len(IDS)  # the server relays every signature
    reqs = server.receive_shares([_share(clients, auth, roster, setup, i) for i in IDS])
    rng = np.random.default_rng(0)
    inputs = {i: rng.integers(0, 2**32, size=8, dtype=np.uint64).astype(np.uint32) for i in IDS}
    nxt = server.receive_masked([clients[i].masked_input(r, inputs[i]) for i, r in reqs.items()])
    nxt = server.receive_consistency([clients[i].sign_view(r) for i, r in nxt.items()])
    total = server.receive_unmask([clients[i].unmask(r) for i, r in nxt.items()])
    expected = np.sum([inputs[i].astype(np.uint64) for i in IDS], axis=0) % 2**32
    np.testing.assert_array_equal(total, expected.astype(np.uint32))


@pytest.mark.parametrize("tofu", [False, True], ids=["directory", "tofu-after-first-contact"])
def test_a_substituted_key_is_refused(tmp_path: Path, tofu: bool) -> None:
    auth = _auth(tmp_path, tofu=tofu)
    if tofu:  # first contact: an honest round pins every peer's long-term key
        setup0 = _setup(round_=2)
        clients, ads = _advertise(setup0, auth)
        roster = ServerSession(setup0).receive_keys(ads)
        for i in IDS:
            _share(clients, auth, roster, setup0, i)
        assert set(FilePinStore(tmp_path / f"pins-{VICTIM}.json").pins()) == set(IDS) - {VICTIM}
    setup = _setup()
    clients, ads = _advertise(setup, auth)
    roster = ServerSession(setup).receive_keys(ads)
    fake = _attacker_ad(setup)
    # (a) the server's keys under the peer's own signature
    swapped = _substitute(roster, IMPERSONATED, enc_publics=fake.enc_public, mask_publics=fake.mask_public,
                          sign_publics=fake.sign_public, seed_commitments=fake.seed_commitment)
    with pytest.raises(ProtocolViolation, match="not signed by its long-term key"):
        _share(clients, auth, swapped, setup, VICTIM)
    # (b) the server's keys signed by a long-term key of its own
    mallory = Ed25519PrivateKey.generate()
    forged = PeerAuth(mallory, pins=FilePinStore(tmp_path / "mallory.json")).sign(fake, run_id=RUN, setup=setup)
    swapped = _substitute(swapped, IMPERSONATED, identity_publics=forged.identity_public,
                          identity_signatures=forged.identity_signature)
    with pytest.raises(ProtocolViolation, match="not the one (in the directory|pinned)"):
        _share(clients, auth, swapped, setup, VICTIM)
    # (c) no signature at all
    bare = dataclasses.replace(roster, identity_publics=[], identity_signatures=[])
    with pytest.raises(ProtocolViolation, match="no long-term signature"):
        _share(clients, auth, bare, setup, VICTIM)
    # the victim shared nothing, and the untouched roster still goes through
    assert clients[VICTIM].stage == "ADVERTISED"
    _share(clients, auth, roster, setup, VICTIM)
    assert clients[VICTIM].stage == "SHARED"
    # negative control: a session that trusts the relay seals its shares to the server's key
    trusting = ClientSession(node_id=VICTIM, setup=setup)
    ads[0] = trusting.advertise_keys()
    relayed = _substitute(ServerSession(setup).receive_keys(ads), IMPERSONATED, enc_publics=fake.enc_public,
                          mask_publics=fake.mask_public, sign_publics=fake.sign_public,
                          seed_commitments=fake.seed_commitment)
    assert IMPERSONATED in trusting.share_keys(relayed).receivers


def test_a_replayed_signature_from_another_round_run_or_setup_is_refused(tmp_path: Path) -> None:
    auth = _auth(tmp_path, tofu=False)
    setup = _setup()
    clients, ads = _advertise(setup, auth)
    roster = ServerSession(setup).receive_keys(ads)
    # the impersonated peer's advertisement (keys and long-term signature) of another round, run, setup;
    # the server knows these keys' private halves when it ran a colluding session of that round
    for other_setup, run in ((_setup(round_=2), RUN), (setup, RUN + 1),
                             (dataclasses.replace(setup, threshold=4), RUN)):
        old = auth[IMPERSONATED].sign(ClientSession(node_id=IMPERSONATED, setup=other_setup).advertise_keys(),
                                      run_id=run, setup=other_setup)
        replayed = _substitute(roster, IMPERSONATED, enc_publics=old.enc_public, mask_publics=old.mask_public,
                               sign_publics=old.sign_public, seed_commitments=old.seed_commitment,
                               identity_publics=old.identity_public, identity_signatures=old.identity_signature)
        with pytest.raises(ProtocolViolation, match="not signed by its long-term key"):
            _share(clients, auth, replayed, setup, VICTIM)
    assert clients[VICTIM].stage == "ADVERTISED"


def test_a_peer_outside_the_directory_or_a_changed_own_key_is_refused(tmp_path: Path) -> None:
    auth = _auth(tmp_path, tofu=False)
    setup = _setup()
    clients, ads = _advertise(setup, auth)
    directory = load_directory(tmp_path / "peers.json")
    del directory[IMPERSONATED]
    narrow = PeerAuth(load_identity(tmp_path / f"id-{VICTIM}.pem"), directory=directory)
    roster = ServerSession(setup).receive_keys(ads)
    with pytest.raises(ProtocolViolation, match="not in the peer directory"):
        narrow.check_roster(roster, node_id=VICTIM, run_id=RUN, setup=setup)
    directory[IMPERSONATED] = directory[VICTIM] = directory[12]
    with pytest.raises(ProtocolViolation, match="on record for this client"):
        PeerAuth(narrow.identity, directory=directory).check_roster(roster, node_id=VICTIM, run_id=RUN,
                                                                    setup=setup)


def test_pins_are_durable_and_a_damaged_pin_file_is_refused(tmp_path: Path) -> None:
    store = FilePinStore(tmp_path / "pins.json")
    assert store.pins() == {}
    store.pin({3: b"\x01" * 32})
    store.pin({4: b"\x02" * 32})
    assert FilePinStore(tmp_path / "pins.json").pins() == {3: b"\x01" * 32, 4: b"\x02" * 32}
    (tmp_path / "pins.json").write_text((tmp_path / "pins.json").read_text()[:-5])  # truncated
    with pytest.raises(ValueError, match="unreadable, refusing"):
        store.pins()


def test_unreadable_key_files_are_refused_with_the_key_named(tmp_path: Path) -> None:
    (tmp_path / "bad.pem").write_text("not a key")
    with pytest.raises(ValueError, match=r"^client-identity-key: cannot read"):
        PeerAuth.from_paths(identity=str(tmp_path / "bad.pem"), directory="", pins=tmp_path / "p.json")
    generate_identity(tmp_path / "ok.pem")
    with pytest.raises(ValueError, match=r"^client-peer-directory: cannot read"):
        PeerAuth.from_paths(identity=str(tmp_path / "ok.pem"), directory=str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="needs client-identity-key"):
        PeerAuth.from_paths(identity="", directory=str(tmp_path / "missing.json"))
    assert PeerAuth.from_paths(identity="") is None  # neither: peers as the server relays them


def test_a_nodes_own_identity_is_made_once_owner_only_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    # Arrange: no key file yet, in a directory that does not exist either
    path = tmp_path / "memory" / "partition-3.identity.pem"
    # Act: two loads (two processes of one node, or two runs)
    first, second = own_identity(path), own_identity(path)
    # Assert: one key, owner-only, no temporary file left beside it; a truncated file is refused, not replaced
    assert first.public_key().public_bytes_raw() == second.public_key().public_bytes_raw()
    assert path.stat().st_mode & 0o777 == 0o600 and [p.name for p in path.parent.iterdir()] == [path.name]
    with pytest.raises(FileExistsError):
        generate_identity(path)  # an existing key is never overwritten
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(ValueError, match=r"^client-identity-key: cannot read .* refusing"):
        own_identity(path)
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(ValueError, match=r"^client-identity-key: cannot create"):
        own_identity(blocked / "partition-0.identity.pem")


def test_pinning_refuses_an_unsigned_peer_and_trusts_only_what_first_contact_showed(tmp_path: Path) -> None:
    auth = _auth(tmp_path, tofu=True)
    setup = _setup()
    _, ads = _advertise(setup, auth)
    # a peer that opted out (client-peer-auth = "relay") signs nothing: a pinning client refuses the roster
    ads[1] = _attacker_ad(setup)  # (its own fresh keys, unsigned)
    with pytest.raises(ProtocolViolation, match=f"peer {IMPERSONATED}'s advertised keys are not signed"):
        auth[VICTIM].check_roster(ServerSession(setup).receive_keys(ads), node_id=VICTIM, run_id=RUN, setup=setup)
    # the limit of trust on first use: a server that substitutes a key at first contact gets it pinned
    fake = _attacker_ad(setup)
    mallory = PeerAuth(Ed25519PrivateKey.generate(), pins=FilePinStore(tmp_path / "mallory.json"))
    ads[1] = mallory.sign(fake, run_id=RUN, setup=setup)
    auth[VICTIM].check_roster(ServerSession(setup).receive_keys(ads), node_id=VICTIM, run_id=RUN, setup=setup)
    assert FilePinStore(tmp_path / f"pins-{VICTIM}.json").pins()[IMPERSONATED] == mallory.public


def _pin_many(path: str, start: int) -> None:
    store = FilePinStore(path)
    for node in range(start, start + 40):
        store.pin({node: bytes([node % 256]) * 32})


def test_two_processes_of_one_node_pinning_at_once_lose_no_pin(tmp_path: Path) -> None:
    import multiprocessing

    from fedprivacy.secagg.messages import ProtocolViolation

    # Arrange: two processes of one node, each pinning 40 peers of its own into the same file
    path = str(tmp_path / "pins.json")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_pin_many, args=(path, start)) for start in (0, 1000)]
    # Act
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    # Assert: every pin of both is there, no temporary file is left, and a changed key is refused
    assert [p.exitcode for p in procs] == [0, 0]
    pins = FilePinStore(path).pins()
    assert set(pins) == set(range(40)) | set(range(1000, 1040))
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(ProtocolViolation, match="pinned to other keys"):
        FilePinStore(path).pin({3: b"\xff" * 32})
    assert FilePinStore(path).pins()[3] == bytes([3]) * 32
