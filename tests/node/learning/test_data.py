"""Dataset readers on tiny files written here, plus the bundled and Debian-provided sets."""

import gzip
import math
import struct

import numpy as np
import pytest
import torch

from node.learning.data import (
    CIFAR_RECORD,
    DATASET_META,
    DATASETS,
    IDX_IMAGES_MAGIC,
    IDX_LABELS_MAGIC,
    DatasetError,
    dataset_meta,
    load_dataset,
    read_cifar_batch,
    read_idx,
)

U32 = torch.finfo(torch.float32).eps / 2  # unit roundoff: one rounding moves x by at most U32 * |x|
U64 = torch.finfo(torch.float64).eps / 2


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape) + array.tobytes()


def write_idx_set(folder, n_train=12, n_test=5, gz=True, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        for stem, array, magic in (
            (f"{prefix}-images-idx3-ubyte", images, IDX_IMAGES_MAGIC),
            (f"{prefix}-labels-idx1-ubyte", labels, IDX_LABELS_MAGIC),
        ):
            data = idx_bytes(array, magic)
            if gz:
                (folder / f"{stem}.gz").write_bytes(gzip.compress(data))
            else:
                (folder / stem).write_bytes(data)
        arrays[prefix] = (images, labels)
    return arrays


@pytest.mark.parametrize("gz", [True, False])
def test_idx_set_round_trip(tmp_path, gz):
    arrays = write_idx_set(tmp_path, gz=gz)
    train = load_dataset("mnist", data_dir=tmp_path)
    test = load_dataset("mnist", data_dir=tmp_path, split="test")
    assert train.x.shape == (12, 1, 28, 28) and train.x.dtype == torch.float32
    assert test.y.dtype == torch.int64 and len(test) == 5 and train.num_classes == 10
    images, labels = arrays["train"]
    # exact: both sides divide the same float32 values by 255, a correctly rounded IEEE operation
    assert torch.equal(train.x[:, 0], torch.from_numpy(images.astype(np.float32) / 255))
    assert torch.equal(train.y, torch.from_numpy(labels.astype(np.int64)))
    assert len(load_dataset("mnist", data_dir=tmp_path, limit=4)) == 4


def test_torchvision_layout(tmp_path):
    write_idx_set(tmp_path / "FashionMNIST" / "raw")
    assert len(load_dataset("fashion-mnist", data_dir=tmp_path)) == 12


def test_idx_wrong_magic(tmp_path):
    path = tmp_path / "labels"
    path.write_bytes(idx_bytes(np.zeros(3, np.uint8), IDX_IMAGES_MAGIC))
    with pytest.raises(DatasetError, match=r"labels: bad magic number 0x00000803, expected 0x00000801"):
        read_idx(path, IDX_LABELS_MAGIC)


def test_idx_truncated_and_trailing(tmp_path):
    data = idx_bytes(np.zeros((4, 28, 28), np.uint8), IDX_IMAGES_MAGIC)
    (tmp_path / "short").write_bytes(data[:-10])
    with pytest.raises(DatasetError, match="short: truncated"):
        read_idx(tmp_path / "short", IDX_IMAGES_MAGIC)
    (tmp_path / "head").write_bytes(data[:6])
    with pytest.raises(DatasetError, match="head: truncated header"):
        read_idx(tmp_path / "head", IDX_IMAGES_MAGIC)
    (tmp_path / "long").write_bytes(data + b"\0")
    with pytest.raises(DatasetError, match="long: .*trailing bytes"):
        read_idx(tmp_path / "long", IDX_IMAGES_MAGIC)


def test_idx_truncated_gzip(tmp_path):
    write_idx_set(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(DatasetError, match="train-images-idx3-ubyte.gz"):
        load_dataset("mnist", data_dir=tmp_path)


def test_idx_count_mismatch_and_missing(tmp_path):
    write_idx_set(tmp_path, gz=False)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(11, np.uint8), IDX_LABELS_MAGIC))
    with pytest.raises(DatasetError, match="12 images but .* 11 labels"):
        load_dataset("mnist", data_dir=tmp_path)
    with pytest.raises(DatasetError, match="not found"):
        load_dataset("mnist", data_dir=tmp_path / "nowhere")


def write_cifar(folder, per_batch=3, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        records = rng.integers(0, 256, size=(per_batch, CIFAR_RECORD), dtype=np.uint8)
        records[:, 0] %= 10
        (folder / name).write_bytes(records.tobytes())


def test_cifar_binary(tmp_path):
    write_cifar(tmp_path / "cifar-10-batches-bin")
    train = load_dataset("cifar10", data_dir=tmp_path)
    assert train.x.shape == (15, 3, 32, 32) and len(load_dataset("cifar10", data_dir=tmp_path, split="test")) == 3
    raw = np.frombuffer((tmp_path / "cifar-10-batches-bin" / "data_batch_1.bin").read_bytes(), np.uint8)
    # a float32 quotient (one rounding) against the float64 one: U32 + 2 U64 relative
    rel = U32 + 2 * U64
    assert int(train.y[0]) == raw[0] and float(train.x[0, 0, 0, 0]) == pytest.approx(raw[1] / 255, rel=rel, abs=0)
    assert float(train.x[0, 1, 0, 0]) == pytest.approx(raw[1 + 1024] / 255, rel=rel, abs=0)  # green follows red
    assert len(load_dataset("cifar10", data_dir=tmp_path, limit=4)) == 4


def test_cifar_errors(tmp_path):
    write_cifar(tmp_path)
    path = tmp_path / "data_batch_2.bin"
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(DatasetError, match="data_batch_2.bin: size 9218 is not a positive multiple"):
        load_dataset("cifar10", data_dir=tmp_path)
    record = bytearray(CIFAR_RECORD)
    record[0] = 10
    path.write_bytes(bytes(record))
    with pytest.raises(DatasetError, match="record 0 has label 10"):
        read_cifar_batch(path)
    (tmp_path / "test_batch.bin").unlink()
    with pytest.raises(DatasetError, match="BINARY version"):
        load_dataset("cifar10", data_dir=tmp_path, split="test")


def test_sklearn_sets_are_split_and_standardized():
    train = load_dataset("digits")
    test = load_dataset("digits", split="test")
    assert train.x.shape[1:] == (1, 8, 8) and len(train) + len(test) == 1797 and train.num_classes == 10
    assert float(train.x.min()) >= 0 and float(train.x.max()) <= 1
    assert torch.equal(load_dataset("digits").y, train.y)  # the split is fixed
    bc = load_dataset("breast-cancer")
    assert bc.x.shape[1:] == (30,) and bc.num_classes == 2
    # Standardized in float64, then each value rounded once to float32 (relative U32). Moments
    # taken here in float64 (n = 426 terms, error <= n U64 of their size), so the mean is 0 within
    # U32 mean|x| and the standard deviation 1 within U32 (seen: 0.08 and 0.22 of those).
    x = bc.x.double()
    n = x.shape[0]
    float64_error = 4 * n * U64 * x.abs().max(0).values
    assert bool((x.mean(0).abs() <= U32 * x.abs().mean(0) + float64_error).all())
    assert bool(((x.std(0, unbiased=False) - 1).abs() <= U32 + float64_error).all())
    # The test split uses the training split's statistics, not its own: its feature means are
    # sampling noise of size ~1/sqrt(n_test) (seen: up to 0.21), far from float rounding.
    test_x = load_dataset("breast-cancer", split="test").x.double()
    assert float(test_x.mean(0).abs().max()) > 0.1 / math.sqrt(test_x.shape[0])


def test_fashion_mnist_slice_from_debian():
    ds = load_dataset("fashion-mnist", split="test", limit=200)
    assert ds.x.shape == (200, 1, 28, 28) and set(ds.y.tolist()) <= set(range(10))


def test_unknown_name_and_bad_split():
    with pytest.raises(ValueError, match="unknown dataset 'svhn'"):
        load_dataset("svhn")
    with pytest.raises(ValueError, match="split must be"):
        load_dataset("digits", split="valid")


def test_static_metadata_matches_every_reader(tmp_path):
    """DATASET_META lets deploy and the genesis skip reading data: it must say what the readers load."""
    write_idx_set(tmp_path / "idx")
    write_cifar(tmp_path / "cifar")
    folders = {"mnist": tmp_path / "idx", "fashion-mnist": tmp_path / "idx", "cifar10": tmp_path / "cifar"}
    assert set(DATASET_META) == set(DATASETS)
    for name in DATASETS:
        for split in ("train", "test"):
            ds = load_dataset(name, data_dir=folders.get(name), split=split)
            assert (tuple(ds.input_shape), ds.num_classes) == (
                DATASET_META[name].input_shape,
                DATASET_META[name].num_classes,
            ), (name, split)
    assert dataset_meta("digits") is DATASET_META["digits"]
    with pytest.raises(ValueError, match="unknown dataset 'svhn'"):
        dataset_meta("svhn")
