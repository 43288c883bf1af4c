"""Datasets read from their standard on-disk formats with numpy: no torchvision, no pickle.

Images come back as float32 (N, C, H, W) scaled to [0, 1]; tabular sets as float32 (N, F)
standardized with the training split's mean and standard deviation (so the test split never
leaks into the scaling). Labels are int64. Readers check magic numbers, declared sizes and
label ranges, and raise `DatasetError` naming the file and what is wrong.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.model_selection import train_test_split

DATASETS = ("fashion-mnist", "mnist", "cifar10", "digits", "breast-cancer")


@dataclass(frozen=True)
class DatasetMeta:
    """What a swarm must agree on about a dataset without reading it: one sample's shape and the
    number of classes (the genesis model is built from these)."""

    input_shape: tuple[int, ...]
    num_classes: int


# Static, so `swarm deploy` and the genesis need no data files; a test checks every entry
# against the loaded data.
DATASET_META: dict[str, DatasetMeta] = {
    "fashion-mnist": DatasetMeta((1, 28, 28), 10),
    "mnist": DatasetMeta((1, 28, 28), 10),
    "cifar10": DatasetMeta((3, 32, 32), 10),
    "digits": DatasetMeta((1, 8, 8), 10),
    "breast-cancer": DatasetMeta((30,), 2),
}


def dataset_meta(name: str) -> DatasetMeta:
    """The static shape and class count of dataset `name` (one of `DATASETS`)."""
    try:
        return DATASET_META[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}") from None


FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
SKLEARN_SPLIT_SEED = 20240613  # fixed: every peer and verifier gets the same train/test split
SKLEARN_TEST_FRACTION = 0.25

IDX_IMAGES_MAGIC = 0x00000803  # unsigned byte, 3 dimensions
IDX_LABELS_MAGIC = 0x00000801  # unsigned byte, 1 dimension
CIFAR_RECORD = 1 + 3 * 32 * 32  # label byte + 3 channel planes of 32x32
MAX_FILE_BYTES = 1 << 30  # refuse to decompress anything larger: a guard against gzip bombs


class DatasetError(ValueError):
    """A dataset file is missing, truncated or not in the expected format."""


@dataclass(frozen=True)
class Dataset:
    name: str
    x: torch.Tensor  # float32, (N, C, H, W) or (N, F)
    y: torch.Tensor  # int64, (N,)
    num_classes: int

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def subset(self, indices: npt.ArrayLike) -> Dataset:
        index = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        return Dataset(self.name, self.x[index], self.y[index], self.num_classes)


def load_dataset(
    name: str, *, data_dir: str | Path | None = None, split: str = "train", limit: int | None = None
) -> Dataset:
    """Load `split` ("train" or "test") of dataset `name` (one of `DATASETS`).

    `limit` keeps the first `limit` samples (the IDX and CIFAR files are already shuffled, so
    this is a fair slice; CI uses it for a small Fashion-MNIST)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit!r}")
    if name == "fashion-mnist":
        ds = _load_idx_set(name, Path(data_dir) if data_dir else FASHION_MNIST_DIR, "FashionMNIST", split, limit)
    elif name == "mnist":
        if data_dir is None:
            raise DatasetError("mnist has no offline copy here: give data_dir, a folder with the four IDX files")
        ds = _load_idx_set(name, Path(data_dir), "MNIST", split, limit)
    elif name == "cifar10":
        if data_dir is None:
            raise DatasetError("cifar10 has no offline copy here: give data_dir, a folder with the binary batches")
        ds = _load_cifar10(Path(data_dir), split, limit)
    elif name in ("digits", "breast-cancer"):
        ds = _load_sklearn(name, split)
        if limit is not None:
            ds = ds.subset(np.arange(min(limit, len(ds))))
    else:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    return ds


# ---- IDX (MNIST, Fashion-MNIST) ----------------------------------------------------------

_IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _find_file(root: Path, torchvision_folder: str, stem: str) -> Path:
    """`stem` or `stem.gz` in `root`, or in torchvision's `<root>/<Folder>/raw` layout."""
    for folder in (root, root / torchvision_folder / "raw"):
        for candidate in (folder / stem, folder / f"{stem}.gz"):
            if candidate.is_file():
                return candidate
    raise DatasetError(f"{stem}[.gz] not found in {root} nor in {root / torchvision_folder / 'raw'}")


def _read_bytes(path: Path, limit_bytes: int | None = None) -> bytes:
    """The file's content, gunzipped if it ends in .gz; at most `limit_bytes` when given."""
    cap = MAX_FILE_BYTES if limit_bytes is None else limit_bytes
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read(cap)
        with open(path, "rb") as f:
            return f.read(cap)
    except (OSError, EOFError, zlib.error) as exc:  # gzip raises these on corrupt/truncated input
        raise DatasetError(f"{path}: cannot read ({exc})") from exc


def read_idx(path: str | Path, expected_magic: int, limit: int | None = None) -> npt.NDArray[np.uint8]:
    """Read an unsigned-byte IDX file (optionally gzipped) into a uint8 array of its dims.

    Checks the magic number and that the file holds exactly the bytes its header declares
    (a prefix when `limit` records are asked for)."""
    path = Path(path)
    ndim = expected_magic & 0xFF
    header_len = 4 + 4 * ndim
    head = _read_bytes(path, header_len)
    if len(head) < header_len:
        raise DatasetError(f"{path}: truncated header ({len(head)} of {header_len} bytes)")
    magic = int.from_bytes(head[:4], "big")
    if magic != expected_magic:
        raise DatasetError(f"{path}: bad magic number 0x{magic:08x}, expected 0x{expected_magic:08x}")
    dims = [int.from_bytes(head[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    count = dims[0] if limit is None else min(dims[0], limit)
    record = int(np.prod(dims[1:], dtype=np.int64)) if ndim > 1 else 1
    want = header_len + count * record
    declared = header_len + dims[0] * record
    if declared > MAX_FILE_BYTES:
        raise DatasetError(f"{path}: header declares {declared} bytes, more than the {MAX_FILE_BYTES} allowed")
    # Read one byte past the full declared size: then a longer file is detected too.
    data = _read_bytes(path, declared + 1 if limit is None else want)
    if len(data) < want:
        raise DatasetError(f"{path}: truncated: header declares {dims} ({declared} bytes), file has {len(data)}")
    if limit is None and len(data) > declared:
        raise DatasetError(
            f"{path}: {len(data) - declared}+ trailing bytes after the {dims} records the header declares"
        )
    array = np.frombuffer(data, dtype=np.uint8, offset=header_len, count=count * record)
    return array.reshape([count, *dims[1:]])


def _load_idx_set(name: str, root: Path, torchvision_folder: str, split: str, limit: int | None) -> Dataset:
    images_stem, labels_stem = _IDX_FILES[split]
    images_path = _find_file(root, torchvision_folder, images_stem)
    labels_path = _find_file(root, torchvision_folder, labels_stem)
    images = read_idx(images_path, IDX_IMAGES_MAGIC, limit)
    labels = read_idx(labels_path, IDX_LABELS_MAGIC, limit)
    if images.shape[0] != labels.shape[0]:
        raise DatasetError(f"{images_path} has {images.shape[0]} images but {labels_path} has {labels.shape[0]} labels")
    if labels.size and labels.max() >= 10:
        raise DatasetError(f"{labels_path}: label {int(labels.max())} out of range 0..9")
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    return Dataset(name, x, y, 10)


# ---- CIFAR-10, binary version --------------------------------------------------------------


def _cifar_files(root: Path, split: str) -> list[Path]:
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] if split == "train" else ["test_batch.bin"]
    for folder in (root, root / "cifar-10-batches-bin"):
        if (folder / names[0]).is_file():
            missing = [n for n in names if not (folder / n).is_file()]
            if missing:
                raise DatasetError(f"{folder}: missing CIFAR-10 batch files {missing}")
            return [folder / n for n in names]
    raise DatasetError(
        f"{names[0]} not found in {root} nor in {root / 'cifar-10-batches-bin'} "
        "(the BINARY version of CIFAR-10 is needed, not the python pickle one)"
    )


def read_cifar_batch(path: str | Path) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """One CIFAR-10 binary batch: records of 1 label byte + 3072 pixel bytes (R, G, B planes)."""
    path = Path(path)
    data = _read_bytes(path)
    if not data or len(data) % CIFAR_RECORD:
        raise DatasetError(
            f"{path}: size {len(data)} is not a positive multiple of the "
            f"{CIFAR_RECORD}-byte CIFAR-10 record (truncated, or not the binary version)"
        )
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, CIFAR_RECORD)
    labels = records[:, 0]
    if labels.max() >= 10:
        bad = int(np.argmax(labels >= 10))
        raise DatasetError(f"{path}: record {bad} has label {int(labels[bad])}, out of range 0..9")
    return records[:, 1:].reshape(-1, 3, 32, 32), labels


def _load_cifar10(root: Path, split: str, limit: int | None) -> Dataset:
    images: list[npt.NDArray[np.uint8]] = []
    labels: list[npt.NDArray[np.uint8]] = []
    have = 0
    for path in _cifar_files(root, split):
        batch_images, batch_labels = read_cifar_batch(path)
        images.append(batch_images)
        labels.append(batch_labels)
        have += len(batch_labels)
        if limit is not None and have >= limit:
            break
    x = np.concatenate(images)[:limit]
    y = np.concatenate(labels)[:limit]
    return Dataset("cifar10", torch.from_numpy(x.astype(np.float32) / 255.0), torch.from_numpy(y.astype(np.int64)), 10)


# ---- scikit-learn's bundled sets -----------------------------------------------------------


def _load_sklearn(name: str, split: str) -> Dataset:
    bunch = load_digits() if name == "digits" else load_breast_cancer()
    features = bunch.data.astype(np.float64)
    labels = bunch.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        features, labels, test_size=SKLEARN_TEST_FRACTION, random_state=SKLEARN_SPLIT_SEED, stratify=labels
    )
    x, y = (x_train, y_train) if split == "train" else (x_test, y_test)
    if name == "digits":
        # 8x8 images with pixel values 0..16, kept as images so CNNs apply.
        x = (x / 16.0).reshape(-1, 1, 8, 8)
    else:
        mean = x_train.mean(axis=0)
        std = x_train.std(axis=0)
        x = (x - mean) / np.where(std > 0, std, 1.0)
    return Dataset(name, torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y), int(labels.max()) + 1)
