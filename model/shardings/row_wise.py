"""Row-wise tables: every rank a row block of each, partial sums reduce-scattered (TorchRec's
rw_sharding.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from model.collective_ops import all_gather_single
from model.features import SparseFeatures
from model.ids_all_to_all import IdsAllToAll, PendingIds
from model.sharding import Shard, TablePlan, row_block
from model.shardings.base import BackwardInFlight, ShardForward, ShardingContext, row_block_tbe


class RowWiseSharding:
    """Row-wise tables: ids bucketized by row block to the block's rank; each rank pools the
    rows it holds for the whole global batch; partial sums are reduce-scattered to the owners."""

    def __init__(self, ctx: ShardingContext, *, features: Sequence[int]) -> None:
        self.ctx, self.features = ctx, list(features)
        w, r = ctx.world_size, ctx.rank
        rows = [ctx.table_rows[t] for t in self.features]
        self.blocks = [row_block(n, w) for n in rows]
        self.block_sizes = torch.tensor(self.blocks, dtype=torch.int64, device=ctx.device)
        self.local = [Shard(r, min(n, r * b), min(n, (r + 1) * b), 0, ctx.dim) for n, b in zip(rows, self.blocks)]
        self.ids = IdsAllToAll(send_slots=[len(self.features)] * w, recv_slots=len(self.features),
                               world_size=w, group=ctx.ids_pg, device=ctx.device, transfer=ctx.transfer, wait=ctx.wait,
                               count=ctx.count_all_to_all)
        self.tbe = self._build_tbe()

    @classmethod
    def from_plan(cls, ctx: ShardingContext, plan: Sequence[TablePlan], tables: list[int]) -> RowWiseSharding:
        """Row blocks of ceil(rows / world_size), as model.sharding.row_wise plans them."""
        return cls(ctx, features=tables)

    def _build_tbe(self):
        """The fused table of this rank's row blocks, each initialised as its table's slice."""
        return row_block_tbe(self.ctx, self.features, self.local)

    def prepare_input_dist(self, ids: SparseFeatures, *, splits_known: bool) -> PendingIds:
        """Ids by destination rank (its row block), rebased to the block's first row: values
        per row block depend on the ids, so `splits_known` cannot apply here."""
        lengths, values, *_ = torch.ops.fbgemm.block_bucketize_sparse_features(
            ids.lengths.reshape(-1), ids.values, False, False, self.block_sizes, self.ctx.world_size, None
        )
        grouped = SparseFeatures(lengths=lengths.view(-1, ids.batch_size), values=values)
        return PendingIds(self.ids, grouped)

    def forward(self, local_ids: SparseFeatures, local_batch: int) -> tuple[torch.Tensor, ShardForward]:
        ctx = self.ctx
        pooled = self.tbe(local_ids.values, local_ids.offsets())  # partial sums, (global batch, F * dim)
        out = ctx.reduce_scatter_rows("pooled_fwd", pooled.detach(), ctx.world_size, ctx.pg)
        return out, ShardForward(pooled=pooled, local_batch=local_batch)

    def start_backward(self, fwd: ShardForward, grad: torch.Tensor) -> BackwardInFlight:
        """Every rank holding rows a sample used needs that sample's gradient: all-gather it (async)."""
        send = self.ctx.bwd_codec.encode(grad.contiguous())
        full = torch.empty(self.ctx.world_size * fwd.local_batch, send.shape[1], device=self.ctx.device,
                           dtype=send.dtype)
        self.ctx.count_ring("pooled_bwd", full, self.ctx.world_size, passes=1)
        work = all_gather_single(full, send, group=self.ctx.pg, async_op=True)
        return BackwardInFlight(fwd, full, work)

    def finish_backward(self, flight: BackwardInFlight) -> None:
        self.ctx.wait(flight.work)
        flight.fwd.pooled.backward(self.ctx.bwd_codec.decode(flight.received, flight.fwd.pooled.shape[1]))

    def shard_weights(self) -> list[tuple[int, Shard, torch.Tensor]]:
        return [(t, s, w) for t, s, w in zip(self.features, self.local, self.tbe.split_embedding_weights()) if s.rows]
