"""`make precision-perf`: what lower precision buys and costs, on one config: fp16 tables
(--table-precision fp16) and the pooled embeddings in fp16, bf16 or fp8 on the wire
(--comm-precision; fp8 also with its gradients in fp8, --comm-precision-bwd fp8).

1. Memory: the weights each rank's tables hold, as the planner counts them (two bytes a weight
   element in fp16, four in fp32) and as measured: the resident memory a fresh process gains
   building rank r's sharded embeddings of one plan (every table table-wise), at each precision,
   with no optimizer state (exact_sgd: the weights alone) and with the config's optimizer.
2. Time and numbers: whole bench runs of fp32 and each variant, in one order then the reverse
   so drift hits all alike, repeated; per run the iteration-time p50, then the median of the
   ratios to the same repeat's fp32 run, and the loss difference to it after the run and the
   largest on the way (same batches, same init), and the bytes its pooled exchanges moved
   (emb_fwd and emb_bwd, from the records) over fp32's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from harness import cli

from harness.report import api as report
from harness.tools.quiet_bench import run_bench

PRECISIONS = ("fp32", "fp16")
"""Table precisions measured for memory."""

VARIANTS = {
    "fp32": [],
    "tables fp16": ["--table-precision", "fp16"],
    "comm fp16": ["--comm-precision", "fp16"],  # gradients back in bf16 (auto)
    "comm bf16": ["--comm-precision", "bf16"],
    "comm fp8": ["--comm-precision", "fp8"],  # gradients back in bf16 (auto)
    "comm fp8/fp8": ["--comm-precision", "fp8", "--comm-precision-bwd", "fp8"],
}
"""The runs, each against fp32: the options each adds to the bench command."""


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096  # resident pages (the kernel's page size here)


def measure_rank_memory(argv: list[str], rank: int, precision: str) -> dict:
    """In this process (start it fresh): build `rank`'s sharded embeddings of the plan `argv` makes,
    at `precision`; the resident memory gained and the weight bytes the tables hold."""
    import dataclasses

    import torch

    from harness.config import PrecisionConfig
    from harness.launch.options import config_from_args
    from harness.launch.planning import make_plan
    from model.names import WEIGHT_BYTES, ShardingType
    from model.sharded_embeddings import ShardedEmbeddingCollection
    from model.shardings import ShardingContext

    cfg = config_from_args(cli.build_parser().parse_args(["bench", *argv]))
    plan, _ = make_plan(cfg, ranks_per_host=cfg.run.world_size)  # the fp32 plan, then built at `precision`
    cfg = cfg.replace(precision=dataclasses.replace(cfg.precision, tables=precision))
    torch.set_num_threads(1)

    def build() -> ShardedEmbeddingCollection:
        return ShardedEmbeddingCollection(ShardingContext(
            rank=rank, world_size=cfg.run.world_size, pg=None, ids_pg=None, device=torch.device("cpu"),
            ranks_per_node=cfg.run.gpus_per_node, table_rows=cfg.model.table_rows, dim=cfg.model.embedding_dim,
            multi_hot=cfg.model.multi_hot, optimizer=cfg.optimizer.embedding_optimizer,
            learning_rate=cfg.optimizer.learning_rate, eps=cfg.optimizer.eps, init_seed=cfg.data.seed,
            table_precision=precision,
        ), plan)

    # Built once and dropped first: the first build also maps fbgemm's kernels and warms the
    # allocator (about 80 MB here at either precision), which are not the tables' memory.
    first = build()
    del first
    gc.collect()
    before = _rss_bytes()
    emb = build()
    gained = _rss_bytes() - before
    dp = ShardingType.DATA_PARALLEL
    fused = [w for t, _, w in emb.shard_weights() if plan[t].kind != dp]
    planned = sum(sh.rows * sh.cols for tp in plan if tp.kind != dp for sh in tp.shards if sh.rank == rank)
    return {"rss_gained": gained, "weight_bytes": sum(w.numel() * w.element_size() for w in fused),
            "planned_weight_bytes": planned * WEIGHT_BYTES[precision]}


def _memory_in_subprocess(argv: list[str], rank: int, precision: str) -> dict:
    # glibc raises its mmap threshold each time a large block is freed, so the init's 32 MB draw
    # chunks would come from the heap and stay resident after they are freed (about 50 MB here):
    # a fixed threshold returns every large temporary, and what stays is what the tables hold.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    out = subprocess.run([sys.executable, "-m", "harness.tools.precision_perf", "--memory-of", str(rank), precision, "--", *argv],
                         capture_output=True, text=True, check=False, env=env)
    if out.returncode != 0:
        raise SystemExit(f"precision-perf: measuring memory failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def pooled_bytes(run) -> float:
    """Bytes the pooled exchanges (emb_fwd, emb_bwd) sent, a rank and timed iteration."""
    st = run.stages[~run.stages["warmup"] & run.stages["stage"].isin(["emb_fwd", "emb_bwd"])]
    return float(st["sent_bytes"].sum() / st[["rank", "iteration"]].drop_duplicates().shape[0])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--memory-of"]:  # the child of _memory_in_subprocess
        print(json.dumps(measure_rank_memory(argv[4:], int(argv[1]), argv[2])))
        return 0
    p = argparse.ArgumentParser(prog="harness.tools.precision_perf", description=__doc__)
    p.add_argument("--preset", default="small", choices=["tiny", "small"])
    p.add_argument("--gpus-per-node", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--runs-root", type=Path, default=Path("runs"))
    args = p.parse_args(argv)
    if args.repeats < 1:
        return cli._error(ValueError(f"--repeats must be a positive integer, got {args.repeats}"))
    # Every table table-wise, so every table is fused (data-parallel ones stay fp32) and both
    # precisions run the same kinds (the planner, seeing cheaper fp16 rows, could pick others).
    base = ["--preset", args.preset, "--gpus-per-node", str(args.gpus_per_node), "--sharding", "table_wise"]
    print(f"{args.preset}, {args.gpus_per_node} ranks, every table table-wise: fused tables fp32 vs fp16")
    mib = lambda m, key: f"{m['fp32'][key] / 2**20:.1f} -> {m['fp16'][key] / 2**20:.1f} MiB (x{m['fp16'][key] / max(1, m['fp32'][key]):.3f})"
    for rank in range(args.gpus_per_node):
        m = {prec: _memory_in_subprocess(base, rank, prec) for prec in PRECISIONS}
        # exact_sgd keeps no optimizer state: what the process gains is the weights alone.
        bare = {prec: _memory_in_subprocess([*base, "--embedding-optimizer", "exact_sgd"], rank, prec) for prec in PRECISIONS}
        print(f"  rank {rank}: weights planned {mib(m, 'planned_weight_bytes')}, held as tensors {mib(m, 'weight_bytes')}; "
              f"resident memory gained building the tables: {mib(bare, 'rss_gained')} without optimizer state "
              f"(exact_sgd), {mib(m, 'rss_gained')} with the config's (fp32 in both)", flush=True)
    p50: dict[str, list[float]] = {name: [] for name in VARIANTS}
    finals: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS if name != "fp32"}
    names = list(VARIANTS)
    for r in range(args.repeats):
        runs = {}
        for name in names if r % 2 == 0 else names[::-1]:  # forward, then backward: drift hits all alike
            run = run_bench([*base, *VARIANTS[name]], args.runs_root, tool="precision-perf")
            runs[name] = run
            p50[name].append(report.iteration_summary(run)["iter_ms_p50"])
            print(f"repeat {r + 1}/{args.repeats} {name:12s}: iter_ms p50 {p50[name][-1]:9.3f}  ({run.run_id})", flush=True)
        moved = {name: pooled_bytes(run) for name, run in runs.items()}
        losses = {name: run.iterations.set_index(["rank", "iteration"])["loss"] for name, run in runs.items()}
        last = {name: float(loss.groupby(level="iteration").mean().iloc[-1]) for name, loss in losses.items()}
        for name in finals:
            finals[name].append((last[name] - last["fp32"], float((losses[name] - losses["fp32"]).abs().max())))
    iters = runs["fp32"].manifest.config.run.iters + runs["fp32"].manifest.config.run.warmup_iters
    print(f"against fp32 (iteration-time p50s, median of {args.repeats} interleaved pairs; loss after {iters} "
          "iterations, mean over ranks; same batches and init):")
    for name in finals:
        ratios = [b / a for a, b in zip(p50["fp32"], p50[name])]
        d_last = statistics.median(d for d, _ in finals[name])
        worst = max(w for _, w in finals[name])
        print(f"  {name:12s}: time x{statistics.median(ratios):.3f} (pairs {', '.join(f'{x:.3f}' for x in ratios)}), "
              f"final loss difference {d_last:+.2e}, largest on the way {worst:.2e}; pooled bytes "
              f"x{moved[name] / moved['fp32']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
