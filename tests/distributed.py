"""Run a function (harness.run.train.train, or any other) on several local ranks and bring the results back."""

from __future__ import annotations

import faulthandler
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from harness.launch import fork_server
from harness.run.device import process_group_options


PRELOAD = ("tests.distributed", "tests.reference")
"""What the server imports before its first fork besides the product's ranks' (fork_server.PRELOAD).
The server is the product launcher's: a test of the launcher and one of this helper share it."""


def _rank_main(rank: int, world: int, fn: Callable[..., Any], args: tuple, out: str, device: str) -> None:
    # A forked rank's environment is the test's: fork_server.ready_server replaces a server whose
    # environment is not the one this process has now.
    # A rank that dies on a signal (SIGABRT from C++ teardown, SIGSEGV) prints every thread's Python
    # stack to its stderr, which pytest shows: mp.spawn alone reports only the signal's name.
    faulthandler.enable(all_threads=True)
    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank)
    backend = "nccl" if device == "cuda" else "gloo"
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    dist.init_process_group(backend, init_method=f"file://{out}/store", rank=rank, world_size=world,
                            **process_group_options(dev))
    try:
        result = fn(rank, world, dev, *args)
        torch.save(result, os.path.join(out, f"rank{rank}.pt.part"))
        os.replace(os.path.join(out, f"rank{rank}.pt.part"), os.path.join(out, f"rank{rank}.pt"))
        dist.barrier()  # every rank's result is on disk before any rank tears its process group down
        Path(out, f"rank{rank}.done").touch()
    finally:
        dist.destroy_process_group()


def start_method(device: str) -> str:
    """The multiprocessing start method of ranks on `device` ("cpu" or "cuda"): the product
    launcher's (harness/launch/fork_server.py), forked from a server on CPU, spawned on CUDA."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: ranks run on cpu or cuda")
    return fork_server.start_method(device == "cuda")


def spawn_ranks(fn: Callable[..., Any], world: int, tmp_path: Path, *args: Any, device: str = "cpu") -> list[Any]:
    """fn(rank, world, device, *args) on `world` processes in one process group (gloo on CPU,
    NCCL with one GPU a rank on CUDA); their return values in rank order. fn must be a
    module-level function (it is pickled)."""
    method = start_method(device)
    try:
        if method == "forkserver":
            fork_server.ready_server(extra=PRELOAD)
        mp.start_processes(_rank_main, args=(world, fn, args, str(tmp_path), device), nprocs=world,
                           join=True, start_method=method)
    except mp.ProcessExitedException as exc:
        # Once every rank has saved its result and passed the barrier after it, what is left is
        # process teardown (destroy_process_group, interpreter exit), which is not what a test
        # of fn checks. One such abort was seen once in CI ("terminate called without an active
        # exception" in rank 0 after its work); it is reported as a warning, with the rank's
        # faulthandler stack in the captured stderr, and the results are used.
        if not all((tmp_path / f"rank{r}.done").exists() for r in range(world)):
            raise
        warnings.warn(f"{exc} after every rank had saved its result: a crash in process teardown", RuntimeWarning)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]  # our own files


def _train(rank: int, world: int, device: torch.device, cfg, plan: list) -> dict:
    from harness.run.train import train

    return train(cfg, rank=rank, device=device, recorder=None, plan=plan, keep_weights=True).__dict__


def run_ranks(cfg, plan, tmp_path: Path, device: str = "cpu") -> list[dict]:
    """One TrainResult dict per rank, in rank order (the frozen config and plan pickle as they are)."""
    return spawn_ranks(_train, cfg.run.world_size, tmp_path, cfg, list(plan), device=device)
