"""gpu-bench's projection steps (issue 46; harness/tools/gpu_bench.py runs them): its own runs
projected from its calibration runs, and the 16 x 8 H100 mlperf job that issue 46 asks about,
calibrated on this bench's runs, beside the published figures."""

from __future__ import annotations

from pathlib import Path

from harness.tools.gpu_bench_plan import CLUSTER, Outcome, Plan


def _harness_runs(outcome: Outcome, step: str) -> list[str]:
    """The harness side's run ids of a compare step (none if it did not run)."""
    return outcome.compares.get(step, {}).get("runs", {}).get("harness", [])


def projection_targets(outcome: Outcome) -> dict[str, list[str]]:
    """label -> the run ids (pooled: one configuration's mean) the projection check projects: each
    flag-round row's runs, the --opts all compare's harness runs and the tiny compare's (one eager
    run's period moved by a fifth on the H100 hosts: each configuration's runs pooled)."""
    small = outcome.plan.get("small", "small")
    out = {name: f["runs"] for name, f in outcome.flags.items() if f.get("runs")}
    if _harness_runs(outcome, f"{small} --opts all"):
        out["--opts all"] = _harness_runs(outcome, f"{small} --opts all")
    if _harness_runs(outcome, "tiny"):
        out["tiny"] = _harness_runs(outcome, "tiny")
    return out


def calibration_runs(outcome: Outcome) -> list[Path]:
    """The runs both projection steps calibrate on: the small defaults compare's harness runs (one
    configuration, pooled: a single eager run's period moved by a fifth on the H100 host), the
    quarter-batch run (with them, host time a sample), the profiled run (its trace: the eager dense
    step's device time) and the first --cuda-graphs run (a device-bound dense step)."""
    folder = Path(outcome.folder)
    ids = [*_harness_runs(outcome, f"{outcome.plan.get('small', 'small')} defaults"), outcome.quarter_run,
           outcome.profiled_run, *outcome.flags.get("+cuda_graphs", {}).get("runs", [])[:1]]
    return [folder / i for i in ids if i and (folder / i / "manifest.json").is_file()]


def run_projection_check(outcome: Outcome, plan: Plan) -> None:
    """Calibrated on calibration_runs, each target's period projected against its measured one
    (issue 46: within 25%)."""
    from harness.projection.calibrate import calibrate, measured, pooled, project_run

    folder = Path(outcome.folder)
    if not _harness_runs(outcome, f"{plan.small} defaults") or not outcome.quarter_run:
        outcome.failures.append("projection check: needs the defaults compare and the quarter-batch run")
        return
    runs = calibration_runs(outcome)
    profile, cal, measured_runs = calibrate(runs)
    if not profile.async_device and plan.gpus > 1:  # a CPU rehearsal: this host's gloo and threads
        from harness.tools.project import probe_host
        probe_host(profile, measured(runs[0]).run.manifest.config, measured_runs, print)
    for label, run_ids in projection_targets(outcome).items():
        m = pooled([measured(folder / r) for r in run_ids])
        proj = project_run(m, profile, cal)
        got, want = proj.period_ms, m.period_s * 1e3
        stages = stage_errors(m, proj)
        outcome.projection[label] = {"runs": run_ids, "measured_ms": want, "projected_ms": got, "error": got / want - 1,
                                     "stages": stages}
        print(f"  projection {label:26s} measured {want:8.3f} ms, projected {got:8.3f} ms ({got / want - 1:+.0%}); "
              f"stages beyond {STAGE_TARGET:.0%}: {missed_stages(stages) or 'none'}", flush=True)


STAGE_TARGET = 0.25
"""Issue 46's bound on a projected stage (and period) against the measured one."""


def stage_errors(m, proj) -> dict[str, dict]:
    """Stage -> its measured and projected mean over ranks (ms), the error and its share of the
    measured period, for the stages the run timed."""
    got = proj.stage_ms("mean")
    period = m.period_s * 1e3
    return {s: {"measured_ms": v * 1e3, "projected_ms": got[s], "error": got[s] / (v * 1e3) - 1,
                "share": v * 1e3 / period} for s, v in m.stage_s.items() if v > 0}


def missed_stages(stages: dict[str, dict]) -> str:
    """The stages beyond STAGE_TARGET, each with its error and share of the period."""
    return ", ".join(f"{s} {e['error']:+.0%} ({e['share']:.1%} of the period)" for s, e in stages.items()
                     if abs(e["error"]) >= STAGE_TARGET)


def run_cluster_projection(outcome: Outcome, plan: Plan) -> None:
    """`make project PRESET=mlperf NODES=16 GPUS_PER_NODE=8 HARDWARE=h100` at the bench's precision,
    calibrated on this bench's GPU runs (an H200's retargeted to the H100: hardware.retarget), its
    report in reports/ and its baseline, all flags and ratio in the table. CPU runs say nothing of
    an H100: a rehearsal skips it."""
    from harness.launch.options import config_from_args
    from harness.tools import project as tool

    if plan.device != "cuda":
        print("  16 x 8 projection: not run (CPU runs do not calibrate an H100)", flush=True)
        return
    runs = calibration_runs(outcome)
    if not runs:
        outcome.failures.append("16 x 8 projection: no defaults run to calibrate on")
        return
    cfg = config_from_args(tool.build_parser().parse_args([*CLUSTER, "--dense-precision", plan.precision]))
    out = Path(outcome.folder) / "reports" / "projection-mlperf-16x8"
    res = tool.run_projection(cfg, runs, out, plans=("harness",), log=lambda line: print(f"  {line}", flush=True))
    base, every = res["base"].period_ms, res["every"].period_ms
    outcome.cluster_projection = {"baseline_ms": base, "all_flags_ms": every, "ratio": base / every,
                                  "calibrated_on": [r.name for r in runs], "report": str(res["path"])}
    print(f"  16 x 8 H100 mlperf, projected: baseline {base:.2f} ms, all flags {every:.2f} ms "
          f"({base / every:.2f}x)", flush=True)
