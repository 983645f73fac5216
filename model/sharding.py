"""Sharding plans: where each embedding table's rows and columns live.

A plan is a list with one TablePlan per table. Every kind is expressed as shards (a row range
times a column range on one rank), so placement, memory and cost are computed one way:

- table_wise:    one shard, the whole table, on one rank;
- column_wise:   k shards, all rows, a column block each, on k distinct ranks;
- row_wise:      one shard per rank holding a block of ceil(rows / world) rows (the last
                 blocks may be short or, for tiny tables, empty and then absent);
- table_row_wise: row-wise over the ranks of one node only (TorchRec's TWRW): ids go to that
                 node's ranks, partial sums are reduced inside the node, and each sample's
                 pooled row crosses between nodes once;
- grid_shard:    column blocks on k distinct nodes, each table-row-wise over its node's ranks
                 (TorchRec's GRID_SHARD): a hot table's lookups and partial sums split k ways,
                 its ids sent to each of the k nodes;
- data_parallel: the whole table replicated on every rank;
- dynamic:       the whole id space on one rank (placed as table-wise), but only `slots` rows
                 resident: an ID transformer maps ids to slots and evicted rows go to a
                 parameter store (model/dynamic_table.py). Its one shard is the slot table:
                 rows 0..slots, so memory and traffic are counted for slots, not rows;
- dynamic_row_wise: dynamic, but the id space row-wise: rank r owns the ids of row block r (as
                 row_wise's) and keeps `slots` of them resident; its shard is its slot table,
                 rows 0..slots. Every block must have a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from model.names import SHARDING_TYPES, ShardingType


@dataclass(frozen=True)
class Shard:
    rank: int
    row_start: int
    row_end: int
    col_start: int
    col_end: int

    @property
    def rows(self) -> int:
        return self.row_end - self.row_start

    @property
    def cols(self) -> int:
        return self.col_end - self.col_start


@dataclass(frozen=True)
class TablePlan:
    kind: str
    """A ShardingType: a known type's plain string (a manifest's, TorchRec's) is turned into its
    member; an unknown one is kept for check_plan or the manifest to name. Typed str so the run
    manifest reads and writes it as the plain string it equals."""
    shards: tuple[Shard, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.kind, ShardingType) and self.kind in SHARDING_TYPES:
            object.__setattr__(self, "kind", ShardingType(self.kind))


def table_wise(rows: int, dim: int, rank: int) -> TablePlan:
    return TablePlan(ShardingType.TABLE_WISE, (Shard(rank, 0, rows, 0, dim),))


def column_wise(rows: int, dim: int, ranks: Sequence[int]) -> TablePlan:
    k = len(ranks)
    if k < 1 or dim % k or len(set(ranks)) != k:
        raise ValueError(f"column_wise needs {k} distinct ranks and a dim divisible by them; dim is {dim}")
    w = dim // k
    return TablePlan(ShardingType.COLUMN_WISE, tuple(Shard(r, 0, rows, i * w, (i + 1) * w) for i, r in enumerate(ranks)))


def row_block(rows: int, world_size: int) -> int:
    return -(-rows // world_size)


def row_wise(rows: int, dim: int, world_size: int) -> TablePlan:
    b = row_block(rows, world_size)
    shards = tuple(
        Shard(r, r * b, min(rows, (r + 1) * b), 0, dim) for r in range(world_size) if r * b < rows
    )
    return TablePlan(ShardingType.ROW_WISE, shards)


def table_row_wise(rows: int, dim: int, node: int, ranks_per_node: int) -> TablePlan:
    """Row blocks of ceil(rows / ranks_per_node) over node `node`'s ranks (empty blocks absent)."""
    b = row_block(rows, ranks_per_node)
    first = node * ranks_per_node
    shards = tuple(
        Shard(first + j, j * b, min(rows, (j + 1) * b), 0, dim) for j in range(ranks_per_node) if j * b < rows
    )
    return TablePlan(ShardingType.TABLE_ROW_WISE, shards)


def grid_shard(rows: int, dim: int, nodes: Sequence[int], ranks_per_node: int) -> TablePlan:
    """Column block i of dim / len(nodes) columns table-row-wise on node nodes[i] (distinct nodes)."""
    k = len(nodes)
    if k < 1 or dim % k or len(set(nodes)) != k:
        raise ValueError(f"grid_shard needs {k} distinct nodes and a dim divisible by them; dim is {dim}")
    w = dim // k
    shards = []
    for i, node in enumerate(nodes):
        block = table_row_wise(rows, w, node, ranks_per_node)
        shards += [Shard(s.rank, s.row_start, s.row_end, i * w, (i + 1) * w) for s in block.shards]
    return TablePlan(ShardingType.GRID_SHARD, tuple(shards))


def grid_nodes(tp: TablePlan, ranks_per_node: int) -> list[int]:
    """The node of each column block of a table-row-wise or grid plan, in column order."""
    return [node for _, node in sorted({(s.col_start, s.rank // ranks_per_node) for s in tp.shards})]


def data_parallel(rows: int, dim: int, world_size: int) -> TablePlan:
    return TablePlan(ShardingType.DATA_PARALLEL, tuple(Shard(r, 0, rows, 0, dim) for r in range(world_size)))


def dynamic(rows: int, dim: int, rank: int, slots: int) -> TablePlan:
    """A dynamic table on `rank` with min(slots, rows) slots resident."""
    if slots < 1:
        raise ValueError(f"a dynamic table needs at least one slot, got {slots}")
    return TablePlan(ShardingType.DYNAMIC, (Shard(rank, 0, min(slots, rows), 0, dim),))


def dynamic_row_wise(rows: int, dim: int, world_size: int, slots: int) -> TablePlan:
    """A dynamic table row-wise: each rank min(slots, its block's rows) slots for its block's ids."""
    if slots < 1:
        raise ValueError(f"a dynamic table needs at least one slot, got {slots}")
    blocks = block_rows(rows, world_size)
    if min(blocks) < 1:
        raise ValueError(f"a dynamic_row_wise table needs a row a rank: {rows} rows over {world_size} ranks")
    return TablePlan(ShardingType.DYNAMIC_ROW_WISE, tuple(Shard(r, 0, min(slots, n), 0, dim) for r, n in enumerate(blocks)))


def block_rows(rows: int, world_size: int) -> list[int]:
    """Rows of each rank's row block (row_wise's blocks; the last may be short or empty)."""
    b = row_block(rows, world_size)
    return [max(0, min(rows, (r + 1) * b) - r * b) for r in range(world_size)]


def check_plan(plan: Sequence[TablePlan], table_rows: Sequence[int], dim: int, world_size: int) -> None:
    """Every table covered exactly once (replicas aside), on ranks that exist; a dynamic table
    by one full-width slot table of at most its rows (dynamic_row_wise: one a rank, of at most its block)."""
    if len(plan) != len(table_rows):
        raise ValueError(f"plan has {len(plan)} tables, model has {len(table_rows)}")
    for t, (tp, rows) in enumerate(zip(plan, table_rows)):
        if tp.kind not in SHARDING_TYPES:
            raise ValueError(f"table {t}: unknown sharding type {tp.kind!r}")
        if any(not 0 <= s.rank < world_size for s in tp.shards):
            raise ValueError(f"table {t}: shard on a rank outside 0..{world_size - 1}")
        if tp.kind == ShardingType.DYNAMIC:
            if len(tp.shards) != 1 or tp.shards[0].cols != dim or not 1 <= tp.shards[0].rows <= rows:
                raise ValueError(f"table {t}: a dynamic table is one shard of 1..{rows} slots x {dim}")
            continue
        if tp.kind == ShardingType.DYNAMIC_ROW_WISE:
            blocks = block_rows(rows, world_size)
            if ([s.rank for s in tp.shards] != list(range(world_size))
                    or any(s.cols != dim or not 1 <= s.rows <= n for s, n in zip(tp.shards, blocks))):
                raise ValueError(f"table {t}: a dynamic_row_wise table is one shard a rank, rank r's of 1..(its "
                                 f"row block's rows) slots x {dim}")
            continue
        copies = world_size if tp.kind == ShardingType.DATA_PARALLEL else 1
        if sum(s.rows * s.cols for s in tp.shards) != copies * rows * dim:
            raise ValueError(f"table {t}: {tp.kind} shards do not cover {rows} x {dim} exactly")
