"""From a resolved config to what a peer runs with: the shared settings (anchored in the genesis
blob), the mechanism parameters, the data shard, and the swarm's eps cap."""

from __future__ import annotations

import torch

import mechanisms
from mechanisms.accounting import cumulative_spend
from node.config import Config
from node.learning.data import dataset_meta, load_dataset
from node.learning.models import build_model, init_model
from node.learning.partition import partition as split
from node.protocol import wire
from node.protocol.blob import flatten
from node.protocol.settings import DPSGDConfig, PeerSettings, SharedSettings


def mechanism_params(config: Config) -> dict[str, object]:
    """The parameters the peer commits on chain (canonical JSON) and rebuilds its mechanism from."""

    extra: dict[str, object] = dict(config.privacy.params or {})
    name = config.privacy.mechanism
    if name == "none":
        raise ValueError(
            "privacy.mechanism = none is for `swarm simulate` baselines only: a swarm peer "
            "always perturbs what it shares"
        )
    if name in ("duchi", "pm", "hm", "laplace", "sampled") and "clip" not in extra:
        extra["clip"] = True  # model weights are not confined to [-1, 1]: clamp, inside the mechanism
    if name == "sampled":
        extra.setdefault("base", "pm")
    if name == "gaussian":
        if config.privacy.perturb != "update":
            raise ValueError(
                "privacy.mechanism = gaussian clips the whole shared vector to clip_norm: use it with "
                "privacy.perturb = update (the weights themselves would be shrunk)"
            )
        extra.setdefault("clip_norm", 1.0)
        extra.setdefault("delta", config.privacy.delta)
    mechanism = mechanisms.get(name, epsilon=config.privacy.epsilon, **extra)
    return mechanism.params()


def shared_settings(config: Config) -> SharedSettings:
    meta = dataset_meta(config.data.dataset)
    model = config.model_name
    return SharedSettings(
        model=model,
        dataset=config.data.dataset,
        input_shape=meta.input_shape,
        num_classes=meta.num_classes,
        share=config.privacy.perturb,
        aggregation=config.aggregation.rule,
        trim_ratio=config.aggregation.trim_ratio,
        krum_f=config.aggregation.krum_f,
        seed=config.swarm.seed,
    )


def genesis(config: Config) -> bytes:
    sh = shared_settings(config)
    model = init_model(sh.model, input_shape=sh.input_shape, num_classes=sh.num_classes, seed=sh.seed)
    vector, _ = flatten(model)
    return wire.genesis_blob(vector, sh.to_dict())


def num_params(config: Config) -> int:
    sh = shared_settings(config)
    model = build_model(sh.model, input_shape=sh.input_shape, num_classes=sh.num_classes)
    return sum(p.numel() for p in model.state_dict().values())


def eps_cap_micro(config: Config) -> int:
    """The swarm's per-peer cap. 0 in the config means: exactly what `rounds` rounds of the
    configured mechanism spend, so the demo never silently stops a peer."""

    if config.chain.eps_cap > 0:
        return wire.eps_to_micro(config.chain.eps_cap)
    spend = cumulative_spend(mechanism_params(config), num_params(config), config.swarm.rounds)
    return wire.eps_to_micro(spend.epsilon)


def peer_settings(config: Config, *, fault: str | None = None) -> PeerSettings:
    t = config.train
    dp = None
    if t.dp_sgd:
        dp = DPSGDConfig(noise_multiplier=t.dp_noise_multiplier, max_grad_norm=t.dp_max_grad_norm, delta=t.dp_delta)
    return PeerSettings(
        shared=shared_settings(config),
        mechanism=mechanism_params(config),
        epochs=t.epochs,
        batch_size=t.batch_size,
        lr=t.lr,
        lr_decay=t.lr_decay,
        momentum=t.momentum,
        rounds=config.swarm.rounds,
        fetch_timeout=config.chain.fetch_timeout,
        fault=fault,
        dp=dp,
    )


def load_shard(
    config: Config, partition: tuple[int, int] | None
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """This peer's training shard and the shared test set."""

    d = config.data
    train = load_dataset(d.dataset, data_dir=d.data_dir or None, split="train", limit=d.limit or None)
    test = load_dataset(d.dataset, data_dir=d.data_dir or None, split="test", limit=d.test_limit or None)
    if partition is not None:
        i, n = partition
        shards = split(
            train.y.numpy(),
            n,
            scheme=d.partition,
            alpha=d.alpha,
            shards_per_peer=d.shards_per_peer,
            seed=config.swarm.seed,
        )
        idx = torch.as_tensor(shards[i], dtype=torch.long)
        train = train.subset(idx)
    return (train.x, train.y), (test.x, test.y)
