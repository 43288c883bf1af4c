"""The round table (docs/LEDGER.md "Gas"): duplicate digests and vote counters in reused slots,
with full buckets and the overflow mapping forced by digests and aggregates that all start in the
same bucket, on a real Anvil (automine)."""

from __future__ import annotations

import hashlib
from itertools import count

import pytest
from web3 import Web3

from node.chain import errors
from node.chain.anvil import start_anvil
from node.chain.records import RoundState

PEERS = 11  # 10 digests to fill three buckets of three and reach the overflow, and one to copy them
TABLE = 2 * PEERS  # slots created by PEERS registrations: round 2's table
BUCKET = 5


def _start(value: bytes, shift: int) -> int:
    return (int.from_bytes(value, "big") >> shift) % TABLE


def digests_in_bucket(n: int, bucket: int = BUCKET) -> list[bytes]:
    """`n` update digests whose probe sequence starts at `bucket` (keccak256(digest) >> 128)."""
    found = []
    for i in count():
        d = hashlib.sha256(b"table digest %d" % i).digest()
        if _start(Web3.keccak(d), 128) == bucket:
            found.append(d)
            if len(found) == n:
                return found
    raise AssertionError


def aggregates_in_bucket(n: int, bitmap: bytes, bucket: int = BUCKET) -> list[bytes]:
    """`n` aggregate digests whose (aggregate, bitmap) key starts at `bucket` (key >> 192)."""
    found = []
    for i in count():
        agg = hashlib.sha256(b"table aggregate %d" % i).digest()
        if _start(Web3.keccak(agg + bitmap), 192) == bucket:
            found.append(agg)
            if len(found) == n:
                return found
    raise AssertionError


@pytest.fixture(scope="module")
def table_chain():
    with start_anvil(accounts=PEERS) as anvil:
        yield anvil


@pytest.fixture
def round_two(table_chain, kit):
    """PEERS registered peers; round 1 finalized by peer 0 alone, so round 2 has a table of TABLE buckets."""
    swarm = kit.Swarm(table_chain, PEERS, min_peers=1, commit_window=30, attest_window=30)
    swarm.register(PEERS)
    swarm.peers[0].commit(1, kit.digest("round 1"), 10, 1, kit.MECHANISM)
    swarm.pass_commit_window(1)
    swarm.peers[0].close_round(1)
    swarm.peers[0].attest(1, kit.digest("aggregate 1"), b"\x01")
    assert swarm.reader.current_round() == 2
    return swarm


def test_duplicates_are_refused_in_full_buckets_and_in_the_overflow(round_two, kit):
    swarm = round_two
    p = swarm.peers
    digests = digests_in_bucket(PEERS)
    gas = [p[i].commit(2, digests[i], 10, 1, kit.MECHANISM)["gasUsed"] for i in range(10)]
    # Buckets 5, 6 and 7 hold three digests each; the tenth found them full and went to the overflow.
    assert gas[9] > max(gas[:9]) + 15_000, gas  # the overflow created a slot: 20,000 gas
    assert max(gas[:9]) < 52_000, gas  # the table's slots were created by the registrations
    for copied in (digests[0], digests[4], digests[8], digests[9]):  # first, second, third bucket, overflow
        with pytest.raises(errors.DuplicateDigest):
            p[10].commit(2, copied, 10, 1, kit.MECHANISM)
    p[10].commit(2, digests[10], 10, 1, kit.MECHANISM)  # a new digest past full buckets: the overflow again
    assert [c.digest for c in swarm.reader.commitments(2)] == digests
    assert [c.index for c in swarm.reader.commitments(2)] == list(range(PEERS))


def test_votes_count_in_buckets_and_in_the_overflow_and_finalize(round_two, kit):
    swarm = round_two
    p = swarm.peers
    for i, peer in enumerate(p):
        peer.commit(2, kit.digest(f"update {i}"), 10, 1, kit.MECHANISM)
    p[0].close_round(2)  # every registered peer committed: no window to wait for
    bitmap = b"\xff\x07"
    a, b, c, d = aggregates_in_bucket(4, bitmap)
    assert swarm.reader.votes_for(2, d, bitmap) == 0
    for peer, agg in zip(p, (a, b, c, d, d, d, d, d)):  # three buckets, then the overflow for d
        peer.attest(2, agg, bitmap)
    votes = [swarm.reader.votes_for(2, x, bitmap) for x in (a, b, c, d)]
    assert votes == [1, 1, 1, 5]  # 5 of 11: no strict majority yet
    assert swarm.reader.votes_for(2, d, b"\xff\x03") == 0  # same digest, other bitmap: another key
    assert swarm.reader.round_info(2).state is RoundState.CLOSED
    p[8].attest(2, d, bitmap)  # 6 of 11
    info = swarm.reader.round_info(2)
    assert info.state is RoundState.FINALIZED and info.finalized_digest == d
    assert swarm.reader.last_finalized() == (2, d)
    assert [x.votes for x in swarm.reader.attestations(2)] == [1, 1, 1, 1, 2, 3, 4, 5, 6]
    with pytest.raises(errors.WrongRound):  # a past round's votes are in its Attested events only
        swarm.reader.votes_for(2, d, bitmap)


def test_steady_state_commit_and_attest_create_no_slot(round_two, kit):
    """Round 2 and 3 on fresh digests: no commit nor attestation pays for a new slot (20,000 gas)."""
    swarm = round_two
    p = swarm.peers[:3]
    for r in (2, 3):
        commits = [
            peer.commit(r, kit.digest(f"steady {r} {i}"), 10, 1, kit.MECHANISM)["gasUsed"] for i, peer in enumerate(p)
        ]
        swarm.pass_commit_window(r)
        p[0].close_round(r)
        attests = [peer.attest(r, kit.digest(f"steady aggregate {r}"), b"\x07")["gasUsed"] for peer in p[:2]]
        assert max(commits) < 50_000, commits
        assert attests[0] < 45_000 and attests[1] < 55_000, attests  # the second one finalizes
        assert max(commits) + max(attests) <= 100_000
