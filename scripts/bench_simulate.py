"""Benchmark `swarm simulate`: peer-rounds per second and peak memory for 10, 100 and 500 peers
on the default CNN (pnpm-fmnist on Fashion-MNIST, PNPM at eps 1), and the ratio of simulated time
per peer-round to the same local training alone (target: overhead under 20%, ratio < 1.2).

Each peer holds 100 training images (1 local epoch, batch 32), so every peer-round does the same
work whatever the swarm size. Each size runs in a fresh process (its peak RSS is that size's
alone), on one torch thread. The baseline, measured in the same process right after, is
`node.train.train_local` on the same shards from the same genesis model, nothing else: the ratio
then charges the simulator for the model loads, perturbation, aggregation and the per-round test
evaluation (1,000 images).

    python scripts/bench_simulate.py [--sizes 10,100,500] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
SAMPLES_PER_PEER = 100
BASELINE_PEERS = 50  # the baseline times this many peers' training (per-peer cost is uniform)


def child(peers: int, rounds: int) -> dict:
    import tempfile

    import torch

    from node.blob import unflatten
    from node.config import load_config
    from node.local import round_seed
    from node.simulate import Simulation, peer_name
    from node.train import round_lr, train_local

    torch.set_num_threads(1)
    config = load_config(None, ["data.dataset=fashion-mnist", f"data.limit={SAMPLES_PER_PEER * peers}",
                                "data.test_limit=1000", f"swarm.peers={peers}", f"swarm.rounds={rounds}",
                                "train.epochs=1", "train.batch_size=32", "train.lr=0.05", "privacy.mechanism=pnpm",
                                "privacy.epsilon=1.0", "swarm.seed=0"])
    _warm_up()
    with tempfile.TemporaryDirectory() as tmp:
        sim = Simulation(config, out=Path(tmp) / "run", threads=1)
        result = sim.run()
    s = result.summary
    per_peer_round = s["seconds"]["total"] / s["peer_rounds"]

    # Baseline: the same local training alone, same shards, same seeds, from the genesis model.
    s_ = sim.settings
    timed = min(peers, BASELINE_PEERS)
    started = time.perf_counter()
    for i in range(timed):
        sim.model.load_state_dict(unflatten(sim.genesis_vector, sim.spec))
        train_local(sim.model, sim.peers[i].x, sim.peers[i].y, epochs=s_.epochs, batch_size=s_.batch_size,
                    lr=round_lr(s_.lr, s_.lr_decay, 0), momentum=s_.momentum,
                    seed=round_seed(config.swarm.seed, peer_name(i), 1), dp=s_.dp)
    baseline = (time.perf_counter() - started) / timed
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"peers": peers, "rounds": rounds, "peer_rounds": s["peer_rounds"], "seconds": s["seconds"]["total"],
            "train_seconds": s["seconds"]["train"], "evaluate_seconds": s["seconds"]["evaluate"],
            "aggregate_seconds": s["seconds"]["aggregate"], "per_peer_round": per_peer_round,
            "baseline_per_peer": baseline, "ratio": per_peer_round / baseline, "peak_mib": peak_mib,
            "ratio_without_eval": (s["seconds"]["total"] - s["seconds"]["evaluate"]) / s["peer_rounds"] / baseline,
            "num_params": s["num_params"]}


def _warm_up() -> None:
    """torch's first forward/backward in a process pays one-time setup (allocator, kernel choice):
    pay it before timing anything, so neither side of the ratio carries it."""
    import torch

    from node.models import init_model
    from node.train import train_local

    model = init_model("pnpm-fmnist", input_shape=(1, 28, 28), num_classes=10, seed=0)
    x = torch.rand(64, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    train_local(model, x, torch.arange(64) % 10, epochs=2, batch_size=32, lr=0.01, seed=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10,100,500")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.rounds)))
        return
    from benchdoc import machine_line, table, write_section

    rows = []
    for peers in [int(x) for x in args.sizes.split(",")]:
        out = subprocess.run([sys.executable, __file__, "--child", str(peers), "--rounds", str(args.rounds)],
                             check=True, capture_output=True, text=True, cwd=ROOT)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(r, flush=True)
        rows.append(r)
    md = [f"Machine: {machine_line()}. `python scripts/bench_simulate.py --rounds {args.rounds}`: default CNN "
          f"(pnpm-fmnist, {rows[0]['num_params']:,} parameters) on Fashion-MNIST, {SAMPLES_PER_PEER} images per "
          "peer, 1 local epoch (batch 32), PNPM eps 1, FedAvg, every peer in every round, 1 torch thread, "
          "test evaluation (1,000 images) after every round.", "",
          table(["peers", "peer-rounds", "peer-rounds/s", "peak RSS (MiB)", "s per peer-round",
                 "local training alone (s)", "ratio (target < 1.2)", "ratio without evaluation"],
                [[r["peers"], r["peer_rounds"], f"{r['peer_rounds'] / r['seconds']:.1f}", f"{r['peak_mib']:.0f}",
                  f"{r['per_peer_round']:.4f}", f"{r['baseline_per_peer']:.4f}", f"{r['ratio']:.3f}",
                  f"{r['ratio_without_eval']:.3f}"] for r in rows]),
          "", "The ratio is simulated time per peer-round over the same `train_local` call alone, measured in the "
          "same process; what it charges beyond training is model loading, PNPM perturbation, exact fixed-point "
          "aggregation and the per-round evaluation, which is spread over fewer peer-rounds for small swarms (the last column leaves it out). Timings are "
          "wall-clock on a machine shared with other jobs: read the ratios, not the seconds."]
    write_section("simulate", "\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
