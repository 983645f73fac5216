"""Brief measurements of the machine's peaks, taken in the rank's own process at start.

They are the yardsticks of the roofline: achieved FLOP/s and bytes/s of a stage are read
against what this process, on this core share, could do at best.
"""

from __future__ import annotations

import time

import torch


def _timed(device: torch.device, fn, reps: int) -> float:
    fn()  # warm-up: allocator, kernel selection
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter_ns()
    for _ in range(reps):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter_ns() - start) / 1e9


def measure_gemm_gflops(device: torch.device, n: int = 1024, reps: int = 5) -> float:
    """fp32 GFLOP/s of a plain n x n torch.mm."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    return 2 * n**3 * reps / _timed(device, lambda: torch.mm(a, b), reps) / 1e9


def measure_copy_gbps(device: torch.device, mib: int = 64, reps: int = 5) -> float:
    """GB/s of a device-memory copy, counting bytes read plus bytes written."""
    src = torch.empty(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 * reps / _timed(device, lambda: dst.copy_(src), reps) / 1e9
