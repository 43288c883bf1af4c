"""Round overhead of real local swarms: for 4, 8, 16 and 32 peer processes on one machine, how
long a round spends outside local training (exchange, chain, aggregation, waiting for slower
peers), where that time goes, the CPU seconds each peer spends on the protocol (its process CPU
less training and evaluation), the blob bytes each peer and the busiest peer upload, the gas, and
how much of a core a peer with nothing to do uses; on either ledger (`--ledger-kind`: SwarmLedger,
three transactions a member and round, and PipelinedLedger, one; both by default, each figure beside
its baseline), with the transactions, gas and HTTP requests each member sends per round and the
chain's latency around each round's close.

Every swarm runs the README demo's configuration (examples/demo.toml: Fashion-MNIST, softmax
regression with DP-SGD, PNPM on the update) with the same total data, so the training work per
round is the same for every N and only the peers' share of it changes. Round 1 is left out of the
averages (it includes process start-up). Writes the "round" section of docs/BENCHMARKS.md.

The idle measure: a swarm of 4 registered peers of which 3 run; they commit round 1 and then wait
for the fourth until the commit window ends. Their CPU time over that wait (from /proc) is the cost
of a peer with nothing to do: chain watching, the registry, gossip heartbeats.

    python scripts/bench_round.py [--peers 4 8 16 32] [--rounds 3] [--ledger-kind swarm pipelined]
        [--polled-peers 4] [--no-idle]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

from benchdoc import machine_line, table, write_section  # noqa: E402

LEDGER_KINDS = ("swarm", "pipelined")  # node.config.LEDGER_KINDS, without importing torch for --help

PROTOCOL_CPU_TARGET = 0.2  # CPU seconds per peer and round outside training and evaluation, 16 peers
IDLE_TARGET = 0.02  # of one core, a waiting peer
REQUESTS_TARGET = 10  # HTTP requests per member per round at steady state
GAS_TARGET = 60_000  # per member per round
LATENCY_TARGET_BLOCKS = 2  # the chain's own blocks between a round's last commit and its close
IDLE_SECONDS = 15.0
# memory of one `swarm node` of the demo (torch, opacus, libp2p), with a margin: its proportional set size
# (shared libraries counted once over the processes sharing them) was 430 MB in a 16-peer swarm, its RSS 630
PEER_RSS_BYTES = 500 * 2**20
PHASES = [
    ("training", "training"),
    ("committing", "commit"),
    ("waiting-close", "wait close"),
    ("fetching", "fetch"),
    ("aggregating", "aggregate"),
    ("attesting", "attest"),
    ("waiting-final", "wait final"),
    ("evaluating", "evaluate"),
]


def demo_config(peers: int, rounds: int, extra: list[str] = ()):  # type: ignore[assignment]
    from node.config import load_config

    return load_config(
        ROOT / "examples" / "demo.toml",
        [f"swarm.peers={peers}", f"swarm.rounds={rounds}", "chain.run_timeout=1800", *extra],
    )


def chain_figures(ledger, w3, rounds: int) -> dict:
    """The ledger's transactions by the round they name (every transaction to the ledger mined after
    round 2 opened, up to the block that ended the last round, reverted ones included): per
    function, their count and gas in the steady rounds 2..rounds-1 and in the last round (on a
    pipelined ledger the last round's votes go in final votes, sent once a run, not once a round);
    and, per steady round r, the blocks from r's last commit to its close, from its close to r + 1's
    first commit and to r's end. Anvil mines every transaction in a block of its own and an empty
    block every block_time, so a span of blocks is the transactions in it plus the clock's ticks."""
    first = ledger.round_info(2).opened_block + 1  # that block holds round 1's last transaction
    last = ledger.round_info(rounds).ended_block or ledger.block_number()
    steady: dict[str, list[int]] = {}  # function -> gas of each transaction naming a steady round
    final: dict[str, list[int]] = {}  # the same for the last round
    empty = set()
    for b in range(first, last + 1):
        block = w3.eth.get_block(b, full_transactions=True)
        if not block.transactions:
            empty.add(b)
        for tx in block.transactions:
            if not tx["to"] or tx["to"].lower() != ledger.address.lower():
                continue
            fn, args = ledger.contract.decode_function_input(tx["input"])
            r = args.get("round", 0)
            if 2 <= r <= rounds:
                gas = w3.eth.get_transaction_receipt(tx["hash"])["gasUsed"]
                (final if r == rounds else steady).setdefault(fn.fn_name, []).append(gas)
    spans = []
    for r in range(2, rounds):
        info = ledger.round_info(r)
        last_commit = max(c.block_number for c in ledger.commitments(r))
        next_commit = min((c.block_number for c in ledger.commitments(r + 1)), default=0)

        def ticks(a: int, b: int) -> int:
            return sum(1 for x in range(a + 1, b + 1) if x in empty)

        spans.append(
            {
                "commit_close": info.closed_block - last_commit,
                "commit_close_ticks": ticks(last_commit, info.closed_block),
                "close_next": next_commit - info.closed_block if next_commit else None,
                "close_next_ticks": ticks(info.closed_block, next_commit) if next_commit else None,
                "close_end": info.ended_block - info.closed_block if info.ended_block else None,
                "close_end_ticks": ticks(info.closed_block, info.ended_block) if info.ended_block else None,
            }
        )
    return {"steady": steady, "final": final, "spans": spans}


def blob_size(swarm, r: int) -> int:
    """The size of round r's update blobs (all alike: one model), from a committer's store."""
    for c in swarm.ledger.commitments(r):
        for p in swarm.peers:
            digest = c.digest.hex()
            path = p.workdir / "blobs" / digest[:2] / digest
            if path.exists():
                return path.stat().st_size
    raise RuntimeError(f"no blob of round {r} found in the peers' stores")


def run_swarm(peers: int, rounds: int, kind: str, watch: str = "subscribed", by_method: bool = False) -> dict:
    """One swarm of the demo on a ledger of `kind`, its peers watching the chain `watch`
    (subscribed or polled); `by_method`: their HTTP requests through a counting proxy
    (tests/e2e/testnet_box.py, no faults), their subscriptions straight to Anvil."""
    from node.runs.local import LocalSwarm

    extra = [f"chain.ledger_kind={kind}"] + (["chain.ws_url=off"] if watch == "polled" else [])
    config = demo_config(peers, rounds, extra)
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalSwarm(config, Path(tmp) / "run") as swarm,
        contextlib.ExitStack() as proxied,
    ):
        anvil_url, proxy = swarm.anvil.url, None
        if by_method:
            from tests.e2e.testnet_box import ProxyFaults, rpc_proxy

            proxy = proxied.enter_context(rpc_proxy(anvil_url, ProxyFaults(latency_s=0.0, jitter_s=0.0)))
            if watch == "subscribed":
                ws = [f"chain.ws_url={anvil_url.replace('http://', 'ws://')}"]
                swarm.peer_overrides = {p.index: ws for p in swarm.peers}
            swarm.anvil.url = proxy.url  # only the peers' --rpc-url
        started = time.monotonic()
        try:
            swarm.start()
        finally:
            swarm.anvil.url = anvil_url
        swarm.wait(config.chain.run_timeout)
        wall = time.monotonic() - started
        methods = (
            {m: n / (peers * rounds) for m, n in sorted(proxy.stats.by_method.items(), key=lambda kv: -kv[1])}
            if proxy
            else {}
        )
        failed = {p.index: last_error(p.workdir / "peer.log") for p in swarm.peers if p.process.returncode != 0}
        for i, why in failed.items():
            print(f"  peer {i} failed: {why}", flush=True)
        all_records = [p.metrics() for p in swarm.peers]
        metrics = [m for ms in all_records for m in ms if m["round"] > 1]
        later = range(2, rounds + 1)
        chain = chain_figures(swarm.ledger, swarm.w3, rounds)
        states = [swarm.ledger.round_info(r).state.name.lower() for r in later]
        sizes = [blob_size(swarm, r) for r in later]
        busiest = [max((m["bytes_sent"] for m in metrics if m["round"] == r), default=0) for r in later]
        penalties = sum((p.workdir / "peer.log").read_text(errors="replace").count("GRAFT flood") for p in swarm.peers)

    def mean(key):
        return statistics.fmean(m[key] for m in metrics)

    def phase(name):
        return statistics.fmean(m["phase_seconds"].get(name, 0.0) for m in metrics)

    covers = [c for p in all_records for c in training_cover(p)]
    round_s = statistics.fmean(period for period, _ in covers)
    train_s = statistics.fmean(covered for _, covered in covers)
    eval_s = phase("evaluating")
    outside = round_s - train_s
    steady_rounds = peers * (rounds - 2)  # member-rounds of rounds 2..rounds-1

    def per_member(calls: dict[str, list[int]], member_rounds: int) -> dict[str, float]:
        return {name: len(gas) / member_rounds for name, gas in sorted(calls.items())}

    steady_gas = sum(sum(g) for g in chain["steady"].values())
    commits = chain["steady"].get("commit", [])
    requests = sorted(m["rpc_requests"] for m in metrics if m.get("rpc_requests") is not None)
    return {
        "kind": kind,
        "watch": watch,
        "peers": peers,
        "wall": wall,
        "states": states,
        "round_s": round_s,
        "train_s": train_s,
        "eval_s": eval_s,
        "outside_s": outside,
        "outside_share": outside / round_s,
        "phases": {name: phase(name) for name, _ in PHASES},
        "protocol_cpu": mean("protocol_cpu_s"),
        "protocol_cpu_max": max(m["protocol_cpu_s"] for m in metrics),
        "compute_cpu": mean("compute_cpu_s"),
        "sent": mean("bytes_sent"),
        "received": mean("bytes_received"),
        "busiest_share": statistics.fmean(b / (s * peers) for b, s in zip(busiest, sizes)),
        "blob": statistics.fmean(sizes),
        "gas_round": steady_gas / (rounds - 2),
        "gas_peer": steady_gas / steady_rounds,
        "commit_gas": statistics.fmean(commits) if commits else 0.0,
        "tx_peer": sum(len(g) for g in chain["steady"].values()) / steady_rounds,
        "calls": per_member(chain["steady"], steady_rounds),
        "final_calls": per_member(chain["final"], peers),
        "final_gas_peer": sum(sum(g) for g in chain["final"].values()) / peers,
        "spans": chain["spans"],
        "methods": methods,
        "requests_median": statistics.median(requests) if requests else None,
        "requests_range": (requests[0], requests[-1]) if requests else None,
        "penalties": penalties,
        "failed": failed,
    }


def last_error(log: Path) -> str:
    """The last line of a peer's log that says what went wrong (for a peer that exited non-zero)."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["(empty log)"])[-1][:300]


def training_cover(records: list[dict]) -> list[tuple[float, float]]:
    """(round period, seconds of it this peer spent training) for each round after the first.
    The period runs from the end of the previous round to the end of this one (the metrics line's
    time); training is every local training's wall-clock interval that falls in it: a round's own,
    and the next round's when it started early (speculation on our own aggregate)."""
    trainings = [(m["train_started"], m["train_ended"]) for m in records if m.get("train_started")]
    out = []
    for prev, cur in zip(records, records[1:]):
        start, end = prev["time"], cur["time"]
        covered = sum(max(0.0, min(end, b) - max(start, a)) for a, b in trainings)
        out.append((end - start, covered))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu() -> list[float]:
    """CPU share of one core of each of 3 peers waiting for a fourth that never comes."""
    from node.runs.local import LocalSwarm

    config = demo_config(4, 2, ["chain.commit_window=2400"])  # 10 minutes: longer than the measure
    with tempfile.TemporaryDirectory() as tmp, LocalSwarm(config, Path(tmp) / "run") as swarm:
        waiting = swarm.peers[:3]
        for p in waiting:
            swarm.start_peer(p.index)
        deadline = time.monotonic() + 600
        while not all(p.status().get("phase") == "waiting-close" for p in waiting):
            if time.monotonic() > deadline or any(p.process.poll() is not None for p in waiting):
                raise SystemExit("the idle swarm's peers did not all reach waiting-close (see their peer.log)")
            time.sleep(0.2)
        time.sleep(2.0)  # past the commit's own follow-up (announcements, status writes)
        before = [cpu_seconds(p.process.pid) for p in waiting]
        t0 = time.monotonic()
        time.sleep(IDLE_SECONDS)
        elapsed = time.monotonic() - t0
        after = [cpu_seconds(p.process.pid) for p in waiting]
        if not all(p.status().get("phase") == "waiting-close" for p in waiting):
            raise SystemExit("a peer left waiting-close during the idle measure")
    return [(a - b) / elapsed for a, b in zip(after, before)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--ledger-kind", nargs="+", choices=LEDGER_KINDS, default=list(LEDGER_KINDS), help="the ledgers to run on"
    )
    ap.add_argument(
        "--polled-peers",
        type=int,
        nargs="*",
        default=[4],
        help="swarm sizes also run with their peers polling the chain (chain.ws_url = off)",
    )
    ap.add_argument(
        "--by-method-peers",
        type=int,
        nargs="*",
        default=[4],
        help="swarm sizes whose peers' HTTP requests go through a counting proxy, to count them by method",
    )
    ap.add_argument("--no-idle", action="store_true", help="leave out the idle measure")
    ap.add_argument("--no-write", action="store_true", help="print the table, leave docs/BENCHMARKS.md alone")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds must be >= 3 (round 1 includes start-up and is left out; the spans need a next round)")
    idle: list[float] = []
    if not args.no_idle:
        print("idle: 3 peers waiting for a fourth ...", flush=True)
        idle = idle_cpu()
        print("  CPU of one core per waiting peer: " + ", ".join(f"{x:.1%}" for x in idle), flush=True)
    results, skipped = [], []
    for n in args.peers:
        if n * PEER_RSS_BYTES > available_memory():
            why = (
                f"{n} peers not run: {n} x ~{PEER_RSS_BYTES / 2**20:.0f} MB per peer process is more than the "
                f"{available_memory() / 2**30:.1f} GB of memory available"
            )
            print(why, flush=True)
            skipped.append(why)
            continue
        for kind in args.ledger_kind:
            for watch in ["subscribed", *(["polled"] if n in args.polled_peers else [])]:
                print(f"swarm of {n} peers on a {kind} ledger, {watch}, {args.rounds} rounds ...", flush=True)
                results.append(run_swarm(n, args.rounds, kind, watch, by_method=n in args.by_method_peers))
                print("  " + summary(results[-1]), flush=True)
    md = report(results, idle, args.rounds, skipped)
    if not args.no_write:
        write_section("round", md)
    print(md)
    return 0 if all(met for _, met in targets(results, idle)) else 1


def summary(r: dict) -> str:
    return (
        f"round {r['round_s']:.2f} s, training {r['train_s']:.2f} s, outside training {r['outside_s']:.2f} s "
        f"({r['outside_share']:.0%}), protocol CPU {r['protocol_cpu']:.3f} s (max {r['protocol_cpu_max']:.3f}), "
        f"training + evaluation CPU {r['compute_cpu']:.3f} s, phases "
        + ", ".join(f"{label} {r['phases'][name]:.2f}" for name, label in PHASES)
        + f"; transactions per member and round {r['tx_peer']:.2f} "
        + str({k: round(v, 2) for k, v in r["calls"].items()})
        + f", last round {r['final_calls']}, gas {r['gas_peer']:,.0f} (commit {r['commit_gas']:,.0f}, last round "
        f"{r['final_gas_peer']:,.0f}), RPC requests {r['requests_median']} {r['requests_range']}, spans "
        f"{r['spans']}; finalized {r['states'].count('finalized')}/{len(r['states'])}; wall {r['wall']:.0f} s"
        + (f"; requests by method per member and round {r['methods']}" if r["methods"] else "")
    )


def targets(results: list[dict], idle: list[float]) -> list[tuple[str, bool]]:
    """Each target this run measured, in words, and whether it was met."""
    out: list[tuple[str, bool]] = []
    for r in results:
        name = f"{r['peers']} peers, {r['kind']}, {r['watch']}"
        everything = r["states"].count("finalized") == len(r["states"]) and not r["failed"]
        out.append((f"{name}: every round finalized, no peer failing", everything))
        if r["requests_median"] is not None:
            out.append(
                (
                    f"{name}: {r['requests_median']:g} HTTP requests per member per round (median; target <= "
                    f"{REQUESTS_TARGET})",
                    r["requests_median"] <= REQUESTS_TARGET,
                )
            )
        if r["watch"] != "subscribed":
            continue
        if r["peers"] == 16:
            out.append(
                (
                    f"{name}: {r['protocol_cpu']:.2f} protocol CPU-s per member per round (target <= "
                    f"{PROTOCOL_CPU_TARGET})",
                    r["protocol_cpu"] <= PROTOCOL_CPU_TARGET,
                )
            )
        if r["peers"] == 32:
            out.append((f"{name}: 32 peers finalize every round", everything))
        out.append(
            (
                f"{name}: {r['gas_peer']:,.0f} gas per member per round (target <= {GAS_TARGET:,})",
                r["gas_peer"] <= GAS_TARGET,
            )
        )
        out.append((f"{name}: {r['tx_peer']:.2f} transactions per member per round (target 1)", r["tx_peer"] <= 1.0))
        ticks = [s["commit_close_ticks"] for s in r["spans"]]
        out.append(
            (
                f"{name}: clock blocks from a round's last commit to its close {ticks} (target <= "
                f"{LATENCY_TARGET_BLOCKS})",
                max(ticks) <= LATENCY_TARGET_BLOCKS,
            )
        )
    if idle:
        out.append(
            (
                "a waiting peer: "
                + ", ".join(f"{x:.1%}" for x in idle)
                + f" of one core (target <= {IDLE_TARGET:.0%})",
                max(idle) <= IDLE_TARGET,
            )
        )
    return out


def available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 2**62  # unknown: try


def _spans(r: dict, key: str) -> str:
    values = [s[key] for s in r["spans"] if s[key] is not None]
    return ", ".join(str(v) for v in values) or "-"


def steady_rounds(rounds: int) -> str:
    """The rounds after start-up with a next round, in words."""
    return "round 2" if rounds == 3 else f"rounds 2 to {rounds - 1}"


def report(results: list[dict], idle: list[float], rounds: int, skipped: list[str]) -> str:
    subscribed = [r for r in results if r["watch"] == "subscribed"]
    rows = [
        [
            r["peers"],
            r["kind"],
            f"{r['states'].count('finalized')}/{len(r['states'])}",
            f"{r['round_s']:.2f}",
            f"{r['train_s']:.2f}",
            f"{r['outside_s']:.2f}",
            f"{r['outside_share']:.0%}",
            f"**{r['protocol_cpu']:.2f}**",
            f"{r['compute_cpu']:.2f}",
            f"**{r['tx_peer']:.2f}**",
            f"**{r['gas_peer']:,.0f}**",
            f"{r['commit_gas']:,.0f}",
            "-"
            if r["requests_median"] is None
            else f"**{r['requests_median']:g}** ({r['requests_range'][0]}-{r['requests_range'][1]})",
            *(f"{r['phases'][name]:.2f}" for name, _ in PHASES if name not in ("training", "evaluating")),
            f"{r['sent'] / 1e3:,.0f}",
            f"{r['busiest_share']:.2f}",
            r["penalties"],
        ]
        for r in subscribed
    ]
    calls = [
        [
            r["peers"],
            r["kind"],
            ", ".join(f"{name} {n:.2f}" for name, n in r["calls"].items()),
            ", ".join(f"{name} {n:.2f}" for name, n in r["final_calls"].items()),
            f"{r['final_gas_peer']:,.0f}",
        ]
        for r in subscribed
    ]
    methods = [
        [r["peers"], r["kind"], r["watch"], ", ".join(f"{m} {n:.1f}" for m, n in r["methods"].items())]
        for r in results
        if r["methods"]
    ]
    latency = [
        [
            r["peers"],
            r["kind"],
            _spans(r, "commit_close") + " (" + _spans(r, "commit_close_ticks") + ")",
            _spans(r, "close_next") + " (" + _spans(r, "close_next_ticks") + ")",
            _spans(r, "close_end") + " (" + _spans(r, "close_end_ticks") + ")",
        ]
        for r in subscribed
    ]
    polled = [r for r in results if r["watch"] == "polled"]
    watching = [
        [
            r["peers"],
            r["kind"],
            r["watch"],
            "-" if r["requests_median"] is None else f"{r['requests_median']:g}",
            "-" if r["requests_range"] is None else f"{r['requests_range'][0]}-{r['requests_range'][1]}",
            f"{r['protocol_cpu']:.2f}",
            f"{r['round_s']:.2f}",
        ]
        for r in results
        if any(p["peers"] == r["peers"] and p["kind"] == r["kind"] for p in polled)
    ]
    growth = []
    for r in subscribed:
        base = next(b for b in subscribed if b["kind"] == r["kind"])
        growth.append(
            [
                r["peers"],
                r["kind"],
                f"{r['peers'] / base['peers']:.0f}x",
                f"{r['outside_s'] / base['outside_s']:.2f}x",
                f"{r['received'] / base['received']:.2f}x",
                f"{r['gas_round'] / base['gas_round']:.2f}x",
                f"{r['gas_peer'] / base['gas_peer']:.2f}x",
            ]
        )

    headers = ["peers", "ledger", "finalized", "round s", "training s", "outside training s", "share"]
    headers += ["protocol CPU-s", "training + evaluation CPU-s", "transactions / member", "gas / member"]
    headers += ["gas / commit", "HTTP requests / member (median, range)"]
    headers += [f"{label} s" for name, label in PHASES if name not in ("training", "evaluating")]
    headers += ["kB sent / peer", "busiest upload / (blob x N)", "GRAFT-flood penalties"]
    return "\n".join(
        [
            "## Round overhead (`scripts/bench_round.py`)",
            "",
            f"{machine_line()}. Real swarms: Anvil (transactions mined at once, an empty block every 0.25 s "
            "from `swarm up`'s clock once the peers are up), the ledger, N `swarm node` "
            f"processes on 127.0.0.1, the demo's configuration (examples/demo.toml) with the same 40,000 training "
            f"images split over N peers; {rounds} rounds, round 1 left out; the blob fetch timeout `swarm up`'s for "
            "N peers sharing this machine's cores (node/runs/local.py `size_exchange`: 10 s up to 16 peers on 2 "
            "cores, 40 s for 32). Each swarm size on both ledgers, one "
            "after the other in the same run: 'swarm' the SwarmLedger (commit, closeRound, attest), 'pipelined' "
            'the PipelinedLedger (one commit a round carrying the vote on the round before; docs/LEDGER.md "One '
            'transaction per round"), deployed with the same terms and its peers registered there. Per member '
            "and round, averaged. "
            "'round s' is the period from one round's end to the next's at each peer; 'training s' the part of it "
            "the peer spent in local training (wall clock: its own round's, and the next round's that it starts "
            "on its own aggregate while the majority forms); 'outside training' the rest: exchange, chain, "
            "aggregation, evaluation and waiting for slower peers. The phase columns say where a peer's time "
            "went (phases overlap a speculative training, so they do not add up to the round). All N processes "
            "share 2 cores, so training and waiting both grow with N. 'protocol CPU-s': each peer's process CPU "
            "time (all threads) over the round less the CPU its training and evaluation used, read on their "
            "threads' clocks (node/peer/cpu.py; `protocol_cpu_s` in metrics.jsonl and report.json); CPU seconds, "
            "which a shared virtual machine's other tenants still inflate: the same tree gave 0.19 and 0.36 at 16 "
            "peers hours apart here, a fixed Python workload 0.10 to 0.18 CPU-s minutes apart (docs/SCALING.md, "
            "\"Per task, counted\"). 'transactions' and 'gas': "
            f"the transactions to the ledger (reverted ones included) naming {steady_rounds(rounds)}, the steady "
            "rounds, over members x those rounds; the last round's, whose votes go in final votes on the "
            "pipelined ledger, apart below; 'gas / commit' the mean commit's. 'HTTP requests': each "
            "member's requests to its RPC endpoint per round (`rpc_requests` in metrics.jsonl: the client's own "
            "count, web3's and the raw reader's), the peers subscribed to new heads and the ledger's logs over "
            "Anvil's WebSocket (its two `eth_subscribe` requests not counted).",
            "",
            table(headers, rows),
            "",
            *(f"{why}." for why in skipped),
            *(
                f"{r['peers']} peers ({r['kind']}, {r['watch']}): peer {i} exited non-zero ({why}); the figures "
                "are the other peers'."
                for r in results
                for i, why in r["failed"].items()
            ),
            "",
            "Transactions per member and round, by function: the steady rounds, and the last round (sent once a "
            "run: its final votes on the pipelined ledger):",
            "",
            table(["peers", "ledger", "steady rounds", "last round", "last round gas / member"], calls),
            "",
            *(
                [
                    "HTTP requests per member and round by method, the whole run (start-up included) over "
                    f"members x {rounds} rounds, counted by a proxy in front of Anvil (tests/e2e/testnet_box.py, no "
                    "faults) in the runs so marked:",
                    "",
                    table(["peers", "ledger", "watching", "requests by method"], methods),
                    "",
                ]
                if methods
                else []
            ),
            f"Chain latency around each round's close, {steady_rounds(rounds)} (a round r needs r + 1's "
            "commits): blocks from r's last commit to the block r closed "
            "in, from that block to r + 1's first commit, and from r's close to its end (finalized or aborted). "
            "Anvil mines each transaction in a block of its own and adds an empty block every 0.25 s, so a span "
            "of blocks counts the transactions in it and the clock's ticks; the ticks (empty blocks, the chain's "
            "own waiting) in brackets. On the pipelined ledger the last commit closes the round in its own block; "
            "r + 1's first commit then waits for the peers (fetch, aggregation, training), not the chain; r ends "
            "at the commit of r + 1 that brings the majority of votes.",
            "",
            table(
                [
                    "peers",
                    "ledger",
                    "last commit -> close (ticks)",
                    "close -> next commit (ticks)",
                    "close -> end (ticks)",
                ],
                latency,
            ),
            "",
            *(
                [
                    "Watching the chain by subscription against polling it (`chain.ws_url = off`), the same "
                    "swarm size and ledger, HTTP requests per member and round:",
                    "",
                    table(
                        ["peers", "ledger", "watching", "requests (median)", "range", "protocol CPU-s", "round s"],
                        watching,
                    ),
                    "",
                ]
                if watching
                else []
            ),
            "Growth against the smallest swarm of the same ledger:",
            "",
            table(
                [
                    "peers",
                    "ledger",
                    "peers",
                    "outside training",
                    "bytes received per peer",
                    "gas per round",
                    "gas per member",
                ],
                growth,
            ),
            "",
            *(
                [
                    f"A waiting peer (SwarmLedger, 3 peers committed, waiting {IDLE_SECONDS:.0f} s for a fourth): "
                    + ", ".join(f"{x:.1%}" for x in idle)
                    + f" of one core (target <= {IDLE_TARGET:.0%}).",
                    "",
                ]
                if idle
                else []
            ),
            "Targets:",
            "",
            *(f"- {what}: {'met' if met else 'NOT met'}" for what, met in targets(results, idle)),
            "",
            "'busiest upload / (blob x N)': blob bytes served by the peer that served most in a round, over one "
            "blob per peer of the swarm. All-to-all, every peer needs the N-1 other blobs, so the swarm uploads "
            "N(N-1) blobs and the mean peer N-1: the figure cannot fall below (N-1)/N; what fetching from any "
            "holder buys is that no peer serves much more than that.",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
