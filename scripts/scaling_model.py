"""A message-count simulation of one round of the protocol for N peers on a public chain (docs/SCALING.md).

What one round costs, counted message by message as the code does it today:
- gossip: a seeded random GossipSub mesh (degree and bounds read from p2p/gossip.py), every
  announcement of the round propagated hop by hop (forward on first receipt to every mesh peer but
  the forwarder and the origin, as py-libp2p's `_get_peers_to_send`), and the IHAVE gossip every
  heartbeat to max(6, 0.25 x non-mesh topic peers) peers (py-libp2p 0.8.1's fixed Dlazy rule);
- blobs: all-to-all (every participant fetches N-1 updates, first from their committer, as
  node/peer/agree.py orders providers) against "fetch from any holder", simulated fetch by fetch;
- chain: a block-by-block simulation at 12 s and 30M gas: commits queued FIFO into blocks, the
  close race (every waiting peer nudges closeRound once the last commit is mined; one succeeds, the
  rest revert and pay), attestations until the strict majority (later ones revert and pay);
- RPC: the reads node/peer/peer.py, agree.py, runner.py (registry) and node/chain/sender.py make
  over the round's phases, with the JSON bytes of the logs they return.

Inputs and where they come from: gas per function from docs/BENCHMARKS.md (section bench:ledger,
measured by scripts/bench_ledger.py); mesh settings from p2p/gossip.py; chunk and HAVE sizes from
p2p/wire.py; blob sizes from node/protocol/wire.py's layout (4 bytes per parameter + a header measured
once, below); poll intervals from node/protocol/settings.py, node/peer/agree.py and node/chain/sender.py;
the rest (block time, block gas limit, gas price, uplink) are stated assumptions with flags.

    python scripts/scaling_model.py                 # the tables for N = 4, 16, 64, 100, 256, 1000
    python scripts/scaling_model.py --json          # everything as JSON
    python scripts/scaling_model.py --write         # the tables into docs/SCALING.md between markers

Deterministic: every random draw comes from `random.Random(seed)` / numpy's `default_rng(seed)`.
"""

from __future__ import annotations

import argparse
import ast
import heapq
import json
import math
import random
import re
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from p2p import wire as p2p_wire  # noqa: E402  (light: no libp2p import)
from scripts.benchdoc import table, write_section  # noqa: E402

BENCHMARKS = ROOT / "docs" / "BENCHMARKS.md"
SCALING = ROOT / "docs" / "SCALING.md"
GOSSIP_SOURCE = ROOT / "p2p" / "gossip.py"
DEFAULT_NS = (4, 16, 64, 100, 256, 1000)

# ---------------------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Gas:
    """Gas per ledger function. `attest` is the first vote for a (digest, bitmap) at `attest_peers`
    participants (its bitmap has ceil(attest_peers / 8) bytes); `attest_gas(n)` scales it."""

    register: int
    commit: int
    close: int
    attest: int
    attest_peers: int
    source: str


# What docs/BENCHMARKS.md held when this model was written (2026-11-23, scripts/bench_ledger.py);
# used only if the section cannot be read.
FALLBACK_GAS = Gas(139_464, 65_787, 73_502, 57_390, 64, "fallback constants of 2026-11-23 (bench_ledger.py)")


def measured_gas(doc: Path = BENCHMARKS) -> Gas:
    """Gas per function from the bench:ledger section of docs/BENCHMARKS.md (its operation table,
    and the attest of its largest swarm), else FALLBACK_GAS."""
    try:
        text = doc.read_text()
        section = text[text.index("<!-- bench:ledger -->") : text.index("<!-- /bench:ledger -->")]
    except (OSError, ValueError):
        return FALLBACK_GAS
    ops = {m[1].strip(): int(m[2].replace(",", "")) for m in re.finditer(r"^\| ([^|]+) \| ([\d,]+) \|$", section, re.M)}

    def op(prefix: str) -> int | None:
        return next((v for k, v in ops.items() if k.startswith(prefix)), None)

    # per-swarm rows: | peers | commit max | closeRound | attest first | ...
    swarms = [(int(m[1]), int(m[2])) for m in re.finditer(r"^\| (\d+) \| \d+ \| \d+ \| (\d+) \|", section, re.M)]
    register, commit, close = op("register"), op("commit"), op("closeRound")
    if None in (register, commit, close) or not swarms:
        return FALLBACK_GAS
    peers, attest = max(swarms)
    return Gas(int(register or 0), int(commit or 0), int(close or 0), attest, peers, "docs/BENCHMARKS.md, bench:ledger")


# Modelled gas (not measured): EIP-2028 calldata 16 gas per non-zero byte, 4 per zero byte; LOG data 8
# gas per byte; a reverted transaction pays 21,000 + calldata + what ran before the revert (the live-
# round slot read cold, 2,100, plus dispatch, about 500).
TX_BASE_GAS = 21_000
REVERT_EXECUTION_GAS = 2_600


def bitmap_bytes(n: int) -> int:
    return math.ceil(n / 8)


def attest_gas(gas: Gas, n: int) -> int:
    """Attest at n participants: the measured figure plus 16 (calldata) + 8 (Attested's data) gas
    per bitmap byte more than the measured swarm's (a modelled correction; 0 at that size)."""
    return gas.attest + 24 * (bitmap_bytes(n) - bitmap_bytes(gas.attest_peers))


def reverted_close_gas() -> int:
    # closeRound(uint64): 4-byte selector + one word with one non-zero byte
    return TX_BASE_GAS + 4 * 16 + 31 * 4 + 16 + REVERT_EXECUTION_GAS


def reverted_attest_gas(n: int) -> int:
    # attest(uint64, bytes32, bytes): selector, round, digest, offset, length, the bitmap in words
    words = 4 + math.ceil(bitmap_bytes(n) / 32)
    nonzero = 4 + 1 + 32 + 1 + 1 + bitmap_bytes(n)
    zero = 4 + 32 * words - nonzero
    return TX_BASE_GAS + 16 * nonzero + 4 * zero + REVERT_EXECUTION_GAS


@dataclass(frozen=True)
class Mesh:
    degree: int
    degree_low: int
    degree_high: int
    heartbeat: float  # s, HostConfig.gossip_heartbeat
    gossip_window: int  # heartbeats of message ids an IHAVE lists (py-libp2p default 3)
    dlazy: int  # py-libp2p 0.8.1 without adaptive gossip: IHAVE to max(6, 0.25 x non-mesh peers)
    gossip_factor: float
    source: str


def mesh_settings(path: Path = GOSSIP_SOURCE) -> Mesh:
    """MESH_DEGREE, MESH_DEGREE_LOW, MESH_DEGREE_HIGH as p2p/gossip.py assigns them (read without
    importing libp2p); py-libp2p's defaults for the rest."""
    values = {"MESH_DEGREE": 6, "MESH_DEGREE_LOW": 4, "MESH_DEGREE_HIGH": 12}
    source = "py-libp2p defaults (p2p/gossip.py not found)"
    if path.exists():
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, int)
            ):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id in values:
                        values[target.id] = int(node.value.value)
        source = "p2p/gossip.py"
    return Mesh(values["MESH_DEGREE"], values["MESH_DEGREE_LOW"], values["MESH_DEGREE_HIGH"], 1.0, 3, 6, 0.25, source)


@dataclass(frozen=True)
class Model:
    name: str
    params: int

    # node/protocol/wire.py: float32 safetensors plus a JSON header; measured once with
    # wire.update_blob(torch.zeros(n), 12, pnpm JSON, an address) and wire.model_blob: 232 and 120-128 bytes.
    @property
    def update_bytes(self) -> int:
        return 4 * self.params + 232

    @property
    def model_bytes(self) -> int:
        return 4 * self.params + 128


LOGREG = Model("logreg (demo)", 7_850)  # examples/demo.toml: softmax regression on Fashion-MNIST
CNN = Model("pnpm-fmnist CNN", 42_090)  # docs/NODE.md, "Models", with biases


@dataclass(frozen=True)
class Chain:
    block_time: float = 12.0  # s, Ethereum mainnet slot
    block_gas_limit: int = 30_000_000
    block_share: float = 1.0  # share of each block the swarm's transactions get (1.0: the whole block)
    gas_price_gwei: float = 10.0
    commit_window: int = 120  # blocks, node/defaults.toml chain.commit_window
    log_chunk_blocks: int = 10_000  # node/chain/client.py LOG_CHUNK_BLOCKS
    rounds_so_far: int = 100  # the round modelled is the 100th: history reads grow with it


@dataclass(frozen=True)
class Network:
    uplink_bytes_s: float = 12.5e6  # 100 Mbit/s per peer (assumption)
    fetch_timeout: float = 10.0  # s, node/defaults.toml chain.fetch_timeout
    announce_delay: float = 0.5  # s, HostConfig.announce_delay (fetched HAVEs batched)
    hello_interval: float = 60.0  # s, HostConfig.hello_interval (steady state)
    connected_peers_cap: int | None = None  # None: dial_discovered connects every peer to every other


@dataclass(frozen=True)
class Polls:
    """How often the code reads the chain (s); sources in the comments."""

    round_state: float = 0.1  # PeerSettings.poll_interval (node/protocol/settings.py)
    nudge: float = 1.0  # ChainWatcher._wait_for nudge_every: an eth_estimateGas for close / abort
    attestations: float = 0.5  # agree.WATCH_INTERVAL, while fetching
    registry: float = 1.0  # RegistryCache.keep_fresh: block_number + 2 eth_getLogs
    receipt: float = 0.02  # sender._wait: wait_for_transaction_receipt(poll_latency=0.02)
    reporter_commitments: int = 1  # NodeReporter reads each round's commitments once


# ------------------------------------------------------------------------------------- gossip


def build_mesh(n: int, mesh: Mesh, rng: random.Random) -> list[set[int]]:
    """A symmetric mesh like GossipSub's heartbeat builds: each peer, in a random order, grafts
    random peers until it has `degree`, never one already at `degree_high`."""
    adj: list[set[int]] = [set() for _ in range(n)]
    if n <= mesh.degree + 1:
        return [set(range(n)) - {p} for p in range(n)]
    order = list(range(n))
    rng.shuffle(order)
    for p in order:
        tries = 0
        while len(adj[p]) < mesh.degree and tries < 50 * n:
            q = rng.randrange(n)
            tries += 1
            if q != p and q not in adj[p] and len(adj[q]) < mesh.degree_high:
                adj[p].add(q)
                adj[q].add(p)
    return adj


@dataclass
class Propagation:
    transmissions: int  # copies sent over mesh links
    deliveries: int  # first receipts (N-1 when every peer got it)
    duplicates: int
    hops: int  # longest path from the origin


def propagate(adj: list[set[int]], origin: int) -> Propagation:
    """One message, event by event: the origin sends to its mesh; each peer forwards on first
    receipt to every mesh peer except the forwarder and the origin; later copies are dropped."""
    seen = {origin: 0}
    queue: deque[tuple[int, int, int]] = deque((q, origin, 1) for q in adj[origin])
    transmissions = len(adj[origin])
    duplicates = hops = 0
    while queue:
        peer, forwarder, hop = queue.popleft()
        if peer in seen:
            duplicates += 1
            continue
        seen[peer] = hop
        hops = max(hops, hop)
        for q in adj[peer]:
            if q not in (forwarder, origin):
                transmissions += 1
                queue.append((q, peer, hop + 1))
    return Propagation(transmissions, len(seen) - 1, duplicates, hops)


def gossip_message_bytes(n_digests: int, addrs: int = 2) -> int:
    """One announcement on the wire: p2p/wire.py's envelope (kind, u16, the sender's addresses,
    32 bytes per digest) inside a signed pubsub Message (from 38, seqno 8, topic "swarm-0x..." 46,
    signature 64, protobuf tags about 12) inside an RPC frame, Yamux (12) and Noise (16 + 2)."""
    envelope = len(p2p_wire.envelope(p2p_wire.KIND_HAVE, ["/ip4/203.0.113.7/tcp/40001/p2p/" + "x" * 52] * addrs))
    envelope += 32 * n_digests
    return envelope + 38 + 8 + 46 + 64 + 12 + 4 + 12 + 18


MSG_ID_BYTES = 38 + 8  # py-libp2p's default message id: from (38-byte Ed25519 peer id) + seqno


def ihave_bytes(ids: int) -> int:
    return ids * (MSG_ID_BYTES + 2) + 46 + 8 + 12 + 18  # ids, topic, control tags, Yamux + Noise


@dataclass
class Publish:
    time: float
    publisher: int
    digests: int
    kind: str


def ihave_targets(n: int, mesh_degree: float, mesh: Mesh, net: Network) -> int:
    """Peers one IHAVE goes to per heartbeat: max(Dlazy, 0.25 x topic peers outside the mesh), at
    most that many (py-libp2p 0.8.1 `_get_adaptive_gossip_peers_count` with adaptive gossip off)."""
    topic_peers = n - 1 if net.connected_peers_cap is None else min(n - 1, net.connected_peers_cap)
    outside = max(0, int(topic_peers - mesh_degree))
    return min(outside, max(mesh.dlazy, int(outside * mesh.gossip_factor)))


# ----------------------------------------------------------------------------------------- blobs


def all_to_all_uploads(n: int, rule: str, rng: np.random.Generator) -> np.ndarray:
    """Blobs each peer uploads when every peer fetches every other peer's blob, fetch by fetch.
    "committer": each blob from its committer (today's first provider). "any-holder": the fetchers
    of a blob come in a random order and each picks a holder uniformly among the committer and the
    fetchers before it (each announced it)."""
    if rule == "committer":
        return np.full(n, n - 1, dtype=np.int64)
    uploads = np.zeros(n, dtype=np.int64)
    for blob in range(n):
        order = np.concatenate(([blob], rng.permutation(np.delete(np.arange(n), blob))))
        picks = np.floor(rng.random(n - 1) * np.arange(1, n)).astype(np.int64)  # fetcher k picks holder < k
        np.add.at(uploads, order[picks], 1)
    return uploads


@dataclass
class Spread:
    uploads: list[int]  # blobs uploaded per peer
    steps: int  # transfer slots until every peer holds it


def spread_one(n: int, sources: list[int], rule: str, fanout: int, rng: random.Random) -> Spread:
    """One blob from `sources` to every peer, slot by slot: each peer without it asks one holder
    ("committer": one of the sources; "any-holder": any peer that held it at the start of the
    slot); a holder serves at most `fanout` requests per slot, the others ask again next slot."""
    holders = set(sources)
    uploads = [0] * n
    wanting = [p for p in range(n) if p not in holders]
    steps = 0
    while wanting:
        steps += 1
        pool = sorted(sources) if rule == "committer" else sorted(holders)
        asked: dict[int, list[int]] = {}
        for p in wanting:
            asked.setdefault(pool[rng.randrange(len(pool))], []).append(p)
        served: set[int] = set()
        for holder, requests in asked.items():
            chosen = requests if len(requests) <= fanout else rng.sample(requests, fanout)
            uploads[holder] += len(chosen)
            served.update(chosen)
        holders |= served
        wanting = [p for p in wanting if p not in served]
    return Spread(uploads, steps)


# ----------------------------------------------------------------------------------------- chain


@dataclass
class Tx:
    time: float  # submitted
    peer: int
    kind: str  # commit | close | attest
    gas: int = 0
    ok: bool = False
    block: int = 0


@dataclass
class ChainRound:
    blocks_commit: int  # blocks from the first commit's block to the last commit's, both included
    commits_per_block: int  # at the swarm's share of a block
    close_block: int
    final_block: int
    txs: dict[str, int]  # sent per kind
    reverted: dict[str, int]
    gas: dict[str, int]  # total per kind (reverted included)
    commit_mined_at: list[float]  # per peer
    waited: dict[str, list[float]]  # per kind, per peer: seconds from sending to the receipt (0: not sent)
    closed_at: float
    finalized_at: float
    fits_commit_window: bool


class BlockChain:
    """Blocks every `block_time` s; each takes pending transactions FIFO (by sending time) up to
    `block_share x block_gas_limit` gas of the swarm's (the rest of the block is other users')."""

    def __init__(self, chain: Chain) -> None:
        self.c = chain
        self.pending: list[tuple[float, int, Tx]] = []
        self._seq = 0

    def submit(self, tx: Tx) -> None:
        heapq.heappush(self.pending, (tx.time, self._seq, tx))
        self._seq += 1

    def mine(self, block: int, execute: Callable[[Tx], int]) -> None:
        """Include the pending transactions sent before this block's time, in order, while the
        next one's gas limit (its successful gas) fits; `execute` applies one and returns the gas it
        used (a reverted one uses less), which is what the block's budget loses."""
        t = block * self.c.block_time
        budget = int(self.c.block_share * self.c.block_gas_limit)
        while self.pending and self.pending[0][0] < t and self.pending[0][2].gas <= budget:
            _, _, tx = heapq.heappop(self.pending)
            tx.block = block
            budget -= execute(tx)


def simulate_chain(
    n: int, gas: Gas, chain: Chain, fetch_seconds: list[float], rng: random.Random, commit_spread: float = 6.0
) -> ChainRound:
    """One round on a public chain, block by block. Commits are sent within `commit_spread` s of the
    round's start (training ends at different times). Once the last commit is mined, every peer's
    next close nudge (within 1 s; ChainWatcher._wait_for) estimates closeRound on the new state, which
    passes, so every peer sends it: the first mined closes, the others revert (RoundNotOpen). After
    the close each peer fetches (`fetch_seconds[p]`), aggregates and attests, unless the round was
    already finalized when it estimates (then nothing is sent); votes mined after the majority
    revert (RoundNotClosed)."""
    bc = BlockChain(chain)
    a_gas = attest_gas(gas, n)
    for p in range(n):
        bc.submit(Tx(rng.uniform(0, commit_spread), p, "commit", gas.commit))
    kinds = ("commit", "close", "attest")
    sent = dict.fromkeys(kinds, 0)
    reverted = dict.fromkeys(kinds, 0)
    spent = dict.fromkeys(kinds, 0)
    waited = {k: [0.0] * n for k in kinds}
    commit_mined_at = [0.0] * n
    committed = votes = 0
    closed_at = finalized_at = -1.0
    close_block = final_block = first_commit_block = last_commit_block = 0
    majority = n // 2 + 1
    block = 0
    while finalized_at < 0:
        block += 1
        t = block * chain.block_time

        def execute(tx: Tx, t: float = t, block: int = block) -> int:
            nonlocal committed, votes, closed_at, close_block, finalized_at, final_block
            nonlocal first_commit_block, last_commit_block
            sent[tx.kind] += 1
            waited[tx.kind][tx.peer] = t - tx.time
            if tx.kind == "commit":
                tx.ok = True
                committed += 1
                commit_mined_at[tx.peer] = t
                first_commit_block = first_commit_block or block
                last_commit_block = block
            elif tx.kind == "close":
                tx.ok = closed_at < 0
                if tx.ok:
                    closed_at, close_block = t, block
            else:
                tx.ok = finalized_at < 0
                votes += tx.ok
                if tx.ok and votes >= majority:
                    finalized_at, final_block = t, block
            reverted[tx.kind] += not tx.ok
            used = tx.gas if tx.ok else _reverted_gas(tx.kind, n)
            spent[tx.kind] += used
            return used

        bc.mine(block, execute)
        if committed == n and sent["close"] == 0 and not any(tx.kind == "close" for _, _, tx in bc.pending):
            for p in range(n):
                bc.submit(Tx(t + rng.uniform(0.0, 1.0), p, "close", gas.close))
        if closed_at == t:
            for p in range(n):
                bc.submit(Tx(t + rng.uniform(0.0, 0.2) + fetch_seconds[p], p, "attest", a_gas))
        if block > 100_000:
            raise RuntimeError("the round never finalized")
    # Still pending: sent before the finalizing block was visible, so sent, mined later, reverted.
    # Anything later is refused by its estimate (RoundNotClosed) and never sent.
    for _, _, tx in bc.pending:
        if tx.time < finalized_at:
            sent[tx.kind] += 1
            reverted[tx.kind] += 1
            spent[tx.kind] += _reverted_gas(tx.kind, n)
            waited[tx.kind][tx.peer] = chain.block_time
    per_block = int(chain.block_share * chain.block_gas_limit) // gas.commit
    return ChainRound(
        blocks_commit=last_commit_block - first_commit_block + 1,
        commits_per_block=per_block,
        close_block=close_block,
        final_block=final_block,
        txs=sent,
        reverted=reverted,
        gas=spent,
        commit_mined_at=commit_mined_at,
        waited=waited,
        closed_at=closed_at,
        finalized_at=finalized_at,
        fits_commit_window=math.ceil(n / max(1, per_block)) <= chain.commit_window,
    )


def _reverted_gas(kind: str, n: int) -> int:
    return reverted_close_gas() if kind == "close" else reverted_attest_gas(n)


# ------------------------------------------------------------------------------------------- RPC


# JSON-RPC sizes (modelled, geth's field set): a log object is about 367 bytes of fixed fields plus
# 68 per topic and 2 per data byte; a request about 150 bytes; an eth_call answer 100 + 2 per byte.
def log_json_bytes(topics: int, data_bytes: int) -> int:
    return 367 + 68 * topics + 2 * data_bytes


COMMITTED_LOG = log_json_bytes(3, 32 * 9)  # index, digest, samples, eps, record eps, offset, length, 52-byte JSON
REGISTERED_LOG = log_json_bytes(2, 32 * 8)
REQUEST_BYTES = 150
CALL_ANSWER_BYTES = 100 + 2 * 32 * 6


def attested_log(n: int) -> int:
    return log_json_bytes(3, 32 * (4 + math.ceil(bitmap_bytes(n) / 32)))


@dataclass
class RpcCount:
    calls: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)

    def add(self, what: str, calls: float, answer_bytes: float = CALL_ANSWER_BYTES) -> None:
        c = int(math.ceil(calls))
        self.calls[what] = self.calls.get(what, 0) + c
        self.bytes[what] = self.bytes.get(what, 0) + int(c * REQUEST_BYTES + calls * answer_bytes)

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())


CLIENT_SOURCE = ROOT / "node" / "chain" / "client.py"


def commitments_reads_storage(path: Path = CLIENT_SOURCE) -> bool:
    """Whether `LedgerClient.commitments` also calls the `commitmentsByDigest` view (read from the
    client's source at run time: the check against storage may be dropped)."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "commitments":
            return "commitmentsByDigest" in ast.unparse(node)
    return True


READS_STORAGE = commitments_reads_storage()


def commitments_read(rpc: RpcCount, n: int, blocks: int, chain: Chain, what: str) -> None:
    """LedgerClient.commitments(r) (and participants(r), which calls it): block_number, round_info at
    that block, eth_getLogs of the round's Committed events (one per 10,000 blocks), and, if the
    client still checks storage, commitmentsByDigest(round, n digests) (request 32 n, answer 96 n bytes)."""
    rpc.add(what, 2)
    rpc.add(what, math.ceil(max(1, blocks) / chain.log_chunk_blocks), n * COMMITTED_LOG)
    if READS_STORAGE:
        rpc.add(what, 1, 100 + 2 * 96 * n)
        rpc.bytes[what] += 2 * 32 * n


def rpc_round(n: int, chain: Chain, polls: Polls, cr: ChainRound, peer: int, fetch_s: float) -> RpcCount:
    """The reads one participant makes in the round, phase by phase (node/peer/peer.py). While a
    transaction of its own is pending the peer polls only its receipt (the call blocks)."""
    rpc = RpcCount()
    rounds = chain.rounds_so_far
    history_blocks = rounds * max(1, cr.final_block)
    receipt = {kind: cr.waited[kind][peer] for kind in cr.waited}

    def transaction(kind: str) -> None:  # estimate, two fee reads (web3 fills EIP-1559 fees), send
        if receipt[kind] > 0:
            rpc.add("transactions (estimate, fees, send)", 4)
            rpc.add("receipt polls", receipt[kind] / polls.receipt, 60)

    # play_round: round_info, participants() (am I in?), params; the commit
    rpc.add("round state", 2)
    commitments_read(rpc, n, cr.final_block, chain, "participants()/commitments() reads")
    transaction("commit")
    # waiting-close: round_info every poll interval, a closeRound estimate every second
    close_wait = max(0.0, cr.closed_at - cr.commit_mined_at[peer] - receipt["close"])
    rpc.add("round state", close_wait / polls.round_state)
    rpc.add("close/abort nudges (estimates)", close_wait / polls.nudge)
    transaction("close")
    # after close: participants(), then the agreement: commitments(), peer_id_of per committer and
    # commit_history per other committer (every Committed log of that peer since deployment, checked
    # against its two eps records on chain)
    for _ in range(2):
        commitments_read(rpc, n, cr.final_block, chain, "participants()/commitments() reads")
    rpc.add("peer_id_of per committer", n)
    chunks = math.ceil(history_blocks / chain.log_chunk_blocks)
    rpc.add("commit_history per committer", (n - 1) * (4 + chunks), 0)  # params, head, 2 eps views, logs
    rpc.bytes["commit_history per committer"] += (n - 1) * rounds * COMMITTED_LOG
    # while fetching: attestations() every 0.5 s (round_info, block_number, eth_getLogs Attested)
    rpc.add("attestation reads while fetching", 3 * max(1.0, fetch_s / polls.attestations))
    # the attestation, then waiting-final: polls and abort nudges until the majority is mined
    transaction("attest")
    final_wait = max(0.0, cr.finalized_at - cr.closed_at - fetch_s - receipt["attest"])
    rpc.add("round state", final_wait / polls.round_state)
    rpc.add("close/abort nudges (estimates)", final_wait / polls.nudge)
    # the finalized model: finalized_digest, participants(), peer_id_of per participant, the digest again
    rpc.add("round state", 2)
    commitments_read(rpc, n, cr.final_block, chain, "participants()/commitments() reads")
    rpc.add("peer_id_of per committer", n - 1)
    for _ in range(polls.reporter_commitments):  # swarm node's reporter (node/cli/node_output.py)
        commitments_read(rpc, n, cr.final_block, chain, "participants()/commitments() reads")
    # the registry: block_number + Registered + AllowlistChanged logs every second, all round long
    rpc.add("registry refresh", 3 * cr.finalized_at / polls.registry)
    return rpc


# ------------------------------------------------------------------------------------- one round


@dataclass
class RoundResult:
    n: int
    gossip: dict[str, Any]
    blobs: dict[str, Any]
    chain: dict[str, Any]
    rpc: dict[str, Any]
    time: dict[str, float]


def fetch_seconds(n: int, model: Model, net: Network, rng: random.Random) -> list[float]:
    """All-to-all fetch time per peer: upload-bound, (n-1) blobs through each peer's uplink, +-10%."""
    base = (n - 1) * model.update_bytes / net.uplink_bytes_s
    return [base * rng.uniform(0.9, 1.1) + 0.05 for _ in range(n)]


def publishes(
    n: int, cr: ChainRound, fetch_s: list[float], net: Network, round_seconds: float, mesh: Mesh
) -> list[Publish]:
    """Every gossip message of the round, when it is published (node/peer/peer.py, p2p/host.py):
    the HAVE of a peer's own update once its commit is mined; the batched HAVEs of fetched blobs
    (one per announce_delay while fetching); the model's HAVE after aggregating and again after
    the finalized model is read; hellos once per hello_interval."""
    out: list[Publish] = []
    for p in range(n):
        out.append(Publish(cr.commit_mined_at[p], p, 1, "own update HAVE"))
        batches = min(n - 1, max(1, math.ceil(fetch_s[p] / net.announce_delay))) if n > 1 else 0
        per = math.ceil((n - 1) / batches) if batches else 0
        for b in range(batches):
            digests = min(per, n - 1 - b * per)
            if digests > 0:
                t = cr.closed_at + (b + 1) * fetch_s[p] / batches
                out.append(Publish(t, p, min(digests, p2p_wire.MAX_HAVE_DIGESTS), "fetched HAVE (batched)"))
        out.append(Publish(cr.closed_at + fetch_s[p] + 0.1, p, 1, "model HAVE (aggregated)"))
        out.append(Publish(cr.finalized_at + 0.2, p, 1, "model HAVE (finalized, again)"))
        for h in range(int(round_seconds // net.hello_interval)):
            out.append(Publish(h * net.hello_interval + p % 60, p, 0, "hello"))
    return out


def simulate_round(
    n: int,
    *,
    model: Model = LOGREG,
    gas: Gas | None = None,
    mesh: Mesh | None = None,
    chain: Chain = Chain(),
    net: Network = Network(),
    polls: Polls = Polls(),
    seed: int = 0,
    sources: int = 16,
) -> RoundResult:
    gas = gas or measured_gas()
    mesh = mesh or mesh_settings()
    rng = random.Random(seed)
    fetch_s = fetch_seconds(n, model, net, rng)
    cr = simulate_chain(n, gas, chain, fetch_s, rng)
    round_s = cr.finalized_at

    # gossip: a seeded mesh; the propagation of a message is simulated for `sources` origins (it
    # does not depend on the origin in a static mesh without loss: checked) and every publish pays it
    adj = build_mesh(n, mesh, rng)
    degrees = [len(a) for a in adj]
    origins = rng.sample(range(n), min(n, sources))
    runs = [propagate(adj, o) for o in origins]
    if len({r.transmissions for r in runs}) != 1:
        raise AssertionError("transmissions depend on the origin: the mesh model is broken")
    per_msg = runs[0]
    pubs = publishes(n, cr, fetch_s, net, round_s, mesh)
    msg_bytes = [gossip_message_bytes(p.digests) for p in pubs]
    by_kind: dict[str, int] = {}
    for p in pubs:
        by_kind[p.kind] = by_kind.get(p.kind, 0) + 1
    mean_degree = sum(degrees) / n
    # IHAVE: each heartbeat, every peer whose window (gossip_window heartbeats) holds ids sends one
    # IHAVE listing them to `targets` peers outside its mesh
    targets = ihave_targets(n, mean_degree, mesh, net)
    times = sorted(p.time for p in pubs)
    ihave_msgs = ihave_bytes_total = 0
    beat = 0
    while beat * mesh.heartbeat <= round_s + mesh.gossip_window * mesh.heartbeat:
        t = beat * mesh.heartbeat
        lo = _bisect(times, t - mesh.gossip_window * mesh.heartbeat)
        ids = _bisect(times, t) - lo
        if ids and targets:
            ihave_msgs += n * targets
            ihave_bytes_total += n * targets * ihave_bytes(ids)
        beat += 1
    gossip = {
        "mesh_degree_mean": round(mean_degree, 2),
        "mesh_degree_max": max(degrees),
        "per_message_transmissions": per_msg.transmissions,
        "per_message_deliveries": per_msg.deliveries,
        "per_message_duplicates": per_msg.duplicates,
        "per_message_hops": per_msg.hops,
        "published": len(pubs),
        "published_by_kind": by_kind,
        "transmissions": per_msg.transmissions * len(pubs),
        "receptions_per_peer": per_msg.transmissions * len(pubs) / n,
        "mesh_bytes_per_peer": per_msg.transmissions * sum(msg_bytes) / n,
        "ihave_targets": targets,
        "ihave_messages": ihave_msgs,
        "ihave_bytes_per_peer": ihave_bytes_total / n,
        "iwant_messages": 0,  # no loss: every id an IHAVE lists was delivered by the mesh first
    }

    # blobs: all-to-all, busiest uploader under both rules; one blob (a late or the model) to all
    nrng = np.random.default_rng(seed)
    committer = all_to_all_uploads(n, "committer", nrng)
    any_holder = all_to_all_uploads(n, "any-holder", nrng) if n <= 1000 else committer
    one_committer = spread_one(n, [0], "committer", n, rng)
    one_any = spread_one(n, [0], "any-holder", 4, rng)
    b = model.update_bytes
    blobs = {
        "blob_bytes": b,
        "download_per_peer": (n - 1) * b,
        "upload_mean": float(committer.mean()) * b,
        "busiest_upload_committer": int(committer.max()) * b,
        "busiest_upload_any_holder": int(any_holder.max()) * b,
        "one_blob_busiest_committer": max(one_committer.uploads) * b,
        "one_blob_busiest_any_holder_fanout4": max(one_any.uploads) * b,
        "one_blob_slots_any_holder_fanout4": one_any.steps,
        "total_bytes": n * (n - 1) * b,
        "fetch_seconds_mean": sum(fetch_s) / n,
        "fetch_over_timeout": sum(f > net.fetch_timeout for f in fetch_s),
    }

    total_gas = sum(cr.gas.values())
    chain_out = {
        "txs": cr.txs,
        "reverted": cr.reverted,
        "gas": cr.gas,
        "gas_total": total_gas,
        "gas_per_peer": total_gas / n,
        "gas_per_peer_register_once": gas.register,
        "eth_total": total_gas * chain.gas_price_gwei * 1e-9,
        "eth_per_peer": total_gas * chain.gas_price_gwei * 1e-9 / n,
        "commits_per_block": cr.commits_per_block,
        "blocks_for_commits": cr.blocks_commit,
        "blocks_round": cr.final_block,
        "fits_commit_window": cr.fits_commit_window,
        "max_peers_in_commit_window": cr.commits_per_block * chain.commit_window,
        "gas_source": gas.source,
    }
    median_peer = sorted(range(n), key=lambda p: fetch_s[p])[n // 2]
    rpc = rpc_round(n, chain, polls, cr, median_peer, fetch_s[median_peer])
    one_read = RpcCount()
    commitments_read(one_read, n, cr.final_block, chain, "participants()")
    rpc_out = {
        "calls_per_peer": rpc.total_calls,
        "bytes_per_peer": rpc.total_bytes,
        "by_what_calls": rpc.calls,
        "by_what_bytes": rpc.bytes,
        "participants_read_calls": one_read.total_calls,
        "participants_read_checks_storage": READS_STORAGE,
        "participants_read_bytes": one_read.total_bytes,
        "calls_per_second_swarm": rpc.total_calls * n / max(1.0, round_s),
    }
    return RoundResult(
        n,
        gossip,
        blobs,
        chain_out,
        rpc_out,
        {"round_seconds": round_s, "close_seconds": cr.closed_at, "fetch_seconds": blobs["fetch_seconds_mean"]},
    )


def _bisect(values: list[float], x: float) -> int:
    lo, hi = 0, len(values)
    while lo < hi:
        mid = (lo + hi) // 2
        if values[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def block_space_row(n: int, gas: Gas, chain: Chain, seed: int) -> dict[str, Any]:
    """The chain part alone at another block share: blocks and seconds to finalize."""
    rng = random.Random(seed)
    cr = simulate_chain(n, gas, chain, fetch_seconds(n, LOGREG, Network(), rng), rng)
    return {
        "commits_per_block": cr.commits_per_block,
        "blocks_for_commits": cr.blocks_commit,
        "blocks_round": cr.final_block,
        "round_seconds": cr.finalized_at,
        "max_peers_in_commit_window": cr.commits_per_block * chain.commit_window,
    }


# ------------------------------------------------------------------- proposed: sampling at 1,000


def majority_capture(n: int, f: int, k: int) -> tuple[float, float]:
    """P(a coalition of f of n peers holds a strict majority of a committee of k sampled uniformly
    without replacement by a public seed): hypergeometric, exact; and the binomial (with
    replacement, fraction f / n) for comparison."""
    need = k // 2 + 1
    hyper = sum(math.comb(f, x) * math.comb(n - f, k - x) for x in range(need, min(f, k) + 1)) / math.comb(n, k)
    p = f / n
    binom = sum(math.comb(k, x) * p**x * (1 - p) ** (k - x) for x in range(need, k + 1))
    return hyper, binom


@dataclass(frozen=True)
class Sampled:
    contributors: int = 100  # per-round sample of participants (commit and contribute)
    committee: int = 128  # attestation committee sampled by the public seed
    fanout: int = 4  # bounded upload fan-out for the model dissemination
    membership_check_gas: int = 3_000  # modelled: keccak(seed, address) and a compare in commit/attest


def sampled_round(n: int, s: Sampled, model: Model, gas: Gas, chain: Chain, seed: int = 0) -> dict[str, Any]:
    """The proposal at n peers: k contributors commit, a committee of c fetches their k blobs,
    aggregates and attests (c // 2 + 1 votes finalize), everyone else fetches the finalized model
    from any holder with bounded fan-out (simulated)."""
    rng = random.Random(seed)
    k, c = min(s.contributors, n), min(s.committee, n)
    a_gas = attest_gas(gas, k)
    g = k * (gas.commit + s.membership_check_gas) + gas.close + (c // 2 + 1) * (a_gas + s.membership_check_gas)
    committee = rng.sample(range(n), c)
    spread_any = spread_one(n, committee, "any-holder", s.fanout, rng)
    spread_committee = spread_one(n, committee, "committer", n, rng)
    return {
        "contributors": k,
        "committee": c,
        "txs": k + 1 + c // 2 + 1,
        "gas_total": g,
        "gas_per_peer": g / n,
        "eth_total": g * chain.gas_price_gwei * 1e-9,
        "committee_download": k * model.update_bytes,
        "contributor_upload_committer": c * model.update_bytes,
        "model_download_others": model.model_bytes,
        "model_busiest_upload_from_committee": max(spread_committee.uploads) * model.model_bytes,
        "model_busiest_upload_any_holder": max(spread_any.uploads) * model.model_bytes,
        "model_slots_any_holder": spread_any.steps,
        "participants_log_bytes": k * COMMITTED_LOG,
    }


# ------------------------------------------------------------------------------------------ output


def run(ns: tuple[int, ...] = DEFAULT_NS, seed: int = 0, chain: Chain = Chain()) -> dict[str, Any]:
    gas, mesh = measured_gas(), mesh_settings()
    rounds = {
        m.name: [asdict(simulate_round(n, model=m, gas=gas, mesh=mesh, chain=chain, seed=seed)) for n in ns]
        for m in (LOGREG, CNN)
    }
    sampled = {m.name: sampled_round(1000, Sampled(), m, gas, chain, seed) for m in (LOGREG, CNN)}
    block_space = [
        {"n": n, "block_share": share, **block_space_row(n, gas, replace(chain, block_share=share), seed)}
        for share in (1.0, 0.1)
        for n in ns
    ]
    security = [
        {"f": f, "k": k, "hypergeometric": h, "binomial": b}
        for f in (100, 200, 333, 400)
        for k in (16, 32, 64, 128, 256)
        for h, b in [majority_capture(1000, f, k)]
    ]
    return {
        "inputs": {
            "gas": asdict(gas),
            "mesh": asdict(mesh),
            "chain": asdict(chain),
            "network": asdict(Network()),
            "polls": asdict(Polls()),
            "models": {m.name: {"params": m.params, "update_bytes": m.update_bytes} for m in (LOGREG, CNN)},
            "seed": seed,
        },
        "rounds": rounds,
        "block_space": block_space,
        "sampled_1000": sampled,
        "committee_security_n1000": security,
    }


def _p(x: float) -> str:
    return "0 (f < k/2)" if x == 0 else f"{x:.1e}"


def _mb(x: float) -> str:
    return f"{x / 1e6:,.2f}"


def _kb(x: float) -> str:
    return f"{x / 1e3:,.1f}"


def markdown(result: dict[str, Any]) -> str:
    inp = result["inputs"]
    gas, mesh, chain = inp["gas"], inp["mesh"], inp["chain"]
    lr, cnn = result["rounds"][LOGREG.name], result["rounds"][CNN.name]
    out = [
        "Generated by `python scripts/scaling_model.py --write` (seed "
        f"{inp['seed']}; deterministic). Inputs: gas from {gas['source']} (commit {gas['commit']:,}, closeRound "
        f"{gas['close']:,}, attest {gas['attest']:,} at {gas['attest_peers']} peers, register {gas['register']:,}); "
        f"mesh degree {mesh['degree']} ({mesh['degree_low']}-{mesh['degree_high']}) from {mesh['source']}; "
        f"{chain['block_time']:.0f} s blocks of {chain['block_gas_limit']:,} gas, the swarm using "
        f"{chain['block_share']:.0%} of each; {chain['gas_price_gwei']:g} gwei; uplink 100 Mbit/s; round "
        f"{chain['rounds_so_far']} of the swarm. Blob sizes: {LOGREG.name} {LOGREG.update_bytes:,} bytes, "
        f"{CNN.name} {CNN.update_bytes:,} bytes.",
        "",
        "**Gossip per round** (every peer participates; a message = one signed announcement):",
        "",
        table(
            [
                "N",
                "messages published",
                "sent per message (mesh)",
                "hops",
                "receptions per peer",
                "mesh kB per peer",
                "IHAVE targets per heartbeat",
                "IHAVE messages (swarm)",
                "IHAVE kB per peer",
            ],
            [
                [
                    r["n"],
                    f"{r['gossip']['published']:,}",
                    f"{r['gossip']['per_message_transmissions']:,}",
                    r["gossip"]["per_message_hops"],
                    f"{r['gossip']['receptions_per_peer']:,.0f}",
                    _kb(r["gossip"]["mesh_bytes_per_peer"]),
                    r["gossip"]["ihave_targets"],
                    f"{r['gossip']['ihave_messages']:,}",
                    _kb(r["gossip"]["ihave_bytes_per_peer"]),
                ]
                for r in lr
            ],
        ),
        "",
        "**Blobs per round**, all-to-all (MB; busiest = the peer that uploads most; 'one blob' = one blob "
        "spread to every peer from one holder, e.g. a late committer's or the finalized model for followers):",
        "",
        table(
            [
                "N",
                "logreg down per peer",
                "CNN down per peer",
                "CNN busiest up: committer",
                "CNN busiest up: any holder",
                "CNN one blob busiest: committer / any holder (fan-out 4)",
                "CNN fetch s at 100 Mbit/s (peers past fetch_timeout)",
                "CNN swarm total MB",
            ],
            [
                [
                    a["n"],
                    _mb(a["blobs"]["download_per_peer"]),
                    _mb(c["blobs"]["download_per_peer"]),
                    _mb(c["blobs"]["busiest_upload_committer"]),
                    _mb(c["blobs"]["busiest_upload_any_holder"]),
                    f"{_mb(c['blobs']['one_blob_busiest_committer'])} / "
                    f"{_mb(c['blobs']['one_blob_busiest_any_holder_fanout4'])}",
                    f"{c['blobs']['fetch_seconds_mean']:.1f} ({c['blobs']['fetch_over_timeout']})",
                    f"{c['blobs']['total_bytes'] / 1e6:,.0f}",
                ]
                for a, c in zip(lr, cnn)
            ],
        ),
        "",
        f"**Chain per round** ({chain['block_time']:.0f} s blocks; reverted = mined with status 0, gas paid; "
        f"ETH at {chain['gas_price_gwei']:g} gwei):",
        "",
        table(
            [
                "N",
                "commits",
                "closeRound sent / reverted",
                "attest sent / reverted",
                "gas total",
                "gas per peer",
                "ETH per round (swarm)",
                "ETH per peer",
                "commits per block",
                "blocks to finalize",
                "round s",
            ],
            [
                [
                    r["n"],
                    r["chain"]["txs"]["commit"],
                    f"{r['chain']['txs']['close']} / {r['chain']['reverted']['close']}",
                    f"{r['chain']['txs']['attest']} / {r['chain']['reverted']['attest']}",
                    f"{r['chain']['gas_total']:,}",
                    f"{r['chain']['gas_per_peer']:,.0f}",
                    f"{r['chain']['eth_total']:.4f}",
                    f"{r['chain']['eth_per_peer']:.6f}",
                    r["chain"]["commits_per_block"],
                    r["chain"]["blocks_round"],
                    f"{r['time']['round_seconds']:.0f}",
                ]
                for r in lr
            ],
        ),
        "",
        "**RPC per peer per round** (the reads the code makes; logreg; a `participants()` read = "
        "`commitments()`: block_number, roundInfo, eth_getLogs of the round's Committed events"
        + (", commitmentsByDigest" if READS_STORAGE else "")
        + ", as node/chain/client.py reads it now):",
        "",
        table(
            [
                "N",
                "calls per peer",
                "MB per peer",
                "of which commit_history MB",
                "receipt polls",
                "round-state polls",
                "one participants() read: calls / kB",
                "swarm calls per second",
            ],
            [
                [
                    r["n"],
                    f"{r['rpc']['calls_per_peer']:,}",
                    _mb(r["rpc"]["bytes_per_peer"]),
                    _mb(r["rpc"]["by_what_bytes"]["commit_history per committer"]),
                    f"{r['rpc']['by_what_calls']['receipt polls']:,}",
                    f"{r['rpc']['by_what_calls']['round state']:,}",
                    f"{r['rpc']['participants_read_calls']} / {_kb(r['rpc']['participants_read_bytes'])}",
                    f"{r['rpc']['calls_per_second_swarm']:,.0f}",
                ]
                for r in lr
            ],
        ),
        "",
    ]
    out += [
        f"**Block space**: the same round with the whole block and with 10% of each block for the swarm "
        f"(commit window {chain['commit_window']} blocks, node/defaults.toml):",
        "",
        table(
            [
                "N",
                "share of block",
                "commits per block",
                "blocks for commits",
                "blocks to finalize",
                "round s",
                "most peers whose commits fit the window",
            ],
            [
                [
                    r["n"],
                    f"{r['block_share']:.0%}",
                    r["commits_per_block"],
                    r["blocks_for_commits"],
                    r["blocks_round"],
                    f"{r['round_seconds']:.0f}",
                    f"{r['max_peers_in_commit_window']:,}",
                ]
                for r in result["block_space"]
                if r["n"] in (100, 1000)
            ],
        ),
        "",
    ]
    s_lr, s_cnn = result["sampled_1000"][LOGREG.name], result["sampled_1000"][CNN.name]
    out += [
        f"**Proposed at 1,000 peers** ({s_cnn['contributors']} contributors sampled per round, a committee of "
        f"{s_cnn['committee']} attests, the model spread from any holder with fan-out 4):",
        "",
        table(
            ["figure", "logreg", "CNN"],
            [
                ["transactions per round", s_lr["txs"], s_cnn["txs"]],
                ["gas per round", f"{s_lr['gas_total']:,}", f"{s_cnn['gas_total']:,}"],
                ["ETH per round (swarm)", f"{s_lr['eth_total']:.4f}", f"{s_cnn['eth_total']:.4f}"],
                ["committee member downloads (MB)", _mb(s_lr["committee_download"]), _mb(s_cnn["committee_download"])],
                [
                    "contributor uploads, committer-only (MB)",
                    _mb(s_lr["contributor_upload_committer"]),
                    _mb(s_cnn["contributor_upload_committer"]),
                ],
                ["other peers download (MB)", _mb(s_lr["model_download_others"]), _mb(s_cnn["model_download_others"])],
                [
                    "model: busiest upload, from the committee only (MB)",
                    _mb(s_lr["model_busiest_upload_from_committee"]),
                    _mb(s_cnn["model_busiest_upload_from_committee"]),
                ],
                [
                    "model: busiest upload, any holder, fan-out 4 (MB)",
                    _mb(s_lr["model_busiest_upload_any_holder"]),
                    _mb(s_cnn["model_busiest_upload_any_holder"]),
                ],
                ["model: transfer slots to reach all", s_lr["model_slots_any_holder"], s_cnn["model_slots_any_holder"]],
                ["Committed logs per participants() read (kB)", _kb(s_lr["participants_log_bytes"]), "same"],
            ],
        ),
        "",
        "**Committee security** at 1,000 peers: probability that a coalition of f peers holds a strict "
        "majority of a committee of k drawn uniformly by a public seed (hypergeometric, exact; binomial "
        "in brackets):",
        "",
    ]
    ks = sorted({row["k"] for row in result["committee_security_n1000"]})
    rows: list[list[object]] = []
    for f in sorted({row["f"] for row in result["committee_security_n1000"]}):
        cells = {row["k"]: row for row in result["committee_security_n1000"] if row["f"] == f}
        row: list[object] = [f"f = {f} ({f / 10:.1f}%)"]
        rows.append(row + [f"{_p(cells[k]['hypergeometric'])} ({_p(cells[k]['binomial'])})" for k in ks])
    out.append(table(["coalition"] + [f"k = {k}" for k in ks], rows))
    return "\n".join(out)


def write_scaling_doc(md: str, doc: Path = SCALING) -> Path:
    """The tables go between `<!-- bench:scaling -->` markers (scripts/benchdoc.py's convention)."""
    return write_section("scaling", md, doc=doc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, nargs="+", default=list(DEFAULT_NS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gas-price-gwei", type=float, default=Chain.gas_price_gwei)
    parser.add_argument("--block-share", type=float, default=Chain.block_share)
    parser.add_argument("--json", action="store_true", help="print everything as JSON")
    parser.add_argument("--write", action="store_true", help="write the tables into docs/SCALING.md")
    args = parser.parse_args(argv)
    chain = replace(Chain(), gas_price_gwei=args.gas_price_gwei, block_share=args.block_share)
    result = run(tuple(args.peers), args.seed, chain)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(markdown(result))
    if args.write:
        if tuple(args.peers) != DEFAULT_NS or args.seed or chain != Chain():
            parser.error("--write records the default run only (peers, seed, gas price, block share)")
        print(f"wrote {write_scaling_doc(markdown(result))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
