"""How far one member claiming the swarm's sample cap can move the finalized model, against how far
an honest member with the cap moves it: the table in docs/THREATS.md ("A member claiming the cap").

    python scripts/measure_count_attack.py [--config examples/demo.toml] [--peers 5] [--draws 8]

Round 1 of the config's swarm from its genesis, with the real round code: every peer trains on its
shard of the config's partition (`contribute`: DP-SGD, then the policy's mechanism, PNPM in the
demo) and the round's model is `aggregate.next_global` under each rule. Peer 0 is the member under
test, with the cap (`derive.max_samples`, the largest shard); the other peers are honest. For each
rule the table gives the distance (L2 over the whole vector, and the largest coordinate) between the
model with the member and the model without it:
- honest: its own update, released by the mechanism `--draws` times (fresh noise each), the largest;
- attacker: the worst of three vectors inside the blob bound (|v| < 2^20, which every PNPM release
  may reach: PNPM's outputs are any real vector): every coordinate at 2^20 - 1; every coordinate at
  2^20 - 1 against the sign of the honest mean; and, under FedAvg, the vector that makes the model
  exactly an arbitrary target (the genesis with its sign flipped), for any rule;
and the test accuracy of each model. Five peers by default so that Krum (f = 1) can aggregate the
round without the member (it needs f + 3 = 4; with fewer peers its row is left out). The "auto" row
is the config's own rule (`aggregation.rule = "auto"`: under PNPM a trimmed mean that drops
floor(ratio x n) values at each end, at least one: `aggregate.trim_count`).
Last, for that rule, what it does not stop: t and t + 1 colluding
members (t = the values it trims at each end of the round), each at 2^20 - 1 against the sign of the
honest mean, against the model of the same round with every member honest.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mechanisms  # noqa: E402
from mechanisms.randomness import seeded_generator  # noqa: E402
from node.config import load_config  # noqa: E402
from node.derive import load_shard, max_samples, peer_settings  # noqa: E402
from node.learning.contribute import contribute, round_seed  # noqa: E402
from node.learning.models import init_model  # noqa: E402
from node.learning.train import evaluate  # noqa: E402
from node.protocol import aggregate  # noqa: E402
from node.protocol.blob import flatten, unflatten  # noqa: E402
from node.protocol.settings import SharedSettings  # noqa: E402

EXTREME = 2.0**20 - 1  # the largest value an update blob may hold (wire.read_vector): exact in float32
RULES: tuple[tuple[str, dict[str, Any]], ...] = (  # rule, the SharedSettings fields it sets
    ("fedavg", {}),
    ("median", {}),
    ("trimmed-mean", {"trim_ratio": 0.1}),
    ("trimmed-mean", {"trim_ratio": 0.2}),
    ("krum", {"krum_f": 1}),
    ("auto", {}),  # the config's own rule: aggregation.rule = "auto" resolved (node.config)
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="examples/demo.toml")
    p.add_argument("--peers", type=int, default=5)
    p.add_argument("--draws", type=int, default=8, help="honest releases of the member's update")
    args = p.parse_args()
    config = load_config(args.config, [f"swarm.peers={args.peers}"])
    settings = peer_settings(config)
    shared = settings.shared
    cap = max_samples(config)
    model = init_model(shared.model, input_shape=shared.input_shape, num_classes=shared.num_classes, seed=shared.seed)
    genesis, spec = flatten(model)
    mechanism = mechanisms.from_params(settings.mechanism)
    updates, counts, releases = [], [], []
    test = None
    for i in range(args.peers):
        (x, y), test = load_shard(config, (i, args.peers))
        # the mechanism is applied below, so that the member's own update can be released many times
        c = contribute(
            model,
            spec,
            genesis,
            x,
            y,
            settings=settings,
            mechanism=None,
            round_number=1,
            seed=round_seed(shared.seed, f"peer {i}", 1),
            noise=seeded_generator(1000 + i),
        )
        updates.append(c.vector)
        counts.append(c.num_samples)
        releases.append(mechanism.perturb(c.vector, generator=seeded_generator(2000 + i)).to(torch.float32))
    assert test is not None and max(counts) <= cap
    others, weights = releases[1:], counts[1:]
    honest = [
        mechanism.perturb(updates[0], generator=seeded_generator(3000 + k)).to(torch.float32) for k in range(args.draws)
    ]
    mean = torch.stack(others).mean(dim=0)
    target = -genesis  # an arbitrary model the attacker wants: the genesis with its sign flipped
    total = cap + sum(weights)
    takeover = ((target - genesis) * total - sum(w * v for w, v in zip(weights, others))) / cap
    attacks = {
        "all at 2^20 - 1": torch.full_like(genesis, EXTREME),
        "against the honest mean": -torch.sign(mean) * EXTREME,
        "FedAvg takeover": takeover.clamp(-EXTREME, EXTREME),
    }

    def accuracy(vector: torch.Tensor) -> float:
        model.load_state_dict(unflatten(vector, spec))
        return evaluate(model, *test)[0]

    print(f"config {args.config}, {args.peers} peers of {counts} records, cap {cap}, {shared.privacy.mechanism}")
    print(
        "| rule | honest member: L2 / largest coordinate | attacker: L2 / largest coordinate (worst vector) "
        "| attacker / honest (L2) | accuracy without / honest / attacked |"
    )
    print("|---|---|---|---|---|")
    for rule, knobs in RULES:
        if rule == "krum" and args.peers - 1 < knobs["krum_f"] + 3:
            continue  # it cannot aggregate the round without the member
        rule_shared = shared if rule == "auto" else dataclasses.replace(shared, aggregation=rule, **knobs)
        without = aggregate.next_global(rule_shared, genesis, others, weights)

        def moved(
            vector: torch.Tensor, rule_shared: SharedSettings = rule_shared, without: torch.Tensor = without
        ) -> tuple[float, float, torch.Tensor]:
            model_with = aggregate.next_global(rule_shared, genesis, [vector, *others], [cap, *weights])
            delta = (model_with - without).double()
            return float(delta.norm()), float(delta.abs().max()), model_with

        honest_moves = [moved(v) for v in honest]
        h_l2, h_max, h_model = max(honest_moves, key=lambda m: m[0])
        name, (a_l2, a_max, a_model) = max(((n, moved(v)) for n, v in attacks.items()), key=lambda m: m[1][0])
        label = rule + (f" {knobs['trim_ratio']}" if "trim_ratio" in knobs else "")
        if rule == "auto":
            label = f"auto: {shared.aggregation} {shared.trim_ratio:g}"
            if shared.aggregation == "trimmed-mean":
                label += f" ({aggregate.trim_count(shared.trim_ratio, args.peers)} of {args.peers} trimmed at each end)"
        print(
            f"| {label} | {h_l2:.3g} / {h_max:.3g} | {a_l2:.3g} / {a_max:.3g} ({name}) | {a_l2 / h_l2:.3g} "
            f"| {accuracy(without):.3f} / {accuracy(h_model):.3f} / {accuracy(a_model):.3f} |"
        )
    fedavg = dataclasses.replace(shared, aggregation="fedavg")
    taken = aggregate.next_global(fedavg, genesis, [attacks["FedAvg takeover"], *others], [cap, *weights])
    off = float((taken - target).abs().max())
    print(f"FedAvg takeover: the model is the attacker's target to {off:.2g} per coordinate")
    if shared.aggregation == "trimmed-mean":
        trimmed = aggregate.trim_count(shared.trim_ratio, args.peers)
        honest_model = aggregate.next_global(shared, genesis, releases, counts)
        for colluders in (trimmed, trimmed + 1):
            bent = [attacks["against the honest mean"]] * colluders + releases[colluders:]
            bent_model = aggregate.next_global(shared, genesis, bent, counts)
            delta = (bent_model - honest_model).double()
            print(
                f"auto, {colluders} colluding member(s) at 2^20 - 1 against the honest mean: the model moves "
                f"{float(delta.norm()):.3g} (L2) / {float(delta.abs().max()):.3g} (largest coordinate) from the "
                f"all-honest one, accuracy {accuracy(honest_model):.3f} -> {accuracy(bent_model):.3f}"
            )


if __name__ == "__main__":
    main()
