"""`swarm deploy`: deploy a SwarmLedger contract and print its address."""
from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    p = subparsers.add_parser("deploy", help="deploy the swarm's ledger contract and print its address",
                              description="Deploy a SwarmLedger. The key comes from SWARM_PRIVATE_KEY or the "
                              "keystore (created on first use, password from SWARM_KEYSTORE_PASSWORD or a prompt).")
    p.add_argument("--rpc-url", required=True, help="EVM JSON-RPC URL (http or https)")
    p.add_argument("--min-peers", type=int, default=2, help="quorum: commitments needed to close a round")
    p.add_argument("--commit-window", "--window", type=int, default=10, dest="commit_window",
                   help="blocks a round takes commitments for (extends until quorum)")
    p.add_argument("--attest-window", type=int, default=10, help="blocks after closing before a round can be aborted")
    p.add_argument("--eps-cap", type=float, default=10.0, help="cap on each peer's cumulative epsilon")
    p.add_argument("--delta", type=float, default=1e-5, help="the swarm's delta")
    p.add_argument("--genesis-digest", required=True,
                   help="sha256 (64 hex digits) of the initial model every peer starts from")
    p.add_argument("--allow", action="append", metavar="ADDR", default=[],
                   help="admit only these addresses (repeatable); without it anyone may register")
    p.add_argument("--keystore", default=None, help="keystore file (default ~/.swarm/keystore.json)")
    p.add_argument("--tx-timeout", type=float, default=120.0, help="seconds to wait for the receipt")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=handler)


def _digest(text: str) -> bytes:
    from node.cli import CLIError

    try:
        raw = bytes.fromhex(text.removeprefix("0x"))
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise CLIError(f"--genesis-digest must be 64 hex digits (a sha256 digest), got {text!r}")
    return raw


def handler(args: argparse.Namespace) -> int:
    from node import keys
    from node.cli import CLIError
    from node.ledger import EPS_SCALE, LedgerClient, LedgerError, connect

    genesis = _digest(args.genesis_digest)
    try:
        account = keys.load_account(args.keystore, create=True)
        w3 = connect(args.rpc_url)
        client = LedgerClient.deploy(
            w3, account, min_peers=args.min_peers, commit_window=args.commit_window,
            attest_window=args.attest_window, eps_cap_micro=round(args.eps_cap * EPS_SCALE), delta=args.delta,
            genesis_digest=genesis, allowlist=args.allow or None, tx_timeout=args.tx_timeout,
        )
    except (ValueError, keys.AccountLoadError, LedgerError) as exc:
        raise CLIError(str(exc)) from None
    result = {"address": client.address, "chain_id": w3.eth.chain_id, "deployer": account.address,
              "gas_used": client.gas_used["deploy"], "block": client.params().deploy_block}
    print(json.dumps(result) if args.json else client.address)
    return 0
