"""One member claiming the swarm's sample cap, for real: a real Anvil with the ledger deployed as
`swarm up` deploys it (`LocalSwarm`: the genesis and the terms from the config, four peers
registered with their libp2p keys), the honest members' releases from the real round code
(`contribute`: DP-SGD, then PNPM), the model from `aggregate.next_global`, and `swarm verify`.

The attacker (peer 0) holds the largest shard. A commit claiming one sample past the cap the
swarm derived from its data is refused by the contract and by rule 2. At the cap, with an extreme
vector (every PNPM release may be any vector, so no check can refuse it), the round finalizes and
verifies, and the model moves about as far as an honest member's release at the cap moves it: the
default rule under PNPM is a trimmed mean that drops each coordinate's lowest and highest value
(docs/THREATS.md, "A member claiming the cap").
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import mechanisms
from mechanisms.randomness import seeded_generator
from node.chain import errors
from node.chain.client import LedgerClient
from node.chain.records import Commitment, RoundState
from node.config import load_config
from node.derive import load_shard, partition_sizes, peer_settings
from node.learning.contribute import contribute
from node.learning.models import init_model
from node.protocol import aggregate, policy, wire
from node.protocol.blob import decode_blob, flatten, sha256
from node.protocol.settings import SharedSettings
from node.rules import Rulebook
from node.runs.local import LocalSwarm, _ledger_terms
from node.verify import verify

PEERS = 4
# digits (1,347 training images: shards of 337, 337, 337, 336), softmax regression, DP-SGD, PNPM on
# the update: the defaults' policy on a data set that trains in a second
CONFIG = ["data.dataset=digits", "model.name=logreg", f"swarm.peers={PEERS}", "swarm.rounds=1"]
CONFIG += ["train.batch_size=64"]
EXTREME = 2.0**20 - 1  # the largest value an update blob may hold (wire.read_vector)
HONEST_DRAWS = 8  # releases of the member's own update, each with fresh noise


def test_a_count_past_the_cap_is_refused_and_one_at_it_moves_the_model_within_the_honest_spread(tmp_path):
    config = load_config(None, CONFIG)
    cap = max(partition_sizes(config))
    assert cap == 337 and _ledger_terms(load_config(None, [*CONFIG, "chain.max_samples=100"])).max_samples == 100
    settings = peer_settings(config)
    shared = settings.shared
    # "auto" under PNPM: the lowest and the highest value of every coordinate dropped (at 4 members the
    # mean of the middle two)
    assert shared.max_samples == cap and (shared.aggregation, shared.trim_ratio) == ("trimmed-mean", 0.1)
    # Every member's update first (the real round code, seeded): the chain's windows need not wait for it.
    model = init_model(shared.model, input_shape=shared.input_shape, num_classes=shared.num_classes, seed=shared.seed)
    genesis, spec = flatten(model)
    pnpm = mechanisms.from_params(dict(shared.privacy.mechanism))
    updates, counts = [], []
    for i in range(PEERS):
        (x, y), _ = load_shard(config, (i, PEERS))
        c = contribute(
            model,
            spec,
            genesis,
            x,
            y,
            settings=settings,
            mechanism=None,
            round_number=1,
            seed=i,
            noise=seeded_generator(i),
        )
        updates.append(c.vector)
        counts.append(c.num_samples)
    assert counts[0] == cap
    releases = [pnpm.perturb(u, generator=seeded_generator(100 + i)).to(torch.float32) for i, u in enumerate(updates)]
    others, weights = releases[1:], counts[1:]
    # The attacker commits last, having fetched the others' releases: against their mean, at the bound.
    attack = -torch.sign(torch.stack(others).mean(dim=0)) * EXTREME

    with LocalSwarm(config, tmp_path / "run") as swarm:
        params = swarm.ledger.params()
        genesis_blob = swarm.archive.get(bytes(params.genesis_digest).hex())
        assert genesis_blob is not None
        _, meta = decode_blob(genesis_blob, max_size=1 << 24, expected=None)
        # the cap derived from the swarm's data, in the genesis and the deployment alike
        assert SharedSettings.from_dict(json.loads(meta["swarm"])) == shared and params.max_samples == cap

        clients = [LedgerClient(swarm.w3, swarm.ledger.address, swarm.chain.peer_account(i)) for i in range(PEERS)]
        mechanism_json = wire.canonical(dict(shared.privacy.mechanism))
        d = genesis.numel()

        def commit(i: int, vector: torch.Tensor, samples: int) -> None:
            data = wire.update_blob(vector, 1, mechanism_json, clients[i].account.address)
            spent = policy.privacy_spend(shared.privacy, d, [samples])
            digest = bytes.fromhex(swarm.archive.put(data))
            clients[i].commit(1, digest, samples, spent.eps_micro, mechanism_json.encode(), spent.record_eps_micro)

        for i in range(1, PEERS):
            commit(i, releases[i], counts[i])
        with pytest.raises(errors.NumSamplesOverCap) as refused:
            commit(0, attack, cap + 1)
        assert refused.value.fields == {"numSamples": cap + 1, "maxSamples": cap}
        rules = Rulebook(shared, d, int(params.max_samples))
        over = Commitment(clients[0].account.address, 0, b"\x01" * 32, cap + 1, 0, b"", 1, 0, 1)
        assert rules.commit_verdict(over, [cap + 1]).check == "samples"  # peers and verify refuse it too
        commit(0, attack, cap)
        clients[0].close_round(1)  # every registered member committed

        finalized = aggregate.next_global(shared, genesis, [*others, attack], [*weights, cap])  # ledger order
        digest = bytes.fromhex(swarm.archive.put(wire.model_blob(finalized, 1)))
        order = [c.peer for c in swarm.ledger.commitments(1)]
        assert order == [c.account.address for c in clients[1:]] + [clients[0].account.address]
        for client in clients:
            if swarm.ledger.round_info(1).state is RoundState.FINALIZED:
                break
            client.attest(1, digest, wire.encode_bitmap([True] * PEERS))
        assert swarm.ledger.finalized_digest(1) == sha256(wire.model_blob(finalized, 1))
        # the attack breaks no rule (PNPM can release any vector): the rule has to contain it
        report = verify(LedgerClient(swarm.w3, swarm.ledger.address), swarm.archive)
        assert report.ok, report.failures

    def moved(rule_shared: SharedSettings, vector: torch.Tensor) -> torch.Tensor:
        without = aggregate.next_global(rule_shared, genesis, others, weights)
        return (aggregate.next_global(rule_shared, genesis, [vector, *others], [cap, *weights]) - without).double()

    honest = [
        pnpm.perturb(updates[0], generator=seeded_generator(200 + k)).to(torch.float32) for k in range(HONEST_DRAWS)
    ]
    honest_l2 = max(float(moved(shared, v).norm()) for v in honest)
    attacked = moved(shared, attack)
    assert torch.equal(attacked, (finalized - aggregate.next_global(shared, genesis, others, weights)).double())
    # The mean of the middle two of four values moves, per coordinate, at most half the spread of the
    # three others, whatever the fourth is: an honest release beyond them moves it exactly as far (up to
    # the float32 roundings of the two models and the fixed point's, below 1e-5 here).
    spread = torch.stack(others).double()
    assert bool((attacked.abs() <= (spread.max(dim=0).values - spread.min(dim=0).values) / 2 + 1e-5).all())
    # Over the whole vector the attacker is beyond the others in every coordinate, an honest release
    # in some: a little farther than the farthest of 8 honest releases (the demo's figures:
    # scripts/measure_count_attack.py, docs/THREATS.md). FedAvg gives it the model.
    assert float(attacked.norm()) <= 1.5 * honest_l2
    fedavg = dataclasses.replace(shared, aggregation="fedavg")
    assert float(moved(fedavg, attack).norm()) > 1e4 * max(float(moved(fedavg, v).norm()) for v in honest)
