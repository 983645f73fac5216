"""Hardware profiles for projection: every figure with its value and where it came from.

A figure's source is one of "spec" (a vendor spec sheet or the planner's profile, which cites
them), "probe" (measured by a run's start-up probes, the manifest's rank notes), "assumption" (a
figure nobody measured here, named so a reader can change it) or "calibrated: <run_id> <stage>"
(calibrate.py). Projection reads only `Profile.value`, so every number in an output can be traced.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from harness.launch.planning import PROFILES


@dataclass(frozen=True)
class Figure:
    value: float
    unit: str
    source: str
    note: str = ""


@dataclass
class Profile:
    """Named figures of one device kind and its links (units in each Figure)."""

    name: str
    async_device: bool
    """True on a GPU: the host launches and the device runs later (a stage takes the longer of the
    two); False on a CPU: every op runs on the host thread that issued it (they add up)."""
    figures: dict[str, Figure] = field(default_factory=dict)

    def value(self, key: str) -> float:
        return self.figures[key].value

    def set(self, key: str, value: float, unit: str, source: str, note: str = "") -> None:
        self.figures[key] = Figure(float(value), unit, source, note)

    def copy(self) -> Profile:
        return dataclasses.replace(self, figures=dict(self.figures))

    def assumptions(self) -> list[tuple[str, str, str, str]]:
        """(figure, value with unit, source, note) rows, in insertion order."""
        return [(k, f"{f.value:.4g} {f.unit}", f.source, f.note) for k, f in self.figures.items()]


PEAK_KEYS = {"fp32": "peak_fp32_tflops", "tf32": "peak_tf32_tflops", "bf16": "peak_bf16_tflops"}


def _links(p: Profile, name: str) -> None:
    prof = PROFILES[name]
    src = "spec (harness/launch/planning.py PROFILES)"
    p.set("hbm_gbps", prof["memory_gbps"], "GB/s", src)
    p.set("intra_node_gbps", prof["intra_node_gbps"], "GB/s", src, "a direction; no NCCL efficiency derating")
    p.set("inter_node_gbps", prof["inter_node_gbps"], "GB/s", src, "a direction; no NCCL efficiency derating")
    p.set("intra_node_latency_us", prof["intra_node_latency_us"], "us", src, "a collective")
    p.set("inter_node_latency_us", prof["inter_node_latency_us"], "us", src, "a collective")


def _hopper(name: str, sheet: str) -> Profile:
    """An NVIDIA Hopper SXM GPU: the H100 and the H200 share the chip, its clocks and so its
    tensor-core peaks; their memory differs (planning.PROFILES, set by _links)."""
    p = Profile(name, async_device=True)
    p.set("peak_fp32_tflops", 67.0, "TFLOP/s", sheet, "FP32 without tensor cores")
    p.set("peak_tf32_tflops", 494.7, "TFLOP/s", sheet)
    p.set("peak_bf16_tflops", 989.4, "TFLOP/s", sheet)
    _links(p, name)
    p.set("launch_us", 10.0, "us", "assumption", "host time a kernel launch, eager PyTorch; replaced by calibration")
    p.set("graph_launch_us", 20.0, "us", "assumption", "host time to replay one CUDA graph")
    p.set("graph_kernel_gap_us", 1.0, "us", "assumption", "device gap between a graph's kernels")
    p.set("sync_us", 15.0, "us", "assumption", "a host sync + pageable D2H copy of a few bytes, besides the wait")
    p.set("thread_handoff_us", 30.0, "us", "assumption", "handing input dist to its thread and back")
    p.set("draw_op_us", 10.0, "us", "assumption", "host time an op of the batch drawn on the GPU (no autograd); "
          "used only where the calibration runs drew theirs elsewhere")
    p.set("dense_eff", 0.5, "of peak", "assumption", "dense step at the run's shapes; replaced by calibration")
    p.set("lookup_eff", 0.5, "of HBM", "assumption", "embedding lookup/update bandwidth; replaced by calibration")
    p.set("update_eff", 0.5, "of HBM", "assumption", "dense optimizer step bandwidth; replaced by calibration")
    return p


def h100() -> Profile:
    """NVIDIA H100 SXM5 80GB (DGX H100), dense (no sparsity) tensor-core peaks from the data sheet."""
    return _hopper("h100", "spec (NVIDIA H100 SXM5 data sheet, dense)")


def h200() -> Profile:
    """NVIDIA H200 SXM 141GB (DGX H200): the H100's peaks (its data sheet gives the same, dense), 4.8
    TB/s of HBM3e."""
    return _hopper("h200", "spec (NVIDIA H200 SXM data sheet, dense)")


def cpu(gemm_gflops: float = 50.0, copy_gbps: float = 10.0, source: str = "assumption", *, cores: float = 2,
        rank_cores: float = 2, cores_source: str = "assumption") -> Profile:
    """A CPU host: peaks from a run's start-up probes where one is given (those of one rank that had
    `rank_cores` of the host's `cores`), gloo for the links."""
    p = Profile("cpu", async_device=False)
    for key in PEAK_KEYS.values():
        p.set(key, gemm_gflops / 1e3, "TFLOP/s", source, "the GEMM probe (every precision alike on CPU)")
    _links(p, "cpu")
    p.set("hbm_gbps", copy_gbps, "GB/s", source, "the copy probe")
    p.set("cores", cores, "cores", cores_source, "the host's: ranks on one host share them")
    p.set("rank_cores", rank_cores, "cores", cores_source,
          "what the probed rank had: the peaks and efficiencies are its")
    for kind in ("all_to_all", "all_reduce"):
        p.set(f"{kind}_latency_us", PROFILES["cpu"]["intra_node_latency_us"], "us", "spec (harness/launch/planning.py "
              "PROFILES)", "gloo, a collective; make project probes this host's where the ranks fit on it")
        p.set(f"{kind}_gbps", PROFILES["cpu"]["intra_node_gbps"], "GB/s", "spec (harness/launch/planning.py PROFILES)",
              "gloo, a rank's bytes")
    p.set("one_thread_gain", 1.0, "x", "assumption", "a one-thread rank's compute rate over a core's share of "
          "the probed rank's: compute in proportion to the cores; make project probes it (probe.dense_threads)")
    p.set("launch_us", 20.0, "us", "assumption", "host time an op; replaced by calibration")
    p.set("gloo_pair_ratio", 2.0, "x", "assumption", "two gloo collectives in flight on ranks that fill the cores: "
          "at once (gloo's two worker threads), each at half speed while they overlap (project.pair_ratio)")
    p.set("graph_launch_us", 0.0, "us", "spec", "no CUDA graphs on CPU (flag inactive)")
    p.set("graph_kernel_gap_us", 0.0, "us", "spec", "no CUDA graphs on CPU (flag inactive)")
    p.set("sync_us", 0.0, "us", "spec", "nothing to synchronize on CPU")
    p.set("thread_handoff_us", 30.0, "us", "assumption", "handing input dist to its thread and back")
    p.set("dense_eff", 0.5, "of peak", "assumption", "replaced by calibration")
    p.set("lookup_eff", 0.5, "of copy", "assumption", "replaced by calibration")
    p.set("update_eff", 0.5, "of copy", "assumption", "replaced by calibration")
    return p


HARDWARE = {"h100": h100, "h200": h200, "cpu": cpu}


def retarget(calibrated: Profile, name: str) -> Profile:
    """The profile `name` with what runs on another GPU calibrated (each efficiency, the host's costs:
    every figure a run set), for projecting a GPU from another's runs; spec figures are the
    target's. A CPU's figures say nothing of a GPU's, nor the reverse: refused."""
    if name == calibrated.name:
        return calibrated
    target = HARDWARE[name]()
    if target.async_device != calibrated.async_device:
        ran = "a GPU" if calibrated.async_device else "a CPU"
        raise ValueError(f"--hardware {name}: the calibration runs ran on {ran} ({calibrated.name}); "
                         f"give runs of {'a CPU' if ran == 'a GPU' else 'a GPU'} (CALIBRATE=...) or --hardware "
                         f"{calibrated.name}")
    for key, fig in calibrated.figures.items():
        if not fig.source.startswith(("spec", "assumption")):
            target.figures[key] = dataclasses.replace(fig, note=f"{fig.note}; measured on {calibrated.name}".lstrip("; "))
    return target


def set_gloo(p: Profile, figures: dict[str, float], ranks: int) -> None:
    """The gloo probe's figures (harness/projection/probe.py) for `ranks` processes on this host."""
    for key, value in figures.items():
        p.set(key, value, "GB/s" if key.endswith("gbps") else "us", f"probe: gloo, {ranks} processes on this host",
              "probe.py: idle peers, so a lower bound")


def set_thread_gain(p: Profile, seconds: dict[int, float]) -> None:
    """probe.dense_threads' figures: the dense step on the probed rank's threads (rank_cores) over
    one thread's share of it on one thread. On this project's 2-core VM two threads run small's
    dense step 9-19% under twice one thread's rate (docs/projection.md); ranks of one thread each
    get that back."""
    probed = int(p.value("rank_cores"))
    if probed <= 1 or probed not in seconds or 1 not in seconds:
        return
    p.set("one_thread_gain", seconds[probed] / seconds[1], "x",
          f"probe: the dense step on {probed} threads and its share on 1 on this host", "best of interleaved rounds")


def rank_cores(cores: float, local_ranks: int) -> float:
    """Cores a rank computes on: harness/run/worker.threads_per_rank's threads, or its share of the
    host when the ranks outnumber the cores (then each runs a fraction of the time)."""
    return min(max(1, int(cores) // local_ranks), cores / local_ranks)


def peak_flops(p: Profile, precision: str) -> float:
    """FLOP/s of the dense step's precision (bf16 autocast, fp32 with or without TF32)."""
    return p.value(PEAK_KEYS[precision]) * 1e12


def dense_precision(cfg) -> str:
    prec = cfg.precision
    if prec.dense != "fp32":  # bf16 autocast or bf16-pure: bf16 GEMMs
        return "bf16"
    return "tf32" if prec.tf32 else "fp32"
