"""Seeded partitions of a training set among peers: IID, Dirichlet(alpha) label skew, and
pathological k-class shards (McMahan et al., AISTATS 2017, section 3).

Every scheme returns disjoint, sorted index arrays that together cover the whole set, one per
peer, all non-empty; the same (labels, num_peers, scheme, parameters, seed) always gives the
same partition, so every peer can compute its own shard from the swarm's seed alone.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

SCHEMES = ("iid", "dirichlet", "shards")
DIRICHLET_MAX_DRAWS = 100  # redraws until every peer has a sample; then a clear error


def partition(
    labels: npt.ArrayLike,
    num_peers: int,
    *,
    scheme: str = "iid",
    alpha: float = 0.5,
    shards_per_peer: int = 2,
    seed: int,
) -> list[npt.NDArray[np.int64]]:
    """Split indices 0..len(labels)-1 among `num_peers` peers."""
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {array.shape}")
    n = array.shape[0]
    if num_peers < 1:
        raise ValueError(f"num_peers must be >= 1, got {num_peers}")
    if num_peers > n:
        raise ValueError(f"num_peers={num_peers} is more than the {n} samples: some peer would get none")
    rng = np.random.default_rng(seed)
    parts: list[npt.NDArray[np.intp]]
    if scheme == "iid":
        parts = np.array_split(rng.permutation(n), num_peers)
    elif scheme == "dirichlet":
        parts = _dirichlet(array, num_peers, alpha, rng)
    elif scheme == "shards":
        parts = _shards(array, num_peers, shards_per_peer, rng)
    else:
        raise ValueError(f"unknown partition scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    return [np.sort(p).astype(np.int64) for p in parts]


def _dirichlet(
    labels: npt.NDArray[np.generic], num_peers: int, alpha: float, rng: np.random.Generator
) -> list[npt.NDArray[np.intp]]:
    """For each class, the share of each peer is drawn from Dirichlet(alpha * 1); small alpha
    gives each peer few classes (Hsu, Qi and Brown, 2019)."""
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0 for the dirichlet scheme, got {alpha!r}")
    classes = np.unique(labels)
    for _ in range(DIRICHLET_MAX_DRAWS):
        parts: list[list[npt.NDArray[np.intp]]] = [[] for _ in range(num_peers)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(labels == c))
            shares = rng.dirichlet(np.full(num_peers, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(members)).astype(np.int64)
            for peer, chunk in enumerate(np.split(members, cuts)):
                parts[peer].append(chunk)
        merged = [np.concatenate(p) for p in parts]
        if min(len(p) for p in merged) > 0:
            return merged
    raise ValueError(
        f"dirichlet partition with alpha={alpha} left a peer empty in {DIRICHLET_MAX_DRAWS} draws "
        f"({len(labels)} samples, {num_peers} peers): raise alpha or use fewer peers"
    )


def _shards(
    labels: npt.NDArray[np.generic], num_peers: int, shards_per_peer: int, rng: np.random.Generator
) -> list[npt.NDArray[np.intp]]:
    """Sort by label, cut into num_peers * shards_per_peer equal shards, deal them at random."""
    if shards_per_peer < 1:
        raise ValueError(f"shards_per_peer must be >= 1, got {shards_per_peer}")
    num_shards = num_peers * shards_per_peer
    if num_shards > len(labels):
        raise ValueError(
            f"{num_peers} peers x {shards_per_peer} shards_per_peer = {num_shards} shards "
            f"is more than the {len(labels)} samples"
        )
    by_label = np.argsort(labels, kind="stable")
    shards = np.array_split(by_label, num_shards)
    order = rng.permutation(num_shards)
    return [
        np.concatenate([shards[s] for s in order[p * shards_per_peer : (p + 1) * shards_per_peer]])
        for p in range(num_peers)
    ]


def parse_partition_spec(spec: str) -> tuple[int, int]:
    """Parse "i/N" (peer i of N, 0-based: 0 <= i < N) as given to `--partition`."""
    try:
        index_text, count_text = spec.split("/")
        index, count = int(index_text), int(count_text)
    except ValueError:
        raise ValueError(f"partition spec must look like 'i/N' (e.g. '0/4'), got {spec!r}") from None
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"partition spec {spec!r}: need N >= 1 and 0 <= i < N (i is 0-based)")
    return index, count
