"""Complaints against a dealer that seals bad shares (mechanisms.secagg.complaints), in-process
with real keys and frames: the attack that stopped a round naming nobody (bad shares sealed to
floor(n/3) holders, the dealer's own reveal withheld) now finalizes with the dealer named; a
false complaint names its complainer and changes nothing else; a revealed key opens only its own
(holder, dealer) pair; malformed complaints are named, oversized ones before they are parsed.
Also the KEYS frame's pair keys: which frames U1 keeps (`round.covering`) and the low-order
points refused without an agreement each."""

from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from mechanisms.secagg import complaints as c
from mechanisms.secagg import messages as m
from mechanisms.secagg import round as r
from mechanisms.secagg.masks import MaskKey
from mechanisms.secagg.round import RoundFailed
from mechanisms.secagg.shamir import PRIME
from mechanisms.secagg.unmask import RoundArchive, survivors, unmask_round, verify_round
from tests.secagg.harness import Swarm, plain_sum, play

CHEAT = 4


def _bad_seals(swarm: Swarm, victims: dict[int, str]):
    """A SEALED hook: CHEAT seals each victim bad shares, in the way named."""
    session = swarm.setup.session

    def hook(state: r.MemberState, holder: int, keys: r.PublicKeys, frame: bytes) -> bytes:
        if state.index != CHEAT or holder not in victims:
            return frame
        cipher, nonce, how = state.cipher_key.loaded(), os.urandom(12), victims[holder]
        opened = m.open_frame(frame, m.Kind.SEALED, session, swarm.setup.signing)
        if how == "garbage":  # the right size and signature, nothing that decrypts
            body = holder.to_bytes(2, "big") + os.urandom(len(opened.payload) - 2)
            return m.seal_frame(m.Kind.SEALED, session, CHEAT, body, state.signing_key)
        # what it sealed, opened from its own side of the agreement
        b, s = m.read_sealed(opened, holder, cipher, keys.pairs[CHEAT])
        if how == "off commitment":  # sealed properly, one share moved by one
            return m.sealed_message(
                session, (b._replace(y=(b.y + 1) % PRIME), s), cipher, keys.pairs[CHEAT], nonce, state.signing_key
            )
        assert how == "wrong key"  # the right shares, sealed to the holder's dealer key instead of its pair key
        return m.sealed_message(session, (b, s), cipher, keys.cipher, nonce, state.signing_key)

    return hook


VICTIMS = {0: "garbage", 1: "off commitment", 2: "wrong key"}  # floor(9 / 3) = 3 holders of 9


def test_a_dealer_sealing_bad_shares_to_a_third_and_withholding_its_reveal_is_dropped_and_named():
    swarm = Swarm(9)  # t = 6
    drops = {"reveal": {CHEAT}}
    # as before complaints: nobody complains, the dealer masks, and its seed has 5 good shares of 6
    silent = play(
        swarm, drop_before=drops, sealed_hook=_bad_seals(swarm, VICTIMS), complaint_hook=lambda state, frame: None
    )
    with pytest.raises(RoundFailed, match=f"member {CHEAT}: 5 good shares revealed, 6 needed") as failed:
        verify_round(swarm.setup, silent.archive)
    assert failed.value.member is None
    # with the complaints: the three victims complain, the dealer leaves U2 before anyone masks
    played = play(swarm, drop_before=drops, sealed_hook=_bad_seals(swarm, VICTIMS))
    assert set(played.archive.complaints) == set(VICTIMS) and CHEAT not in played.dealt
    result = verify_round(swarm.setup, played.archive)
    assert set(result.faults) == {CHEAT} and "the complaint of member 0 holds" in result.faults[CHEAT]
    assert set(result.survivors) == set(range(9)) - {CHEAT} and result.dropped == ()
    assert np.array_equal(result.total, plain_sum(played))
    # a member unmasks the same from what it holds: U1, U2 as the complaints left it, U3
    setup, archive = swarm.setup, played.archive
    keys, _ = r.key_set(setup, archive.keys)
    dealing_frames, sealed, _ = m.split_bundles(archive.dealings)
    candidates, _ = r.dealt_set(setup, keys, dealing_frames)
    dealt, named = c.settle(setup, keys, candidates, archive.complaints, sealed)
    assert set(dealt) == set(candidates) - {CHEAT} and set(named) == {CHEAT}
    vectors, _ = survivors(setup, dealt, archive.masked)
    mine = unmask_round(setup, keys, dealt, vectors, archive.reveals, named)
    assert np.array_equal(mine.total, result.total) and mine.faults == result.faults


def test_a_dealer_masking_anyway_after_a_complaint_held_is_left_out_of_the_sum():
    swarm = Swarm(9)
    played = play(swarm, drop_before={"reveal": {CHEAT}}, sealed_hook=_bad_seals(swarm, {1: "off commitment"}))
    state = played.states[CHEAT]  # it masks against the U2 it was in, and sends that frame
    keys, _ = r.key_set(swarm.setup, played.archive.keys)
    masked = r.masked_vector(state, swarm.setup, keys, set(played.dealt) | {CHEAT}, played.inputs[CHEAT])
    archive = RoundArchive(**{**vars(played.archive), "masked": {**played.archive.masked, CHEAT: masked}})
    result = verify_round(swarm.setup, archive)
    assert "masked vector without a dealing in U2" in result.faults[CHEAT]
    assert CHEAT not in result.survivors and np.array_equal(result.total, plain_sum(played))


@pytest.mark.parametrize("lie", ["random key", "key of another pair", "honest dealer", "no such dealer"])
def test_a_false_complaint_names_the_complainer_and_changes_nothing_else(lie):
    swarm, liar, dealer = Swarm(9), 1, 3
    honest = play(swarm, drop_before={"mask": {7}})
    state = honest.states[liar]  # the liar's own keys, so that only the complaint differs
    revealed = {
        "random key": {dealer: os.urandom(32)},
        "key of another pair": {dealer: state.pair_keys[5]},
        "honest dealer": {dealer: state.pair_keys[dealer]},
        "no such dealer": {200: state.pair_keys[2]},
    }[lie]
    complaint = m.complaint_message(swarm.setup.session, liar, revealed, swarm.signing[liar])
    archive = RoundArchive(**{**vars(honest.archive), "complaints": {liar: complaint}})
    result = verify_round(swarm.setup, archive)
    expected = {
        "random key": "not its KEYS frame's key for member 3's shares",
        "key of another pair": "not its KEYS frame's key for member 3's shares",
        "honest dealer": "complained against member 3, whose shares for it open and match its commitments",
        "no such dealer": "complains against member 200, not a dealer of U2",
    }[lie]
    assert set(result.faults) == {liar} and expected in result.faults[liar]
    unchallenged = verify_round(swarm.setup, honest.archive)
    assert result.dropped == unchallenged.dropped == (7,)
    assert result.survivors == unchallenged.survivors == tuple(i for i in range(9) if i != 7)
    assert np.array_equal(result.total, unchallenged.total) and np.array_equal(result.total, plain_sum(honest))


def test_a_false_complaint_made_during_the_round_changes_no_members_mask():
    """The same, played through: every member settles the complaints before masking, and the
    liar's complaint against an honest dealer leaves U2 whole."""
    swarm, liar = Swarm(7), 2

    def hook(state: r.MemberState, frame: bytes | None) -> bytes | None:  # its true key, against honest 0
        if state.index != liar:
            return frame
        return m.complaint_message(swarm.setup.session, liar, {0: state.pair_keys[0]}, swarm.signing[liar])

    lied = play(swarm, complaint_hook=hook)
    assert lied.dealt == frozenset(range(7)) and set(lied.archive.complaints) == {liar}
    result = verify_round(swarm.setup, lied.archive)
    assert set(result.faults) == {liar} and np.array_equal(result.total, plain_sum(lied))


def test_a_revealed_key_opens_its_own_pair_and_no_other():
    swarm, holder = Swarm(6), 2
    played = play(swarm)
    setup = swarm.setup
    dealing_frames, sealed, _ = m.split_bundles(played.archive.dealings)
    keys, _ = r.key_set(setup, played.archive.keys)
    revealed = X25519PrivateKey.from_private_bytes(played.states[holder].pair_keys[3])

    def frame_of(dealer: int, to: int) -> m.Frame:
        return m.open_frame(sealed[dealer][to], m.Kind.SEALED, setup.session, setup.signing)

    assert m.read_sealed(frame_of(3, holder), holder, revealed, keys[3].cipher) == played.states[holder].held[3]
    for other in (0, 1, 4, 5, holder):  # another dealer's frame to the same holder
        with pytest.raises(m.BadMessage, match="do not decrypt"):
            m.read_sealed(frame_of(other, holder), holder, revealed, keys[other].cipher)
    for to in (0, 4):  # the same dealer's frame to another holder
        with pytest.raises(m.BadMessage, match="do not decrypt"):
            m.read_sealed(frame_of(3, to), to, revealed, keys[3].cipher)
    # nor does it stand for another pair in a complaint: that dealer's key in the holder's KEYS differs
    dealings, _ = r.dealt_set(setup, keys, dealing_frames)
    complaint = m.complaint_message(
        setup.session, holder, {5: played.states[holder].pair_keys[3]}, swarm.signing[holder]
    )
    dealt, named = c.settle(setup, keys, dealings, {holder: complaint}, sealed)
    assert set(dealt) == set(dealings) and "not its KEYS frame's key for member 5's shares" in named[holder]


def test_malformed_complaints_are_named_and_oversized_ones_refused_before_parsing():
    swarm = Swarm(9)
    played = play(swarm, drop_before={"keys": {8}})  # 8 has no keys in U1
    setup, archive = swarm.setup, played.archive
    keys, _ = r.key_set(setup, archive.keys)
    dealing_frames, sealed, _ = m.split_bundles(archive.dealings)
    dealings, _ = r.dealt_set(setup, keys, dealing_frames)
    genuine = m.complaint_message(setup.session, 0, {1: played.states[0].pair_keys[1]}, swarm.signing[0])
    too_many = {d: bytes(32) for d in range(len(dealings) + 1)}
    hostile = {
        0: genuine + b"\x00",  # a trailing byte
        1: m.complaint_message(setup.session, 1, too_many, swarm.signing[1]),  # more dealers than U2 has
        2: genuine,  # 0's complaint posted as 2's
        3: genuine[:-1] + bytes([genuine[-1] ^ 1]),  # a bad signature
        4: bytes(m.max_frame_bytes(m.Kind.COMPLAINT) + 1),  # over the bound: not even its header is read
        5: m.complaint_message(setup.session, 5, {}, swarm.signing[6]),  # signed by another member
        8: m.complaint_message(setup.session, 8, {0: bytes(32)}, swarm.signing[8]),  # no keys in U1
    }
    dealt, named = c.settle(setup, keys, dealings, hostile, sealed)
    assert set(dealt) == set(dealings) and set(named) == set(hostile)
    assert "names 9 dealers, the round has 8" in named[1]
    assert "over the COMPLAINT bound" in named[4] and "complains without keys in U1" in named[8]
    result = verify_round(setup, RoundArchive(**{**vars(archive), "complaints": hostile}))
    assert set(result.faults) == set(hostile) and np.array_equal(result.total, plain_sum(played))


def test_a_bundle_without_the_holders_frame_convicts_its_dealer_and_a_missing_bundle_stops_the_round():
    swarm, holder = Swarm(6), 1
    played = play(swarm)
    setup, archive = swarm.setup, played.archive
    keys, _ = r.key_set(setup, archive.keys)
    dealing_frames, sealed, _ = m.split_bundles(archive.dealings)
    dealings, _ = r.dealt_set(setup, keys, dealing_frames)
    complaint = {
        holder: m.complaint_message(
            setup.session, holder, {3: played.states[holder].pair_keys[3]}, swarm.signing[holder]
        )
    }
    without = {**sealed, 3: {h: f for h, f in sealed[3].items() if h != holder}}
    dealt, named = c.settle(setup, keys, dealings, complaint, without)
    assert 3 not in dealt and set(named) == {3} and "no SEALED shares for member 1" in named[3]
    lacking = {d: frames for d, frames in sealed.items() if d != 3}
    with pytest.raises(RoundFailed, match="member 1 complains against member 3, whose SEALED frames are not here"):
        c.settle(setup, keys, dealings, complaint, lacking)


def test_a_member_lacking_a_dealers_bundle_does_not_complain_against_it():
    """A holder whose transport lost an honest dealer's bundle must not take that for the dealer's
    fault: its complaint would be found false, and the pair key it reveals would make public the
    dealer's shares for it, one share of each of its secrets (t - 1 colluders then rebuild both)."""
    swarm, dealer, holder = Swarm(9), 8, 7
    played = play(swarm)
    setup, archive = swarm.setup, played.archive
    keys, _ = r.key_set(setup, archive.keys)
    dealing_frames, sealed, _ = m.split_bundles(archive.dealings)
    dealings, _ = r.dealt_set(setup, keys, dealing_frames)
    state = played.states[holder]
    state.held.clear()
    lost = {d: frames for d, frames in sealed.items() if d != dealer}
    with pytest.raises(RoundFailed, match=r"the dealing bundles of members \[8\] of U2 are not here") as failed:
        r.receive(state, setup, keys, dealings, lost)
    assert failed.value.member is None
    # with the bundle, and no frame for the holder in it, the dealer is at fault, and the complaint holds
    without = {**sealed, dealer: {h: f for h, f in sealed[dealer].items() if h != holder}}
    bad = r.receive(state, setup, keys, dealings, without)
    assert set(bad) == {dealer} and "no SEALED shares for member 7" in bad[dealer]
    dealt, named = c.settle(setup, keys, dealings, {holder: c.complain(state, setup, bad)}, without)
    assert dealer not in dealt and set(named) == {dealer}


def test_the_verifier_judges_complaints_on_the_bundle_whose_digest_the_chain_holds():
    """A dealer that signs a second SEALED frame for a colluding holder: the members judge the
    holder's false complaint on the bundle the chain fixed (dealer kept, holder named); an archive
    carrying the other frame has another digest for that bundle, so it cannot pass for the same."""
    swarm, dealer, holder = Swarm(9), 4, 0
    session = swarm.setup.session

    def hook(state: r.MemberState, frame: bytes | None) -> bytes | None:
        if state.index != holder:
            return frame
        return m.complaint_message(session, holder, {dealer: state.pair_keys[dealer]}, state.signing_key)

    played = play(swarm, complaint_hook=hook)
    setup, archive = swarm.setup, played.archive
    assert dealer in played.dealt
    result = verify_round(setup, archive)
    assert set(result.faults) == {holder} and dealer in result.survivors
    assert np.array_equal(result.total, plain_sum(played))
    dealing_frames, sealed, _ = m.split_bundles(archive.dealings)
    size = len(m.open_frame(sealed[dealer][holder], m.Kind.SEALED, session, setup.signing).payload)
    body = holder.to_bytes(2, "big") + os.urandom(size - 2)  # signed by the dealer, opens to nothing
    other = m.seal_frame(m.Kind.SEALED, session, dealer, body, swarm.signing[dealer])
    forged = RoundArchive(
        **{
            **vars(archive),
            "dealings": {
                **archive.dealings,
                dealer: m.dealing_bundle(dealing_frames[dealer], {**sealed[dealer], holder: other}),
            },
        }
    )
    assert forged.digests()["dealings"][dealer] != archive.digests()["dealings"][dealer]


def test_settle_judges_a_complainer_up_to_its_first_false_entry_and_each_dropped_dealer_once(monkeypatch):
    """Colluders that each complain against every dealer with their true pair keys cost every
    member and the verifier one check each, not one per dealer: the first false entry names the
    complainer, and an entry against a dealer already dropped is not judged."""
    swarm = Swarm(9)
    played = play(swarm, sealed_hook=_bad_seals(swarm, {0: "garbage", 1: "off commitment"}))
    setup, archive = swarm.setup, played.archive
    keys, _ = r.key_set(setup, archive.keys)
    dealing_frames, sealed, _ = m.split_bundles(archive.dealings)
    dealings, _ = r.dealt_set(setup, keys, dealing_frames)
    liars = (2, 3, 5)
    complaints = dict(archive.complaints)  # 0's and 1's, against CHEAT: both hold
    for i in liars:
        revealed = {d: played.states[i].pair_keys[d] for d in dealings}
        complaints[i] = m.complaint_message(setup.session, i, revealed, swarm.signing[i])
    judged: list[tuple[int, int]] = []
    opened = c.open_sealed

    def counted(setup, keys, dealing, holder, private, raw):  # the real check, counted
        judged.append((holder, dealing.dealer))
        return opened(setup, keys, dealing, holder, private, raw)

    monkeypatch.setattr(c, "open_sealed", counted)
    dealt, named = c.settle(setup, keys, dealings, complaints, sealed)
    assert set(dealt) == set(dealings) - {CHEAT} and set(named) == {CHEAT, *liars}
    assert "the complaint of member 0 holds" in named[CHEAT]
    assert all("complained against member 0, whose shares for it open" in named[i] for i in liars)
    assert judged == [(0, CHEAT), (2, 0), (3, 0), (5, 0)]


def test_a_member_complains_only_against_dealers_whose_shares_it_lacks():
    played = play(Swarm(5))
    with pytest.raises(ValueError, match="opened and matched"):
        c.complain(played.states[0], played.swarm.setup, [2])


def _frames(swarm: Swarm, covered: dict[int, int]) -> dict[int, bytes]:
    """Each member's KEYS frame with pair keys for `covered[i]` indices."""
    session = swarm.setup.session
    return {i: r.start_session(session, i, swarm.signing[i], members=k)[1] for i, k in covered.items()}


def test_u1_keeps_the_cutoff_that_leaves_the_most_members():
    swarm = Swarm(8)  # t = 6
    # 0..5 signed before 6 and 7 registered: their frames cover 6 indices; 6 and 7 leave U1, unnamed
    keys, faults = r.key_set(swarm.setup, _frames(swarm, {i: 6 if i < 6 else 8 for i in range(8)}))
    assert set(keys) == set(range(6)) and faults == {}
    # had 0..6 signed after everyone registered, 7 is covered too, and 5 (which covers 6 only) is left out
    keys, _ = r.key_set(swarm.setup, _frames(swarm, {i: 6 if i == 5 else 8 for i in range(8)}))
    assert set(keys) == set(range(8)) - {5}
    swarm = Swarm(10)  # t = 7: two members covering too few leave out themselves, or one above them
    keys, _ = r.key_set(swarm.setup, _frames(swarm, {i: 9 if i < 2 else 10 for i in range(10)}))
    assert set(keys) == set(range(9))
    keys, _ = r.key_set(swarm.setup, _frames(swarm, {i: 8 if i < 2 else 10 for i in range(10)}))
    assert set(keys) == set(range(2, 10))  # 8 from 0..7 against 8 from 2..9: the higher cutoff
    swarm = Swarm(12)  # 0..8 signed before 9..11 registered; members 0..4 lengthen their frames
    early = {i: 9 if i <= 8 else 12 for i in range(12)}
    for lengthened in (set(), {0, 1, 2, 3, 4}):
        keys, _ = r.key_set(swarm.setup, _frames(swarm, {**early, **dict.fromkeys(lengthened, 12)}))
        assert set(keys) == set(range(9))  # not 0..4 and 9..11, with the honest 5..8 left out
    with pytest.raises(ValueError, match="covers its sender"):
        r.start_session(swarm.setup.session, 4, swarm.signing[4], members=4)


def _agrees(public: bytes, probe: X25519PrivateKey) -> bool:
    """Whether `cryptography` gives a shared secret with `public` (it refuses the all-zero one)."""
    try:
        probe.exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError:
        return False
    return True


def test_low_order_pair_keys_are_found_without_an_agreement():
    probe = X25519PrivateKey.generate()
    assert len(r.LOW_ORDER) == 14  # five points, p and p + 1 too, bit 255 set or not
    assert not any(_agrees(key, probe) for key in r.LOW_ORDER)
    for _ in range(200):
        key = MaskKey.generate().public
        assert key not in r.LOW_ORDER and _agrees(key, probe)
        assert _agrees(bytes([*key[:31], key[31] | 0x80]), probe)  # bit 255 ignored: still usable
