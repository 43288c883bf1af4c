"""Fixed (untrained) feature extractors some models read instead of pixels, computed once per
data set before training, never per step.

ScatterNet (Tramer & Boneh, "Differentially private learning needs better features (or much more
data)", ICLR 2021): a 2-D wavelet scattering transform (Mallat 2012; Oyallon & Mallat 2015) of
depth 2 with J = 2 scales and L = 8 angles maps a C x H x W image to 81*C x H/4 x W/4 features:
translation-invariant, stable to small deformations, and data-independent, so computing them
costs no privacy. A linear model (or a small CNN) on them learns under DP-SGD far better than a
CNN on pixels at the same eps: fewer trainable parameters, less noise per useful dimension.

The transform is kymatio's (the implementation Tramer & Boneh used). kymatio 0.3.0's top-level
`kymatio.torch` also imports its 3-D frontend, which needs `scipy.special.sph_harm` (removed in
SciPy 1.15); the 2-D frontend is imported directly and needs nothing of that.

Features of a data set are cached on disk (`cache_dir()`, keyed by the sha256 of the input bytes
and the transform's parameters) and written atomically, so peers of one machine share them and a
crash never leaves a half-written cache file behind. The cache is bounded (`cache_limit_bytes()`,
$SWARM_CACHE_MAX_MB, 4096 by default): after each write the least recently used files go first,
never the one just written (a hit refreshes a file's time).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

SCATTER_J = 2  # scales: features on a grid 2^J coarser
SCATTER_L = 8  # angles per scale
SCATTER_CHANNELS = 1 + SCATTER_J * SCATTER_L + SCATTER_L**2 * SCATTER_J * (SCATTER_J - 1) // 2  # 81 per input channel
FEATURE_BATCH = 1024
DEFAULT_CACHE_MAX_MB = 4096  # four of the full training set's 950 MB files
STALE_TMP_SECONDS = 3600.0  # a half-written cache file this old belongs to no running writer


def scatter_shape(input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """Shape of the ScatterNet features of one C x H x W image."""
    if len(input_shape) != 3:
        raise ValueError(f"ScatterNet needs images (C, H, W), got input shape {tuple(input_shape)}")
    c, h, w = input_shape
    step = 2**SCATTER_J
    if h % step or w % step:
        raise ValueError(f"ScatterNet with J={SCATTER_J} needs H and W divisible by {step}, got {h}x{w}")
    return c * SCATTER_CHANNELS, h // step, w // step


def cache_dir() -> Path:
    """$SWARM_CACHE, else $XDG_CACHE_HOME/swarm-ledger, else ~/.cache/swarm-ledger."""
    if os.environ.get("SWARM_CACHE"):
        return Path(os.environ["SWARM_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "swarm-ledger"


def cache_limit_bytes() -> int:
    """$SWARM_CACHE_MAX_MB (megabytes, >= 0) as bytes, else DEFAULT_CACHE_MAX_MB's."""
    raw = os.environ.get("SWARM_CACHE_MAX_MB", "").strip()
    try:
        megabytes = float(raw) if raw else DEFAULT_CACHE_MAX_MB
    except ValueError:
        raise ValueError(f"SWARM_CACHE_MAX_MB must be a number of megabytes, got {raw!r}") from None
    if not (megabytes >= 0 and math.isfinite(megabytes)):  # also refuses nan and inf
        raise ValueError(f"SWARM_CACHE_MAX_MB must be a finite number >= 0, got {raw!r}")
    return int(megabytes * 1024 * 1024)


def scatter_features(
    x: torch.Tensor, *, cache: bool = True, progress: Callable[[int, int], None] | None = None
) -> torch.Tensor:
    """ScatterNet features (N, 81*C, H/4, W/4), float32, of images `x` (N, C, H, W)."""
    if x.dim() != 4:
        raise ValueError(f"ScatterNet needs a batch of images (N, C, H, W), got shape {tuple(x.shape)}")
    out_shape = scatter_shape(tuple(x.shape[1:]))
    x = x.to(torch.float32).contiguous()
    path = None
    if cache:
        limit = cache_limit_bytes()  # a bad setting fails now, not after a minute of computing
        digest = hashlib.sha256(f"scatter:J={SCATTER_J}:L={SCATTER_L}:{tuple(x.shape)}:".encode())
        digest.update(x.numpy().tobytes())
        path = cache_dir() / "features" / f"scatter-{digest.hexdigest()[:32]}.safetensors"
        if path.exists():
            try:
                cached = load_file(path)["features"]
                if tuple(cached.shape) == (x.shape[0], *out_shape):
                    _touch(path)
                    return cached
            except Exception:  # a damaged cache file is recomputed and replaced
                pass
    features = _compute(x, out_shape, progress)
    if path is not None:
        _save_atomic(path, features)
        evict_least_recent(path.parent, limit=limit, keep=path)
    return features


def evict_least_recent(directory: Path, *, limit: int, keep: Path) -> None:
    """Remove the least recently used cache files of `directory` (by modification time, which a
    hit refreshes) until the rest fit in `limit` bytes; `keep` stays whatever its size. Files that
    vanish meanwhile (another peer evicting) are skipped."""
    stale_before = time.time() - STALE_TMP_SECONDS
    for tmp in directory.glob(".tmp-*.safetensors"):  # a writer killed mid-write (SIGKILL) left it
        with contextlib.suppress(OSError):
            if tmp.stat().st_mtime < stale_before:
                tmp.unlink()
    entries = []
    for f in directory.glob("scatter-*.safetensors"):
        try:
            st = f.stat()
        except OSError:
            continue
        entries.append((st.st_mtime_ns, st.st_size, f))
    total = sum(size for _, size, _ in entries)
    for _, size, f in sorted(entries):
        if total <= limit:
            break
        if f == keep:
            continue
        try:
            f.unlink()
        except OSError:
            continue
        total -= size


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):  # a read-only cache still serves
        os.utime(path)


def _compute(
    x: torch.Tensor, out_shape: tuple[int, int, int], progress: Callable[[int, int], None] | None
) -> torch.Tensor:
    from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D  # type: ignore[import-untyped]

    n, c, h, w = x.shape
    transform = ScatteringTorch2D(J=SCATTER_J, shape=(h, w), L=SCATTER_L)
    features = torch.empty((n, *out_shape), dtype=torch.float32)
    with torch.no_grad():
        for start in range(0, n, FEATURE_BATCH):
            batch = transform(x[start : start + FEATURE_BATCH])  # (b, C, 81, H/4, W/4)
            features[start : start + batch.shape[0]] = batch.reshape(batch.shape[0], *out_shape)
            if progress is not None:
                progress(min(n, start + FEATURE_BATCH), n)
    return features


def _save_atomic(path: Path, features: torch.Tensor) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".safetensors")
        os.close(fd)
        try:
            save_file({"features": features.contiguous()}, tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:
        pass  # a read-only or full cache costs time, never the run
