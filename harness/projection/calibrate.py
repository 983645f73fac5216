"""Calibration: the per-device compute figures a run folder measures, each named with its source.

From each run (any device; world size any, its records read with harness/report): its measured
per-stage means (critical_stage_means), its config and plan (manifest), the kernels its code path
launches (kernels.py) and the spec-sheet roofline of each stage (project.py). Then:

- launch_us (host time a kernel, eager): from the run whose dense step is furthest from its spec
  roofline (roofline / measured < ROOF_SHARE) and not graphed: its dense_fwd_bwd time, less the
  roofline on a synchronous device, over its kernels;
- dense_eff_<precision>: from the run whose dense step is closest to its roofline, when that step
  is device-bound (graphed, or its launches explain < LAUNCH_SHARE of it on a GPU; on a CPU the
  launches subtracted): roofline / device time;
- lookup_eff: emb_bwd's lookup bytes (read and write, two thirds of the lookup's) at HBM speed over
  its measured time (a lower bound: its host work counted as device time), from the run where that
  ratio is highest; emb_fwd's rest is its host time (host_fixed_s);
- update_eff: dense_update's bytes at HBM speed over its time, likewise;
- host_fixed_s (the first run only): per stage, the time the timeline leaves unexplained, found by
  iterating the timeline on the first run's own configuration (what Python costs besides launches);
- between_s: the first run's mean time between iterations (batch drawn, records flushed).

A figure no run identifies keeps its profile value, source "assumption" or "spec".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.report.api import iteration_summary, load_run
from harness.report.load import Run
from harness.report.tables import critical_stage_means
from harness.names import STAGES
from harness.projection.hardware import Profile, cpu, dense_precision, h100
from harness.projection.kernels import stage_kernels
from harness.projection.project import Calibration, dense_roof_s, effective_flags, project
from harness.projection.work import Work, work_of

ROOF_SHARE = 0.5
LAUNCH_SHARE = 0.8
FIXED_PASSES = 6


@dataclass(frozen=True)
class Measured:
    run: Run
    stage_s: dict[str, float]
    between_s: float
    period_s: float
    work: Work
    name: str


def measured(path: Path | str) -> Measured:
    run = load_run(Path(path))
    m = run.manifest
    means = critical_stage_means(run).mean(numeric_only=True)
    summ = iteration_summary(run)
    stage_s = {s: float(means.get(s, 0.0)) / 1e3 for s in STAGES}
    work = work_of(m.config, m.plan, world_size=m.world_size, ranks_per_node=m.config.run.gpus_per_node)
    return Measured(run=run, stage_s=stage_s, between_s=float(summ["between_ms_mean"]) / 1e3,
                    period_s=float(summ["period_ms_mean"]) / 1e3, work=work, name=Path(path).name)


def base_profile(first: Measured) -> Profile:
    """The spec profile of the first run's device: h100 for a CUDA run, the run's own probes on CPU."""
    if first.run.manifest.device.startswith("cpu"):
        r = first.run.manifest.ranks[0]
        return cpu(r.gemm_gflops, r.copy_gbps, source=f"probe: {first.name} rank 0")
    return h100()


def _kernels(m: Measured, profile: Profile):
    cfg = m.run.manifest.config
    flags = effective_flags(cfg, profile)
    return stage_kernels(cfg, groups=len(m.work.groups), params=m.work.params, world_size=m.work.world_size,
                         flags=flags), flags


def _set_launch(runs: list[Measured], p: Profile) -> None:
    best = None
    for m in runs:
        k, flags = _kernels(m, p)
        t = m.stage_s["dense_fwd_bwd"]
        roof = dense_roof_s(m.work, p, dense_precision(m.run.manifest.config))
        if flags["cuda_graphs"] or t <= 0 or roof / t >= ROOF_SHARE:
            continue
        if best is None or roof / t < best[0]:
            best = (roof / t, m, (t - (0 if p.async_device else roof)) / k.dense_fwd_bwd)
    if best:
        p.set("launch_us", best[2] * 1e6, "us", f"calibrated: {best[1].name} dense_fwd_bwd",
              f"its time over its {_kernels(best[1], p)[0].dense_fwd_bwd} kernels (spec roofline {best[0]:.0%} of it)")


def _set_dense_eff(runs: list[Measured], p: Profile) -> None:
    launch = p.value("launch_us") * 1e-6
    best: dict[str, tuple] = {}
    for m in runs:
        k, flags = _kernels(m, p)
        prec = dense_precision(m.run.manifest.config)
        t = m.stage_s["dense_fwd_bwd"]
        roof = dense_roof_s(m.work, p, prec)
        launches = k.dense_fwd_bwd * launch
        if p.async_device:
            device_bound = flags["cuda_graphs"] or launches < LAUNCH_SHARE * t
            dev = t
        else:
            device_bound, dev = t - launches > 0.2 * t, t - launches
        if device_bound and dev > 0 and (prec not in best or roof / dev > best[prec][0]):
            best[prec] = (roof / dev, m)
    for prec, (eff, m) in best.items():
        p.set(f"dense_eff_{prec}", eff, "of peak", f"calibrated: {m.name} dense_fwd_bwd",
              f"{prec} roofline over the measured device time" + (" (above 1: the peak under-measured)" if eff > 1 else ""))


def _set_bandwidth_effs(runs: list[Measured], p: Profile) -> None:
    hbm = p.value("hbm_gbps") * 1e9
    for key, stages, nbytes in (("lookup_eff", ("emb_bwd",), lambda w: float(w.lookup_bwd.max())),
                                ("update_eff", ("dense_update",), lambda w: w.update_bytes)):
        best = None
        for m in runs:
            t = sum(m.stage_s[s] for s in stages)
            if t > 0 and nbytes(m.work) > 0:
                eff = nbytes(m.work) / hbm / t
                if best is None or eff > best[0]:
                    best = (eff, m)
        if best:
            p.set(key, best[0], "of HBM" if p.async_device else "of copy",
                  f"calibrated: {best[1].name} {'+'.join(stages)}", "bytes at the spec bandwidth over the measured time")


def host_fixed(first: Measured, p: Profile) -> Calibration:
    cal = Calibration(between_s=first.between_s)
    cal.sources["between_s"] = f"calibrated: {first.name} between_iterations mean"
    cfg = first.run.manifest.config
    for _ in range(FIXED_PASSES):
        proj = project(cfg, first.work, p, cal)
        got = proj.stage_ms("mean")
        for s in STAGES:
            miss = first.stage_s[s] - got[s] / 1e3
            cal.host_fixed_s[s] = max(0.0, cal.host_fixed_s.get(s, 0.0) + miss)
    for s, v in cal.host_fixed_s.items():
        cal.sources[f"host_fixed_{s}"] = f"calibrated: {first.name} {s} (host time beyond its launches)"
    return cal


def calibrate(paths: list[Path | str]) -> tuple[Profile, Calibration, list[Measured]]:
    """The profile and calibration the runs at `paths` set (the first run's device picks the profile)."""
    runs = [measured(p) for p in paths]
    if not runs:
        raise ValueError("calibrate: give at least one run folder")
    p = base_profile(runs[0])
    _set_launch(runs, p)
    _set_dense_eff(runs, p)
    _set_bandwidth_effs(runs, p)
    return p, host_fixed(runs[0], p), runs
