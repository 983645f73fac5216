"""`make data-perf`: how fast the MLPerf-file loader makes batches, alone, on one rank.

One rank reads whole global batches of the preset (the most a rank ever reads) from the files at
--data, or from days generated for the run in a temporary folder (then in the page cache, as
files a run reads twice are); the synthetic stream is timed beside it, interleaved. It prints
samples a second for each; a run is never bound by data while these stay well above its
training throughput. Given a bench run (--against-run, make's RUN=), it prints that run's training
samples/s and the loader's multiple of it (the goal: at least 5x, so data never bounds a run).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from harness.data.criteo_files import CriteoFiles, DataError
from harness.data.synthetic import SyntheticCriteo
from harness.tools.make_dataset import main as make_dataset
from harness.presets import PRESETS
from harness.report.api import ReportError, iteration_summary
from harness.report.load import load_run, resolve_run

# The loader must outrun training by this much, so that data never bounds a run (issue 13).
GOAL_MULTIPLE = 5.0


def training_rate(runs_root: Path, run: str) -> tuple[str, float]:
    """(a line naming the run, its training samples/s over its timed iterations)."""
    loaded = load_run(resolve_run(runs_root, run))
    rate = iteration_summary(loaded)["samples_per_s"]
    m = loaded.manifest
    return (f"run {m.run_id} ({m.config.run.preset}, {m.world_size} ranks, global batch "
            f"{m.config.data.global_batch_size})"), rate


def _time_batches(source, batches: range) -> float:
    start = time.perf_counter()
    for it in batches:
        source.local_batch(it, 0, 1)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="harness.tools.data_perf", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=None, help="an MLPerf-layout folder (default: generate one)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="small", help="model and batch (default %(default)s)")
    p.add_argument("--batches", type=int, default=30, help="global batches timed (default %(default)s)")
    p.add_argument("--against-run", default=None, metavar="RUN",
                   help="a bench run id (or latest) whose training samples/s the loader is set against")
    p.add_argument("--runs-root", type=Path, default=Path("runs"), help="where runs live (default %(default)s)")
    args = p.parse_args(argv)
    against = None
    if args.against_run is not None:  # read first: a bad run id fails before any timing
        try:
            against = training_rate(args.runs_root, args.against_run)
        except ReportError as exc:
            p.error(str(exc))
    cfg = PRESETS[args.preset]()
    g = cfg.data.global_batch_size
    with tempfile.TemporaryDirectory(prefix="data-perf-") as tmp:
        folder = args.data
        if folder is None:
            folder = Path(tmp) / "days"
            rows = (args.batches + 2) * g
            print(f"generating 2 days of {rows} samples for {args.preset} in {folder} ...", flush=True)
            make_dataset(["--out", str(folder), "--rows", str(rows), "--days", "2", "--preset", args.preset])
        try:
            files = CriteoFiles(folder, cfg.model, g)
            files.check_iterations(args.batches + 2)
        except DataError as exc:
            p.error(str(exc))
        synthetic = SyntheticCriteo(cfg.model, cfg.data)
        seconds = {"files": 0.0, "synthetic": 0.0}
        for source in (files, synthetic):  # warm-up: first pages mapped, first allocations made
            _time_batches(source, range(2))
        last = time.perf_counter()
        for it in range(2, args.batches + 2):  # interleaved, so a noisy moment hits both
            seconds["files"] += _time_batches(files, range(it, it + 1))
            seconds["synthetic"] += _time_batches(synthetic, range(it, it + 1))
            if time.perf_counter() - last >= 3.0:
                done = it - 1
                print(f"batch {done}/{args.batches}: files {done * g / seconds['files']:,.0f} samples/s, "
                      f"synthetic {done * g / seconds['synthetic']:,.0f} samples/s", flush=True)
                last = time.perf_counter()
    n = args.batches * g
    print(f"loader, one rank, global batch {g} ({args.preset}), {args.batches} batches: "
          f"files {n / seconds['files']:,.0f} samples/s, synthetic stream {n / seconds['synthetic']:,.0f} samples/s")
    if against is not None:
        name, rate = against
        multiple = n / seconds["files"] / rate
        verdict = "met" if multiple >= GOAL_MULTIPLE else "MISSED: data would bound training"
        print(f"training, {name}: {rate:,.0f} samples/s; the loader is x{multiple:,.1f} that "
              f"(goal >= x{GOAL_MULTIPLE:g}: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
