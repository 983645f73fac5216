"""What a sharding plan moves and holds, rank by rank: an analytic count, no timing model.

For one training iteration of a global batch G (B = G / W a rank, W = N nodes x L ranks, a
node's ranks consecutive), every transfer is charged to both ends, at the level of the link it
takes (inside a node or between nodes; a rank's own share moves no bytes):

- table/column-wise shard on q (c columns): every rank s sends q its ids (8 B a value, 8 B a
  length); q sends s its B pooled rows (4c B each); s sends q their gradients;
- row-wise shard on q (a fraction f of the rows): ids as above but only the fraction f of the
  values; q sends each s the partial sums of s's samples (reduce-scatter, 4D B a sample) and
  receives each s's gradients (all-gather);
- table-row-wise shard on q (slice j of node n): ids as row-wise; inside the node q sends every
  other node rank its partial sums of their slices and, backward, its slice of the gradients
  (G / L samples each way); q sends each owner s of slice j (s // N == j) its summed rows and
  receives their gradients;
- grid shard: each column block (c columns) as a table-row-wise table of width c on its node, so
  its ids go to each of the k nodes, its partial sums and rows are c wide;
- data-parallel: the gradient all-reduce of the whole table, hierarchical as NCCL runs it on
  several nodes: 2(L-1)/L of the table inside the node, 2(N-1)/N of an L-th between nodes.

Each transfer belongs to one of three exchanges an iteration (PHASES: the ids in, the pooled
rows or partial sums out, their gradients back, data-parallel all-reduces with the gradients),
kept apart in the footprint: a link carries both directions at once inside one exchange only.

Bytes through a rank's own memory (the lookup), per iteration:

- table/column-wise: 3 x 4c B for each of the G x pooling ids (forward read, backward read and
  write: the optimizer is fused into the backward);
- row-wise kinds: the same for the fraction f of the ids, plus the partial sums of all G samples
  written and their gradients read (2 x 4c B a sample; c = D but for grid blocks);
- data-parallel: 3 x 4D B for each of the rank's own B x pooling ids, plus the dense update of
  the whole table: its gradient zeroed, then read with the Adagrad state and the weights and
  those two written back (6 x the table).

Memory a rank holds: weights and optimizer state of its shards (Adagrad: a float an element;
row-wise Adagrad: a float a row), data-parallel tables a dense gradient and dense Adagrad state
besides the weights (model/shardings/data_parallel.py), plus the exchange buffers of one iteration:
the ids a shard receives, the pooled rows and gradients of the whole batch it serves (partial
sums for the row-wise kinds), and on every rank its own B pooled rows and their gradients.

`table_footprint` is one table's count; the planner (model/planner.py) adds them up candidate by
candidate and turns them into seconds, so what it optimises and what this module reports agree.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from model.names import ROW_BLOCKED_KINDS, ShardingType
from model.sharding import TablePlan, block_rows

ID_BYTES = 8
FLOAT_BYTES = 4

PHASES = ("ids", "forward", "backward")
"""The exchanges of an iteration, one after the other: the ids in, the pooled rows (or partial sums)
out, their gradients back (and data-parallel tables' all-reduce). A link is full duplex inside one
exchange, not across them."""
IDS, FORWARD, BACKWARD = range(3)
LEVELS = ("intra", "inter")
"""Link levels: inside a node, between nodes."""
LOOKUP, MEMORY = 0, 1
"""Footprint rows: bytes through the rank's memory, bytes it holds; traffic rows follow (row())."""
FOOTPRINT_ROWS = 2 + len(PHASES) * len(LEVELS) * 2


def row(phase: int, level: int, into: bool) -> int:
    """The footprint row of the bytes a rank sends (into=False) or receives in one exchange on one level."""
    return 2 + (phase * len(LEVELS) + level) * 2 + into


def traffic_rows(level: int, into: bool) -> list[int]:
    """The rows of one level and direction, every exchange."""
    return [row(phase, level, into) for phase in range(len(PHASES))]


@dataclass(frozen=True, kw_only=True)
class Geometry:
    """The job a table's footprint is counted for."""

    world_size: int
    ranks_per_node: int
    global_batch: int
    state_per_element: float
    """Optimizer state floats a weight element (Adagrad: 1)."""
    state_per_row: float = 0.0
    """Optimizer state floats a row (row-wise Adagrad: 1)."""
    weight_bytes: float = FLOAT_BYTES
    """Bytes a weight element of a fused (sharded) table takes: 4 in fp32, 2 in fp16 (model/names.py
    WEIGHT_BYTES). The optimizer state stays fp32, and data-parallel tables stay fp32."""

    def __post_init__(self) -> None:
        if self.world_size % self.ranks_per_node:
            raise ValueError(f"world size {self.world_size} is not a whole number of nodes of {self.ranks_per_node} ranks")

    @property
    def nodes(self) -> int:
        return self.world_size // self.ranks_per_node


def shard_bytes(rows: int, cols: int, geo: Geometry) -> float:
    """What a fused shard of rows x cols holds on its rank: its weights and their optimizer state
    (a dynamic table's slots count as its rows)."""
    return rows * cols * (geo.weight_bytes + geo.state_per_element * FLOAT_BYTES) + rows * geo.state_per_row * FLOAT_BYTES


def table_footprint(tp: TablePlan, *, rows: int, dim: int, pooling: float, geo: Geometry) -> np.ndarray:
    """One table's count (the module docstring), shape (FOOTPRINT_ROWS, W), bytes."""
    w, per_node, g = geo.world_size, geo.ranks_per_node, geo.global_batch
    b = g / w
    node = np.arange(w) // per_node
    fp = np.zeros((FOOTPRINT_ROWS, w))
    # What each rank q sends every peer and receives from each, by exchange and by whom its peers
    # are (ALL, its NODE, the OWNERS of its slice), charged at the end (_charge) in a few matrix
    # products: one call a shard and exchange made the planner's search 4 s of a 16 x 8 dry run.
    sends, receives = np.zeros((len(PHASES), len(_PEERS), w)), np.zeros((len(PHASES), len(_PEERS), w))

    def exchange(phase: int, q: int, to_each: float, from_each: float, peers: int = ALL) -> None:
        """In one exchange q sends `to_each` bytes to every peer and receives `from_each` from each,
        charged at the level of the link between them; q itself moves nothing."""
        sends[phase, peers, q] += to_each
        receives[phase, peers, q] += from_each

    if tp.kind == ShardingType.DATA_PARALLEL:
        _add_data_parallel(fp, rows=rows, dim=dim, pooling=pooling, geo=geo)
        return fp

    fp[MEMORY] += 2 * b * dim * FLOAT_BYTES  # every rank: its own pooled rows and their gradients
    row_kinds = tp.kind in ROW_BLOCKED_KINDS
    # The share of a table's ids each shard gets: its rows' share, but a dynamic_row_wise shard's
    # rows are slots, and its ids are its row block's.
    share = block_rows(rows, w) if tp.kind == ShardingType.DYNAMIC_ROW_WISE else [sh.rows for sh in tp.shards]
    for sh, held in zip(tp.shards, share):
        q = sh.rank
        fp[MEMORY, q] += shard_bytes(sh.rows, sh.cols, geo)
        f = held / rows if row_kinds else 1.0
        fp[MEMORY, q] += ID_BYTES * (g * pooling * f + g)
        exchange(IDS, q, 0.0, ID_BYTES * (b * pooling * f + b))
        width = sh.cols  # a row-wise kind's block is full width, but for a grid table's column block
        fp[LOOKUP, q] += 3 * g * pooling * f * width * geo.weight_bytes  # rows read, read again and written back
        if not row_kinds:
            fp[MEMORY, q] += 2 * g * width * FLOAT_BYTES
            exchange(FORWARD, q, b * width * FLOAT_BYTES, 0.0)
            exchange(BACKWARD, q, 0.0, b * width * FLOAT_BYTES)
            continue
        fp[LOOKUP, q] += 2 * g * width * FLOAT_BYTES  # partial sums of every sample written, gradients read
        fp[MEMORY, q] += 2 * g * width * FLOAT_BYTES
        if tp.kind in (ShardingType.ROW_WISE, ShardingType.DYNAMIC_ROW_WISE):
            exchange(FORWARD, q, b * width * FLOAT_BYTES, 0.0)
            exchange(BACKWARD, q, 0.0, b * width * FLOAT_BYTES)
            continue
        slice_bytes = (g / per_node) * width * FLOAT_BYTES  # reduce-scatter forward, all-gather backward
        fp[MEMORY, q] += 2 * slice_bytes
        exchange(FORWARD, q, slice_bytes, 0.0, peers=NODE)  # what q receives, its peers' shards send
        exchange(BACKWARD, q, slice_bytes, 0.0, peers=NODE)
        exchange(FORWARD, q, b * width * FLOAT_BYTES, 0.0, peers=OWNERS)
        exchange(BACKWARD, q, 0.0, b * width * FLOAT_BYTES, peers=OWNERS)
    _charge(fp, sends, receives, geo)
    return fp


ALL, NODE, OWNERS = range(3)
_PEERS = ("all", "node", "owners")
"""Whom a rank q exchanges with: every rank; its node's ranks; the owners of its slice of the batch
(slice j = q's place in its node: the ranks s with s // N == j, a table-row-wise shard's owners)."""


@functools.lru_cache(maxsize=64)
def _peer_levels(world_size: int, ranks_per_node: int) -> tuple[np.ndarray, np.ndarray]:
    """[peers, level, q, s]: 1.0 where s is a peer of q (never q itself) over a link of that level;
    and [peers, level, q]: how many such s."""
    ranks = np.arange(world_size)
    node = ranks // ranks_per_node
    same = node[:, None] == node[None, :]
    peers = np.stack([np.ones_like(same), same, (ranks[None, :] // (world_size // ranks_per_node))
                      == (ranks[:, None] % ranks_per_node)]) & ~np.eye(world_size, dtype=bool)
    levels = np.stack([peers & same, peers & ~same], axis=1).astype(float)
    return levels, levels.sum(axis=3)


def _charge(fp: np.ndarray, sends: np.ndarray, receives: np.ndarray, geo: Geometry) -> None:
    """Each exchange's bytes to both ends (exchange() in table_footprint): a peer s of q receives
    what q sends each and sends what q receives from each; q sends and receives that times its
    peers."""
    levels, counts = _peer_levels(geo.world_size, geo.ranks_per_node)
    for phase in range(len(PHASES)):
        for peers in range(len(_PEERS)):
            to_each, from_each = sends[phase, peers], receives[phase, peers]
            if not (to_each.any() or from_each.any()):
                continue
            for level in range(len(LEVELS)):
                m, n = levels[peers, level], counts[peers, level]
                out, into = row(phase, level, False), row(phase, level, True)
                fp[into] += to_each @ m + from_each * n
                fp[out] += to_each * n + from_each @ m


def _add_data_parallel(fp: np.ndarray, *, rows: int, dim: int, pooling: float, geo: Geometry) -> None:
    """A data-parallel table's count added to `fp`: every rank its own lookups, the dense update,
    and the gradient all-reduce (the module docstring)."""
    per_node, b = geo.ranks_per_node, geo.global_batch / geo.world_size
    table = rows * dim * FLOAT_BYTES
    fp[LOOKUP] += 3 * b * pooling * dim * FLOAT_BYTES + 6 * table
    fp[MEMORY] += 3 * table + 2 * b * dim * FLOAT_BYTES  # weights, dense gradient and Adagrad state; own rows
    for level, nbytes in enumerate((2 * (per_node - 1) / per_node * table,
                                    2 * (geo.nodes - 1) / geo.nodes * table / per_node)):
        fp[row(BACKWARD, level, False)] += nbytes
        fp[row(BACKWARD, level, True)] += nbytes


@dataclass(frozen=True)
class PlanTraffic:
    """Per-rank arrays (length W): bytes sent and received on each link level, memory held."""

    intra_out: np.ndarray
    intra_in: np.ndarray
    inter_out: np.ndarray
    inter_in: np.ndarray
    memory: np.ndarray
    """Weights, optimizer state and one iteration's exchange buffers, bytes."""
    lookup: np.ndarray
    """Bytes through the rank's memory for lookups, gradients and dense updates."""

    @classmethod
    def of(cls, fp: np.ndarray) -> PlanTraffic:
        level = {name: fp[traffic_rows(lv, into)].sum(axis=0) for lv, into, name in (
            (0, False, "intra_out"), (0, True, "intra_in"), (1, False, "inter_out"), (1, True, "inter_in"))}
        return cls(**level, memory=fp[MEMORY], lookup=fp[LOOKUP])

    @property
    def inter(self) -> np.ndarray:
        """Bytes a rank moves between nodes, the busier direction (links are full duplex)."""
        return np.maximum(self.inter_out, self.inter_in)

    @property
    def intra(self) -> np.ndarray:
        return np.maximum(self.intra_out, self.intra_in)
