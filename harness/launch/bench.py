"""The bench, compare and ablation commands once their line is parsed (harness/cli.py): every
check a user can fail before anything starts, the run folder, the launch, the closing summary."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.config import BenchConfig
from harness.launch.launcher import LaunchFailed, choose_launch, node_commands
from harness.launch.launcher import run as launch_run
from harness.launch.options import refuse
from harness.launch.planning import format_dry_run, format_plan, make_plan
from harness.records import writer as records
from harness.records.manifest import PlanEstimate, ResolvedFlags, RunManifest
from harness.report import api as report
from harness.run.device import check_gpus_per_host, check_shard_dims, cuda_device_count, describe_device, uses_cuda
from harness.run.optimizations import describe, draw_asked, resolve
from harness.store_url import pass_to_ranks
from model.dense import dense_flops_per_sample
from model.sharding import TablePlan


def plan_and_flags(cfg: BenchConfig, *, ranks_per_host: int,
                   dry_run: bool = False) -> tuple[tuple[TablePlan, ...], PlanEstimate, ResolvedFlags]:
    """The sharding plan, its estimate and the resolved optimization flags (raises ValueError).
    A CPU run that will start is planned within this host's RAM; a dry run plans the profile's."""
    cuda = uses_cuda(cfg.run.device)
    plan, estimate = make_plan(cfg, ranks_per_host=ranks_per_host, on_this_host=not cuda and not dry_run)
    if cfg.data.path is not None and not dry_run:  # a dry run may plan on a host without the data
        from harness.data.source import open_batches

        open_batches(cfg)
    if cfg.run.engine == "torchrec":  # TorchRec's import is a rank's: the launcher takes it only here
        from harness.run import engine_torchrec

        engine_torchrec.check_config(cfg, [tp.kind for tp in plan])
    if cuda:
        check_shard_dims(plan)
    flags = resolve(cfg.optimizations, cuda=cuda, plan_kinds=[tp.kind for tp in plan],
                    precision=cfg.precision, engine=cfg.run.engine, ahead=cfg.data.ahead,
                    local_ranks=cfg.run.gpus_per_node, world_size=cfg.run.world_size,
                    draw_on=draw_asked(cfg.data))
    return plan, estimate, flags


def check_config(cfg: BenchConfig) -> ResolvedFlags:
    """Effective flags of a config, checked without running (raises ValueError)."""
    return plan_and_flags(cfg, ranks_per_host=cfg.run.world_size)[2]


@dataclass(kw_only=True, frozen=True)
class Invocation:
    """The parts of a bench command line that are not config: where the run goes and how it is launched."""

    runs_root: Path
    """Folder the run folder is made in."""
    run_id: str | None
    """The run's name; None: a new sortable id."""
    dry_run: bool
    """Print each node's command, the flags and the plan; start nothing."""
    rdzv_endpoint: str | None
    """HOST:PORT of a multi-host rendezvous; None: MASTER_ADDR:MASTER_PORT when set."""
    node_rank: int | None
    """This host's node in a multi-host launch; None: NODE_RANK."""
    in_process: bool = False
    """--in-process: the one rank runs in this process (harness/launch/launcher.py)."""
    plan_detail: str | None = None
    """--plan-detail: '-' prints the dry run's per-rank table, a path writes it there; None: neither."""
    start_method: str | None = None
    """--start-method: how a local simulation's ranks begin (spawn, forkserver); None: by device
    (harness/launch/fork_server.py)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Invocation":
        return cls(runs_root=args.runs_root, run_id=args.run_id, dry_run=args.dry_run,
                   rdzv_endpoint=args.rdzv_endpoint, node_rank=args.node_rank, in_process=args.in_process,
                   plan_detail=args.plan_detail, start_method=args.start_method)


def checked_launch(cfg: BenchConfig, how: Invocation):
    """The launch `how` asks for and the ranks it starts on this host, refused in one line where it
    cannot start here (--in-process with several ranks; more CUDA ranks than this host's GPUs, except
    in a dry run, which may plan a cluster from a smaller host)."""
    launch = choose_launch(cfg, environ=os.environ, rdzv_endpoint=how.rdzv_endpoint, node_rank=how.node_rank,
                           in_process=how.in_process, start_method=how.start_method)
    on_this_host = launch.mode in ("local-simulation", "in-process")
    ranks_per_host = cfg.run.world_size if on_this_host else cfg.run.gpus_per_node
    if uses_cuda(cfg.run.device) and not how.dry_run:
        check_gpus_per_host(ranks_per_host=ranks_per_host, device_count=cuda_device_count())
    return launch, ranks_per_host


def checked_for(how: Invocation):
    """check_config, and the launch `how` asks for (checked_launch): a compare or an ablation refuses
    those before its first run, not at every run."""
    def check(cfg: BenchConfig) -> ResolvedFlags:
        checked_launch(cfg, how)
        return check_config(cfg)
    return check


def bench(cfg: BenchConfig, how: Invocation) -> int:
    # Everything a user can get wrong is checked here, before a folder is made or a process started.
    try:
        if how.run_id is not None:
            records.check_run_id(how.run_id)
        launch, ranks_per_host = checked_launch(cfg, how)
        if launch.mode == "torchrun" and not how.run_id:
            raise ValueError("a multi-host launch needs the same --run-id (make: RUN_ID=...) on every host")
        plan, estimate, flags = plan_and_flags(cfg, ranks_per_host=ranks_per_host, dry_run=how.dry_run)
        device = describe_device(cfg.run.device)
    except ValueError as exc:
        return refuse(exc)
    run_id = how.run_id or records.new_run_id(cfg.run.preset, cfg.run.nodes, cfg.run.gpus_per_node)
    run_dir = how.runs_root / run_id
    commands = tuple(node_commands(launch, run_dir, run_id))
    if how.dry_run:
        print(f"dry run, preset {cfg.run.preset}: {cfg.run.nodes} node(s) x {cfg.run.gpus_per_node} rank(s), "
              f"global batch {cfg.data.global_batch_size}; nothing started, no folder made")
        try:
            print(format_dry_run(launch, describe(flags), plan, estimate, plan_detail=how.plan_detail,
                                 run_dir=str(how.runs_root / (how.run_id or "RUN_ID"))))
        except OSError as exc:  # --plan-detail FILE could not be written
            return refuse(ValueError(f"--plan-detail {how.plan_detail}: {exc.strerror or exc}"))
        return 0
    if run_dir.exists() and not (launch.mode == "torchrun" and launch.node_rank):
        return refuse(ValueError(f"run folder {run_dir} exists; run ids are never reused"))

    leader = launch.mode != "torchrun" or launch.node_rank == 0
    if leader:
        try:
            records.create_run(how.runs_root, RunManifest(
                run_id=run_id, config=cfg, launcher=launch.mode, node_commands=commands, device=device,
                start_method=launch.start_method,
                optimizations=flags, plan=plan, plan_estimate=estimate,
                dense_flops_per_sample=dense_flops_per_sample(**cfg.model.dense_arch_kwargs()),
                **records.launcher_facts(),
            ))
        except FileExistsError:  # made between the check above and here: another run with this id
            return refuse(ValueError(f"run folder {run_dir} was just made by another run with the same id; "
                                     "run ids are never reused"))
        except OSError as exc:
            return refuse(ValueError(f"cannot make the run folder {run_dir}: {exc.strerror or exc}"))
    elif not records.wait_for_manifest(run_dir, timeout_s=120):
        return refuse(ValueError(f"{run_dir}/manifest.json did not appear in 120 s: node 0 writes it, so runs/ "
                                 "must be on a filesystem every node shares"))
    print(f"run {run_id}: {cfg.run.preset}, {cfg.run.nodes} node(s) x {cfg.run.gpus_per_node} rank(s) "
          f"({launch.mode}), global batch {cfg.data.global_batch_size}, "
          f"{cfg.run.warmup_iters}+{cfg.run.iters} iterations -> {run_dir}", flush=True)
    print(describe(flags))
    print(format_plan(plan, estimate, detail=cfg.run.world_size <= 8), flush=True)
    error = None
    pass_to_ranks(cfg.dynamic.ps)  # the store's password reaches the ranks by environment, never the run folder
    try:
        launch_run(launch, run_dir, run_id=run_id)
    except LaunchFailed as exc:
        error = str(exc)
    except KeyboardInterrupt:
        error = "interrupted (KeyboardInterrupt) before all ranks finished"
    except Exception as exc:  # the launcher itself broke: still close the run as failed
        error = f"launcher: {type(exc).__name__}: {exc}"
    if error and records.disk_full(run_dir):
        error += "; the run folder's disk is full (No space left on device)"
    if not leader:
        return 1 if error else 0
    try:
        records.finish_run(run_dir, error=error)
    except OSError as exc:  # a full disk can refuse even the manifest's few KB
        sys.stderr.write(f"harness bench: run {run_id} {'failed: ' + error if error else 'finished'}; its manifest "
                         f"could not be closed ({exc.strerror or exc}), so it still says running\n")
        return 1
    if error:
        sys.stderr.write(f"harness bench: run {run_id} failed: {error}\n"
                         f"harness bench: records written before the failure are kept in {run_dir}\n")
        return 1
    print(report.format_summary(report.load_run(run_dir)))
    return 0


def compare(cfg: BenchConfig, how: Invocation, *, repeats: int, reports_root: Path, report=None) -> int:
    """Both engines interleaved (harness/launch/compare.py); `report`: the comparison report step (tests inject one)."""
    from harness.launch.compare import run_compare

    if how.run_id or how.dry_run:
        return refuse(ValueError("compare names its runs itself and starts them: drop --run-id / --dry-run"))
    return run_compare(cfg, repeats=repeats, runs_root=how.runs_root, reports_root=reports_root,
                       bench=lambda c, run_id: bench(c, dataclasses.replace(how, run_id=run_id)),
                       check=checked_for(how), report=report)


def ablation(cfg: BenchConfig, how: Invocation, *, repeats: int) -> int:
    """Baseline, each flag, all, all-but-one (harness/launch/ablation.py), each a bench run."""
    from harness.launch.ablation import run_ablation

    try:
        return run_ablation(cfg, repeats=repeats, runs_root=how.runs_root,
                            bench=lambda c, run_id: bench(c, dataclasses.replace(how, run_id=run_id)),
                            check=checked_for(how))
    except ValueError as exc:  # a derived config failed its checks; nothing has run yet
        return refuse(exc)
