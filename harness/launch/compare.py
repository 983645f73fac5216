"""`make compare`: the torchrec and harness engines on one config, runs interleaved, one report.

REPEATS runs of each engine in the order torchrec, harness, torchrec, harness, ... so that
drift (thermal, other load) hits both alike. Each run is an ordinary bench run with its own
folder; runs/compares/<id>/compare.json links them, written as the comparison goes. The two
engines' configs differ only in `run.engine`, the harness's optimization flags and precision.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.config import BenchConfig, OptimizationsConfig, PrecisionConfig
from harness.records.typed_json import to_jsonable

ENGINE_ORDER = ("torchrec", "harness")
"""The order within each repeat; the ratio is harness / torchrec iteration period (start to the next start)."""


def engine_configs(cfg: BenchConfig) -> dict[str, BenchConfig]:
    """One config per engine: the given one with run.engine changed, and for TorchRec the loop as
    stock TorchRec runs it (TrainPipelineSparseDist, none of the harness's flags, torch's blocking
    waits, fp32 tables and wire), so `OPTS="--skip-splits-a2a"` measures what it buys over stock
    TorchRec. The dense arch's precision (--dense-precision, --tf32) is the same on both sides:
    TorchRec's dense arch runs under the same autocast, so the comparison stays same-math."""
    return {
        "torchrec": cfg.replace(run=dataclasses.replace(cfg.run, engine="torchrec"),
                                optimizations=OptimizationsConfig(collective_wait="block"),
                                precision=PrecisionConfig(dense=cfg.precision.dense, tf32=cfg.precision.tf32)),
        "harness": cfg.replace(run=dataclasses.replace(cfg.run, engine="harness")),
    }


def default_report(*, groups: dict[str, list[Path]], out_dir: Path) -> Any:
    # Imported here: the report side (pandas, matplotlib) loads only when a comparison is reported.
    from harness.report.api import write_compare_report

    return write_compare_report(groups=groups, out_dir=out_dir)


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _p50_ms(run_dir: Path) -> str:
    from harness.report import api as report

    try:
        its = report.iteration_summary(report.load_run(run_dir))
        return f"period p50 {its['period_ms_p50']:.3f} (timed window iter_ms p50 {its['iter_ms_p50']:.3f})"
    except Exception as exc:  # the progress line must not hide the run's own outcome
        return f"no iteration summary ({type(exc).__name__})"


def run_compare(
    cfg: BenchConfig,
    *,
    repeats: int,
    runs_root: Path,
    reports_root: Path,
    check: Callable[[BenchConfig], Any],
    bench: Callable[[BenchConfig, str], int],
    report: Callable[..., Any] | None = None,
) -> int:
    """check(cfg) raises ValueError for what cannot run; bench(cfg, run_id) -> exit code runs one;
    report(groups=, out_dir=) -> .ratio, .ratio_ci (None: harness.report.api.write_compare_report)."""
    from harness.records.writer import new_run_id, now_iso

    try:
        if repeats < 1:
            raise ValueError(f"--repeats must be a positive integer, got {repeats}")
        cfgs = engine_configs(cfg)
        for c in cfgs.values():  # both engines checked before anything runs
            check(c)
    except ValueError as exc:
        print(f"harness compare: error: {exc}", file=sys.stderr)
        return 2
    base = cfgs["harness"]
    compare_id = new_run_id(f"compare-{base.run.preset}", base.run.nodes, base.run.gpus_per_node)
    folder = Path(runs_root) / "compares" / compare_id
    folder.mkdir(parents=True)
    manifest: dict[str, Any] = {
        "compare_id": compare_id, "start_time": now_iso(), "end_time": None, "status": "running", "error": None,
        "order": [], "repeats": repeats, "config": to_jsonable(base),
        "runs": {e: [] for e in ENGINE_ORDER}, "failed_runs": {e: [] for e in ENGINE_ORDER},
        "report_dir": None, "ratio": None, "ratio_ci": None,
    }
    _write(folder / "compare.json", manifest)
    total = repeats * len(ENGINE_ORDER)
    print(f"compare {compare_id}: {' vs '.join(ENGINE_ORDER)}, {repeats} runs each, interleaved -> {folder}",
          flush=True)
    n = 0
    for k in range(repeats):
        for engine in ENGINE_ORDER:
            n += 1
            run_id = f"{compare_id}-r{k}-{engine}"
            # A bench run prints its plan and summary; here one line a run says what happened.
            with contextlib.redirect_stdout(io.StringIO()):
                code = bench(cfgs[engine], run_id)
            run_dir = Path(runs_root) / run_id
            manifest["order"].append(run_id)
            (manifest["runs"] if code == 0 else manifest["failed_runs"])[engine].append(run_id)
            _write(folder / "compare.json", manifest)
            outcome = _p50_ms(run_dir) if code == 0 else f"FAILED (exit {code}; records in {run_dir})"
            print(f"[{n}/{total}] {engine:8s} {run_id}: {outcome}", flush=True)
    failed = [r for runs in manifest["failed_runs"].values() for r in runs]
    manifest["end_time"] = now_iso()
    if failed:
        manifest.update(status="failed", error=f"failed runs: {', '.join(failed)}")
        _write(folder / "compare.json", manifest)
        print(f"harness compare: {len(failed)} run(s) failed ({', '.join(failed)}); no comparison made",
              file=sys.stderr)
        return 1
    out_dir = Path(reports_root) / f"compare-{compare_id}"
    groups = {e: [Path(runs_root) / r for r in manifest["runs"][e]] for e in ENGINE_ORDER}
    try:
        result = (report or default_report)(groups=groups, out_dir=out_dir)
    except BaseException as exc:  # the runs stay linked; the record says the report step failed
        manifest.update(status="failed", error=f"report: {type(exc).__name__}: {exc}")
        _write(folder / "compare.json", manifest)
        raise
    lo, hi = result.ratio_ci
    manifest.update(status="completed", report_dir=str(out_dir), ratio=result.ratio, ratio_ci=[lo, hi])
    _write(folder / "compare.json", manifest)
    print(f"report: {out_dir}")
    print(f"harness/torchrec iteration period: {result.ratio:.3f} (95% CI {lo:.3f}-{hi:.3f})")
    return 0
