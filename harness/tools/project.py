"""`make project`: what a configuration would take on hardware it has not run on (issue 46).

python -m harness.tools.project [--preset mlperf] [--nodes 16] [--gpus-per-node 8] [--hardware h100]
    [--calibrate run,...] [--plans harness,torchrec] [--opts all | any bench option] [--out reports/projection-...]

Calibrated on the run folders given (default for h100 and h200: the fifth H100 session's gpu-bench
runs in tests/data/h100-runs-5/, today's code with its batches drawn on the GPU: the bf16 defaults
at 8192 samples (three runs, pooled) and 2048, the profiled defaults (their trace) and
--cuda-graphs, as gpu-bench's own 16 x 8 step takes them; for cpu: tiny and small at one rank of a 2-core VM,
each at its batch and a quarter of it, in tests/data/cpu-runs-2core/), it projects the configuration, its baseline (no
flag), each flag alone and all flags (harness/projection/), and writes a report marked projected.
Runs of one GPU project another (--hardware): its spec figures, their calibrated ones.
With --plans it also projects each sharding plan named (this harness's planner's, TorchRec's
EmbeddingShardingPlanner's: harness/tools/plan_compare.py) at baseline and all flags.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import logging
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.launch.options import add_config_options, config_from_args
from harness.launch.planning import hardware_profile, make_plan
from harness.names import OPTIMIZATION_FLAGS, PRESET_NAMES
from harness.projection import render
from harness.projection.calibrate import calibrate, probed_run
from harness.projection.hardware import retarget, set_gloo, set_thread_gain
from harness.projection.probe import dense_threads, gloo_collectives
from harness.projection.project import project
from harness.projection.work import work_of
from harness.tools.plan_compare import torchrec_plan

ROOT = Path(__file__).resolve().parents[2]
H100_RUNS = tuple(f"tests/data/h100-runs-5/{run}" for run in (
    *(f"20261127-191817-compare-small-1x1-d72a-r{k}-harness" for k in range(3)), "gpu-bench-20261127-191643-quarter",
    "gpu-bench-20261127-191643-profiled", "gpu-bench-20261127-191643-cuda_graphs-r0"))
DEFAULT_CALIBRATION = {"h100": H100_RUNS, "h200": H100_RUNS,
                       "cpu": tuple(f"tests/data/cpu-runs-2core/{preset}-1{q}-r{k}" for preset in ("tiny", "small")
                                    for q in ("", "-quarter") for k in (0, 1))}
"""Without --calibrate: the recorded runs of that hardware (the CPU ones are a 2-core VM's, each
preset on one rank at its batch and a quarter of it, twice: calibrate on runs of your own host for
its figures; the report names the runs it used). No H200 has run this harness yet: h200 takes the
H100 runs' efficiencies and host costs, its own data sheet's peaks and bandwidths (hardware.retarget)."""
SEARCH = ("runs", "tests/data/h100-runs-5", "tests/data/h100-runs-4", "tests/data/h100-runs-3", "tests/data/h100-runs-2", "tests/data/h100-runs")
PLANS = ("harness", "torchrec")
"""--plans: this harness's planner (harness/launch/planning.py), TorchRec's EmbeddingShardingPlanner."""


def resolve_run(name: str) -> Path:
    """A run folder by path, or by id under runs/ or the recorded H100 folders."""
    p = Path(name)
    if p.is_dir():
        return p
    for base in SEARCH:
        if (ROOT / base / name).is_dir():
            return ROOT / base / name
    raise ValueError(f"--calibrate: no run folder {name!r} (give a path, or a run id under {', '.join(SEARCH)})")


def with_flags(cfg, flags: dict[str, bool]):
    """The config with these optimization flags set (the others as they are)."""
    return cfg.replace(optimizations=dataclasses.replace(cfg.optimizations, **flags))


def _base_and_every(cfg, work, profile, cal):
    """The baseline (every flag off) and all flags on, projected on `work`."""
    base = project(with_flags(cfg, {f: False for f in OPTIMIZATION_FLAGS}), work, profile, cal,
                   label="baseline (no flag)")
    every = project(with_flags(cfg, {f: True for f in OPTIMIZATION_FLAGS}), work, profile, cal, label="all flags")
    return base, every


def _projections(cfg, work, profile, cal):
    """Baseline, each flag alone, all flags and the config as given, on `work`."""
    off = {f: False for f in OPTIMIZATION_FLAGS}
    base, every = _base_and_every(cfg, work, profile, cal)
    alone = {f: project(with_flags(cfg, {**off, f: True}), work, profile, cal, label=f"+{f}")
             for f in OPTIMIZATION_FLAGS}
    main = project(cfg, work, profile, cal, label="as configured")
    return base, alone, every, main


def torchrec_installed() -> bool:
    """Whether TorchRec's planner can be imported here (--plans torchrec needs it)."""
    return importlib.util.find_spec("torchrec") is not None


def parse_plans(value: str | None) -> list[str] | None:
    """--plans: the names given, in order, each once (None: the default, which needs the world size).
    Raises ValueError naming the valid plans for an unknown one."""
    if value is None:
        return None
    names = list(dict.fromkeys(n.strip() for n in value.split(",")))
    bad = [n for n in names if n not in PLANS]
    if bad:
        raise ValueError(f"--plans: unknown plan {bad[0]!r}; valid plans: {', '.join(PLANS)}")
    if "torchrec" in names and not torchrec_installed():
        raise ValueError("--plans torchrec: torchrec is not installed in this environment")
    return names


def default_plans(world_size: int) -> list[str]:
    """Both planners on several ranks; on one, TorchRec's plan is trivial (every table on rank 0)."""
    return ["harness", "torchrec"] if world_size > 1 and torchrec_installed() else ["harness"]


@contextlib.contextmanager
def _quiet_torchrec():
    """TorchRec's planner logs its stats table and warns; silence both, then restore (tests share the process)."""
    loggers = [logging.getLogger(), logging.getLogger("torchrec")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def plan_of(name: str, cfg, log: Callable[[str], None]) -> tuple:
    """The named planner's plan of the config's tables (TorchRec's with a progress line and its time)."""
    if name == "harness":
        return make_plan(cfg, ranks_per_host=cfg.run.gpus_per_node)[0]
    log(f"TorchRec planning ({cfg.run.nodes} x {cfg.run.gpus_per_node} ranks) ...")
    start = time.perf_counter()
    with _quiet_torchrec():
        plan = torchrec_plan(cfg, cfg.run.nodes, cfg.run.gpus_per_node)
    log(f"TorchRec plan in {time.perf_counter() - start:.1f} s")
    return plan


def _torchrec_failed(exc: Exception) -> bool:
    """Whether `exc` is TorchRec's planner saying no plan fits (its PlannerError)."""
    from torchrec.distributed.planner.types import PlannerError
    return isinstance(exc, PlannerError)


def project_plans(cfg, names: Sequence[str], profile, cal, log: Callable[[str], None],
                  known: dict[str, render.PlanProjection] | None = None) -> list[render.PlanProjection]:
    """Each named plan projected at baseline and all flags (`known`: plans already projected)."""
    out = []
    for name in names:
        if known and name in known:
            out.append(known[name])
            continue
        try:
            plan = plan_of(name, cfg, log)
        except Exception as exc:  # a layout TorchRec finds no plan for costs its section, not the report
            if not _torchrec_failed(exc):
                raise
            log(f"plan {name}: TorchRec found no plan ({str(exc).splitlines()[0]}); left out of the report")
            continue
        work = work_of(cfg, plan, world_size=cfg.run.world_size, ranks_per_node=cfg.run.gpus_per_node)
        out.append(render.PlanProjection(name, plan, work, *_base_and_every(cfg, work, profile, cal)))
    return out


def compares_to_published(cfg, profile) -> bool:
    """The published figures (TorchRec's 7.6 and 3.4 ms, the ~2.3 ms record) are mlperf on H100s:
    set beside a projection of that, not of another preset, GPU or a CPU."""
    return cfg.run.preset == "mlperf" and profile.name == "h100"


def probe_host(profile, cfg, runs, log: Callable[[str], None]) -> None:
    """A CPU layout whose ranks fit on this host: its gloo exchanges as the probe measures them here,
    and one thread's dense step against the calibration rank's threads (harness/projection/probe.py);
    elsewhere the spec figures and assumptions stay, named in the report."""
    if profile.async_device or cfg.run.nodes != 1 or cfg.run.gpus_per_node < 2:
        return
    log(f"probing gloo's collectives between {cfg.run.gpus_per_node} processes on this host ...")
    set_gloo(profile, gloo_collectives(cfg.run.gpus_per_node), cfg.run.gpus_per_node)
    probed = int(profile.value("rank_cores"))
    if probed > 1:
        log(f"probing the dense step on 1 and {probed} threads ...")
        m = probed_run(runs)
        set_thread_gain(profile, dense_threads(m.run.manifest.config.model, m.work.local_batch, probed))


def calibrated(cfg, calibration: list[Path]) -> tuple:
    """calibrate's profile, calibration and runs, the profile that of the config's --hardware
    (hardware.retarget); ValueError where the runs cannot calibrate it."""
    profile, cal, runs = calibrate(calibration)
    return retarget(profile, hardware_profile(cfg)[0]), cal, runs


def run_projection(cfg, calibration: list[Path], out: Path | None = None, *, plans: Sequence[str] = ("harness",),
                   log: Callable[[str], None] = print, calibrated_as: tuple | None = None) -> dict:
    """Calibrate (or take `calibrated`'s answer, calibrated_as), project the config on this
    harness's plan (baseline, each flag, all flags, as given) and each of `plans` (baseline, all
    flags); write the report under `out` if given."""
    profile, cal, runs = calibrated_as or calibrated(cfg, calibration)
    probe_host(profile, cfg, runs, log)
    plan, _ = make_plan(cfg, ranks_per_host=cfg.run.gpus_per_node)
    work = work_of(cfg, plan, world_size=cfg.run.world_size, ranks_per_node=cfg.run.gpus_per_node)
    base, alone, every, main = _projections(cfg, work, profile, cal)
    ours = render.PlanProjection("harness", plan, work, base, every)
    projected = project_plans(cfg, plans, profile, cal, log, known={"harness": ours})
    extra = [f"calibrated on: {', '.join(str(p) for p in calibration)}",
             f"plan: {len(plan)} tables, sharding groups {', '.join(work.groups)}; world size {work.world_size}"]
    for f, p in alone.items():
        extra.append(f"{f} alone: {p.period_ms / base.period_ms:.3f}x the baseline period")
    path = None
    if out is not None:
        path = render.write(out, title=f"{cfg.run.preset} on {cfg.run.nodes} x {cfg.run.gpus_per_node} "
                            f"{profile.name}", base=base, alone=alone, every=every, main=main, profile=profile,
                            cal=cal.of(cfg.model), extra=extra, plans=projected, published=compares_to_published(cfg, profile))
    return dict(base=base, alone=alone, every=every, main=main, profile=profile, cal=cal, path=path, extra=extra,
                plans=projected)


def build_parser() -> argparse.ArgumentParser:
    """make project's options: these and every bench option of the config."""
    parser = argparse.ArgumentParser(prog="harness.tools.project", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=PRESET_NAMES, default="mlperf")
    parser.add_argument("--calibrate", default=None, help="run folders or ids, comma-separated")
    parser.add_argument("--out", type=Path, default=None, help="report folder [reports/projection-<preset>-<N>x<L>]")
    parser.add_argument("--plans", default=None,
                        help=f"sharding plans to project, comma-separated, of {', '.join(PLANS)} "
                             "[harness,torchrec on several ranks, harness on one]")
    add_config_options(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        plans = parse_plans(args.plans)
        cfg = config_from_args(args)
        hardware = hardware_profile(cfg)[0]
        names = args.calibrate.split(",") if args.calibrate else DEFAULT_CALIBRATION.get(hardware, ())
        if not names:
            raise ValueError(f"--calibrate: give run folders for hardware {hardware}")
        calibration = [resolve_run(n) for n in names]
        calibrated_as = calibrated(cfg, calibration)
    except ValueError as exc:
        print(f"make project: {exc}", file=sys.stderr)
        return 2
    out = args.out or ROOT / "reports" / f"projection-{cfg.run.preset}-{cfg.run.nodes}x{cfg.run.gpus_per_node}"
    res = run_projection(cfg, calibration, out, plans=plans or default_plans(cfg.run.world_size),
                         log=lambda line: print(line, flush=True), calibrated_as=calibrated_as)
    base, every, projected = res["base"], res["every"], res["plans"]
    profile = res["profile"]
    published = render.against_published(base, every, profile) if compares_to_published(cfg, profile) else []
    for line in render.findings(base, every, profile) + published + res["extra"]:
        print(line)
    for pp in projected:
        print(render.plan_line(pp))
    for pp in projected[1:]:
        print(render.plan_mechanism(projected[0], pp, profile))
    print(f"report: {res['path']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
