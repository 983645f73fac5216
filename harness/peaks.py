"""Brief measurements of the machine's peaks, taken in the rank's own process at start."""

from __future__ import annotations

import time

import torch


def measure_gemm_gflops(device: torch.device, n: int = 1024, reps: int = 5) -> float:
    """fp32 GFLOP/s of a plain n x n torch.mm: the yardstick the dense stage's rate is compared with."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    torch.mm(a, b)  # warm-up: allocator, kernel selection
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter_ns()
    for _ in range(reps):
        torch.mm(a, b)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = (time.perf_counter_ns() - start) / 1e9
    return 2 * n**3 * reps / seconds / 1e9
