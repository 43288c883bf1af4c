"""Signed, length-framed messages: they round-trip, a tampered or misattributed frame is refused
and names the member, an oversized one is refused before it is parsed."""

from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mechanisms.secagg import messages as m
from mechanisms.secagg.masks import MaskKey, session_id
from mechanisms.secagg.shamir import combine, split

SESSION = session_id(b"genesis", 3)
N = 4


@pytest.fixture(scope="module")
def signers():
    keys = [Ed25519PrivateKey.generate() for _ in range(N)]
    return keys, {i: k.public_key() for i, k in enumerate(keys)}


def test_keys_round_trip_and_a_wrong_signer_is_named(signers):
    keys, publics = signers
    mask_key, cipher_key = MaskKey.generate(), MaskKey.generate()
    raw = m.keys_message(SESSION, 2, mask_key.public, cipher_key.public, keys[2])
    assert m.read_keys(m.open_frame(raw, m.Kind.KEYS, SESSION, publics)) == (mask_key.public, cipher_key.public)
    forged = m.keys_message(SESSION, 2, mask_key.public, cipher_key.public, keys[1])  # 1 signs as 2
    with pytest.raises(m.BadMessage) as err:
        m.open_frame(forged, m.Kind.KEYS, SESSION, publics)
    assert err.value.member == 2
    with pytest.raises(m.BadMessage):
        m.open_frame(raw, m.Kind.KEYS, session_id(b"genesis", 4), publics)  # replayed in another round


def test_dealt_shares_open_for_their_holder_and_a_tampered_share_names_its_dealer(signers):
    keys, publics = signers
    dealer, holder = 0, 3
    ciphers = [MaskKey.generate() for _ in range(N)]
    secret = os.urandom(32)
    shares = split(secret, 3, N)
    frames = (
        m.share_message(SESSION, dealer, holder, m.Secret.SELF_SEED, shares[holder], keys[dealer]),
        m.share_message(SESSION, dealer, holder, m.Secret.MASK_KEY, shares[holder], keys[dealer]),
    )
    sealed = m.seal_shares(
        SESSION, dealer, holder, ciphers[dealer].private, ciphers[holder].public, frames, os.urandom(12)
    )
    raw = m.dealing_message(SESSION, dealer, b"\x00" * 32, {holder: sealed}, keys[dealer])
    digest, dealt = m.read_dealing(m.open_frame(raw, m.Kind.DEALING, SESSION, publics))
    opened = m.open_shares(dealt[holder], SESSION, dealer, holder, ciphers[holder].private, ciphers[dealer].public)
    assert opened == frames
    share = m.read_share(opened[0], SESSION, publics)
    assert (share.dealer, share.holder, share.secret, share.share) == (
        dealer,
        holder,
        m.Secret.SELF_SEED,
        shares[holder],
    )
    # a holder (or anyone) that alters a share before revealing it: the dealer's signature fails
    tampered = bytearray(opened[0])
    tampered[-m.SIGNATURE_BYTES - 1] ^= 1  # last byte of y
    with pytest.raises(m.BadMessage) as err:
        m.read_share(bytes(tampered), SESSION, publics)
    assert err.value.member == dealer
    # revealed shares reconstruct the secret
    others = [
        m.read_share(m.share_message(SESSION, dealer, h, m.Secret.SELF_SEED, shares[h], keys[dealer]), SESSION, publics)
        for h in (1, 2)
    ]
    assert combine([share.share] + [o.share for o in others], 3) == secret
    with pytest.raises(m.BadMessage) as err:  # another holder cannot open it
        m.open_shares(dealt[holder], SESSION, dealer, 2, ciphers[2].private, ciphers[dealer].public)
    assert err.value.member == dealer


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
    with pytest.raises(m.BadMessage, match="over the KEYS bound"):
        m.open_frame(raw, m.Kind.KEYS, SESSION, publics)  # refused on its size alone
    with pytest.raises(m.BadMessage):
        m.open_frame(raw[:-1], m.Kind.MASKED, SESSION, publics)  # length field disagrees


def test_reveal_carries_dealer_signed_shares(signers):
    keys, publics = signers
    shares = split(os.urandom(32), 2, N)
    frames = [m.share_message(SESSION, d, 0, m.Secret.MASK_KEY, shares[0], keys[d]) for d in (1, 2)]
    raw = m.reveal_message(SESSION, 0, frames, keys[0])
    revealed = m.read_reveal(m.open_frame(raw, m.Kind.REVEAL, SESSION, publics))
    assert [m.read_share(f, SESSION, publics).dealer for f in revealed] == [1, 2]
