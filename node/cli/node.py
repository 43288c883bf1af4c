"""`swarm node`: one peer, for swarms across hosts or on a testnet."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from node.cli import common


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("node", help="run one peer against a deployed ledger")
    p.add_argument("--rpc-url", help="the chain's JSON-RPC URL (default: the config's chain.rpc_url)")
    p.add_argument("--ledger", help="the SwarmLedger contract address (default: the config's chain.ledger)")
    p.add_argument(
        "--bootstrap",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="a peer to connect to first, /ip4/.../tcp/.../p2p/<id> (repeatable; added to p2p.bootstrap)",
    )
    p.add_argument(
        "--listen",
        action="append",
        default=None,
        metavar="MULTIADDR",
        help="listen address (default: p2p.listen_host and p2p.listen_port of the config, "
        "127.0.0.1 and any free port; use 0.0.0.0 across hosts)",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=Path("swarm-node"),
        help="keys, blob store, metrics and status of this peer (default ./swarm-node)",
    )
    p.add_argument("--partition", metavar="i/N", help="take shard i of N of the dataset (seeded by swarm.seed)")
    p.add_argument("--data-dir", help="folder holding this peer's dataset files")
    p.add_argument("--fault", help=argparse.SUPPRESS)  # testing hook (node/peer/faults.py): never for real runs
    p.add_argument("-v", "--verbose", action="store_true")
    common.add_config_options(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    import trio

    from node.cli import CLIError
    from node.learning.partition import parse_partition_spec
    from node.peer.faults import check_fault
    from node.peer.runner import NodeOptions, run_node

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    config = common.load(args, {"data_dir": "data.data_dir"})
    from node.derive import mechanism_params

    try:
        partition = parse_partition_spec(args.partition) if args.partition else None
        fault = check_fault(args.fault)
        mechanism_params(config)  # a bad mechanism setting fails here, before any network work
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    rpc_url, ledger = args.rpc_url or config.chain.rpc_url, args.ledger or config.chain.ledger
    if not (rpc_url and ledger):
        raise CLIError("give --rpc-url and --ledger (or chain.rpc_url and chain.ledger in the config)")
    listen = args.listen or [f"/ip4/{config.p2p.listen_host}/tcp/{config.p2p.listen_port}"]
    options = NodeOptions(
        rpc_url=rpc_url,
        ledger=ledger,
        workdir=args.workdir,
        bootstrap=[*args.bootstrap, *config.p2p.bootstrap],
        listen=listen,
        partition=partition,
        fault=fault,
    )
    return trio.run(run_node, config, options)
