"""A sharding planner that explains itself: memory per rank and an estimated cost per rank.

Cost model (bytes a rank moves per iteration, turned into seconds with the given bandwidths):

    lookup  = 3 x ids x bytes per pooled row slice  (forward read, backward read + write),
              plus, row-wise, the partial sums of the whole batch written and their gradients read
    comm    = the remote share (w-1)/w of: ids in + pooled rows out + their gradients back
              (table/column-wise), reduce-scatter + all-gather of pooled rows (row-wise),
              all-reduce of the whole table's gradient (data-parallel); table-row-wise:
              ids in + the node's share of summed rows out and gradients back, plus the
              in-node reduce-scatter and all-gather charged to the intra-node link
    seconds = lookup / memory bandwidth + comm / link bandwidth
    latency = each sharding in use (table/column-wise tables share one, and so on) costs every
              rank its collectives' latency once (COLLECTIVES_OF_GROUP; the profile's latencies):
              on tiny (2 CPU ranks) this makes every table data-parallel, measured 0.77x the
              iteration time of the bandwidth-only plan (4 interleaved pairs, p50s)

The link is the inter-node one when the job spans nodes (the all-to-alls then cross them),
else the intra-node one. Tables are placed largest first; for each, every allowed kind and
placement that fits the remaining memory is tried and the one with the smallest resulting
maximum rank cost wins (ties: table_wise, column_wise, row_wise, data_parallel, in that order).
table_row_wise is tried when the job spans nodes (one candidate per node).
A table is only split (column- or row-wise) when it alone costs more than a balanced rank's
share, or fits on no rank whole: splitting adds work in total and only pays for balance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from model.sharding import (
    SHARDING_TYPES, Shard, TablePlan, column_wise, data_parallel, row_wise, table_row_wise, table_wise,
)

ID_BYTES = 8
FLOAT_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class Topology:
    world_size: int
    ranks_per_node: int
    memory_bytes: float
    """Memory a rank may use for embedding shards and their optimizer state."""
    memory_bw: float
    """Bytes/s of the memory the tables live in."""
    intra_node_bw: float
    """Bytes/s a rank gets over the links inside a node."""
    inter_node_bw: float
    """Bytes/s a rank gets over the network between nodes."""
    intra_node_latency_s: float = 0.0
    """Seconds a collective inside a node costs whatever its size."""
    inter_node_latency_s: float = 0.0
    """Seconds a collective spanning nodes costs whatever its size."""

    @property
    def link_bw(self) -> float:
        return self.inter_node_bw if self.world_size > self.ranks_per_node else self.intra_node_bw


@dataclass(frozen=True, kw_only=True)
class TableSpec:
    rows: int
    dim: int
    pooling: float
    """Ids a sample looks up in this table."""


@dataclass
class RankLoad:
    memory_bytes: float = 0.0
    cost_s: float = 0.0
    shards: list[str] = field(default_factory=list)


class PlanError(ValueError):
    """No plan: a table fits nowhere, or a forced type cannot work."""


ABBREVIATIONS = {"table_wise": "TW", "column_wise": "CW", "row_wise": "RW", "table_row_wise": "TRW", "data_parallel": "DP"}


def shard_label(t: int, tp: TablePlan, s: Shard) -> str:
    """'t3:TW', 't3:CW[0:64]', 't3:RW', 't3:DP': what a rank holds, for the printed plan."""
    if tp.kind == "column_wise":
        return f"t{t}:CW[{s.col_start}:{s.col_end}]"
    return f"t{t}:{ABBREVIATIONS[tp.kind]}"


@dataclass(frozen=True, kw_only=True)
class MemoryModel:
    """What a shard costs its rank in memory besides its weights."""

    state_per_element: float
    """Optimizer state floats per weight element (Adagrad: 1)."""
    state_per_row: float = 0.0
    """Optimizer state floats per row (row-wise Adagrad: 1)."""
    global_batch: int = 0
    """Samples an iteration: sizes the exchange buffers the shard's rank holds (0: none counted)."""


def shard_memory(tp: TablePlan, shard: Shard, spec: TableSpec, mem: MemoryModel) -> float:
    """Weights, optimizer state and the exchange buffers its rank holds for it an iteration: the
    ids it receives (values and lengths), and the pooled rows and their gradients of the whole
    global batch (table/column-wise), or the partial sums and gathered gradients (row-wise kinds)."""
    weights = shard.rows * shard.cols * FLOAT_BYTES
    state = (mem.state_per_element * shard.rows * shard.cols + mem.state_per_row * shard.rows) * FLOAT_BYTES
    g = mem.global_batch
    if tp.kind == "data_parallel":  # a dense gradient of the table; no exchange buffers of ids
        return weights + state + weights
    share = shard.rows / spec.rows if tp.kind in ("row_wise", "table_row_wise") else 1.0
    width = spec.dim if tp.kind in ("row_wise", "table_row_wise") else shard.cols
    buffers = ID_BYTES * g * (spec.pooling * share + 1) + 2 * g * width * FLOAT_BYTES
    return weights + state + buffers


def shard_cost(tp: TablePlan, shard: Shard, spec: TableSpec, topo: Topology, global_batch: int) -> float:
    """Seconds this shard adds to its rank an iteration (see the module docstring)."""
    w, b, p = topo.world_size, global_batch, spec.pooling
    remote = (w - 1) / w  # the share of a batch that lives on other ranks and crosses a link
    row_bytes = shard.cols * FLOAT_BYTES
    if tp.kind in ("table_wise", "column_wise"):
        lookup = 3 * b * p * row_bytes
        comm = remote * (b * p * ID_BYTES + 2 * b * row_bytes)
    elif tp.kind == "row_wise":
        share = shard.rows / spec.rows
        # Every rank writes partial sums for the whole batch and reads every sample's gradient.
        lookup = 3 * b * p * share * row_bytes + 2 * b * row_bytes
        comm = remote * (b * p * share * ID_BYTES + 2 * b * row_bytes)
    elif tp.kind == "table_row_wise":
        share, local = shard.rows / spec.rows, topo.ranks_per_node
        # As row-wise, but the partial sums are reduce-scattered and the gradients all-gathered
        # inside the node, and only each sample's summed row crosses to its owner's node.
        lookup = 3 * b * p * share * row_bytes + 2 * b * row_bytes
        intra = 2 * b * row_bytes * (local - 1) / local
        comm = remote * (b * p * share * ID_BYTES + 2 * (b / local) * row_bytes)
        return lookup / topo.memory_bw + intra / topo.intra_node_bw + comm / topo.link_bw
    else:  # data_parallel
        lookup = 3 * (b / w) * p * row_bytes
        comm = 2 * spec.rows * row_bytes * remote
    return lookup / topo.memory_bw + comm / topo.link_bw


GROUP_OF_KIND = {"table_wise": "pooled", "column_wise": "pooled", "row_wise": "row_wise",
                 "table_row_wise": "table_row_wise", "data_parallel": "data_parallel"}
"""The sharding (one set of collectives an iteration, model/embedding_shardings.py) a kind's tables share."""
COLLECTIVES_OF_GROUP = {"pooled": (4, 0), "row_wise": (4, 0), "table_row_wise": (4, 2), "data_parallel": (1, 0)}
"""(collectives over all ranks, collectives inside a node) a sharding runs an iteration: the splits and
ids exchanges, the forward and backward exchanges (table-row-wise adds its in-node reduce-scatter
and all-gather); data-parallel tables one gradient all-reduce."""


def group_latency_s(group: str, topo: Topology) -> float:
    """What a sharding's collectives cost every rank in latency alone, once, however many tables it holds."""
    world, node = COLLECTIVES_OF_GROUP[group]
    spans_nodes = topo.world_size > topo.ranks_per_node
    return world * (topo.inter_node_latency_s if spans_nodes else topo.intra_node_latency_s) + \
        node * topo.intra_node_latency_s


def _candidates(kind: str, t: int, spec: TableSpec, topo: Topology, loads: list[RankLoad], column_shards: int):
    if kind == "table_wise":
        return [table_wise(spec.rows, spec.dim, r) for r in range(topo.world_size)]
    if kind == "column_wise":
        k = min(column_shards, topo.world_size)
        if spec.dim % k:
            raise PlanError(
                f"table {t}: column_wise into {k} shards needs a dim divisible by {k}, dim is {spec.dim}"
            )
        lightest = sorted(range(topo.world_size), key=lambda r: (loads[r].cost_s, r))[:k]
        return [column_wise(spec.rows, spec.dim, sorted(lightest))]
    if kind == "row_wise":
        return [row_wise(spec.rows, spec.dim, topo.world_size)]
    if kind == "table_row_wise":
        per_node = topo.ranks_per_node
        return [table_row_wise(spec.rows, spec.dim, node, per_node) for node in range(topo.world_size // per_node)]
    return [data_parallel(spec.rows, spec.dim, topo.world_size)]


def _kinds_to_try(t: int, spec: TableSpec, whole_cost: float, balanced_share: float, topo: Topology,
                  loads: list[RankLoad], mem: MemoryModel) -> list[str]:
    """Split a table (column- or row-wise) only when it alone costs more than a balanced rank's
    share of all the work, or no rank has room for it whole: splitting always costs more in
    total (every rank pays partial outputs and extra collectives), it only wins on balance."""
    kinds = ["table_wise", "data_parallel"]
    whole = table_wise(spec.rows, spec.dim, 0)
    full = shard_memory(whole, whole.shards[0], spec, mem)
    room = max(topo.memory_bytes - ld.memory_bytes for ld in loads)
    if whole_cost > balanced_share or full > room:
        # Across nodes, row blocks inside one node keep each sample's row crossing once: at 16 x 8
        # on mlperf's tables this took the busiest rank from 19.5 to 5.0 GiB and from 99 to 25 MB
        # between nodes an iteration (make plan-compare).
        multi_node = topo.world_size > topo.ranks_per_node
        kinds[1:1] = ["column_wise", "row_wise", *(["table_row_wise"] if multi_node else [])]
    return kinds


def plan_tables(
    tables: Sequence[TableSpec],
    topo: Topology,
    *,
    global_batch: int,
    state_per_element: float,
    state_per_row: float = 0.0,
    forced: dict[int, str] | None = None,
    column_shards: int = 2,
) -> tuple[list[TablePlan], list[RankLoad]]:
    """A plan for every table and each rank's resulting load. Raises PlanError with the reason.
    state_per_element / state_per_row: optimizer state floats (see MemoryModel)."""
    forced = forced or {}
    mem = MemoryModel(state_per_element=state_per_element, state_per_row=state_per_row, global_batch=global_batch)
    for t, kind in forced.items():
        if kind not in SHARDING_TYPES:
            raise PlanError(f"table {t}: unknown sharding type {kind!r}; types are {', '.join(SHARDING_TYPES)}")
        if not 0 <= t < len(tables):
            raise PlanError(f"forced sharding names table {t}; tables are 0..{len(tables) - 1}")
    loads = [RankLoad() for _ in range(topo.world_size)]
    plan: list[TablePlan | None] = [None] * len(tables)
    order = sorted(range(len(tables)), key=lambda t: (-tables[t].rows * tables[t].dim, t))
    whole = [shard_cost(tp, tp.shards[0], tables[t], topo, global_batch)
             for t, tp in ((t, table_wise(tables[t].rows, tables[t].dim, 0)) for t in range(len(tables)))]
    balanced_share = sum(whole) / topo.world_size
    groups: set[str] = set()  # shardings in use: their latency is paid once, by every rank
    for t in order:
        spec = tables[t]
        kinds = [forced[t]] if t in forced else _kinds_to_try(t, spec, whole[t], balanced_share, topo, loads, mem)
        best = None
        for pref, kind in enumerate(kinds):
            for tp in _candidates(kind, t, spec, topo, loads, column_shards):
                held = [loads[r].memory_bytes for r in range(topo.world_size)]
                group = GROUP_OF_KIND[tp.kind]
                opening = 0.0 if group in groups else group_latency_s(group, topo)
                cost = [loads[r].cost_s + opening for r in range(topo.world_size)]
                for s in tp.shards:
                    held[s.rank] += shard_memory(tp, s, spec, mem)
                    cost[s.rank] += shard_cost(tp, s, spec, topo, global_batch)
                if max(held) > topo.memory_bytes:
                    continue
                touched = max(cost[s.rank] for s in tp.shards)  # load-aware: the lightest ranks win ties
                key = (max(max(cost), balanced_share), touched, sum(cost), pref)
                if best is None or key < best[0]:
                    best = (key, tp)
        if best is None:
            first = _candidates(kinds[0], t, spec, topo, loads, column_shards)[0]
            need = max(shard_memory(first, s, spec, mem) for s in first.shards)
            free = max(topo.memory_bytes - ld.memory_bytes for ld in loads)
            raise PlanError(
                f"table {t} ({spec.rows} x {spec.dim}) fits on no rank as {'/'.join(kinds)}: a shard needs "
                f"{need / 2**30:.2f} GiB with optimizer state and exchange buffers, the most any rank has left is {free / 2**30:.2f} GiB "
                f"of {topo.memory_bytes / 2**30:.2f} GiB; add ranks, raise the memory budget or allow row_wise"
            )
        tp = best[1]
        plan[t] = tp
        if GROUP_OF_KIND[tp.kind] not in groups:
            groups.add(GROUP_OF_KIND[tp.kind])
            for ld in loads:
                ld.cost_s += group_latency_s(GROUP_OF_KIND[tp.kind], topo)
        for s in tp.shards:
            loads[s.rank].memory_bytes += shard_memory(tp, s, spec, mem)
            loads[s.rank].cost_s += shard_cost(tp, s, spec, topo, global_batch)
            loads[s.rank].shards.append(shard_label(t, tp, s))
    return plan, loads  # type: ignore[return-value]
