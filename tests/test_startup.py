"""A rank's start-up by phase (harness/run/startup.py), against clocks outside the code under test:
the parent's wall clock around a process, and the run's own iteration records."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

from harness.cli import main
from harness.names import STARTUP_PHASES
from harness.records.manifest import RankInfo
from harness.records.writer import read_manifest
from harness.report.api import load_run
from harness.report.startup import start_s, startup_line
from harness.tools.gpu_bench import Outcome, summary

ROOT = Path(__file__).resolve().parents[1]
TICK = 0.02  # /proc's clock ticks (10 ms) at each end


def test_a_process_knows_how_long_ago_it_started():
    """A child that sleeps 0.5 s first: its age is at least that, and at most the parent's wall
    time around the whole child."""
    code = "import time; time.sleep(0.5); from harness.run.startup import process_age_s; print(process_age_s())"
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t0
    age = float(out)
    assert 0.5 <= age <= wall + TICK, (age, wall)


def test_a_runs_phases_fit_its_wall_time_and_its_iterations(tmp_path):
    """Every phase is recorded; together they fit inside the launcher's wall time around the run;
    the loop phase holds every iteration the records time (warm-up included)."""
    t0 = time.perf_counter()
    assert main(["bench", "--preset", "tiny", "--gpus-per-node", "1", "--iters", "8", "--warmup", "2",
                 "--runs-root", str(tmp_path), "--run-id", "s", "--start-method", "spawn"]) == 0
    wall = time.perf_counter() - t0
    phases = read_manifest(tmp_path / "s").ranks[0].startup_s
    assert tuple(phases) == STARTUP_PHASES and all(v >= 0 for v in phases.values()), phases
    assert phases["imports"] > 0.1  # torch alone takes longer than that to import (a spawned rank's)
    assert sum(phases.values()) <= wall + TICK, (phases, wall)
    it = load_run(tmp_path / "s").iterations
    assert len(it) == 10 and phases["loop"] >= (it["end_ns"].max() - it["start_ns"].min()) / 1e9
    assert start_s(phases) == sum(v for k, v in phases.items() if k != "loop")


def test_older_records_have_no_start_up_and_say_so(tmp_path):
    info = RankInfo.from_json('{"run_id": "r", "rank": 0, "node": 0, "host": "h", "pid": 1, "device": "cpu", '
                              '"backend": "gloo", "threads": 1, "gemm_gflops": 1.0, "copy_gbps": 1.0}')
    assert info.startup_s == {} and math.isnan(start_s(info.startup_s))
    assert startup_line([tmp_path / "nothing-here"]) == "not recorded"


def test_gpu_bench_prints_the_mean_start_up_of_its_runs(tmp_path):
    for run_id in ("a", "b"):
        assert main(["bench", "--preset", "tiny", "--gpus-per-node", "1", "--iters", "2", "--warmup", "0",
                     "--runs-root", str(tmp_path), "--run-id", run_id]) == 0
    recorded = [read_manifest(tmp_path / r).ranks[0].startup_s for r in ("a", "b")]
    row = [line for line in summary(Outcome(folder=str(tmp_path), plan={})).splitlines()
           if line.startswith("start-up a run (s)")]
    assert len(row) == 1 and "(rank 0, mean of 2 runs)" in row[0], row
    assert f"imports {(recorded[0]['imports'] + recorded[1]['imports']) / 2:.1f}," in row[0]
    wall = float(row[0].split("the manifest's start to end ")[1].split()[0])
    assert wall >= min(sum(r.values()) for r in recorded) - 0.1  # the launcher's part comes on top


def test_the_start_up_row_keeps_in_process_runs_apart_from_local_ones(tmp_path):
    """An in-process run pays no imports: averaged with a local simulation's runs it would hide what
    theirs cost, so the row gives each launcher (and start method) its own part."""
    for run_id, extra in (("a", []), ("b", ["--in-process"]), ("c", ["--in-process"])):
        assert main(["bench", "--preset", "tiny", "--gpus-per-node", "1", "--iters", "2", "--warmup", "0", *extra,
                     "--runs-root", str(tmp_path), "--run-id", run_id]) == 0
    local = read_manifest(tmp_path / "a").ranks[0].startup_s["imports"]
    line = startup_line([tmp_path / r for r in ("a", "b", "c")])
    here, there = line.split("; local-simulation (forkserver): ")
    assert here.startswith("in-process: imports 0.0,") and "(rank 0, mean of 2 runs)" in here, line
    assert there.startswith(f"imports {local:.1f},") and "(rank 0, mean of 1 runs)" in there, line
