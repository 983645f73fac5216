"""gpu-bench's projection steps (issue 46; harness/tools/gpu_bench.py runs them): its own runs
projected from its calibration runs, and the 16 x 8 H100 mlperf job that issue 46 asks about,
calibrated on this bench's runs, beside the published figures."""

from __future__ import annotations

from pathlib import Path

from harness.tools.gpu_bench_plan import Outcome, Plan

CLUSTER = ("--preset", "mlperf", "--nodes", "16", "--gpus-per-node", "8", "--hardware", "h100")
"""The job the published figures are of (TorchRec 7.6 and 3.4 ms, the ~2.3 ms record): make project's default."""


def _harness_runs(outcome: Outcome, step: str) -> list[str]:
    """The harness side's run ids of a compare step (none if it did not run)."""
    return outcome.compares.get(step, {}).get("runs", {}).get("harness", [])


def projection_targets(outcome: Outcome) -> dict[str, str]:
    """label -> run id of the runs the projection check projects: each flag's first run alone, the
    --opts all and tiny compares' first harness runs, and the second defaults run (the same config)."""
    small = outcome.plan.get("small", "small")
    out = {name: f["runs"][0] for name, f in outcome.flags.items() if f.get("runs")}
    for step, label in ((f"{small} --opts all", "--opts all"), ("tiny", "tiny")):
        if _harness_runs(outcome, step):
            out[label] = _harness_runs(outcome, step)[0]
    defaults = _harness_runs(outcome, f"{small} defaults")
    if len(defaults) > 1:
        out["defaults (another run)"] = defaults[1]
    return out


def run_projection_check(outcome: Outcome, plan: Plan) -> None:
    """Calibrated on the first defaults run, the quarter-batch run and the profiled run (its trace:
    the dense step's device time), each target's period projected against its measured one (issue
    46: within 25%)."""
    from harness.projection.calibrate import calibrate, measured, project_run

    folder = Path(outcome.folder)
    defaults = _harness_runs(outcome, f"{plan.small} defaults")
    if not defaults or not outcome.quarter_run:
        outcome.failures.append("projection check: needs the defaults compare and the quarter-batch run")
        return
    profiled = [p for p in [folder / (outcome.profiled_run or "-")] if (p / "manifest.json").is_file()]
    profile, cal, runs = calibrate([folder / defaults[0], folder / outcome.quarter_run, *profiled])
    if not profile.async_device and plan.gpus > 1:  # a CPU rehearsal: this host's gloo and threads
        from harness.tools.project import probe_host
        probe_host(profile, measured(folder / defaults[0]).run.manifest.config, runs, print)
    for label, run_id in projection_targets(outcome).items():
        m = measured(folder / run_id)
        got = project_run(m, profile, cal).period_ms
        want = m.period_s * 1e3
        outcome.projection[label] = {"run": run_id, "measured_ms": want, "projected_ms": got, "error": got / want - 1}
        print(f"  projection {label:26s} measured {want:8.3f} ms, projected {got:8.3f} ms ({got / want - 1:+.0%})",
              flush=True)


def cluster_calibration(outcome: Outcome) -> list[Path]:
    """This bench's runs that calibrate the 16 x 8 projection, as make project's default takes the
    recorded H100 runs: the first defaults run, the quarter-batch run, the profiled run (its trace:
    the eager dense step's device time) and the first --cuda-graphs run (the graphed one)."""
    folder = Path(outcome.folder)
    ids = [*_harness_runs(outcome, f"{outcome.plan.get('small', 'small')} defaults")[:1], outcome.quarter_run,
           outcome.profiled_run, *outcome.flags.get("+cuda_graphs", {}).get("runs", [])[:1]]
    return [folder / i for i in ids if i and (folder / i / "manifest.json").is_file()]


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
    runs = cluster_calibration(outcome)
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
