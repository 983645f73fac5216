"""What each rank process runs: read the run's manifest, set up distributed, train, record."""

from __future__ import annotations

import dataclasses
import datetime as dt
import faulthandler
import os
import resource
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from harness.run.device import maybe_tf32, process_group_options, resolve_device
from harness.records.manifest import RankInfo
from harness.run.peaks import dense_gemm_probe, measure_copy_gbps, measure_gemm_gflops
from harness.run.startup import StartupClock
from harness.records.writer import RankRecorder, read_manifest
from harness.run.train import train


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


def run_rank(run_dir: str) -> dict:
    """Entry point of one rank (torchrun or the in-process elastic launcher set RANK etc.)."""
    # A rank killed by a signal (a C++ abort in a collective library, a segfault) leaves the Python
    # stack of every thread in its log, not just the signal's name in torchrun's summary.
    faulthandler.enable(all_threads=True)
    clock = StartupClock()
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
        flags = manifest.optimizations
        maybe_avoid_record_streams(flags.effective["avoid_record_streams"])
        dist.init_process_group(backend, timeout=dt.timedelta(seconds=cfg.run.collective_timeout_s),
                                **process_group_options(device))
        clock.lap("process_group")
        maybe_tf32(flags.precision.tf32)
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
            info, startup_s=dict(clock.phases), peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
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
