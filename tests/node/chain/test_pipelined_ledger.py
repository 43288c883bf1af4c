"""The one-transaction-per-round prototype (contracts/PipelinedLedger.sol, docs/LEDGER.md "One
transaction per round") on a real automine Anvil: rounds close by themselves, the previous round
finalizes from the votes the next round's commits carry, a round does not close on an unfinalized
predecessor, the window's end closes a round in the next round's first commit, final votes, aborts; and
the client's reads: `confirmations` deep, logs in chunks, logs that lag read again, requests counted."""

from __future__ import annotations

import pytest
from eth_account import Account

from node.chain import errors, pipelined
from node.chain.client import connect
from node.chain.pipelined import PipelinedClient
from node.chain.registration import sign_registration
from node.chain.votes import leading, majority, votes_on
from node.protocol.wire import encode_bitmap
from tests.e2e.testnet_box import ProxyFaults, rpc_proxy

GAS_TARGET = 60_000  # gas per member per round (docs/LEDGER.md "One transaction per round")
WINDOW_BLOCKS = 30
WINDOW_SECONDS = 60
NO_VOTE = (b"\0" * 32, b"")  # round 1's commits: no round before to vote on


class Ledger:
    """A fresh PipelinedLedger and one client per member (node.chain.pipelined), every member registered."""

    def __init__(self, anvil, kit, n: int, min_peers: int = 2) -> None:
        self.anvil, self.kit = anvil, kit
        w3 = connect(anvil.url)
        accounts = [Account.from_key(k) for k in anvil.private_keys[:n]]
        first = PipelinedClient.deploy(
            w3,
            accounts[0],
            min_peers=min_peers,
            commit_window=WINDOW_BLOCKS,
            attest_window=WINDOW_BLOCKS,
            commit_window_seconds=WINDOW_SECONDS,
            attest_window_seconds=WINDOW_SECONDS,
            eps_cap_micro=10_000_000,
            delta=1e-5,
            genesis_digest=kit.GENESIS,
            tx_timeout=30,
        )
        self.members = [first] + [PipelinedClient(w3, first.address, a, tx_timeout=30) for a in accounts[1:]]
        self.reader = PipelinedClient(w3, first.address)
        self.eps = [0] * n
        for i, (member, account) in enumerate(zip(self.members, accounts)):
            key = kit.identity(i)
            member.register(
                kit.peer_id_of_key(key), sign_registration(key, w3.eth.chain_id, first.address, account.address)
            )

    def commit(self, i: int, r: int, vote: bytes = NO_VOTE[0], bitmap: bytes = NO_VOTE[1], label: str = ""):
        """Member i's commit in round r; its mechanism named in its first commit only (then unchanged)."""
        mechanism = self.kit.MECHANISM if self.eps[i] == 0 else b""
        receipt = self.members[i].commit(
            r, self.kit.digest(label or f"{r}-{i}"), 100 + i, self.eps[i] + 1, mechanism, vote, bitmap
        )
        self.eps[i] += 1
        return receipt

    def current(self) -> int:
        return self.reader.current_round()

    def voting(self) -> tuple[int, bool, int]:
        v = self.reader.voting_round()
        return v.round, v.pending, v.participants

    def finalized(self) -> tuple[int, bytes]:
        """The last finalized round and its digest (from its events: not in storage)."""
        r = self.reader.last_finalized_round()
        found = self.reader.finalized(r) if r else None
        return (r, found[0]) if found else (0, self.kit.GENESIS)

    def counts(self) -> tuple[int, int, int]:
        return tuple(self.reader.contract.functions.openRoundCounts().call())

    def pass_window(self, seconds: int) -> None:
        self.anvil.rpc("evm_increaseTime", [seconds])
        self.anvil.mine(WINDOW_BLOCKS + 1)


@pytest.fixture
def ledger(automine_chain, kit):
    return lambda n, **kw: Ledger(automine_chain, kit, n, **kw)


def test_one_commit_per_member_closes_rounds_and_finalizes_the_one_before(ledger, kit):
    led = ledger(4)
    everyone = encode_bitmap([True] * 4)
    for i in range(4):
        led.commit(i, 1)
    assert (led.current(), led.voting()) == (2, (1, True, 4)), "the fourth commit closed round 1"
    gas: dict[int, list[int]] = {}
    for r in (2, 3, 4):
        agg = kit.digest(f"agg-{r - 1}")
        gas[r] = []
        for i in range(4):
            gas[r].append(led.commit(i, r, agg, everyone)["gasUsed"])
            # strict majority of round r - 1's 4 participants: the third vote finalizes it
            assert led.finalized() == ((r - 1, agg) if i >= 2 else (r - 2, led.finalized()[1]))
        assert led.current() == r + 1
    # round 3: the finalization rewrites a bitmap word that changes (the dearer case); round 4: the
    # same word again, unchanged (steady state). Round 2 is the first to use the round table.
    assert max(gas[3] + gas[4]) <= GAS_TARGET, gas
    assert gas[3][2] > gas[4][2], "a changed bitmap word costs the finalizer more"
    assert led.reader.finalized(3) == (kit.digest("agg-3"), everyone)
    assert [c.vote_digest for c in led.reader.voted_commits(4)] == [kit.digest("agg-3")] * 4
    assert [c.mechanism for c in led.reader.voted_commits(1)] == [kit.MECHANISM] * 4
    assert [c.mechanism for c in led.reader.voted_commits(2)] == [b""] * 4, "unchanged: not committed again"


def test_a_member_left_out_is_not_awaited_in_the_next_two_rounds(ledger, kit):
    led = ledger(4)
    for i in range(4):
        led.commit(i, 1)
    without_3 = encode_bitmap([True, True, True, False])
    for i in range(3):  # member 3's blob reached nobody: round 1's majority leaves it out
        led.commit(i, 2, kit.digest("agg-1"), without_3)
    assert led.finalized()[0] == 1
    assert led.current() == 3, "round 2 closed without waiting for member 3"
    assert led.counts() == (0, 1, 4), "round 3 opens not awaiting member 3 either (it sat round 2 out)"
    three = encode_bitmap([True] * 3)
    for i in range(3):
        led.commit(i, 3, kit.digest("agg-2"), three)
    assert led.current() == 4, "round 3 closed without member 3"
    assert led.counts() == (0, 0, 4), "round 4 awaits it again"
    for i in range(3):
        led.commit(i, 4, kit.digest("agg-3"), three)
    assert led.current() == 4
    led.commit(3, 4)  # its vote does not count: it did not take part in round 3
    assert led.current() == 5


def test_a_dissent_makes_the_early_close_wait_rather_than_skip_an_awaited_member(ledger, kit):
    led = ledger(5)
    for i in range(5):
        led.commit(i, 1)
    without_4 = encode_bitmap([True, True, True, True, False])
    led.commit(0, 2, kit.digest("agg-1"), without_4)
    led.commit(3, 2, kit.digest("another"), encode_bitmap([True] * 5))  # included, but dissenting
    led.commit(1, 2, kit.digest("agg-1"), without_4)
    led.commit(2, 2, kit.digest("agg-1"), without_4)  # the majority: round 1 final, member 4 left out
    assert led.finalized()[0] == 1
    # whether the dissenter is left out is not known without a loop: counted as left out, so member
    # 4 stays awaited (a round waits longer, never closes without someone it awaits)
    assert led.counts() == (4, 4, 5) and led.current() == 2
    with pytest.raises(errors.CommitWindowOpen):
        led.members[0].close_round(2)
    led.pass_window(WINDOW_SECONDS)
    led.members[0].close_round(2)
    assert led.current() == 3


def test_a_full_round_waits_for_its_predecessor_then_both_abort(ledger, kit):
    led = ledger(4)
    for i in range(4):
        led.commit(i, 1)
    everyone = encode_bitmap([True] * 4)
    for i in range(4):  # two votes each for two aggregates: no majority on round 1
        led.commit(i, 2, kit.digest(f"agg-{i % 2}"), everyone)
    assert led.current() == 2 and led.voting() == (1, True, 4), "round 2 is full but round 1 is not final"
    with pytest.raises(errors.PreviousPending):
        led.members[0].close_round(2)
    with pytest.raises(errors.AbortTooEarly):
        led.members[0].abort_round(1)
    led.pass_window(WINDOW_SECONDS)
    led.members[0].abort_round(1)
    assert led.current() == 3 and led.voting()[1] is False
    assert led.finalized() == (0, kit.GENESIS), "round 3 starts from the last finalized model"
    # round 2's commits were trained from round 1: gone with it; round 3 takes commits as round 1 did
    for i in range(4):
        led.commit(i, 3)
    assert led.current() == 4


def test_the_window_end_closes_a_round_in_the_next_rounds_first_commit(ledger, kit):
    led = ledger(4)
    for i in range(4):
        led.commit(i, 1)
    everyone = encode_bitmap([True] * 4)
    for i in range(3):  # member 3 is gone: round 2 waits for it until its window ends
        led.commit(i, 2, kit.digest("agg-1"), everyone)
    assert led.current() == 2 and led.finalized()[0] == 1
    three = encode_bitmap([True] * 3)
    with pytest.raises(errors.WrongRound):
        led.commit(0, 3, kit.digest("agg-2"), three)
    led.pass_window(WINDOW_SECONDS)
    with pytest.raises(errors.CommitWindowClosed):
        led.commit(3, 2, kit.digest("agg-1"), everyone)
    led.commit(0, 3, kit.digest("agg-2"), three)  # closes round 2, votes on it, commits in round 3
    assert led.current() == 3 and led.voting() == (2, True, 3)
    with pytest.raises(errors.NotParticipant):  # member 0 voted in its commit
        led.members[0].vote(2, kit.digest("agg-2"), three)
    with pytest.raises(errors.NotParticipant):  # member 3 sat round 2 out
        led.members[3].vote(2, kit.digest("agg-2"), three)
    with pytest.raises(errors.MalformedBitmap):
        led.members[1].vote(2, kit.digest("agg-2"), everyone)
    led.members[1].vote(2, kit.digest("agg-2"), three)  # a final vote: the second of three finalizes
    assert led.finalized() == (2, kit.digest("agg-2"))
    with pytest.raises(errors.NotVoting):
        led.members[2].vote(2, kit.digest("agg-2"), three)


def test_copied_digests_second_commits_and_a_first_commit_without_its_mechanism_are_refused(ledger, kit):
    led = ledger(3)
    with pytest.raises(errors.MissingMechanism):
        led.members[0].commit(1, kit.digest("1-0"), 100, 1, b"", *NO_VOTE)
    led.commit(0, 1)
    with pytest.raises(errors.DuplicateDigest):
        led.commit(1, 1, label="1-0")
    with pytest.raises(errors.AlreadyCommitted):
        led.commit(0, 1)
    with pytest.raises(errors.CommitWindowOpen):
        led.members[0].close_round(1)


def test_dissent_is_counted_apart_and_a_final_vote_closes_a_round_past_its_window(ledger, kit):
    led = ledger(4)
    for i in range(3):
        led.commit(i, 1)
    led.pass_window(WINDOW_SECONDS)
    led.commit(0, 2, kit.digest("agg-1"), encode_bitmap([True] * 3))  # closes round 1 (3 participants)
    assert led.voting() == (1, True, 3)
    three = encode_bitmap([True] * 3)
    led.commit(1, 2, kit.digest("other"), three)  # a dissenting vote: counted in the table
    led.commit(3, 2)  # member 3 sat round 1 out: its vote does not count
    assert led.voting()[1] is True and led.finalized()[0] == 0
    led.pass_window(WINDOW_SECONDS)
    with pytest.raises(errors.PreviousPending):
        led.members[0].close_round(2)
    led.members[2].vote(1, kit.digest("agg-1"), three)  # 2 of 3: round 1 final, and round 2 closes
    assert led.finalized() == (1, kit.digest("agg-1"))
    assert led.current() == 3 and led.voting() == (2, True, 3)


def test_reads_lie_confirmations_deep(ledger, kit):
    """A client with confirmations 2 sees a commit, the round it closed and the round it finalized
    only once two blocks are built on it; one at the head sees them at once."""
    led = ledger(2)
    deep = PipelinedClient(connect(led.anvil.url), led.reader.address, confirmations=2)
    for i in range(2):
        led.commit(i, 1)
    led.anvil.mine(2)
    agg, both = kit.digest("agg-1"), encode_bitmap([True, True])
    led.commit(0, 2, agg, both)
    led.commit(1, 2, agg, both)  # closes round 2 and finalizes round 1 (2 of 2 votes)
    assert (led.current(), led.reader.finalized(1)) == (3, (agg, both))
    assert deep.block_number() == deep.head() - 2
    assert (deep.current_round(), deep.voted_commits(2), deep.finalized(1)) == (2, [], None)  # 0 blocks on the last
    led.anvil.mine(1)
    assert (deep.current_round(), [c.index for c in deep.voted_commits(2)]) == (2, [0])
    assert (deep.finalized(1), deep.last_finalized_round(), deep.voting_round().pending) == (None, 0, True)
    led.anvil.mine(1)
    assert (deep.current_round(), len(deep.voted_commits(2)), deep.finalized(1)) == (3, 2, (agg, both))
    assert deep.last_finalized_round() == 1
    with pytest.raises(ValueError):
        PipelinedClient(deep.w3, deep.address, confirmations=-1)


def test_logs_are_read_in_chunks_from_the_deployment_and_requests_counted(ledger, kit, monkeypatch):
    """Commits spread over more blocks than one log request spans all come back, in order, from
    ceil(blocks / chunk) requests per event; the reads' requests are counted."""
    led = ledger(3)
    monkeypatch.setattr(pipelined, "LOG_CHUNK_BLOCKS", 4)
    for i in range(3):
        led.commit(i, 1)
        led.anvil.mine(5)  # the next commit lies in another chunk
    client = led.members[0]
    assert client.from_block > 0  # set by deploy: nothing before the deployment is read
    before = client.rpc_requests()
    members = [Account.from_key(k).address for k in led.anvil.private_keys[:3]]
    assert [c.peer for c in client.voted_commits(1)] == members
    chunks = -(-(client.block_number() - client.from_block + 1) // 4)
    # Committed, RoundClosed and RoundAborted in one request per chunk, the head, the current round
    assert client.rpc_requests() - before >= chunks + 2
    assert client.rpc_requests() - before <= chunks + 6


def test_logs_that_lag_their_block_are_read_again_until_the_state_accounts_for_them(ledger, kit):
    """An endpoint that serves a block's logs 0.5 s after the block: the commitments of the open
    round, and those of a round just closed, read at once still come out complete."""
    led = ledger(2)
    with rpc_proxy(led.anvil.url, ProxyFaults(latency_s=0.0, jitter_s=0.0, log_lag_s=0.5)) as proxy:
        reader = PipelinedClient(connect(proxy.url), led.reader.address)
        assert reader.voted_commits(1) == []  # the proxy has seen the chain up to here
        led.commit(0, 1)
        assert [c.index for c in reader.voted_commits(1)] == [0]
        led.commit(1, 1)  # closes round 1: its RoundClosed lags too
        assert [c.index for c in reader.voted_commits(1)] == [0, 1]
        assert proxy.stats.logs_held_back > 0  # the lag was real


def test_votes_counted_off_chain_are_the_contracts(ledger, kit):
    """node/chain/votes.py on a real ledger: a dissent is counted apart, a vote from a member that sat
    the round out only names its base, and the vote that reaches the majority off chain is the one
    whose transaction finalized the round on chain (here a final vote)."""
    led = ledger(4)
    for i in range(3):
        led.commit(i, 1)
    led.pass_window(WINDOW_SECONDS)
    agg, other, three = kit.digest("agg-1"), kit.digest("other"), encode_bitmap([True] * 3)
    led.commit(0, 2, agg, three)  # closes round 1 (3 participants)
    led.commit(1, 2, other, three)  # dissent
    led.commit(3, 2, agg, three)  # sat round 1 out: not counted
    reader = led.reader

    def counted():
        return votes_on(reader.voted_commits(1), reader.voted_commits(2), reader.final_votes(1))

    peers = [c.peer for c in reader.voted_commits(1)]
    votes = counted()
    assert [(v.peer, v.aggregate_digest, v.votes) for v in votes] == [(peers[0], agg, 1), (peers[1], other, 1)]
    assert majority(votes, 3) is None and reader.finalized(1) is None
    assert leading(votes) == votes[0]  # a tie: the key voted first leads
    led.members[2].vote(1, agg, three)  # 2 of 3: round 1 final
    votes = counted()
    assert [v.votes for v in votes] == [1, 1, 2] and votes[2].peer == peers[2]
    assert leading(votes) == votes[2] == majority(votes, 3)
    assert reader.finalized(1) == (agg, three)
    assert reader.final_votes(1)[0].block_number == votes[2].block_number
