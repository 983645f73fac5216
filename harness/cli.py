"""`python -m harness bench|report ...`: argument parsing and the two commands' flow."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness import engine_torchrec, records, report
from harness.config import ENGINES, OPTIMIZATION_FLAGS, BenchConfig, DataConfig, OptimizationsConfig, ShardingConfig
from harness.device import describe_device
from harness.presets import PRESETS
from harness.stages import STAGES
from harness.launch import LaunchFailed, choose_launch, node_commands
from harness.launch import run as launch_run
from harness.optimizations import describe, resolve
from harness.planning import format_plan, make_plan
from model.dense import dense_flops_per_sample
from model.sharding import SHARDING_TYPES


class OneLineParser(argparse.ArgumentParser):
    """Errors are one line on stderr (what is wrong and where to look), exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)


def _rank_iter(text: str) -> tuple[int, int]:
    try:
        rank, it = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RANK:ITERATION, got {text!r}") from None
    return rank, it


def _table_kinds(text: str) -> tuple[tuple[int, str], ...]:
    try:
        pairs = tuple((int(t), k) for t, k in (item.split("=") for item in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected T=KIND[,T=KIND...], got {text!r}") from None
    return pairs


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    bench = sub.add_parser("bench", help="train DLRM-DCNv2 and record every iteration's stages")
    add_bench_arguments(bench)
    abl = sub.add_parser("ablation", help="baseline, each flag, all, all-but-one: repeated bench runs")
    add_bench_arguments(abl)
    abl.add_argument("--repeats", type=int, default=3, help="runs per config (inactive-only configs: one)")

    cmp = sub.add_parser("compare", help="torchrec and harness engines, runs interleaved, one comparison report")
    add_bench_arguments(cmp)
    cmp.add_argument("--repeats", type=int, default=3, help="runs per engine")
    cmp.add_argument("--reports-root", type=Path, default=Path("reports"), help="where the comparison report goes")

    wk = sub.add_parser("worker", help="one rank (what torchrun starts on each node)")
    wk.add_argument("--run-dir", type=Path, required=True)

    rep = sub.add_parser("report", help="report a run, an ablation or an nsys export (reads nothing else)")
    which = rep.add_mutually_exclusive_group()
    which.add_argument("--run", default=None, help="run id under --runs-root, or 'latest' (the default)")
    which.add_argument("--ablation", default=None, help="ablation id under --runs-root/ablations, or 'latest'")
    which.add_argument("--nsys", type=Path, default=None, help="an `nsys export --type sqlite` file")
    rep.add_argument("--runs-root", type=Path, default=Path("runs"))
    rep.add_argument("--reports-root", type=Path, default=Path("reports"))
    return parser


def add_bench_arguments(bench: argparse.ArgumentParser) -> None:
    bench.add_argument("--preset", choices=sorted(PRESETS), default="small", help="model and batch preset")
    bench.add_argument("--engine", choices=list(ENGINES), default="harness",
                       help="who trains: harness (this project) or torchrec (stock TorchRec on the same config)")
    bench.add_argument("--nodes", type=int, default=1, help="nodes (simulated on one machine here)")
    bench.add_argument("--gpus-per-node", type=int, default=2, help="ranks per node")
    bench.add_argument("--iters", type=int, default=20, help="timed iterations after warm-up")
    bench.add_argument("--warmup", type=int, default=3, help="warm-up iterations (recorded, marked, not summarised)")
    bench.add_argument("--global-batch", type=int, default=None, help="override the preset's global batch")
    bench.add_argument("--seed", type=int, default=0, help="seed of data and weights")
    bench.add_argument("--id-exponent", type=float, default=None, help="power-law exponent of ids (0: uniform)")
    bench.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    bench.add_argument("--timeline", action=argparse.BooleanOptionalAction, default=True,
                       help="per-stage NVTX ranges and timers (off: iteration times only)")
    bench.add_argument("--flush-every", type=int, default=10, help="iterations between record writes")
    bench.add_argument("--collective-timeout", type=float, default=300.0, help="seconds before a stuck collective fails the job")
    bench.add_argument("--fail-at", type=_rank_iter, default=None, metavar="RANK:ITER",
                       help="fault injection: that rank raises at that iteration")
    bench.add_argument("--stall-at", type=_rank_iter, default=None, metavar="RANK:ITER",
                       help="fault injection: that rank hangs at that iteration (the collective timeout ends the job)")
    bench.add_argument("--runs-root", type=Path, default=Path("runs"), help="where run folders go")
    bench.add_argument("--run-id", default=None, help="name the run (multi-host launches: the same on every host)")
    bench.add_argument("--dry-run", action="store_true", help="print each node's command and the plan; start nothing")
    bench.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                       help="multi-host rendezvous (default: MASTER_ADDR:MASTER_PORT when set)")
    bench.add_argument("--node-rank", type=int, default=None, help="this host's node (default: NODE_RANK)")
    opt = bench.add_argument_group("loop and optimization flags (design.md); each --X / --no-X")
    opt.add_argument("--pipeline", action=argparse.BooleanOptionalAction, default=True,
                     help="overlap batch i+1's input dist with batch i's compute (default on)")
    opt.add_argument("--opts", choices=["none", "all"], default="none",
                     help="start from no flags or all flags; --X/--no-X then change single ones")
    for flag in OPTIMIZATION_FLAGS:
        opt.add_argument(f"--{flag.replace('_', '-')}", dest=flag, action=argparse.BooleanOptionalAction, default=None)
    bench.add_argument("--ragged-every", type=int, default=0,
                       help="every k-th batch has variable hotness (exercises skip_splits_a2a's fallback)")
    shard = bench.add_argument_group("sharding")
    shard.add_argument("--sharding", choices=["auto", *SHARDING_TYPES], default=None,
                       help="auto: the planner picks per table; a type: forced on every table")
    shard.add_argument("--shard", type=_table_kinds, default=(), metavar="T=KIND[,T=KIND...]",
                       help="force the type of single tables, e.g. 0=row_wise,5=data_parallel")
    shard.add_argument("--column-shards", type=int, default=None, help="column blocks of a column_wise table")
    shard.add_argument("--hardware", choices=["cpu", "h100"], default=None, help="the planner's bandwidth/memory profile")
    shard.add_argument("--memory-gib", type=float, default=None, help="per-rank memory budget for embeddings")



def config_from_args(args: argparse.Namespace) -> BenchConfig:
    cfg = PRESETS[args.preset](
        engine=args.engine, iters=args.iters, warmup_iters=args.warmup, nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        device=args.device, timeline=args.timeline, flush_every=args.flush_every,
        collective_timeout_s=args.collective_timeout, fail_at=args.fail_at, stall_at=args.stall_at,
    )
    sh = cfg.sharding
    sharding = ShardingConfig(
        kind=args.sharding or sh.kind, per_table=args.shard or sh.per_table,
        column_shards=args.column_shards or sh.column_shards, hardware=args.hardware or sh.hardware,
        memory_gib=args.memory_gib or sh.memory_gib,
    )
    data = cfg.data
    if args.global_batch is not None or args.id_exponent is not None:
        data = DataConfig(
            global_batch_size=args.global_batch if args.global_batch is not None else data.global_batch_size,
            seed=args.seed,
            id_exponent=args.id_exponent if args.id_exponent is not None else data.id_exponent,
            ragged_every=args.ragged_every,
        )
    else:
        data = DataConfig(global_batch_size=data.global_batch_size, seed=args.seed, id_exponent=data.id_exponent,
                          ragged_every=args.ragged_every)
    base = args.opts == "all"
    flags = {f: getattr(args, f) if getattr(args, f) is not None else base for f in OPTIMIZATION_FLAGS}
    return cfg.replace(data=data, sharding=sharding,
                       optimizations=OptimizationsConfig(pipeline=args.pipeline, **flags))


def plan_and_flags(cfg: BenchConfig, *, ranks_per_host: int) -> tuple[dict, dict]:
    """The sharding plan's description and the resolved optimization flags (raises ValueError)."""
    plan, plan_desc = make_plan(cfg, ranks_per_host=ranks_per_host)
    if cfg.run.engine == "torchrec":
        engine_torchrec.check_config(cfg, [tp.kind for tp in plan])
    flags = resolve(cfg.optimizations, cuda=describe_device(cfg.run.device).startswith("cuda"),
                    plan_kinds=[tp.kind for tp in plan])
    return plan_desc, flags


def check_config(args: argparse.Namespace) -> dict:
    """Effective flags of a bench command line, checked without running (raises ValueError)."""
    cfg = config_from_args(args)
    return plan_and_flags(cfg, ranks_per_host=cfg.run.world_size)[1]


def timed_stages(cfg: BenchConfig) -> list[str]:
    """The stages the run's engine records (the manifest says so; reports show no others)."""
    if not cfg.run.timeline:
        return []
    return list(engine_torchrec.TIMED_STAGES if cfg.run.engine == "torchrec" else STAGES)


def _error(exc: Exception) -> int:
    sys.stderr.write(f"harness bench: error: {exc}\n")
    return 2


def bench(args: argparse.Namespace, *, config: BenchConfig | None = None) -> int:
    """One run. `config`: the run's config when the caller built it (compare), else from `args`."""
    # Everything a user can get wrong is checked here, before a folder is made or a process started.
    try:
        cfg = config if config is not None else config_from_args(args)
        launch = choose_launch(cfg, environ=os.environ, rdzv_endpoint=args.rdzv_endpoint, node_rank=args.node_rank)
        if launch.mode == "torchrun" and not args.run_id:
            raise ValueError("a multi-host launch needs the same --run-id (make: RUN_ID=...) on every host")
        ranks_per_host = cfg.run.world_size if launch.mode == "local-simulation" else cfg.run.gpus_per_node
        plan_desc, flags = plan_and_flags(cfg, ranks_per_host=ranks_per_host)
        device = describe_device(cfg.run.device)
    except ValueError as exc:
        return _error(exc)
    run_id = args.run_id or records.new_run_id(cfg.run.preset, cfg.run.nodes, cfg.run.gpus_per_node)
    run_dir = args.runs_root / run_id
    if args.dry_run:
        print(f"dry run: nothing is started. launcher: {launch.mode}, {cfg.run.nodes} node(s) x "
              f"{cfg.run.gpus_per_node} rank(s) = {cfg.run.world_size} ranks, rendezvous {launch.endpoint}")
        print("\n".join(node_commands(launch, run_dir, run_id)))
        print(describe(flags))
        print(format_plan(plan_desc))
        return 0
    if run_dir.exists() and not (launch.mode == "torchrun" and launch.node_rank):
        return _error(ValueError(f"run folder {run_dir} exists; run ids are never reused"))

    leader = launch.mode != "torchrun" or launch.node_rank == 0
    if leader:
        records.create_run(args.runs_root, run_id, {
            "preset": cfg.run.preset, "engine": cfg.run.engine, "timed_stages": timed_stages(cfg),
            "config": cfg.to_dict(), "world_size": cfg.run.world_size,
            "nodes": cfg.run.nodes, "gpus_per_node": cfg.run.gpus_per_node,
            "global_batch_size": cfg.data.global_batch_size, "device": device,
            "pipeline": cfg.optimizations.pipeline, "optimizations": flags,
            "launcher": launch.mode, "node_commands": node_commands(launch, run_dir, run_id),
            "sharding_plan": plan_desc,
            "dense_flops_per_sample": dense_flops_per_sample(**cfg.model.dense_arch_kwargs()),
        })
    elif not records.wait_for_manifest(run_dir, timeout_s=120):
        return _error(ValueError(f"{run_dir}/manifest.json did not appear in 120 s: node 0 writes it, so runs/ "
                                 "must be on a filesystem every node shares"))
    print(f"run {run_id}: {cfg.run.preset}, {cfg.run.nodes} node(s) x {cfg.run.gpus_per_node} rank(s) "
          f"({launch.mode}), global batch {cfg.data.global_batch_size}, "
          f"{cfg.run.warmup_iters}+{cfg.run.iters} iterations -> {run_dir}", flush=True)
    print(describe(flags))
    print(format_plan(plan_desc, max_rows=16), flush=True)
    error = None
    try:
        launch_run(launch, run_dir, run_id=run_id)
    except LaunchFailed as exc:
        error = str(exc)
    except KeyboardInterrupt:
        error = "interrupted (KeyboardInterrupt) before all ranks finished"
    except Exception as exc:  # the launcher itself broke: still close the run as failed
        error = f"launcher: {type(exc).__name__}: {exc}"
    if not leader:
        return 1 if error else 0
    records.finish_run(run_dir, error=error)
    if error:
        sys.stderr.write(f"harness bench: run {run_id} failed: {error}\n"
                         f"harness bench: records written before the failure are kept in {run_dir}\n")
        return 1
    print(report.format_summary(report.load_run(run_dir)))
    return 0


def compare(args: argparse.Namespace, *, report=None) -> int:
    """Both engines interleaved (harness/compare.py); `report`: the comparison report step (tests inject one)."""
    from harness.compare import run_compare

    return run_compare(args, config=config_from_args, bench=bench, report=report,
                       check=lambda cfg: plan_and_flags(cfg, ranks_per_host=cfg.run.world_size))


def worker(args: argparse.Namespace) -> int:
    """One rank under torchrun (multi-node launches); the local simulation calls run_rank directly."""
    from harness.worker import run_rank

    run_rank(str(args.run_dir))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        return bench(args)
    if args.command == "worker":
        return worker(args)
    if args.command == "compare":
        return compare(args)
    if args.command == "ablation":
        from harness.ablation import run_ablation

        if args.repeats < 1:
            return _error(ValueError(f"--repeats must be a positive integer, got {args.repeats}"))
        try:
            check_config(args)
        except ValueError as exc:
            return _error(exc)
        return run_ablation(args, bench=bench, check=check_config)
    run = args.run if args.run or args.ablation or args.nsys else "latest"
    return report.report_main(run, args.runs_root, args.reports_root, ablation=args.ablation, nsys=args.nsys)
