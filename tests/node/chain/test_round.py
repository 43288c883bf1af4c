"""A full round with 3 accounts, registration to finalization, on automine Anvil and on Anvil
started like a testnet (chain id 11155111, one block per second: receipts awaited for real)."""

from __future__ import annotations

import json

from node.chain.client import LedgerClient
from node.chain.records import RoundState, describe_mechanism
from node.protocol.wire import encode_bitmap


def test_full_round_three_accounts(chain, kit):
    swarm = kit.Swarm(chain, 3, min_peers=3, commit_window=3, attest_window=3)
    assert swarm.w3.eth.chain_id == chain.chain_id
    swarm.register(3)
    swarm.commit_all(1, 3)
    commitments = swarm.reader.commitments(1)
    assert [c.peer for c in commitments] == [a.address for a in swarm.accounts]
    assert [c.index for c in commitments] == [0, 1, 2]
    assert commitments[1].digest == kit.digest("r1-p1") and commitments[1].num_samples == 101
    assert describe_mechanism(commitments[0].mechanism)["protects"].startswith("sign only")
    own = swarm.reader.commitment_of(1, swarm.accounts[2].address)
    assert own.digest == kit.digest("r1-p2") and own.eps_micro == 1_000_000
    swarm.pass_commit_window(1)
    swarm.peers[2].close_round(1)
    aggregate = kit.digest("aggregate r1")
    for peer in swarm.peers[:2]:
        peer.attest(1, aggregate, encode_bitmap([True, True, True]))
    info = swarm.reader.round_info(1)
    assert info.state is RoundState.FINALIZED and info.finalized_digest == aggregate
    assert swarm.reader.current_round() == 2
    assert swarm.reader.round_info(2).state is RoundState.OPEN
    snap = swarm.reader.snapshot()
    json.dumps(snap)  # JSON-able
    assert snap["rounds"][0]["finalized_digest"] == aggregate.hex()
    assert [p["eps_spent_micro"] for p in snap["peers"]] == [1_000_000] * 3
    assert len(snap["rounds"][0]["attestations"]) == 2


def test_back_to_back_transactions_keep_nonces(chain, kit):
    """Two transactions from one account sent without another client in between: the local
    nonce counter, not the node's pending count, orders them."""
    swarm = kit.Swarm(chain, 1, min_peers=1)
    again = LedgerClient(swarm.w3, swarm.address, swarm.accounts[0])
    swarm.deployer.register(b"solo", b"")
    swarm.deployer.commit(1, kit.digest("solo"), 5, 10, kit.MECHANISM)
    assert again.eps_spent(swarm.accounts[0].address) == 10
