"""From a config and a calibrated profile to a projected iteration: the ops of each stage on the
code path the flags select, simulated on every rank (timeline.py).

What each flag is credited with (the mechanism, nothing else):

- pipeline (default on): batch i+1's ids all-to-all is launched in iteration i and waited in
  iteration i+1's emb_fwd, so it overlaps the compute between;
- skip_splits_a2a: no splits all-to-all, no D2H of the splits and no host sync in input_dist;
- pinned_d2h: the splits' copy is waited by its event: the host waits for the splits exchange
  only, not for the compute stream to drain (a pageable copy's sync);
- threaded_input_dist: input dist's wait moves to its own thread; the main thread pays a hand-off
  and still runs the launches (the GIL);
- cuda_graphs (GPU): dense_fwd_bwd's launches become one graph replay on the host; the device still
  runs every kernel, a small gap apart;
- avoid_record_streams: no time credited (it changes the NCCL allocator's bookkeeping; inactive on
  torch >= 2.8).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from harness.names import OPTIMIZATION_FLAGS, STAGES
from harness.projection.hardware import Profile, dense_precision, peak_flops
from harness.projection.kernels import StageKernels, stage_kernels
from harness.projection.timeline import Collective, Host, Launch, Result, Sync, simulate
from harness.projection.work import Work

CUDA_ONLY = ("cuda_graphs", "pinned_d2h", "avoid_record_streams")


@dataclass
class Calibration:
    """What calibration runs measured beyond the profile's figures: per-stage host time the launch
    count does not explain, and the time between iterations (each with its source)."""

    host_fixed_s: dict[str, float] = field(default_factory=dict)
    between_s: float = 0.0
    sources: dict[str, str] = field(default_factory=dict)


def effective_flags(cfg, profile: Profile) -> dict[str, bool]:
    flags = {f: bool(getattr(cfg.optimizations, f)) for f in OPTIMIZATION_FLAGS}
    if not profile.async_device:
        flags.update({f: False for f in CUDA_ONLY})
    return flags


def dense_roof_s(work: Work, profile: Profile, precision: str) -> float:
    """The dense step at the spec peaks: FLOPs at the precision's peak plus bytes at HBM speed."""
    return work.dense_flops / peak_flops(profile, precision) + work.dense_bytes / (profile.value("hbm_gbps") * 1e9)


def dense_eff(profile: Profile, precision: str) -> float:
    key = f"dense_eff_{precision}"
    return profile.value(key) if key in profile.figures else profile.value("dense_eff")


def _latency(profile: Profile, work: Work) -> float:
    if work.world_size == 1:
        return 0.0  # one rank: exchanges are local copies
    key = "inter_node_latency_us" if work.spans_nodes else "intra_node_latency_us"
    return profile.value(key) * 1e-6


def _exchange(work: Work, profile: Profile, name: str) -> np.ndarray:
    return work.exchange_seconds(name, profile.value("intra_node_gbps") * 1e9, profile.value("inter_node_gbps") * 1e9)


def _input_dist_ops(work: Work, profile: Profile, k: StageKernels, flags: dict, cal: Calibration, lat: float) -> list:
    launch, groups = profile.value("launch_us") * 1e-6, len(work.groups)
    ops = [Launch("input_dist", cal.host_fixed_s.get("input_dist", 0.0) + k.input_dist * launch, 0.0)]
    if not flags["skip_splits_a2a"]:
        ops.append(Collective("splits", "input_dist", groups * lat))
        if flags["threaded_input_dist"]:
            ops.append(Host("input_dist", profile.value("thread_handoff_us") * 1e-6))
        elif flags["pinned_d2h"]:
            ops.append(Sync("input_dist", profile.value("sync_us") * 1e-6, drain=False, on="splits"))
        else:
            ops.append(Sync("input_dist", profile.value("sync_us") * 1e-6, drain=True))
    ops.append(Collective("ids", "input_dist", _exchange(work, profile, "ids") + groups * lat))
    return ops


def iteration_ops(cfg, work: Work, profile: Profile, cal: Calibration, flags: dict) -> tuple[list, StageKernels]:
    """One iteration's ops on every rank (module docstring for what each flag changes)."""
    k = stage_kernels(cfg, groups=len(work.groups), params=work.params, world_size=work.world_size, flags=flags)
    launch, hbm = profile.value("launch_us") * 1e-6, profile.value("hbm_gbps") * 1e9
    lat, groups, fixed = _latency(profile, work), len(work.groups), cal.host_fixed_s
    prec = dense_precision(cfg)
    ops = _input_dist_ops(work, profile, k, flags, cal, lat)
    ids = "ids@prev" if cfg.optimizations.pipeline else "ids"
    ops.append(Launch("emb_fwd", fixed.get("emb_fwd", 0.0) + k.emb_fwd * launch,
                      work.lookup_fwd / (hbm * profile.value("lookup_eff")), waits=(ids,)))
    ops.append(Collective("forward", "emb_fwd", _exchange(work, profile, "forward") + groups * lat))
    dense_dev = dense_roof_s(work, profile, prec) / dense_eff(profile, prec)
    if flags["cuda_graphs"]:
        host = profile.value("graph_launch_us") * 1e-6
        dense_dev += k.dense_fwd_bwd * profile.value("graph_kernel_gap_us") * 1e-6
    else:
        host = fixed.get("dense_fwd_bwd", 0.0) + k.dense_fwd_bwd * launch
    ops.append(Launch("dense_fwd_bwd", host, dense_dev, waits=("forward",)))
    if work.world_size > 1:
        intra, inter = work.allreduce_bytes()
        ar = intra / (profile.value("intra_node_gbps") * 1e9) + inter / (profile.value("inter_node_gbps") * 1e9)
        ops.append(Collective("allreduce", "dense_fwd_bwd", ar + max(k.dense_buckets, 1) * lat))
    ops.append(Collective("backward", "emb_bwd", _exchange(work, profile, "backward") + groups * lat))
    ops.append(Launch("emb_bwd", fixed.get("emb_bwd", 0.0) + k.emb_bwd * launch,
                      work.lookup_bwd / (hbm * profile.value("lookup_eff")), waits=("backward",)))
    ops.append(Launch("dense_update", fixed.get("dense_update", 0.0) + k.dense_update * launch,
                      work.update_bytes / (hbm * profile.value("update_eff")),
                      waits=("allreduce",) if work.world_size > 1 else ()))
    ops.append(Host("between_iterations", cal.between_s))
    return ops, k


@dataclass(frozen=True)
class Projection:
    label: str
    flags: dict[str, bool]
    result: Result
    kernels: StageKernels
    world_size: int

    def stage_ms(self, how: str = "max") -> dict[str, float]:
        f = np.max if how == "max" else np.mean
        return {s: float(f(self.result.stage_s[s])) * 1e3 for s in (*STAGES, "between_iterations")}

    @property
    def period_ms(self) -> float:
        return self.result.period_s * 1e3

    @property
    def window_ms(self) -> float:
        return float(np.max(self.result.window_s)) * 1e3


def project(cfg, work: Work, profile: Profile, cal: Calibration, *, label: str = "") -> Projection:
    flags = effective_flags(cfg, profile)
    ops, k = iteration_ops(cfg, work, profile, cal, flags)
    result = simulate(ops, ranks=work.world_size, async_device=profile.async_device)
    return Projection(label=label, flags=flags, result=result, kernels=k, world_size=work.world_size)
