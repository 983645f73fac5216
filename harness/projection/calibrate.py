"""Calibration: the per-device compute figures a run folder measures, each named with its source.

From each run (any device; world size any, its records read with harness/report; runs of one
configuration pooled, each figure their mean): its measured
per-stage means (critical_stage_means), its config and plan (manifest), the kernels its code path
launches (kernels.py) and the spec-sheet roofline of each stage (project.py). Then:

- launch_us (host time a kernel, eager): from the run whose dense step is furthest from its spec
  roofline (roofline / measured < ROOF_SHARE) and not graphed: its dense_fwd_bwd time, less the
  roofline on a synchronous device, over its kernels;
- dense_eff_<precision>: from the run whose dense step is closest to its roofline, when that step
  is device-bound (graphed, or its launches explain < LAUNCH_SHARE of it on a GPU; on a CPU the
  launches subtracted), or from a GPU run's `--profile` trace (its dense step's GPU busy time,
  measured even where the stage is launch-bound): roofline / device time; where a trace is given,
  its GEMM kernels (by name) and the rest apart: dense_mem_eff, the dense step's bytes at HBM
  speed over the rest's time, and dense_eff_<precision> the GEMMs' FLOPs at peak over theirs;
- lookup_eff: emb_bwd's lookup bytes (read and write, two thirds of the lookup's) at HBM speed over
  its measured time (a lower bound: its host work counted as device time; on a CPU its launches
  subtracted), from the run where that ratio is highest; emb_fwd's rest is its host time;
- update_eff: dense_update's bytes at HBM speed over its time, likewise;
- host_fixed_s and host_per_sample_s: per stage, the time the timeline leaves unexplained, found
  by iterating the timeline on the first run's own configuration (what Python costs besides
  launches); split into a fixed part and a part a sample of the local batch when a second run on
  the same device has another local batch (`_pair`: of the same model where one is), else all
  fixed. Each model among the runs gets its own, from its first run (Calibration.models). On a
  CPU it may be below zero, down to the stage's launches: launch_us is the dense step's per-op
  cost (autograd's), and other stages' ops can cost less;
- between_s (and a part a sample, likewise): the mean time between iterations (batch drawn,
  records flushed); its wait for the next batch split by the two runs where both recorded it;
- on a CPU, the GEMM and copy probes of the run with the most dense FLOPs a rank, and the cores
  its rank had (`cores`, `rank_cores`): a projected rank's compute scales with its own cores, its
  single-threaded host work with the turns its ranks take on the host's cores (project.cpu_share).

A figure no run identifies keeps its profile value, source "assumption" or "spec".
"""

from __future__ import annotations

import os
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from harness.report.api import iteration_summary, load_run
from harness.report.load import Run
from harness.report.tables import critical_stage_means
from harness.names import STAGES
from harness.launch.planning import gpu_profile_name
from harness.projection.hardware import HARDWARE, Profile, cpu, dense_precision, peak_flops, rank_cores
from harness.projection.kernels import dense_impl, stage_kernels
from harness.projection.project import (Calibration, cpu_share, dense_roof_s, draw_launches_s, effective_flags,
                                       project)
from harness.projection.work import Work, gathered, work_of

GEMM_KERNELS = r"gemm|nvjet|cutlass|cublas"
"""A GEMM kernel's name in an H100 trace (cuBLAS's nvjet and cutlass kernels, its split-K reduce)."""
ROOF_SHARE = 0.5
LAUNCH_SHARE = 0.8
FIXED_PASSES = 6
DRAIN_MARGIN = 0.05


@dataclass(frozen=True)
class Measured:
    run: Run
    stage_s: dict[str, float]
    between_s: float
    period_s: float
    work: Work
    name: str
    drawn_s: float | None
    """Of between_s, the mean time an iteration waited for its next batch (the records' next_batch
    sub-spans); None for records older than those sub-spans."""
    flushed_s: float | None = None
    """Of between_s, the mean time an iteration spent writing records (flush_records sub-spans, one
    flush every `flush_every` iterations); None for records older than those sub-spans."""
    flush_every: int = 10
    traced_dense_s: float | None = None
    """The dense step's GPU busy time an iteration in the run's `--profile` trace (its lowest
    rank's; harness/report/profile_trace.py): its device time measured, where an eager run's
    stage time is its launches'. None without a trace, or one with no kernels (a CPU run)."""
    traced_gemm_s: float | None = None
    """Of traced_dense_s, its GEMM kernels' time (cuBLAS's, by name: GEMM_KERNELS)."""


def _traced_dense_s(path: Path) -> tuple[float | None, float | None]:
    """(the dense step's GPU busy time, its GEMM kernels' time) an iteration in the lowest rank's
    trace; (None, None) without a readable trace or dense kernels (a CPU run)."""
    from harness.report.load import ReportError
    from harness.report.profile_trace import parse, rank_traces, read_events, stage_table

    traces = rank_traces(path)
    if not traces:
        return None, None
    try:
        trace = parse(read_events(traces[min(traces)]))
    except ReportError:
        return None, None
    table = stage_table(trace).set_index("stage")
    busy = float(table["gpu_busy_ms"].get("dense_fwd_bwd", float("nan"))) / 1e3
    if not busy > 0:  # NaN or nothing: no kernels traced
        return None, None
    k = trace.kernels[trace.kernels["stage"] == "dense_fwd_bwd"]
    gemm = k[k["name"].str.contains(GEMM_KERNELS, case=False, regex=True)]
    return busy, float((gemm["end"] - gemm["start"]).sum()) / table.loc["dense_fwd_bwd", "iterations"] / 1e3


def _profiled_as_warmup(run: Run) -> Run:
    """The run with its `--profile` window's iterations counted as warm-up: they time the profiler
    too (the window belongs in the warm-up; the second H100 session's profiled run had it in its
    timed iterations, 3 of 30, and its dense step's mean 0.5 ms long)."""
    window = run.manifest.config.run.profile
    if not window:
        return run
    inside = {k: (df["iteration"] >= window[0]) & (df["iteration"] <= window[1])
              for k, df in (("stages", run.stages), ("iterations", run.iterations), ("subspans", run.subspans))
              if not df.empty}
    return dataclasses.replace(run, **{k: getattr(run, k).assign(warmup=getattr(run, k)["warmup"] | w)
                                       for k, w in inside.items()})


_MEASURED: dict[Path, tuple[tuple, Measured]] = {}
"""measured's answers this process, by folder, each with the folder's files as it read them."""


def _folder_state(path: Path) -> tuple:
    """Every file under `path`: its name, size and modification time."""
    stats = [(p, p.stat()) for p in sorted(path.rglob("*")) if p.is_file()]
    return tuple((str(p.relative_to(path)), st.st_size, st.st_mtime_ns) for p, st in stats)


def measured(path: Path | str) -> Measured:
    """A run folder's figures (`_measured`), read once a process while its files stay as they
    were: a calibration and the projection after it ask for the same runs again, and reading one
    is a third of a second to a second (2026-12-07). Callers share the answer; none changes it.
    Kept by the folder's real path, answered under the name it was asked by (a link's)."""
    folder = Path(path).resolve()
    state = _folder_state(folder)
    kept = _MEASURED.get(folder)
    if kept is None or kept[0] != state or kept[1].name != Path(path).name:
        kept = _MEASURED[folder] = (state, _measured(Path(path)))
    return kept[1]


def _measured(path: Path) -> Measured:
    run = _profiled_as_warmup(load_run(path))
    m = run.manifest
    means = critical_stage_means(run).mean(numeric_only=True)
    summ = iteration_summary(run)
    stage_s = {s: float(means.get(s, 0.0)) / 1e3 for s in STAGES}
    work = work_of(m.config, m.plan, world_size=m.world_size, ranks_per_node=m.config.run.gpus_per_node)
    return Measured(run=run, stage_s=stage_s, between_s=float(summ["between_ms_mean"]) / 1e3,
                    period_s=float(summ["period_ms_mean"]) / 1e3, work=work, name=Path(path).name,
                    drawn_s=_between_part_s(run, "next_batch"), flushed_s=_between_part_s(run, "flush_records"),
                    flush_every=m.config.run.flush_every,
                    **dict(zip(("traced_dense_s", "traced_gemm_s"), _traced_dense_s(Path(path)))))


def pooled(runs: list[Measured]) -> Measured:
    """Runs of one configuration as one: each figure their mean (one run's period on a shared host
    moves by a fifth from run to run; docs/projection.md)."""
    if len(runs) == 1:
        return runs[0]
    first, n = runs[0], len(runs)
    drawn, flushed = [m.drawn_s for m in runs], [m.flushed_s for m in runs]
    traced = [m.traced_dense_s for m in runs if m.traced_dense_s is not None]
    gemm = [m.traced_gemm_s for m in runs if m.traced_gemm_s is not None]
    return Measured(run=first.run, stage_s={s: sum(m.stage_s[s] for m in runs) / n for s in first.stage_s},
                    between_s=sum(m.between_s for m in runs) / n, period_s=sum(m.period_s for m in runs) / n,
                    work=first.work, name=f"{'+'.join(m.name for m in runs)} (pooled)",
                    drawn_s=None if None in drawn else sum(drawn) / n,
                    flushed_s=None if None in flushed else sum(flushed) / n, flush_every=first.flush_every,
                    traced_dense_s=sum(traced) / len(traced) if traced else None,
                    traced_gemm_s=sum(gemm) / len(gemm) if gemm else None)


def by_config(runs: list[Measured]) -> list[Measured]:
    """The runs pooled by configuration, in the order each configuration first comes."""
    groups: list[list[Measured]] = []
    for m in runs:
        same = next((g for g in groups if g[0].run.manifest.config == m.run.manifest.config), None)
        if same is None:
            groups.append([m])
        else:
            same.append(m)
    return [pooled(g) for g in groups]


def _between_part_s(run: Run, name: str) -> float | None:
    """A between-iterations part's mean time an iteration (rank 0's `name` sub-spans over its timed
    iterations: next_batch, flush_records), None where the records have no sub-spans."""
    sub = run.subspans
    if sub is None or len(sub) == 0:
        return None
    its = run.iterations[(~run.iterations["warmup"]) & (run.iterations["rank"] == 0)]
    waits = sub[(~sub["warmup"]) & (sub["rank"] == 0) & (sub["name"] == name)]["duration_ms"]
    return float(waits.sum()) / max(1, len(its)) / 1e3


def probed_run(runs: list[Measured]) -> Measured:
    """The CPU run whose start-up probes a CPU profile takes: the most dense FLOPs a rank."""
    return max((r for r in runs if r.run.manifest.device.startswith("cpu")), key=lambda r: r.work.dense_flops)


def base_profile(runs: list[Measured]) -> Profile:
    """The spec profile of the runs' device: a GPU's by its name (h100, h200; another is refused); on
    a CPU the start-up probes of the run with the most dense FLOPs a rank (its GEMM probe is at the
    largest shape, the steadiest), with the cores that run's rank had."""
    first = runs[0]
    if not first.run.manifest.device.startswith("cpu"):
        try:
            return HARDWARE[gpu_profile_name(first.run.manifest.device)]()
        except ValueError as exc:
            raise ValueError(f"calibrate: {first.name}: {exc}") from None
    m = probed_run(runs)
    r0, local = m.run.manifest.ranks[0], m.run.manifest.config.run.gpus_per_node
    if r0.threads > 1:  # threads_per_rank gave each rank cores // local of them
        cores, how = r0.threads * local, f"probe: {m.name}: {local} rank(s) x {r0.threads} threads"
    else:
        cores, how = float(os.cpu_count() or 1), f"this host's os.cpu_count() ({m.name} ran 1 thread a rank)"
    return cpu(r0.gemm_gflops, r0.copy_gbps, source=f"probe: {m.name} rank 0", cores=cores,
               rank_cores=rank_cores(cores, local), cores_source=how)


def _kernels(m: Measured, profile: Profile):
    cfg = m.run.manifest.config
    flags = effective_flags(cfg, profile, m.work)
    return stage_kernels(cfg, groups=m.work.groups, params=m.work.params, world_size=m.work.world_size,
                         flags=flags, **dense_impl(m.run.manifest.optimizations)), flags


def _work(m: Measured) -> Work:
    """The run's work with its gradients' cat in the stage its recorded path ran it (work.gathered)."""
    return gathered(m.work, dense_impl(m.run.manifest.optimizations)["gather"])


def _set_launch(runs: list[Measured], p: Profile) -> None:
    best = None
    for m in runs:
        k, flags = _kernels(m, p)
        t = m.stage_s["dense_fwd_bwd"]
        roof = dense_roof_s(_work(m), p, dense_precision(m.run.manifest.config))
        if flags["cuda_graphs"] or t <= 0 or roof / t >= ROOF_SHARE:
            continue
        if best is None or roof / t < best[0]:
            best = (roof / t, m, (t - (0 if p.async_device else roof)) / k.dense_fwd_bwd)
    if best:
        p.set("launch_us", best[2] * 1e6, "us", f"calibrated: {best[1].name} dense_fwd_bwd",
              f"its time over its {_kernels(best[1], p)[0].dense_fwd_bwd} kernels (spec roofline {best[0]:.0%} of it)")


def _set_mem_eff(runs: list[Measured], p: Profile) -> None:
    """dense_mem_eff from the traced run with the most dense FLOPs: the dense step's bytes at HBM
    speed over its kernels' time besides the GEMMs' (project.dense_device_s)."""
    traced = [m for m in runs if m.traced_gemm_s and m.traced_dense_s and m.traced_dense_s > m.traced_gemm_s]
    if not p.async_device or not traced:
        return
    m = max(traced, key=lambda m: m.work.dense_flops)
    p.set("dense_mem_eff", _work(m).dense_bytes / (p.value("hbm_gbps") * 1e9) / (m.traced_dense_s - m.traced_gemm_s),
          "of HBM", f"calibrated: {m.name} --profile trace: dense_fwd_bwd's kernels besides its GEMMs",
          "the dense step's bytes at HBM speed over those kernels' time")


def _set_dense_eff(runs: list[Measured], p: Profile) -> None:
    """dense_eff_<precision>: the roofline over the device time (module docstring); where a trace
    split the dense step's kernels (dense_mem_eff), its GEMMs' part of each: the FLOPs at peak over
    the trace's GEMM time, or over a device-bound run's time less its bytes at dense_mem_eff."""
    launch, hbm = p.value("launch_us") * 1e-6, p.value("hbm_gbps") * 1e9
    split = "dense_mem_eff" in p.figures
    best: dict[str, tuple] = {}
    for m in runs:
        k, flags = _kernels(m, p)
        prec = dense_precision(m.run.manifest.config)
        t = m.stage_s["dense_fwd_bwd"]
        w = _work(m)
        mem = w.dense_bytes / (hbm * p.value("dense_mem_eff")) if split else 0.0
        roof = w.dense_flops / peak_flops(p, prec) if split else dense_roof_s(w, p, prec)
        launches = k.dense_fwd_bwd * launch
        if p.async_device:
            device_bound = flags["cuda_graphs"] or launches < LAUNCH_SHARE * t
            dev = t - mem
        else:
            device_bound, dev = t - launches > 0.2 * t, t - launches
        candidates = [(roof / dev, m, "dense_fwd_bwd" + (" less its bytes at dense_mem_eff" if split else ""))
                      ] if device_bound and dev > 0 else []
        if p.async_device and m.traced_dense_s:  # measured on the device, whatever bounds the stage
            traced, what = ((m.traced_gemm_s, "GEMM kernels' time") if split and m.traced_gemm_s
                            else (m.traced_dense_s, "GPU busy time"))
            candidates.append((roof / traced, m, f"--profile trace: dense_fwd_bwd's {what}"))
        for c in candidates:
            if prec not in best or c[0] > best[prec][0]:
                best[prec] = c
    for prec, (eff, m, what) in best.items():
        p.set(f"dense_eff_{prec}", eff, "of peak", f"calibrated: {m.name} {what}",
              f"{prec} {'GEMM FLOPs at peak' if split else 'roofline'} over the measured device time"
              + (" (above 1: the peak under-measured)" if eff > 1 else ""))


def _set_bandwidth_effs(runs: list[Measured], p: Profile) -> None:
    hbm, launch = p.value("hbm_gbps") * 1e9, p.value("launch_us") * 1e-6
    for key, stages, nbytes in (("lookup_eff", ("emb_bwd",), lambda w: float(w.lookup_bwd.max())),
                                ("update_eff", ("dense_update",), lambda w: w.update_bytes)):
        best = None
        for m in runs:
            # On a CPU the host runs its ops' launches too: what is left is the memory traffic.
            k = _kernels(m, p)[0]
            t = sum(m.stage_s[s] - (0.0 if p.async_device else k.of(s) * launch) for s in stages)
            n = nbytes(_work(m))
            if t > 0 and n > 0:
                eff = n / hbm / t
                if best is None or eff > best[0]:
                    best = (eff, m)
        if best:
            p.set(key, best[0], "of HBM" if p.async_device else "of copy",
                  f"calibrated: {best[1].name} {'+'.join(stages)}", "bytes at the spec bandwidth over the measured time")


def _pair(runs: list[Measured]) -> Measured | None:
    """The run beside the first that identifies a per-sample host time: the same device and another
    local batch, of the first's model where one is (None when all have the first's batch); of
    those, the batch furthest from the first's."""
    first = runs[0]
    same = [r for r in runs[1:] if r.run.manifest.device == first.run.manifest.device
            and r.work.local_batch != first.work.local_batch]
    own = [r for r in same if _model(r) == _model(first)]
    return max(own or same, key=lambda r: abs(r.work.local_batch - first.work.local_batch), default=None)


def _model(m: Measured):
    return m.run.manifest.config.model


def _split(t1: float, b1: int, t2: float | None, b2: int | None) -> tuple[float, float]:
    """(fixed, per sample) through (b1, t1) and (b2, t2); all fixed without a second run. The fixed
    part may come out below zero (Calibration.host clips the sum at zero): a host time that grows
    with the batch and is nothing below some batch. The part a sample may too: a time that shrinks
    as the batch grows (measured here: tiny's emb_bwd, 0.40 ms at 96 samples, 0.73 at 24), held at
    the calibration's ends beyond them (Calibration.batches)."""
    if t2 is None or b2 is None:
        return max(0.0, t1), 0.0
    per = (t2 - t1) / (b2 - b1)
    return t1 - per * b1, per


def host_fixed(runs: list[Measured], p: Profile) -> Calibration:
    """Per stage, the host time the timeline leaves unexplained on the first run (and its pair, for
    the per-sample part), found by iterating the timeline on their own configurations."""
    first, second = runs[0], _pair(runs)
    on_device, block = _drawn(first)
    cal = Calibration(drawn_on_device=on_device, draw_s=draw_launches_s(p, on_device, block))
    used = [first] + ([second] if second else [])
    names = " and ".join(m.name for m in used)
    b = [m.work.local_batch for m in used]
    cal.batches = tuple(b) if second else ()
    t2, b2 = (second.between_s - (second.flushed_s or 0.0), b[1]) if second else (None, None)
    if first.flushed_s is not None:  # a flush's cost, projected at the projected run's --flush-every
        cal.flush_s = first.flushed_s * first.flush_every
        cal.sources["flush_s"] = (f"calibrated: {first.name} flush_records parts, a flush every {first.flush_every} "
                                  "iterations")
        first = dataclasses.replace(first, between_s=first.between_s - first.flushed_s)
    if first.drawn_s is not None and second is not None and second.drawn_s is not None:
        # the batch wait: a fixed part and a part a sample through both runs; the rest (flushes) fixed
        drawn_fixed, cal.between_per_sample_s = _split(first.drawn_s, b[0], second.drawn_s, b[1])
        cal.between_s = max(0.0, first.between_s - first.drawn_s) + drawn_fixed
        cal.sources["between_s"] = (f"calibrated: {names} between_iterations means, their next_batch parts a fixed "
                                    "part and a part a sample")
    elif first.drawn_s is not None:  # the batch wait grows with the batch, the rest (flushes) does not
        cal.between_s = max(0.0, first.between_s - first.drawn_s)
        cal.between_per_sample_s = first.drawn_s / b[0]
        cal.sources["between_s"] = f"calibrated: {first.name} between_iterations mean, its next_batch part a sample"
    elif second is None:  # records before the sub-spans: the gap was the next batch drawn on the host
        cal.between_per_sample_s = first.between_s / b[0]
        cal.sources["between_s"] = f"calibrated: {first.name} between_iterations mean (older records: the batch drawn)"
    else:
        cal.between_s, cal.between_per_sample_s = _split(first.between_s, b[0], t2, b2)
        cal.sources["between_s"] = f"calibrated: {names} between_iterations mean"
    resid = [{s: 0.0 for s in STAGES} for _ in used]
    # On a CPU the host runs each stage itself: a stage that took less than its ops at the dense
    # step's per-op cost gets the difference back (down to no launch time at all).
    cal.rest_offsets_launches = not p.async_device
    launch = p.value("launch_us") * 1e-6
    floors = [{s: 0.0 if p.async_device else -_kernels(m, p)[0].of(s) * launch for s in STAGES} for m in used]
    for _ in range(FIXED_PASSES):
        for i, m in enumerate(used):
            turns = cpu_share(p, m.work)[1]
            got = project_run(m, p, cal).stage_ms("mean")
            for s in STAGES:
                resid[i][s] = max(floors[i][s], resid[i][s] + (m.stage_s[s] - got[s] / 1e3) / turns)
        for s in STAGES:
            t2 = resid[1][s] if second else None
            cal.host_fixed_s[s], cal.host_per_sample_s[s] = _split(resid[0][s], b[0], t2, b2)
    for s in STAGES:
        cal.sources[f"host_fixed_{s}"] = f"calibrated: {names} {s} (host time beyond its launches)"
    _set_drains(first, p, cal)
    return cal


def _drawn(m: Measured) -> tuple[bool, int]:
    """(drawn on the GPU, batches a draw) as the run's manifest recorded them."""
    ahead = m.run.manifest.optimizations.batches_ahead
    return bool(ahead.on_device), int(ahead.draw_block)


def project_run(m: Measured, p: Profile, cal: Calibration):
    """A measured run's configuration projected as it ran: with the dense kernel choices and the
    batches' draw place its manifest recorded (today's code may choose otherwise for the same
    config)."""
    return project(m.run.manifest.config, m.work, p, cal, dense=dense_impl(m.run.manifest.optimizations),
                   drawn=_drawn(m))


def _set_drains(first: Measured, p: Profile, cal: Calibration) -> None:
    """Whether the host waited for the device before its between-iterations work: the timeline run
    both ways on the first run's own configuration, the one that reproduces its period clearly
    better (by DRAIN_MARGIN) taken; a launch-bound run cannot tell them apart: no wait."""
    if not p.async_device:
        return
    err = {}
    for drains in (False, True):
        cal.between_drains = drains
        err[drains] = abs(project_run(first, p, cal).period_ms / (first.period_s * 1e3) - 1)
    cal.between_drains = err[True] + DRAIN_MARGIN < err[False]
    cal.sources["between_drains"] = (f"calibrated: {first.name} period reproduced within {err[True]:.0%} with the "
                                     f"wait, {err[False]:.0%} without")


def calibrate(paths: list[Path | str]) -> tuple[Profile, Calibration, list[Measured]]:
    """The profile and calibration the runs at `paths` set (the first run's device picks the profile);
    runs of the same configuration are pooled (`by_config`)."""
    given = [measured(p) for p in paths]
    if not given:
        raise ValueError("calibrate: give at least one run folder")
    devices = {m.run.manifest.device for m in given}
    if len(devices) > 1:  # each figure would be a mean of two machines', or one's taken for the other's
        raise ValueError(f"calibrate: the runs ran on {len(devices)} devices ({', '.join(sorted(devices))}); "
                         "give runs of one")
    runs = by_config(given)
    p = base_profile(runs)
    _set_launch(runs, p)
    _set_mem_eff(runs, p)
    _set_dense_eff(runs, p)
    _set_bandwidth_effs(runs, p)
    cal = host_fixed(runs, p)
    for model in dict.fromkeys(_model(m) for m in runs[1:]):
        if model != _model(runs[0]):  # each model's host time from its own runs first
            cal.models[model] = host_fixed([m for m in runs if _model(m) == model] +
                                           [m for m in runs if _model(m) != model], p)
    return p, cal, runs
