"""A sharding planner that explains itself: memory per rank and an estimated cost per rank.

Cost model: model/plan_traffic.py counts, for a table's candidate placement, the bytes every
rank moves through its memory, sends and receives on each link level (inside a node, between
nodes; every transfer charged to both ends) in each exchange of the iteration, and holds.

- A rank's seconds (rank_seconds, printed per rank): lookup bytes / memory bandwidth, plus for
  each exchange and level the busier direction / that level's bandwidth.
- The iteration's (step_seconds, what the search minimises): the same terms, each taken at its
  busiest rank, since a collective ends when its slowest rank does. Summing per rank instead
  would let one rank's long lookup hide another's long transfer (docs/model-notes.md).
- Latency: each sharding in use (table/column-wise tables share one, and so on) costs every
  rank its collectives' latency once (COLLECTIVES_OF_GROUP; the profile's latencies): on tiny
  (2 CPU ranks) this makes every table data-parallel, the faster plan there (docs/model-notes.md).

Search: tables are placed largest first. For each, every kind (table-wise on each rank,
column-wise into 2..column_shards blocks on the least loaded ranks, row-wise, table-row-wise on
each node and grid (2..column_shards column blocks, each table-row-wise on one of the least loaded
nodes) when the job spans nodes, data-parallel; a table forced dynamic: table-wise placements of its
slot table on each rank; forced dynamic_row_wise: its one placement, slots on every rank) whose
placement fits the memory left is tried,
and the best by, in order:

1. the resulting iteration seconds, but never below the balanced floor (the least total work any
   plan can do, spread evenly): below it, lowering the maximum buys nothing yet;
2. the total work the candidate adds over all ranks (splitting a table always adds work: partial
   sums, more collectives; it must pay for itself in step 1 or lose here);
3. load: the busiest rank it touches, then the busiest node, then the most memory a rank it
   touches holds (the lightest win);
4. the kind's order above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from model.plan_traffic import (
    FOOTPRINT_ROWS, LOOKUP, MEMORY, PHASES, Geometry, PlanTraffic, row, table_footprint,
)
from model.names import COLUMN_BLOCKED_KINDS, DYNAMIC_KINDS, NODE_BLOCKED_KINDS, SHARDING_TYPES, ShardingType
from model.sharding import (
    Shard, TablePlan, block_rows, column_wise, data_parallel, dynamic, dynamic_row_wise, grid_shard, row_wise,
    table_row_wise, table_wise,
)

MIN_COLUMN_BLOCK = 4
"""Columns a column-wise block needs at least, and a multiple of: fbgemm's CUDA kernels take
embedding dims divisible by 4 (TorchRec's column-wise blocks are 32 wide by default)."""


@dataclass(frozen=True, kw_only=True)
class Topology:
    world_size: int
    ranks_per_node: int
    memory_bytes: float
    """Memory a rank may use for embedding shards, their optimizer state and exchange buffers."""
    memory_bw: float
    """Bytes/s of the memory the tables live in."""
    intra_node_bw: float
    """Bytes/s a rank gets over the links inside a node, each direction."""
    inter_node_bw: float
    """Bytes/s a rank gets over the network between nodes, each direction."""
    intra_node_latency_s: float = 0.0
    """Seconds a collective inside a node costs whatever its size."""
    inter_node_latency_s: float = 0.0
    """Seconds a collective spanning nodes costs whatever its size."""

    @property
    def spans_nodes(self) -> bool:
        return self.world_size > self.ranks_per_node


@dataclass(frozen=True, kw_only=True)
class TableSpec:
    rows: int
    dim: int
    pooling: float
    """Ids a sample looks up in this table."""


@dataclass
class RankLoad:
    """What the plan puts on one rank: memory held, estimated seconds, the shards, the bytes."""

    memory_bytes: float = 0.0
    cost_s: float = 0.0
    shards: list[str] = field(default_factory=list)
    traffic: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    """Bytes an iteration: (intra-node in, intra-node out, inter-node in, inter-node out)."""


class PlanError(ValueError):
    """No plan: a table fits nowhere, or a forced type cannot work."""


ABBREVIATIONS = {ShardingType.TABLE_WISE: "TW", ShardingType.COLUMN_WISE: "CW", ShardingType.ROW_WISE: "RW",
                 ShardingType.TABLE_ROW_WISE: "TRW", ShardingType.GRID_SHARD: "GRID", ShardingType.DATA_PARALLEL: "DP",
                 ShardingType.DYNAMIC: "DYN", ShardingType.DYNAMIC_ROW_WISE: "DYN-RW"}


def shard_label(t: int, tp: TablePlan, s: Shard) -> str:
    """'t3:TW', 't3:CW[0:64]', 't3:RW', 't3:GRID[64:128]', 't3:DP': what a rank holds, for the printed plan."""
    if tp.kind in COLUMN_BLOCKED_KINDS:
        return f"t{t}:{ABBREVIATIONS[tp.kind]}[{s.col_start}:{s.col_end}]"
    if tp.kind in DYNAMIC_KINDS:
        return f"t{t}:{ABBREVIATIONS[tp.kind]}[{s.rows} slots]"
    return f"t{t}:{ABBREVIATIONS[tp.kind]}"


GROUP_OF_KIND = {ShardingType.TABLE_WISE: "pooled", ShardingType.COLUMN_WISE: "pooled",
                 ShardingType.ROW_WISE: "row_wise",
                 ShardingType.TABLE_ROW_WISE: "table_row_wise", ShardingType.GRID_SHARD: "table_row_wise",
                 ShardingType.DATA_PARALLEL: "data_parallel", ShardingType.DYNAMIC: "dynamic",
                 ShardingType.DYNAMIC_ROW_WISE: "dynamic_row_wise"}
"""The sharding (one set of collectives an iteration) a kind's tables share: the family of
model/shardings/registry.py FAMILY_OF, by its name (torch-free here)."""
COLLECTIVES_OF_GROUP = {"pooled": (4, 0), "row_wise": (4, 0), "table_row_wise": (4, 2), "data_parallel": (1, 0),
                        "dynamic": (4, 0), "dynamic_row_wise": (4, 0)}
"""(collectives over all ranks, collectives inside a node) a sharding runs an iteration: the splits and
ids exchanges, the forward and backward exchanges (table-row-wise adds its in-node reduce-scatter
and all-gather); data-parallel tables one gradient all-reduce."""


def group_latency_s(group: str, topo: Topology) -> float:
    """What a sharding's collectives cost every rank in latency alone, once, however many tables it holds."""
    world, node = COLLECTIVES_OF_GROUP[group]
    return world * (topo.inter_node_latency_s if topo.spans_nodes else topo.intra_node_latency_s) + \
        node * topo.intra_node_latency_s


def _bandwidths(topo: Topology) -> tuple[float, float]:
    return topo.intra_node_bw, topo.inter_node_bw


def rank_seconds(fp: np.ndarray, topo: Topology) -> np.ndarray:
    """Seconds per rank of a footprint (model/plan_traffic.py), latency aside: each exchange on each
    link level takes its busier direction (links are full duplex within an exchange)."""
    seconds = fp[LOOKUP] / topo.memory_bw
    for phase in range(len(PHASES)):
        for level, bw in enumerate(_bandwidths(topo)):
            seconds = seconds + np.maximum(fp[row(phase, level, False)], fp[row(phase, level, True)]) / bw
    return seconds


def step_seconds(fp: np.ndarray, topo: Topology) -> float:
    """What the embedding lookups and exchanges of a footprint cost the iteration, latency aside.
    A collective ends when its busiest rank is done, so each exchange on each level costs its
    busiest rank's time, and the lookups the busiest rank's (a sum of per-rank totals instead
    would let one rank's long lookup hide another's long transfer)."""
    seconds = float(fp[LOOKUP].max()) / topo.memory_bw
    for phase in range(len(PHASES)):
        for level, bw in enumerate(_bandwidths(topo)):
            seconds += max(fp[row(phase, level, False)].max(), fp[row(phase, level, True)].max()) / bw
    return seconds


def work_seconds(fp: np.ndarray, topo: Topology) -> float:
    """A footprint's total over all ranks, every byte priced once at its link's rate: unlike the
    maxima it does not depend on where the table goes, only on how it is split."""
    seconds = float(fp[LOOKUP].sum()) / topo.memory_bw
    for level, bw in enumerate(_bandwidths(topo)):
        seconds += sum(float(fp[row(phase, level, False)].sum()) for phase in range(len(PHASES))) / bw
    return seconds


def column_blocks(dim: int, most: int, holders: int) -> list[int]:
    """The column block counts 2..most that split `dim` into blocks of MIN_COLUMN_BLOCK columns or
    a multiple of it, one block a holder (a rank for column-wise, a node for grid). A single holder
    takes the table as one block (the kind's code path runs, as a forced plan there asks)."""
    if holders == 1:
        return [1]
    return [k for k in range(2, min(most, holders) + 1)
            if dim % k == 0 and (dim // k) % MIN_COLUMN_BLOCK == 0]


def _candidates(kind: ShardingType, spec: TableSpec, topo: Topology, lightest: list[int], lightest_nodes: list[int],
                column_shards: int, dynamic_slots: int) -> list[TablePlan]:
    """Every placement of one kind the search tries; `lightest`: the ranks, least loaded first;
    `lightest_nodes`: the nodes, least loaded first."""
    if kind == ShardingType.DYNAMIC:
        return [dynamic(spec.rows, spec.dim, r, dynamic_slots) for r in range(topo.world_size)]
    if kind == ShardingType.DYNAMIC_ROW_WISE:
        return [dynamic_row_wise(spec.rows, spec.dim, topo.world_size, dynamic_slots)]
    if kind == ShardingType.TABLE_WISE:
        return [table_wise(spec.rows, spec.dim, r) for r in range(topo.world_size)]
    if kind == ShardingType.COLUMN_WISE:
        return [column_wise(spec.rows, spec.dim, sorted(lightest[:k]))
                for k in column_blocks(spec.dim, column_shards, topo.world_size)]
    if kind == ShardingType.ROW_WISE:
        return [row_wise(spec.rows, spec.dim, topo.world_size)]
    if kind == ShardingType.TABLE_ROW_WISE:
        per_node = topo.ranks_per_node
        return [table_row_wise(spec.rows, spec.dim, node, per_node) for node in range(topo.world_size // per_node)]
    if kind == ShardingType.GRID_SHARD:
        return [grid_shard(spec.rows, spec.dim, sorted(lightest_nodes[:k]), topo.ranks_per_node)
                for k in column_blocks(spec.dim, column_shards, len(lightest_nodes))]
    return [data_parallel(spec.rows, spec.dim, topo.world_size)]


SEARCHED_KINDS = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE,
                  ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD, ShardingType.DATA_PARALLEL)
"""The kinds the search tries for a table not forced, in its tie-break order (never dynamic)."""


def _kinds(topo: Topology) -> list[ShardingType]:
    """SEARCHED_KINDS; table-row-wise and grid only when the job spans nodes (on one node they are row-wise)."""
    return [k for k in SEARCHED_KINDS if k not in NODE_BLOCKED_KINDS or topo.spans_nodes]


def plan_footprint(plan: Sequence[TablePlan], tables: Sequence[TableSpec], geo: Geometry) -> np.ndarray:
    total = np.zeros((FOOTPRINT_ROWS, geo.world_size))
    for tp, spec in zip(plan, tables):
        total += table_footprint(tp, rows=spec.rows, dim=spec.dim, pooling=spec.pooling, geo=geo)
    return total


def plan_latency_s(plan: Sequence[TablePlan], topo: Topology) -> float:
    return sum(group_latency_s(g, topo) for g in {GROUP_OF_KIND[tp.kind] for tp in plan})


def plan_step_seconds(plan: Sequence[TablePlan], tables: Sequence[TableSpec], topo: Topology, geo: Geometry) -> float:
    """What the planner minimises for a whole plan: step_seconds plus the latency of its shardings."""
    return step_seconds(plan_footprint(plan, tables, geo), topo) + plan_latency_s(plan, topo)


def plan_tables(
    tables: Sequence[TableSpec],
    topo: Topology,
    *,
    global_batch: int,
    state_per_element: float,
    state_per_row: float = 0.0,
    weight_bytes: float = 4.0,
    forced: dict[int, str] | None = None,
    column_shards: int = 4,
    dynamic_slots: Mapping[int, int] | None = None,
) -> tuple[list[TablePlan], list[RankLoad]]:
    """A plan for every table and each rank's resulting load. Raises PlanError with the reason.
    state_per_element / state_per_row: optimizer state floats, weight_bytes: bytes a fused table's
    weight element takes (see plan_traffic.Geometry);
    column_shards: the most column blocks tried; dynamic_slots: table -> its slots, for each table
    forced dynamic (placed as table-wise; the search never makes a table dynamic by itself)."""
    dynamic_slots = dynamic_slots or {}
    forced = _checked_forced(forced or {}, tables, topo, column_shards, dynamic_slots)
    geo = Geometry(world_size=topo.world_size, ranks_per_node=topo.ranks_per_node, global_batch=global_batch,
                   state_per_element=state_per_element, state_per_row=state_per_row, weight_bytes=weight_bytes)
    search = _Search(tables, topo, geo)
    for t in sorted(range(len(tables)), key=lambda t: (-tables[t].rows * tables[t].dim, t)):
        kinds = [forced[t]] if t in forced else _kinds(topo)
        search.place(t, kinds, column_shards, dynamic_slots.get(t, 0))
    return search.plan, search.loads()  # type: ignore[return-value]


def _checked_forced(forced: dict[int, str], tables: Sequence[TableSpec], topo: Topology, column_shards: int,
                    dynamic_slots: Mapping[int, int]) -> dict[int, ShardingType]:
    """The forced kinds as ShardingTypes; PlanError for one that cannot work."""
    for t, kind in forced.items():
        if kind not in SHARDING_TYPES:
            raise PlanError(f"table {t}: unknown sharding type {kind!r}; types are {', '.join(SHARDING_TYPES)}")
        if not 0 <= t < len(tables):
            raise PlanError(f"forced sharding names table {t}; tables are 0..{len(tables) - 1}")
        if kind in DYNAMIC_KINDS and not dynamic_slots.get(t, 0) >= 1:
            raise PlanError(f"table {t}: a dynamic table needs its slots (--dynamic-slots or --dynamic-memory-gib)")
        if kind == ShardingType.DYNAMIC_ROW_WISE and min(block_rows(tables[t].rows, topo.world_size)) < 1:
            raise PlanError(f"table {t}: dynamic_row_wise needs a row a rank; it has {tables[t].rows} rows for "
                            f"{topo.world_size} ranks")
        holders = {ShardingType.COLUMN_WISE: ("rank", topo.world_size),
                   ShardingType.GRID_SHARD: ("node", topo.world_size // topo.ranks_per_node)}
        if kind in holders and not column_blocks(tables[t].dim, column_shards, holders[kind][1]):
            what, n = holders[kind]
            raise PlanError(
                f"table {t}: {kind} needs 2..{column_shards} blocks (at most one a {what}, {n} {what}s) "
                f"of a multiple of {MIN_COLUMN_BLOCK} columns each; dim is {tables[t].dim}")
    return {t: ShardingType(kind) for t, kind in forced.items()}


class _Search:
    """plan_tables' search: tables placed one at a time, each where it costs least given what the
    tables placed before it add up to (the module docstring)."""

    def __init__(self, tables: Sequence[TableSpec], topo: Topology, geo: Geometry) -> None:
        self.tables, self.topo, self.geo = tables, topo, geo
        w = topo.world_size
        self.node_of = np.arange(w) // topo.ranks_per_node
        self.floor = self._balanced_floor()
        self.total = np.zeros((FOOTPRINT_ROWS, w))
        self.groups: set[str] = set()  # shardings in use: their latency is paid once, by every rank
        self.latency = 0.0
        self.plan: list[TablePlan | None] = [None] * len(tables)
        self.labels: list[list[str]] = [[] for _ in range(w)]

    def footprint(self, tp: TablePlan, spec: TableSpec) -> np.ndarray:
        return table_footprint(tp, rows=spec.rows, dim=spec.dim, pooling=spec.pooling, geo=self.geo)

    def _balanced_floor(self) -> float:
        """The least work each table can cost (whole on one rank, or replicated), spread evenly, plus
        the cheapest sharding's latency: no plan's busiest rank does less."""
        topo, w = self.topo, self.topo.world_size
        least = [min(work_seconds(self.footprint(table_wise(s.rows, s.dim, 0), s), topo),
                     work_seconds(self.footprint(data_parallel(s.rows, s.dim, w), s), topo)) for s in self.tables]
        return sum(least) / w + min(group_latency_s(GROUP_OF_KIND[k], topo) for k in _kinds(topo))

    def even(self, seconds: float) -> float:
        """Equal up to rounding: the same bytes summed in another order must tie, so that load decides."""
        return round(seconds / (self.floor or 1.0), 9)

    def place(self, t: int, kinds: Sequence[ShardingType], column_shards: int, slots: int) -> None:
        """Table t placed the best way of `kinds` (PlanError when none fits), its load added."""
        tp, fp = self._best(t, kinds, column_shards, slots)
        self.plan[t] = tp
        self.total += fp
        group = GROUP_OF_KIND[tp.kind]
        if group not in self.groups:
            self.groups.add(group)
            self.latency += group_latency_s(group, self.topo)
        for s in tp.shards:
            self.labels[s.rank].append(shard_label(t, tp, s))

    def _best(self, t: int, kinds: Sequence[ShardingType], column_shards: int,
              slots: int) -> tuple[TablePlan, np.ndarray]:
        """The best candidate placement of table t by the module docstring's order, and its footprint."""
        spec, topo, w, node_of = self.tables[t], self.topo, self.topo.world_size, self.node_of
        cost_now = rank_seconds(self.total, topo)
        node_now = np.bincount(node_of, weights=cost_now)
        lightest = sorted(range(w), key=lambda r: (cost_now[r], node_now[node_of[r]], r))
        lightest_nodes = sorted(range(w // topo.ranks_per_node), key=lambda n: (node_now[n], n))
        best, tightest = None, None
        for pref, kind in enumerate(kinds):
            for tp in _candidates(kind, spec, topo, lightest, lightest_nodes, column_shards, slots):
                fp = self.footprint(tp, spec)
                held = self.total[MEMORY] + fp[MEMORY]
                if tightest is None or held.max() < tightest:
                    tightest = held.max()
                if held.max() > topo.memory_bytes:
                    continue
                group = GROUP_OF_KIND[tp.kind]
                opening = 0.0 if group in self.groups else group_latency_s(group, topo)
                after = self.total + fp
                cost = rank_seconds(after, topo)
                owners = [s.rank for s in tp.shards]
                node_cost = np.bincount(node_of, weights=cost)
                key = (self.even(max(step_seconds(after, topo) + self.latency + opening, self.floor)),
                       self.even(work_seconds(fp, topo) + opening * w),
                       cost[owners].max(), node_cost[node_of[owners]].max(), held[owners].max(), pref)
                if best is None or key < best[0]:
                    best = (key, tp, fp)
        if best is None:
            raise PlanError(
                f"table {t} ({spec.rows} x {spec.dim}) fits on no rank as {'/'.join(kinds)}: the best placement "
                f"leaves a rank holding {tightest / 2**30:.2f} GiB (weights, optimizer state and exchange buffers) "
                f"of {topo.memory_bytes / 2**30:.2f} GiB; add ranks, raise the memory budget or allow row_wise"
            )
        return best[1], best[2]

    def loads(self) -> list[RankLoad]:
        """Each rank's memory, estimated seconds (latency included), shards and traffic."""
        seconds = rank_seconds(self.total, self.topo) + self.latency
        traffic = PlanTraffic.of(self.total)
        return [RankLoad(memory_bytes=float(self.total[MEMORY, r]), cost_s=float(seconds[r]), shards=self.labels[r],
                         traffic=(float(traffic.intra_in[r]), float(traffic.intra_out[r]),
                                  float(traffic.inter_in[r]), float(traffic.inter_out[r])))
                for r in range(self.topo.world_size)]
