"""A whole round in-process: every member's steps (mechanisms.secagg.round) over signed frames,
dropouts at each step, and the aggregate recomputed from the archive (unmask.verify_round)
exactly equal to the plain sum mod 2^bits. Faults (a wrong share, a malformed masked vector) are
named and left out; a reveal of both secrets of one member is refused."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from mechanisms.randomness import seeded_generator
from mechanisms.secagg import messages as m
from mechanisms.secagg import round as r
from mechanisms.secagg.member import encode, sum_residues, within_norm_bound
from mechanisms.secagg.policy import SecAggPolicy
from mechanisms.secagg.unmask import RoundArchive, RoundFailed, verify_round
from tests.secagg.harness import BITS, DIM, Swarm, plain_sum, play


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


def test_more_than_a_third_gone_stops_the_round_and_says_who():
    played = play(Swarm(9), drop_before={"reveal": {0, 1, 2, 3}})  # t = 6, 5 reveal
    with pytest.raises(RoundFailed, match="5 good shares revealed, 6 needed"):
        verify_round(played.swarm.setup, played.archive)


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
    swarm = Swarm(6)
    setup = swarm.setup
    frames = {i: r.start(setup, i, swarm.signing[i])[1] for i in range(5)}
    frames[5] = m.keys_message(setup.session, 5, bytes(32), bytes(32), swarm.signing[5])  # a low-order point
    frames[4] = frames[3]  # 3's frame posted as 4's
    keys, faults = r.key_set(setup, frames)
    assert set(keys) == {0, 1, 2, 3} and set(faults) == {4, 5}


def test_hostile_bytes_anywhere_in_the_archive_are_named_or_stop_the_round_cleanly():
    """A bad REVEAL is named and left out (the sum recovered). A KEYS, DEALING or MASKED frame
    changed after the members acted on it makes the archive disagree with what they did (on a
    swarm its digest on chain would not match, which is checked before the archive is unmasked):
    its sender is named or the round stops with RoundFailed, never another exception."""
    played = play(Swarm(7), drop_before={"mask": {6}})  # t = 5, six reveal
    setup, archive = played.swarm.setup, played.archive
    rng = np.random.default_rng(9)
    for slot in ("keys", "dealings", "masked", "reveals"):
        frames = getattr(archive, slot)
        victim = sorted(frames)[2]
        good = frames[victim]
        for bad in (good[:-1], good + b"\x00", bytes(rng.integers(0, 256, len(good), dtype=np.uint8)), b"", good[:9]):
            hostile = RoundArchive(**{**vars(archive), slot: {**frames, victim: bad}})
            if slot != "reveals":
                with contextlib.suppress(RoundFailed):
                    assert victim in verify_round(setup, hostile).faults
                continue
            result = verify_round(setup, hostile)
            assert set(result.faults) == {victim}
            assert np.array_equal(result.total, plain_sum(played))
