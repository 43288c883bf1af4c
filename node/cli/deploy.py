"""`swarm deploy`: deploy the swarm's ledger contract and print its address: a SwarmLedger (commit,
close, attest: three transactions a member and round), or with `--ledger-kind pipelined`
(`chain.ledger_kind`) a PipelinedLedger (one: the commit carries the vote on the round before;
docs/LEDGER.md "One transaction per round"). Peers tell the two apart by the deployed code
(node.chain.kind). A pipelined ledger has no secure-aggregation steps (refused by the config), and
its allowlist is fixed at deployment.

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
from typing import TYPE_CHECKING, Any

from node.cli.common import add_transaction_options
from node.config import LEDGER_KINDS

if TYPE_CHECKING:  # annotations only: the CLI imports its heavy modules lazily
    from eth_account.signers.local import LocalAccount

    from node.chain.client import LedgerClient
    from node.chain.pipelined import PipelinedClient
    from node.config import Config

LOCAL_CHAIN_IDS = frozenset({31337, 1337})
# Flags that set a chain.* config key of the same name (checked and derived there like the config's own)
CHAIN_SHORTCUTS = (
    "commit_window",
    "attest_window",
    "commit_window_seconds",
    "attest_window_seconds",
    "max_samples",
    "ledger_kind",
)
OPEN_WARNING = (
    "warning: open admission: anyone may register with this ledger, and a strict majority of a "
    "round's committers finalizes it, so whoever registers enough (Sybil) addresses can decide "
    "rounds. Use --allow ADDR... to admit only known peers."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "deploy",
        help="deploy the swarm's ledger contract and print its address",
        description="Deploy the swarm's ledger: a SwarmLedger, or a PipelinedLedger with --ledger-kind pipelined "
        "(one transaction per member per round). The deployer's key comes from SWARM_PRIVATE_KEY or the keystore "
        "(--keystore, default ~/.swarm/keystore.json: created on first use, password from "
        "SWARM_KEYSTORE_PASSWORD or a prompt, its new address printed to be funded). Never on the command line.",
    )
    p.add_argument("--rpc-url", required=True, help="EVM JSON-RPC URL (http or https)")
    p.add_argument(
        "--ledger-kind",
        choices=LEDGER_KINDS,
        help="the contract: swarm (SwarmLedger: commit, close, attest) or pipelined (PipelinedLedger: one "
        "transaction per member per round; no secure aggregation); default: the config's chain.ledger_kind",
    )
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
        "--commit-window-seconds",
        type=int,
        help="seconds the commit window also lasts: it ends once its blocks and its seconds have passed "
        "(default: the config's chain.commit_window_seconds; 0 there = the blocks x chain.block_time)",
    )
    p.add_argument(
        "--attest-window-seconds",
        type=int,
        help="seconds the attestation window also lasts (default: the config's chain.attest_window_seconds; "
        "0 there = the blocks x chain.block_time)",
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
        help="cap on a commit's numSamples, the FedAvg weight, in the genesis and the ledger (default: the config's "
        "chain.max_samples; 0 there = the largest shard of the config's partition of its data)",
    )
    _add_admission(p)
    add_transaction_options(p)
    p.set_defaults(func=handler)


def _add_admission(p: argparse.ArgumentParser) -> None:
    """Who may register (--allow or --open) and the deployer's key (--keystore)."""
    admission = p.add_mutually_exclusive_group()
    admission.add_argument(
        "--allow",
        action="extend",
        nargs="+",
        metavar="ADDR",
        default=[],
        help="admit only these addresses (the deployer can allow or disallow more later on a SwarmLedger; "
        "a PipelinedLedger's list is fixed at deployment); "
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
    from node.cli import common

    config = common.load(args, {name: f"chain.{name}" for name in CHAIN_SHORTCUTS})
    digest = _digest(args.genesis_digest) if args.genesis_digest else None
    common.probe_chain(args.rpc_url)  # a wrong URL is one line at once, before web3 loads
    common.setup_logging(args.verbose)
    from node.chain.kind import CONTRACT_NAMES
    from node.protocol.wire import eps_from_micro

    terms = _terms(args, config, digest)
    client, chain_id, account = _deploy(args, config, terms)
    result = {
        "address": client.address,
        "ledger_kind": config.chain.ledger_kind,
        "contract": CONTRACT_NAMES[config.chain.ledger_kind],
        "chain_id": chain_id,
        "admission": "allowlist" if args.allow else "open",
        "max_samples": client.params().max_samples,
        "commit_window": [config.chain.commit_window, terms["commit_window_seconds"]],  # both must pass
        "attest_window": [config.chain.attest_window, terms["attest_window_seconds"]],
        "deployer": account.address,
        "gas_used": client.gas_used["deploy"],
        "block": client.params().deploy_block,
        "genesis_digest": terms["genesis_digest"].hex(),
        "eps_cap": eps_from_micro(terms["eps_cap_micro"]),
        "eps_step": eps_from_micro(terms["eps_step_micro"]),
        "record_eps_cap": eps_from_micro(terms["record_eps_cap_micro"]) if terms["record_eps_cap_micro"] else None,
        "record_delta": terms["record_delta"] or None,
    }
    print(json.dumps(result) if args.json else client.address)
    return 0


def _terms(args: argparse.Namespace, config: Config, digest: bytes | None) -> dict[str, Any]:
    """The ledger's constructor terms: the flags, else what the config derives."""
    from node.cli import CLIError
    from node.config import quorum, window_seconds
    from node.derive import (
        eps_cap_micro,
        eps_step_micro,
        max_samples,
        record_delta,
        record_eps_cap_micro,
        secure_aggregation,
    )
    from node.derive import genesis as genesis_blob
    from node.protocol.blob import sha256
    from node.protocol.wire import eps_from_micro, eps_to_micro

    try:
        commit_seconds, attest_seconds = window_seconds(config)
        terms: dict[str, Any] = {
            "genesis_digest": digest or sha256(genesis_blob(config)),
            "min_peers": args.min_peers if args.min_peers is not None else quorum(config),
            "commit_window_seconds": commit_seconds,
            "attest_window_seconds": attest_seconds,
            "eps_cap_micro": eps_to_micro(args.eps_cap) if args.eps_cap is not None else eps_cap_micro(config),
            "delta": args.delta if args.delta is not None else config.privacy.delta,
            "eps_step_micro": eps_step_micro(config),
            "max_samples": max_samples(config),
            "record_eps_cap_micro": record_eps_cap_micro(config),
            "record_delta": record_delta(config),
            "secure_aggregation": secure_aggregation(config),
        }
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    if terms["eps_step_micro"] > terms["eps_cap_micro"]:
        raise CLIError(
            f"the eps cap {eps_from_micro(terms['eps_cap_micro']):g} is below what one round spends under the "
            f"configured privacy policy ({eps_from_micro(terms['eps_step_micro']):g}): no peer could ever commit"
        )
    return terms


def _deploy(
    args: argparse.Namespace, config: Config, terms: dict[str, Any]
) -> tuple[LedgerClient | PipelinedClient, int, LocalAccount]:
    """The ledger of `config.chain.ledger_kind` deployed with `terms`, after the admission choice is
    checked against the chain."""
    from node.chain import keys
    from node.chain.client import LedgerClient
    from node.chain.errors import LedgerError
    from node.chain.pipelined import PipelinedClient
    from node.cli import CLIError, common

    w3 = common.connect_chain(args.rpc_url)
    try:
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
        common_terms: dict[str, Any] = {
            "commit_window": config.chain.commit_window,
            "attest_window": config.chain.attest_window,
            "allowlist": args.allow or None,
            "tx_timeout": args.tx_timeout,
        }
        client: LedgerClient | PipelinedClient
        if config.chain.ledger_kind == "pipelined":  # secure aggregation is False: the config refuses it there
            pipelined_terms = {k: v for k, v in terms.items() if k != "secure_aggregation"}
            client = PipelinedClient.deploy(w3, account, **common_terms, **pipelined_terms)
        else:
            client = LedgerClient.deploy(w3, account, **common_terms, **terms)
    except (ValueError, keys.AccountLoadError, LedgerError) as exc:
        raise CLIError(common.one_line(exc)) from exc
    return client, chain_id, account
