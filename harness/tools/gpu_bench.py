"""`make gpu-bench`: the first thing to run on a new GPU host, one command, a few minutes.

On whatever GPUs the host has (one rank a GPU, one node), in this order:
1. the battery (`make gpu-check`: every test marked cuda, in a process of its own), a verdict a check;
2. the batches the GPU draws (harness/data/device_draw.py, the default on CUDA) against numpy's, in
   a process of its own (gpu_bench_draw.py): where they differ or cannot be drawn, every run below
   draws on the host (--draw-on host) and the table says why;
   then `compare` on `small` at MLPerf's per-GPU batch (8192 a GPU), defaults, then `--opts all`;
3. each optimization flag alone against the defaults, runs interleaved (defaults, +flag, ... each
   round), the period ratio of each flag with a bootstrap 95% CI (a flag that cannot take effect
   on this device and GPU count whatever the plan is not run: its row says why); in the same
   rounds --opts all (so that it and the best flag are ratios over the same defaults runs), the
   harness's own dense kernels taken away, the all-bf16 dense step alone and with --opts all (the
   fastest configuration), and the host's batch threads instead of the GPU's draw (--draw-on
   host) alone and with --opts all, and small's tables in the mlperf job's two sharding groups
   (gpu_bench_plan.flag_configs; each row's mean period and GPU idle between iterations beside
   its ratio; a row that adds one change to another row is its ratio over that row's runs,
   gpu_bench_plan.AGAINST); then, where the runs were in-process, one run of the defaults
   spawned against them;
4. `compare` on `tiny` (the latency-bound regime: launch and input-distribution overheads);
5. one run of the defaults at a quarter of the batch;
6. one run of the defaults with a --profile window in its warm-up: host against device per stage
   (the last runs: in-process, none after them shares the process with the profiler), then the
   same at a quarter of the batch, on tiny and with every activation in bf16;
7. the projection check (issue 46): the projection (harness/projection/) calibrated on the
   defaults at both batch sizes (the host time a sample needs two; the compare's runs pooled), the
   profiled run's trace and the first --cuda-graphs run, each other configuration's period (its
   runs pooled) projected against what it measured;
8. the 16 x 8 H100 mlperf job projected, calibrated on this bench's runs (make project's default
   calibrated on today's code), beside the published figures (harness/tools/gpu_bench_projection.py).
On one GPU each run's rank runs in this process (bench --in-process: no interpreter, torch and CUDA
start a run; --spawn-each-run to start a process each), and after a run that fails so, every later
one spawns. Everything goes into one folder, runs/gpu-bench-<stamp>/ (run folders, compares/, reports/,
battery.txt, gpu-bench.json, summary.md), and one summary table is printed last, with each run's
start-up by phase. Every figure is the period between iteration starts, never the timed window alone.

--budget-s N (a device lease's seconds) stops the flag rounds after the first where another
round and the steps after it would not fit at the pace of the rounds so far; the table says how
many ran and why.

Without CUDA it says so in one line and exits 0. `--device cpu` runs the same plan on CPU ranks
(with --preset-small tiny: a rehearsal of the plan, not a measurement of a GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from harness.names import OPTIMIZATION_FLAGS
from harness.tools.gpu_bench_child import in_child, run_battery
from harness.tools.gpu_bench_plan import AGAINST, Outcome, Plan, flag_configs, in_process_choice, runs_sharding_layouts
from harness.tools.gpu_bench_projection import run_cluster_projection, run_projection_check
from harness.tools.gpu_bench_table import summary


def _cli(argv: list[str]) -> tuple[int, str]:
    """`python -m harness ...` in this process, its screen output kept (a line a run is printed instead)."""
    from harness.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


def run_bench(outcome: Outcome, plan: Plan, argv: list[str], run_id: str) -> tuple[int, str]:
    """`bench argv --run-id run_id` into the folder: (exit code, the run id that ran). A run that
    fails in-process is run again spawned, and every later run spawns (a failed CUDA run can leave
    this process's device unusable): said on screen and in launch_notes."""
    folder = str(outcome.folder)
    code, _ = _cli(["bench", *argv, "--run-id", run_id, "--runs-root", folder])
    if code == 0 or "--in-process" not in argv:
        return code, run_id
    _spawn_from_now(outcome, plan, f"{run_id} failed in-process (exit {code})")
    again = f"{run_id}-spawned"
    code, _ = _cli(["bench", *spawned(argv), "--run-id", again, "--runs-root", folder])
    outcome.launch_notes.append(f"{again}: spawned, exited {code}")
    return code, again


def spawned(argv: list[str]) -> list[str]:
    """A run's options for a process of its own: spawned, whatever the device (a CPU rehearsal's too)."""
    return [a for a in argv if a != "--in-process"] + ["--start-method", "spawn"]


def _spawn_from_now(outcome: Outcome, plan: Plan, why: str) -> None:
    plan.in_process = False
    outcome.launch_notes.append(f"{why}: every later run spawns a process")
    print(f"gpu-bench: {why}; every later run spawns a process", flush=True)


def run_compare(outcome: Outcome, plan: Plan, step: str, preset: str, batch_per_gpu: int | None,
                extra: list[str]) -> None:
    folder = Path(outcome.folder)
    argv = ["compare", *plan.common(preset, batch_per_gpu), "--repeats", str(plan.repeats), *extra,
            "--runs-root", str(folder), "--reports-root", str(folder / "reports")]
    before = set((folder / "compares").glob("*/compare.json"))
    code, _ = _cli(argv)
    found = sorted(set((folder / "compares").glob("*/compare.json")) - before)  # this compare's, if it made one
    data = json.loads(found[-1].read_text()) if found else {}
    if code != 0 and "--in-process" in argv:  # not run again: a compare is several runs
        _spawn_from_now(outcome, plan, f"{step}: compare failed in-process (exit {code})")
    if code != 0 or data.get("ratio") is None:
        outcome.failures.append(f"{step}: compare exited {code} ({data.get('error') or 'no ratio'})")
        return
    runs = [folder / r for r in data["runs"]["harness"]]
    outcome.compares[step] = {"ratio": data["ratio"], "ratio_ci": data["ratio_ci"], "runs": data["runs"],
                              **_harness_side(runs)}
    lo, hi = data["ratio_ci"]
    print(f"{step}: harness/torchrec period {data['ratio']:.3f} (95% CI {lo:.3f}-{hi:.3f})", flush=True)


def _harness_side(run_dirs: list[Path]) -> dict:
    """The harness runs' period and each stage's critical ms (mean over the runs)."""
    from harness.report import api as report
    from harness.report.tables import critical_stage_means

    runs = [report.load_run(d) for d in run_dirs]
    period = sum(report.iteration_summary(r)["period_ms_mean"] for r in runs) / len(runs)
    stages = [critical_stage_means(r, "rank").mean() for r in runs]
    mean = {k: float(sum(s.get(k, float("nan")) for s in stages) / len(stages)) for k in stages[0].index}
    # Issue 45's shares of the period: the GPU idle between iterations, the input dist left exposed.
    shares = {k: mean.get(k, float("nan")) / period for k in ("between_iterations", "input_dist")}
    return {"period_ms": period, "stage_ms": mean, "share_of_period": shares}


def run_flags(outcome: Outcome, plan: Plan) -> None:
    """Defaults and each flag alone, interleaved round by round, then each flag's ratio with its CI."""
    from harness.report import api as report
    from harness.report.compare import compare_runs

    folder = Path(outcome.folder)
    skipped = inactive_here(plan)
    for f, why in skipped.items():
        outcome.flags[f"+{f}"] = {"runs": [], "inactive": why, "skipped": True}
        print(f"  +{f:25s} not run: it cannot take effect here ({why})", flush=True)
    configs = flag_configs(plan, skipped)
    runs: dict[str, list[str]] = {name: [] for name in configs}
    periods: dict[str, list[float]] = {name: [] for name in configs}
    start, before = time.monotonic(), sum(outcome.seconds.values())
    for k in range(plan.repeats):
        took, why = time.monotonic() - start, None
        if k and plan.budget_s is not None:
            why = round_over_budget(budget_s=plan.budget_s, elapsed_s=before + took, round_s=took / k,
                                    runs_a_round=len(configs), runs_after=runs_after_flags(plan))
        if why:
            outcome.flag_rounds = {"ran": k, "asked": plan.repeats, "why": why}
            print(f"  flag rounds: {k} of {plan.repeats}: {why}", flush=True)
            break
        for name, extra in configs.items():
            code, run_id = run_bench(outcome, plan, [*plan.common(plan.small, plan.batch_per_gpu), *extra],
                                     f"{folder.name}-{name.strip('+')}-r{k}")
            if code != 0:
                outcome.failures.append(f"flags: {name} run {k} exited {code} ({folder / run_id})")
                continue
            runs[name].append(run_id)
            period = report.iteration_summary(report.load_run(folder / run_id))["period_ms_mean"]
            periods[name].append(period)
            print(f"  {name:26s} r{k}: period {period:.3f} ms", flush=True)
            outcome.save()  # the archive holds each run as it ends: a call cut off mid-step keeps them
    outcome.defaults_runs = runs["defaults"]
    for name in list(configs)[1:]:
        against = AGAINST.get(name) if runs.get(AGAINST.get(name)) else "defaults"
        if not runs[name] or not runs[against]:
            continue
        cmp = compare_runs({against: [report.load_run(folder / r) for r in runs[against]],
                            name: [report.load_run(folder / r) for r in runs[name]]})
        outcome.flags[name] = {"runs": runs[name], "against": against, "ratio": cmp.ratio, "ratio_ci": list(cmp.ratio_ci),
                               "period_ms": sum(periods[name]) / len(periods[name]),
                               "share_of_period": _harness_side([folder / r for r in runs[name]])["share_of_period"],
                               "inactive": _inactive(folder / runs[name][0], name.strip("+"))}


def run_draw_check(outcome: Outcome, plan: Plan) -> None:
    """--draw-on device's batches against numpy's, in a process of its own (gpu_bench_draw.py)."""
    from harness.tools.gpu_bench_draw import check_line, draw_check

    if plan.device != "cuda":
        return
    outcome.draw_check = in_child(draw_check, plan.small, plan.batch_per_gpu)
    line = check_line(outcome.draw_check)
    print(f"device draw: {line}", flush=True)
    if outcome.draw_check.get("error") or any(outcome.draw_check["differ"].values()):
        # Not the stream every engine and rank must see: every run draws on the host instead.
        plan.draw_on_host = outcome.plan["draw_on_host"] = f"the device draw's check {line}"
        outcome.launch_notes.append(f"every run draws its batches on the host (--draw-on host): {plan.draw_on_host}")


def runs_after_flags(plan: Plan) -> int:
    """Runs of the steps after the flag rounds, in flag-run equivalents: tiny's compare (both
    engines), the quarter-batch run, the profiled runs (three, one more at bf16 and one more of small
    on CUDA), and the spawned check (start-up and all)."""
    return (2 * plan.repeats + 4 + (plan.precision == "bf16") + runs_sharding_layouts(plan)
            + (3 if plan.in_process else 0))


def round_over_budget(*, budget_s: float, elapsed_s: float, round_s: float, runs_a_round: int,
                      runs_after: int) -> str | None:
    """Why another flag round does not fit in budget_s, with the runs after it at the rounds' mean
    a run; None where it fits."""
    after = round_s / runs_a_round * runs_after
    end = elapsed_s + round_s + after
    if end <= budget_s:
        return None
    return (f"another round ({round_s:.0f} s) and the {runs_after} runs' worth after it ({after:.0f} s) would end "
            f"at {end:.0f} s, past the {budget_s:.0f} s budget")


def run_spawned_check(outcome: Outcome, plan: Plan) -> None:
    """One run of the defaults in a process of its own, against the flag rounds' in-process ones:
    what a spawned run costs beside its iterations (the start-up row) and whether both ways measure
    the same period (the ratio's CI should hold 1)."""
    from harness.report import api as report
    from harness.report.compare import compare_runs

    if not plan.in_process or not outcome.defaults_runs:
        return
    folder = Path(outcome.folder)
    argv = spawned(plan.common(plan.small, plan.batch_per_gpu))
    code, run_id = run_bench(outcome, plan, argv, f"{folder.name}-defaults-spawned")
    if code != 0:
        outcome.failures.append(f"spawned check: exited {code} ({folder / run_id})")
        return
    cmp = compare_runs({"in-process": [report.load_run(folder / r) for r in outcome.defaults_runs],
                        "spawned": [report.load_run(folder / run_id)]})
    outcome.spawned_check = {"run": run_id, "ratio": cmp.ratio, "ratio_ci": list(cmp.ratio_ci)}
    print(f"spawned / in-process defaults: period {cmp.ratio:.3f} (95% CI {cmp.ratio_ci[0]:.3f}-{cmp.ratio_ci[1]:.3f})",
          flush=True)


def run_profiled(outcome: Outcome, plan: Plan) -> None:
    """One run of the defaults with a --profile window in its warm-up: its trace says, per stage,
    launch-bound, kernel-bound or waiting for the host (measured, not guessed); then the same at a
    quarter of the batch, on tiny, and with every activation in bf16 (bf16-pure)."""
    folder = Path(outcome.folder)
    common = plan.common(plan.small, plan.batch_per_gpu)
    common[common.index("--warmup") + 1] = str(max(plan.warmup, 8))
    code, run_id = run_bench(outcome, plan, [*common, "--profile", "5:7"], f"{folder.name}-profiled")
    outcome.profiled_run = run_id
    if code != 0:
        outcome.failures.append(f"profiled run exited {code} ({folder / run_id})")
        return
    outcome.profiled = _finding(folder / run_id)
    print(f"profiled: {outcome.profiled}", flush=True)
    # The same window at a quarter of the batch and on tiny: where their stages' time goes (device
    # or host), which the projection cannot tell from small's runs alone (docs/projection.md); and
    # the all-bf16 dense step's kernels, which no autocast run's efficiency predicts.
    quarter = plan.common(plan.small, max(1, plan.batch_per_gpu // 4))
    quarter[quarter.index("--warmup") + 1] = str(max(plan.warmup, 8))
    tiny = plan.common("tiny", None)
    tiny[tiny.index("--warmup") + 1] = str(max(plan.warmup, 8))
    pure = [*common, "--dense-precision", "bf16-pure"] if plan.precision == "bf16" else None
    # Every table data-parallel: tiny's code path at small's size, its ops and host time a stage
    # on the same machine as the table-wise defaults' (a host cost a code path; docs/projection.md).
    dp = [*common, "--sharding", "data_parallel"] if runs_sharding_layouts(plan) else None
    for label, argv in (("quarter", quarter), ("tiny", tiny), ("bf16_pure", pure), ("all_data_parallel", dp)):
        if argv is None:
            continue
        code, run_id = run_bench(outcome, plan, [*argv, "--profile", "5:7"], f"{folder.name}-profiled-{label}")
        if code != 0:
            outcome.failures.append(f"profiled {label} run exited {code} ({folder / run_id})")
            continue
        outcome.profiled_more[label] = {"run": run_id, "finding": _finding(folder / run_id)}
        print(f"profiled {label}: {outcome.profiled_more[label]['finding']}", flush=True)


def _finding(run_dir: Path) -> str:
    """A profiled run's host-against-device finding (harness/report/profile_trace.py)."""
    from harness.report.profile_trace import read_run

    profiles = read_run(run_dir)
    found = profiles.findings() or [f"rank {r}: {why}" for r, why in profiles.problems.items()]
    return found[0] if found else "no trace was written"


def run_quarter(outcome: Outcome, plan: Plan) -> None:
    """The defaults at a quarter of the batch: with the full batch's run, the projection's
    calibration tells host time that grows with the batch from host time that does not."""
    folder = Path(outcome.folder)
    code, run_id = run_bench(outcome, plan, plan.common(plan.small, max(1, plan.batch_per_gpu // 4)),
                             f"{folder.name}-quarter")
    if code != 0:
        outcome.failures.append(f"quarter-batch run exited {code} ({folder / run_id})")
        return
    outcome.quarter_run = run_id


def inactive_here(plan: Plan) -> dict[str, str]:
    """The plan's flags that cannot take effect on its device and GPU count, with why (none is run)."""
    from harness.run.optimizations import inactive_whatever_the_plan

    return inactive_whatever_the_plan(plan.flags, cuda=plan.device == "cuda", world_size=plan.gpus)


def _inactive(run_dir: Path, flag: str) -> str | None:
    """Why the flag did not take effect in that run (its manifest), or None (a row that is no flag)."""
    flags = json.loads((run_dir / "manifest.json").read_text())["optimizations"]
    return flags["inactive_reasons"].get(flag)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="harness.tools.gpu_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--gpus", type=int, default=None, help="ranks (one a GPU); default: every GPU the host has")
    p.add_argument("--preset-small", default="small", help="the preset of the compare and flag steps (small)")
    p.add_argument("--batch-per-gpu", type=int, default=8192)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=None,
                   help="seconds the whole bench may take: a flag round after the first starts only if it and "
                        "the steps after it fit, at the rounds' pace so far (default: every round)")
    p.add_argument("--flags", default=",".join(OPTIMIZATION_FLAGS), help="the flags run alone (comma-separated)")
    p.add_argument("--no-battery", action="store_true")
    p.add_argument("--spawn-each-run", action="store_true",
                   help="start a process for each run's rank even on one GPU (default there: in this process)")
    p.add_argument("--dense-precision", choices=("fp32", "bf16"), default="bf16",
                   help="every run's dense precision, both engines (default bf16, issue 45's targets)")
    p.add_argument("--archive", type=Path, default=None,
                   help="also keep the folder as this .tar.gz, rewritten after each step (e.g. $OUT/gpu-bench.tgz "
                        "under a device lease that brings back a few files)")
    p.add_argument("--runs-root", type=Path, default=Path("runs"))
    args = p.parse_args(argv)
    unknown = sorted(set(args.flags.split(",")) - set(OPTIMIZATION_FLAGS))
    if unknown:
        p.error(f"--flags: {', '.join(unknown)} not among {', '.join(OPTIMIZATION_FLAGS)}")
    if args.repeats < 1:
        p.error(f"--repeats must be a positive integer, got {args.repeats}")
    if args.budget_s is not None and not args.budget_s > 0:
        p.error(f"--budget-s must be a positive number of seconds, got {args.budget_s}")
    return args


def main(argv: list[str] | None = None, *, cuda_available: bool | None = None) -> int:
    """cuda_available: stands in for torch's answer (tests)."""
    args = parse(argv)
    import torch

    from harness.tools.gpu_check import environment_line

    cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    if args.device == "cuda" and not cuda:
        print(f"gpu-bench: no CUDA device on this machine ({environment_line()}): nothing to run; "
              "run make gpu-bench on a GPU host")
        return 0
    gpus = args.gpus or (torch.cuda.device_count() if args.device == "cuda" else 2)
    gpu_name = torch.cuda.get_device_name(0) if args.device == "cuda" else None
    in_process, spawn_why = in_process_choice(gpus, args.spawn_each_run)
    plan = Plan(device=args.device, gpus=gpus, gpu_name=gpu_name, small=args.preset_small,
                batch_per_gpu=args.batch_per_gpu, iters=args.iters, warmup=args.warmup, repeats=args.repeats, battery=not args.no_battery, flags=tuple(args.flags.split(",")),
                precision=args.dense_precision, in_process=in_process, spawn_why=spawn_why, budget_s=args.budget_s)
    return run(plan, args.runs_root, archive=args.archive)


def run(plan: Plan, runs_root: Path, *, archive: Path | None = None) -> int:
    folder = Path(runs_root) / time.strftime("gpu-bench-%Y%m%d-%H%M%S")
    folder.mkdir(parents=True)
    outcome = Outcome(folder=str(folder), plan=asdict(plan), archive=str(archive) if archive else None,
                      launch_notes=[f"every run spawns a process: {plan.spawn_why}"] if plan.spawn_why else [])
    steps = [("battery", lambda: run_battery(outcome))] if plan.battery and plan.device == "cuda" else []
    steps += [
        ("device draw check", lambda: run_draw_check(outcome, plan)),
        (f"{plan.small} defaults", lambda: run_compare(outcome, plan, f"{plan.small} defaults", plan.small,
                                                      plan.batch_per_gpu, [])),
        (f"{plan.small} --opts all", lambda: run_compare(outcome, plan, f"{plan.small} --opts all", plan.small,
                                                        plan.batch_per_gpu, ["--opts", "all"])),
        ("each flag alone", lambda: run_flags(outcome, plan)),
        ("a spawned run", lambda: run_spawned_check(outcome, plan)),
        ("tiny (latency-bound)", lambda: run_compare(outcome, plan, "tiny", "tiny", None, [])),
        ("quarter-batch run", lambda: run_quarter(outcome, plan)),
        # Last of the runs: in-process, no run after it shares the process with the profiler's CUPTI.
        ("profiled run", lambda: run_profiled(outcome, plan)),
        ("projection check", lambda: run_projection_check(outcome, plan)),
        ("16 x 8 projection", lambda: run_cluster_projection(outcome, plan)),
    ]
    print(f"gpu-bench: {plan.gpus} {plan.device} rank(s), {len(steps)} steps -> {folder}", flush=True)
    start = time.monotonic()
    for name, step in steps:
        t0 = time.monotonic()
        print(f"== {name} (at {t0 - start:.0f} s)", flush=True)
        try:
            step()
        except Exception as exc:  # a step that breaks is reported; the others still run
            outcome.failures.append(f"{name}: {type(exc).__name__}: {exc}")
        outcome.seconds[name] = time.monotonic() - t0
        outcome.save()
    table = summary(outcome)
    (folder / "summary.md").write_text(f"# gpu-bench {folder.name}\n\n```\n{table}\n```\n")
    outcome.save()  # the archive with the summary in it
    print(f"gpu-bench done in {time.monotonic() - start:.0f} s: {folder}\n{table}")
    return 1 if outcome.failures else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
