"""`make perf`: what the instrumentation itself costs.

1. The cost of one timed stage (NVTX push/pop plus two clock reads), measured in a loop.
2. Whole runs with the timeline on and off, interleaved in ABBA order so drift hits both
   alike, repeated; the medians of their per-run iteration-time medians are compared.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time
from pathlib import Path

from harness import cli

from harness.report import api as report
from harness.run.device import uses_cuda
from harness.run.timeline import Timeline


def stage_cost_ns(n: int = 200_000, *, cuda: bool = False) -> float:
    """Host time of one timed stage, averaged over n. On CUDA the marks are CUDA events (what a
    CUDA run records), and the device is synchronized before and after so the loop is timed whole."""
    import torch

    tl = Timeline(cuda=cuda, stages=True)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    tl.begin_iteration(0)
    sync()
    start = time.perf_counter_ns()
    for _ in range(n):
        with tl.stage("emb_fwd"):
            pass
    sync()
    cost = (time.perf_counter_ns() - start) / n
    tl.end_iteration()
    tl.drain()
    return cost


def run_p50_ms(argv: list[str], runs_root: Path) -> tuple[str, float]:
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(["bench", *argv, "--runs-root", str(runs_root)])
    if code != 0:
        raise SystemExit(f"perf: a bench run failed (exit {code}); see {runs_root}")
    run = report.load_run(report.resolve_run(runs_root, "latest"))
    return run.run_id, report.iteration_summary(run)["iter_ms_p50"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="harness.tools.perf", description=__doc__)
    p.add_argument("--preset", default="tiny", choices=["tiny", "small"])
    p.add_argument("--gpus-per-node", type=int, default=2)
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--runs-root", type=Path, default=Path("runs"))
    args = p.parse_args(argv)

    cuda = uses_cuda("auto")
    cost = stage_cost_ns(20_000 if cuda else 200_000, cuda=cuda)
    marks = "2 CUDA events" if cuda else "2 clock reads"
    print(f"one timed stage (NVTX range + {marks}): {cost / 1000:.2f} us; 5 an iteration = {5 * cost / 1000:.1f} us")
    base = ["--preset", args.preset, "--gpus-per-node", str(args.gpus_per_node),
            "--iters", str(args.iters), "--warmup", "10"]
    on, off = [], []
    for r in range(args.repeats):
        pair = (("--timeline", on), ("--no-timeline", off))
        for flag, sink in pair if r % 2 == 0 else pair[::-1]:  # ABBA order: drift cancels
            run_id, p50 = run_p50_ms([*base, flag], args.runs_root)
            sink.append(p50)
            print(f"repeat {r + 1}/{args.repeats} {flag:14s} iter_ms p50 {p50:9.3f}  ({run_id})", flush=True)
    m_on, m_off = statistics.median(on), statistics.median(off)
    spread = lambda xs: f"{min(xs):.3f}..{max(xs):.3f}"
    print(f"{args.preset}, {args.gpus_per_node} ranks, {args.iters} iterations a run, {args.repeats} interleaved repeats:")
    print(f"  timeline on : median iter_ms {m_on:.3f} (runs {spread(on)})")
    print(f"  timeline off: median iter_ms {m_off:.3f} (runs {spread(off)})")
    paired = statistics.median(100 * (a - b) / b for a, b in zip(on, off))
    print(f"  instrumentation overhead: {100 * (m_on - m_off) / m_off:+.2f}% of iteration time from the medians, "
          f"{paired:+.2f}% median of paired repeats (goal <= 2%)")
    print(f"  direct cost bound: {5 * cost / 1000:.1f} us of {m_off * 1000:.0f} us = {100 * 5 * cost / 1e6 / m_off:.3f}%; "
          "a larger A/B figure is run-to-run noise (see the spreads)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
