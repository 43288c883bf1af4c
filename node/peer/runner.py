"""One peer process (`swarm node`): wires the ledger client, the libp2p host, the blob store,
the data shard and the round state machine together, and records status and metrics. The ledger's
deployed code decides the client and the round loop (node.chain.kind): a SwarmLedger gets
`LedgerClient` and `Peer`, a PipelinedLedger `PipelinedClient` and `PipelinedPeer` (no witness
endpoint, no secure aggregation there: refused before anything is loaded or started). A pipelined
peer stops cleanly on SIGTERM or SIGINT (`stop_on_signals`); a SwarmLedger peer as Python does by
default (SIGTERM ends the process, SIGINT is a KeyboardInterrupt)."""

from __future__ import annotations

import getpass
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import trio
from eth_account.signers.local import LocalAccount
from libp2p.crypto.keys import PrivateKey
from web3 import Web3

from node.chain.client import LedgerClient, connect
from node.chain.keys import load_account
from node.chain.kind import LedgerKind, ledger_kind
from node.chain.liveness import watch_chain
from node.chain.mirror import LedgerMirror
from node.chain.pipelined import PipelinedClient
from node.chain.subscription import ChainFeed, ws_url_for
from node.config import Config
from node.derive import load_shard, peer_settings
from node.peer.addresses import advertised_addrs, tcp_problem
from node.peer.endpoints import Witness
from node.peer.faults import STORE_FAULTS, FaultyStore
from node.peer.peer import Peer, RoundOutcome
from node.peer.pipelined_peer import PipelinedPeer
from node.peer.registry import RegistryCache
from node.peer.secure_round import Membership, open_member, secure_policy
from node.peer.watch import ChainWatcher
from node.protocol import wire
from node.protocol.settings import PeerSettings
from node.runfiles import MetricsWriter, write_json_atomic
from p2p.host import HostConfig, SwarmHost, open_host
from p2p.identity import load_or_create_identity
from p2p.store import DiskBlobStore

log = logging.getLogger("swarm.node")

P2P_PASSWORD_ENV = "SWARM_P2P_PASSWORD"
BOOTSTRAP_TIMEOUT_S = 60.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass
class NodeOptions:
    rpc_url: str
    ledger: str
    workdir: Path
    bootstrap: list[str]
    listen: list[str]
    partition: tuple[int, int] | None  # (i, N): this peer's shard of the dataset
    fault: str | None = None
    # Unlocked by the caller (`swarm node` does it before any network work, so a wrong password
    # or a new key's address shows at once); None: the workdir's keystore and SWARM_P2P_PASSWORD.
    account: LocalAccount | None = None
    p2p_password: bytes | None = None
    # Seconds the peer waits, once it listens, for a first connection when it has --bootstrap peers:
    # with none of them reached and no other peer connected by then it stops (BootstrapUnreachable).
    # 0: wait for ever (`swarm up`'s peers, started together, bootstrap to each other).
    bootstrap_timeout: float = BOOTSTRAP_TIMEOUT_S
    # A second endpoint of the same chain: the peer stops when the two disagree (node/peer/endpoints.py).
    witness_rpc_url: str | None = None


def p2p_password() -> bytes:
    value = os.environ.get(P2P_PASSWORD_ENV)
    if value:
        return value.encode()
    if sys.stdin.isatty():
        return getpass.getpass("password for this peer's libp2p key file: ").encode()
    raise RuntimeError(f"set {P2P_PASSWORD_ENV} to the password of this peer's libp2p key file")


class BootstrapUnreachable(RuntimeError):
    """None of the bootstrap peers could be reached in time, and no other peer connected."""


class NotOnPipelined(RuntimeError):
    """An option of this node that the pipelined round loop does not run (a witness endpoint,
    secure aggregation): refused rather than ignored."""


def check_pipelined_options(options: NodeOptions, settings: PeerSettings) -> None:
    """What a node on a PipelinedLedger cannot do, as one line (NotOnPipelined)."""
    if options.witness_rpc_url is not None:
        raise NotOnPipelined(
            f"the ledger at {options.ledger} is a PipelinedLedger, whose peers hold no second endpoint to the "
            "first yet: give --rpc-url once"
        )
    if secure_policy(settings) is not None:
        raise NotOnPipelined(
            f"the ledger at {options.ledger} is a PipelinedLedger, which has no secure-aggregation steps: "
            "a secure swarm runs on a SwarmLedger"
        )


def follow_feed(ledger: LedgerClient | PipelinedClient, feed: ChainFeed, watcher: ChainWatcher) -> None:
    """Wire the subscription in: the watcher's moves, the client's head and the sender's base fee
    from it, and where the client reads one (the pipelined ledger's), a mirror of the ledger's
    pushed logs (node/chain/mirror.py)."""
    mirror = None
    if isinstance(ledger, PipelinedClient):
        mirror = LedgerMirror(bytes.fromhex(ledger.address.removeprefix("0x")))
        feed.mirror(mirror)
        ledger.use_mirror(mirror)
    watcher.follow(feed, ledger.confirmations, mirror)
    ledger.pushed_head = feed.live_head  # every read of the head: the one pushed
    ledger.pushed_base_fee = feed.live_base_fee  # the sender's fees: from the pushed head


def open_client(
    kind: LedgerKind, w3: Web3, address: str, account: LocalAccount, confirmations: int
) -> LedgerClient | PipelinedClient:
    """The peer's ledger client for the contract deployed at `address`, on one Web3 (one
    endpoint, one count of its requests), acting `confirmations` blocks deep."""
    if kind == "pipelined":
        return PipelinedClient(w3, address, account, confirmations=confirmations)
    return LedgerClient(w3, address, account, confirmations=confirmations)


async def require_bootstrap(host: SwarmHost, bootstrap: list[str], timeout: float, poll: float = 0.5) -> None:
    """Return once the host has a peer; raise BootstrapUnreachable when it still has none
    `timeout` seconds after it started listening (0: never). A peer with no bootstrap address
    (the swarm's first one) waits for others to dial it and is never stopped. The host keeps
    re-dialing meanwhile (p2p.host); this only decides when waiting is pointless: a peer alone
    cannot fetch the others' blobs, and would wait out every round's windows for nothing."""
    if not bootstrap or timeout <= 0:
        return
    deadline = trio.current_time() + timeout
    while not host.connected_peers():
        if trio.current_time() >= deadline:
            problems = await trio.to_thread.run_sync(lambda: [(a, tcp_problem(a)) for a in bootstrap])
            if host.connected_peers():  # connected while we were probing
                return
            reasons = "; ".join(
                f"{addr}: {problem or 'its port opens, but no libp2p connection (another peer id or program?)'}"
                for addr, problem in problems
            )
            raise BootstrapUnreachable(
                f"no peer reached in {timeout:g} s: none of the --bootstrap peers answered ({reasons}) and no "
                "other peer connected to this one: check that they run, their addresses (as they printed them) "
                "and that their ports are open to this host, then start this node again "
                "(--bootstrap-timeout waits longer)"
            )
        await trio.sleep(poll)


async def stop_on_signals(stop: Callable[[], None], *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """A pipelined peer's clean stop (`PipelinedPeer.stop`): the first SIGTERM or SIGINT calls `stop`
    (the round under way is played out, then the final vote on it goes in: its members need it for
    their majority); a second one ends the node at once, as a KeyboardInterrupt. Started (its
    handlers installed) once `task_status.started()` is called; the main thread's only (trio's)."""
    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        task_status.started()
        stopping = False
        async for signum in signals:
            if stopping:
                raise KeyboardInterrupt
            stopping = True
            log.warning(
                "%s: stopping after this round and its final vote (send it again to stop at once)",
                signal.Signals(signum).name,
            )
            stop()


def open_witness(ledger: LedgerClient, options: NodeOptions) -> Witness | None:
    """The second endpoint, compared with the first before the peer does anything (blocking)."""
    if options.witness_rpc_url is None:
        return None
    url = options.witness_rpc_url
    # read at the same depth as the first endpoint: what the peer acts on is compared, not the fresher head
    second = LedgerClient(connect(url), options.ledger, confirmations=ledger.confirmations)
    witness = Witness(ledger, second, (options.rpc_url, url))
    witness.compare_chains()
    return witness


def secure_member(
    ledger: LedgerClient,
    host: SwarmHost,
    store: DiskBlobStore | FaultyStore,
    identity: PrivateKey,
    settings: PeerSettings,
) -> Membership | None:
    """The peer's secure-aggregation member when the swarm's policy is secagg, else None."""
    policy = secure_policy(settings)
    return open_member(ledger, host, store, identity, policy, settings) if policy is not None else None


def round_loop(
    ledger: LedgerClient | PipelinedClient,
    witness: Witness | None,
    host: SwarmHost,
    store: DiskBlobStore | FaultyStore,
    identity: PrivateKey,
    settings: PeerSettings,
) -> Callable[..., Peer]:
    """The round loop the deployed ledger calls for, its ledger-specific parts bound: `PipelinedPeer`
    on a PipelinedLedger, else `Peer` with its witness and secure member."""
    if isinstance(ledger, PipelinedClient):
        return partial(PipelinedPeer, ledger=ledger)
    return partial(
        Peer, ledger=ledger, witness=witness, secure_member=secure_member(ledger, host, store, identity, settings)
    )


def round_recorder(
    ledger: LedgerClient | PipelinedClient, address: str, metrics: MetricsWriter
) -> Callable[[RoundOutcome], None]:
    """What the peer calls at each round's end: the round's line in metrics.jsonl, with the RPC
    requests it made to its endpoint over the round (start-up's count towards round 1)."""
    requests_before = [ledger.rpc_requests()]

    def on_round(outcome: RoundOutcome) -> None:
        record = {"peer": address, "time": time.time(), **asdict(outcome)}
        requests_before.append(ledger.rpc_requests())
        record["rpc_requests"] = requests_before[-1] - requests_before[-2]
        record["included"] = sum(outcome.included) if outcome.included else None
        metrics.write(record)
        log.info("round %d %s acc=%s", outcome.round, outcome.state, outcome.accuracy)

    return on_round


async def run_node(config: Config, options: NodeOptions) -> int:
    """Run one peer until the configured number of rounds is over. Returns an exit status."""

    torch.set_num_threads(1)  # several peers share a machine's cores; one thread each is fastest
    workdir = options.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    w3 = await trio.to_thread.run_sync(lambda: connect(options.rpc_url))
    account = options.account or load_account(workdir / "eth-keystore.json", create=True)
    kind = await trio.to_thread.run_sync(lambda: ledger_kind(w3, options.ledger))
    settings = peer_settings(config, fault=options.fault)
    if kind == "pipelined":
        check_pipelined_options(options, settings)
    ledger = open_client(kind, w3, options.ledger, account, config.chain.confirmations)
    witness = (
        await trio.to_thread.run_sync(lambda: open_witness(ledger, options))
        if isinstance(ledger, LedgerClient)
        else None
    )
    train_xy, test_xy = await trio.to_thread.run_sync(lambda: load_shard(config, options.partition))
    key_pair = load_or_create_identity(workdir / "p2p.key", options.p2p_password or p2p_password())
    disk = DiskBlobStore(workdir / "blobs")
    store: DiskBlobStore | FaultyStore = FaultyStore(disk, options.fault) if options.fault in STORE_FAULTS else disk
    registry = RegistryCache(ledger)
    await trio.to_thread.run_sync(registry.refresh)
    chain_id = await trio.to_thread.run_sync(lambda: w3.eth.chain_id)
    host_config = HostConfig(
        key_pair=key_pair,
        listen_addrs=options.listen,
        bootstrap=options.bootstrap,
        topic=wire.topic_for(chain_id, ledger.address),
        max_blob_size=wire.max_blob_size(10_000_000),
    )
    status_path = workdir / "status.json"

    async with open_host(host_config, store, allowed=registry) as host:
        write_json_atomic(
            workdir / "peer.json",
            {"peer_id": host.peer_id, "addrs": advertised_addrs(host.addrs), "address": account.address},
        )
        with MetricsWriter(workdir / "metrics.jsonl") as metrics:

            def on_status(status: dict) -> None:
                write_json_atomic(status_path, status)

            on_round = round_recorder(ledger, account.address, metrics)
            peer = round_loop(ledger, witness, host, store, key_pair.private_key, settings)(
                settings,
                host=host,
                store=store,
                train_xy=train_xy,
                test_xy=test_xy,
                on_status=on_status,
                accountant_path=workdir / "privacy-accountant.json",
                identity=key_pair.private_key,
                ownership=registry.ownership,
            )
            # new heads and the ledger's logs pushed where the endpoint offers it; polled otherwise
            ws_url = ws_url_for(options.rpc_url, config.chain.ws_url)
            feed = ChainFeed(ws_url, ledger.address, ledger.take_head, ledger.take_head_at_once) if ws_url else None
            async with trio.open_nursery() as nursery:
                if isinstance(peer, PipelinedPeer):
                    await nursery.start(stop_on_signals, peer.stop)
                if feed is not None:
                    follow_feed(ledger, feed, peer.watcher)
                    nursery.start_soon(feed.run)
                if witness is not None:
                    nursery.start_soon(witness.watch)
                nursery.start_soon(partial(registry.keep_fresh, feed=feed))
                nursery.start_soon(require_bootstrap, host, options.bootstrap, options.bootstrap_timeout)
                nursery.start_soon(
                    partial(watch_chain, pushed_head=feed.live_head if feed is not None else None),
                    w3,
                    options.rpc_url,
                    lambda: peer.phase.value,
                )  # nudge/warn if stalled
                await peer.run(on_round=on_round)
                nursery.cancel_scope.cancel()
    return 0
