"""From config to what a peer commits: every registered mechanism works from plain settings,
its committed parameters rebuild it, and the recorded spend is the whole-update figure."""

from __future__ import annotations

import json

import pytest

import mechanisms
from mechanisms.accounting import cumulative_spend
from node.config import load_config, quorum
from node.derive import (
    eps_cap_micro,
    genesis,
    max_samples,
    mechanism_params,
    num_params,
    partition_sizes,
    shared_settings,
)
from node.protocol import wire


@pytest.mark.parametrize("name", sorted(mechanisms.MECHANISMS))
def test_every_mechanism_works_from_plain_config(name):
    config = load_config(None, [f"privacy.mechanism={name}", "privacy.perturb=update"])
    params = mechanism_params(config)
    committed = json.loads(wire.canonical(params))  # what goes on chain, read back by verify
    assert mechanisms.from_params(committed).params() == params
    spend = cumulative_spend(committed, 1000, 3)
    per_round = cumulative_spend(committed, 1000, 1)
    assert spend.epsilon >= per_round.epsilon > 0
    if mechanisms.get(name, **{k: v for k, v in params.items() if k != "name"}).guarantee.scope == "coordinate":
        # d x eps, never per coordinate; exact: basic composition is this one correctly rounded product
        assert per_round.epsilon == 1000 * config.privacy.epsilon


def test_gaussian_refuses_to_clip_the_weights():
    with pytest.raises(ValueError, match="perturb = update"):
        mechanism_params(load_config(None, ["privacy.mechanism=gaussian", "privacy.perturb=weights"]))


def test_swarm_is_refused_a_non_private_mechanism():
    with pytest.raises(ValueError, match="simulate"):
        mechanism_params(load_config(None, ["privacy.mechanism=none"]))


def test_auto_cap_is_exactly_the_configured_rounds_and_quorum_two_thirds():
    config = load_config(None, ["swarm.rounds=3", "privacy.epsilon=0.5"])
    d = num_params(config)
    assert eps_cap_micro(config) == wire.eps_to_micro(3 * d * 0.5)  # exact: integers times 0.5
    assert [quorum(load_config(None, [f"swarm.peers={n}"])) for n in (1, 2, 4, 8, 16)] == [1, 2, 3, 6, 11]


def test_genesis_depends_on_the_shared_settings_only():
    no_dp = ["train.dp_sgd=false", "chain.max_samples=15000"]
    base = genesis(load_config(None, no_dp))
    assert genesis(load_config(None, [*no_dp, "train.lr=0.01", "swarm.peers=9"])) == base  # local choices
    assert genesis(load_config(None, [*no_dp, "chain.max_samples=15001"])) != base  # the sample cap is the swarm's
    assert genesis(load_config(None, [*no_dp, "aggregation.rule=fedavg"])) != base  # shared: anchored on chain
    assert genesis(load_config(None, [*no_dp, "swarm.seed=1"])) != base
    # the privacy policy is the swarm's: the mechanism, its parameters, and DP-SGD's settings
    for shared in (
        [*no_dp, "privacy.epsilon=2"],
        [*no_dp, "privacy.mechanism=duchi"],
        ["train.dp_sgd=true"],
        ["train.dp_sgd=true", "train.dp_noise_multiplier=2"],
    ):
        assert genesis(load_config(None, shared)) != base, shared
    dp = genesis(load_config(None, ["train.dp_sgd=true"]))
    for shared in (["train.dp_max_grad_norm=2"], ["train.batch_size=64"], ["train.epochs=1"], ["train.dp_delta=1e-6"]):
        assert genesis(load_config(None, ["train.dp_sgd=true", *shared])) != dp, shared
    assert genesis(load_config(None, [*no_dp, "train.batch_size=64"])) == base  # without DP-SGD: a local choice


def test_the_sample_cap_is_the_largest_shard_of_the_partition_unless_set():
    """chain.max_samples = 0: the largest shard the config's own partition gives a peer, in the
    genesis; a value set in the config wins. What it derives from is shared: with 0, the partition's
    settings (here swarm.peers) change the genesis."""
    iid = load_config(None, ["data.dataset=digits", "model.name=logreg", "data.limit=1001", "swarm.peers=4"])
    assert partition_sizes(iid) == [251, 250, 250, 250] and max_samples(iid) == 251
    assert shared_settings(iid).max_samples == 251
    skewed = load_config(
        None, ["data.dataset=digits", "model.name=logreg", "data.partition=dirichlet", "data.alpha=0.1"]
    )
    sizes = partition_sizes(skewed)
    assert sum(sizes) == 1347 and max_samples(skewed) == max(sizes) > 1347 // 4  # label skew: unequal shards
    assert max_samples(load_config(None, ["data.dataset=digits", "model.name=logreg", "chain.max_samples=99"])) == 99
    more_peers = load_config(None, ["data.dataset=digits", "model.name=logreg", "data.limit=1001", "swarm.peers=5"])
    assert genesis(more_peers) != genesis(iid)
