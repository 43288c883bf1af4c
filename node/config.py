"""The run configuration: typed dataclasses, defaults in node/defaults.toml, a TOML file on top,
then `section.key=value` overrides parsed with the field's type.

Every key must be known and every value must have the field's type and range: a typo in a
config file is an error, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from node.protocol.secure_windows import WINDOWS, step_blocks

DEFAULTS_PATH = Path(__file__).with_name("defaults.toml")

# The names a config may use, written out here so that a config is checked before torch loads
# (`swarm` answers a bad one at once, node/cli/); tests/node/cli/test_fast_answers.py holds each
# equal to the registry that implements it (node.learning, node.protocol.aggregate, mechanisms).
DATASETS = ("fashion-mnist", "mnist", "cifar10", "digits", "breast-cancer")
IMAGE_DATASETS = ("fashion-mnist", "mnist", "cifar10", "digits")  # the inputs are (C, H, W) images
_CNNS = ("pnpm-mnist", "pnpm-fmnist", "pnpm-cifar10", "seed002-cnn", "digits-cnn")
SCATTER_MODELS = ("scatter-linear", "scatter-cnn")  # read ScatterNet features, not the pixels
MODELS = (*(cnn + v for cnn in _CNNS for v in ("", "-tanh", "-gn", "-gn-tanh")), *SCATTER_MODELS, "logreg")
DEFAULT_MODELS = {
    "mnist": "pnpm-mnist",
    "fashion-mnist": "pnpm-fmnist",
    "cifar10": "pnpm-cifar10",
    "digits": "digits-cnn",
    "breast-cancer": "logreg",
}
PARTITIONS = ("iid", "dirichlet", "shards")
RULES = ("fedavg", "median", "trimmed-mean", "krum")
# aggregation.rule = "auto": trimmed-mean under PNPM, whose releases can be any vector (a member's
# weight then bounds nothing: docs/THREATS.md, "A member claiming the cap"), fedavg under the others
UNBOUNDED_RELEASES = ("pnpm",)
# secure aggregation with distributed DP (mechanisms.secagg): a privacy policy, not a local mechanism
SECURE_AGGREGATION = "secagg"
MECHANISMS = ("duchi", "exponential", "gaussian", "hm", "laplace", "ldp-fl", "pm", "pnpm", "rr", "sampled")
DEVICES = ("auto", "cpu", "cuda")  # whether this machine has CUDA is checked where training starts
# the ledger contracts `swarm deploy` deploys (chain.ledger_kind): node.chain.kind tells them apart by their code
LEDGER_KINDS = ("swarm", "pipelined")


class ConfigError(ValueError):
    """An unknown key, a value of the wrong type, or a value out of range."""


@dataclass
class SwarmConfig:
    peers: int
    rounds: int
    seed: int


@dataclass
class DataConfig:
    dataset: str
    partition: str
    alpha: float
    shards_per_peer: int
    data_dir: str | None = None
    limit: int | None = None  # first N training samples (CI slices)
    test_limit: int | None = None  # first N test samples for evaluation


@dataclass
class ModelConfig:
    name: str


@dataclass
class TrainConfig:
    epochs: int
    batch_size: int
    lr: float
    lr_decay: float
    momentum: float
    dp_sgd: bool
    dp_noise_multiplier: float
    dp_max_grad_norm: float
    dp_delta: float
    dp_augmentations: int  # augmentation multiplicity of DP-SGD (De et al. 2022); 1 = off; images only
    device: str  # auto | cpu | cuda: where this peer trains; per peer, not in the genesis


@dataclass
class PrivacyConfig:
    mechanism: str
    epsilon: float
    perturb: str
    delta: float
    params: dict[str, float] = field(default_factory=dict)


@dataclass
class AggregationConfig:
    rule: str
    trim_ratio: float
    krum_f: int


@dataclass
class ChainConfig:
    min_peers: int
    commit_window: int
    attest_window: int
    commit_window_seconds: int  # 0 = commit_window x block_time (window_seconds)
    attest_window_seconds: int  # 0 = attest_window x block_time
    eps_cap: float
    record_eps_cap: float
    fetch_timeout: float
    block_time: float
    run_timeout: float
    confirmations: int  # blocks on top of the head a peer's chain reads and receipts wait for (docs/TESTNET.md)
    ws_url: str  # auto | off | a ws(s):// URL: where a peer subscribes to new heads and the ledger's logs
    ledger_kind: str  # the contract `swarm deploy` and `swarm up` deploy: swarm | pipelined (a peer reads the code)
    max_samples: int = 0  # cap on a commit's numSamples (the FedAvg weight); 0 = the largest shard (node.derive)
    rpc_url: str | None = None
    ledger: str | None = None


@dataclass
class P2PConfig:
    listen_host: str
    listen_port: int
    bootstrap: list[str]
    linger: float
    linger_max: float


@dataclass
class OutputConfig:
    plot: bool
    dir: str | None = None


@dataclass
class Config:
    swarm: SwarmConfig
    data: DataConfig
    model: ModelConfig
    train: TrainConfig
    privacy: PrivacyConfig
    aggregation: AggregationConfig
    chain: ChainConfig
    p2p: P2PConfig
    output: OutputConfig

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        """TOML text that `load_config` reads back to an equal Config (None values are left out)."""

        def drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
            return {k: drop_none(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}

        return tomli_w.dumps(drop_none(self.to_dict()))

    @property
    def model_name(self) -> str:
        """The model to build: `model.name`, or the dataset's default when it is "auto"."""
        return self.model.name if self.model.name != "auto" else DEFAULT_MODELS[self.data.dataset]

    @property
    def aggregation_rule(self) -> str:
        """The rule to aggregate with: `aggregation.rule`, or when it is "auto" trimmed-mean under a
        mechanism whose releases can be any vector (PNPM) and fedavg under the others."""
        if self.aggregation.rule != "auto":
            return self.aggregation.rule
        return "trimmed-mean" if self.privacy.mechanism in UNBOUNDED_RELEASES else "fedavg"


def _section_types() -> dict[str, type]:
    return typing.get_type_hints(Config)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults, then the TOML file at `path` (if any), then each "section.key=value" override."""
    with open(DEFAULTS_PATH, "rb") as f:
        merged = tomllib.load(f)
    if path is not None:
        try:
            with open(path, "rb") as f:
                user = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        _merge(merged, user, source=str(path))
    config = _build(merged)
    for override in overrides:
        _apply_override(config, override)
    _check_ranges(config)
    return config


def _merge(base: dict[str, Any], user: Mapping[str, Any], *, source: str) -> None:
    sections = _section_types()
    for section, values in user.items():
        if section not in sections:
            raise ConfigError(f"{source}: unknown section [{section}]; known: {', '.join(sections)}")
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: [{section}] must be a table")
        known = {f.name for f in dataclasses.fields(sections[section])}
        for key, value in values.items():
            if key not in known:
                raise ConfigError(f"{source}: unknown key {section}.{key}; known: {', '.join(sorted(known))}")
            base.setdefault(section, {})[key] = value


def _build(merged: Mapping[str, Any]) -> Config:
    sections: dict[str, Any] = {}
    for section, cls in _section_types().items():
        values = merged.get(section, {})
        hints = typing.get_type_hints(cls)
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in values:
                kwargs[f.name] = _coerce(values[f.name], hints[f.name], f"{section}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{section}.{f.name} has no value (node/defaults.toml must set it)")
        sections[section] = cls(**kwargs)
    return Config(**sections)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Check a TOML value against a field type (ints are accepted for floats)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _coerce(value, inner, where)
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, item = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a table, got {value!r}")
        return {str(k): _coerce(v, item, f"{where}.{k}") for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{where} must be a finite number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported field type {hint!r}")


def _parse_text(text: str, hint: Any, where: str) -> Any:
    """An override's text as a value of the field's type: TOML syntax, or a bare string."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType) and text.strip().lower() in ("none", "null", ""):
        return None
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text  # a bare word such as dirichlet or /data/mnist
    if origin is list and isinstance(value, str):
        value = [part for part in value.split(",") if part]
    if hint is str or (origin in (typing.Union, types.UnionType) and str in typing.get_args(hint)):
        value = text  # strings are taken verbatim: "1" stays "1"
    return _coerce(value, hint, where)


def _apply_override(config: Config, override: str) -> None:
    key, sep, text = override.partition("=")
    if not sep:
        raise ConfigError(f"override {override!r} must look like section.key=value")
    parts = key.strip().split(".")
    sections = _section_types()
    if len(parts) < 2 or parts[0] not in sections:
        raise ConfigError(f"override {override!r}: unknown section {parts[0]!r}; known: {', '.join(sections)}")
    section = getattr(config, parts[0])
    hints = typing.get_type_hints(type(section))
    name = parts[1]
    if name not in hints:
        raise ConfigError(f"override {override!r}: unknown key {parts[0]}.{name}; known: {', '.join(sorted(hints))}")
    hint = hints[name]
    if typing.get_origin(hint) is dict:
        if len(parts) != 3:
            raise ConfigError(f"override {override!r}: set one entry as {parts[0]}.{name}.NAME=value")
        (_, item) = typing.get_args(hint)
        getattr(section, name)[parts[2]] = _parse_text(text.strip(), item, key)
        return
    if len(parts) != 2:
        raise ConfigError(f"override {override!r}: {parts[0]}.{name} has no sub-keys")
    setattr(section, name, _parse_text(text.strip(), hint, key))


# the longest a peer serves on after its last round (p2p.linger, p2p.linger_max): an hour
MAX_LINGER_S = 3600.0


def _check_ranges(c: Config) -> None:
    checks = [
        (c.swarm.peers >= 1, "swarm.peers", "must be >= 1"),
        (c.swarm.rounds >= 1, "swarm.rounds", "must be >= 1"),
        (c.swarm.seed >= 0, "swarm.seed", "must be >= 0"),
        (c.data.dataset in DATASETS, "data.dataset", f"must be one of {', '.join(DATASETS)}"),
        (c.data.partition in PARTITIONS, "data.partition", f"must be one of {', '.join(PARTITIONS)}"),
        (c.data.alpha > 0, "data.alpha", "must be > 0"),
        (c.data.shards_per_peer >= 1, "data.shards_per_peer", "must be >= 1"),
        (c.data.limit is None or c.data.limit >= 1, "data.limit", "must be >= 1"),
        (c.data.test_limit is None or c.data.test_limit >= 1, "data.test_limit", "must be >= 1"),
        (c.model.name == "auto" or c.model.name in MODELS, "model.name", f"must be auto or one of {', '.join(MODELS)}"),
        (c.train.epochs >= 1, "train.epochs", "must be >= 1"),
        (c.train.batch_size >= 1, "train.batch_size", "must be >= 1"),
        (c.train.lr > 0, "train.lr", "must be > 0"),
        (0 < c.train.lr_decay <= 1, "train.lr_decay", "must be in (0, 1]"),
        (0 <= c.train.momentum < 1, "train.momentum", "must be in [0, 1)"),
        (c.train.dp_noise_multiplier > 0, "train.dp_noise_multiplier", "must be > 0"),
        (c.train.dp_max_grad_norm > 0, "train.dp_max_grad_norm", "must be > 0"),
        (0 < c.train.dp_delta < 1, "train.dp_delta", "must be in (0, 1)"),
        (1 <= c.train.dp_augmentations <= 64, "train.dp_augmentations", "must be in [1, 64]"),
        (
            c.train.dp_augmentations == 1 or _reads_pixels(c),
            "train.dp_augmentations",
            "needs DP-SGD on an image dataset with a model that reads pixels (not ScatterNet features)",
        ),
        (c.privacy.epsilon > 0, "privacy.epsilon", "must be > 0"),
        (c.privacy.perturb in ("weights", "update"), "privacy.perturb", "must be weights or update"),
        (0 < c.privacy.delta < 1, "privacy.delta", "must be in (0, 1)"),
        (c.aggregation.rule in ("auto", *RULES), "aggregation.rule", f"must be auto or one of {', '.join(RULES)}"),
        (0 <= c.aggregation.trim_ratio < 0.5, "aggregation.trim_ratio", "must be in [0, 0.5)"),
        (c.aggregation.krum_f >= 0, "aggregation.krum_f", "must be >= 0"),
        (c.chain.min_peers >= 0, "chain.min_peers", "must be >= 0 (0 = two thirds of swarm.peers)"),
        (c.chain.commit_window >= 1, "chain.commit_window", "must be >= 1 block"),
        (c.chain.attest_window >= 1, "chain.attest_window", "must be >= 1 block"),
        (0 <= c.chain.commit_window_seconds < 2**32, "chain.commit_window_seconds", "must be in 0..2^32 - 1"),
        (0 <= c.chain.attest_window_seconds < 2**32, "chain.attest_window_seconds", "must be in 0..2^32 - 1"),
        (c.chain.eps_cap >= 0, "chain.eps_cap", "must be >= 0 (0 = exactly what swarm.rounds rounds spend)"),
        (c.chain.record_eps_cap >= 0, "chain.record_eps_cap", "must be >= 0 (0 = what swarm.rounds rounds spend)"),
        (0 <= c.chain.max_samples < 2**32, "chain.max_samples", "must be in 0..2^32 - 1 (0 = the largest shard)"),
        (c.chain.fetch_timeout >= 0, "chain.fetch_timeout", "must be >= 0 (0 = the default for the swarm)"),
        (c.chain.block_time > 0, "chain.block_time", "must be > 0"),
        (c.chain.run_timeout > 0, "chain.run_timeout", "must be > 0"),
        (0 <= c.chain.confirmations <= 64, "chain.confirmations", "must be in 0..64 blocks"),
        (
            c.chain.ws_url in ("auto", "off") or c.chain.ws_url.startswith(("ws://", "wss://")),
            "chain.ws_url",
            "must be auto, off or a ws:// or wss:// URL",
        ),
        (c.chain.min_peers <= c.swarm.peers, "chain.min_peers", f"must be <= swarm.peers ({c.swarm.peers})"),
        (c.chain.ledger_kind in LEDGER_KINDS, "chain.ledger_kind", f"must be one of {', '.join(LEDGER_KINDS)}"),
        (
            c.chain.ledger_kind == "swarm" or c.privacy.mechanism != SECURE_AGGREGATION,
            "chain.ledger_kind",
            f"must be swarm with privacy.mechanism = {SECURE_AGGREGATION} (a pipelined ledger has no secure steps)",
        ),
        (
            c.privacy.mechanism in ("none", SECURE_AGGREGATION, *MECHANISMS),
            "privacy.mechanism",
            f"must be none, {SECURE_AGGREGATION} or one of {', '.join(MECHANISMS)}",
        ),
        (0 <= c.p2p.listen_port <= 65535, "p2p.listen_port", "must be in 0..65535"),
        (0 <= c.p2p.linger <= MAX_LINGER_S, "p2p.linger", f"must be in 0..{MAX_LINGER_S:g} s"),
        (
            c.p2p.linger <= c.p2p.linger_max <= MAX_LINGER_S,
            "p2p.linger_max",
            f"must be in p2p.linger ({c.p2p.linger:g})..{MAX_LINGER_S:g} s",
        ),
        (c.train.device in DEVICES, "train.device", f"must be one of {', '.join(DEVICES)}"),
    ]
    for ok, name, rule in checks:
        if not ok:
            raise ConfigError(f"{name} {rule}, got {_get(c, name)!r}")
    if c.privacy.mechanism == SECURE_AGGREGATION:
        _check_secure_windows(c)


# blocks a secure-aggregation step's window must last beyond chain.confirmations: a member learns
# that the step before has passed only `confirmations` blocks late, then acts (docs/SECAGG.md)
SECURE_WINDOW_MARGIN = 2


def _check_secure_windows(c: Config) -> None:
    """Each step's window of a secure round (`node.protocol.secure_windows`: eighths of the commit
    window for KEYS, DEALING, their acknowledgments and the complaints, of the attestation window
    for the MASKED acknowledgments and REVEAL, as the ledger divides them) longer than
    chain.confirmations + SECURE_WINDOW_MARGIN blocks, or no member could act in it in time."""
    chain, least = c.chain, c.chain.confirmations + SECURE_WINDOW_MARGIN
    for step, window in WINDOWS.items():
        blocks = step_blocks(step, chain.commit_window, chain.attest_window)
        if blocks <= least:
            name = "attest_window" if window.closed else "commit_window"
            enough = next(b for b in itertools.count(1) if step_blocks(step, b, b) > least)
            raise ConfigError(
                f"chain.{name} of {getattr(chain, name)} blocks gives the secure-aggregation {step.name} window "
                f"{blocks} blocks: each must be more than chain.confirmations ({chain.confirmations}) "
                f"+ {SECURE_WINDOW_MARGIN} blocks (chain.{name} >= {enough})"
            )


def _reads_pixels(c: Config) -> bool:
    """Whether the model trains on the dataset's images themselves (what augmentation crops)."""
    if not c.train.dp_sgd or c.data.dataset not in DATASETS or c.model.name not in (*MODELS, "auto"):
        return False
    return c.data.dataset in IMAGE_DATASETS and c.model_name not in SCATTER_MODELS


# seconds a peer fetches a round's blobs before leaving the missing ones out, where chain.fetch_timeout is 0 and
# no local swarm sized it (node/runs/local.py `local_fetch_timeout`): ample for peers on machines of their own
DEFAULT_FETCH_TIMEOUT = 10.0


def fetch_timeout(c: Config) -> float:
    """chain.fetch_timeout, where 0 means DEFAULT_FETCH_TIMEOUT (`swarm up` writes the figure it sized for
    its peers into their config.toml instead)."""
    return c.chain.fetch_timeout or DEFAULT_FETCH_TIMEOUT


def quorum(c: Config) -> int:
    """chain.min_peers, where 0 means two thirds of the peers (3 of 4: one may crash)."""
    return c.chain.min_peers or max(1, (2 * c.swarm.peers + 2) // 3)


def window_seconds(c: Config) -> tuple[int, int]:
    """The (commit, attest) windows' lengths in seconds, which the ledger requires to pass as well as
    their blocks: chain.commit_window_seconds and chain.attest_window_seconds, where 0 means the
    block window at chain.block_time seconds a block, rounded up: the time the window lasts on the
    chain `swarm up` starts, which stuffing it with blocks cannot shorten."""
    chain = c.chain
    commit = chain.commit_window_seconds or max(1, math.ceil(chain.commit_window * chain.block_time))
    attest = chain.attest_window_seconds or max(1, math.ceil(chain.attest_window * chain.block_time))
    return commit, attest


def _get(c: Config, dotted: str) -> Any:
    section, key = dotted.split(".")
    return getattr(getattr(c, section), key)
