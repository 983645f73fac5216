"""`make data-perf`: how fast the MLPerf-file loader makes batches, alone, on one rank.

One rank reads whole global batches of the preset (the most a rank ever reads) from the files at
--data, or from days generated for the run in a temporary folder (then in the page cache, as
files a run reads twice are); the synthetic stream is timed beside it, interleaved. It prints
samples a second for each; a run is never bound by data while these stay well above its
training throughput (the bench's samples/s).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from harness.criteo_files import CriteoFiles, DataError
from harness.data import SyntheticCriteo
from harness.make_dataset import main as make_dataset
from harness.presets import PRESETS


def _time_batches(source, batches: range) -> float:
    start = time.perf_counter()
    for it in batches:
        source.local_batch(it, 0, 1)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="harness.data_perf", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=None, help="an MLPerf-layout folder (default: generate one)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="small", help="model and batch (default %(default)s)")
    p.add_argument("--batches", type=int, default=30, help="global batches timed (default %(default)s)")
    args = p.parse_args(argv)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
