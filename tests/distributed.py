"""Run a function (harness.train.train, or any other) on several local ranks and bring the results back."""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank_main(rank: int, world: int, fn: Callable[..., Any], args: tuple, out: str, device: str) -> None:
    # A rank that dies on a signal (SIGABRT from C++ teardown, SIGSEGV) prints every thread's Python
    # stack to its stderr, which pytest shows: mp.spawn alone reports only the signal's name.
    faulthandler.enable(all_threads=True)
    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank)
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{out}/store", rank=rank, world_size=world)
    try:
        dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
        torch.save(fn(rank, world, dev, *args), os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def spawn_ranks(fn: Callable[..., Any], world: int, tmp_path: Path, *args: Any, device: str = "cpu") -> list[Any]:
    """fn(rank, world, device, *args) on `world` processes in one process group (gloo on CPU,
    NCCL with one GPU a rank on CUDA); their return values in rank order. fn must be a
    module-level function (it is pickled)."""
    mp.spawn(_rank_main, args=(world, fn, args, str(tmp_path), device), nprocs=world, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]  # our own files


def _train(rank: int, world: int, device: torch.device, cfg, plan: list) -> dict:
    from harness.train import train

    return train(cfg, rank=rank, device=device, recorder=None, plan=plan, keep_weights=True).__dict__


def run_ranks(cfg, plan, tmp_path: Path, device: str = "cpu") -> list[dict]:
    """One TrainResult dict per rank, in rank order (the frozen config and plan pickle as they are)."""
    return spawn_ranks(_train, cfg.run.world_size, tmp_path, cfg, list(plan), device=device)
