"""`make project`: what a configuration would take on hardware it has not run on (issue 46).

python -m harness.tools.project [--preset mlperf] [--nodes 16] [--gpus-per-node 8] [--hardware h100]
    [--calibrate run,...] [--opts all | any bench option] [--out reports/projection-...]

Calibrated on the run folders given (default for h100: the second H100 session's bf16 defaults and
--cuda-graphs runs in tests/data/h100-runs-2/), it projects the configuration, its baseline (no
flag), each flag alone and all flags (harness/projection/), and writes a report marked projected.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from harness.launch.options import add_config_options, config_from_args
from harness.launch.planning import make_plan
from harness.names import OPTIMIZATION_FLAGS, PRESET_NAMES
from harness.projection import render
from harness.projection.calibrate import calibrate
from harness.projection.project import project
from harness.projection.work import work_of

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CALIBRATION = {"h100": ("tests/data/h100-runs-2/s-bf16-r0", "tests/data/h100-runs-2/s-bf16-cuda-graphs-r0")}
SEARCH = ("runs", "tests/data/h100-runs-2", "tests/data/h100-runs")


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
    return cfg.replace(optimizations=dataclasses.replace(cfg.optimizations, **flags))


def _projections(cfg, work, profile, cal):
    off = {f: False for f in OPTIMIZATION_FLAGS}
    base = project(with_flags(cfg, off), work, profile, cal, label="baseline (no flag)")
    alone = {f: project(with_flags(cfg, {**off, f: True}), work, profile, cal, label=f"+{f}") for f in OPTIMIZATION_FLAGS}
    every = project(with_flags(cfg, {f: True for f in OPTIMIZATION_FLAGS}), work, profile, cal, label="all flags")
    main = project(cfg, work, profile, cal, label="as configured")
    return base, alone, every, main


def run_projection(cfg, calibration: list[Path], out: Path | None = None) -> dict:
    profile, cal, _ = calibrate(calibration)
    plan, _ = make_plan(cfg, ranks_per_host=cfg.run.gpus_per_node)
    work = work_of(cfg, plan, world_size=cfg.run.world_size, ranks_per_node=cfg.run.gpus_per_node)
    base, alone, every, main = _projections(cfg, work, profile, cal)
    extra = [f"calibrated on: {', '.join(str(p) for p in calibration)}",
             f"plan: {len(plan)} tables, sharding groups {', '.join(work.groups)}; world size {work.world_size}"]
    for f, p in alone.items():
        extra.append(f"{f} alone: {p.period_ms / base.period_ms:.3f}x the baseline period")
    path = None
    if out is not None:
        path = render.write(out, title=f"{cfg.run.preset} on {cfg.run.nodes} x {cfg.run.gpus_per_node} "
                            f"{profile.name}", base=base, alone=alone, every=every, main=main, profile=profile,
                            cal=cal, extra=extra)
    return dict(base=base, alone=alone, every=every, main=main, profile=profile, cal=cal, path=path, extra=extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness.tools.project", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=PRESET_NAMES, default="mlperf")
    parser.add_argument("--calibrate", default=None, help="run folders or ids, comma-separated")
    parser.add_argument("--out", type=Path, default=None, help="report folder [reports/projection-<preset>-<N>x<L>]")
    add_config_options(parser)
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
        names = args.calibrate.split(",") if args.calibrate else DEFAULT_CALIBRATION.get(cfg.sharding.hardware, ())
        if not names:
            raise ValueError(f"--calibrate: give run folders for hardware {cfg.sharding.hardware}")
        calibration = [resolve_run(n) for n in names]
    except ValueError as exc:
        print(f"make project: {exc}", file=sys.stderr)
        return 2
    out = args.out or ROOT / "reports" / f"projection-{cfg.run.preset}-{cfg.run.nodes}x{cfg.run.gpus_per_node}"
    res = run_projection(cfg, calibration, out)
    for line in render.findings(res["base"], res["every"]) + render.against_published(res["base"], res["every"]) + res["extra"]:
        print(line)
    print(f"report: {res['path']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
