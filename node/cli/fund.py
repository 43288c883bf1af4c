"""`swarm fund`: send ETH to an address, for a newcomer whose new keystore has none.

`swarm node` and `swarm deploy` create a missing keystore and print its address to be funded. On a
local chain the ETH comes from one of the dev accounts `swarm chain --keystore-dir` wrote; on a
testnet from any funded account (or a faucet). The key, as everywhere, never goes on a command
line: SWARM_PRIVATE_KEY, or the keystore (`--keystore`, default ~/.swarm/keystore.json, the
operator's key `swarm deploy` uses too; never created here: a new key has nothing to send).
"""

from __future__ import annotations

import argparse
import json

from node.cli.common import add_transaction_options

DEFAULT_ETH = 1.0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "fund",
        help="send ETH to an address (a new node's keystore) from a funded key",
        description="Send ETH to an address, e.g. the one a new `swarm node` keystore printed. The sender's "
        "key comes from SWARM_PRIVATE_KEY or the keystore (--keystore, default ~/.swarm/keystore.json, "
        "password from SWARM_KEYSTORE_PASSWORD or a prompt). Never on the command line.",
    )
    p.add_argument("--rpc-url", required=True, help="EVM JSON-RPC URL (http or https)")
    p.add_argument("--to", required=True, metavar="ADDR", help="the address to fund (0x and 40 hex digits)")
    p.add_argument("--eth", type=float, default=DEFAULT_ETH, help=f"how much to send (default {DEFAULT_ETH:g} ETH)")
    p.add_argument(
        "--keystore",
        default=None,
        help="the sender's keystore (default ~/.swarm/keystore.json, as `swarm deploy`; on a local chain a dev "
        "keystore of `swarm chain --keystore-dir`)",
    )
    add_transaction_options(p)
    p.set_defaults(func=handler)


def handler(args: argparse.Namespace) -> int:
    import re
    from decimal import Decimal, InvalidOperation

    from node.cli import CLIError, common

    if not re.fullmatch(r"0x[0-9a-fA-F]{40}", args.to):
        raise CLIError(f"--to {args.to!r} is not an address (0x and 40 hex digits)")
    try:
        value = int(Decimal(str(args.eth)) * 10**18)
    except (InvalidOperation, ValueError, OverflowError):  # nan, inf
        value = 0
    if value <= 0:
        raise CLIError(f"--eth must be a positive amount, got {args.eth:g}")
    common.probe_chain(args.rpc_url)  # a wrong URL is one line at once, before web3 loads
    common.setup_logging(args.verbose)
    from web3 import Web3

    from node.chain import keys
    from node.chain.errors import LedgerError
    from node.chain.sender import WEI_PER_ETH, send_eth

    to = Web3.to_checksum_address(args.to)
    try:
        account = keys.load_account(args.keystore, create=False)
        w3 = common.connect_chain(args.rpc_url, check_evm=False)  # a transfer runs on any EVM
        receipt = send_eth(w3, account, to, value, tx_timeout=args.tx_timeout)
        if receipt["status"] != 1:
            raise CLIError(f"the transfer 0x{bytes(receipt['transactionHash']).hex()} failed on chain (status 0)")
        balance = int(w3.eth.get_balance(to))
    except (ValueError, keys.AccountLoadError, LedgerError) as exc:
        raise CLIError(common.one_line(exc)) from exc
    result = {
        "from": account.address,
        "to": to,
        "eth": args.eth,
        "tx": "0x" + bytes(receipt["transactionHash"]).hex(),
        "block": int(receipt["blockNumber"]),
        "balance_eth": balance / WEI_PER_ETH,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"sent {args.eth:g} ETH from {account.address} to {to} (tx {result['tx']}, block {result['block']}); "
            f"{to} now holds {balance / WEI_PER_ETH:.6g} ETH"
        )
    return 0
