"""Batch key derivation and sealing give exactly what the single-item functions give."""

from __future__ import annotations

import pytest

from fedprivacy.secagg.keys import (
    KeyPair,
    SealError,
    context_bytes,
    derive_key,
    derive_keys,
    load_private,
    open_many,
    open_sealed,
    seal,
    seal_many,
)


def _peers(k: int) -> tuple[list[KeyPair], list[bytes]]:
    pairs = [KeyPair.generate() for _ in range(k)]
    ctxs = [context_bytes(round=3, sender=0, receiver=i + 1) for i in range(k)]
    return pairs, ctxs


def test_derive_keys_equals_derive_key_item_by_item_and_both_ends_agree() -> None:
    me = KeyPair.generate()
    pairs, ctxs = _peers(7)
    got = derive_keys(load_private(me.private), [p.public for p in pairs], purpose="mask", contexts=ctxs)
    assert got == [derive_key(me.private, p.public, purpose="mask", context=c)
                   for p, c in zip(pairs, ctxs, strict=True)]
    assert got == [derive_key(p.private, me.public, purpose="mask", context=c)
                   for p, c in zip(pairs, ctxs, strict=True)]
    assert len(set(got)) == 7


def test_derive_keys_names_the_bad_peer() -> None:
    me = KeyPair.generate()
    pairs, ctxs = _peers(3)
    pubs = [p.public for p in pairs]
    with pytest.raises(ValueError, match=r"peer_publics\[1\]"):
        derive_keys(me.private, [pubs[0], bytes(32), pubs[2]], purpose="mask", contexts=ctxs)  # low order
    with pytest.raises(ValueError, match=r"peer_publics\[2\].*32 bytes"):
        derive_keys(me.private, [pubs[0], pubs[1], b"short"], purpose="mask", contexts=ctxs)
    with pytest.raises(ValueError, match="one length"):
        derive_keys(me.private, pubs, purpose="mask", contexts=ctxs[:2])


def test_seal_many_and_open_many_interoperate_with_the_single_forms() -> None:
    keys = [KeyPair.generate().public for _ in range(5)]  # any 32-byte keys
    _, ctxs = _peers(5)
    pts = [bytes([i]) * (10 + i) for i in range(5)]
    sealed = seal_many(keys, pts, purpose="share-seal", contexts=ctxs)
    assert [open_sealed(k, c, purpose="share-seal", context=x)
            for k, c, x in zip(keys, sealed, ctxs, strict=True)] == pts
    single = [seal(k, p, purpose="share-seal", context=x) for k, p, x in zip(keys, pts, ctxs, strict=True)]
    assert open_many(keys, single, purpose="share-seal", contexts=ctxs) == pts
    assert len({c[:12] for c in sealed}) == 5  # a fresh nonce per message


def test_open_many_names_the_first_failing_ciphertext_and_binds_the_context() -> None:
    keys = [KeyPair.generate().public for _ in range(3)]
    _, ctxs = _peers(3)
    sealed = seal_many(keys, [b"a", b"b", b"c"], purpose="share-seal", contexts=ctxs)
    tampered = [sealed[0], sealed[1][:-1] + bytes([sealed[1][-1] ^ 1]), sealed[2]]
    with pytest.raises(SealError, match=r"sealed\[1\]"):
        open_many(keys, tampered, purpose="share-seal", contexts=ctxs)
    with pytest.raises(SealError, match=r"sealed\[0\]"):
        open_many(keys, sealed, purpose="share-seal", contexts=[ctxs[1], ctxs[1], ctxs[2]])
    with pytest.raises(SealError, match=r"sealed\[2\].*too short"):
        open_many(keys, [sealed[0], sealed[1], b"x"], purpose="share-seal", contexts=ctxs)
    with pytest.raises(SealError):
        open_many(keys, sealed, purpose="mask", contexts=ctxs)  # another purpose label
