"""The one place that decides the device and the collective backend."""

from __future__ import annotations

import torch


def uses_cuda(requested: str) -> bool:
    """Whether ranks run on CUDA: 'auto' takes it when present; 'cuda' without it is an error, not a fallback."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but this machine has no usable CUDA device; use --device cpu or auto")
    return requested == "cuda" or (requested == "auto" and torch.cuda.is_available())


def resolve_device(requested: str, local_rank: int) -> tuple[torch.device, str]:
    """(device, backend) for this rank: NCCL on CUDA, gloo on CPU."""
    if uses_cuda(requested):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def describe_device(requested: str) -> str:
    """What the ranks will run on, for the manifest (the launcher's view; ranks record their own)."""
    return f"cuda ({torch.cuda.get_device_name(0)})" if uses_cuda(requested) else "cpu"
