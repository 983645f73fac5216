"""The one place that decides the device and the collective backend."""

from __future__ import annotations

import torch


def resolve_device(requested: str, local_rank: int) -> tuple[torch.device, str]:
    """(device, backend) for this rank: NCCL on CUDA, gloo on CPU. 'cuda' without CUDA is an error, not a fallback."""
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ValueError("run.device is 'cuda' but this machine has no usable CUDA device; use --device cpu")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def check_device_available(requested: str) -> None:
    """Before launch: fail fast (one line) when the requested device is not here."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but this machine has no usable CUDA device; use --device cpu or auto")


def describe_device(requested: str) -> str:
    """What the ranks will run on, for the manifest (the launcher's view; ranks record their own)."""
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        return f"cuda ({torch.cuda.get_device_name(0)})"
    return "cpu"
