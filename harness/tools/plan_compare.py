"""`make plan-compare`: this harness's sharding plan against TorchRec's planner, planning only.

For the mlperf tables at each layout (nodes x ranks a node, the h100 profile), both planners
plan the same 26 tables (TorchRec's EmbeddingShardingPlanner limited to the kinds the harness
runs, fused kernels, 80 GiB HBM), and each plan is scored three ways:

- the analytic count of model/plan_traffic.py (both ends of every transfer, by link level;
  memory with optimizer state and exchange buffers);
- this harness's cost model (model/planner.py's estimate, the busiest rank);
- TorchRec's own cost model (its perf and storage estimators on every shard, summed a rank).

It prints one table a layout, the two plans side by side, and a progress line per plan.
"""

from __future__ import annotations

import argparse
import logging
import textwrap
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.config import BenchConfig
from harness.launch.planning import PROFILES, geometry, make_plan, table_specs, topology
from harness.presets import mlperf
from model.plan_traffic import PlanTraffic
from model.names import COLUMN_BLOCKED_KINDS, ShardingType
from model.planner import (
    SEARCHED_KINDS, Topology, plan_footprint, plan_latency_s, rank_seconds, step_seconds,
)
from model.sharding import Shard, TablePlan

LAYOUTS = ((1, 8), (2, 8), (16, 8))
KINDS = tuple(k.value for k in SEARCHED_KINDS)
"""The kinds both planners may use (TorchRec's own names for them): what this planner searches."""
HBM_GIB = 80


@dataclass(frozen=True)
class Score:
    kinds: str
    memory_gib_max: float
    """Analytic: weights, optimizer state and exchange buffers, busiest rank."""
    inter_mb_max: float
    """Analytic: MB the busiest rank sends or receives between nodes an iteration."""
    intra_mb_max: float
    empty_ranks: int
    harness_ms_max: float
    """This harness's cost model, busiest rank."""
    harness_step_ms: float
    """This harness's cost model, the iteration: each exchange at its busiest rank (what it minimises)."""
    torchrec_ms_max: float
    """TorchRec's perf estimator, busiest rank."""
    torchrec_gib_max: float
    """TorchRec's storage estimator (HBM), busiest rank."""


def _silence_torchrec() -> None:
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


def _torchrec_inputs(cfg: BenchConfig, nodes: int, per_node: int):
    """(module on meta, topology, batch size a rank, constraints by table name) for TorchRec."""
    import torch
    from torchrec.distributed.planner import Topology as TrecTopology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    m = cfg.model
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=m.embedding_dim, num_embeddings=r,
                                 feature_names=[f"f{i}"]) for i, r in enumerate(m.table_rows)]
    module = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    prof = PROFILES["h100"]  # the same hardware for both planners; TorchRec counts bytes a millisecond
    topo = TrecTopology(world_size=nodes * per_node, local_world_size=per_node, compute_device="cuda",
                        hbm_cap=HBM_GIB * 2**30, hbm_mem_bw=prof["memory_gbps"] * 1e6,
                        intra_host_bw=prof["intra_node_gbps"] * 1e6, inter_host_bw=prof["inter_node_gbps"] * 1e6)
    # fused: the embedding optimizer in the backward, as the harness runs tables; dense: what
    # TorchRec runs data-parallel tables with (the harness too: model/shardings/data_parallel.py).
    constraints = {f"t{i}": ParameterConstraints(sharding_types=list(KINDS), compute_kernels=["fused", "dense"],
                                                 pooling_factors=[float(h)]) for i, h in enumerate(m.multi_hot)}
    return module, topo, cfg.data.global_batch_size // (nodes * per_node), constraints


def torchrec_plan(cfg: BenchConfig, nodes: int, per_node: int) -> tuple[TablePlan, ...]:
    """TorchRec's planner's plan of the tables, as this harness's TablePlans."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    module, topo, batch, constraints = _torchrec_inputs(cfg, nodes, per_node)
    planner = EmbeddingShardingPlanner(topology=topo, batch_size=batch, constraints=constraints)
    planner.plan(module, [EmbeddingBagCollectionSharder()])
    by_table = {int(opt.name[1:]): opt for opt in planner._best_plan}  # its chosen options, ranks set
    return tuple(TablePlan(by_table[t].sharding_type, tuple(
        Shard(s.rank, s.offset[0], s.offset[0] + s.size[0], s.offset[1], s.offset[1] + s.size[1])
        for s in by_table[t].shards if s.size[0] > 0)) for t in range(len(by_table)))


def torchrec_rating(cfg: BenchConfig, plan: Sequence[TablePlan], nodes: int, per_node: int) -> tuple[np.ndarray, np.ndarray]:
    """TorchRec's estimators on a plan: (perf ms, storage GiB) summed a rank. Each table's shards
    are priced as TorchRec prices the same kind and shard sizes (matched by offset)."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
    from torchrec.distributed.planner.types import ParameterConstraints

    module, topo, batch, constraints = _torchrec_inputs(cfg, nodes, per_node)
    for t, tp in enumerate(plan):
        cols = min(s.cols for s in tp.shards)
        constraints[f"t{t}"] = ParameterConstraints(
            sharding_types=[str(tp.kind)],
            compute_kernels=["dense" if tp.kind == ShardingType.DATA_PARALLEL else "fused"],
            pooling_factors=[float(cfg.model.multi_hot[t])],
            min_partition=cols if tp.kind in COLUMN_BLOCKED_KINDS else None)
    enumerator = EmbeddingEnumerator(topology=topo, batch_size=batch, constraints=constraints,
                                     estimator=[EmbeddingPerfEstimator(topo, constraints),
                                                EmbeddingStorageEstimator(topo, constraints)])
    options = enumerator.enumerate(module, [EmbeddingBagCollectionSharder()])
    w = nodes * per_node
    perf, storage = np.zeros(w), np.zeros(w)
    for t, tp in enumerate(plan):
        candidates = [o for o in options if o.name == f"t{t}" and o.sharding_type == tp.kind]
        wanted = sorted((s.row_start, s.col_start, s.rows, s.cols) for s in tp.shards)
        match = None
        for opt in candidates:
            sized = sorted((s.offset[0], s.offset[1], s.size[0], s.size[1]) for s in opt.shards if s.size[0] > 0)
            if sized == wanted or (tp.kind == ShardingType.DATA_PARALLEL and len(opt.shards) == len(tp.shards)):
                match = opt
                break
        if match is None:
            raise ValueError(f"table {t}: TorchRec enumerates no {tp.kind} option with this plan's shard sizes")
        priced = {(s.offset[0], s.offset[1]): s for s in match.shards}
        for i, sh in enumerate(tp.shards):
            ts = match.shards[i] if tp.kind == ShardingType.DATA_PARALLEL else priced[(sh.row_start, sh.col_start)]
            perf[sh.rank] += ts.perf.total
            storage[sh.rank] += ts.storage.hbm / 2**30
    return perf, storage


def score(cfg: BenchConfig, plan: Sequence[TablePlan], nodes: int, per_node: int) -> Score:
    topo: Topology = topology(cfg, ranks_per_host=per_node)
    fp = plan_footprint(plan, table_specs(cfg), geometry(cfg, topo))
    traffic = PlanTraffic.of(fp)
    latency = plan_latency_s(plan, topo)
    cost = rank_seconds(fp, topo) + latency
    trec_perf, trec_storage = torchrec_rating(cfg, plan, nodes, per_node)
    held = np.zeros(nodes * per_node, dtype=bool)
    for tp in plan:
        for sh in tp.shards:
            held[sh.rank] = True
    counts = {k: sum(tp.kind == k for tp in plan) for k in KINDS}
    return Score(
        kinds=" ".join(f"{k}:{n}" for k, n in counts.items() if n),
        memory_gib_max=float(traffic.memory.max() / 2**30), inter_mb_max=float(traffic.inter.max() / 1e6),
        intra_mb_max=float(traffic.intra.max() / 1e6), empty_ranks=int((~held).sum()),
        harness_ms_max=float(cost.max() * 1e3), harness_step_ms=(step_seconds(fp, topo) + latency) * 1e3,
        torchrec_ms_max=float(trec_perf.max()),
        torchrec_gib_max=float(trec_storage.max()),
    )


ROWS = (("memory GiB, busiest rank (analytic)", "memory_gib_max", "{:.2f}"),
        ("inter-node MB, busiest rank (analytic)", "inter_mb_max", "{:.1f}"),
        ("intra-node MB, busiest rank (analytic)", "intra_mb_max", "{:.1f}"),
        ("ranks holding no shard", "empty_ranks", "{}"),
        ("harness cost model, ms, busiest rank", "harness_ms_max", "{:.3f}"),
        ("harness cost model, ms, iteration", "harness_step_ms", "{:.3f}"),
        ("TorchRec perf model, ms, busiest rank", "torchrec_ms_max", "{:.3f}"),
        ("TorchRec storage model, GiB, busiest rank", "torchrec_gib_max", "{:.2f}"))


def format_scores(nodes: int, per_node: int, ours: Score, theirs: Score) -> str:
    """The two plans side by side in at most 100 columns; each plan's kinds on a line of its own
    above (a list of kinds is wider than a column)."""
    lines = [f"== mlperf tables on {nodes} x {per_node} (h100 profile) ==",
             f"kinds, harness plan:  {ours.kinds}", f"kinds, TorchRec plan: {theirs.kinds}",
             f"{'':42s} {'harness plan':>27s} {'TorchRec plan':>27s}"]
    for label, field, fmt in ROWS:
        lines.append(f"{label:42s} {fmt.format(getattr(ours, field)):>27s} {fmt.format(getattr(theirs, field)):>27s}")
    return "\n".join(textwrap.fill(line, 100, subsequent_indent=" " * 22) for line in lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="harness.tools.plan_compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layouts", default=",".join(f"{n}x{g}" for n, g in LAYOUTS),
                   help="comma-separated NODESxRANKS_PER_NODE (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        layouts = [tuple(int(x) for x in item.split("x")) for item in args.layouts.split(",")]
        if any(len(lay) != 2 or min(lay) < 1 for lay in layouts):
            raise ValueError
    except ValueError:
        p.error(f"--layouts {args.layouts!r}: expected e.g. 1x8,2x8,16x8")
    _silence_torchrec()
    for nodes, per_node in layouts:
        cfg = mlperf(nodes=nodes, gpus_per_node=per_node)
        start = time.perf_counter()
        ours, _ = make_plan(cfg, ranks_per_host=per_node)
        print(f"{nodes}x{per_node}: harness plan in {time.perf_counter() - start:.1f} s; TorchRec planning ...", flush=True)
        start = time.perf_counter()
        theirs = torchrec_plan(cfg, nodes, per_node)
        print(f"{nodes}x{per_node}: TorchRec plan in {time.perf_counter() - start:.1f} s; scoring both ...", flush=True)
        print(format_scores(nodes, per_node, score(cfg, ours, nodes, per_node), score(cfg, theirs, nodes, per_node)),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
