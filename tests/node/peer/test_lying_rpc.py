"""An RPC endpoint cannot lie a peer into harm: a lying JSON-RPC proxy (tests/node/peer/rpcproxy.py)
in front of a real Anvil, and the real ledger client, registry, `Peer` and `swarm node` behind it.

- A made-up head (eth_blockNumber) used to become the admission registry's last scanned block:
  one answer of 50,002 on a chain at block 30, and every later registration and removal went
  unseen. Heads are now held to monotonic, bounded progress (node/chain/rawrpc.py, `HeadGuard`)
  and the registry records only blocks the endpoint serves.
- A made-up receipt (the transaction never sent) used to make a peer store and serve its blob as
  if committed. A commit now counts only once the chain's Committed event is read back.
- Two endpoints that disagree (a block's hash, or our own commit) stop the peer, in one line.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import trio
from eth_account import Account
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from web3 import Web3

from node.chain.anvil import free_port, start_anvil
from node.chain.client import LedgerClient, connect
from node.chain.rawrpc import HEAD_SLACK, MAX_BLOCKS_PER_SECOND, HeadGuard, HeadRefused
from node.chain.registration import sign_registration
from node.cli import main
from node.config import load_config
from node.peer import endpoints
from node.peer.endpoints import EndpointsDisagree, Witness
from node.peer.peer import Peer, RoundOutcome
from node.peer.registry import RegistryCache
from p2p.store import MemoryBlobStore
from tests.node.peer.fakes import FakeNetwork
from tests.node.peer.harness import genesis_digest, genesis_vector, settings, tiny_data
from tests.node.peer.rpcproxy import LyingRPC, lying_rpc

LIE = 50_000  # blocks a made-up head is ahead of the real one


@pytest.fixture(scope="module")
def anvil():
    with start_anvil(accounts=5) as chain:  # automine: a block per transaction
        yield chain


def deploy(anvil, *, allowlist: list[str] | None = None) -> LedgerClient:
    return LedgerClient.deploy(
        connect(anvil.url),
        Account.from_key(anvil.private_keys[0]),
        min_peers=1,
        commit_window=50,
        attest_window=50,
        commit_window_seconds=60,
        attest_window_seconds=60,
        eps_cap_micro=10**12,
        delta=0.0,
        genesis_digest=genesis_digest(),
        allowlist=allowlist,
        tx_timeout=30,
    )


# ------------------------------------------------------------------ heads


class Reads:
    """A head endpoint in a test: answers `heads` in turn; `blocks` are the blocks it serves."""

    def __init__(self, heads: list[int], blocks: int) -> None:
        self.heads, self.blocks, self.now = list(heads), blocks, 0.0

    def read(self) -> int:
        return self.heads.pop(0)

    def exists(self, n: int) -> bool:
        return n <= self.blocks


def test_a_head_never_goes_back_and_a_jump_past_the_bound_needs_its_block():
    chain = Reads([30, 31, 29, 31 + LIE, 32, 40 + HEAD_SLACK], blocks=40 + HEAD_SLACK)
    guard = HeadGuard(chain.exists, clock=lambda: chain.now)
    assert guard.check(chain.read) == 30  # the first head: its block is served
    assert guard.check(chain.read) == 31
    assert guard.check(chain.read) == 31  # 29 went back: refused, 31 stands
    assert guard.check(chain.read) == 32  # 50,031 is not served: read again
    chain.now = 0.1
    assert guard.check(chain.read) == 40 + HEAD_SLACK  # past the slack, but served: a real jump
    liar = Reads([100 + LIE] * 3, blocks=100)
    guard = HeadGuard(liar.exists, clock=lambda: liar.now)
    with pytest.raises(HeadRefused, match="serves no such block"):
        guard.check(liar.read)
    assert guard.last is None


def test_a_pushed_head_is_taken_at_once_only_where_the_guard_needs_no_request():
    """`take_at_once` (a subscription's head without a thread hop) takes what `check` would take
    without asking the endpoint, and leaves to `check` the first head, a jump past the credit and a
    busy guard (without waiting for it: it runs on the event loop)."""
    chain = Reads([], blocks=1000)
    guard = HeadGuard(chain.exists, clock=lambda: chain.now)
    assert guard.take_at_once(30) is None  # the first head: its block must be asked for
    assert guard.check(lambda: 30) == 30
    assert guard.take_at_once(31) == 31 and guard.last == 31
    assert guard.take_at_once(29) == 31  # went back: refused, 31 stands
    assert guard.take_at_once(31 + LIE) is None and guard.last == 31  # past the credit: `check` asks
    assert guard.take_at_once(31 + HEAD_SLACK) is None  # 63 blocks of credit left, not 64
    assert guard.take_at_once(30 + HEAD_SLACK) == 30 + HEAD_SLACK
    chain.now = 0.5  # the credit refills with time (25 blocks), up to HEAD_SLACK
    assert guard.take_at_once(30 + HEAD_SLACK + 25) == 30 + HEAD_SLACK + 25
    assert guard.take_at_once(31 + HEAD_SLACK + 25) is None
    taken: list[int | None] = []
    with guard._lock:  # a check in progress in another thread
        worker = threading.Thread(target=lambda: taken.append(guard.take_at_once(guard.last or 0)), daemon=True)
        worker.start()
        worker.join(timeout=10)
    assert taken == [None]  # answered at once: never waited for on the event loop


def test_heads_pushed_each_at_the_bound_do_not_walk_the_head_away():
    """The slack is a credit, not a bound granted again with every head: a liar pushing heads each
    HEAD_SLACK ahead, as fast as it likes, gets HEAD_SLACK once, then MAX_BLOCKS_PER_SECOND; past
    that its head is asked about (and refused when the endpoint does not serve it)."""
    real = 100
    chain = Reads([], blocks=real)
    guard = HeadGuard(chain.exists, clock=lambda: chain.now)
    assert guard.check(lambda: real) == real
    pushed = [guard.take_at_once((guard.last or 0) + HEAD_SLACK) for _ in range(100)]
    assert pushed[0] == real + HEAD_SLACK and pushed[1:] == [None] * 99
    chain.now = 1.0
    assert guard.take_at_once(real + HEAD_SLACK + int(MAX_BLOCKS_PER_SECOND)) == real + HEAD_SLACK + 50
    assert guard.take_at_once(real + HEAD_SLACK + 51) is None
    with pytest.raises(HeadRefused):
        guard.check(lambda: real + 10 * HEAD_SLACK)  # through `check`: asked, not served
    assert guard.last == real + HEAD_SLACK + 50


def ahead(times: int) -> Any:
    """A lie: the next `times` heads LIE blocks ahead of the real one, then the truth."""
    told = [0]

    def lie(params: list[Any], real: Any) -> str:
        told[0] += 1
        head = int(real(), 16)
        return hex(head + LIE if told[0] <= times else head)

    return lie


def test_the_registry_is_not_fooled_by_made_up_heads(anvil):
    deployer_key, member_key, late_key = (Account.from_key(k) for k in anvil.private_keys[:3])
    ledger = deploy(anvil, allowlist=[member_key.address, late_key.address])
    pairs = [create_new_key_pair(hashlib.sha256(b"lying rpc %d" % i).digest()) for i in range(2)]

    def register(account, pair) -> str:
        client = LedgerClient(ledger.w3, ledger.address, account, tx_timeout=30)
        assert client.account is not None
        client.register(
            ID.from_pubkey(pair.public_key).to_bytes(),
            sign_registration(pair.private_key, client.chain_id(), client.address, client.account.address),
        )
        return ID.from_pubkey(pair.public_key).to_base58()

    with lying_rpc(anvil.url) as proxy:
        registry = RegistryCache(LedgerClient(connect(proxy.url), ledger.address))
        member = register(member_key, pairs[0])
        registry.refresh()
        assert registry(member)

        for lies in (1, 3):  # once (read again: the real head), then every time (no scan at all)
            proxy.lies["eth_blockNumber"] = ahead(lies)
            if lies == 1:
                registry.refresh()
            else:
                with pytest.raises(HeadRefused):
                    registry.refresh()
            assert registry.scanned_to is not None and registry.scanned_to <= anvil.block_number()

        # a head made up within the bound: the registry does not record a block the endpoint lacks
        proxy.lies["eth_blockNumber"] = lambda params, real: hex(int(real(), 16) + 3)
        with pytest.raises(Exception, match="serves no such block"):
            registry.refresh()
        assert registry.scanned_to is not None and registry.scanned_to <= anvil.block_number()
        del proxy.lies["eth_blockNumber"]

        late = register(late_key, pairs[1])
        ledger.disallow(member_key.address)
        anvil.mine(4)  # past the made-up head: the guard's last head is real again
        registry.refresh()
        assert registry(late) and not registry(member)  # the later registration and the removal are seen


# ------------------------------------------------------------------ receipts


def fabricate_receipts(proxy: LyingRPC) -> set[str]:
    """From now on transactions are swallowed (never sent) and answered with a receipt of success
    in the latest block, shaped like the real receipt of that block's transaction; returns the
    swallowed transactions' hashes."""
    swallowed: set[str] = set()

    def call(method: str, *params: Any) -> Any:
        return proxy.forward({"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)})["result"]

    latest = call("eth_getBlockByNumber", "latest", False)
    template = call("eth_getTransactionReceipt", latest["transactions"][0])

    def send(params: list[Any], real: Any) -> str:
        tx_hash = "0x" + bytes(Web3.keccak(hexstr=params[0])).hex()
        swallowed.add(tx_hash)
        return tx_hash

    def receipt(params: list[Any], real: Any) -> Any:
        if params[0] not in swallowed:
            return real()
        head = call("eth_getBlockByNumber", "latest", False)
        return template | {"transactionHash": params[0], "status": "0x1", "logs": [], "blockNumber": head["number"]}

    proxy.lies["eth_getTransactionReceipt"] = receipt
    proxy.lies["eth_sendRawTransaction"] = send
    return swallowed


@pytest.mark.parametrize("lying", [False, True], ids=["honest-rpc", "made-up-receipt"])
def test_a_made_up_receipt_does_not_make_the_peer_serve(anvil, lying):
    ledger = deploy(anvil)
    network = FakeNetwork()

    async def main() -> tuple[Peer, RoundOutcome, set[str]]:
        with lying_rpc(anvil.url) as proxy:
            client = LedgerClient(connect(proxy.url), ledger.address, Account.from_key(anvil.private_keys[1]))
            store = MemoryBlobStore()
            peer = Peer(
                settings(),
                ledger=client,
                host=network.join(b"honest peer", store),
                store=store,
                train_xy=tiny_data(0),
                test_xy=tiny_data(100),
            )
            await peer.start()  # registers (for real: the lie comes after)
            swallowed = fabricate_receipts(proxy) if lying else set()
            out = RoundOutcome(round=1, state="open")
            await peer._commit(1, genesis_vector(), out)
            return peer, out, swallowed

    peer, out, swallowed = trio.run(main)

    committed = ledger.commitments(1)
    served = {genesis_digest().hex()}
    if lying:
        assert len(swallowed) == 1  # the commit was never sent, and its receipt said success
        assert committed == [] and not out.committed and peer.spending.commits == 0
    else:
        (c,) = committed
        assert out.committed and peer.spending.commits == 1
        served.add(c.digest.hex())
    assert set(peer.store.digests()) == served and set(network.announced) == served  # nothing else stored or served


def test_a_made_up_head_does_not_confirm_a_receipt_early(anvil):
    """The sender awaits `confirmations` blocks on top of a receipt on the client's guarded head:
    an endpoint reporting a head far past the chain (the block unserved) gives no depth, so the
    commit is not counted until the real chain is 2 blocks past it. Before, the sender read
    eth_blockNumber past the guard and returned the receipt at depth 0."""
    ledger = deploy(anvil)
    with lying_rpc(anvil.url) as proxy:
        account = Account.from_key(anvil.private_keys[3])
        registrar = LedgerClient(ledger.w3, ledger.address, account, tx_timeout=60)
        pair = create_new_key_pair(hashlib.sha256(b"made-up head").digest())
        registrar.register(
            ID.from_pubkey(pair.public_key).to_bytes(),
            sign_registration(pair.private_key, registrar.chain_id(), registrar.address, account.address),
        )
        client = LedgerClient(connect(proxy.url), ledger.address, account, tx_timeout=60, confirmations=2)
        proxy.lies["eth_blockNumber"] = ahead(10**9)  # from now on every head is made up
        out: dict[str, Any] = {}

        def commit() -> None:
            try:
                out["receipt"] = client.commit(1, hashlib.sha256(b"deep").digest(), 100, 1, b"{}")
            except BaseException as exc:  # the test asserts on it
                out["error"] = exc

        thread = threading.Thread(target=commit, daemon=True)
        thread.start()
        # event: the commit is mined (automine), and the sender has asked the liar for heads since
        deadline = time.monotonic() + 60
        while not ledger.commitments(1) or proxy.calls.get("eth_blockNumber", 0) < 12:
            assert time.monotonic() < deadline and thread.is_alive(), out
            time.sleep(0.05)
        mined_at = anvil.block_number()  # automine: the commit's block is the head
        heads_asked = proxy.calls["eth_blockNumber"]
        while proxy.calls["eth_blockNumber"] < heads_asked + 6:  # and again, on the made-up heads
            assert time.monotonic() < deadline and thread.is_alive(), out
            time.sleep(0.05)
        assert thread.is_alive() and not out, out  # not counted at depth 0 on a made-up head
        del proxy.lies["eth_blockNumber"]
        anvil.mine(2)
        thread.join(60)
    assert "error" not in out, out
    assert out["receipt"]["blockNumber"] == mined_at and anvil.block_number() >= mined_at + 2


# ------------------------------------------------------------------ two endpoints


def other_hashes(params: list[Any], real: Any) -> Any:
    """A lie: every block as the real one, under another hash (a chain of its own)."""
    header = real()
    if header:
        header["hash"] = "0x" + hashlib.sha256(bytes.fromhex(header["hash"][2:])).hexdigest()
    return header


def hide_ledger_logs(params: list[Any], real: Any) -> Any:
    """A lie: no event of any contract (our commit among them)."""
    return []


def test_a_witness_endpoint_that_disagrees_is_named_and_one_that_agrees_is_quiet(anvil, monkeypatch):
    ledger = deploy(anvil)
    account = Account.from_key(anvil.private_keys[1])
    committer = LedgerClient(ledger.w3, ledger.address, account, tx_timeout=30)
    committer.register(b"\x01" * 38, b"")
    digest = hashlib.sha256(b"our release").digest()
    committer.commit(1, digest, 10, 1_000_000, b"{}")
    (ours,) = ledger.commitments(1)
    monkeypatch.setattr(endpoints, "COMMIT_LAG", 1.0)

    with lying_rpc(anvil.url) as proxy:
        witness = Witness(ledger, LedgerClient(connect(proxy.url), ledger.address), (anvil.url, proxy.url))
        anvil.mine(2 * endpoints.REORG_DEPTH)
        witness.compare_chains()  # the same chain: nothing to say
        witness.confirm_commit(1, account.address, digest, ours.block_number)

        proxy.lies["eth_getBlockByNumber"] = other_hashes
        witness.compare_blocks()  # a difference is read again before it counts
        with pytest.raises(EndpointsDisagree, match=r"disagree: block \d+ is 0x[0-9a-f]{64} at the first and 0x"):
            witness.compare_blocks()
        del proxy.lies["eth_getBlockByNumber"]

        proxy.lies["eth_getLogs"] = hide_ledger_logs
        with pytest.raises(EndpointsDisagree, match="our commit of round 1 .* is in block"):
            witness.confirm_commit(1, account.address, digest, ours.block_number)


def test_swarm_node_stops_in_one_line_when_its_two_endpoints_disagree(anvil, tmp_path):
    """`swarm node --rpc-url A --rpc-url B`, B a chain of its own (other block hashes): the node
    stops on its own with one line naming both endpoints, exit status 2."""
    sets = ["swarm.peers=2", "swarm.rounds=1", "chain.min_peers=2", "data.limit=200", "data.test_limit=100"]
    config = tmp_path / "swarm.toml"
    config.write_text(load_config(None, sets).to_toml())
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        mp.setenv("SWARM_PRIVATE_KEY", anvil.private_keys[0])
        assert main(["deploy", "--rpc-url", anvil.url, "--config", str(config), "--json"]) == 0
    address = json.loads(printed.getvalue())["address"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}

    with lying_rpc(anvil.url) as proxy:
        proxy.lies["eth_getBlockByNumber"] = other_hashes
        proc = subprocess.run(
            [sys.executable, "-m", "node.cli", "node", "--rpc-url", anvil.url, "--rpc-url", proxy.url]
            + ["--ledger", address, "--config", str(config), "--workdir", str(tmp_path / "node")]
            + ["--partition", "0/2", "--listen", f"/ip4/127.0.0.1/tcp/{free_port()}", "-q"],
            env=env | {"SWARM_PRIVATE_KEY": anvil.private_keys[2], "SWARM_P2P_PASSWORD": "pw"},
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )
    assert proc.returncode == 2, proc.stderr
    # the stop is one line, the last; a loaded machine may print a warning before it (a stalled chain)
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and [line for line in lines if "error" in line] == lines[-1:], proc.stderr
    lines = lines[-1:]
    assert lines[0].startswith(f"swarm node: error: the RPC endpoints {anvil.url} and {proxy.url} disagree: block ")
    assert lines[0].endswith("one of them lies or they serve different chains, so this peer stops"), lines[0]
