"""`swarm node`: one peer, for swarms across hosts or on a testnet."""
from __future__ import annotations

import logging
from pathlib import Path

from node.cli import common


def register(sub) -> None:
    p = sub.add_parser("node", help="run one peer against a deployed ledger")
    p.add_argument("--rpc-url", required=True, help="the chain's JSON-RPC URL")
    p.add_argument("--ledger", required=True, help="the SwarmLedger contract address")
    p.add_argument("--bootstrap", action="append", default=[], metavar="MULTIADDR",
                   help="a peer to connect to first, /ip4/.../tcp/.../p2p/<id> (repeatable)")
    p.add_argument("--listen", action="append", default=None, metavar="MULTIADDR",
                   help="listen address (default /ip4/127.0.0.1/tcp/0; use 0.0.0.0 across hosts)")
    p.add_argument("--workdir", type=Path, default=Path("swarm-node"),
                   help="keys, blob store, metrics and status of this peer (default ./swarm-node)")
    p.add_argument("--partition", metavar="i/N", help="take shard i of N of the dataset (seeded by swarm.seed)")
    p.add_argument("--data-dir", help="folder holding this peer's dataset files")
    p.add_argument("--fault", help=argparse_suppress())
    p.add_argument("-v", "--verbose", action="store_true")
    common.add_config_options(p)
    p.set_defaults(func=handle)


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS  # testing hook (node/faults.py): a byzantine peer, never for real runs


def handle(args) -> int:
    import trio

    from node.cli import CLIError
    from node.faults import check_fault
    from node.partition import parse_partition_spec
    from node.runner import NodeOptions, run_node

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = common.load(args, {"data_dir": "data.data_dir"})
    from node.setup import mechanism_params

    try:
        partition = parse_partition_spec(args.partition) if args.partition else None
        fault = check_fault(args.fault)
        mechanism_params(config)  # a bad mechanism setting fails here, before any network work
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    options = NodeOptions(rpc_url=args.rpc_url, ledger=args.ledger, workdir=args.workdir,
                          bootstrap=args.bootstrap, listen=args.listen or ["/ip4/127.0.0.1/tcp/0"],
                          partition=partition, fault=fault)
    return trio.run(run_node, config, options)
