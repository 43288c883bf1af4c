"""Options shared by several subcommands (config file, --set overrides, --json, -v), the checks that
run before anything is deployed or started (the chain answers at --rpc-url, the data is there, the
device exists), and how an expected failure becomes one line: the known error unwrapped from
trio's ExceptionGroups."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:  # annotations only: the CLI imports its heavy modules lazily
    from web3 import Web3

    from node.chain.client import LedgerClient
    from node.chain.kind import LedgerKind
    from node.chain.pipelined import PipelinedClient
    from node.config import Config

PROBE_TIMEOUT_S = 5.0  # how long the first request to --rpc-url may take before the command gives up
SKLEARN_DATASETS = ("digits", "breast-cancer")  # shipped with scikit-learn: they read no files
NO_DEFAULT_DIR = ("mnist", "cifar10")  # read from files only where --data-dir says (node.learning.data)


def add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="TOML", help="a swarm.toml; defaults come from node/defaults.toml")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value, e.g. --set train.lr=0.05 (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document for scripts")


def add_verbose(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", help="log more, full tracebacks on errors")


def add_transaction_options(parser: argparse.ArgumentParser) -> None:
    """The options of a subcommand that sends one transaction and waits for its receipt."""
    parser.add_argument("--tx-timeout", type=float, default=120.0, help="seconds to wait for the receipt")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_verbose(parser)


def load(args: argparse.Namespace, shortcuts: dict[str, str]) -> Config:
    """Config file, then --set overrides, then the command's own shortcut flags
    (`shortcuts` maps an argparse dest to a config key) which win over both."""
    from node.cli import CLIError
    from node.config import ConfigError, load_config

    overrides = list(args.overrides)
    for dest, key in shortcuts.items():
        value = getattr(args, dest, None)
        if value is not None:
            overrides.append(f"{key}={value}")
    try:
        return load_config(args.config, overrides)
    except (ConfigError, OSError) as exc:
        raise CLIError(str(exc)) from exc


def require_swarm_ledger(config: Config, command: str) -> None:
    """For `swarm simulate --ledger`, which records its rounds on a SwarmLedger only (its simulated
    peers commit, close and attest): chain.ledger_kind = pipelined is refused there, not ignored."""
    from node.cli import CLIError

    if config.chain.ledger_kind != "swarm":
        raise CLIError(
            f"{command} runs on a SwarmLedger only, not chain.ledger_kind = {config.chain.ledger_kind}: run a "
            "pipelined swarm with swarm deploy --ledger-kind pipelined and one swarm node per peer"
        )


def check_data_dir(config: Config) -> None:
    """For the commands that read data: data.data_dir names a folder, and a dataset that reads files."""
    from node.cli import CLIError

    data_dir = config.data.data_dir
    if data_dir and config.data.dataset in SKLEARN_DATASETS:
        raise CLIError(
            f"{config.data.dataset} comes with scikit-learn and reads no files, so --data-dir {data_dir} "
            "(data.data_dir) would be ignored: drop it, or choose a dataset read from files "
            "(fashion-mnist, mnist, cifar10)"
        )
    if not data_dir and config.data.dataset in NO_DEFAULT_DIR:
        raise CLIError(
            f"{config.data.dataset} is read from its files, and this machine has no copy of its own: "
            "give --data-dir DIR (data.data_dir), the folder holding them"
        )
    if data_dir and not Path(data_dir).is_dir():
        raise CLIError(f"--data-dir {data_dir} (data.data_dir) is not a folder: give the folder holding its files")


def check_data(config: Config) -> None:
    """Read one record of the train and test splits, so a missing or unreadable dataset is one line
    before anything is deployed, started or written (heavy: loads torch)."""
    from node.cli import CLIError
    from node.learning.data import DatasetError, load_dataset

    d = config.data
    try:
        for split in ("train", "test"):
            load_dataset(d.dataset, data_dir=d.data_dir, split=split, limit=1)
    except DatasetError as exc:
        where = "give --data-dir DIR (data.data_dir), the folder holding its files"
        if d.dataset == "fashion-mnist" and not d.data_dir:
            where = f"install it (sudo apt-get install dataset-fashion-mnist), {where}, or choose --dataset digits"
        raise CLIError(f"{d.dataset}: {exc}: {where}") from exc


def check_device(config: Config) -> None:
    """train.device = cuda on a machine whose torch sees no CUDA: one line before any work (heavy)."""
    from node.cli import CLIError
    from node.learning.device import device_error

    problem = device_error(config.train.device)
    if problem is not None:
        raise CLIError(f"train.device {problem.rstrip(';')}, got {config.train.device!r}")


def probe_chain(rpc_url: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """One eth_chainId request with the standard library, before web3 loads: a URL that is not an
    Ethereum JSON-RPC endpoint (nothing listening, a web server, a port that never answers) ends
    the command in one line within `timeout` seconds, without the client's retries."""
    import json
    import urllib.error
    import urllib.request

    from node.cli import CLIError

    if not rpc_url.startswith(("http://", "https://")):
        raise CLIError(f"--rpc-url must be an http(s) URL, got {rpc_url!r}")
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "swarm-ledger"}  # some gateways refuse urllib's
    request = urllib.request.Request(rpc_url, body, headers)
    not_chain = f"{rpc_url} is not an Ethereum JSON-RPC endpoint"
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read(1 << 16))
    except urllib.error.HTTPError as exc:
        raise CLIError(f"{not_chain} (it answers HTTP {exc.code} {exc.reason}): fix --rpc-url") from exc
    except TimeoutError as exc:
        raise CLIError(
            f"{rpc_url} took the connection but did not answer within {timeout:g} s: check that a chain "
            "runs there (swarm chain starts one) or fix --rpc-url"
        ) from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        text = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
        raise CLIError(f"cannot reach the chain at {rpc_url} ({text}): start it or fix --rpc-url") from exc
    except ValueError as exc:  # not JSON
        raise CLIError(f"{not_chain} (its answer is not JSON): fix --rpc-url") from exc
    if not (isinstance(answer, dict) and "result" in answer):
        raise CLIError(f"{not_chain} (no eth_chainId result in its answer): fix --rpc-url")


def connect_chain(rpc_url: str, *, check_evm: bool = True) -> Web3:
    """`node.chain.client.connect` after `probe_chain`, its failures as one line."""
    from node.chain.client import connect
    from node.chain.errors import LedgerError
    from node.chain.evm import UnsupportedEVM
    from node.cli import CLIError

    try:
        return connect(rpc_url, check_evm=check_evm)
    except UnsupportedEVM as exc:  # reachable, but cannot run the contract: its own message says how to fix it
        raise CLIError(str(exc)) from exc
    except (ValueError, LedgerError) as exc:
        raise CLIError(f"cannot reach the chain at {rpc_url} ({short_reason(exc)}): start it or fix --rpc-url") from exc


def deployed_kind(w3: Web3, address: str) -> LedgerKind:
    """Which ledger contract runs at `address` (node.chain.kind), an address without one as one line."""
    from node.chain.errors import LedgerError
    from node.chain.kind import ledger_kind
    from node.cli import CLIError

    try:
        return ledger_kind(w3, address)
    except (ValueError, LedgerError) as exc:
        raise CLIError(f"{one_line(exc)}: check --ledger (the address swarm deploy printed) and --rpc-url") from exc


def open_ledger(w3: Web3, address: str) -> LedgerClient:
    """A read-only client of the SwarmLedger at `address`; a wrong address, or a PipelinedLedger
    (which the commands that call this do not read yet), as one line. Code that is neither ledger's
    gets a client all the same: `swarm verify` names what differs (check "code")."""
    from node.chain.client import LedgerClient
    from node.chain.errors import LedgerError, LedgerUnavailable
    from node.chain.kind import ledger_kind
    from node.cli import CLIError

    try:
        pipelined = ledger_kind(w3, address) == "pipelined"
    except LedgerUnavailable as exc:
        raise CLIError(f"{one_line(exc)}: check --rpc-url") from exc
    except (ValueError, LedgerError):
        pipelined = False  # no code, or other code: LedgerClient says which, verify what differs
    if pipelined:
        raise CLIError(
            f"the ledger at {address} is a PipelinedLedger (one transaction per round), which this command does "
            "not read yet: it reads a SwarmLedger"
        )
    try:
        return LedgerClient(w3, address)
    except (ValueError, LedgerError) as exc:
        raise CLIError(f"{one_line(exc)}: check --ledger (the address swarm deploy printed) and --rpc-url") from exc


def open_deployed_ledger(w3: Web3, address: str) -> LedgerClient | PipelinedClient:
    """A read-only client of the ledger at `address`, of the contract deployed there; a wrong
    address as one line."""
    from node.chain.client import LedgerClient
    from node.chain.errors import LedgerError
    from node.chain.pipelined import PipelinedClient
    from node.cli import CLIError

    kind = deployed_kind(w3, address)
    try:
        return PipelinedClient(w3, address) if kind == "pipelined" else LedgerClient(w3, address)
    except (ValueError, LedgerError) as exc:
        raise CLIError(f"{one_line(exc)}: check --ledger (the address swarm deploy printed) and --rpc-url") from exc


class _CurrentStderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever `sys.stderr` is when a record is emitted, not the stream it was at setup:
    a CLI run inside another program (a test that swaps and closes stderr) leaves no handler on a
    closed stream behind it."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def setup_logging(verbose: bool) -> None:
    """Log records to stderr in one format: warnings and errors, everything from INFO up with -v.
    `force`: opacus configures the root logger when imported (its own format, no level), which
    would make this a no-op. py-libp2p detaches its loggers when imported (no handler, no
    propagation: Python's last-resort handler printed their warnings raw); they go through ours,
    whose level (not the loggers', which py-libp2p sets to INFO here and there) keeps them quiet."""
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        handlers=[_CurrentStderrHandler()],
        force=True,
    )
    for handler in logging.getLogger().handlers:
        handler.setLevel(level)
    logging.getLogger("libp2p").propagate = True


def emit_json(obj: object) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside `exc`, ExceptionGroups flattened (trio wraps every task's error in
    one group per nursery it crosses), in order."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def _everything(exc: BaseException) -> list[BaseException]:
    """`exc`, the groups and errors inside it, and the causes and contexts of each, every one once."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or any(current is s for s in seen):
            continue
        seen.append(current)
        todo.append(current.__cause__ or current.__context__)
        if isinstance(current, BaseExceptionGroup):
            todo.extend(reversed(current.exceptions))
    return seen


def expected_failure(exc: BaseException, expected: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first expected error inside `exc` (groups unwrapped), or None when some error inside is
    not expected (a bug: its traceback matters). An insufficient-funds error anywhere in it wins (in a
    group, or in the cause or context of an error or group inside), since it says what to fund:
    registration failures wrap it, and a py-libp2p shutdown race raised while the node stops may
    carry it only as its context."""
    from node.chain.sender import InsufficientFunds

    inner = leaves(exc)
    if not inner or not all(isinstance(e, expected) for e in inner):
        return None
    return next((e for e in _everything(exc) if isinstance(e, InsufficientFunds)), inner[0])


def interrupted(exc: BaseException) -> bool:
    """Whether Ctrl-C is among the errors inside `exc`."""
    return any(isinstance(e, KeyboardInterrupt) for e in leaves(exc))


def one_line(exc: BaseException, hints: Sequence[tuple[str, str]] = ()) -> str:
    """The error's message on one line, plus the first hint whose key occurs in it (what to do)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    for key, hint in hints:
        if key.lower() in text.lower():
            return f"{text}: {hint}"
    return text


def short_reason(exc: BaseException) -> str:
    """A connection error's reason without the HTTP library's nesting ("Connection refused"),
    else the whole message."""
    import re

    text = str(exc)
    found = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    return found.group(1).strip() if found else " ".join(text.split())
