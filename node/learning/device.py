"""Which device local training runs on: `train.device = "auto" | "cpu" | "cuda"`.

A per-peer choice (peers of one swarm may differ in hardware), so it is not part of the swarm's
shared settings or its genesis digest. Only training and evaluation run on the device: every
vector that goes into a blob is on the CPU before it is perturbed and encoded, and aggregation
works on decoded blobs in fixed point, so a GPU peer and a CPU peer aggregate the same bits.
"""

from __future__ import annotations

import torch

DEVICES = ("auto", "cpu", "cuda")


def cuda_available() -> bool:
    return bool(torch.cuda.is_available())


def device_error(name: str) -> str | None:
    """Why `name` cannot be used on this machine, or None if it can."""
    if name not in DEVICES:
        return f"must be one of {', '.join(DEVICES)}"
    if name == "cuda" and not cuda_available():
        return (
            f"needs CUDA, but this torch ({torch.__version__}) sees no CUDA device: use auto or cpu, or "
            "install a CUDA build of torch (SWARM_TORCH_INDEX, docs/NODE.md);"
        )
    return None


def resolve_device(name: str) -> torch.device:
    """The torch device for a `train.device` value: auto is CUDA when available, else the CPU.
    ValueError for an unknown value or cuda on a machine without CUDA."""
    error = device_error(name)
    if error is not None:
        raise ValueError(f"train.device {error}, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if cuda_available() else "cpu")
    return torch.device(name)
