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
- data-parallel: the gradient all-reduce of the whole table, hierarchical as NCCL runs it on
  several nodes: 2(L-1)/L of the table inside the node, 2(N-1)/N of an L-th between nodes.

Memory a rank holds: weights and optimizer state of its shards (Adagrad: a float an element;
row-wise Adagrad: a float a row; data-parallel tables also a dense gradient and dense Adagrad
state), plus the exchange buffers of one iteration (ids received, pooled outputs and gradients,
partial sums).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from model.names import STATE_PER_ELEMENT, STATE_PER_ROW
from model.sharding import TablePlan

ID_BYTES = 8
FLOAT_BYTES = 4


@dataclass(frozen=True)
class PlanTraffic:
    """Per-rank arrays (length W): bytes sent and received on each link level, memory held."""

    intra_out: np.ndarray
    intra_in: np.ndarray
    inter_out: np.ndarray
    inter_in: np.ndarray
    memory: np.ndarray
    """Weights, optimizer state and one iteration's exchange buffers, bytes."""

    @property
    def inter(self) -> np.ndarray:
        """Bytes a rank moves between nodes, the busier direction (links are full duplex)."""
        return np.maximum(self.inter_out, self.inter_in)

    @property
    def intra(self) -> np.ndarray:
        return np.maximum(self.intra_out, self.intra_in)


def plan_traffic(plan: Sequence[TablePlan], *, table_rows: Sequence[int], pooling: Sequence[float], dim: int,
                 world_size: int, ranks_per_node: int, global_batch: int, optimizer: str) -> PlanTraffic:
    """The analytic count of the module docstring for `plan`."""
    w, per_node = world_size, ranks_per_node
    if w % per_node:
        raise ValueError(f"world size {w} is not a whole number of nodes of {per_node} ranks")
    nodes, g = w // per_node, global_batch
    b = g / w
    node = np.arange(w) // per_node
    out = {k: np.zeros(w) for k in ("intra_out", "intra_in", "inter_out", "inter_in", "memory")}
    per_element, per_row = STATE_PER_ELEMENT[optimizer], STATE_PER_ROW[optimizer]

    def move(src: int, dst: int, nbytes: float) -> None:
        if src == dst or nbytes == 0:
            return
        level = "intra" if node[src] == node[dst] else "inter"
        out[f"{level}_out"][src] += nbytes
        out[f"{level}_in"][dst] += nbytes

    for tp, rows, p in zip(plan, table_rows, pooling):
        for sh in tp.shards:
            q = sh.rank
            weights = sh.rows * sh.cols * FLOAT_BYTES
            out["memory"][q] += weights * (1 + per_element) + sh.rows * per_row * FLOAT_BYTES
            if tp.kind == "data_parallel":
                table = rows * dim * FLOAT_BYTES
                out["memory"][q] += 2 * table + b * dim * FLOAT_BYTES  # dense gradient, dense Adagrad state
                intra = 2 * (per_node - 1) / per_node * table
                inter = 2 * (nodes - 1) / nodes * table / per_node
                out["intra_out"][q] += intra
                out["intra_in"][q] += intra
                out["inter_out"][q] += inter
                out["inter_in"][q] += inter
                continue
            f = sh.rows / rows if tp.kind in ("row_wise", "table_row_wise") else 1.0
            ids = ID_BYTES * (b * p * f + b)
            out["memory"][q] += ID_BYTES * (g * p * f + g)
            for s in range(w):
                move(s, q, ids)
            if tp.kind in ("table_wise", "column_wise"):
                rows_bytes = b * sh.cols * FLOAT_BYTES
                out["memory"][q] += 2 * g * sh.cols * FLOAT_BYTES
                for s in range(w):
                    move(q, s, rows_bytes)
                    move(s, q, rows_bytes)
                    out["memory"][s] += 2 * rows_bytes
            elif tp.kind == "row_wise":
                out["memory"][q] += 2 * g * dim * FLOAT_BYTES
                for s in range(w):
                    move(q, s, b * dim * FLOAT_BYTES)
                    move(s, q, b * dim * FLOAT_BYTES)
            else:  # table_row_wise
                out["memory"][q] += 2 * g * dim * FLOAT_BYTES + 2 * (g / per_node) * dim * FLOAT_BYTES
                first, j = node[q] * per_node, q % per_node
                for other in range(first, first + per_node):
                    move(q, other, 2 * (g / per_node) * dim * FLOAT_BYTES)
                for s in range(w):
                    if s // nodes == j:
                        move(q, s, b * dim * FLOAT_BYTES)
                        move(s, q, b * dim * FLOAT_BYTES)
    return PlanTraffic(**out)
