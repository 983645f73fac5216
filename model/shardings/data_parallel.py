"""Data-parallel tables: replicated on every rank, the gradient all-reduced (TorchRec's dp_sharding.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from model.adagrad import Adagrad
from model.embeddings import build_dense_tbe, init_shard_
from model.features import SparseFeatures
from model.ids_all_to_all import Ready
from model.sharding import Shard, TablePlan
from model.shardings.base import BackwardInFlight, ShardForward, ShardingContext


class DataParallelSharding:
    """Replicated tables: local lookup, gradient all-reduced, dense Adagrad (the same math as
    fbgemm's EXACT_ADAGRAD: untouched rows get a zero gradient and do not move)."""

    def __init__(self, ctx: ShardingContext, *, features: Sequence[int]) -> None:
        self.ctx, self.features = ctx, list(features)
        rows = [ctx.table_rows[t] for t in self.features]
        self.tbe = build_dense_tbe(rows=rows, dims=[ctx.dim] * len(rows), device=ctx.device)
        offsets = self.tbe.weights_offsets.tolist()
        with torch.no_grad():
            for i, (t, n) in enumerate(zip(self.features, rows)):
                view = self.tbe.weights[offsets[i] : offsets[i] + n * ctx.dim].view(n, ctx.dim)
                init_shard_(view, table=t, table_rows=n, table_dim=ctx.dim, row_start=0, col_start=0,
                            seed=ctx.init_seed)
        self.rows = rows
        self.offsets = offsets
        self.opt = Adagrad(self.tbe.weights, lr=ctx.learning_rate, eps=ctx.eps, impl=None)

    @classmethod
    def from_plan(cls, ctx: ShardingContext, plan: Sequence[TablePlan], tables: list[int]) -> DataParallelSharding:
        return cls(ctx, features=tables)

    def prepare_input_dist(self, ids: SparseFeatures, *, splits_known: bool) -> Ready:
        """Every rank holds the whole table: its own ids are all it needs."""
        return Ready(ids)

    def forward(self, local_ids: SparseFeatures, local_batch: int) -> tuple[torch.Tensor, ShardForward]:
        pooled = self.tbe(local_ids.values, local_ids.offsets())
        return pooled.detach(), ShardForward(pooled=pooled, local_batch=local_batch)

    def start_backward(self, fwd: ShardForward, grad: torch.Tensor) -> BackwardInFlight:
        """The local table gradient, then its all-reduce launched (async)."""
        fwd.pooled.backward(grad)
        work = None
        if self.ctx.world_size > 1:
            self.ctx.count_ring("table_grads", self.tbe.weights.grad, self.ctx.world_size, passes=2)
            work = dist.all_reduce(self.tbe.weights.grad, group=self.ctx.pg, async_op=True)
        return BackwardInFlight(fwd, self.tbe.weights.grad, work)

    def finish_backward(self, flight: BackwardInFlight) -> None:
        if flight.work is not None:
            self.ctx.wait(flight.work)
        self.opt.step()
        self.tbe.weights.grad = None

    def shard_weights(self) -> list[tuple[int, Shard, torch.Tensor]]:
        out = []
        for t, n, off in zip(self.features, self.rows, self.offsets):
            view = self.tbe.weights.detach()[off : off + n * self.ctx.dim].view(n, self.ctx.dim)
            out.append((t, Shard(self.ctx.rank, 0, n, 0, self.ctx.dim), view))
        return out
