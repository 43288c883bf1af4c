"""`swarm ledger`: show a ledger's rounds, participants, digests and epsilon per peer.

The ledger opens the next round as soon as one ends, so a finished swarm's last round is open with
no commitment: it is shown as "not started", not as an unfinished round (`not_started` in --json)."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ledger", help="show a ledger: rounds, participants, digests, eps per peer")
    p.add_argument("--rpc-url", required=True, help="EVM JSON-RPC URL (http or https)")
    p.add_argument("--ledger", required=True, metavar="ADDR", help="the SwarmLedger contract address")
    p.add_argument("--json", action="store_true", help="print everything a verifier needs as JSON")
    p.set_defaults(func=handler)


def not_started(snap: dict) -> int | None:
    """The current round when it is open with no commitment yet, else None."""
    rounds = snap["rounds"]
    last = rounds[-1] if rounds else None
    if last and last["round"] == snap["current_round"] and last["state"] == "OPEN" and not last["participant_count"]:
        return int(last["round"])
    return None


def render(snap: dict) -> str:
    """The human-readable report of a `LedgerClient.snapshot()`."""
    p = snap["params"]
    out = [
        f"SwarmLedger {snap['address']} on chain {snap['chain_id']} at block {snap['block']}",
        f"  quorum {p['min_peers']}, commit window {p['commit_window']} blocks, attestation window "
        f"{p['attest_window']} blocks, eps cap {p['eps_cap']:g}, delta {p['delta']:g}, "
        f"{'allowlist' if p['allowlist_enabled'] else 'open admission'}",
        f"  privacy policy: each commit adds exactly {p['eps_step']:g} to the whole-update eps"
        if p["eps_step"]
        else "  privacy policy: the whole-update eps per round is recomputed by peers and `swarm verify`",
        f"  record-level (DP-SGD, each training record): cap {p['record_eps_cap']:g}, delta {p['record_delta']:g}"
        if p["record_eps_cap"]
        else "  record-level: no DP-SGD in the policy (the training records have no guarantee of their own)",
        f"  genesis {p['genesis_digest']}; current round {snap['current_round']}"
        + (" (not started)" if not_started(snap) else "")
        + f", last finalized round {snap['last_finalized']['round']}",
        "",
    ]
    waiting = not_started(snap)
    for r in snap["rounds"]:
        if r["round"] == waiting:
            out.append(
                f"round {r['round']}: not started (opened at block {r['opened_block']} when round {r['round'] - 1} "
                "ended; no commitment yet)"
                if r["round"] > 1
                else f"round 1: not started (no commitment yet since the deployment at block {r['opened_block']})"
            )
            continue
        blocks = (
            f"opened {r['opened_block']}"
            + (f", closed {r['closed_block']}" if r["closed_block"] else "")
            + (f", ended {r['ended_block']}" if r["ended_block"] else "")
        )
        out.append(
            f"round {r['round']}: {r['state']} ({blocks}), {r['participant_count']} participants"
            + (f", aggregate {r['finalized_digest'][:16]}..." if r["finalized_digest"] else "")
        )
        for c in r["commitments"]:
            out.append(
                f"  #{c['index']} {c['peer']} digest {c['digest'][:16]}... samples {c['num_samples']} "
                f"eps {c['eps']:g} (at most the swarm's delta {p['delta']:g}) via {c['mechanism_name']} "
                f"(protects: {c['protects']})"
                + (
                    f"; record-level eps {c['record_eps']:g} (delta {p['record_delta']:g}, each training record)"
                    if p["record_eps_cap"]
                    else ""
                )
            )
        for a in r["attestations"]:
            out.append(
                f"  attest {a['peer']} aggregate {a['aggregate_digest'][:16]}... included 0x{a['included']} "
                f"({a['votes']} votes)"
            )
    out.append("")
    out.append("peers (eps is cumulative over all rounds; read it with what each mechanism protects, above):")
    for peer in snap["peers"]:
        out.append(
            f"  {peer['address']} eps spent {peer['eps_spent']:g} (delta {p['delta']:g}) "
            + (
                f"record-level eps {peer['record_eps_spent']:g} (delta {p['record_delta']:g}) "
                if p["record_eps_cap"]
                else ""
            )
            + f"peer id {peer['peer_id'][:20]}..."
        )
    return "\n".join(out)


def handler(args: argparse.Namespace) -> int:
    from node.chain.client import LedgerClient, connect
    from node.chain.errors import LedgerError
    from node.cli import CLIError

    try:
        snap = LedgerClient(connect(args.rpc_url), args.ledger).snapshot()
    except (ValueError, LedgerError) as exc:
        raise CLIError(str(exc)) from None
    snap["not_started"] = not_started(snap)
    print(json.dumps(snap, indent=1) if args.json else render(snap))
    return 0
