"""A whole round in-process: every member's steps (mechanisms.secagg.round) over signed frames,
dropouts at each step, and the aggregate recomputed from the archive (unmask.verify_round)
exactly equal to the plain sum mod 2^bits. Faults (a wrong share, a malformed masked vector) are
named and left out; a reveal of both secrets of one member is refused, and so is any reveal or
unmasking of fewer masked vectors than the round's minimum."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from mechanisms.randomness import seeded_generator
from mechanisms.secagg import messages as m
from mechanisms.secagg import round as r
from mechanisms.secagg import unmask
from mechanisms.secagg.masks import MaskKey
from mechanisms.secagg.member import encode, sum_residues, within_norm_bound
from mechanisms.secagg.policy import SecAggPolicy
from mechanisms.secagg.round import RoundFailed
from mechanisms.secagg.shamir import PRIME
from mechanisms.secagg.unmask import RoundArchive, unmask_round, verify_round
from tests.secagg.harness import BITS, DIM, Played, Swarm, plain_sum, play


def test_a_full_round_sums_exactly_and_anyone_recomputes_it():
    played = play(Swarm(7))
    result = verify_round(played.swarm.setup, played.archive)
    assert result.survivors == tuple(range(7)) and result.dropped == () and result.faults == {}
    assert np.array_equal(result.total, sum_residues(list(played.inputs.values()), BITS))


@pytest.mark.parametrize("step", ["keys", "deal", "mask", "reveal"])
def test_a_third_dropping_at_one_step(step):
    n = 12  # t = 8: a third is 4
    played = play(Swarm(n), drop_before={step: {1, 4, 7, 10}})
    setup = played.swarm.setup
    assert setup.threshold == 8
    result = verify_round(setup, played.archive)
    expected_alive = set(range(n)) - ({1, 4, 7, 10} if step in ("keys", "deal", "mask") else set())
    assert set(result.survivors) == expected_alive
    assert set(result.dropped) == ({1, 4, 7, 10} if step == "mask" else set())
    assert np.array_equal(result.total, plain_sum(played))


def test_dropouts_at_every_step_of_one_round():
    n = 15  # t = 10: five drop in all, over four steps
    played = play(Swarm(n), drop_before={"keys": {0}, "deal": {3}, "mask": {6, 9}, "reveal": {12}})
    result = verify_round(played.swarm.setup, played.archive)
    assert result.dropped == (6, 9)
    assert set(result.survivors) == set(range(n)) - {0, 3, 6, 9}
    assert np.array_equal(result.total, plain_sum(played))


@pytest.mark.parametrize("bits", [32, 33, 48, 62])
def test_a_full_round_sums_exactly_at_every_width(bits):
    played = play(Swarm(5, bits=bits), drop_before={"mask": {3}})
    result = verify_round(played.swarm.setup, played.archive)
    assert result.dropped == (3,) and np.array_equal(result.total, plain_sum(played))
    setup = played.swarm.setup
    for i in played.alive:  # each masked vector is far from its input: no coordinate left bare
        frame = m.open_frame(played.archive.masked[i], m.Kind.MASKED, setup.session, setup.signing)
        assert np.count_nonzero(m.read_masked(frame, bits, DIM) == played.inputs[i]) < 3


def test_more_than_a_third_gone_stops_the_round_and_names_nobody():
    played = play(Swarm(9), drop_before={"reveal": {0, 1, 2, 3}})  # t = 6, 5 reveal
    with pytest.raises(RoundFailed, match="member 0: 5 good shares revealed, 6 needed") as failed:
        verify_round(played.swarm.setup, played.archive)
    assert failed.value.member is None and failed.value.faults == {}  # nobody is proven at fault


def _forge_opening(swarm: Swarm, member: int, dealer: int, frame: bytes) -> bytes:
    """`member`'s REVEAL with its share of `dealer`'s secret moved by one, re-signed by itself."""
    setup = swarm.setup
    opened = m.read_reveal(m.open_frame(frame, m.Kind.REVEAL, setup.session, setup.signing))
    forged = [o._replace(y=(o.y + 1) % PRIME) if o.dealer == dealer else o for o in opened]
    return m.reveal_message(setup.session, member, forged, swarm.signing[member])


def test_a_round_short_of_shares_names_the_liar_not_its_victim():
    swarm, liar, victim = Swarm(9), 4, 0  # t = 6: six reveal, one lies about member 0's seed

    def hook(i: int, frame: bytes) -> bytes:
        return _forge_opening(swarm, i, victim, frame) if i == liar else frame

    played = play(swarm, drop_before={"reveal": {6, 7, 8}}, reveal_hook=hook)
    with pytest.raises(RoundFailed, match="member 0: 5 good shares revealed, 6 needed") as failed:
        verify_round(swarm.setup, played.archive)
    assert failed.value.member is None
    assert set(failed.value.faults) == {liar} and "does not match its commitment" in failed.value.faults[liar]


def _reveal_regardless(played: Played, member: int, alive: set[int]) -> bytes:
    """What a member ignoring the round's minimum would reveal for U3 = `alive`."""
    state, setup = played.states[member], played.swarm.setup
    chosen = [state.held[d][0 if d in alive else 1] for d in sorted(played.dealt & set(state.held))]
    return m.reveal_message(setup.session, member, chosen, played.swarm.signing[member])


def test_too_few_masked_vectors_are_never_unmasked():
    """With 8 of 9 vectors missing, the 'sum' would be member 0's input: nobody reveals for it,
    and reveals sent anyway unmask nothing."""
    swarm = Swarm(9)
    assert swarm.setup.min_survivors == swarm.setup.threshold == 6
    with pytest.raises(r.RevealRefused, match="1 masked vectors survived R2, the round needs 6"):
        play(swarm, masked_hook=lambda i, frame: frame if i == 0 else b"")
    played = play(swarm)
    alone = RoundArchive(
        played.archive.keys,
        played.archive.dealings,
        {0: played.archive.masked[0]},
        {i: _reveal_regardless(played, i, {0}) for i in range(9)},
    )
    with pytest.raises(RoundFailed, match="1 masked vectors survived"):
        verify_round(swarm.setup, alone)
    keys, _ = r.key_set(swarm.setup, played.archive.keys)
    dealt, _ = r.dealt_set(swarm.setup, keys, m.split_bundles(played.archive.dealings)[0])
    vectors, _ = unmask.survivors(swarm.setup, dealt, alone.masked)
    with pytest.raises(RoundFailed, match="1 masked vectors survived"):
        unmask_round(swarm.setup, keys, dealt, vectors, alone.reveals, {})


def test_the_policys_counted_members_set_the_round_minimum():
    """The sum must carry the noise of h members (the policy's counted members): with h = 8 of 9,
    one vector may miss R2, two may not (above t = 6)."""
    swarm = Swarm(9, counted_members=8)
    assert swarm.setup.min_survivors == 8
    played = play(swarm, drop_before={"mask": {3}})
    assert np.array_equal(verify_round(swarm.setup, played.archive).total, plain_sum(played))
    with pytest.raises(r.RevealRefused, match="7 masked vectors survived R2, the round needs 8"):
        play(swarm, drop_before={"mask": {3, 5}})
    with pytest.raises(ValueError, match="min_survivors"):
        r.RoundSetup.for_members(swarm.setup.session, swarm.setup.signing, BITS, DIM, counted_members=10)


def test_dealing_and_masking_stop_cleanly_below_the_minimum():
    with pytest.raises(RoundFailed, match="U1 has 1 members, the round needs at least 2"):
        play(Swarm(2), drop_before={"keys": {1}})  # t = 2
    with pytest.raises(RoundFailed, match="U2 has 5 members, the round needs at least 6"):
        play(Swarm(9), drop_before={"deal": {0, 1, 2, 3}})  # t = 6


def test_revealers_leaving_out_different_dealers_cost_one_set_of_coefficients(monkeypatch):
    """Three colluders each leave out a different subset of dealers (colluder j those with bit j
    set), so the dealers' holder sets take eight forms: the O(t^2) coefficients are still computed
    once, the others adjusted for the missing points, and the sum is exact."""
    swarm, colluders = Swarm(12), (0, 1, 2)  # t = 8; every dealer keeps at least 9 shares

    def hook(i: int, frame: bytes) -> bytes:
        if i not in colluders:
            return frame
        opened = m.read_reveal(m.open_frame(frame, m.Kind.REVEAL, swarm.setup.session, swarm.setup.signing))
        kept = [o for o in opened if not (o.dealer >> colluders.index(i)) & 1]
        return m.reveal_message(swarm.setup.session, i, kept, swarm.signing[i])

    played = play(swarm, drop_before={"mask": {11}}, reveal_hook=hook)
    calls = []
    lagrange = unmask.lagrange_at_zero
    monkeypatch.setattr(unmask, "lagrange_at_zero", lambda points: calls.append(points) or lagrange(points))
    result = verify_round(swarm.setup, played.archive)
    assert len(calls) == 1 and result.faults == {} and result.dropped == (11,)
    assert np.array_equal(result.total, plain_sum(played))


def test_a_reveal_with_more_openings_than_dealers_is_left_out_whole():
    swarm, cheat = Swarm(7), 2
    setup = swarm.setup

    def stuffed(i: int, frame: bytes) -> bytes:
        if i != cheat:
            return frame
        opened = m.read_reveal(m.open_frame(frame, m.Kind.REVEAL, setup.session, setup.signing))
        extra = [m.Opening(d, i, m.Secret.SELF_SEED, 1, bytes(m.SALT_BYTES)) for d in range(100, 4000)]
        return m.reveal_message(setup.session, i, [*opened, *extra], swarm.signing[i])

    played = play(swarm, reveal_hook=stuffed)
    result = verify_round(setup, played.archive)
    assert set(result.faults) == {cheat} and "REVEAL carries 3907 openings, the round has 7" in result.faults[cheat]
    assert np.array_equal(result.total, plain_sum(played))

    def outside(i: int, frame: bytes) -> bytes:  # as many openings as U2 has dealers, none of them in it
        if i != cheat:
            return frame
        extra = [m.Opening(d, i, m.Secret.SELF_SEED, 1, bytes(m.SALT_BYTES)) for d in range(100, 107)]
        return m.reveal_message(setup.session, i, extra, swarm.signing[i])

    result = verify_round(setup, play(swarm, reveal_hook=outside).archive)
    assert "and 4 more bad shares" in result.faults[cheat] and len(result.faults[cheat]) <= unmask.MAX_FAULT_CHARS


def _wrong_share(swarm: Swarm, member: int, frame: bytes) -> bytes:
    """`member`'s REVEAL with every share's value changed by one, signed by itself."""
    setup = swarm.setup
    opened = m.read_reveal(m.open_frame(frame, m.Kind.REVEAL, setup.session, setup.signing))
    forged = [m.Opening(o.dealer, o.holder, o.secret, (o.y + 1) % (2**256), o.salt) for o in opened]
    return m.reveal_message(setup.session, member, forged, swarm.signing[member])


def test_a_wrong_share_is_named_and_left_out_and_the_sum_recovered():
    swarm, liar = Swarm(9), 2

    def hook(i: int, frame: bytes) -> bytes:
        return _wrong_share(swarm, i, frame) if i == liar else frame

    played = play(swarm, drop_before={"mask": {5}}, reveal_hook=hook)
    result = verify_round(played.swarm.setup, played.archive)
    assert set(result.faults) == {liar}
    assert "does not match its commitment" in result.faults[liar]
    assert result.dropped == (5,)
    assert np.array_equal(result.total, plain_sum(played))


def test_a_malformed_masked_vector_is_named_and_its_sender_counted_as_dropped():
    swarm, cheat = Swarm(9), 4

    def hook(i: int, frame: bytes) -> bytes:
        if i != cheat:
            return frame
        short = np.zeros(DIM - 1, dtype=np.int64)  # the wrong dimension, properly signed
        return m.masked_message(swarm.setup.session, i, short, BITS, swarm.signing[i])

    played = play(swarm, masked_hook=hook)
    result = verify_round(played.swarm.setup, played.archive)
    assert set(result.faults) == {cheat} and "dimension" in result.faults[cheat]
    assert result.dropped == (cheat,) and cheat not in result.survivors
    assert np.array_equal(result.total, plain_sum(played))


def test_a_reveal_of_both_secrets_of_one_member_is_refused():
    played = play(Swarm(6))
    setup, state = played.swarm.setup, played.states[0]
    # member 0 revealed b_v for every survivor; told afterwards that 3 dropped, it refuses s_3
    with pytest.raises(r.RevealRefused, match="never both"):
        r.reveal(state, setup, played.dealt, played.alive - {3})
    with pytest.raises(r.RevealRefused):
        r.reveal(state, setup, played.dealt - {1}, played.alive)  # survivors outside U2
    # and a revealer that sends a mask-key share of a survivor anyway is named, the share unused
    key_share = state.held[3][1]
    forged = m.reveal_message(setup.session, 0, [key_share], played.swarm.signing[0])
    archive = RoundArchive(
        played.archive.keys, played.archive.dealings, played.archive.masked, {**played.archive.reveals, 0: forged}
    )
    result = verify_round(setup, archive)
    assert "MASK_KEY of member 3" in result.faults[0]
    assert np.array_equal(result.total, plain_sum(played))


def test_an_aggregate_beyond_what_honest_members_can_sum_is_refused():
    """What replaces a robust rule: the unmasked sum's norm against the honest bound."""
    policy = SecAggPolicy(members=5, max_records=500, dim=DIM, clip=0.1, noise_multiplier=2.0)
    rng = np.random.default_rng(4)
    honest = []
    for u in range(5):  # 100 records each, every clipped gradient at the clip norm, in one direction
        direction = np.ones(DIM) / np.sqrt(DIM)
        gradient_sum = 100 * policy.clip * direction
        stream = seeded_generator(u)
        honest.append(encode(policy, gradient_sum, stream.mechanism, stream.dpsgd_noise))
    total = sum_residues(honest, BITS)
    assert within_norm_bound(policy, total, 500, 5)
    cheat = rng.integers(0, 2**BITS, DIM, dtype=np.int64)  # one member sends arbitrary residues
    assert not within_norm_bound(policy, sum_residues([*honest[:4], cheat], BITS), 500, 5)


def test_keys_that_no_member_can_agree_with_are_named_and_left_out():
    swarm = Swarm(7)
    setup = swarm.setup
    frames = {i: r.start(setup, i, swarm.signing[i])[1] for i in range(7)}
    pairs = [MaskKey.generate().public for _ in range(7)]
    frames[5] = m.keys_message(setup.session, 5, bytes(32), bytes(32), pairs, swarm.signing[5])  # a low-order point
    low_pair = [*pairs[:3], (2**255 - 19).to_bytes(32, "little"), *pairs[4:]]  # p itself: u = 0, order 2
    good = MaskKey.generate().public
    frames[6] = m.keys_message(setup.session, 6, good, good, low_pair, swarm.signing[6])
    frames[4] = frames[3]  # 3's frame posted as 4's
    keys, faults = r.key_set(setup, frames)
    assert set(keys) == {0, 1, 2, 3} and set(faults) == {4, 5, 6}
    assert "low-order" in faults[6]


def test_hostile_bytes_anywhere_in_the_archive_are_named_or_stop_the_round_cleanly():
    """A bad REVEAL is named and left out (the sum recovered). A KEYS, DEALING or MASKED frame
    changed after the members acted on it makes the archive disagree with what they did (on a
    swarm its digest on chain would not match, which is checked before the archive is unmasked):
    its sender is named (a KEYS frame that does not open although the dealers dealt to its sender
    stops the round naming it) or the round stops with RoundFailed, never another exception."""
    played = play(Swarm(7), drop_before={"mask": {6}})  # t = 5, six reveal
    setup, archive = played.swarm.setup, played.archive
    rng = np.random.default_rng(9)
    for slot in ("keys", "dealings", "masked", "reveals"):
        frames = getattr(archive, slot)
        victim = sorted(frames)[2]
        good = frames[victim]
        for bad in (good[:-1], good + b"\x00", bytes(rng.integers(0, 256, len(good), dtype=np.uint8)), b"", good[:9]):
            hostile = RoundArchive(**{**vars(archive), slot: {**frames, victim: bad}})
            if slot == "keys":
                with pytest.raises(RoundFailed) as failed:
                    verify_round(setup, hostile)
                assert failed.value.member == victim and victim in failed.value.faults
            elif slot != "reveals":
                with contextlib.suppress(RoundFailed):
                    assert victim in verify_round(setup, hostile).faults
            else:
                result = verify_round(setup, hostile)
                assert set(result.faults) == {victim}
                assert np.array_equal(result.total, plain_sum(played))


def test_a_keys_frame_re_signed_by_its_sender_opens_and_only_its_digest_tells():
    """Why the archive must match the chain's digests: a member that re-signs its KEYS frame with
    another mask key after the others masked with the first one gives an archive that opens, is
    unmasked with no fault named, and sums wrong; its digest is the one that differs."""
    played = play(Swarm(6), drop_before={"mask": {5}})  # 5's masks are restored with 3's public key
    setup, archive, cheat = played.swarm.setup, played.archive, 3
    frame = m.open_frame(archive.keys[cheat], m.Kind.KEYS, setup.session, setup.signing)
    keys = m.read_keys(frame)
    other = m.keys_message(
        setup.session, cheat, MaskKey.generate().public, keys.cipher, keys.pairs, played.swarm.signing[cheat]
    )
    changed = RoundArchive(**{**vars(archive), "keys": {**archive.keys, cheat: other}})
    result = verify_round(setup, changed)
    assert result.faults == {} and not np.array_equal(result.total, plain_sum(played))
    on_chain, archived = archive.digests(), changed.digests()
    differing = [(step, i) for step in on_chain for i in on_chain[step] if on_chain[step][i] != archived[step][i]]
    assert differing == [("keys", cheat)] and on_chain["keys"][cheat] == m.frame_digest(archive.keys[cheat])
