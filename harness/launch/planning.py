"""From a config to a sharding plan: the hardware profile, the planner call, the printed table.

The plan is made once, by the launcher, before any rank starts; it goes into the manifest
and every rank reads it from there, so all ranks agree and the run records what ran.
"""

from __future__ import annotations

import collections
import os
import re
import shlex
import textwrap
from pathlib import Path

from harness.config import DEFAULT_DYNAMIC_SLOTS, BenchConfig
from harness.launch.launcher import Launch, srun_argv, torchrun_argv
from harness.records.manifest import PlanEstimate, RankEstimate
from harness.run.device import gpu_name, uses_cuda
from model.names import DYNAMIC_KINDS, STATE_PER_ELEMENT, STATE_PER_ROW, WEIGHT_BYTES, ShardingType
from model.dynamic_budget import DynamicDemand, budget_slots
from model.plan_traffic import Geometry, shard_bytes
from model.planner import PlanError, Topology, TableSpec, plan_step_seconds, plan_tables
from model.sharding import TablePlan

GB = 1e9

# Per-rank figures. h100: 80 GB HBM3 of which 64 GiB for embeddings (the rest: dense model,
# activations, NCCL buffers), 3.35 TB/s HBM, NVLink 4 at 450 GB/s a direction, one 400 Gb/s
# NDR InfiniBand port per GPU (50 GB/s). h200: the same links and the same headroom out of 141 GB
# HBM3e (120 GiB for embeddings), 4.8 TB/s. cpu: a share of host RAM, one core's copy bandwidth,
# gloo over loopback and 10 GbE between hosts.
# Latencies: a small NCCL collective costs ~10 us inside an NVLink node and ~25 us across
# InfiniBand; a gloo all-to-all of a few KB here took 0.15 ms polled (model/collective_wait.py).
PROFILES: dict[str, dict[str, float | None]] = {
    "h100": {"memory_gib": 64.0, "memory_gbps": 3350.0, "intra_node_gbps": 450.0, "inter_node_gbps": 50.0,
             "intra_node_latency_us": 10.0, "inter_node_latency_us": 25.0},
    "h200": {"memory_gib": 120.0, "memory_gbps": 4800.0, "intra_node_gbps": 450.0, "inter_node_gbps": 50.0,
             "intra_node_latency_us": 10.0, "inter_node_latency_us": 25.0},
    "cpu": {"memory_gib": None, "memory_gbps": 20.0, "intra_node_gbps": 2.0, "inter_node_gbps": 1.25,
            "intra_node_latency_us": 150.0, "inter_node_latency_us": 300.0},
}


GPU_NAMES = {"H100": "h100", "H200": "h200"}
"""A part of the name CUDA gives a device (torch.cuda.get_device_name) -> its profile."""


def gpu_profile_name(device: str) -> str:
    """The profile of a GPU by its name, or by a run's device as its manifest names it ("cuda
    (NVIDIA H100 80GB HBM3)"); a GPU no profile names is a ValueError, not taken for an H100."""
    for part, name in GPU_NAMES.items():
        if part in device:
            return name
    raise ValueError(f"no spec profile for the GPU {device!r} (profiles: {', '.join(sorted(GPU_NAMES))}); "
                     f"add its data sheet's figures to harness/launch/planning.py and harness/projection/hardware.py")


def hardware_profile(cfg: BenchConfig) -> tuple[str, str]:
    """The profile the planner uses and, where --hardware left it to auto, how it was chosen: the
    run's device's (cpu for CPU ranks, a GPU's by its name; a GPU no profile names plans with the
    H100's figures, and says so)."""
    if cfg.sharding.hardware != "auto":
        return cfg.sharding.hardware, ""
    return gpu_hardware(gpu_name()) if uses_cuda(cfg.run.device) else ("cpu", "auto: CPU ranks")


def gpu_hardware(name: str) -> tuple[str, str]:
    """hardware_profile's choice for a GPU that CUDA calls `name`, and why."""
    try:
        return gpu_profile_name(name), f"auto: {name}"
    except ValueError:
        return "h100", f"auto: no profile has {name}'s name, so the H100's"


def host_memory_share_gib(ranks_per_host: int) -> float:
    """Half the host's RAM split over the ranks it runs (the rest: dense model, data, the OS)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total / 2 / ranks_per_host / 2**30


def topology(cfg: BenchConfig, *, ranks_per_host: int, on_this_host: bool = False) -> Topology:
    """on_this_host: the ranks will run here on CPU, so the tables must fit this host's RAM,
    whatever the hardware profile or --memory-gib say (those plan a cluster's GPUs)."""
    sh, prof = cfg.sharding, PROFILES[hardware_profile(cfg)[0]]
    memory_gib = sh.memory_gib or prof["memory_gib"] or host_memory_share_gib(ranks_per_host)
    if on_this_host:
        memory_gib = min(memory_gib, host_memory_share_gib(ranks_per_host))
    return Topology(
        world_size=cfg.run.world_size,
        ranks_per_node=cfg.run.gpus_per_node,
        memory_bytes=memory_gib * 2**30,
        memory_bw=(sh.memory_gbps or prof["memory_gbps"]) * GB,
        intra_node_bw=(sh.intra_node_gbps or prof["intra_node_gbps"]) * GB,
        inter_node_bw=(sh.inter_node_gbps or prof["inter_node_gbps"]) * GB,
        intra_node_latency_s=prof["intra_node_latency_us"] * 1e-6,
        inter_node_latency_s=prof["inter_node_latency_us"] * 1e-6,
    )


def table_specs(cfg: BenchConfig) -> list[TableSpec]:
    m = cfg.model
    return [TableSpec(rows=r, dim=m.embedding_dim, pooling=h) for r, h in zip(m.table_rows, m.multi_hot)]


def geometry(cfg: BenchConfig, topo: Topology) -> Geometry:
    """What the footprint of a plan depends on besides the plan (model/plan_traffic.py)."""
    opt = cfg.optimizer.embedding_optimizer
    return Geometry(world_size=topo.world_size, ranks_per_node=topo.ranks_per_node, global_batch=cfg.data.global_batch_size,
                    state_per_element=STATE_PER_ELEMENT[opt], state_per_row=STATE_PER_ROW[opt],
                    weight_bytes=WEIGHT_BYTES[cfg.precision.tables])


def dynamic_slots(cfg: BenchConfig, forced: dict[int, str], geo: Geometry) -> dict[int, int]:
    """table -> slots a rank for each table forced dynamic: --dynamic-slots for each, or their
    shares of --dynamic-memory-gib (model/dynamic_budget.py), a dynamic_row_wise table's share
    split evenly over the ranks. Raises PlanError when the budget is too small."""
    dynamic = {t: kind for t, kind in sorted(forced.items()) if kind in DYNAMIC_KINDS}
    d, m = cfg.dynamic, cfg.model
    if d.memory_gib is None:
        return {t: d.slots or DEFAULT_DYNAMIC_SLOTS for t in dynamic}
    demand = {t: DynamicDemand(rows=m.table_rows[t], pooling=m.multi_hot[t], slot_bytes=shard_bytes(1, m.embedding_dim, geo))
              for t in dynamic if 0 <= t < m.num_sparse}  # a table out of range: plan_tables names it
    try:
        slots = budget_slots(demand, d.memory_gib * 2**30) if demand else {}
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    for t, kind in dynamic.items():
        if kind == ShardingType.DYNAMIC_ROW_WISE and t in slots:
            slots[t] //= geo.world_size
            if slots[t] < 1:
                raise PlanError(f"table {t}: its share of the dynamic memory budget holds fewer slots than ranks "
                                f"({geo.world_size}); raise --dynamic-memory-gib")
    return slots


def host_refusal(planner_says: str, ranks_per_host: int) -> str:
    """A CPU run whose tables do not fit this host, said once with its fix: the planner's own advice
    (more ranks, a bigger budget, another kind) is about a cluster, not this host. Other refusals
    (a forced kind that cannot work) are the planner's as they are."""
    m = re.match(r"(table \d+) \(.*fits on no rank.*leaves a rank holding ([\d.]+ GiB)", planner_says)
    if m is None:
        return planner_says
    # Kept under 100 columns with harness bench's prefix: one line a user reads whole.
    return (f"{m.group(1)} needs {m.group(2)} a rank, {host_memory_share_gib(ranks_per_host):.1f} GiB here: "
            "use --dry-run, or preset small")


def make_plan(cfg: BenchConfig, *, ranks_per_host: int,
              on_this_host: bool = False) -> tuple[tuple[TablePlan, ...], PlanEstimate]:
    """The plan and what the planner assumed and estimated (per-rank memory and cost).
    on_this_host: see topology().

    Raises model.planner.PlanError (a ValueError) when no plan fits.
    """
    m = cfg.model
    tables = table_specs(cfg)
    forced = {t: cfg.sharding.kind for t in range(m.num_sparse)} if cfg.sharding.kind != "auto" else {}
    forced.update(dict(cfg.sharding.per_table))
    topo = topology(cfg, ranks_per_host=ranks_per_host, on_this_host=on_this_host)
    geo = geometry(cfg, topo)
    try:
        plan, loads = plan_tables(
            tables, topo, global_batch=geo.global_batch, state_per_element=geo.state_per_element,
            state_per_row=geo.state_per_row, weight_bytes=geo.weight_bytes, forced=forced,
            column_shards=cfg.sharding.column_shards, dynamic_slots=dynamic_slots(cfg, forced, geo),
        )
    except PlanError as exc:
        if not on_this_host:
            raise
        host_bound = host_memory_share_gib(ranks_per_host) < (cfg.sharding.memory_gib or float("inf"))
        raise PlanError(host_refusal(str(exc), ranks_per_host) if host_bound else str(exc)) from None
    hardware, source = hardware_profile(cfg)
    estimate = PlanEstimate(
        hardware=hardware, hardware_source=source,
        memory_gib=topo.memory_bytes / 2**30, memory_gbps=topo.memory_bw / GB,
        intra_node_gbps=topo.intra_node_bw / GB, inter_node_gbps=topo.inter_node_bw / GB,
        link="inter-node" if topo.world_size > topo.ranks_per_node else "intra-node",
        intra_node_latency_us=topo.intra_node_latency_s * 1e6, inter_node_latency_us=topo.inter_node_latency_s * 1e6,
        est_step_ms=plan_step_seconds(plan, tables, topo, geo) * 1e3,
        ranks=tuple(
            RankEstimate(rank=r, node=r // cfg.run.gpus_per_node, memory_gib=ld.memory_bytes / 2**30,
                         est_ms=ld.cost_s * 1e3, shards=tuple(ld.shards),
                         intra_in_mb=ld.traffic[0] / 1e6, intra_out_mb=ld.traffic[1] / 1e6,
                         inter_in_mb=ld.traffic[2] / 1e6, inter_out_mb=ld.traffic[3] / 1e6)
            for r, ld in enumerate(loads)
        ),
    )
    return tuple(plan), estimate


WIDTH = 100
"""Columns the printed plan fits in."""


def wrap(text: str, indent: str = "  ") -> str:
    """Each line of `text` folded to WIDTH columns, continuation lines indented."""
    return "\n".join(textwrap.fill(line, WIDTH, subsequent_indent=indent, break_on_hyphens=False,
                                   break_long_words=False) for line in text.splitlines())


def _kinds(ranks: list[RankEstimate]) -> str:
    """'32 GRID, 96 DP': the shards the ranks hold, counted by kind (model/planner.py's labels)."""
    counts = collections.Counter(label.split(":", 1)[1].split("[", 1)[0] for r in ranks for label in r.shards)
    return ", ".join(f"{n} {k}" for k, n in counts.most_common()) or "none (dense part only)"


def _node_rows(est: PlanEstimate) -> list[str]:
    """A row a node; consecutive nodes whose row reads the same share it ('nodes 0-3')."""
    by_node: dict[int, list[RankEstimate]] = collections.defaultdict(list)
    for r in est.ranks:
        by_node[r.node].append(r)
    rows: list[tuple[list[int], str]] = []
    for node, on in sorted(by_node.items()):
        body = (f"{len(on):>5} {max(r.memory_gib for r in on):>10.3f} {max(r.est_ms for r in on):>9.3f} "
                f"{sum(r.intra_in_mb for r in on):>9.1f} {sum(r.intra_out_mb for r in on):>9.1f} "
                f"{sum(r.inter_in_mb for r in on):>9.1f} {sum(r.inter_out_mb for r in on):>9.1f}  {_kinds(on)}")
        if rows and rows[-1][1] == body:
            rows[-1][0].append(node)
        else:
            rows.append(([node], body))
    return [f"{_ranges(nodes):>7} {body}"[:WIDTH] for nodes, body in rows]


def format_plan(plan: tuple[TablePlan, ...], est: PlanEstimate, *, detail: bool = False) -> str:
    """The plan in at most WIDTH columns: what was assumed, a row a node (identical nodes share one),
    the estimates; `detail`: the per-rank table after it."""
    counts = {k: sum(tp.kind == k for tp in plan) for k in ShardingType}
    kinds = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    lines = [
        f"sharding plan, {est.hardware} profile{f' ({est.hardware_source})' if est.hardware_source else ''}: "
        f"{est.memory_gib:.1f} GiB a rank, memory {est.memory_gbps:.0f} GB/s, "
        f"links {est.intra_node_gbps:g} GB/s in a node and {est.inter_node_gbps:g} GB/s across, latency "
        f"{est.intra_node_latency_us:g} us in a node and {est.inter_node_latency_us:g} us across",
        f"{len(plan)} tables: {kinds}",
        "                   max a rank       MB an iteration, the node's ranks in all",
        f"{'node':>7} {'ranks':>5} {'GiB':>10} {'est ms':>9} {'in-node in':>9} {'out':>9} {'across in':>9} "
        f"{'out':>9}  shards",
        *_node_rows(est),
    ]
    empty = [r.rank for r in est.ranks if not r.shards]
    if empty:
        # A ratio over an empty rank's zero cost means nothing: say what is going on instead.
        spread = (f"{len(empty)} of {len(est.ranks)} ranks hold no shard (ranks {_ranges(empty)}): "
                  "they only run the dense part")
    else:
        spread = f"spread {est.est_ms_max / est.est_ms_min:.2f}x" if est.est_ms_min > 0 else "spread n/a (zero cost)"
    lines.append(f"estimated embedding time an iteration: {est.est_step_ms:.3f} ms (each exchange at its busiest "
                 "rank, plus latency)")
    lines.append(f"estimated cost a rank: max {est.est_ms_max:.3f} ms, min {est.est_ms_min:.3f} ms ({spread}); "
                 f"memory max {est.memory_gib_max:.3f} GiB")
    if detail:
        lines.append(format_ranks(est))
    return wrap("\n".join(lines))


def format_ranks(est: PlanEstimate) -> str:
    """The per-rank table (MB an iteration on each link level), shards folded under each row."""
    lines = [f"{'rank':>5} {'node':>5} {'GiB':>8} {'est ms':>8} {'in-node in':>10} {'out':>8} {'across in':>9} "
             f"{'out':>8}  shards"]
    for r in est.ranks:
        row = (f"{r.rank:>5} {r.node:>5} {r.memory_gib:>8.3f} {r.est_ms:>8.3f} {r.intra_in_mb:>10.2f} "
               f"{r.intra_out_mb:>8.2f} {r.inter_in_mb:>9.2f} {r.inter_out_mb:>8.2f}  {' '.join(r.shards) or '-'}")
        lines.append(textwrap.fill(row, WIDTH, subsequent_indent=" " * 12, break_long_words=False,
                                   break_on_hyphens=False))
    return "\n".join(lines)


def _shell(argv: list[str]) -> str:
    """A command folded to WIDTH columns with shell continuations, so it can be pasted as it is."""
    lines = textwrap.wrap(shlex.join(argv), WIDTH - 6, break_on_hyphens=False, break_long_words=False)
    return "    " + " \\\n      ".join(lines)


def describe_launch(launch: Launch, *, run_dir: str) -> str:
    """Which launcher a run would use, said plainly, with the one command it would start (run_dir:
    a placeholder: a dry run makes no folder)."""
    n, g = launch.nodes, launch.nproc_per_node
    if launch.mode == "slurm":
        return wrap(f"launcher: Slurm: one srun over {n} node(s), a torchrun on each with {g} rank(s), "
                    f"rendezvous {launch.endpoint}; it runs:") + "\n" + _shell(srun_argv(launch, Path(run_dir), "RUN_ID"))
    if launch.mode == "torchrun":
        return wrap(f"launcher: torchrun for this host, node {launch.node_rank} of 0..{n - 1}, {g} rank(s), "
                    f"rendezvous {launch.endpoint} (every host runs the same with its own NODE_RANK); this host "
                    "runs:") + "\n" + _shell(torchrun_argv(launch, Path(run_dir), "RUN_ID", launch.node_rank))
    if launch.mode == "in-process":
        return "launcher: none: the one rank runs in this process (--in-process)"
    how = {"forkserver": "forked from a server that imports torch once", "spawn": "each a fresh interpreter"}
    here = (f"launcher: local, {n * g} rank process(es) on this host ({os.cpu_count()} CPU cores), "
            f"{how[launch.start_method]} (--start-method {launch.start_method})")
    if n == 1:
        return wrap(here)
    return wrap(f"{here}, simulating {n} nodes: a test of the plan, not the target.\n"
                f"launcher on the target: inside a Slurm allocation of {n} nodes, srun with one torchrun a node; "
                f"without Slurm, torchrun on each host, started there as MASTER_ADDR=<node 0's host> NODE_RANK=k "
                f"RUN_ID=<name> make bench (same knobs), k = 0..{n - 1}")


def format_dry_run(launch: Launch, flags_text: str, plan: tuple[TablePlan, ...], est: PlanEstimate, *,
                   run_dir: str, plan_detail: str | None) -> str:
    """What --dry-run prints, in WIDTH columns and a screen at any size; the per-rank table only
    with --plan-detail (printed, or written to the file it names)."""
    lines = [describe_launch(launch, run_dir=run_dir), wrap(flags_text), format_plan(plan, est, detail=plan_detail == "-")]
    if plan_detail is None:
        lines.append("per-rank table: add --plan-detail (printed) or --plan-detail FILE (make: OPTS=...)")
    elif plan_detail != "-":
        Path(plan_detail).write_text(format_ranks(est) + "\n")
        lines.append(f"per-rank table ({len(est.ranks)} ranks): written to {plan_detail}")
    return "\n".join(lines)


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    out, start = [], ranks[0]
    for prev, cur in zip(ranks, [*ranks[1:], None]):
        if cur != prev + 1:
            out.append(f"{start}-{prev}" if prev > start else f"{start}")
            start = cur
    return ", ".join(out)
