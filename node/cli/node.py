"""`swarm node`: one peer, for swarms across hosts or on a testnet.

Before any network work it unlocks both keys, checks the chain answers, that the ledger exists,
that this node's settings give the ledger's genesis digest and that the swarm's rounds are not
over, so the usual mistakes end in one line instead of after minutes. While the peer runs,
`node_output.NodeReporter` prints its addresses and one line per round; expected failures inside
the peer (trio wraps them in ExceptionGroups) are unwrapped to one line too, the full traceback
only with -v.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from node.cli import common, dashboard

if TYPE_CHECKING:  # annotations only: the CLI imports its heavy modules lazily
    from eth_account.signers.local import LocalAccount

    from node.chain.client import LedgerClient
    from node.chain.pipelined import PipelinedClient
    from node.cli.node_output import NodeReporter
    from node.config import Config
    from node.peer.runner import NodeOptions

KEYSTORE_NAME = "eth-keystore.json"  # in --workdir unless --keystore says otherwise
BOOTSTRAP_TIMEOUT_S = 60.0  # node.peer.runner.BOOTSTRAP_TIMEOUT_S (not imported: `swarm --help` stays fast)

ENVIRONMENT_HELP = """\
keys (never on the command line):
  SWARM_PRIVATE_KEY        the peer's Ethereum key (hex); when unset, the keystore is used
  SWARM_KEYSTORE_PASSWORD  password of the keystore (--keystore, default <workdir>/eth-keystore.json),
                           created on first use; its new address is printed: fund it before the
                           peer can register and commit (a prompt asks when unset on a terminal)
  SWARM_P2P_PASSWORD       password of the libp2p key file <workdir>/p2p.key (the peer id),
                           created on first use (a prompt asks when unset on a terminal)

output: the listen addresses (give the /p2p/ one to other peers as --bootstrap), one line per
round (state, included peers, accuracy, cumulative eps with its delta and scope) and a summary;
-q prints only warnings and errors. Peers sharing dataset files must each take --partition i/N.
The ledger's events are kept in <workdir>/chain-events.jsonl for `swarm dashboard --run <workdir>`.
"""

# Errors a peer raises on purpose: a message for the user, not a bug. Anything else keeps its traceback.
HINTS = [
    ("genesis digest", "start this node with the --config (and --set values) the ledger was deployed with"),
    (
        "no close on chain",
        "the round never closed: check that enough peers (the quorum) run and reach each other "
        "(--bootstrap, --listen) and that the chain mines blocks",
    ),
    (
        "no finalization on chain",
        "no majority attested in time: check that the peers reach each other "
        "(--bootstrap, --listen) and that the chain mines blocks",
    ),
    ("could not be fetched", "the peers that hold it are gone or unreachable: check --bootstrap and --listen"),
    ("address already in use", "choose another --listen port"),
    ("no answer after", "check that the chain runs and that --rpc-url reaches it"),
]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "node",
        help="run one peer against a deployed ledger",
        description="Run one peer of a swarm against its deployed ledger (swarms across hosts or on a testnet).",
        epilog=ENVIRONMENT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--rpc-url",
        action="append",
        default=None,
        help="the chain's JSON-RPC URL (default: the config's chain.rpc_url); given twice, the second endpoint is a "
        "witness: the node stops when the two disagree (a block's hash, or its own commit)",
    )
    p.add_argument(
        "--ledger",
        help="the ledger contract's address, a SwarmLedger or a PipelinedLedger: the node runs the round loop of "
        "the one deployed there (default: the config's chain.ledger)",
    )
    p.add_argument(
        "--bootstrap",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="a peer to connect to first, /ip4/.../tcp/.../p2p/<id> as another peer printed it "
        "(repeatable; added to p2p.bootstrap)",
    )
    p.add_argument(
        "--listen",
        action="append",
        default=None,
        metavar="MULTIADDR",
        help="listen address (default: p2p.listen_host and p2p.listen_port of the config, 127.0.0.1 and any "
        "free port); across hosts use /ip4/0.0.0.0/tcp/PORT: the addresses printed and written to "
        "<workdir>/peer.json are then this host's interface addresses",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=Path("swarm-node"),
        help="keys, blob store, metrics and status of this peer (default ./swarm-node)",
    )
    p.add_argument(
        "--keystore",
        type=Path,
        help=f"this node's Ethereum keystore (default <workdir>/{KEYSTORE_NAME}, one key per node; created on "
        "first use, password from SWARM_KEYSTORE_PASSWORD); SWARM_PRIVATE_KEY, when set, is used instead. "
        "`swarm deploy` and `swarm fund` default to ~/.swarm/keystore.json, the operator's key",
    )
    p.add_argument(
        "--partition",
        metavar="i/N",
        help="train on shard i of N (0-based) of the dataset, split by data.partition and swarm.seed: "
        "peers that share dataset files must each take a distinct i with the same N",
    )
    p.add_argument("--data-dir", help="folder holding this peer's dataset files")
    p.add_argument(
        "--bootstrap-timeout",
        type=float,
        default=BOOTSTRAP_TIMEOUT_S,
        metavar="SECONDS",
        help=f"with --bootstrap: stop (exit status 2) when no peer is connected this long after listening "
        f"(default {BOOTSTRAP_TIMEOUT_S:g}; 0 = wait for ever)",
    )
    p.add_argument(
        "--no-chain-events",
        dest="chain_events",
        action="store_false",
        help="do not keep the ledger's events in <workdir>/chain-events.jsonl (read once every few seconds; "
        "with --dashboard every second)",
    )
    p.add_argument("--fault", help=argparse.SUPPRESS)  # testing hook (node/peer/faults.py): never for real runs
    verbosity = p.add_mutually_exclusive_group()
    verbosity.add_argument("-v", "--verbose", action="store_true", help="log everything, full tracebacks on errors")
    verbosity.add_argument("-q", "--quiet", action="store_true", help="print only warnings and errors")
    dashboard.add_options(p)
    common.add_config_options(p)
    p.set_defaults(func=handle)


@dataclass
class _Plan:
    """What `swarm node` will run, checked before anything heavy loads."""

    config: Config
    partition: tuple[int, int] | None
    rpc_url: str
    witness_url: str | None  # a second --rpc-url
    ledger: str
    listen: list[str]
    bootstrap: list[str]
    fault: str | None


def handle(args: argparse.Namespace) -> int:
    plan = _plan(args)
    for url in (plan.rpc_url, plan.witness_url):  # a wrong URL is one line at once, before web3 loads
        if url is not None:
            common.probe_chain(url)
    _setup_logging(args.verbose)
    from node.cli import CLIError
    from node.derive import mechanism_params

    common.check_device(plan.config)
    common.check_data(plan.config)
    try:
        mechanism_params(plan.config)  # a bad mechanism setting fails here, before any network work
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    return _run(args, plan)


def _plan(args: argparse.Namespace) -> _Plan:
    from node.cli import CLIError
    from node.learning.partition import parse_partition_spec
    from node.peer.faults import check_fault

    config = common.load(args, {"data_dir": "data.data_dir"})
    common.check_data_dir(config)
    dashboard.check_options(args)
    try:
        partition = parse_partition_spec(args.partition) if args.partition else None
        fault = check_fault(args.fault)
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    urls, ledger_address = args.rpc_url or [config.chain.rpc_url], args.ledger or config.chain.ledger
    if len(urls) > 2:
        raise CLIError(f"--rpc-url is given at most twice (an endpoint and its witness), got {len(urls)}")
    rpc_url, witness_url = urls[0], (urls[1] if len(urls) == 2 else None)
    if not (rpc_url and ledger_address):
        raise CLIError("give --rpc-url and --ledger (or chain.rpc_url and chain.ledger in the config)")
    bootstrap = [*args.bootstrap, *config.p2p.bootstrap]
    for addr in bootstrap:
        if "/p2p/" not in addr:
            raise CLIError(f"bootstrap address {addr!r} must end with /p2p/<peer id> (as the other peer printed it)")
    if args.bootstrap_timeout < 0:
        raise CLIError(f"--bootstrap-timeout must be >= 0 seconds, got {args.bootstrap_timeout:g}")
    listen = args.listen or [f"/ip4/{config.p2p.listen_host}/tcp/{config.p2p.listen_port}"]
    return _Plan(config, partition, rpc_url, witness_url, ledger_address, listen, bootstrap, fault)


def _setup_logging(verbose: bool) -> None:
    """After the peer's imports (opacus and py-libp2p configure logging when imported); py-libp2p's
    multi-line errors become one line unless -v."""
    import node.peer.runner  # noqa: F401 (imported for its logging setup, before ours)

    common.setup_logging(verbose)
    if not verbose:
        from node.cli.node_output import Libp2pOneLine

        for handler in logging.getLogger().handlers:
            handler.addFilter(Libp2pOneLine())


def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, plan: _Plan) -> int:
    """The peer until its last round (or Ctrl-C), its output, page and event log around it."""
    from node.cli.node_output import NodeReporter
    from node.peer.runner import NodeOptions

    config = plan.config
    say = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    options = NodeOptions(
        rpc_url=plan.rpc_url,
        witness_rpc_url=plan.witness_url,
        ledger=plan.ledger,
        workdir=args.workdir,
        bootstrap=plan.bootstrap,
        listen=plan.listen,
        partition=plan.partition,
        fault=plan.fault,
        p2p_password=_p2p_password(),
        account=_account(args),
        bootstrap_timeout=args.bootstrap_timeout,
    )
    ledger = _check_ledger(plan.rpc_url, plan.ledger, config)
    if plan.partition is None and config.swarm.peers > 1 and not config.data.data_dir:
        _warn(
            f"warning: no --partition: this peer trains on the whole {config.data.dataset} dataset, as does every "
            f"peer started without one; give each of the {config.swarm.peers} peers its own shard with --partition "
            f"i/{config.swarm.peers} (i = 0..{config.swarm.peers - 1})"
        )
    args.workdir.mkdir(parents=True, exist_ok=True)
    reporter = NodeReporter(
        args.workdir,
        rounds=config.swarm.rounds,
        say=say,
        warn=_warn,
        commitments=lambda r: [(c.peer, int(c.num_samples)) for c in ledger.commitments(r)],
        partitioned=plan.partition is not None or bool(config.data.data_dir),
        bootstrap=plan.bootstrap,
        bootstrap_timeout=args.bootstrap_timeout,
    )
    served = dashboard.start(args, args.workdir)
    source = (plan.rpc_url, plan.ledger)
    events = dashboard.log_events(args, args.workdir, lambda: source) if args.chain_events else None
    try:
        status = _run_peer(config, options, reporter)
    finally:
        if events:
            events.stop()  # after a last read: the run's final events are in the file
    say(reporter.summary())
    try:
        dashboard.finish(served, args)
    finally:
        if served:
            served.stop()
    return status


def _run_peer(config: Config, options: NodeOptions, reporter: NodeReporter) -> int:
    """trio.run of the peer; its expected failures (unwrapped from trio's groups) as one line."""
    import trio

    from node.chain.errors import LedgerError
    from node.chain.keys import AccountLoadError
    from node.cli import CLIError
    from node.peer.runner import run_node
    from p2p.errors import P2PError

    reporter.start()
    try:
        status = trio.run(run_node, config, options)
    except BaseException as exc:
        if common.interrupted(exc):
            raise KeyboardInterrupt from None
        expected = (LedgerError, AccountLoadError, P2PError, RuntimeError, TimeoutError, ValueError, OSError)
        known = common.expected_failure(exc, expected + (trio.TooSlowError,))
        if known is None:
            raise
        raise CLIError(common.one_line(known, HINTS)) from None  # with -v, main prints `exc`'s traceback first
    finally:
        reporter.stop()
    return int(status)


def _p2p_password() -> bytes:
    """SWARM_P2P_PASSWORD, or a prompt on a terminal; a one-line error naming the variable otherwise."""
    from node.cli import CLIError
    from node.peer.runner import p2p_password

    try:
        return p2p_password()
    except (RuntimeError, EOFError) as exc:
        raise CLIError(f"{exc} (created on first use; see swarm node --help)") from None


def _account(args: argparse.Namespace) -> LocalAccount:
    """SWARM_PRIVATE_KEY, else the keystore (created on first use: its address is printed)."""
    from node.chain import keys
    from node.cli import CLIError

    path = args.keystore or args.workdir / KEYSTORE_NAME

    def created(account: LocalAccount, where: Path) -> None:
        print(
            f"created keystore {where} for address {account.address}: fund this address on the swarm's chain "
            "before the peer can register and commit",
            file=sys.stderr,
            flush=True,
        )

    try:
        return keys.load_account(path, create=True, on_create=created)
    except keys.AccountLoadError as exc:
        raise CLIError(str(exc)) from None


def _check_ledger(rpc_url: str, address: str, config: Config) -> LedgerClient | PipelinedClient:
    """A read-only client of the ledger (of the contract deployed there), after checking what would
    otherwise fail late."""
    from node.chain.client import connect
    from node.chain.errors import LedgerError
    from node.chain.evm import UnsupportedEVM
    from node.cli import CLIError
    from node.derive import genesis
    from node.protocol.blob import sha256

    try:
        w3 = connect(rpc_url)
    except UnsupportedEVM as exc:  # reachable, but cannot run the contract: its own message says how to fix it
        raise CLIError(str(exc)) from None
    except (ValueError, LedgerError) as exc:
        raise CLIError(
            f"cannot reach the chain at {rpc_url} ({common.short_reason(exc)}): start it or fix --rpc-url"
        ) from None
    try:
        ledger = common.open_deployed_ledger(w3, address)
        params = ledger.params()
        current = ledger.current_round()
    except (ValueError, LedgerError) as exc:
        raise CLIError(f"{exc}: check --ledger (the address swarm deploy printed) and --rpc-url") from None
    ours = sha256(genesis(config))
    if ours != bytes(params.genesis_digest):
        raise CLIError(
            f"this node's settings give genesis digest {ours.hex()[:16]}..., the ledger's is "
            f"{bytes(params.genesis_digest).hex()[:16]}...: start it with the --config (and --set values) "
            "the ledger was deployed with"
        )
    if current > config.swarm.rounds:
        raise CLIError(
            f"the swarm on {ledger.address} has finished: its {config.swarm.rounds} rounds have ended (the ledger is "
            f"at round {current}); nothing to join: deploy a new ledger for a new swarm"
        )
    return ledger
