"""Run harness.train.train on several local gloo ranks and bring the results back."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank_main(rank: int, world: int, cfg, plan: list, out: str, device: str) -> None:
    from harness.train import train

    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank)
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{out}/store", rank=rank, world_size=world)
    try:
        dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
        result = train(cfg, rank=rank, device=dev, recorder=None, plan=plan, keep_weights=True)
        torch.save(result.__dict__, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_ranks(cfg, plan, tmp_path: Path, device: str = "cpu") -> list[dict]:
    """One TrainResult dict per rank, in rank order (gloo on CPU, NCCL with one GPU a rank on CUDA)."""
    world = cfg.run.world_size
    # The frozen config and plan dataclasses pickle as they are.
    mp.spawn(_rank_main, args=(world, cfg, list(plan), str(tmp_path), device), nprocs=world, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]  # our own files
