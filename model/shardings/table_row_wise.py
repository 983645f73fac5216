"""Table-row-wise and grid tables: each column block of a table row-wise over the ranks of one
node (TorchRec's twrw_sharding.py, and its GRID_SHARD: column blocks over nodes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from model.collective_ops import all_gather_single, all_to_all_single
from model.features import FeatureOrder, SparseFeatures
from model.ids_all_to_all import IdsAllToAll, PendingIds
from model.names import ShardingType
from model.sharding import Shard, TablePlan, grid_nodes, grid_shard, row_block, table_row_wise
from model.shardings.base import BackwardInFlight, ShardForward, ShardingContext, row_block_tbe
from model.wire_codec import WireCodec


@dataclass(frozen=True)
class NodeBlock:
    """Columns col_start..col_end of a table-row-wise sharding's feature `feature` (its position in
    the sharding's features), row-blocked over the ranks of node `node`: a table-row-wise table is
    one such block at full width, a grid table one a column block."""

    feature: int
    node: int
    col_start: int
    col_end: int

    @property
    def cols(self) -> int:
        return self.col_end - self.col_start


class TableRowWiseSharding:
    """Table-row-wise (TorchRec's TWRW) and grid (GRID_SHARD) tables: each column block of a table
    row-wise over the ranks of one node (a TWRW table is one block at full width).

    Ids go to each block's node's ranks by row block; each pools the rows it holds for the whole
    global batch; the partial sums are reduce-scattered inside the node, leaving node rank j the full
    sums of global-batch slice j (the local batches of ranks j*N .. j*N+N-1, N nodes); an
    all-to-all then sends each batch owner its rows, one pooled row per sample and block across
    nodes, and the owner puts the blocks' columns in feature order. Backward runs it in reverse:
    the gradient's columns by node, the all-to-all to the slice holders, an all-gather inside the
    node, the fused update.
    """

    def __init__(self, ctx: ShardingContext, *, features: Sequence[int], blocks: Sequence[NodeBlock]) -> None:
        """features: the tables; blocks: their column blocks, each feature's columns covered once."""
        self.ctx, self.features = ctx, list(features)
        w, f, dim = ctx.world_size, len(features), ctx.dim
        per_node = ctx.ranks_per_node or w
        if w % per_node:
            raise ValueError(f"world size {w} is not a whole number of nodes of {per_node} ranks")
        self.per_node, self.nodes = per_node, w // per_node
        node, self.slice = divmod(ctx.rank, per_node)
        self.owner_slice = ctx.rank // self.nodes  # which node rank holds this rank's samples' sums
        on_node = [sorted((e for e in blocks if e.node == k), key=lambda e: (e.feature, e.col_start))
                   for k in range(self.nodes)]
        # The pooled rows arrive node by node, block by block: column c of that order is column
        # cols[c] of the feature-ordered output (all of them once: checked).
        cols = [e.feature * dim + c for es in on_node for e in es for c in range(e.col_start, e.col_end)]
        if sorted(cols) != list(range(f * dim)) or any(not 0 <= e.node < self.nodes for e in blocks):
            raise ValueError("table-row-wise blocks must cover every feature's columns once, on nodes that exist")
        self.block_cols = None if cols == sorted(cols) else torch.tensor(cols, device=ctx.device)
        self.feature_cols = None if self.block_cols is None else torch.argsort(self.block_cols)
        self.node_widths = [sum(e.cols for e in es) for es in on_node]
        self.copies = [sum(e.feature == p for e in blocks) for p in range(f)]
        """How many nodes each feature's ids go to (its column blocks)."""
        rows = [ctx.table_rows[t] for t in self.features]
        row_blocks = [row_block(n, per_node) for n in rows]
        self.block_sizes = torch.tensor(row_blocks, dtype=torch.int64, device=ctx.device)
        # Bucketized, row j * f + p holds feature p's ids for node rank j; rank r gets those of its
        # node's blocks in its row block.
        order = [(r % per_node) * f + e.feature for r in range(w) for e in on_node[r // per_node]]
        self.send_order = FeatureOrder.of(order, ctx.device)
        mine = on_node[node]
        self.mine = [self.features[e.feature] for e in mine]
        self.local = [Shard(ctx.rank, min(rows[e.feature], self.slice * row_blocks[e.feature]),
                            min(rows[e.feature], (self.slice + 1) * row_blocks[e.feature]), e.col_start, e.col_end)
                      for e in mine]
        self.ids = IdsAllToAll(send_slots=[len(on_node[r // per_node]) for r in range(w)], recv_slots=len(mine),
                               world_size=w, group=ctx.ids_pg, device=ctx.device, transfer=ctx.transfer, wait=ctx.wait,
                               count=ctx.count_all_to_all)
        self.tbe = row_block_tbe(ctx, self.mine, self.local) if mine else None

    @classmethod
    def from_plan(cls, ctx: ShardingContext, plan: Sequence[TablePlan], tables: list[int]) -> TableRowWiseSharding:
        """The tables in the order of their blocks' nodes (then table), each column block a NodeBlock.
        The sharding derives the row blocks from the rows: a plan must have them as
        model.sharding.table_row_wise / grid_shard make them (ValueError otherwise)."""
        per_node = ctx.ranks_per_node or ctx.world_size
        ordered = sorted((grid_nodes(plan[t], per_node), t) for t in tables)
        blocks = []
        for p, (nodes, t) in enumerate(ordered):
            kind, rows = plan[t].kind, ctx.table_rows[t]
            made = (table_row_wise(rows, ctx.dim, nodes[0], per_node) if kind == ShardingType.TABLE_ROW_WISE
                    else grid_shard(rows, ctx.dim, nodes, per_node))
            if plan[t] != made:
                raise ValueError(f"table {t}: a {kind} plan needs row blocks over its nodes' {per_node} ranks, "
                                 f"as model.sharding.{kind} makes them")
            width = ctx.dim // len(nodes)
            blocks += [NodeBlock(p, n, i * width, (i + 1) * width) for i, n in enumerate(nodes)]
        return cls(ctx, features=[t for _, t in ordered], blocks=blocks)

    def prepare_input_dist(self, ids: SparseFeatures, *, splits_known: bool) -> PendingIds:
        """Ids by destination rank (its node's features, its row block of each), rebased to the
        block's first row; values per block depend on the ids, so `splits_known` cannot apply."""
        lengths, values, *_ = torch.ops.fbgemm.block_bucketize_sparse_features(
            ids.lengths.reshape(-1), ids.values, False, False, self.block_sizes, self.per_node, None
        )
        bucketed = SparseFeatures(lengths=lengths.view(-1, ids.batch_size), values=values)
        # Every bucket goes to one rank a column block of its feature: the values' number is known
        # on the host without reading the device, unless a grid table's ids go to several nodes
        # and the loader did not say how many each feature has (then the permute reads it).
        total = values.numel()
        if any(k > 1 for k in self.copies):
            total = None if ids.feature_values is None else sum(k * n for k, n in zip(self.copies, ids.feature_values))
        return PendingIds(self.ids, bucketed.permute(self.send_order, total_values=total))

    def _exchange_sizes(self, b: int, codec: WireCodec) -> tuple[list[int], list[int]]:
        """(what this rank sends each rank, what it receives from each) in the forward all-to-all,
        in the codec's units: a slice holder sends each owner of its slice that owner's rows of
        its node's tables."""
        w, n = self.ctx.world_size, self.nodes
        mine = codec.units(self.node_widths[self.ctx.rank // self.per_node])
        send = [b * mine if s // n == self.slice else 0 for s in range(w)]
        recv = [b * codec.units(self.node_widths[r // self.per_node]) if r % self.per_node == self.owner_slice else 0
                for r in range(w)]
        return send, recv

    def forward(self, local_ids: SparseFeatures, local_batch: int) -> tuple[torch.Tensor, ShardForward]:
        ctx, b, codec = self.ctx, local_batch, self.ctx.fwd_codec
        pooled, summed = None, torch.empty(0, device=ctx.device, dtype=codec.dtype)
        if self.tbe is not None:
            pooled = self.tbe(local_ids.values, local_ids.offsets())  # partial sums, (global batch, mine * dim)
            # The node's sums, encoded again for the trip across nodes (exact for a cast codec).
            summed = codec.encode(ctx.reduce_scatter_rows("pooled_fwd", pooled.detach(), self.per_node, ctx.node_pg))
        send, recv = self._exchange_sizes(b, codec)
        received = torch.empty(sum(recv), device=ctx.device, dtype=codec.dtype)
        ctx.count_all_to_all("pooled_fwd", send, recv, received.element_size())
        ctx.wait(all_to_all_single(received, summed.reshape(-1), output_split_sizes=recv, input_split_sizes=send,
                                        group=ctx.pg, async_op=True))
        widths = [self.node_widths[r // self.per_node] for r in range(ctx.world_size)]
        parts = [codec.decode(c.view(b, -1), wd) for c, n, wd in zip(received.split(recv), recv, widths) if n]
        out = torch.cat(parts, dim=1) if parts else torch.zeros(b, 0, device=ctx.device)  # nodes in order
        if self.feature_cols is not None:  # grid blocks (or features spread over nodes out of order)
            out = out.index_select(1, self.feature_cols)
        return out, ShardForward(pooled=pooled, local_batch=b)

    def start_backward(self, fwd: ShardForward, grad: torch.Tensor) -> BackwardInFlight:
        """Each node's columns of the pooled gradient to the rank holding this rank's slice there (async)."""
        b, codec = fwd.local_batch, self.ctx.bwd_codec
        send_back, recv_back = self._exchange_sizes(b, codec)  # the forward's sizes, the other way round
        if self.block_cols is not None:
            grad = grad.index_select(1, self.block_cols)
        send = torch.cat([codec.encode(c).reshape(-1) for c in grad.split(self.node_widths, dim=1)])
        received = torch.empty(sum(send_back), device=self.ctx.device, dtype=codec.dtype)
        self.ctx.count_all_to_all("pooled_bwd", recv_back, send_back, received.element_size())
        work = all_to_all_single(received, send, output_split_sizes=send_back, input_split_sizes=recv_back,
                                      group=self.ctx.pg, async_op=True)
        return BackwardInFlight(fwd, received, work)

    def finish_backward(self, flight: BackwardInFlight) -> None:
        """Wait for this rank's slice of the gradients, gather the node's slices (still encoded:
        one rounding), the fused update."""
        self.ctx.wait(flight.work)
        if self.tbe is None:
            return
        pooled, codec = flight.fwd.pooled, self.ctx.bwd_codec
        rows = flight.received.view(-1, codec.units(pooled.shape[1]))
        full = torch.empty(pooled.shape[0], rows.shape[1], device=self.ctx.device, dtype=rows.dtype)
        self.ctx.count_ring("pooled_bwd", full, self.per_node, passes=1)
        all_gather_single(full, rows, group=self.ctx.node_pg)
        pooled.backward(codec.decode(full, pooled.shape[1]))

    def shard_weights(self) -> list[tuple[int, Shard, torch.Tensor]]:
        if self.tbe is None:
            return []
        return [(t, s, w) for t, s, w in zip(self.mine, self.local, self.tbe.split_embedding_weights()) if s.rows]
