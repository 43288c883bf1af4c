"""Round overhead of real local swarms: for 4, 8, 16 and 32 peer processes on one machine, how
long a round spends outside local training (exchange, chain, aggregation, waiting for slower
peers), where that time goes, the CPU seconds each peer spends on the protocol (its process CPU
less training and evaluation), the blob bytes each peer and the busiest peer upload, the gas, and
how much of a core a peer with nothing to do uses.

Every swarm runs the README demo's configuration (examples/demo.toml: Fashion-MNIST, softmax
regression with DP-SGD, PNPM on the update) with the same total data, so the training work per
round is the same for every N and only the peers' share of it changes. Round 1 is left out of the
averages (it includes process start-up). Writes the "round" section of docs/BENCHMARKS.md.

The idle measure: a swarm of 4 registered peers of which 3 run; they commit round 1 and then wait
for the fourth until the commit window ends. Their CPU time over that wait (from /proc) is the cost
of a peer with nothing to do: chain watching, the registry, gossip heartbeats.

    python scripts/bench_round.py [--peers 4 8 16 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
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

DEMO_TARGET = 0.10  # outside training, share of a round of the demo (4 peers)
LARGE_TARGET = 0.25  # the same for 16 peers
PROTOCOL_CPU_TARGET = 0.2  # CPU seconds per peer and round outside training and evaluation, 16 peers
IDLE_TARGET = 0.02  # of one core, a waiting peer
IDLE_SECONDS = 15.0
PEER_RSS_BYTES = 700 * 2**20  # resident memory of one `swarm node` of the demo (torch, opacus, libp2p): ~650 MB
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


def round_gas(ledger, w3, r: int) -> int:
    info = ledger.round_info(r)
    total = 0
    for b in range(info.opened_block, (info.ended_block or ledger.block_number()) + 1):
        block = w3.eth.get_block(b, full_transactions=True)
        for tx in block.transactions:
            if tx["to"] and tx["to"].lower() == ledger.address.lower():
                total += w3.eth.get_transaction_receipt(tx["hash"])["gasUsed"]
    return total


def blob_size(swarm, r: int) -> int:
    """The size of round r's update blobs (all alike: one model), from a committer's store."""
    for c in swarm.ledger.commitments(r):
        for p in swarm.peers:
            digest = c.digest.hex()
            path = p.workdir / "blobs" / digest[:2] / digest
            if path.exists():
                return path.stat().st_size
    raise RuntimeError(f"no blob of round {r} found in the peers' stores")


def run_swarm(peers: int, rounds: int) -> dict:
    from node.runs.local import LocalSwarm

    config = demo_config(peers, rounds)
    with tempfile.TemporaryDirectory() as tmp, LocalSwarm(config, Path(tmp) / "run") as swarm:
        started = time.monotonic()
        swarm.start()
        swarm.wait(config.chain.run_timeout)
        wall = time.monotonic() - started
        failed = {p.index: last_error(p.workdir / "peer.log") for p in swarm.peers if p.process.returncode != 0}
        for i, why in failed.items():
            print(f"  peer {i} failed: {why}", flush=True)
        all_records = [p.metrics() for p in swarm.peers]
        metrics = [m for ms in all_records for m in ms if m["round"] > 1]
        later = range(2, rounds + 1)
        gas = [round_gas(swarm.ledger, swarm.w3, r) for r in later]
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
    return {
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
        "compute_cpu": mean("compute_cpu_s"),
        "sent": mean("bytes_sent"),
        "received": mean("bytes_received"),
        "busiest_share": statistics.fmean(b / (s * peers) for b, s in zip(busiest, sizes)),
        "blob": statistics.fmean(sizes),
        "gas_round": statistics.fmean(gas),
        "gas_peer": statistics.fmean(gas) / peers,
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
    ap.add_argument("--no-write", action="store_true", help="print the table, leave docs/BENCHMARKS.md alone")
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error("--rounds must be >= 2 (round 1 includes start-up and is left out)")
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
        print(f"swarm of {n} peers, {args.rounds} rounds ...", flush=True)
        results.append(run_swarm(n, args.rounds))
        r = results[-1]
        print(
            f"  round {r['round_s']:.2f} s, training {r['train_s']:.2f} s, outside training {r['outside_s']:.2f} s "
            f"({r['outside_share']:.0%}), protocol CPU {r['protocol_cpu']:.3f} s, training + evaluation CPU "
            f"{r['compute_cpu']:.3f} s, phases "
            + ", ".join(f"{label} {r['phases'][name]:.2f}" for name, label in PHASES)
            + f"; finalized {r['states'].count('finalized')}/{len(r['states'])}",
            flush=True,
        )
    md = report(results, idle, args.rounds, skipped)
    if not args.no_write:
        write_section("round", md)
    print(md)
    by_n = {r["peers"]: r for r in results}
    met = [
        by_n[4]["outside_share"] <= DEMO_TARGET if 4 in by_n else True,
        by_n[16]["outside_share"] <= LARGE_TARGET if 16 in by_n else True,
        max(idle) <= IDLE_TARGET,
    ]
    return 0 if all(met) else 1


def cpu_verdict(by_n: dict[int, dict]) -> str:
    if 16 not in by_n:
        return "protocol CPU at 16 peers: not run"
    cpu = by_n[16]["protocol_cpu"]
    met = "met" if cpu <= PROTOCOL_CPU_TARGET else "NOT met"
    return f"16 peers {cpu:.2f} protocol CPU-s per peer and round (target <= {PROTOCOL_CPU_TARGET}): {met}"


def available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 2**62  # unknown: try


def report(results: list[dict], idle: list[float], rounds: int, skipped: list[str]) -> str:
    rows = [
        [
            r["peers"],
            f"{r['states'].count('finalized')}/{len(r['states'])}",
            f"{r['round_s']:.2f}",
            f"{r['train_s']:.2f}",
            f"{r['eval_s']:.2f}",
            f"{r['outside_s']:.2f}",
            f"**{r['outside_share']:.0%}**",
            f"**{r['protocol_cpu']:.2f}**",
            f"{r['compute_cpu']:.2f}",
            *(f"{r['phases'][name]:.2f}" for name, _ in PHASES if name not in ("training", "evaluating")),
            f"{r['sent'] / 1e3:,.0f}",
            f"{r['busiest_share']:.2f}",
            f"{r['gas_peer']:,.0f}",
            r["penalties"],
        ]
        for r in results
    ]
    base = results[0]
    growth = [
        [
            r["peers"],
            f"{r['peers'] / base['peers']:.0f}x",
            f"{r['outside_s'] / base['outside_s']:.2f}x",
            f"{r['received'] / base['received']:.2f}x",
            f"{r['gas_round'] / base['gas_round']:.2f}x",
            f"{r['gas_peer'] / base['gas_peer']:.2f}x",
        ]
        for r in results
    ]
    by_n = {r["peers"]: r for r in results}

    def verdict(n: int, target: float) -> str:
        if n not in by_n:
            return f"{n} peers: not run"
        share = by_n[n]["outside_share"]
        everything = by_n[n]["states"].count("finalized") == len(by_n[n]["states"]) and not by_n[n]["failed"]
        ok = share <= target and everything
        finalized = by_n[n]["states"].count("finalized")
        return (
            f"{n} peers {share:.0%} outside training, {finalized}/{len(by_n[n]['states'])} rounds finalized "
            f"(target <= {target:.0%}, every round finalized, no peer failing): {'met' if ok else 'NOT met'}"
        )

    headers = ["peers", "finalized", "round s", "training s", "evaluation s", "outside training s", "share"]
    headers += ["protocol CPU-s", "training + evaluation CPU-s"]
    headers += [f"{label} s" for name, label in PHASES if name not in ("training", "evaluating")]
    headers += ["kB sent / peer", "busiest upload / (blob x N)", "gas / peer", "GRAFT-flood penalties"]
    return "\n".join(
        [
            "## Round overhead (`scripts/bench_round.py`)",
            "",
            f"{machine_line()}. Real swarms: Anvil (transactions mined at once, an empty block every 0.25 s "
            "from `swarm up`'s clock once the peers are up), the ledger, N `swarm node` "
            f"processes on 127.0.0.1, the demo's configuration (examples/demo.toml) with the same 40,000 training "
            f"images split over N peers; {rounds} rounds, round 1 left out. Per peer and round, averaged. "
            "'round s' is the period from one round's end to the next's at each peer; 'training s' the part of it "
            "the peer spent in local training (wall clock: its own round's, and the next round's that it starts "
            "on its own aggregate while the majority forms); 'outside training' the rest: exchange, chain, "
            "aggregation, evaluation and waiting for slower peers. The phase columns say where a peer's time "
            "went (phases overlap a speculative training, so they do not add up to the round). All N processes "
            "share 2 cores, so training and waiting both grow with N. 'protocol CPU-s': each peer's process CPU "
            "time (all threads) over the round less the CPU its training and evaluation used, read on their "
            "threads' clocks (node/peer/cpu.py; `protocol_cpu_s` in metrics.jsonl and report.json); CPU seconds, "
            "which other jobs on a shared machine inflate far less than wall time.",
            "",
            table(headers, rows),
            "",
            *(f"{why}." for why in skipped),
            *(
                f"{r['peers']} peers: peer {i} exited non-zero ({why}); the figures are the other peers'."
                for r in results
                for i, why in r["failed"].items()
            ),
            "",
            "Growth against the smallest swarm:",
            "",
            table(
                ["peers", "peers", "outside training", "bytes received per peer", "gas per round", "gas per peer"],
                growth,
            ),
            "",
            f"A waiting peer (3 peers committed, waiting {IDLE_SECONDS:.0f} s for a fourth): "
            + ", ".join(f"{x:.1%}" for x in idle)
            + f" of one core (target <= {IDLE_TARGET:.0%}, {'met' if max(idle) <= IDLE_TARGET else 'NOT met'}).",
            "",
            f"Targets: {verdict(4, DEMO_TARGET)}; {verdict(16, LARGE_TARGET)}; {cpu_verdict(by_n)}.",
            "",
            "'busiest upload / (blob x N)': blob bytes served by the peer that served most in a round, over one "
            "blob per peer of the swarm. All-to-all, every peer needs the N-1 other blobs, so the swarm uploads "
            "N(N-1) blobs and the mean peer N-1: the figure cannot fall below (N-1)/N; what fetching from any "
            "holder buys is that no peer serves much more than that.",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
