"""The cheap reads a waiting peer polls: the block number past web3's
middleware, and whether the ledger emitted anything in a range of blocks; on a real Anvil."""

from __future__ import annotations

import pytest

from node.chain import client as client_module
from node.chain.anvil import start_anvil
from node.chain.client import head_block
from node.chain.errors import LedgerError


def test_activity_says_when_and_only_when_the_ledger_emitted_an_event(kit):
    with start_anvil(accounts=3) as anvil:  # automine: one block per transaction, none otherwise
        swarm = kit.Swarm(anvil, 3, min_peers=1, commit_window=50, attest_window=50)
        swarm.register(1)
        ledger = swarm.peers[0]
        start = ledger.block_number()
        assert start == swarm.w3.eth.block_number == head_block(swarm.w3)
        assert not ledger.activity(start + 1, start)  # an empty range

        anvil_mine = swarm.w3.provider.make_request("evm_mine", [])  # a block without ledger events
        assert "result" in anvil_mine
        quiet = ledger.block_number()
        assert quiet == start + 1 and not ledger.activity(start + 1, quiet)

        ledger.commit(1, kit.digest("one"), 100, 1_000_000, kit.MECHANISM)  # emits Committed
        busy = ledger.block_number()
        assert busy == quiet + 1
        assert ledger.activity(busy, busy) and ledger.activity(start + 1, busy)


def lag_logs(reader, monkeypatch, lagging: int) -> dict[str, int]:
    """Make `reader`'s log queries drop their newest event for the first `lagging` calls (an RPC
    whose logs lag its state: it cannot be caused on demand); storage reads and the other events
    are the real chain's. Returns the call counter, which the test may reset and re-arm."""
    monkeypatch.setattr(client_module, "LOG_LAG_PAUSE", 0.0)
    real_logs = reader._logs
    calls = {"n": 0, "lagging": lagging}

    def lagging_logs(*args, **kwargs):
        calls["n"] += 1
        found = real_logs(*args, **kwargs)
        return found[:-1] if calls["n"] <= calls["lagging"] else found

    monkeypatch.setattr(reader, "_logs", lagging_logs)
    return calls


def test_commitments_read_again_while_the_logs_lag_the_state_and_fail_if_they_stay_behind(
    automine_chain, kit, monkeypatch
):
    """An RPC may report a block whose events eth_getLogs does not return yet (seen on Anvil under
    load: a peer died of "2 Committed events for 3 stored participants")."""
    swarm = kit.Swarm(automine_chain, 3, min_peers=1, commit_window=50, attest_window=50)
    swarm.register(3)
    swarm.commit_all(1, 3)
    reader = swarm.reader
    calls = lag_logs(reader, monkeypatch, lagging=2)
    assert [c.index for c in reader.commitments(1)] == [0, 1, 2]  # the third read is complete
    assert calls["n"] == 3

    calls.update(n=0, lagging=10**6)  # logs that never catch up: an error, after every retry
    with pytest.raises(LedgerError, match="2 Committed events for 3 stored participants"):
        reader.commitments(1)
    assert calls["n"] == client_module.LOG_LAG_RETRIES + 1


def test_a_commit_history_read_again_while_the_logs_lag_the_stored_eps(automine_chain, kit, monkeypatch):
    """A restarted peer rebuilds its accountant from its commit history: a history that misses its
    newest commit (logs lagging the state) would count too little spent. The history must end in
    the eps records the ledger stores; it is read again until it does, or it is an error."""
    swarm = kit.Swarm(automine_chain, 2, min_peers=1, commit_window=50, attest_window=50)
    swarm.register(2)
    swarm.peers[1].commit(1, kit.digest("first"), 100, 1_000_000, kit.MECHANISM)
    swarm.peers[0].commit(1, kit.digest("other"), 100, 1_000_000, kit.MECHANISM)
    reader = swarm.reader
    calls = lag_logs(reader, monkeypatch, lagging=2)
    account = swarm.accounts[1].address
    history = reader.commit_history(account)
    assert [c.eps_micro for c in history] == [1_000_000] and calls["n"] == 3

    calls.update(n=0, lagging=10**6)
    with pytest.raises(LedgerError, match="the ledger stores"):
        reader.commit_history(account)
    assert calls["n"] == client_module.LOG_LAG_RETRIES + 1
    calls.update(n=0)  # a read from a block on (an incremental reader) is not checked against the total
    assert reader.commit_history(account, from_block=0) == [] and calls["n"] == 1
