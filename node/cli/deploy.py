"""`swarm deploy`: deploy a SwarmLedger contract and print its address.

Admission is a choice on every chain but a local one: `--allow ADDR...` (an allowlist the
deployer manages) or `--open` (anyone may register, with a warning of what that means). A chain
is local when its chain id is a development chain's, 31337 (Anvil, Hardhat) or 1337 (Ganache,
geth --dev): their accounts come from public mnemonics, so there is nothing to admit against. The
RPC URL does not decide it: a loopback URL can just as well reach a node of a public chain, a
tunnel, or a fork that keeps the public chain's id.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from node.cli.common import add_transaction_options

if TYPE_CHECKING:  # annotations only: the CLI imports its heavy modules lazily
    from eth_account.signers.local import LocalAccount

LOCAL_CHAIN_IDS = frozenset({31337, 1337})
OPEN_WARNING = (
    "warning: open admission: anyone may register with this ledger, and a strict majority of a "
    "round's committers finalizes it, so whoever registers enough (Sybil) addresses can decide "
    "rounds. Use --allow ADDR... to admit only known peers."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "deploy",
        help="deploy the swarm's ledger contract and print its address",
        description="Deploy a SwarmLedger. The deployer's key comes from SWARM_PRIVATE_KEY or the keystore "
        "(--keystore, default ~/.swarm/keystore.json: created on first use, password from "
        "SWARM_KEYSTORE_PASSWORD or a prompt, its new address printed to be funded). Never on the command line.",
    )
    p.add_argument("--rpc-url", required=True, help="EVM JSON-RPC URL (http or https)")
    p.add_argument("--min-peers", type=int, help="quorum: commitments needed to close a round (default: the config's)")
    p.add_argument(
        "--commit-window",
        "--window",
        type=int,
        dest="commit_window",
        help="blocks a round takes commitments for (extends until quorum; default: the config's)",
    )
    p.add_argument(
        "--attest-window", type=int, help="blocks after closing before a round can be aborted (default: the config's)"
    )
    p.add_argument(
        "--eps-cap",
        type=float,
        help="cap on each peer's cumulative epsilon (default: the config's chain.eps_cap; 0 there = "
        "what swarm.rounds rounds of the configured mechanism spend)",
    )
    p.add_argument("--delta", type=float, help="the swarm's delta (default: the config's privacy.delta)")
    p.add_argument(
        "--genesis-digest",
        help="sha256 (64 hex digits) of the initial model; default: computed from the config, which "
        "every peer must then run with (`swarm node --config` the same file)",
    )
    p.add_argument("--config", metavar="TOML", help="the swarm's settings (model, data, aggregation, chain, privacy)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value (repeatable)",
    )
    p.add_argument(
        "--max-samples",
        type=int,
        help="cap on a commit's numSamples, the FedAvg weight (default: the config's chain.max_samples; 0 = 2^32 - 1)",
    )
    admission = p.add_mutually_exclusive_group()
    admission.add_argument(
        "--allow",
        action="extend",
        nargs="+",
        metavar="ADDR",
        default=[],
        help="admit only these addresses (the deployer can allow or disallow more later); "
        "on a non-local chain this or --open is required",
    )
    admission.add_argument(
        "--open",
        action="store_true",
        help="anyone may register (Sybil addresses can then decide rounds); "
        "local chains (chain id 31337 or 1337) are open without it",
    )
    p.add_argument(
        "--keystore",
        default=None,
        help="the deployer's keystore file (default ~/.swarm/keystore.json: the deployer's key serves every "
        "swarm it deploys and manages their allowlists; `swarm node` keeps its own in its --workdir)",
    )
    add_transaction_options(p)
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


def _print_created(account: LocalAccount, path: Path) -> None:
    print(
        f"created keystore {path} for address {account.address}: fund this address on the chain to deploy",
        file=sys.stderr,
        flush=True,
    )


def handler(args: argparse.Namespace) -> int:
    from node.chain import keys
    from node.chain.client import LedgerClient, connect
    from node.chain.errors import LedgerError, LedgerUnavailable
    from node.cli import CLIError, common
    from node.config import quorum
    from node.derive import eps_cap_micro, eps_step_micro, record_eps_cap_micro
    from node.derive import genesis as genesis_blob
    from node.protocol.blob import sha256
    from node.protocol.wire import eps_from_micro, eps_to_micro

    common.setup_logging(args.verbose)
    config = common.load(args, {"max_samples": "chain.max_samples"})
    try:
        genesis = _digest(args.genesis_digest) if args.genesis_digest else sha256(genesis_blob(config))
        min_peers = args.min_peers if args.min_peers is not None else quorum(config)
        commit_window = args.commit_window if args.commit_window is not None else config.chain.commit_window
        attest_window = args.attest_window if args.attest_window is not None else config.chain.attest_window
        cap_micro = eps_to_micro(args.eps_cap) if args.eps_cap is not None else eps_cap_micro(config)
        delta = args.delta if args.delta is not None else config.privacy.delta
        step_micro = eps_step_micro(config)
        record_cap_micro = record_eps_cap_micro(config)
        record_delta = config.train.dp_delta if config.train.dp_sgd else 0.0
        if step_micro > cap_micro:
            raise ValueError(
                f"the eps cap {eps_from_micro(cap_micro):g} is below what one round spends under the configured "
                f"privacy policy ({eps_from_micro(step_micro):g}): no peer could ever commit"
            )
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    try:
        w3 = connect(args.rpc_url)
        chain_id = w3.eth.chain_id
        if not args.allow and not args.open and chain_id not in LOCAL_CHAIN_IDS:
            raise CLIError(
                f"chain {chain_id} is not a local chain (ids {sorted(LOCAL_CHAIN_IDS)}): choose admission with "
                "--allow ADDR... (only these addresses may register) or --open (anyone may; Sybil addresses "
                "can then decide rounds)"
            )
        if args.open:
            print(OPEN_WARNING, file=sys.stderr)
        account = keys.load_account(args.keystore, create=True, on_create=_print_created)
        client = LedgerClient.deploy(
            w3,
            account,
            min_peers=min_peers,
            commit_window=commit_window,
            attest_window=attest_window,
            eps_cap_micro=cap_micro,
            delta=delta,
            genesis_digest=genesis,
            eps_step_micro=step_micro,
            record_eps_cap_micro=record_cap_micro,
            record_delta=record_delta,
            allowlist=args.allow or None,
            max_samples=config.chain.max_samples,
            tx_timeout=args.tx_timeout,
        )
    except LedgerUnavailable as exc:
        raise CLIError(
            f"cannot reach the chain at {args.rpc_url} ({common.short_reason(exc)}): start it or fix --rpc-url"
        ) from None
    except (ValueError, keys.AccountLoadError, LedgerError) as exc:
        raise CLIError(str(exc)) from None
    result = {
        "address": client.address,
        "chain_id": chain_id,
        "admission": "allowlist" if args.allow else "open",
        "max_samples": client.params().max_samples,
        "deployer": account.address,
        "gas_used": client.gas_used["deploy"],
        "block": client.params().deploy_block,
        "genesis_digest": genesis.hex(),
        "eps_cap": eps_from_micro(cap_micro),
        "eps_step": eps_from_micro(step_micro),
        "record_eps_cap": eps_from_micro(record_cap_micro) if record_cap_micro else None,
        "record_delta": record_delta or None,
    }
    print(json.dumps(result) if args.json else client.address)
    return 0
