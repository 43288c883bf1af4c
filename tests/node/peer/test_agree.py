"""The fetch-and-agree step (node/peer/agree.py) in the event orders that matter: a late blob, a
blob that never arrives, a malformed blob, two different attestations on chain, an attestation
before this peer's fetch ends, a focal set that cannot be completed. (Censorship by an early
attestation that leaves a blob out: tests/node/peer/test_censorship.py.)

The decisions are checked without trio first; then participant 0 runs the real step, wired by
the real `Peer`, against a FakeChain and FakeNetwork in trio's virtual time (tests/node/peer/harness.py),
while scripted participants attest at chosen times."""

from __future__ import annotations

import logging

import pytest
import torch
import trio

from node.chain.records import Attestation
from node.peer.agree import (
    ATTESTATIONS_REREAD,
    CLAIM_PATIENCE,
    NOT_AWAITED_AFTER,
    WATCH_INTERVAL,
    Agreement,
    RoundBlobs,
    choose_focal,
    decide_inclusion,
)
from node.peer.faults import FaultyStore
from node.peer.fetching import RETRY_INTERVAL
from node.protocol import wire
from node.protocol.wire import encode_bitmap
from tests.node.peer.harness import (
    FETCH_TIMEOUT,
    FakeSwarm,
    closed_round,
    digest_of,
    member_address,
    run_virtual,
    update_blob,
    update_vector,
)

T, F = True, False

# ------------------------------------------------------------------ decisions, without trio


def test_the_focal_set_includes_us_and_all_we_hold_supersets_first():
    # (this test used to read "the first bitmap that includes us, not the later, larger one": that
    # first-wins rule let an early attester leave any blob out; see tests/node/peer/test_censorship.py)
    bitmaps = [[F, T, T], [T, T, F], [T, T, T]]
    nothing = [F, F, F]
    assert choose_focal(bitmaps, 0, nothing) == [T, T, T]  # the larger one contains the first that includes us
    assert choose_focal(bitmaps, 1, nothing) == [T, T, T]
    assert choose_focal([[F, T, T]], 0, nothing) is None  # none includes us
    assert choose_focal([[T, T, F], [T, F, T]], 0, nothing) == [T, T, F]  # neither contains the other: the first
    # a set that leaves out a blob we hold is never adopted, however early it came
    assert choose_focal([[T, T, F], [T, F, T]], 0, [T, F, T]) == [T, F, T]
    assert choose_focal([[T, T, F]], 0, [T, F, T]) is None
    # nor one that includes a blob we found malformed (or refused)
    assert choose_focal([[T, T, T], [T, T, F]], 0, [T, F, F], [F, F, T]) == [T, T, F]


@pytest.mark.parametrize(
    "have,focal,expected",
    [
        ([T, T, T], [T, T, F], [T, T, F]),  # a complete focal set wins, even over more blobs
        ([T, F, T], [T, T, F], [T, F, T]),  # a focal blob is missing: what we fetched ourselves
        ([T, T, F], None, [T, T, F]),  # no focal set
    ],
)
def test_decide_inclusion(have, focal, expected):
    assert decide_inclusion(have, focal) == expected


def test_round_blobs_learn_holders_and_rechoose_the_focal_set():
    blobs = RoundBlobs(["p0", "p1", "p2"], mine=0)
    index = {"0xa": 0, "0xb": 1, "0xc": 2}
    excludes_us = Attestation("0xb", b"\x01" * 32, encode_bitmap([F, T, T]), 1, 5)
    includes_us = Attestation("0xc", b"\x02" * 32, encode_bitmap([T, F, T]), 1, 6)
    blobs.learn([excludes_us], index, 1.0)
    assert blobs.focal is None and blobs.holders == [[], ["p1"], ["p1"]]
    blobs.learn([excludes_us, includes_us], index, 2.0)  # the chain's list grows; holders are not repeated
    assert blobs.focal == [T, F, T] and blobs.holders == [["p2"], ["p1"], ["p1", "p2"]]
    assert blobs.claimed_at == [None, 1.0, 2.0]  # each attester claims its own blob, first seen then
    later = Attestation("0xa", b"\x03" * 32, encode_bitmap([T, T, T]), 1, 7)
    blobs.learn([excludes_us, includes_us, later], index, 0.0)
    assert blobs.focal == [T, T, T]  # a later superset replaces it (it used to be "adopted once, never replaced")
    # whom to ask for blob 2: its committer, then its holders, then whoever announced it
    assert blobs.providers(2, announced=["p1", "p9"]) == ["p2", "p1", "p2", "p0", "p9"]
    # a blob fetched later drops every set that leaves it out
    blobs = RoundBlobs(["p0", "p1", "p2"], mine=0)
    blobs.learn([includes_us], index, 0.0)
    assert blobs.focal == [T, F, T]
    blobs.vectors[1] = torch.zeros(1)
    assert blobs.focal is None


def test_round_blobs_done_when_all_is_settled_and_decide_what_is_held():
    blobs = RoundBlobs(["p0", "p1", "p2"], mine=0)
    blobs.vectors[0] = torch.zeros(1)
    assert not blobs.done()
    blobs.malformed[1] = True  # settled: nothing more to fetch for it
    assert not blobs.done()
    blobs.bitmaps = [[T, T, F]]  # includes the malformed blob 1: not a focal set
    assert blobs.focal is None and blobs.decide() == [T, F, F]
    blobs.malformed[2] = True
    assert blobs.done()
    blobs.vectors[1], blobs.malformed[1] = torch.zeros(1), False
    assert blobs.focal == [T, T, F] and blobs.decide() == [T, T, F]
    with pytest.raises(ValueError):
        RoundBlobs(["p0"], mine=1)


def test_a_blob_is_withheld_once_its_committer_claimed_it_then_failed_us_and_nobody_else_claims_it():
    blobs = RoundBlobs(["p0", "p1", "p2"], mine=0)
    blobs.vectors[0] = blobs.vectors[1] = torch.zeros(1)
    blobs.claimed_at[2], blobs.unserved_at[2] = 5.0, 4.0  # it failed us before its claim only
    assert blobs.next_due(1.0, 5.5) == 6.0  # when its claim comes due
    assert blobs.withhold_overdue(10.0, 1.0) == [] and blobs.next_due(1.0, 10.0) is None
    blobs.unserved_at[2] = 5.5  # and after it
    assert blobs.withhold_overdue(5.9, 1.0) == []
    blobs.holders[2] = ["p2", "p1"]  # 1 attested it too: it is waited for as any blob
    assert blobs.withhold_overdue(6.0, 1.0) == [] and not blobs.done()
    blobs.holders[2] = ["p2"]
    assert blobs.withhold_overdue(6.0, 1.0) == [2] and blobs.is_settled(2) and blobs.done()
    assert blobs.decide() == [T, T, F]


def test_a_committers_own_announcement_is_a_claim_and_a_withheld_blob_another_claims_is_fetched_again():
    blobs = RoundBlobs(["p0", "p1", "p2"], mine=0)
    blobs.vectors[0] = blobs.vectors[1] = torch.zeros(1)
    assert not blobs.hear(2, ["p1"], 1.0) and blobs.claimed_at[2] is None  # another's HAVE: no claim of 2's
    blobs.announcers[2] = []
    assert blobs.hear(2, ["p2"], 2.0) and blobs.claimed_at[2] == 2.0  # its committer's own HAVE
    assert not blobs.hear(2, ["p2"], 3.0) and blobs.claimed_at[2] == 2.0  # first seen then
    blobs.unserved_at[2] = 2.1
    assert blobs.withhold_overdue(3.0, 1.0) == [2] and blobs.is_settled(2) and blobs.done()
    blobs.hear(2, ["p2", "p1"], 4.0)  # 1 fetched it after all: it is a blob to fetch again
    assert not blobs.is_settled(2) and not blobs.done()


def test_a_blob_not_awaited_keeps_no_step_waiting_unless_another_attester_claims_it():
    blobs = RoundBlobs(["p0", "p1", "p2"], mine=0, awaited=[T, T, F])
    blobs.vectors[0] = blobs.vectors[1] = torch.zeros(1)
    assert not blobs.is_settled(2) and blobs.done()
    blobs.holders[2] = ["p2"]  # its committer's own claim changes nothing
    assert blobs.done()
    blobs.holders[2] = ["p2", "p1"]  # 1 holds it: fetch it from 1
    assert not blobs.done()


# ------------------------------------------------------------------ event orders, in virtual time


async def agree(swarm: FakeSwarm, *scripted: tuple) -> tuple[Agreement, list[bool], float]:
    """Participant 0 (a real Peer's wiring) runs the step while scripted members attest
    (time, member, digest, flags); returns the step, its bitmap and the trio seconds it took."""
    peer = swarm.peer(0)
    async with trio.open_nursery() as nursery:
        for args in scripted:
            nursery.start_soon(swarm.attest_at, *args)
        started = trio.current_time()
        agreement = await peer._agreement(1)
        included = await agreement.run()
        elapsed = trio.current_time() - started
        nursery.cancel_scope.cancel()  # attestations still scheduled do not matter any more
    return agreement, included, elapsed


def test_a_late_blob_is_waited_for_and_included():
    async def main():
        swarm, blobs, digests = closed_round(3)
        swarm.network.delay(digests[1], 6.0)  # arrives 6 s into a 10 s fetch

        agreement, included, elapsed = await agree(swarm)

        assert included == [T, T, T]
        assert elapsed == pytest.approx(6.0)  # stopped as soon as the last blob was in
        assert torch.equal(agreement.blobs.vectors[1], update_vector(1))
        assert swarm.network.providers_of(digests[1], swarm.members[0].peer_id) == [swarm.members[1].peer_id]

    run_virtual(main)


@pytest.mark.parametrize("how", ["committer-unreachable", "transfer-stalls", "arrives-after-timeout"])
def test_b_a_blob_that_never_arrives_is_left_out_after_fetch_timeout(how):
    async def main():
        swarm, blobs, digests = closed_round(3)
        if how == "committer-unreachable":
            swarm.network.unreachable.add(swarm.members[2].peer_id)
        elif how == "transfer-stalls":
            swarm.network.stall(digests[2])
        else:
            swarm.network.delay(digests[2], FETCH_TIMEOUT + 0.5)

        agreement, included, elapsed = await agree(swarm)

        assert included == [T, T, F]
        assert elapsed == pytest.approx(FETCH_TIMEOUT)  # waited the whole timeout, once: no focal set
        assert agreement.blobs.vectors[2] is None and not agreement.blobs.malformed[2]
        assert agreement.blobs.focal is None

    run_virtual(main)


@pytest.mark.parametrize(
    "bad",
    [
        b"\x00" * 64,  # not safetensors at all
        wire.model_blob(update_vector(2), 1),  # a well-formed blob of the wrong kind
        wire.update_blob(torch.zeros(7), 1, "{}", member_address(2)),  # an update of the wrong size
    ],
    ids=["garbage", "wrong-kind", "wrong-size"],
)
def test_e_a_malformed_blob_is_left_out_at_once_like_a_missing_one(bad):
    async def main():
        swarm, blobs, digests = closed_round(3, [update_blob(0), update_blob(1), bad])

        agreement, included, elapsed = await agree(swarm)

        assert included == [T, T, F]  # the bitmap of a blob that never arrived
        assert agreement.blobs.malformed[2] and agreement.blobs.vectors[2] is None
        assert elapsed < 1.0  # nothing to wait for: it cannot get better
        # the right bytes did arrive (digest checked): it is the content that is refused
        assert swarm.network.providers_of(digests[2], swarm.members[0].peer_id) == [swarm.members[2].peer_id]

    run_virtual(main)


def test_c_the_first_attestation_excludes_us_a_later_one_includes_us():
    """Participant 3 is unreachable (and silent); 1 attests a set without us (nor 3) first, then 2
    attests all four. We adopt 2's set (the first that includes us) and fetch 3's blob from 2, who
    attested it."""

    async def main():
        swarm, blobs, digests = closed_round(4)
        p = [m.peer_id for m in swarm.members]
        swarm.network.unreachable.add(p[3])
        swarm.members[2].store.put(blobs[3])  # 2 fetched it earlier (and did not announce it)
        without_us, everyone = [F, T, T, F], [T, T, T, T]

        agreement, included, elapsed = await agree(
            swarm, (1.25, 1, digest_of(blobs, without_us), without_us), (2.25, 2, digest_of(blobs, everyone), everyone)
        )

        assert [a.peer for a in swarm.members[0].ledger.attestations(1)] == [
            swarm.members[1].address,
            swarm.members[2].address,
        ]
        assert agreement.blobs.focal == everyone and included == everyone
        assert swarm.network.providers_of(digests[3], p[0]) == [p[2]]
        assert 2.25 < elapsed <= 3.0  # done as soon as the focal set was complete, not at the timeout
        assert agreement.blobs.holders[3] == [p[2]]

    run_virtual(main)


def test_c_a_committer_that_serves_another_attester_but_not_us_is_fetched_from_that_attester():
    """1 cannot reach us but served 2. Both attest all three (1's claim of its blob and 2's come
    together): 2's claim means the blob exists beyond its committer, so it is not withheld: we
    fetch it from 2 and include it."""

    async def main():
        swarm, blobs, digests = closed_round(3)
        p = [m.peer_id for m in swarm.members]
        swarm.network.unreachable.add(p[1])
        swarm.members[2].store.put(blobs[1])
        everyone = [T, T, T]

        agreement, included, elapsed = await agree(
            swarm, (1.25, 1, digest_of(blobs, everyone), everyone), (1.3, 2, digest_of(blobs, everyone), everyone)
        )

        assert included == everyone and not agreement.blobs.withheld[1]
        assert swarm.network.providers_of(digests[1], p[0]) == [p[2]]
        assert elapsed <= 1.3 + WATCH_INTERVAL + RETRY_INTERVAL  # seen, then asked on the next pass

    run_virtual(main)


def test_c_a_committer_that_attests_its_own_blob_and_serves_it_to_nobody_is_left_out_as_withholding(caplog):
    """1 attests {0, 1}; 2 attests {0, 1, 2} a moment later, its own blob included, but serves that
    blob to nobody. Its attestation claims the blob; 2 does not serve it to us after that and no
    other attester claims it, so CLAIM_PATIENCE of the fetch timeout after the claim it is withheld:
    we vote {0, 1} and name 2 in the round's record. (Waiting for it used to cost the fetch timeout,
    then one more to complete 2's own larger set: 20 s, every round.)"""

    async def main():
        swarm, blobs, digests = closed_round(3)
        swarm.network.unreachable.add(swarm.members[2].peer_id)  # serves nobody
        first, second = [T, T, F], [T, T, T]

        agreement, included, elapsed = await agree(
            swarm, (1.25, 1, digest_of(blobs, first), first), (1.3, 2, digest_of(blobs, second), second)
        )

        assert included == first and agreement.blobs.focal == second  # preferred, never completed
        patience = CLAIM_PATIENCE * FETCH_TIMEOUT
        assert 1.3 + patience <= elapsed <= 1.3 + WATCH_INTERVAL + patience  # the claim, seen, plus patience
        assert agreement.blobs.vectors[2] is None and agreement.blobs.withheld[2]
        why = agreement.blobs.left_out[2]
        assert why is not None and why.startswith(f"round 1: blob {digests[2][:16]} of participant 2 ")
        assert swarm.members[2].address in why and "is withheld" in why
        assert agreement.blobs.left_out[:2] == [None, None]

    with caplog.at_level(logging.WARNING, logger="swarm.peer"):
        run_virtual(main)
    assert any("withheld, not waited for" in r.getMessage() for r in caplog.records)


def test_c_a_committer_that_attests_its_own_blob_and_answers_nothing_costs_one_fetch_timeout_not_two():
    """2 attests {0, 1, 2} at once and then takes every request for its blob without answering. A
    silent transfer may be a slow one, so step 1 waits its fetch timeout; but 2 served us nothing in
    all that time after claiming the blob, so it is withheld: its own set is not waited for again."""

    async def main():
        swarm, blobs, digests = closed_round(3)
        swarm.network.stall(digests[2])
        everyone = [T, T, T]

        agreement, included, elapsed = await agree(swarm, (0.25, 2, digest_of(blobs, everyone), everyone))

        assert included == [T, T, F] and agreement.blobs.withheld[2] and agreement.blobs.focal == everyone
        assert elapsed == pytest.approx(FETCH_TIMEOUT)

    run_virtual(main)


def test_c_a_slow_blob_whose_committer_attested_early_is_still_waited_for():
    """2 attests {0, 1, 2} at once, but its blob takes 6 s to reach us: a transfer that is still
    running is no refusal, so we wait for it (an early attestation must not end the wait for a slow
    blob: tests/node/peer/test_censorship.py) and include it."""

    async def main():
        swarm, blobs, digests = closed_round(3)
        swarm.network.delay(digests[2], 6.0)
        everyone = [T, T, T]

        agreement, included, elapsed = await agree(swarm, (0.25, 2, digest_of(blobs, everyone), everyone))

        assert included == everyone and not agreement.blobs.withheld[2]
        assert elapsed == pytest.approx(6.0)

    run_virtual(main)


def test_c_a_committer_that_announces_its_blob_and_serves_it_to_nobody_is_withheld_without_attesting():
    """2 announces its blob (a claim to hold it, as an honest committer makes once it stored it)
    and serves it to nobody; it never attests. The claim is probed at once, refused, and
    CLAIM_PATIENCE of the fetch timeout later the blob is withheld: the step ends there, not at
    the fetch timeout."""

    async def main():
        swarm, blobs, digests = closed_round(3)
        await swarm.members[2].host.announce_blob(digests[2])
        swarm.network.unreachable.add(swarm.members[2].peer_id)  # serves nobody

        agreement, included, elapsed = await agree(swarm)

        assert included == [T, T, F] and agreement.blobs.withheld[2]
        assert elapsed == pytest.approx(CLAIM_PATIENCE * FETCH_TIMEOUT)
        why = agreement.blobs.left_out[2]
        assert why is not None and swarm.members[2].address in why and "is withheld" in why

    run_virtual(main)


def test_c_a_slow_blob_whose_committer_announced_it_is_still_waited_for():
    """2 announced its blob, which takes 6 s to reach us: a transfer still running is no refusal,
    so the claim's patience does not cut it short: we wait for it and include it."""

    async def main():
        swarm, blobs, digests = closed_round(3)
        await swarm.members[2].host.announce_blob(digests[2])
        swarm.network.delay(digests[2], 6.0)

        agreement, included, elapsed = await agree(swarm)

        assert included == [T, T, T] and not agreement.blobs.withheld[2]
        assert elapsed == pytest.approx(6.0)

    run_virtual(main)


def test_a_committer_not_awaited_is_not_waited_for_but_kept_when_it_arrives():
    """Blob 2's committer served nobody in the last rounds (`awaited` False): nothing waits for its
    blob, which nobody serves now either. Blob 1 is slow (3 s): the step ends with it, and blob 2
    is left out, named as not awaited. With blob 2 quick, it is fetched while the step lasts and
    included."""

    async def main(slow_two: bool):
        swarm, blobs, digests = closed_round(3)
        swarm.network.delay(digests[1], 3.0)
        swarm.network.delay(digests[2], 10.0 if slow_two else 1.0)
        peer = swarm.peer(0)
        peer.withholding.missed[swarm.members[2].address] = NOT_AWAITED_AFTER
        started = trio.current_time()
        agreement = await peer._agreement(1)
        assert agreement.blobs.awaited == [T, T, F]
        included = await agreement.run()
        return agreement, included, trio.current_time() - started

    agreement, included, elapsed = run_virtual(main, True)
    assert included == [T, T, F] and elapsed == pytest.approx(3.0)
    why = agreement.blobs.left_out[2]
    assert why is not None and "was not awaited" in why
    agreement, included, elapsed = run_virtual(main, False)
    assert included == [T, T, T] and elapsed == pytest.approx(3.0)
    assert agreement.served(2) is True


def test_withholding_counts_rounds_in_a_row_and_a_served_blob_resets_it():
    async def main():
        swarm, blobs, digests = closed_round(3)
        swarm.network.unreachable.add(swarm.members[2].peer_id)
        peer = swarm.peer(0)
        w = peer.withholding
        late = swarm.members[2].address
        for _ in range(NOT_AWAITED_AFTER):
            assert w.awaited(late)
            agreement = await peer._agreement(1)
            await agreement.run()
            assert agreement.served(2) is False and agreement.served(1) is True and agreement.served(0) is None
            w.record(agreement)
        assert not w.awaited(late) and w.awaited(swarm.members[1].address)
        w.served(late)  # e.g. a prefetch got one of its blobs
        assert w.awaited(late)

    run_virtual(main)


def test_d_an_attestation_before_our_fetch_ends_sets_what_we_wait_for():
    """Four participants. 2's blob reaches nobody; 3 is unreachable to us but 1 holds its blob.
    1 attests {0, 1, 3} at 2.25 s, long before our 10 s fetch ends: we fetch blob 3 from 1 and
    vote 1's set. (We used to stop waiting for blob 2 at once: the early stop an attester could
    use to censor a slow blob. Now blob 2 is waited for until the fetch timeout.)"""

    async def main():
        swarm, blobs, digests = closed_round(4)
        p = [m.peer_id for m in swarm.members]
        swarm.network.unreachable.update({p[2], p[3]})
        swarm.members[1].store.put(blobs[3])
        focal = [T, T, F, T]

        agreement, included, elapsed = await agree(swarm, (2.25, 1, digest_of(blobs, focal), focal))

        assert included == focal
        assert swarm.network.providers_of(digests[3], p[0]) == [p[1]]
        assert torch.equal(agreement.blobs.vectors[3], update_vector(3))
        assert agreement.blobs.vectors[2] is None
        assert elapsed == pytest.approx(FETCH_TIMEOUT)

    run_virtual(main)


def test_d_a_focal_set_we_cannot_complete_falls_back_to_what_we_fetched():
    """1 attests {0, 1, 3} but cannot serve blob 3 (nor can anyone): we wait the fetch timeout,
    then one more for the focal set's rest, then vote what we fetched ourselves."""

    async def main():
        swarm, blobs, digests = closed_round(4)
        swarm.network.unreachable.update({swarm.members[2].peer_id, swarm.members[3].peer_id})
        focal = [T, T, F, T]

        agreement, included, elapsed = await agree(swarm, (2.25, 1, digest_of(blobs, focal), focal))

        assert agreement.blobs.focal == focal
        assert included == [T, T, F, F]
        assert elapsed == pytest.approx(2 * FETCH_TIMEOUT)  # "twice at most"

    run_virtual(main)


def test_a_committer_that_serves_us_other_bytes_is_skipped_for_the_attester_that_holds_its_blob(caplog):
    """2 served 1 its real blob (1 attested all three) but serves us bytes that do not hash to its
    commitment: we blame it, ask 1, and include the blob. (Peers used to ask the committer first
    on every try, so they never got it and attested without it: a committer could split the vote.)"""

    async def main():
        swarm, blobs, digests = closed_round(3)
        p = [m.peer_id for m in swarm.members]
        swarm.members[1].store.put(blobs[2])
        liar = FaultyStore(swarm.members[2].store)  # type: ignore[arg-type]  # any store will do
        liar.poison(digests[2])
        swarm.members[2].host.store = liar  # type: ignore[assignment]
        everyone = [T, T, T]

        agreement, included, elapsed = await agree(swarm, (0.25, 1, digest_of(blobs, everyone), everyone))

        assert included == everyone and torch.equal(agreement.blobs.vectors[2], update_vector(2))
        assert swarm.network.providers_of(digests[2], p[0]) == [p[1]]
        assert elapsed < FETCH_TIMEOUT / 2  # at once, not at the end of the fetch
        return p[2]

    with caplog.at_level(logging.WARNING, logger="swarm.peer"):
        liar_id = run_virtual(main)
    (blame,) = [r.getMessage() for r in caplog.records if "asking the others first" in r.getMessage()]
    assert blame.startswith("round 1: blob ") and "participant 2" in blame
    assert f"holder {liar_id} served bytes that do not hash to the digest" in blame


@pytest.mark.parametrize("pushed", [True, False])
def test_attestations_are_read_on_ledger_news_where_it_is_pushed_else_every_watch_interval(pushed):
    """A blob that never comes keeps step 1 waiting its whole fetch timeout. Where the ledger's
    events are pushed (`ledger_news` says whether one came) the attestations are read on each
    event only, else at ATTESTATIONS_REREAD; where it cannot tell (polling) every WATCH_INTERVAL."""

    async def main():
        swarm, blobs, digests = closed_round(3)
        swarm.network.stall(digests[2])
        agreement = await swarm.peer(0)._agreement(1)
        reads = []
        read = agreement._read_attestations

        async def counted():
            reads.append(trio.current_time())
            return await read()

        async def news(timeout):
            await trio.sleep(timeout)
            return False if pushed else None  # nothing on chain meanwhile

        agreement._read_attestations, agreement._ledger_news = counted, news
        await agreement.run()
        fetching = FETCH_TIMEOUT
        if pushed:
            assert len(reads) <= fetching / ATTESTATIONS_REREAD + 2
        else:
            assert len(reads) >= fetching / WATCH_INTERVAL - 1

    run_virtual(main)
