"""Gas of the SwarmLedger: deploy, register, commit, closeRound, attest, and gas per peer per round
for 4, 16, 64 and 256 peers, on a real Anvil; and a secure-aggregation round of 4 members (postFrame).
Writes the section "ledger" of docs/BENCHMARKS.md.

    python scripts/bench_ledger.py [--peers 4 16 64 256] [--no-write]

Gas is a count, not a time: it is the same on every machine. Each swarm runs two rounds and the
second is reported (steady state: every slot a peer rewrites already exists). In a round every
peer commits, one peer closes, and attestations arrive until the strict majority (n // 2 + 1)
finalizes; the round's total is divided by n for the per-peer figure. Every commit carries its
own digest, so the duplicate-digest check (the round table, docs/LEDGER.md "Gas") is in the
commit figure, and the swarm caps numSamples (maxSamples) like a deployed one would. Round 2 is
the first whose round table is in use (round 1 opens at deployment, before any registration, and
keeps its keys in the overflow mapping), and the first whose commits read the last finalized
inclusion bitmap (who the early close awaits: docs/LEDGER.md "Close"); its finalization rewrites
the other parity's bitmap word with a changed value, the dearer case. 256 peers take about three
minutes on Anvil (2 cores).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.benchdoc import machine_line, table, write_section  # noqa: E402

# A realistic canonical mechanism JSON (PNPM); commit gas grows ~25 gas per byte of it.
MECHANISM = json.dumps({"name": "pnpm", "eps": 1.0, "c": 3.0, "target": "weights"}, separators=(",", ":")).encode()
TARGETS = {"commit": 80_000, "attest": 60_000, "per_peer_round": 100_000}


def digest(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


def register_signed(client, i: int):
    """Register like a real peer: a 38-byte Ed25519 peer id and its key's 64-byte signature."""
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    from node.chain.registration import sign_registration

    key = create_new_key_pair(hashlib.sha256(b"bench key %d" % i).digest()).private_key
    signature = sign_registration(key, client.chain_id(), client.address, client.account.address)
    return client.register(ID.from_pubkey(key.get_public_key()).to_bytes(), signature)


def run_swarm(anvil, n: int) -> dict:
    from eth_account import Account

    from node.chain.client import LedgerClient, connect
    from node.protocol.wire import encode_bitmap

    w3 = connect(anvil.url)
    accounts = [Account.from_key(k) for k in anvil.private_keys[:n]]
    window = n + 2  # every peer commits within the window (automine: one block per transaction)
    deployer = LedgerClient.deploy(
        w3,
        accounts[0],
        min_peers=n,
        commit_window=window,
        attest_window=window,
        commit_window_seconds=1,  # every registered peer commits: the round closes without waiting
        attest_window_seconds=1,
        eps_cap_micro=100_000_000,
        delta=1e-5,
        genesis_digest=digest("genesis"),
        eps_step_micro=1_000_000,  # a pure local mechanism: the contract checks previous + step
        record_eps_cap_micro=100_000_000,  # and DP-SGD's record-level figure: the worst case, both recorded
        record_delta=1e-5,
        max_samples=100_000,
    )
    peers = [deployer] + [LedgerClient(w3, deployer.address, a) for a in accounts[1:]]
    register = [register_signed(p, i)["gasUsed"] for i, p in enumerate(peers)]
    rounds = []
    for r in (1, 2):
        commits = [
            p.commit(r, digest(f"{r}-{i}"), 1000 + i, r * 1_000_000, MECHANISM, r * 2_000_000)["gasUsed"]
            for i, p in enumerate(peers)
        ]
        anvil.rpc("anvil_mine", [hex(window + 1)], timeout=300.0)  # 258 blocks at n = 256: slow on a loaded machine
        close = peers[0].close_round(r)["gasUsed"]
        bitmap = encode_bitmap([True] * n)
        attests = [p.attest(r, digest(f"agg-{r}"), bitmap)["gasUsed"] for p in peers[: n // 2 + 1]]
        rounds.append({"commits": commits, "close": close, "attests": attests})
    last = rounds[-1]
    total = sum(last["commits"]) + last["close"] + sum(last["attests"])
    return {
        "n": n,
        "deploy": deployer.gas_used["deploy"],
        "register": max(register),
        "commit_max": max(last["commits"]),
        "commit_mean": statistics.mean(last["commits"]),
        "close": last["close"],
        "attest_first": last["attests"][0],
        "attest_max": max(last["attests"]),
        "attest_finalizing": last["attests"][-1],
        "per_peer_round": total / n,
        "peer_max_round": max(last["commits"]) + max(last["attests"]),
    }


def run_secure(anvil, n: int = 4) -> dict:
    """A secure-aggregation round (docs/SECAGG.md): every member posts its KEYS, DEALING and
    REVEAL digests with postFrame and its acknowledgments of the KEYS, DEALING and MASKED frames
    (a bitmap of every member) with acknowledge, each in its window, and commits its MASKED
    frame's digest; round 2, as above (round 1 creates each member's posting slot). The windows'
    seconds are 1 and the blocks are mined past each step."""
    from eth_account import Account

    from mechanisms.secagg.messages import max_complaint_bytes
    from node.chain.client import LedgerClient, connect
    from node.protocol.secure_windows import WINDOWS, Step
    from node.protocol.wire import encode_bitmap

    w3 = connect(anvil.url)
    accounts = [Account.from_key(k) for k in anvil.private_keys[:n]]
    window = 16 * (n + 2)  # an eighth of it holds round 1's registrations and every KEYS posting
    deployer = LedgerClient.deploy(
        w3,
        accounts[0],
        min_peers=n,
        commit_window=window,
        attest_window=window,
        commit_window_seconds=1,
        attest_window_seconds=1,
        eps_cap_micro=100_000_000,
        delta=1e-5,
        genesis_digest=digest("genesis"),
        record_eps_cap_micro=100_000_000,
        record_delta=1e-5,
        max_samples=100_000,
        secure_aggregation=True,
    )
    peers = [deployer] + [LedgerClient(w3, deployer.address, a) for a in accounts[1:]]
    for i, p in enumerate(peers):
        register_signed(p, i)
    everyone = encode_bitmap([True] * n)
    posts: dict[str, list[int]] = {}
    first_post = 0

    def into(step: Step, since: int) -> None:  # mine until `step`'s window has begun
        anvil.mine(max(0, since + window * WINDOWS[step].start // 8 + 1 - anvil.block_number()))

    for r in (1, 2):
        opened = peers[0].round_info(r).opened_block
        posts = {"keys": [], "dealing": [], "ack": [], "reveal": []}
        into(Step.KEYS, opened)
        posts["keys"] = [p.post_frame(r, Step.KEYS, digest(f"k{r}-{i}"))["gasUsed"] for i, p in enumerate(peers)]
        first_post = first_post or max(posts["keys"])
        into(Step.KEYS_ACK, opened)
        posts["ack"] += [p.acknowledge(r, Step.KEYS, everyone)["gasUsed"] for p in peers]
        into(Step.DEALING, opened)
        posts["dealing"] = [p.post_frame(r, Step.DEALING, digest(f"d{r}-{i}"))["gasUsed"] for i, p in enumerate(peers)]
        into(Step.DEALING_ACK, opened)
        posts["ack"] += [p.acknowledge(r, Step.DEALING, everyone)["gasUsed"] for p in peers]
        into(Step.COMPLAINT, opened)  # a round with a bad dealer only: outside the round's total
        # COMPLAINT frames: against one dealer, and the largest the contract takes from n registrations
        complaints = [peers[1].complain(r, b"\xa5" * max_complaint_bytes(1))["gasUsed"]]
        if r == 2:
            complaints.append(peers[2].complain(r, b"\xa5" * max_complaint_bytes(n))["gasUsed"])
        anvil.mine(max(0, opened + window * WINDOWS[Step.COMPLAINT].through // 8 + 1 - anvil.block_number()))
        commits = [
            p.commit(r, digest(f"m{r}-{i}"), 1000 + i, 0, MECHANISM, r * 2_000_000)["gasUsed"]
            for i, p in enumerate(peers)
        ]
        peers[0].close_round(r)  # every member committed: the early close
        closed = peers[0].round_info(r).closed_block
        posts["ack"] += [p.acknowledge(r, Step.MASKED, everyone)["gasUsed"] for p in peers]
        into(Step.REVEAL, closed)
        posts["reveal"] = [p.post_frame(r, Step.REVEAL, digest(f"v{r}-{i}"))["gasUsed"] for i, p in enumerate(peers)]
        attests = [p.attest(r, digest(f"agg-{r}"), everyone)["gasUsed"] for p in peers[: n // 2 + 1]]
    return {
        "n": n,
        "post_frame": max(max(posts[step]) for step in ("keys", "dealing", "reveal")),
        "acknowledge": max(posts["ack"]),
        "first_post": first_post,
        "commit": max(commits),
        "complain_one": complaints[0],
        "complain_max": complaints[1],
        "complaint_one_bytes": max_complaint_bytes(1),
        "complaint_max_bytes": max_complaint_bytes(n),
        "secure_per_peer_round": (sum(sum(g) for g in posts.values()) + sum(commits) + sum(attests)) / n,
        "close_after_all": peers[0].gas_used["closeRound"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="SwarmLedger gas benchmark")
    parser.add_argument("--peers", type=int, nargs="+", default=[4, 16, 64, 256])
    parser.add_argument("--no-write", action="store_true", help="print only, do not touch docs/BENCHMARKS.md")
    args = parser.parse_args(argv)

    from node.chain.anvil import start_anvil

    results = []
    for n in args.peers:
        with start_anvil(accounts=n) as anvil:
            results.append(run_swarm(anvil, n))
            print(json.dumps(results[-1]))
    with start_anvil(accounts=4) as anvil:
        secure = run_secure(anvil)
        print(json.dumps(secure))
    secure_total = secure["secure_per_peer_round"] + secure["close_after_all"] / secure["n"]
    base = results[0]["per_peer_round"]
    rows = [
        [
            r["n"],
            r["commit_max"],
            r["close"],
            r["attest_first"],
            r["attest_finalizing"],
            r["attest_max"],
            f"{r['per_peer_round']:,.0f}",
            f"{r['per_peer_round'] / base:.3f}",
            r["peer_max_round"],
        ]
        for r in results
    ]
    worst_commit = max(r["commit_max"] for r in results)
    worst_attest = max(r["attest_max"] for r in results)
    worst_peer = max(max(r["per_peer_round"], r["peer_max_round"]) for r in results)
    first = results[0]

    def verdict(v, t):
        return "met" if v <= t else "MISSED"

    md = "\n".join(
        [
            "## Ledger gas (`python scripts/bench_ledger.py`)",
            "",
            f"{machine_line()}. Anvil 1.7.1 (automine), solc 0.8.28 via IR, optimizer 10,000 runs, EVM shanghai. "
            f"Gas is deterministic: the same on any machine. Mechanism JSON committed: {len(MECHANISM)} bytes "
            "(commit gas grows about 25 gas per byte of it).",
            "",
            table(
                ["operation", "gas"],
                [
                    ["deploy", f"{first['deploy']:,}"],
                    [
                        "register (38-byte Ed25519 peer id, 64-byte signature, two round-table slots)",
                        f"{first['register']:,}",
                    ],
                    ["commit (max over peers)", f"{worst_commit:,}"],
                    ["closeRound", f"{first['close']:,}"],
                    ["attest (max: the finalizing one)", f"{worst_attest:,}"],
                ],
            ),
            "",
            "Per round (second round of each swarm; n // 2 + 1 attestations finalize it; "
            "per peer = round total / n, flatness = per peer / per peer at the smallest swarm):",
            "",
            table(
                [
                    "peers",
                    "commit max",
                    "closeRound",
                    "attest first",
                    "attest finalizing",
                    "attest max",
                    "gas per peer per round",
                    "vs smallest",
                    "one peer's max (commit + attest)",
                ],
                rows,
            ),
            "",
            f'Secure aggregation (`privacy.mechanism = "secagg"`, a ledger deployed with `secure_aggregation`, '
            "docs/SECAGG.md): each member also posts three frame digests with `postFrame` (KEYS, DEALING, "
            f"REVEAL), at most {secure['post_frame']:,} gas each, and its acknowledgments of the KEYS, DEALING and "
            f"MASKED frames it holds with `acknowledge` (at most {secure['acknowledge']:,} gas each for "
            f"{secure['n']} members): a check of the "
            "sender and the step's window, the event, and the rewrite of the member's one posting slot that "
            f"refuses a repeat (its first posting ever creates the slot: {secure['first_post']:,} gas); its "
            f"commit skips the duplicate-digest table ({secure['commit']:,} gas at most). A round of "
            f"{secure['n']} members costs {secure_total:,.0f} gas per member, closeRound included (the MASKED "
            "frame's digest is the ordinary commit). Only in a round with a bad dealer, a holder it sealed bad "
            f"shares to posts its COMPLAINT frame itself with `complain`: {secure['complain_one']:,} gas against "
            f"one dealer ({secure['complaint_one_bytes']} bytes), {secure['complain_max']:,} for the largest frame "
            f"the swarm takes ({secure['complaint_max_bytes']} bytes: 111 + 34 per registration ever made, "
            f"{secure['n']} here; at most 139,375 bytes, 4,096 dealers).",
            "",
            "A commit whose first bucket of the round table is full reads the next one, about 2,540 gas more "
            'each (docs/LEDGER.md "Gas"); the columns show the digests of this run.',
            "",
            f"Targets: commit <= {TARGETS['commit']:,} ({verdict(worst_commit, TARGETS['commit'])}), attest <= "
            f"{TARGETS['attest']:,} ({verdict(worst_attest, TARGETS['attest'])}), a peer's total per round <= "
            f"{TARGETS['per_peer_round']:,} ({verdict(worst_peer, TARGETS['per_peer_round'])}), flat in peers "
            f"(per-peer ratio {min(r['per_peer_round'] for r in results) / base:.3f} to "
            f"{max(r['per_peer_round'] for r in results) / base:.3f}).",
        ]
    )
    print(md)
    if not args.no_write:
        print(f"wrote {write_section('ledger', md)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
