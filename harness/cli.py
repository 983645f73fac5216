"""`python -m harness bench|report ...`: argument parsing and the two commands' flow."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness import records, report
from harness.config import BenchConfig, DataConfig
from harness.device import check_device_available, describe_device
from harness.presets import PRESETS
from harness.train import table_plan
from model.dense import dense_flops_per_sample


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


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    bench = sub.add_parser("bench", help="train DLRM-DCNv2 and record every iteration's stages")
    bench.add_argument("--preset", choices=sorted(PRESETS), default="small", help="model and batch preset")
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
    bench.add_argument("--runs-root", type=Path, default=Path("runs"), help="where run folders go")

    rep = sub.add_parser("report", help="summarise a run folder (reads nothing else)")
    rep.add_argument("--run", default="latest", help="run id under --runs-root, or 'latest'")
    rep.add_argument("--runs-root", type=Path, default=Path("runs"))
    rep.add_argument("--reports-root", type=Path, default=Path("reports"))
    return parser


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    cfg = PRESETS[args.preset](
        iters=args.iters, warmup_iters=args.warmup, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
        device=args.device, timeline=args.timeline, flush_every=args.flush_every,
        collective_timeout_s=args.collective_timeout, fail_at=args.fail_at,
    )
    data = cfg.data
    if args.global_batch is not None or args.id_exponent is not None:
        data = DataConfig(
            global_batch_size=args.global_batch if args.global_batch is not None else data.global_batch_size,
            seed=args.seed,
            id_exponent=args.id_exponent if args.id_exponent is not None else data.id_exponent,
        )
    else:
        data = DataConfig(global_batch_size=data.global_batch_size, seed=args.seed, id_exponent=data.id_exponent)
    return cfg.replace(data=data)


def bench(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
        check_device_available(cfg.run.device)
    except ValueError as exc:
        sys.stderr.write(f"harness bench: error: {exc}\n")
        return 2
    # Imported late: the launcher pulls in the elastic agent, which a bad command line never needs.
    from harness.launch import LaunchFailed, launch_local

    run_id = records.new_run_id(cfg.run.preset, cfg.run.nodes, cfg.run.gpus_per_node)
    run_dir = records.create_run(
        args.runs_root,
        run_id,
        {
            "preset": cfg.run.preset,
            "config": cfg.to_dict(),
            "world_size": cfg.run.world_size,
            "nodes": cfg.run.nodes,
            "gpus_per_node": cfg.run.gpus_per_node,
            "global_batch_size": cfg.data.global_batch_size,
            "device": describe_device(cfg.run.device),
            "launcher": "local-simulation",
            "sharding_plan": {"kind": cfg.sharding.kind, "table_owner": table_plan(cfg)},
            "dense_flops_per_sample": dense_flops_per_sample(**cfg.model.dense_arch_kwargs()),
        },
    )
    print(f"run {run_id}: {cfg.run.preset}, {cfg.run.nodes} node(s) x {cfg.run.gpus_per_node} rank(s), "
          f"global batch {cfg.data.global_batch_size}, {cfg.run.warmup_iters}+{cfg.run.iters} iterations -> {run_dir}",
          flush=True)
    error = None
    try:
        launch_local(run_dir, run_id=run_id, world_size=cfg.run.world_size)
    except LaunchFailed as exc:
        error = str(exc)
    except KeyboardInterrupt:
        error = "interrupted (KeyboardInterrupt) before all ranks finished"
    except Exception as exc:  # the launcher itself broke: still close the run as failed
        error = f"launcher: {type(exc).__name__}: {exc}"
    records.finish_run(run_dir, error=error)
    if error:
        sys.stderr.write(f"harness bench: run {run_id} failed: {error}\n"
                         f"harness bench: records written before the failure are kept in {run_dir}\n")
        return 1
    run = report.load_run(run_dir)
    print(report.format_summary(run))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        return bench(args)
    return report.report_main(args.run, args.runs_root, args.reports_root)
