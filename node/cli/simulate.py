"""`swarm simulate`: many peers in one process, same round and aggregation code as `swarm up`."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.cli import common

if TYPE_CHECKING:  # annotations only: the CLI imports its heavy modules lazily
    from collections.abc import Callable

SHORTCUTS = {
    "peers": "swarm.peers",
    "rounds": "swarm.rounds",
    "seed": "swarm.seed",
    "dataset": "data.dataset",
    "partition": "data.partition",
    "epochs": "train.epochs",
    "batch_size": "train.batch_size",
    "lr": "train.lr",
    "lr_decay": "train.lr_decay",
    "mechanism": "privacy.mechanism",
    "epsilon": "privacy.epsilon",
    "share": "privacy.perturb",
    "aggregation": "aggregation.rule",
    "limit": "data.limit",
    "test_limit": "data.test_limit",
}

SEEDED_NOTICE = (
    "noise seeded: a simulation, not a private run (anyone with the seed can subtract the noise; "
    "--secret-noise draws it as a peer does)"
)

# --quick: a run that finishes in seconds on one core (8x8 digits, 8 peers, 4 rounds). Explicit
# flags and --set win over it.
QUICK = [
    "data.dataset=digits",
    "model.name=auto",  # digits' small CNN
    "train.dp_sgd=false",
    "swarm.peers=8",
    "swarm.rounds=4",
    "train.epochs=2",
    "train.batch_size=16",
    "train.lr=0.1",
    "privacy.mechanism=none",
]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate a swarm of many peers in one process (papers, privacy sweeps)",
        description="Simulate a swarm of hundreds of peers in one process with the same round, privacy and "
        "aggregation code as `swarm up`, without the network (and without the chain unless --ledger). "
        "Writes metrics.jsonl, summary.json and progress.png (accuracy and each privacy figure per round). "
        "Its noise is seeded by default, so a run reproduces: a simulation, not a private run "
        "(--secret-noise draws it as a peer does). docs/SIMULATE.md.",
    )
    p.add_argument("--peers", type=int, help="number of simulated peers, each with its own shard (default 4)")
    p.add_argument("--fraction", type=float, default=1.0, help="fraction of the peers sampled each round (default 1)")
    p.add_argument("--rounds", type=int, help="rounds (default 5)")
    p.add_argument("--epochs", type=int, help="local epochs per round")
    p.add_argument("--batch-size", type=int, help="local mini-batch size")
    p.add_argument("--lr", type=float, help="local learning rate")
    p.add_argument("--lr-decay", type=float, help="learning rate of round r = lr * lr_decay**r")
    p.add_argument("--partition", help="iid, dirichlet or shards")
    p.add_argument("--dataset", help="digits, breast-cancer, fashion-mnist, mnist, cifar10")
    p.add_argument("--limit", type=int, help="use the first N training samples only")
    p.add_argument("--test-limit", type=int, help="evaluate on the first N test samples only")
    p.add_argument(
        "--mechanism",
        help="pnpm, duchi, pm, hm, ldp-fl, laplace, gaussian, sampled, secagg (secure aggregation, docs/SECAGG.md), "
        "or none (non-private baseline, simulate only)",
    )
    p.add_argument("--epsilon", type=float, help="the mechanism's epsilon (per coordinate for local mechanisms)")
    p.add_argument("--share", choices=("weights", "update"), help="share weights (PNPM paper) or w - w_global")
    p.add_argument("--aggregation", help="fedavg, median, trimmed-mean or krum")
    p.add_argument("--seed", type=int, help="the one seed every random draw derives from")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1; same value = same bits)")
    p.add_argument(
        "--ledger",
        action="store_true",
        help="record the run on a local Anvil ledger (one account per peer): `swarm verify --run OUT`",
    )
    p.add_argument(
        "--secret-noise",
        action="store_true",
        help="draw the privacy noise from the OS CSPRNG as a real peer does (default: seeded, so a run is "
        "reproducible, and anyone with the seed can subtract the noise: a simulation, not a private run)",
    )
    p.add_argument("--quick", action="store_true", help="a seconds-long run: digits, 8 peers, 4 rounds, no DP")
    p.add_argument("--out", type=Path, help="run folder (default runs/sim-<timestamp>)")
    common.add_verbose(p)
    common.add_config_options(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from node.cli import CLIError

    if args.quick:
        args.overrides = QUICK + list(args.overrides)
    config = common.load(args, SHORTCUTS)
    if args.ledger:
        common.require_swarm_ledger(config, "swarm simulate --ledger")
    common.check_data_dir(config)
    if not 0 < args.fraction <= 1:
        raise CLIError(f"--fraction must be in (0, 1], got {args.fraction:g}")
    if args.threads < 1:
        raise CLIError(f"--threads must be >= 1, got {args.threads}")
    out = args.out or Path("runs") / dt.datetime.now().strftime("sim-%Y%m%d-%H%M%S")
    if out.exists() and any(out.iterdir()):
        raise CLIError(f"--out {out} exists and is not empty: choose a new folder")
    common.setup_logging(args.verbose)
    from node.chain.anvil import AnvilError
    from node.runs.simulate import Simulation, SimulationError

    common.check_device(config)
    common.check_data(config)
    rounds, peers = config.swarm.rounds, config.swarm.peers
    if not args.secret_noise and not args.json:
        print(SEEDED_NOTICE, file=sys.stderr, flush=True)
    try:
        with _progress(args.json, rounds) as on_progress:
            sim = Simulation(
                config,
                fraction=args.fraction,
                out=out,
                ledger=args.ledger,
                threads=args.threads,
                on_progress=on_progress,
                secret_noise=args.secret_noise,
            )
            result = sim.run()
    except (SimulationError, FileExistsError, AnvilError) as exc:
        raise CLIError(str(exc)) from exc
    except ValueError as exc:  # bad combination caught by the data, partition or mechanism code
        raise CLIError(f"{exc} (peers={peers})") from exc
    summary = result.summary
    if args.json:
        common.emit_json({"summary": summary, "rounds": result.records, "out": str(out)})
    else:
        _print(result.records, summary, out)
    return 0


class _progress:
    """A rich progress bar over peer-rounds on stderr (silent with --json)."""

    def __init__(self, quiet: bool, rounds: int) -> None:
        self.quiet, self.rounds = quiet, rounds

    def __enter__(self) -> Callable[[dict], None]:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True, quiet=self.quiet),
            transient=False,
        )
        self.bar.__enter__()
        self.task = self.bar.add_task(f"round 1/{self.rounds}", total=None)
        self.last: tuple[int, float] | None = None  # (round, accuracy) of the last round that ended

        def on_progress(event: dict) -> None:
            r = event["round"]
            if event.get("finished"):  # the round's own accuracy, at once
                self.last = (r, event["accuracy"])
                self.bar.update(self.task, description=f"round {r}/{self.rounds}  accuracy {event['accuracy']:.3f}")
                return
            done = "" if self.last is None else f"  (round {self.last[0]}: accuracy {self.last[1]:.3f})"
            self.bar.update(
                self.task, description=f"round {r}/{self.rounds}{done}", completed=event["done"], total=event["of"]
            )

        return on_progress

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)


def _print(records: list[dict], summary: dict, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from node.runs.simulate import summary_line

    console = Console()
    t = Table(
        title=f"simulated swarm: {summary['peers']} peers x {summary['fraction']:g} sampled, "
        f"{summary['dataset']}, {summary['mechanism'].get('name')}"
    )
    for col in ("round", "participants", "accuracy", "test loss", "train loss", "max eps per peer (whole update)"):
        t.add_column(col)
    for r in records:
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        t.add_row(
            str(r["round"]),
            str(r["participants"]),
            fmt(r["accuracy"], ".4f"),
            fmt(r["loss"], ".4f"),
            fmt(r["train_loss"], ".4f"),
            fmt(r["eps_max"], ".6g") + ("" if r["eps_max"] is None else f" ({r['protects']})"),
        )
    console.print(t)
    console.print(summary_line(summary))
    if summary["diverged"]:
        console.print(f"[red]{summary['diverged']}[/red]")
    s = summary["seconds"]
    console.print(
        f"{summary['peer_rounds']} peer-rounds in {s['total']:.1f} s "
        f"({summary['peer_rounds'] / max(s['total'], 1e-9):.1f} peer-rounds/s; training {s['train']:.1f} s)"
    )
    console.print(f"metrics: {out / 'metrics.jsonl'}; plot: {out / 'progress.png'}")
    console.print(f"noise: {summary['noise']}")
    if summary.get("ledger"):
        console.print(f"ledger {summary['ledger']['ledger']}: verify with  swarm verify --run {out}")
