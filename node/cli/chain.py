"""`swarm chain`: a local Anvil chain mined the way a swarm needs, until Ctrl-C.

Blocks come every `--block-time` seconds and every transaction is also mined at once (Anvil's mixed
mining, as `swarm up` runs it): a round window passes only in a new block (its number and its
timestamp), so a chain that mined only on transactions would stop the swarm as soon as a peer went
missing. It binds 127.0.0.1 unless `--host` says otherwise: its dev accounts' keys are public
(Anvil's test mnemonic), so whoever reaches the port can spend them.

Keys never go on a command line: `--keystore-dir DIR` writes each dev account as an encrypted
keystore (DIR/dev-<i>.json, mode 0600, password from SWARM_KEYSTORE_PASSWORD or a prompt) for
`swarm deploy --keystore` and `swarm node --keystore`.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import sys
import time
from pathlib import Path

from node.cli import common

DEFAULT_PORT = 8545
DEFAULT_BLOCK_TIME_S = 1.0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "chain",
        help="start a local chain for a swarm (Anvil: a block every second plus one per transaction)",
        description="Start a local Anvil chain with interval plus per-transaction mining, print its URL, "
        "chain id and funded dev accounts, and run until Ctrl-C.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others: warned)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"RPC port (default {DEFAULT_PORT}; 0 = any free)")
    p.add_argument(
        "--block-time",
        type=float,
        default=DEFAULT_BLOCK_TIME_S,
        help=f"seconds between blocks when no transaction comes (default {DEFAULT_BLOCK_TIME_S:g})",
    )
    p.add_argument("--chain-id", type=int, default=31337, help="chain id (default 31337, a local dev chain)")
    p.add_argument("--accounts", type=int, default=10, help="funded dev accounts (default 10)")
    p.add_argument(
        "--keystore-dir",
        type=Path,
        metavar="DIR",
        help="write each dev account as an encrypted keystore DIR/dev-<i>.json "
        "(password from SWARM_KEYSTORE_PASSWORD or a prompt)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON line (url, chain id, accounts) for scripts")
    common.add_verbose(p)
    p.set_defaults(func=handler)


def non_loopback_warning(host: str) -> str | None:
    """The warning for binding `host`, or None when it is a loopback address."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        loopback = False
    if loopback:
        return None
    return (
        f"warning: binding {host}: anyone who can reach this port can use the dev accounts, whose keys are "
        "public (Anvil's test mnemonic); use it only on a network you trust, and never with real funds"
    )


def write_dev_keystores(folder: Path, keys: list[str], password: str) -> list[Path]:
    """DIR/dev-<i>.json for each key (scrypt keystore, mode 0600 from creation). An existing file
    holding the same address is kept; one holding another address is refused."""
    from eth_account import Account
    from eth_typing import HexStr

    from node.cli import CLIError

    if not password:
        raise CLIError("the keystore password must not be empty (SWARM_KEYSTORE_PASSWORD)")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    written = []
    for i, key in enumerate(keys):
        path = folder / f"dev-{i}.json"
        address = Account.from_key(key).address
        if path.exists():
            try:
                stored = json.loads(path.read_text()).get("address", "")
            except (OSError, ValueError, AttributeError):
                stored = ""
            if str(stored).lower().removeprefix("0x") != address.lower().removeprefix("0x"):
                raise CLIError(f"{path} exists and holds another account: refusing to overwrite a key")
        else:
            encrypted = Account.encrypt(HexStr(key), password)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                json.dump(encrypted, handle)
        written.append(path)
    return written


def handler(args: argparse.Namespace) -> int:
    from eth_account import Account

    from node.chain import keys
    from node.chain.anvil import AnvilError, free_port, start_anvil
    from node.cli import CLIError

    if args.block_time <= 0:
        raise CLIError(f"--block-time must be > 0 seconds, got {args.block_time:g}")
    if args.accounts < 1:
        raise CLIError(f"--accounts must be >= 1, got {args.accounts}")
    warning = non_loopback_warning(args.host)
    if warning:
        print(warning, file=sys.stderr)
    try:
        anvil = start_anvil(
            port=args.port or free_port(),
            chain_id=args.chain_id,
            block_time=args.block_time,
            mixed_mining=True,
            accounts=args.accounts,
            host=args.host,
        )
    except (AnvilError, ValueError) as exc:
        first, *log = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = f"{first} {log[-1]}" if log else first  # the log's last line says why (port in use, ...)
        raise CLIError(reason) from None
    with anvil:
        addresses = [Account.from_key(k).address for k in anvil.private_keys]
        stores: list[Path] | None = None
        if args.keystore_dir is not None:
            password = os.environ.get(keys.PASSWORD_ENV)
            if password is None:
                import getpass

                password = getpass.getpass("password for the dev keystores: ")
            stores = write_dev_keystores(args.keystore_dir, anvil.private_keys, password)
        if args.json:
            record = {
                "url": anvil.url,
                "chain_id": anvil.chain_id,
                "host": args.host,
                "port": anvil.port,
                "block_time": args.block_time,
                "accounts": addresses,
                "keystores": [str(p) for p in stores] if stores is not None else None,
            }
            print(json.dumps(record), flush=True)
        else:
            print(_summary(anvil.url, anvil.chain_id, args.block_time, addresses, stores), flush=True)
        # SIGTERM (a service manager, `kill`) stops it as cleanly as Ctrl-C does
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            while anvil.process.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            print("swarm chain: stopping", file=sys.stderr)
            return 0
        tail = anvil.log_tail(1).strip()
        raise CLIError(f"anvil exited with status {anvil.process.returncode}" + (f": {tail}" if tail else ""))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _summary(url: str, chain_id: int, block_time: float, addresses: list[str], stores: list[Path] | None) -> str:
    lines = [
        f"chain: {url}  (chain id {chain_id}; a block every {block_time:g} s, and one per transaction)",
        "funded dev accounts (10000 ETH each; keys from Anvil's public test mnemonic, local use only):",
        *(f"  {i}: {a}" + (f"  {stores[i]}" if stores else "") for i, a in enumerate(addresses)),
    ]
    if stores:
        lines += [
            f"deploy:  swarm deploy --rpc-url {url} --keystore {stores[0]} ...",
            f"a node:  swarm node --rpc-url {url} --keystore {stores[1 % len(stores)]} ...",
            f"fund a new key:  swarm fund --rpc-url {url} --keystore {stores[0]} --to ADDR",
            "(SWARM_KEYSTORE_PASSWORD unlocks them; one account per node)",
        ]
    else:
        lines.append(
            "keys: rerun with --keystore-dir DIR to write each account as an encrypted keystore DIR/dev-<i>.json "
            "for `swarm deploy --keystore` and `swarm node --keystore` (never put a key on a command line)"
        )
    lines.append("Ctrl-C stops the chain (its state is not kept).")
    return "\n".join(lines)
