"""An attacker's review of the one-transaction-per-round port (contracts/PipelinedLedger.sol, docs/
LEDGER.md "One transaction per round") on a real Anvil: hostile members send their transactions to the
contract directly (some through a member that is a contract, `BatchMember`, to put several calls in one
transaction), and hostile code sits at a ledger address. Each test asserts the safe outcome: the peers
and `swarm verify` (both read through `PipelinedClient`, count votes with `node.chain.votes` and apply
`node.rules.base_verdict`) agree with the contract on which key finalized a round and whose votes
counted, a mechanism resolves alike on every read, a read's cost does not grow with the chain's age,
and a look-alike contract is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from node.chain import errors, pipelined
from node.chain.anvil import start_anvil
from node.chain.client import connect
from node.chain.errors import LedgerError
from node.chain.kind import ledger_kind
from node.chain.pipelined import PipelinedClient
from node.chain.records import RoundState
from node.chain.registration import sign_registration
from node.chain.votes import majority
from node.protocol.wire import encode_bitmap
from node.rules import base_verdict
from node.verify_pipelined import PipelinedVerifier
from tests.node.chain.test_pipelined_ledger import NO_VOTE, WINDOW_SECONDS, Ledger

# A member account that is a contract: `run(targets, calls)` makes call i of `calls` to `targets[i]`
# in one transaction, the contract the caller of each, and reverts with the first call that does.
#     contract Batch {
#         function run(address[] calldata targets, bytes[] calldata calls) external {
#             for (uint256 i = 0; i < calls.length; ++i) {
#                 (bool ok, bytes memory ret) = targets[i].call(calls[i]);
#                 if (!ok) assembly { revert(add(ret, 32), mload(ret)) }
#             }
#         }
#     }
# (solc 0.8.28, node_modules/.bin/solcjs --bin --optimize: the default EVM version, which Anvil runs)
BATCH_ABI = json.loads(
    '[{"inputs":[{"internalType":"address[]","name":"targets","type":"address[]"},{"internalType":"bytes['
    ']","name":"calls","type":"bytes[]"}],"name":"run","outputs":[],"stateMutability":"nonpayable","type"'
    ':"function"}]'
)
BATCH_BYTECODE = (
    "0x6080604052348015600e575f5ffd5b5061028e8061001c5f395ff3fe608060405234801561000f575f5ffd5b50600436106100"
    "29575f3560e01c80634d618e3b1461002d575b5f5ffd5b61004061003b366004610159565b610042565b005b5f5b818110156101"
    "0a575f5f868684818110610060576100606101c5565b905060200201602081019061007591906101d9565b6001600160a01b0316"
    "858585818110610090576100906101c5565b90506020028101906100a29190610206565b6040516100b0929190610249565b5f60"
    "4051808303815f865af19150503d805f81146100e9576040519150601f19603f3d011682016040523d82523d5f602084013e6100"
    "ee565b606091505b50915091508161010057805160208201fd5b5050600101610044565b5050505050565b5f5f83601f84011261"
    "0121575f5ffd5b50813567ffffffffffffffff811115610138575f5ffd5b6020830191508360208260051b850101111561015257"
    "5f5ffd5b9250929050565b5f5f5f5f6040858703121561016c575f5ffd5b843567ffffffffffffffff811115610182575f5ffd5b"
    "61018e87828801610111565b909550935050602085013567ffffffffffffffff8111156101ad575f5ffd5b6101b9878288016101"
    "11565b95989497509550505050565b634e487b7160e01b5f52603260045260245ffd5b5f602082840312156101e9575f5ffd5b81"
    "356001600160a01b03811681146101ff575f5ffd5b9392505050565b5f5f8335601e1984360301811261021b575f5ffd5b830180"
    "35915067ffffffffffffffff821115610235575f5ffd5b602001915036819003821315610152575f5ffd5b818382375f91019081"
    "5291905056fea26469706673582212205f198cd66d9d0d9048fdbe257d918ef57449726c76d831a4dd6ccac975ee878964736f6c"
    "634300081c0033"
)
DRIVER = 7  # the dev account that sends a contract member's transactions (the Ledger's members are 0..n-1)
OTHER_MECHANISM = json.dumps({"name": "pnpm", "epsilon": 0.5}, separators=(",", ":")).encode()


def send(w3: Web3, sender: LocalAccount, fn: Any) -> Any:
    """`fn` sent from `sender` (gas given: a reverting call is mined, and refused here by its status)."""
    tx = fn.build_transaction(
        {
            "from": sender.address,
            "nonce": w3.eth.get_transaction_count(sender.address, "pending"),
            "gas": 8_000_000,
            "chainId": w3.eth.chain_id,
        }
    )
    receipt = w3.eth.wait_for_transaction_receipt(
        w3.eth.send_raw_transaction(sender.sign_transaction(tx).raw_transaction), timeout=30
    )
    assert receipt["status"] == 1, f"reverted: {fn.fn_name if hasattr(fn, 'fn_name') else 'deploy'}"
    return receipt


class BatchMember:
    """A registered member that is a contract: several ledger calls in one transaction of its own."""

    def __init__(self, led: Ledger, kit: Any, identity: int) -> None:
        self.w3 = led.reader.w3
        self.driver = Account.from_key(led.anvil.private_keys[DRIVER])
        factory = self.w3.eth.contract(abi=BATCH_ABI, bytecode=BATCH_BYTECODE)
        self.address = send(self.w3, self.driver, factory.constructor())["contractAddress"]
        self.batch = self.w3.eth.contract(address=self.address, abi=BATCH_ABI)
        self.ledger = led.reader.contract
        key = kit.identity(identity)
        signature = sign_registration(key, self.w3.eth.chain_id, led.reader.address, self.address)
        self.run(("register", kit.peer_id_of_key(key), signature))

    def calls(self, *calls: tuple[Any, ...]) -> list[tuple[str, bytes]]:
        """Ledger calls of this member, (target, calldata) each."""
        return [(self.ledger.address, encoded(self.ledger, name, *args)) for name, *args in calls]

    def also(self, other: BatchMember, *calls: tuple[Any, ...]) -> list[tuple[str, bytes]]:
        """Ledger calls of `other` member, made inside this member's transaction."""
        targets, data = zip(*other.calls(*calls))
        return [(other.address, encoded(other.batch, "run", list(targets), list(data)))]

    def run(
        self,
        *calls: tuple[Any, ...],
        inner: list[tuple[str, bytes]] | None = None,
        first: list[tuple[str, bytes]] | None = None,
    ) -> Any:
        """`calls` of this member in one transaction, after the calls `first` and before `inner`."""
        targets, data = zip(*((first or []) + self.calls(*calls) + (inner or [])))
        return send(self.w3, self.driver, self.batch.functions.run(list(targets), list(data)))


def encoded(contract: Any, name: str, *args: Any) -> bytes:
    return bytes.fromhex(contract.encode_abi(name, args=list(args))[2:])


def counted(votes: list[Any]) -> list[tuple[str, bytes, bytes, int]]:
    return [(v.peer, v.aggregate_digest, v.included, v.votes) for v in votes]


def test_more_votes_in_the_finalizing_transaction_leave_the_outcome_as_the_contract_counted(automine_chain, kit):
    """Three members that are contracts share one transaction: the third commits round 2 with a
    dissenting vote on round 1 (counted, before the finalization), the first sends the vote that
    finalizes round 1 and then its round 2 commit (a vote, not counted: it voted), then the second its
    round 2 commit with a vote on round 1 (not counted: round 1 is final). Every read (the round, its
    outcome, the last finalized, the counted votes, verify's check) gives round 1's outcome and
    counted votes as the contract has them."""
    led = Ledger(automine_chain, kit, 3)
    first, second, third = (BatchMember(led, kit, i) for i in (4, 5, 6))
    members = [m.account.address for m in led.members]
    for i in range(3):
        led.commit(i, 1)
    for j, hostile in enumerate((first, second, third)):
        hostile.run(("commit", 1, kit.digest(f"1-h{j}"), 100, 1, 0, kit.MECHANISM, *NO_VOTE))
    assert led.voting() == (1, True, 6), "the sixth commit filled round 1"
    agg, other, everyone = kit.digest("agg-1"), kit.digest("other"), encode_bitmap([True] * 6)
    for i in range(3):
        led.commit(i, 2, agg, everyone)
    assert led.reader.last_finalized_round() == 0, "3 of 6: no majority yet"
    receipt = first.run(
        ("vote", 1, agg, everyone),  # the fourth of 6: round 1 finalizes here
        ("commit", 2, kit.digest("2-h0"), 100, 2, 0, b"", kit.digest("no one computed this"), b"\x07"),
        first=first.also(third, ("commit", 2, kit.digest("2-h2"), 100, 2, 0, b"", other, everyone)),
        inner=first.also(second, ("commit", 2, kit.digest("2-h1"), 100, 2, 0, b"", agg, everyone)),
    )
    reader = led.reader
    assert reader.last_finalized_round() == 1, "the contract finalized round 1"
    assert reader.current_round() == 3, "the sixth round 2 commit closed round 2"
    assert reader.finalized(1) == (agg, everyone)
    info = reader.round_info(1)
    assert (info.state, info.finalized_digest, info.ended_block) == (RoundState.FINALIZED, agg, receipt["blockNumber"])
    assert reader.last_finalized() == (1, agg)
    votes = reader.attestations(1)
    assert counted(votes) == [
        (members[0], agg, everyone, 1),
        (members[1], agg, everyone, 2),
        (members[2], agg, everyone, 3),
        (third.address, other, everyone, 1),
        (first.address, agg, everyone, 4),
    ], "the dissent before the finalizing vote counts, neither vote after it"
    winner = majority(votes, 6)
    assert winner is not None and (winner.peer, winner.block_number) == (first.address, receipt["blockNumber"])
    assert [v.peer for v in reader.final_votes(1)] == [first.address]
    verifier = PipelinedVerifier(PipelinedClient(reader.w3, reader.address), {})
    verifier.check_finalization(info)
    assert verifier.report.failures == []


def test_a_vote_in_the_aborting_transaction_counts_and_none_can_follow_the_abort(automine_chain, kit):
    """A member that is a contract sends a final vote on round 1 and aborts it in one transaction: the
    vote counts (it came before RoundAborted), and no vote can follow an abort in its transaction."""
    led = Ledger(automine_chain, kit, 2)
    hostile = BatchMember(led, kit, 5)
    members = [m.account.address for m in led.members]
    for i in range(2):
        led.commit(i, 1)
    hostile.run(("commit", 1, kit.digest("1-h"), 100, 1, 0, kit.MECHANISM, *NO_VOTE))
    assert led.voting() == (1, True, 3)
    everyone = encode_bitmap([True] * 3)
    split = [kit.digest("a"), kit.digest("b"), kit.digest("c")]
    for i in range(2):
        led.commit(i, 2, split[i], everyone)
    led.pass_window(WINDOW_SECONDS)
    with pytest.raises(AssertionError, match="reverted"):  # round 1 is no more voting once aborted
        hostile.run(("abortRound", 1), ("vote", 1, split[2], everyone))
    receipt = hostile.run(("vote", 1, split[2], everyone), ("abortRound", 1))
    reader = led.reader
    info = reader.round_info(1)
    assert (info.state, info.ended_block) == (RoundState.ABORTED, receipt["blockNumber"])
    assert counted(reader.attestations(1)) == [
        (members[0], split[0], everyone, 1),
        (members[1], split[1], everyone, 1),
        (hostile.address, split[2], everyone, 1),
    ]
    assert reader.last_finalized() == (0, kit.GENESIS)


def test_hostile_votes_count_off_chain_as_the_contract_counts_them(automine_chain, kit):
    """Round 1's five participants and a member that sat it out vote on it: the outsider's votes (a
    zero digest and no bitmap in its commit, then a final vote) are not counted, nor a participant's
    final vote after its counted commit, nor a participant's commit after its final vote (carrying a
    5,000-byte bitmap), nor a vote after the finalization, and a participant's vote with a bitmap of the
    wrong length, a padding bit set or a zero digest is refused with its commit; a final vote gives the
    key its majority of 5. The counted votes, the finalizing block and the key read are the contract's,
    and the base rule leaves out exactly the round 2 commits that name another model than the
    finalized one, for the peers (their rule over the commits' votes) and for verify alike."""
    led = Ledger(automine_chain, kit, 6)
    reader, members = led.reader, [m.account.address for m in led.members]
    for i in range(5):
        led.commit(i, 1)
    led.pass_window(WINDOW_SECONDS)
    key, other, five = kit.digest("agg-1"), kit.digest("other"), encode_bitmap([True] * 5)
    led.commit(5, 2, b"\0" * 32, b"")  # the outsider's first commit closes round 1: a zero digest, not counted
    assert led.voting() == (1, True, 5)
    with pytest.raises(errors.NotParticipant):
        led.members[5].vote(1, key, five)
    led.commit(0, 2, key, five)  # counted: 1
    with pytest.raises(errors.NotParticipant):  # its last commit is of round 2 now
        led.members[0].vote(1, key, five)
    led.members[2].vote(1, other, five)  # counted, for another key
    led.commit(2, 2, key, b"\xff" * 5000)  # voted already: not counted, its bitmap never checked
    for digest, bitmap, refusal in (
        (key, b"\x1f\x00", errors.MalformedBitmap),  # a byte too long
        (key, b"\xff", errors.MalformedBitmap),  # a bit past the fifth participant
        (b"\0" * 32, five, errors.InvalidDigest),
    ):
        with pytest.raises(refusal):
            led.commit(1, 2, digest, bitmap)
    led.commit(1, 2, key, five)  # counted: 2
    assert reader.last_finalized_round() == 0, "no majority yet: only the counted votes count"
    finalizing = led.members[3].vote(1, key, five)  # 3 of 5: final
    assert reader.last_finalized_round() == 1
    led.commit(4, 2, kit.digest("late"), five)  # after the finalization: not counted
    with pytest.raises(errors.NotVoting):
        led.members[4].vote(1, key, five)

    votes = reader.attestations(1)
    assert counted(votes) == [
        (members[0], key, five, 1),
        (members[2], other, five, 1),
        (members[1], key, five, 2),
        (members[3], key, five, 3),
    ]
    winner = majority(votes, 5)
    info = reader.round_info(1)
    assert winner is not None and winner.block_number == info.ended_block == finalizing["blockNumber"]
    assert reader.finalized(1) == (key, five) and info.finalized_digest == key
    verifier = PipelinedVerifier(PipelinedClient(reader.w3, reader.address), {})
    verifier.check_finalization(info)
    assert verifier.report.failures == []
    left_out = {c.peer for c in reader.voted_commits(2) if base_verdict(2, c.vote_digest, key) is not None}
    assert left_out == {members[4], members[5]}
    by_verify = {c.peer for c in reader.commitments(2) if verifier.base_verdict(2, c) is not None}
    assert by_verify == left_out


def test_a_first_commit_without_a_mechanism_is_refused(automine_chain, kit):
    """The rule every read of an empty mechanism relies on (the member named one before): a member's
    first commit that names none is refused, also from a member that is a contract."""
    led = Ledger(automine_chain, kit, 2)
    with pytest.raises(errors.MissingMechanism):
        led.members[0].commit(1, kit.digest("1-0"), 100, 1, b"", *NO_VOTE)
    hostile = BatchMember(led, kit, 5)
    with pytest.raises(AssertionError, match="reverted"):
        hostile.run(("commit", 1, kit.digest("1-h"), 100, 1, 0, b"", *NO_VOTE))
    assert led.counts()[0] == 0


def test_votes_on_aborted_rounds_are_not_counted_and_the_round_after_counts_afresh(automine_chain, kit):
    """Round 1 closes, its votes split 2 to 2 in round 2 commits; it is aborted with round 2. Round 3's
    commits carry votes on round 2 (aborted while open: the contract counts none), a final vote on it
    is refused, and round 3's own votes in round 4 finalize it from counts that start at zero."""
    led = Ledger(automine_chain, kit, 4)
    reader, members = led.reader, [m.account.address for m in led.members]
    everyone = encode_bitmap([True] * 4)
    for i in range(4):
        led.commit(i, 1)
    split = [kit.digest("split-a"), kit.digest("split-b")]
    for i in range(4):
        led.commit(i, 2, split[i % 2], everyone)
    assert led.current() == 2, "round 2 cannot close on a pending round 1"
    led.pass_window(WINDOW_SECONDS)
    aborted = led.members[3].abort_round(1)["blockNumber"]
    assert led.current() == 3
    with pytest.raises(errors.NotVoting):
        led.members[0].vote(2, split[0], everyone)
    for i in range(4):  # votes on round 2, aborted: none counts
        led.commit(i, 3, split[0], everyone)
    assert led.voting() == (3, True, 4)
    key = kit.digest("agg-3")
    finalizing = [led.commit(i, 4, key, everyone) for i in range(3)][2]

    assert [v.block_number <= aborted for v in reader.attestations(1)] == [True] * 4
    assert majority(reader.attestations(1), 4) is None
    assert reader.attestations(2) == []
    assert (reader.round_info(1).state, reader.round_info(2).state) == (RoundState.ABORTED, RoundState.ABORTED)
    votes = reader.attestations(3)
    assert counted(votes) == [(members[i], key, everyone, i + 1) for i in range(3)]
    winner = majority(votes, 4)
    assert winner is not None and winner.block_number == reader.round_info(3).ended_block == finalizing["blockNumber"]
    assert reader.last_finalized() == (3, key)
    verifier = PipelinedVerifier(PipelinedClient(reader.w3, reader.address), {})
    assert [verifier.base_verdict(3, c) for c in reader.commitments(3)] == [None] * 4, "round 2 finalized nothing"


def test_a_mechanism_named_in_an_aborted_round_resolves_alike_on_every_read(automine_chain, kit):
    """Member 0 names another mechanism in round 2, which is aborted, and none in round 3: every read
    (the round's commitments, its whole history, its history from a block, a client that read nothing
    before) resolves round 3's to the one named in the aborted round, as the contract's rule says."""
    led = Ledger(automine_chain, kit, 2)
    reader, member = led.reader, led.members[0].account.address
    for i in range(2):
        led.commit(i, 1)
    led.members[0].commit(2, kit.digest("2-0"), 100, 2, OTHER_MECHANISM, kit.digest("a"), encode_bitmap([True] * 2))
    led.eps[0] = 2
    led.commit(1, 2, kit.digest("b"), encode_bitmap([True] * 2))  # 1 of 2 each: no majority
    led.pass_window(WINDOW_SECONDS)
    led.members[1].abort_round(1)
    third = led.commit(0, 3)  # no mechanism: the last named, in aborted round 2
    assert reader.round_info(2).state is RoundState.ABORTED
    fresh = PipelinedClient(reader.w3, reader.address)
    assert [c.mechanism for c in reader.commitments(3)] == [OTHER_MECHANISM]
    assert [c.mechanism for c in fresh.commitments(3)] == [OTHER_MECHANISM]
    assert [c.mechanism for c in reader.commit_history(member)] == [kit.MECHANISM, OTHER_MECHANISM, OTHER_MECHANISM]
    since = PipelinedClient(reader.w3, reader.address).commit_history(member, third["blockNumber"])
    assert [c.mechanism for c in since] == [OTHER_MECHANISM]


def test_large_mechanisms_named_every_round_are_not_all_kept(automine_chain, kit):
    """A member names a fresh 20 kB mechanism in each of rounds 1 to 7 but 6 and 8: every peer
    resolves its commits (the newest first, then an older one behind the one kept, then all again),
    keeping no more than one mechanism per member."""
    led = Ledger(automine_chain, kit, 2)
    reader, everyone = led.reader, encode_bitmap([True] * 2)
    large = {r: json.dumps({"name": "pad", "pad": f"{r}" + "x" * 20_000}).encode() for r in (1, 2, 3, 4, 5, 7)}
    for r in range(1, 9):
        vote = (kit.digest(f"agg-{r - 1}"), everyone) if r > 1 else NO_VOTE
        led.members[0].commit(r, kit.digest(f"{r}-0"), 100, r, large.get(r, b""), *vote)
        led.commit(1, r, *vote)

    def kept() -> int:
        return sum(len(named.mechanism) for _, named in reader._named.values() if named is not None)

    bound = len(large[7]) + len(kit.MECHANISM)
    assert [c.mechanism for c in reader.commitments(8)] == [large[7], kit.MECHANISM]
    assert kept() <= bound, f"{kept()} bytes of mechanisms kept"
    assert [c.mechanism for c in reader.commitments(6)] == [large[5], kit.MECHANISM], "behind the one kept"
    for r in range(1, 9):
        assert [c.mechanism for c in reader.commitments(r)] == [large.get(r) or large[r - 1], kit.MECHANISM]
    history = reader.commit_history(led.members[0].account.address)
    assert [c.mechanism for c in history] == [large.get(r) or large[r - 1] for r in range(1, 9)]
    assert kept() <= bound, f"{kept()} bytes of mechanisms kept"


def test_a_read_of_a_round_costs_no_more_as_the_chain_grows(kit, monkeypatch):
    """The reads peers and verify make of a finalized round, each counted in requests to the endpoint,
    cost the same after the chain grew by 5 log chunks of empty blocks (a swarm that runs for months)."""
    monkeypatch.setattr(pipelined, "LOG_CHUNK_BLOCKS", 8)
    with start_anvil(accounts=8) as anvil:
        led = Ledger(anvil, kit, 2)
        everyone = encode_bitmap([True] * 2)
        for r in (1, 2):
            for i in range(2):
                led.commit(i, r, *((kit.digest("agg-1"), everyone) if r == 2 else NO_VOTE))
        reader = PipelinedClient(connect(anvil.url), led.reader.address, from_block=led.members[0].from_block)
        reads = {
            "round_info": lambda: reader.round_info(1),
            "voted_commits": lambda: reader.voted_commits(1),
            "attestations": lambda: reader.attestations(1),
            "finalized": lambda: reader.finalized(1),
            "last_finalized": reader.last_finalized,
            "final_votes": lambda: reader.final_votes(1),
            "commitments": lambda: reader.commitments(2),
        }

        def cost() -> dict[str, int]:
            spent = {}
            for name, read in reads.items():
                reader._drop_kept()  # the reads themselves, not what the client keeps of a settled round
                before = reader.rpc_requests()
                read()
                spent[name] = reader.rpc_requests() - before
            return spent

        cost()  # what a first read caches (timestamps, the settings)
        young = cost()
        anvil.mine(5 * 8)
        assert cost() == young


def test_the_round_index_follows_a_reorganisation(automine_chain, kit):
    """The chain in which the reader indexed round 1's close is replaced (evm_revert, then new
    blocks: a reorganisation deeper than its 0 confirmations) by one where round 1 closes later, then
    by one where it closes earlier: each time the reader's reads of rounds 1 and 2 are the new
    chain's (the index forgets an opening that no longer holds and reads it again)."""
    led = Ledger(automine_chain, kit, 2)
    anvil, reader = automine_chain, led.reader
    accounts = [Account.from_key(k) for k in anvil.private_keys[:2]]

    def close_round_1(label: str) -> int:
        for i in range(2):
            mechanism = reader.contract.functions.commit(
                1, kit.digest(f"{label}{i}"), 100, 1, 0, kit.MECHANISM, *NO_VOTE
            )
            closed = send(reader.w3, accounts[i], mechanism)["blockNumber"]
        return int(closed)

    def rounds() -> tuple[int, int, list[bytes]]:
        return (
            reader.round_info(1).closed_block,
            reader.round_info(2).opened_block,
            [c.digest for c in reader.voted_commits(1)],
        )

    snapshot = anvil.rpc("evm_snapshot")
    anvil.mine(3)
    closed = close_round_1("a")
    assert rounds() == (closed, closed, [kit.digest("a0"), kit.digest("a1")])
    for label, empty in (("b", 6), ("c", 0)):  # later, then earlier than the last one read
        head = anvil.block_number()
        anvil.rpc("evm_revert", [snapshot])
        snapshot = anvil.rpc("evm_snapshot")
        anvil.mine(empty)
        moved = close_round_1(label)
        assert moved != closed
        anvil.mine(max(0, head + 1 - anvil.block_number()))  # the reader takes no head behind one it read
        assert rounds() == (moved, moved, [kit.digest(f"{label}0"), kit.digest(f"{label}1")])
        closed = moved


def test_a_look_alike_with_forged_state_is_refused(automine_chain, kit):
    """A contract created by other code than the artifact's constructor, whose runtime code is a real
    PipelinedLedger's (immutables included), its state forged (round 7 open, round 6 finalized) and a
    RoundOpened(1) event emitted at its creation: `ledger_kind` may take it for a PipelinedLedger by
    its code (it cannot tell a constructor's work from its code), but the client refuses to read its
    settings (not created by the artifact's creation code), so no peer plays on it, and verify fails it."""
    led = Ledger(automine_chain, kit, 1)
    w3 = led.reader.w3
    runtime = bytes(w3.eth.get_code(led.reader.address))
    opened = bytes.fromhex(led.reader._signatures["RoundOpened"][2:])
    live = 7 | (6 << 160)
    prefix = (
        b"\x7f" + kit.GENESIS + b"\x60\x20\x52"  # mstore(0x20, genesis)
        b"\x60\x01\x7f" + opened + b"\x60\x40\x60\x00\xa2"  # log2(0, 0x40, RoundOpened, 1)
        b"\x7f" + live.to_bytes(32, "big") + b"\x60\x00\x55"  # sstore(0, live)
    )
    tail_len = 3 + 3 + 2 + 1 + 3 + 2 + 1  # codecopy(0, offset, size), return(0, size)
    offset = len(prefix) + tail_len
    size = len(runtime).to_bytes(2, "big")
    initcode = (
        prefix
        + b"\x61" + size + b"\x61" + offset.to_bytes(2, "big") + b"\x60\x00\x39"
        + b"\x61" + size + b"\x60\x00\xf3"
        + runtime
    )  # fmt: skip
    driver = Account.from_key(automine_chain.private_keys[DRIVER])
    tx = {
        "from": driver.address,
        "nonce": w3.eth.get_transaction_count(driver.address, "pending"),
        "gas": 8_000_000,
        "gasPrice": w3.eth.gas_price * 2,
        "data": initcode,
        "chainId": w3.eth.chain_id,
    }
    receipt = w3.eth.wait_for_transaction_receipt(
        w3.eth.send_raw_transaction(driver.sign_transaction(tx).raw_transaction), timeout=30
    )
    fake = receipt["contractAddress"]
    assert bytes(w3.eth.get_code(fake)) == runtime
    client = PipelinedClient(w3, fake)
    assert client.current_round() == 7, "the forged state reads through the views"
    with pytest.raises(LedgerError, match="not created by the PipelinedLedger artifact"):
        client.params()
    assert ledger_kind(w3, fake) == "pipelined"
    report = PipelinedVerifier(PipelinedClient(w3, fake), {}).run()
    assert not report.ok and "code" in {f.check for f in report.failures}, report.failures
