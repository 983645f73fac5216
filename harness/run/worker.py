"""What each rank process runs: read the run's manifest, set up distributed, train, record."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import faulthandler
import gc
import os
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
import torch.distributed as dist

from harness.run.device import process_group_options, resolve_device, set_tf32
from harness.run.launcher_watch import stop_with_launcher
from harness.records.manifest import RankInfo
from harness.run.peaks import dense_gemm_probe, measure_copy_gbps, measure_gemm_gflops, peak_rss_gib, reset_peak_rss
from harness.run.startup import StartupClock
from harness.records.writer import RankRecorder, read_manifest


def threads_per_rank(local_ranks: int) -> int:
    """Ranks sharing a host split its cores; oversubscribed BLAS threads would distort every timing."""
    return max(1, (os.cpu_count() or 1) // local_ranks)


def maybe_avoid_record_streams(on: bool) -> None:
    """avoid_record_streams: NCCL reads this when the process group is created, so it is set here,
    before init_process_group. The caching allocator then frees collective buffers by stream
    sync instead of recordStream, which otherwise delays their reuse."""
    if not on:
        return
    os.environ["TORCH_NCCL_AVOID_RECORD_STREAMS"] = "1"


def run_rank(run_dir: str, launcher_pid: int | None = None, *, in_process: bool = False) -> dict:
    """Entry point of one rank (torchrun or the in-process elastic launcher set RANK etc.).
    launcher_pid: the local simulation's launcher, which the rank stops with (launcher_watch).
    in_process: run by the launcher's own process (run_in_process), not a process of its own: the
    imports were paid before, and the memory peaks are reset at the entry to be the run's own."""
    if launcher_pid is not None:
        stop_with_launcher(launcher_pid)
    # A rank killed by a signal (a C++ abort in a collective library, a segfault) leaves the Python
    # stack of every thread in its log, not just the signal's name in torchrun's summary. In-process,
    # that is the launcher's process and its own choice (its stderr may not even be a file).
    if not in_process:
        faulthandler.enable(all_threads=True)
    # Here, not at the top: the launcher imports this module for the entry point alone, and the
    # training's imports (fbgemm, the sharded tables) are a rank's; before the clock, they count as imports.
    from harness.run.train import train

    clock = StartupClock(in_process=in_process)
    if in_process:
        reset_peak_rss()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    manifest = read_manifest(Path(run_dir))
    cfg = manifest.config
    if int(os.environ["WORLD_SIZE"]) != cfg.run.world_size:
        raise RuntimeError(f"launched with WORLD_SIZE={os.environ['WORLD_SIZE']}, config wants {cfg.run.world_size}")
    node = rank // cfg.run.gpus_per_node
    recorder = RankRecorder(
        Path(run_dir), run_id=manifest.run_id, rank=rank, node=node,
        warmup_iters=cfg.run.warmup_iters, local_batch=cfg.local_batch_size,
    )
    recorder.note_sigterm()
    try:
        torch.set_num_threads(threads_per_rank(local_world))
        device, backend = resolve_device(cfg.run.device, local_rank)
        if in_process and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        flags = manifest.optimizations
        maybe_avoid_record_streams(flags.effective["avoid_record_streams"])
        # In-process, the one rank's store is in memory: a port picked by the launcher could be
        # taken before the rank binds it (EADDRINUSE ended an H100 gpu-bench's in-process runs).
        store = dict(store=dist.HashStore(), rank=0, world_size=1) if in_process else {}
        dist.init_process_group(backend, timeout=dt.timedelta(seconds=cfg.run.collective_timeout_s),
                                **process_group_options(device), **store)
        clock.lap("process_group")
        set_tf32(flags.precision.tf32)
        probe = dense_gemm_probe(cfg.model, cfg.local_batch_size, cfg.precision.dense)
        info = RankInfo(
            run_id=manifest.run_id, rank=rank, node=node, host=socket.gethostname(), pid=os.getpid(),
            device=str(device), backend=backend, threads=torch.get_num_threads(),
            gemm_gflops=measure_gemm_gflops(device, probe), gemm_probe=probe.describe(),
            copy_gbps=measure_copy_gbps(device),
        )
        recorder.write_info(info)
        clock.lap("probes")
        result = train(cfg, rank=rank, device=device, recorder=recorder, plan=list(manifest.plan), flags=flags,
                       built=lambda: clock.lap("build"))
        clock.lap("loop")
        info = dataclasses.replace(
            info, startup_s=dict(clock.phases), peak_rss_gib=peak_rss_gib(since_reset=in_process),
            peak_gpu_mem_gib=torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        )
        recorder.write_info(info)
        return {"rank": rank, "final_loss": result.losses[-1] if result.losses else None}
    except BaseException as exc:
        recorder.write_error(exc)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        recorder.end_sigterm_note()


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """What a rank sets process-wide (its environment, torch's thread count, TF32), put back after
    it, and what it held freed: the next run in the same process starts as a new process would.
    The launcher's own objects are frozen out of the garbage collector's passes meanwhile, so that
    a long-lived process's heap does not lengthen the rank's collections."""
    environ, threads = dict(os.environ), torch.get_num_threads()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    gc.collect()
    if torch.cuda.is_initialized():  # what the launcher's process held before leaves the device
        torch.cuda.empty_cache()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        os.environ.clear()
        os.environ.update(environ)
        torch.set_num_threads(threads)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        gc.collect()  # CUDA graphs and their memory pools go with their last reference
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()


def run_in_process(run_dir: str, env: Mapping[str, str]) -> dict:
    """The one rank of a one-rank run, in this process (the in-process launch): `env` is what a
    launcher would give the rank's process (RANK, WORLD_SIZE, MASTER_ADDR ...)."""
    with _process_state_kept():
        os.environ.update(env)
        return run_rank(run_dir, in_process=True)
