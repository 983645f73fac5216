"""From a config to a sharding plan: the hardware profile, the planner call, the printed table.

The plan is made once, by the launcher, before any rank starts; it goes into the manifest
and every rank reads it from there, so all ranks agree and the run records what ran.
"""

from __future__ import annotations

import os

from harness.config import DEFAULT_DYNAMIC_SLOTS, BenchConfig
from harness.records.manifest import PlanEstimate, RankEstimate
from model.names import DYNAMIC_KINDS, STATE_PER_ELEMENT, STATE_PER_ROW, WEIGHT_BYTES, ShardingType
from model.dynamic_budget import DynamicDemand, budget_slots
from model.plan_traffic import Geometry, shard_bytes
from model.planner import PlanError, Topology, TableSpec, plan_step_seconds, plan_tables
from model.sharding import TablePlan

GB = 1e9

# Per-rank figures. h100: 80 GB HBM3 of which 64 GiB for embeddings (the rest: dense model,
# activations, NCCL buffers), 3.35 TB/s HBM, NVLink 4 at 450 GB/s a direction, one 400 Gb/s
# NDR InfiniBand port per GPU (50 GB/s). cpu: a share of host RAM, one core's copy bandwidth,
# gloo over loopback and 10 GbE between hosts.
# Latencies: a small NCCL collective costs ~10 us inside an NVLink node and ~25 us across
# InfiniBand; a gloo all-to-all of a few KB here took 0.15 ms polled (model/collective_wait.py).
PROFILES: dict[str, dict[str, float | None]] = {
    "h100": {"memory_gib": 64.0, "memory_gbps": 3350.0, "intra_node_gbps": 450.0, "inter_node_gbps": 50.0,
             "intra_node_latency_us": 10.0, "inter_node_latency_us": 25.0},
    "cpu": {"memory_gib": None, "memory_gbps": 20.0, "intra_node_gbps": 2.0, "inter_node_gbps": 1.25,
            "intra_node_latency_us": 150.0, "inter_node_latency_us": 300.0},
}


def host_memory_share_gib(ranks_per_host: int) -> float:
    """Half the host's RAM split over the ranks it runs (the rest: dense model, data, the OS)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total / 2 / ranks_per_host / 2**30


def topology(cfg: BenchConfig, *, ranks_per_host: int, on_this_host: bool = False) -> Topology:
    """on_this_host: the ranks will run here on CPU, so the tables must fit this host's RAM,
    whatever the hardware profile or --memory-gib say (those plan a cluster's GPUs)."""
    sh, prof = cfg.sharding, PROFILES[cfg.sharding.hardware]
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
        raise PlanError(f"{exc} (on CPU a rank gets half this host's RAM over its {ranks_per_host} local ranks; "
                        "--dry-run plans for the hardware profile without starting)") from None
    estimate = PlanEstimate(
        hardware=cfg.sharding.hardware,
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


def format_plan(plan: tuple[TablePlan, ...], est: PlanEstimate, *, max_rows: int | None = None) -> str:
    """The plan as a table: rank, node, shards, memory GiB, estimated cost."""
    counts = {k: sum(tp.kind == k for tp in plan) for k in ShardingType}
    kinds = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    lines = [
        f"sharding plan ({est.hardware} profile: {est.memory_gib:.1f} GiB a rank, memory {est.memory_gbps:.0f} GB/s, "
        f"links {est.intra_node_gbps:.2f} GB/s in a node, {est.inter_node_gbps:.2f} GB/s across, collective latency {est.intra_node_latency_us:g} us in a node, "
        f"{est.inter_node_latency_us:g} us across): {kinds}",
        f"{'rank':>5} {'node':>5} {'memory_gib':>10} {'est_ms':>8} {'intra_in':>9} {'intra_out':>9} "
        f"{'inter_in':>9} {'inter_out':>9}  shards   (MB an iteration on each link level)",
    ]
    rows = est.ranks if max_rows is None else est.ranks[:max_rows]
    for r in rows:
        lines.append(f"{r.rank:>5} {r.node:>5} {r.memory_gib:>10.3f} {r.est_ms:>8.3f} {r.intra_in_mb:>9.2f} "
                     f"{r.intra_out_mb:>9.2f} {r.inter_in_mb:>9.2f} {r.inter_out_mb:>9.2f}  {' '.join(r.shards) or '-'}")
    if len(rows) < len(est.ranks):
        lines.append(f"  ... {len(est.ranks) - len(rows)} more ranks (all in the manifest)")
    nodes = sorted({r.node for r in est.ranks})
    if len(nodes) > 1:
        for n in nodes:
            on = [r for r in est.ranks if r.node == n]
            lines.append(f"  node {n} in all: memory {sum(r.memory_gib for r in on):.3f} GiB over {len(on)} ranks, est_ms max "
                         f"{max(r.est_ms for r in on):.3f}, between nodes in {sum(r.inter_in_mb for r in on):.2f} MB "
                         f"out {sum(r.inter_out_mb for r in on):.2f} MB")
    empty = [r.rank for r in est.ranks if not r.shards]
    if empty:
        # A ratio over an empty rank's zero cost means nothing: say what is going on instead.
        spread = (f"{len(empty)} of {len(est.ranks)} ranks hold no shard (ranks {_ranges(empty)}): "
                  "they only run the dense part")
    else:
        spread = f"spread {est.est_ms_max / est.est_ms_min:.2f}x" if est.est_ms_min > 0 else "spread n/a (zero cost)"
    lines.append(f"estimated embedding time an iteration (each exchange at its busiest rank, plus latency): "
                 f"{est.est_step_ms:.3f} ms")
    lines.append(
        f"estimated cost a rank: max {est.est_ms_max:.3f} ms, min {est.est_ms_min:.3f} ms "
        f"({spread}); memory max {est.memory_gib_max:.3f} GiB"
    )
    return "\n".join(lines)


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    out, start = [], ranks[0]
    for prev, cur in zip(ranks, [*ranks[1:], None]):
        if cur != prev + 1:
            out.append(f"{start}-{prev}" if prev > start else f"{start}")
            start = cur
    return ", ".join(out)
