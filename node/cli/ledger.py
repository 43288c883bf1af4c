"""`swarm ledger`: show a ledger's rounds, participants, digests and epsilon per peer.

The ledger opens the next round as soon as one ends, so a finished swarm's last round is open with
no commitment: it is shown as "not started", not as an unfinished round (`not_started` in --json)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from node.cli import common

if TYPE_CHECKING:  # annotations only: the CLI imports its heavy modules lazily
    from web3 import Web3


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "ledger",
        help="show a ledger: rounds, participants, digests, eps per peer",
        description="Show a SwarmLedger: its terms, every round with its commitments and attestations, and "
        "each peer's cumulative eps with what it protects. Read from a running chain (--rpc-url and "
        "--ledger), or from a finished `swarm up` run folder (--run: its saved chain on a local Anvil).",
    )
    p.add_argument("--rpc-url", help="EVM JSON-RPC URL (http or https)")
    p.add_argument("--ledger", metavar="ADDR", help="the SwarmLedger contract address")
    p.add_argument(
        "--run", type=Path, metavar="DIR", help="a finished `swarm up` run folder: its ledger from its saved chain"
    )
    p.add_argument("--json", action="store_true", help="print everything a verifier needs as JSON")
    common.add_verbose(p)
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
        f"  quorum {p['min_peers']}, commit window {p['commit_window']} blocks and {p['commit_window_seconds']} s, "
        f"attestation window {p['attest_window']} blocks and {p['attest_window_seconds']} s, "
        f"eps cap {p['eps_cap']:g}, delta {p['delta']:g}, "
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
    from node.cli import CLIError

    if args.run:
        if args.rpc_url or args.ledger:
            raise CLIError("--run reads the run's own saved chain: do not combine it with --rpc-url/--ledger")
        snap = _saved_snapshot(args.run)
    elif args.rpc_url and args.ledger:
        common.probe_chain(args.rpc_url)  # a wrong URL is one line at once, before web3 loads
        snap = _snapshot(common.connect_chain(args.rpc_url, check_evm=False), args.ledger)
    else:
        raise CLIError("give --rpc-url and --ledger, or --run DIR for a finished `swarm up` run")
    snap["not_started"] = not_started(snap)
    print(json.dumps(snap, indent=1) if args.json else render(snap))
    return 0


def _snapshot(w3: Web3, address: str) -> dict:
    from node.chain.errors import LedgerError
    from node.cli import CLIError

    ledger = common.open_ledger(w3, address)
    try:
        return ledger.snapshot()
    except (ValueError, LedgerError) as exc:
        raise CLIError(f"reading the ledger {address} failed: {common.one_line(exc)}") from exc


def _saved_snapshot(run: Path) -> dict:
    """The ledger of a finished run, from the chain state its folder saved, on a local Anvil."""
    from node.chain.anvil import AnvilError, start_anvil
    from node.cli import CLIError
    from node.cli.verify import read_run_info

    info = read_run_info(run)
    try:
        anvil = start_anvil(load_state=run / "chain" / "state.json", chain_id=info["chain_id"])
    except AnvilError as exc:
        raise CLIError(str(exc)) from exc
    with anvil:
        return _snapshot(common.connect_chain(anvil.url, check_evm=False), info["ledger"])
