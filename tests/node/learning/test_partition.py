import numpy as np
import pytest

from node.learning.partition import parse_partition_spec, partition

LABELS = np.repeat(np.arange(10), 100)  # 1,000 samples, 100 per class


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
def test_disjoint_cover_seeded(scheme):
    parts = partition(LABELS, 7, scheme=scheme, seed=3)
    assert len(parts) == 7 and all(len(p) > 0 for p in parts)
    joined = np.concatenate(parts)
    assert np.array_equal(np.sort(joined), np.arange(len(LABELS)))  # disjoint and covering
    again = partition(LABELS, 7, scheme=scheme, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = partition(LABELS, 7, scheme=scheme, seed=4)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other))


def test_iid_sizes_balanced():
    sizes = [len(p) for p in partition(LABELS, 7, seed=0)]
    assert max(sizes) - min(sizes) <= 1


def classes_per_peer(parts, threshold=0.05):
    """Classes making up more than `threshold` of a peer's shard."""
    return [int((np.bincount(LABELS[p], minlength=10) / len(p) > threshold).sum()) for p in parts]


def test_dirichlet_skew_follows_alpha():
    # alpha 0.1 concentrates each peer on few classes; alpha 100 is nearly IID (all 10 classes).
    skewed = classes_per_peer(partition(LABELS, 10, scheme="dirichlet", alpha=0.1, seed=1))
    flat = classes_per_peer(partition(LABELS, 10, scheme="dirichlet", alpha=100.0, seed=1))
    assert np.mean(skewed) < 5 and min(flat) == 10


def test_shards_give_few_classes():
    parts = partition(LABELS, 10, scheme="shards", shards_per_peer=2, seed=0)
    assert all(len(np.unique(LABELS[p])) <= 2 for p in parts)


def test_errors():
    with pytest.raises(ValueError, match="num_peers=2000 is more than the 1000 samples"):
        partition(LABELS, 2000, seed=0)
    with pytest.raises(ValueError, match="unknown partition scheme 'zipf'"):
        partition(LABELS, 2, scheme="zipf", seed=0)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        partition(LABELS, 2, scheme="dirichlet", alpha=0, seed=0)
    with pytest.raises(ValueError, match="left a peer empty"):
        partition(np.zeros(3, int), 3, scheme="dirichlet", alpha=0.001, seed=0)
    with pytest.raises(ValueError, match="shards"):
        partition(LABELS, 600, scheme="shards", shards_per_peer=2, seed=0)


def test_parse_partition_spec():
    assert parse_partition_spec("0/4") == (0, 4)
    assert parse_partition_spec("3/4") == (3, 4)
    for bad in ("4/4", "-1/4", "1", "a/b", "1/0"):
        with pytest.raises(ValueError, match="partition spec"):
            parse_partition_spec(bad)
