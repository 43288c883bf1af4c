"""Signed, length-framed messages: they round-trip; a tampered, misattributed, truncated or
oversized frame is refused with BadMessage (naming the member where the frame names one) before
anything else is parsed, and never crashes the reader."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mechanisms.secagg import messages as m
from mechanisms.secagg.masks import MaskKey, session_id
from mechanisms.secagg.shamir import PRIME

SESSION = session_id(b"genesis", 3, chain_id=1, ledger=bytes(20))
N = 4


@pytest.fixture(scope="module")
def signers():
    keys = [Ed25519PrivateKey.generate() for _ in range(N)]
    return keys, {i: k.public_key() for i, k in enumerate(keys)}


def opening(dealer: int, holder: int, secret: m.Secret) -> m.Opening:
    return m.Opening(dealer, holder, secret, int.from_bytes(os.urandom(32), "big"), os.urandom(m.SALT_BYTES))


def test_keys_round_trip_and_a_wrong_signer_is_named(signers):
    keys, publics = signers
    mask_key, cipher_key = MaskKey.generate(), MaskKey.generate()
    pairs = tuple(MaskKey.generate().public for _ in range(N))
    raw = m.keys_message(SESSION, 2, mask_key.public, cipher_key.public, pairs, keys[2])
    assert len(raw) == m.keys_frame_size(N)
    opened = m.read_keys(m.open_frame(raw, m.Kind.KEYS, SESSION, publics))
    assert opened == (mask_key.public, cipher_key.public, pairs) and opened.pairs[3] == pairs[3]
    forged = m.keys_message(SESSION, 2, mask_key.public, cipher_key.public, pairs, keys[1])  # 1 signs as 2
    with pytest.raises(m.BadMessage) as err:
        m.open_frame(forged, m.Kind.KEYS, SESSION, publics)
    assert err.value.member == 2
    with pytest.raises(m.BadMessage):
        another_round = session_id(b"genesis", 4, chain_id=1, ledger=bytes(20))
        m.open_frame(raw, m.Kind.KEYS, another_round, publics)  # replayed in another round


def test_sealed_shares_open_for_their_holder_only_and_match_the_public_commitments(signers):
    keys, publics = signers
    dealer, holder = 0, 3
    ciphers = [MaskKey.generate() for _ in range(N)]
    b, s = opening(dealer, holder, m.Secret.SELF_SEED), opening(dealer, holder, m.Secret.MASK_KEY)
    sealed = m.sealed_message(
        SESSION, (b, s), ciphers[dealer].loaded(), ciphers[holder].public, os.urandom(12), keys[0]
    )
    frame = m.open_frame(sealed, m.Kind.SEALED, SESSION, publics)
    assert m.read_sealed(frame, holder, ciphers[holder].loaded(), ciphers[dealer].public) == (b, s)
    with pytest.raises(m.BadMessage) as err:  # another member cannot open it
        m.read_sealed(frame, 2, ciphers[2].loaded(), ciphers[dealer].public)
    assert err.value.member == dealer
    commitments = {h: (b.commitment(SESSION), s.commitment(SESSION)) for h in range(N)}
    raw = m.dealing_message(SESSION, dealer, b"\x01" * 32, commitments, keys[dealer])
    dealing = m.read_dealing(m.open_frame(raw, m.Kind.DEALING, SESSION, publics))
    assert dealing.seed_digest == b"\x01" * 32
    assert dealing.commitment(holder, m.Secret.MASK_KEY) == s.commitment(SESSION)
    # a share changed by one, or its salt, or claimed for another holder, no longer matches
    for other in (
        m.Opening(dealer, holder, b.secret, (b.y + 1) % PRIME, b.salt),
        m.Opening(dealer, holder, b.secret, b.y, bytes(16)),
        m.Opening(dealer, 2, b.secret, b.y, b.salt),
    ):
        assert other.commitment(SESSION) != dealing.commitment(holder, m.Secret.SELF_SEED)


def test_masked_vector_round_trips_and_bad_sizes_are_refused_before_parsing(signers):
    keys, publics = signers
    values = np.random.default_rng(0).integers(0, 2**32, 1000, dtype=np.int64)
    raw = m.masked_message(SESSION, 1, values, 32, keys[1])
    assert len(raw) == m.HEADER.size + 32 + 4 + 5 + 4000 + m.SIGNATURE_BYTES
    frame = m.open_frame(raw, m.Kind.MASKED, SESSION, publics)
    assert np.array_equal(m.read_masked(frame, 32, 1000), values)
    with pytest.raises(m.BadMessage) as err:
        m.read_masked(frame, 32, 999)  # not the round's dimension: named
    assert err.value.member == 1
    with pytest.raises(m.BadMessage, match="over the SEALED bound"):
        m.open_frame(raw, m.Kind.SEALED, SESSION, publics)  # refused on its size alone
    odd = np.random.default_rng(1).integers(0, 2**20, 50, dtype=np.int64)  # 3-byte residues
    frame20 = m.open_frame(m.masked_message(SESSION, 1, odd, 20, keys[1]), m.Kind.MASKED, SESSION, publics)
    assert np.array_equal(m.read_masked(frame20, 20, 50), odd)


def test_reveal_round_trips_and_carries_at_most_one_share_per_dealer(signers):
    keys, publics = signers
    shares = [opening(1, 0, m.Secret.SELF_SEED), opening(2, 0, m.Secret.MASK_KEY)]
    raw = m.reveal_message(SESSION, 0, shares, keys[0])
    assert m.read_reveal(m.open_frame(raw, m.Kind.REVEAL, SESSION, publics)) == shares
    with pytest.raises(ValueError):
        m.reveal_message(SESSION, 0, [shares[0], opening(1, 0, m.Secret.MASK_KEY)], keys[0])  # both of 1
    # a hand-built body naming dealer 1 twice, properly signed: refused and its sender named
    entry = [(1).to_bytes(2, "big") + bytes([k]) + bytes(33) + bytes(16) for k in (1, 2)]
    twice = m.seal_frame(m.Kind.REVEAL, SESSION, 0, (2).to_bytes(2, "big") + b"".join(entry), keys[0])
    with pytest.raises(m.BadMessage) as err:
        m.read_reveal(m.open_frame(twice, m.Kind.REVEAL, SESSION, publics))
    assert err.value.member == 0
    # more openings than the round has dealers: refused before any is parsed
    with pytest.raises(m.BadMessage, match="carries 2 openings, the round has 1 dealers"):
        m.read_reveal(m.open_frame(raw, m.Kind.REVEAL, SESSION, publics), max_openings=1)


def test_a_frames_digest_is_the_sha256_of_its_bytes(signers):
    keys, _ = signers
    raw = m.keys_message(SESSION, 1, bytes(range(32)), bytes(32), (), keys[1])
    assert m.frame_digest(raw) == hashlib.sha256(raw).digest()
    assert m.frame_digest(raw) != m.frame_digest(m.keys_message(SESSION, 1, bytes(32), bytes(32), (), keys[1]))


def test_hostile_bytes_are_refused_without_crashing(signers):
    keys, publics = signers
    rng = np.random.default_rng(5)
    good = {
        m.Kind.KEYS: m.keys_message(SESSION, 1, bytes(32), bytes(32), [bytes(32)] * N, keys[1]),
        m.Kind.DEALING: m.dealing_message(SESSION, 1, bytes(32), {0: (bytes(32), bytes(32))}, keys[1]),
        m.Kind.REVEAL: m.reveal_message(SESSION, 1, [opening(2, 1, m.Secret.SELF_SEED)], keys[1]),
        m.Kind.MASKED: m.masked_message(SESSION, 1, np.arange(10, dtype=np.int64), 32, keys[1]),
        m.Kind.COMPLAINT: m.complaint_message(SESSION, 1, {0: bytes(32), 2: bytes(32)}, keys[1]),
    }
    readers = {
        m.Kind.KEYS: m.read_keys,
        m.Kind.DEALING: m.read_dealing,
        m.Kind.REVEAL: m.read_reveal,
        m.Kind.COMPLAINT: m.read_complaint,
    }
    for kind, raw in good.items():
        hostile = [
            b"",
            raw[:10],
            raw[:-1],  # truncated
            raw + b"\x00",  # trailing byte
            raw[:-1] + bytes([raw[-1] ^ 1]),  # bad signature
            bytes(rng.integers(0, 256, len(raw), dtype=np.uint8)),  # noise of the right size
            raw[:20] + bytes([raw[20] ^ 0x40]) + raw[21:],  # a flipped bit in the session
            m.MAGIC + bytes([kind]) + (2**31).to_bytes(4, "big") + bytes(100),  # a huge length
        ]
        for bad in hostile:
            with pytest.raises(m.BadMessage):
                m.open_frame(bad, kind, SESSION, publics)
    with pytest.raises(m.BadMessage, match="over the REVEAL bound"):
        m.open_frame(bytes(64 * 1024 * 1024), m.Kind.REVEAL, SESSION, publics)  # oversized: size alone
    with pytest.raises(m.BadMessage, match="a frame is bytes"):
        m.open_frame("text", m.Kind.KEYS, SESSION, publics)  # type: ignore[arg-type]
    # well-signed bodies that lie about their own contents: refused by the reader, sender named
    for kind, payload in [
        (m.Kind.KEYS, bytes(63)),
        (m.Kind.KEYS, bytes(64) + (3).to_bytes(2, "big") + bytes(64)),  # counts 3 pair keys, holds 2
        (m.Kind.COMPLAINT, (2).to_bytes(2, "big") + bytes(34)),  # counts 2 dealers, names 1
        (m.Kind.COMPLAINT, (2).to_bytes(2, "big") + (bytes(2) + bytes(32)) * 2),  # dealer 0 twice
        (m.Kind.DEALING, bytes(32) + (5).to_bytes(2, "big") + bytes(66)),  # counts 5 holders, holds 1
        (m.Kind.REVEAL, (1).to_bytes(2, "big") + (2).to_bytes(2, "big") + bytes([9]) + bytes(49)),  # secret 9
        (m.Kind.REVEAL, (1).to_bytes(2, "big") + (2).to_bytes(2, "big") + bytes([1]) + b"\xff" * 33 + bytes(16)),
    ]:
        frame = m.open_frame(m.seal_frame(kind, SESSION, 3, payload, keys[3]), kind, SESSION, publics)
        with pytest.raises(m.BadMessage) as err:
            readers[kind](frame)
        assert err.value.member == 3
    masked = m.open_frame(good[m.Kind.MASKED], m.Kind.MASKED, SESSION, publics)
    with pytest.raises(m.BadMessage):
        m.read_masked(masked, 31, 10)  # another bits
    over = m.seal_frame(m.Kind.MASKED, SESSION, 2, bytes([20]) + (1).to_bytes(4, "big") + b"\xff" * 3, keys[2])
    with pytest.raises(m.BadMessage):  # a residue above 2^20 in a 20-bit round
        m.read_masked(m.open_frame(over, m.Kind.MASKED, SESSION, publics), 20, 1)


def test_a_dealing_bundle_splits_back_and_a_hostile_one_is_named(signers):
    keys, publics = signers
    dealer = 1
    ciphers = [MaskKey.generate() for _ in range(N)]
    sealed = {
        h: m.sealed_message(
            SESSION,
            (opening(dealer, h, m.Secret.SELF_SEED), opening(dealer, h, m.Secret.MASK_KEY)),
            ciphers[dealer].loaded(),
            ciphers[h].public,
            os.urandom(12),
            keys[dealer],
        )
        for h in range(N)
    }
    commitments = {h: (os.urandom(32), os.urandom(32)) for h in range(N)}
    dealing = m.dealing_message(SESSION, dealer, b"\x01" * 32, commitments, keys[dealer])
    bundle = m.dealing_bundle(dealing, sealed)
    assert m.split_bundle(bundle, dealer) == (dealing, sealed)
    m.open_frame(m.split_bundle(bundle, dealer)[0], m.Kind.DEALING, SESSION, publics)
    for hostile in (
        bundle[:-1],  # a SEALED frame cut short
        bundle + sealed[0],  # holder 0 twice
        bundle[: m.HEADER.size],  # a header whose body is missing
        b"\x00" * 3,  # shorter than a header
        b"\xff" * (m.max_bundle_bytes() + 1),
    ):
        with pytest.raises(m.BadMessage) as err:
            m.split_bundle(hostile, dealer)
        assert err.value.member == dealer


def test_a_complaint_round_trips_and_its_size_is_checked_before_it_is_parsed(signers):
    keys, publics = signers
    revealed = {0: os.urandom(32), 3: os.urandom(32)}
    raw = m.complaint_message(SESSION, 2, revealed, keys[2])
    assert m.read_complaint(m.open_frame(raw, m.Kind.COMPLAINT, SESSION, publics)) == revealed
    with pytest.raises(m.BadMessage, match="names 2 dealers, the round has 1"):  # before any is parsed
        m.read_complaint(m.open_frame(raw, m.Kind.COMPLAINT, SESSION, publics), max_dealers=1)
    with pytest.raises(ValueError):
        m.complaint_message(SESSION, 2, {m.MAX_MEMBERS: bytes(32)}, keys[2])
    with pytest.raises(ValueError):
        m.complaint_message(SESSION, 2, {1: bytes(31)}, keys[2])
    # every dealer of the largest round named, and one byte more: refused on its size alone
    largest = m.complaint_message(SESSION, 2, {d: bytes(32) for d in range(m.MAX_MEMBERS)}, keys[2])
    assert len(largest) == m.max_frame_bytes(m.Kind.COMPLAINT)
    m.open_frame(largest, m.Kind.COMPLAINT, SESSION, publics)
    with pytest.raises(m.BadMessage, match="over the COMPLAINT bound"):
        m.open_frame(largest + b"\x00", m.Kind.COMPLAINT, SESSION, publics)


def test_a_keys_frame_covers_at_most_every_member_a_frame_can_address(signers):
    keys, publics = signers
    every = [bytes(32)] * m.MAX_MEMBERS
    raw = m.keys_message(SESSION, 1, bytes(32), bytes(32), every, keys[1])
    assert len(raw) == m.keys_frame_size(m.MAX_MEMBERS) == m.max_frame_bytes(m.Kind.KEYS)
    assert len(m.read_keys(m.open_frame(raw, m.Kind.KEYS, SESSION, publics)).pairs) == m.MAX_MEMBERS
    with pytest.raises(ValueError):
        m.keys_message(SESSION, 1, bytes(32), bytes(32), [*every, bytes(32)], keys[1])
    with pytest.raises(m.BadMessage, match="over the KEYS bound"):
        m.open_frame(raw + bytes(32), m.Kind.KEYS, SESSION, publics)
