"""The one place that decides the device and the collective backend."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from model.sharding import TablePlan


def uses_cuda(requested: str) -> bool:
    """Whether ranks run on CUDA: 'auto' takes it when present; 'cuda' without it is an error, not a fallback."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but this machine has no usable CUDA device; use --device cpu or auto")
    return requested == "cuda" or (requested == "auto" and torch.cuda.is_available())


def gpu_name() -> str | None:
    """What CUDA calls this host's first GPU; None without one (a seam: tests stand in a name)."""
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def cuda_device_count() -> int:
    """GPUs this process sees (a seam: tests stand in a count)."""
    return torch.cuda.device_count()


def check_gpus_per_host(*, ranks_per_host: int, device_count: int) -> None:
    """One-line refusal, before launch, of more ranks on this host than it has GPUs."""
    if ranks_per_host > device_count:
        # Each rank takes GPU LOCAL_RANK: past the last one set_device fails ("invalid device
        # ordinal"), and two ranks on one GPU make NCCL fail ("Duplicate GPU detected").
        raise ValueError(f"{ranks_per_host} ranks on this host need a GPU each and it has {device_count}: "
                         "lower GPUS_PER_NODE (and NODES), or use --device cpu")


def check_shard_dims(plan: Sequence[TablePlan]) -> None:
    """One-line refusal of a plan fbgemm's CUDA embeddings would reject on the ranks."""
    odd = sorted({s.cols for tp in plan for s in tp.shards if s.cols % 4})
    if odd:
        # fbgemm's CUDA table-batched embeddings assert that every table's dim is a multiple of 4.
        raise ValueError(f"fbgemm's CUDA embeddings need shard dims that are multiples of 4; this plan has {odd}: "
                         "change --embedding-dim or --column-shards")


def resolve_device(requested: str, local_rank: int) -> tuple[torch.device, str]:
    """(device, backend) for this rank: NCCL on CUDA, gloo on CPU."""
    if uses_cuda(requested):
        if local_rank >= cuda_device_count():  # a launch that bypassed the CLI's check_gpus_per_host
            raise RuntimeError(f"LOCAL_RANK {local_rank} has no GPU: this host has {cuda_device_count()}")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def describe_device(requested: str) -> str:
    """What the ranks will run on, for the manifest (the launcher's view; ranks record their own)."""
    return f"cuda ({torch.cuda.get_device_name(0)})" if uses_cuda(requested) else "cpu"


def process_group_options(device: torch.device) -> dict[str, object]:
    """init_process_group's device binding: on CUDA the rank's GPU (`device_id`), so NCCL makes its
    communicators there and then, at start, not lazily inside iteration 0's first timed collective
    (and new groups split from the bound one); on CPU nothing (gloo has no device to bind)."""
    return {"device_id": device} if device.type == "cuda" else {}


def set_tf32(on: bool) -> None:
    """precision.tf32 (resolved: only ever on for a CUDA run): fp32 matmuls on TF32 tensor cores,
    process-wide, or not: set either way, so that a run in a process an earlier one set (the
    in-process launch, a test) has its own. Called before the rank's GEMM probe, so the probe
    measures what the dense step runs, and at the start of training."""
    torch.backends.cuda.matmul.allow_tf32 = on
