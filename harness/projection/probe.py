"""Probes of this host for a CPU projection (issue 46: "the rest comes from spec sheets or probes"):
what gloo's all-to-all and all-reduce cost between local processes, the figures of its exchanges,
and what one thread's dense step costs against the calibration rank's threads.

`gloo_collectives(ranks)` starts `ranks` processes on loopback, one thread each (as the harness's
ranks get when they outnumber the cores: harness/run/worker.threads_per_rank), and times each
collective at a small and a large size after a few unmeasured calls. The latency is the small
size's median call; the bandwidth the extra bytes over the extra time. The ranks of a projected run also
compute between their collectives; this probe's do not, so the figures are its lower bounds.
"""

from __future__ import annotations

import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SMALL, LARGE = 1024, 8 << 20
"""Bytes a rank sends (all-to-all) or reduces (all-reduce)."""
REPEATS = {SMALL: 25, LARGE: 7}
WARMUP = 3
KINDS = ("all_to_all", "all_reduce")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _time(kind: str, nbytes: int) -> float:
    """The median of single calls: a few calls on an oversubscribed host stall for a scheduler
    tick or more, and a mean of back-to-back calls is theirs."""
    x = torch.zeros(nbytes // 4)
    y = torch.empty_like(x)
    call = (lambda: dist.all_to_all_single(y, x)) if kind == "all_to_all" else (lambda: dist.all_reduce(x))
    for _ in range(WARMUP):
        call()
    dist.barrier()
    times = []
    for _ in range(REPEATS[nbytes]):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _rank(rank: int, ranks: int, port: int, out) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    try:
        times = {(k, n): _time(k, n) for k in KINDS for n in (SMALL, LARGE)}
        # The slowest rank's view: a collective ends for everybody when it ends for the last.
        t = torch.tensor([times[(k, n)] for k in KINDS for n in (SMALL, LARGE)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rank == 0:
            out.put(t.tolist())
    finally:
        dist.destroy_process_group()


def gloo_collectives(ranks: int) -> dict[str, float]:
    """{all_to_all,all_reduce}_{latency_us,gbps} between `ranks` local processes (module docstring)."""
    if ranks < 2:
        raise ValueError(f"the gloo probe needs at least 2 ranks, got {ranks}")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, ranks, port, out), daemon=True) for r in range(ranks)]
    for p in procs:
        p.start()
    try:
        t = out.get(timeout=120)
    finally:
        for p in procs:
            p.join(timeout=30)
    figures = {}
    for i, kind in enumerate(KINDS):
        small, large = t[2 * i], t[2 * i + 1]
        figures[f"{kind}_latency_us"] = small * 1e6
        figures[f"{kind}_gbps"] = (LARGE - SMALL) / max(large - small, 1e-9) / 1e9
    return figures


DENSE_ROUNDS = 3


def dense_threads(model, batch: int, probed: int) -> dict[int, float]:
    """Seconds of one dense forward and backward (model.dense.DenseArch of `model`, fp32) on `batch`
    samples with `probed` torch threads, and on one thread's share of them (batch // probed) with
    one thread, in this process: rounds interleaved, the best of each (another process's burst only
    ever slows a round). Equal seconds: compute in proportion to the threads."""
    import torch.nn.functional as F

    from model.dense import DenseArch

    arch = DenseArch(**model.dense_arch_kwargs())
    before = torch.get_num_threads()

    def seconds(threads: int, b: int) -> float:
        torch.set_num_threads(threads)
        dense, pooled = torch.rand(b, model.num_dense), torch.randn(b, model.num_sparse * model.embedding_dim)
        labels = torch.rand(b).round()
        pooled.requires_grad_(True)
        step = lambda: F.binary_cross_entropy_with_logits(arch(dense, pooled), labels).backward()  # noqa: E731
        step()  # warm-up: allocator, kernel selection
        start = time.perf_counter()
        step()
        return time.perf_counter() - start

    best = {probed: float("inf"), 1: float("inf")}
    try:
        for _ in range(DENSE_ROUNDS):
            best[probed] = min(best[probed], seconds(probed, batch))
            best[1] = min(best[1], seconds(1, max(1, batch // probed)))
    finally:
        torch.set_num_threads(before)
    return best
