"""From a resolved config to what a peer runs with: the shared settings (anchored in the genesis
blob, with the swarm's privacy policy and sample cap), the mechanism parameters, the data shard,
and the swarm's eps caps and per-release spend."""

from __future__ import annotations

import functools

import numpy as np
import numpy.typing as npt
import torch

import mechanisms
from mechanisms.accounting import cumulative_spend
from mechanisms.record_level import DPSGDPolicy, record_level_spend
from mechanisms.secagg import accounting as secagg_accounting
from mechanisms.secagg.policy import SecAggPolicy, secagg_spend
from node.config import SECURE_AGGREGATION, Config, fetch_timeout
from node.learning.data import DatasetError, dataset_meta, load_dataset
from node.learning.device import resolve_device
from node.learning.models import build_model, init_model, model_inputs
from node.learning.partition import partition as split
from node.protocol import policy, wire
from node.protocol.blob import flatten
from node.protocol.secure_step import GlobalStep
from node.protocol.settings import PeerSettings, PrivacyPolicy, SharedSettings


def mechanism_params(config: Config) -> dict[str, object]:
    """The parameters the peer commits on chain (canonical JSON) and rebuilds its mechanism from."""

    extra: dict[str, object] = dict(config.privacy.params or {})
    name = config.privacy.mechanism
    if name == SECURE_AGGREGATION:
        return secagg_policy(config).to_dict()
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


def secagg_policy(config: Config) -> SecAggPolicy:
    """The secure-aggregation policy of privacy.mechanism = secagg: every peer in every round, one
    full-batch DP-GD step each, records clipped to train.dp_max_grad_norm. [privacy.params] may set
    bits (32), dropout_fraction (0) and noise_multiplier; without it, the smallest one whose
    swarm.rounds rounds stay within privacy.epsilon at privacy.delta."""
    params = dict(config.privacy.params or {})
    unknown = set(params) - {"bits", "dropout_fraction", "noise_multiplier"}
    if unknown:
        raise ValueError(f"privacy.params for secagg: unknown {', '.join(sorted(unknown))}")
    if config.train.dp_sgd:
        raise ValueError("privacy.mechanism = secagg clips and noises the sum itself: set train.dp_sgd = false")
    bits = params.get("bits", 32.0)
    if bits != int(bits):
        raise ValueError(f"privacy.params.bits must be a whole number, got {bits}")

    def policy(z: float) -> SecAggPolicy:
        return SecAggPolicy(
            members=config.swarm.peers,
            max_records=config.swarm.peers * max_samples(config),
            dim=num_params(config),
            clip=config.train.dp_max_grad_norm,
            noise_multiplier=z,
            bits=int(bits),
            dropout_fraction=params.get("dropout_fraction", 0.0),
            delta=config.privacy.delta,
        )

    if "noise_multiplier" in params:
        return policy(params["noise_multiplier"])
    target, rounds = config.privacy.epsilon, config.swarm.rounds
    z = secagg_accounting.calibrate_noise_multiplier(target, rounds, config.privacy.delta)
    while (candidate := policy(z)).epsilon(rounds) > target:  # tau and the integer variance
        z *= 1.0001
    return candidate


def dp_policy(config: Config) -> DPSGDPolicy | None:
    """The DP-SGD every peer trains with, or None (plain SGD)."""
    t = config.train
    if not t.dp_sgd:
        return None
    return DPSGDPolicy(
        noise_multiplier=t.dp_noise_multiplier,
        max_grad_norm=t.dp_max_grad_norm,
        batch_size=t.batch_size,
        epochs=t.epochs,
        delta=t.dp_delta,
    )


def privacy_policy(config: Config, *, baseline: bool = False) -> PrivacyPolicy:
    """The swarm's privacy policy. `baseline` (simulations only) lets mechanism "none" through as
    an empty mechanism."""
    if baseline and config.privacy.mechanism == "none":
        return PrivacyPolicy({}, dp_policy(config))
    return PrivacyPolicy(mechanism_params(config), dp_policy(config))


def shared_settings(config: Config, *, baseline: bool = False) -> SharedSettings:
    meta = dataset_meta(config.data.dataset)
    model = config.model_name
    return SharedSettings(
        model=model,
        dataset=config.data.dataset,
        input_shape=meta.input_shape,
        num_classes=meta.num_classes,
        share=config.privacy.perturb,
        aggregation=config.aggregation_rule,
        trim_ratio=config.aggregation.trim_ratio,
        krum_f=config.aggregation.krum_f,
        seed=config.swarm.seed,
        privacy=privacy_policy(config, baseline=baseline),
        max_samples=max_samples(config),
        global_step=global_step(config),
    )


def global_step(config: Config) -> GlobalStep | None:
    """Under secure aggregation, the step every member applies to a round's sum (train.lr,
    lr_decay, momentum), anchored in the genesis so that peers and `swarm verify` agree; None
    otherwise (each peer's local training is its own)."""
    if config.privacy.mechanism != SECURE_AGGREGATION:
        return None
    t = config.train
    return GlobalStep(lr=t.lr, lr_decay=t.lr_decay, momentum=t.momentum)


def genesis(config: Config) -> bytes:
    sh = shared_settings(config)
    model = init_model(sh.model, input_shape=sh.input_shape, num_classes=sh.num_classes, seed=sh.seed)
    vector, _ = flatten(model)
    return wire.genesis_blob(vector, sh.to_dict())


def num_params(config: Config) -> int:
    meta = dataset_meta(config.data.dataset)
    model = build_model(config.model_name, input_shape=meta.input_shape, num_classes=meta.num_classes)
    return sum(p.numel() for p in model.state_dict().values())


def max_samples(config: Config) -> int:
    """The swarm's cap on a commit's sample count (in the genesis and the ledger): the weight FedAvg
    gives an update and the record count its record-level eps is computed for, so the most any
    member can claim. chain.max_samples when set; 0 there means the largest shard of the config's
    own partition (`partition_sizes`), which no honest peer of that partition passes. A swarm whose
    hosts hold data sets of their own must set chain.max_samples (as chain.record_eps_cap)."""
    if config.chain.max_samples > 0:
        return config.chain.max_samples
    try:
        return max(partition_sizes(config))
    except DatasetError as exc:
        raise DatasetError(
            f"{exc} (chain.max_samples = 0 derives the swarm's sample cap from the data: set it, e.g. "
            "--set chain.max_samples=N, where the data is not at hand)"
        ) from None


def partition_sizes(config: Config) -> list[int]:
    """The shard sizes of the config's partition of its training set: data.dataset (its first
    data.limit samples) split over swarm.peers by data.partition and swarm.seed, as each
    `--partition i/N` cuts it. Reads the labels once per process."""
    d = config.data
    labels = _train_labels(d.dataset, d.data_dir or None, d.limit or None)
    shards = split(
        labels,
        config.swarm.peers,
        scheme=d.partition,
        alpha=d.alpha,
        shards_per_peer=d.shards_per_peer,
        seed=config.swarm.seed,
    )
    return [len(shard) for shard in shards]


@functools.lru_cache(maxsize=4)
def _train_labels(dataset: str, data_dir: str | None, limit: int | None) -> npt.NDArray[np.int64]:
    labels = load_dataset(dataset, data_dir=data_dir, split="train", limit=limit).y.numpy()
    labels.flags.writeable = False  # shared by every caller of the cache
    return labels


def eps_cap_micro(config: Config) -> int:
    """The swarm's per-peer cap. 0 in the config means: exactly what `rounds` rounds of the
    configured mechanism spend, so the demo never silently stops a peer (under secure aggregation:
    the record-level eps of `rounds` rounds, which both of a commit's figures record)."""

    if config.chain.eps_cap > 0:
        return wire.eps_to_micro(config.chain.eps_cap)
    if config.privacy.mechanism == SECURE_AGGREGATION:
        return secagg_cap_micro(config)
    step = eps_step_micro(config)
    if step:  # the commits record exact multiples of the step: the cap is one of them
        return step * config.swarm.rounds
    spend = cumulative_spend(mechanism_params(config), num_params(config), config.swarm.rounds)
    return wire.eps_to_micro(spend.epsilon)


def secagg_cap_micro(config: Config) -> int:
    """What `rounds` secure-aggregation rounds spend, in micro-eps, as the commits record it
    (`policy.privacy_spend`)."""
    return wire.eps_to_micro(secagg_spend(secagg_policy(config), config.swarm.rounds).epsilon)


def eps_step_micro(config: Config) -> int:
    """What one release spends under the policy, for the contract to require of every commit
    (node.protocol.policy.eps_step_micro); 0 for the Gaussian, checked off chain instead."""
    return policy.eps_step_micro(mechanism_params(config), num_params(config))


def record_eps_cap_micro(config: Config, shard_sizes: list[int] | None = None) -> int:
    """The swarm's record-level cap (DP-SGD's, or secure aggregation's: `secagg_cap_micro`); 0
    without either. 0 in the config means: what
    `rounds` rounds spend on the smallest shard of this config's partition (the largest eps), so
    the demo never silently stops a peer. A cross-host swarm whose peers hold other data sets
    should set chain.record_eps_cap."""
    if config.privacy.mechanism == SECURE_AGGREGATION:
        if config.chain.record_eps_cap > 0:
            return wire.eps_to_micro(config.chain.record_eps_cap)
        return secagg_cap_micro(config)
    policy = dp_policy(config)
    if policy is None:
        return 0
    if config.chain.record_eps_cap > 0:
        return wire.eps_to_micro(config.chain.record_eps_cap)
    n = min(shard_sizes or partition_sizes(config))
    return wire.eps_to_micro(record_level_spend(policy, [n] * config.swarm.rounds).epsilon)


def secure_aggregation(config: Config) -> bool:
    """Whether the swarm's rounds are secure-aggregation rounds: its ledger is deployed for them."""
    return config.privacy.mechanism == SECURE_AGGREGATION


def record_delta(config: Config) -> float:
    """The delta of the ledger's record-level figures: DP-SGD's, secure aggregation's, 0 without either."""
    if config.privacy.mechanism == SECURE_AGGREGATION:
        return config.privacy.delta
    return config.train.dp_delta if config.train.dp_sgd else 0.0


def peer_settings(config: Config, *, fault: str | None = None) -> PeerSettings:
    t = config.train
    return PeerSettings(
        shared=shared_settings(config),
        epochs=t.epochs,
        batch_size=t.batch_size,
        lr=t.lr,
        lr_decay=t.lr_decay,
        momentum=t.momentum,
        rounds=config.swarm.rounds,
        fetch_timeout=fetch_timeout(config),
        linger=config.p2p.linger,
        linger_max=config.p2p.linger_max,
        device=resolve_device(t.device).type,  # per peer, not shared: "auto" becomes this machine's choice
        augmentations=t.dp_augmentations,
        fault=fault,
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
    model = config.model_name  # a model may read fixed features of the inputs (ScatterNet), computed once here
    return (model_inputs(model, train.x), train.y), (model_inputs(model, test.x), test.y)
