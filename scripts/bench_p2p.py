"""Benchmark the p2p blob exchange on real libp2p hosts over 127.0.0.1; writes section "p2p" of
docs/BENCHMARKS.md.

1. Throughput of a 64 MB chunked fetch (`/swarm/blob/4.0.0`, 1 MiB pieces, pipelined) against a single
   4 MB request/response on the same pair of hosts in the same run (target: ratio >= 0.8).
2. One-piece blobs (30 kB): CPU per fetch with FIRST against OPEN then READ, interleaved in the same run.
3. All-to-all: N peers each hold one 2 MB blob; every peer fetches every other peer's blob (all peers
   at once, each fetching its N-1 blobs one after another), for N = 4, 8, 16, 32. All hosts share one
   process and one trio loop, so the figures include Noise encryption on both ends on one core.
   Target: aggregate MB/s at N = 16 >= 0.7 x that at N = 4 in the same run (docs/P2P.md, "Where the
   cost grew with N").

Usage: python scripts/bench_p2p.py [--reps 3] [--sizes 4,8,16,32] [--no-write]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdoc import machine_line, table, write_section  # noqa: E402

MiB = 1 << 20
SINGLE_PROTOCOL = "/swarm/bench-single/1.0.0"


def _config(**overrides):
    from libp2p.crypto.ed25519 import create_new_key_pair

    from p2p.host import HostConfig

    fields = dict(key_pair=create_new_key_pair(), topic="bench", request_timeout=30.0, connect_timeout=30.0)
    fields.update(overrides)
    return HostConfig(**fields)


async def bench_chunked_vs_single(reps: int, rng: random.Random) -> dict:
    from libp2p.custom_types import TProtocol
    from libp2p.peer.id import ID

    from p2p import wire
    from p2p.host import open_host
    from p2p.store import MemoryBlobStore

    big, small = rng.randbytes(64 * MiB), rng.randbytes(4 * MiB)

    async def serve_single(stream):
        """Baseline: the whole 4 MB answer as one frame, one request, one response."""
        try:
            with trio.fail_after(30):
                await wire.read_frame(stream)
                await wire.write_frame(stream, small)
        finally:
            with trio.move_on_after(1):
                await stream.close()

    async with contextlib.AsyncExitStack() as stack:
        holder_store = MemoryBlobStore()
        big_digest = holder_store.put(big)
        holder = await stack.enter_async_context(open_host(_config(), holder_store))
        holder.libp2p_host.set_stream_handler(TProtocol(SINGLE_PROTOCOL), serve_single)
        chunked, single = [], []
        for _ in range(reps):
            fetcher = await stack.enter_async_context(open_host(_config(), MemoryBlobStore()))
            await fetcher.connect(holder.addrs[0])
            start = time.perf_counter()
            with trio.fail_after(30):
                stream = await fetcher.libp2p_host.new_stream(
                    ID.from_base58(holder.peer_id), [TProtocol(SINGLE_PROTOCOL)]
                )
                await wire.write_frame(stream, b"get")
                got = await wire.read_frame(stream, max_frame=8 * MiB)
                await stream.close()
            single.append(len(got) / (time.perf_counter() - start) / 1e6)
            assert got == small
            start = time.perf_counter()
            got = await fetcher.fetch(big_digest, providers=[holder.peer_id], timeout=120, announce=False)
            chunked.append(len(got) / (time.perf_counter() - start) / 1e6)
            assert got == big
    return {"chunked": statistics.median(chunked), "single": statistics.median(single)}


async def bench_one_piece_fetches(count: int, reps: int, rng: random.Random) -> dict:
    """CPU per fetch of a one-piece blob (30 kB, a round's update) over a kept stream, both ends in this
    process: FIRST (the SIZE and the piece in one answer) against OPEN then READ, interleaved."""
    from p2p.host import open_host
    from p2p.store import MemoryBlobStore

    holder_store = MemoryBlobStore()
    digests = [holder_store.put(rng.randbytes(30_000)) for _ in range(2 * reps * count + 2)]
    cpu: dict[bool, list[float]] = {True: [], False: []}
    async with contextlib.AsyncExitStack() as stack:
        holder = await stack.enter_async_context(open_host(_config(), holder_store))
        fetchers = {}
        for first in (True, False):
            fetchers[first] = await stack.enter_async_context(open_host(_config(ask_first=first), MemoryBlobStore()))
            await fetchers[first].connect(holder.addrs[0])
            await fetchers[first].fetch(digests.pop(), providers=[holder.peer_id], timeout=30, announce=False)
        for _ in range(reps):
            for first in (True, False):
                start = time.process_time()
                for _ in range(count):
                    digest = digests.pop()
                    await fetchers[first].fetch(digest, providers=[holder.peer_id], timeout=30, announce=False)
                cpu[first].append((time.process_time() - start) / count)
    return {first: statistics.median(values) for first, values in cpu.items()}


async def bench_all_to_all(n: int, rng: random.Random) -> dict:
    from p2p.errors import P2PError
    from p2p.host import open_host
    from p2p.store import MemoryBlobStore

    async with contextlib.AsyncExitStack() as stack:
        peers, digests = [], []
        for _ in range(n):
            store = MemoryBlobStore()
            digests.append(store.put(rng.randbytes(2 * MiB)))
            peers.append(await stack.enter_async_context(open_host(_config(dial_discovered=False), store)))
        for i, a in enumerate(peers):  # full mesh of connections, set up before timing
            for b in peers[i + 1 :]:
                try:
                    await a.connect(b.addrs[0])
                except P2PError:  # one retry: at N=32, 496 handshakes in one process can miss a deadline
                    await trio.sleep(1.0)
                    await a.connect(b.addrs[0])
        finished: list[float] = []
        start, cpu_start = time.perf_counter(), time.process_time()

        async def fetch_all(i: int) -> None:
            for j in range(n):
                if j != i:
                    await peers[i].fetch(digests[j], providers=[peers[j].peer_id], timeout=300)
            finished.append(time.perf_counter() - start)

        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(fetch_all, i)
        cpu = time.process_time() - cpu_start
        assert all(p.store.has(d) for p in peers for d in digests)
    moved = n * (n - 1) * 2 * MiB / 1e6
    return {"n": n, "last": max(finished), "mean": statistics.mean(finished), "moved_mb": moved, "cpu": cpu}


async def main(args) -> str:
    rng = random.Random(args.seed)
    ratio = await bench_chunked_vs_single(args.reps, rng)
    small = await bench_one_piece_fetches(200, args.reps, rng)
    rows, throughput = [], {}
    for n in args.sizes:
        try:
            r = await bench_all_to_all(n, rng)
        except BaseException as exc:  # report the size that failed (and why) instead of losing the others
            if isinstance(exc, KeyboardInterrupt):
                raise
            reason = f"{type(exc).__name__}: {exc}"[:160].replace("|", "/")
            rows.append([n, "-", "-", "-", f"failed ({reason})", "-"])
            print(f"N={n}: failed: {reason}", file=sys.stderr)
            continue
        throughput[n] = r["moved_mb"] / r["last"]
        rows.append(
            [
                r["n"],
                f"{r['moved_mb']:.0f}",
                f"{r['mean']:.2f}",
                f"{r['last']:.2f}",
                f"{throughput[n]:.1f}",
                f"{r['moved_mb'] / r['cpu']:.1f}",
            ]
        )
        print(f"N={n}: last peer done in {r['last']:.2f}s ({r['cpu']:.2f} s of CPU)", file=sys.stderr)
    value = ratio["chunked"] / ratio["single"]
    base = min(throughput)
    scaling = [
        f"- aggregate MB/s at N={n} / at N={base}: **{throughput[n] / throughput[base]:.2f}**"
        + (" (target >= 0.7)" if n == 16 else "")
        for n in throughput
        if n != base
    ]
    return "\n".join(
        [
            "## p2p: chunked blob exchange (`scripts/bench_p2p.py`)",
            "",
            f"Machine: {machine_line()}. Real py-libp2p 0.8.1 hosts (TCP + Noise + Yamux) on 127.0.0.1, all in one "
            f"process; median of {args.reps} runs; seed {args.seed}.",
            "",
            table(
                ["measure", "MB/s"],
                [
                    ["64 MB chunked fetch (1 MiB chunks, 8 in flight, sha256 checked)", f"{ratio['chunked']:.1f}"],
                    ["single 4 MB request/response (baseline)", f"{ratio['single']:.1f}"],
                    ["**ratio chunked / single** (target >= 0.8)", f"**{value:.2f}**"],
                ],
            ),
            "",
            "One-piece blobs (30 kB, a round's update), 200 fetches over a kept stream, both ends' CPU in this "
            'process, the two ways interleaved (docs/P2P.md, "One request for a small blob"):',
            "",
            table(
                ["request", "CPU ms per fetch"],
                [
                    ["OPEN, then READ (baseline: two requests, two answers)", f"{small[False] * 1e3:.2f}"],
                    ["FIRST (SIZE and the piece in one answer)", f"{small[True] * 1e3:.2f}"],
                    ["**ratio FIRST / OPEN + READ**", f"**{small[True] / small[False]:.2f}**"],
                ],
            ),
            "",
            "All-to-all: every peer fetches every other peer's 2 MB blob (all peers at once).",
            "",
            table(
                [
                    "N peers",
                    "MB moved",
                    "mean time per peer (s)",
                    "time until last peer done (s)",
                    "aggregate MB/s",
                    "MB per CPU-second",
                ],
                rows,
            ),
            "",
            *scaling,
            "",
            "Each peer moves 2(N-1) MB and the whole swarm N(N-1)*2 MB, all through one event loop on one core "
            "here, so a flat aggregate MB/s means a flat cost per byte; across machines each peer's own work "
            "grows with N. Why it used to fall with N (32.0 MB/s at N=4 and 3.9 at N=16, later 0.37 of N=4's at "
            "N=16: gossip messages, each costing N x D receptions of over a millisecond of CPU, a yamux "
            "WINDOW_UPDATE after every read, multiaddrs parsed for every message) and what was changed: "
            'docs/P2P.md, "Where the cost grew with N". Fetches stripe chunks over up to 3 holders (here mostly '
            "the blob's owner: few others announce it in time).",
        ]
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[4, 8, 16, 32])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true", help="print the section instead of writing it")
    args = parser.parse_args()
    if args.reps < 1:
        parser.error("--reps must be >= 1")
    section = trio.run(main, args)
    print(section)
    if not args.no_write:
        print(f"wrote {write_section('p2p', section)}", file=sys.stderr)
