"""Brief measurements of the machine's peaks, taken in the rank's own process at start.

They are the yardsticks of the roofline: achieved FLOP/s and bytes/s of a stage are read
against what this process, on this core share, could do at best.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass

import torch

from harness.config import ModelConfig


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


@dataclass(frozen=True)
class GemmProbe:
    """The GEMM the peak is measured on: the dense step's widest, at its precision."""

    m: int
    k: int
    n: int
    dtype: torch.dtype

    def describe(self) -> str:
        """What was measured, for rank.json: shape, dtype, and fp32's matmul precision (TF32 or not)."""
        return (f"{str(self.dtype).removeprefix('torch.')} {self.m}x{self.k}x{self.n}, "
                f"fp32 matmul precision {torch.get_float32_matmul_precision()}")


def dense_gemm_probe(model: ModelConfig, local_batch: int, precision: str) -> GemmProbe:
    """The top MLP's first layer, (local batch x the cross net's width) @ (width x top_mlp[0]): the
    dense step's widest GEMM, in its precision (bf16 runs its matmuls in bf16 under autocast; fp32
    in fp32 as torch's float32 matmul precision says, TF32 on "high"). A plain 1024^3 fp32 matmul
    measured 26.5 TFLOP/s on an H100 where the dense step ran at 39.8: a peak below what it
    bounds."""
    width = (model.num_sparse + 1) * model.embedding_dim
    return GemmProbe(m=local_batch, k=width, n=model.top_mlp[0],
                     dtype=torch.float32 if precision == "fp32" else torch.bfloat16)


def measure_gemm_gflops(device: torch.device, probe: GemmProbe | None = None, reps: int | None = None) -> float:
    """GFLOP/s of `probe`'s torch.mm on `device` (default: a 1024^3 fp32 matmul). reps: more on a
    GPU, where one GEMM takes a millisecond or less."""
    probe = probe or GemmProbe(1024, 1024, 1024, torch.float32)
    reps = reps or (20 if device.type == "cuda" else 5)
    a = torch.randn(probe.m, probe.k, device=device).to(probe.dtype)
    b = torch.randn(probe.k, probe.n, device=device).to(probe.dtype)
    return 2 * probe.m * probe.k * probe.n * reps / _timed(device, lambda: torch.mm(a, b), reps) / 1e9


def measure_copy_gbps(device: torch.device, mib: int = 64, reps: int = 5) -> float:
    """GB/s of a device-memory copy, counting bytes read plus bytes written."""
    src = torch.empty(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 * reps / _timed(device, lambda: dst.copy_(src), reps) / 1e9


CLEAR_REFS, STATUS = "/proc/self/clear_refs", "/proc/self/status"
"""Linux's files for a peak of a rank's own (module names: tests point them elsewhere)."""


def reset_peak_rss() -> None:
    """Linux: the process's resident-memory peak (VmHWM) back to what it holds now, so that a rank
    run in a longer-lived process (the in-process launch) reports its own peak, not the process's."""
    with open(CLEAR_REFS, "w") as f:
        f.write("5")


def peak_rss_gib(*, since_reset: bool) -> float:
    """The process's resident-memory peak in GiB: since reset_peak_rss (VmHWM) or since it started."""
    if since_reset:
        with open(STATUS) as f:
            kib = next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), None)
        if kib is None:
            raise OSError(f"{STATUS} has no VmHWM line")
        return kib / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def own_peak_unavailable() -> str | None:
    """Why this process cannot give a run its own memory peak (reset_peak_rss, then VmHWM), or None.
    Tried, not guessed from the files being there: a sandboxed kernel may implement part of /proc
    (the device tool's H200s were seen under gVisor). It resets this process's peak, harmlessly."""
    try:
        reset_peak_rss()
        peak_rss_gib(since_reset=True)
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
