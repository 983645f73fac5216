"""Table-wise and column-wise tables: one sharding, a pooled all-to-all each way (TorchRec's
tw_sharding.py and cw_sharding.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from model.collective_ops import Done, all_to_all_single
from model.embeddings import build_fused_tbe, init_shard_
from model.features import FeatureOrder, SparseFeatures
from model.ids_all_to_all import IdsAllToAll, PendingIds
from model.sharding import Shard, TablePlan
from model.shardings.base import BackwardInFlight, ShardForward, ShardingContext


class PooledAllToAllSharding:
    """Table-wise and column-wise shards: each shard's owner looks up the whole global batch
    for its (feature, column block) and sends every batch owner its rows back."""

    def __init__(self, ctx: ShardingContext, *, features: Sequence[int],
                 slots: Sequence[tuple[int, int, Shard]]) -> None:
        """slots: (position of the feature in `features`, table index, shard) for every shard."""
        self.ctx, self.features = ctx, list(features)
        w = ctx.world_size
        by_rank = [sorted((s for s in slots if s[2].rank == r), key=lambda s: (s[0], s[2].col_start)) for r in range(w)]
        self.local = by_rank[ctx.rank]
        self.widths = [sum(s[2].cols for s in r_slots) for r_slots in by_rank]
        self.send_order = FeatureOrder.of([s[0] for r_slots in by_rank for s in r_slots], ctx.device)
        self.ids = IdsAllToAll(send_slots=[len(s) for s in by_rank], recv_slots=len(self.local),
                               world_size=w, group=ctx.ids_pg, device=ctx.device, transfer=ctx.transfer, wait=ctx.wait,
                               count=ctx.count_all_to_all)
        # With fixed hotness every rank knows what any rank sends anyone: ids per sample per slot.
        self.hot_to = [sum(ctx.multi_hot[self.features[p]] for p, _, _ in r_slots) for r_slots in by_rank]
        self.slots_to = [len(r_slots) for r_slots in by_rank]
        # Column j of what arrives (ranks in order, their slots in order) is output column out_cols[j].
        out_cols = [p * ctx.dim + s.col_start + j for r_slots in by_rank for p, _, s in r_slots for j in range(s.cols)]
        self.out_cols = torch.tensor(out_cols, dtype=torch.int64, device=ctx.device)
        self.in_cols = torch.argsort(self.out_cols)
        # One rank: its shards are every feature's columns in order, so nothing moves either way
        # but through the wire's codec (its rounding, none in fp32): no copy, cat or column gather.
        self.alone = w == 1
        self.tbe = None
        if self.local:
            self.tbe = build_fused_tbe(rows=[s.rows for *_, s in self.local], dims=[s.cols for *_, s in self.local],
                                       device=ctx.device, optimizer=ctx.optimizer,
                                       learning_rate=ctx.learning_rate, eps=ctx.eps, precision=ctx.table_precision)
            self._init_weights()

    @classmethod
    def from_plan(cls, ctx: ShardingContext, plan: Sequence[TablePlan], tables: list[int]) -> PooledAllToAllSharding:
        """Every shard of `tables`, each feature in table order."""
        return cls(ctx, features=tables, slots=[(p, t, s) for p, t in enumerate(tables) for s in plan[t].shards])

    def _init_weights(self) -> None:
        """Each shard its slice of its table's init."""
        for w_t, (_, t, s) in zip(self.tbe.split_embedding_weights(), self.local):
            init_shard_(w_t, table=t, table_rows=self.ctx.table_rows[t], table_dim=self.ctx.dim, row_start=s.row_start,
                        col_start=s.col_start, seed=self.ctx.init_seed)

    def static_splits(self, local_batch: int) -> tuple[list[list[int]], list[list[int]]]:
        """What the splits exchange would return for a fixed-hotness batch, computed locally."""
        sent = [[n * local_batch, h * local_batch] for n, h in zip(self.slots_to, self.hot_to)]
        me = self.ctx.rank
        return sent, [[self.slots_to[me] * local_batch, self.hot_to[me] * local_batch]] * self.ctx.world_size

    def prepare_input_dist(self, ids: SparseFeatures, *, splits_known: bool) -> PendingIds:
        """Ids regrouped by destination rank (a column-wise feature goes to each of its ranks),
        or with `splits_known` (every rank's batch has the fixed hotness) the splits computed
        here, so that no splits exchange runs."""
        grouped = ids.permute(self.send_order)
        return PendingIds(self.ids, grouped, known=self.static_splits(ids.batch_size) if splits_known else None)

    def forward(self, local_ids: SparseFeatures, local_batch: int) -> tuple[torch.Tensor, ShardForward]:
        ctx = self.ctx
        if self.tbe is not None:
            pooled = self.tbe(local_ids.values, local_ids.offsets())
        else:
            pooled = torch.zeros(local_batch * ctx.world_size, 0, device=ctx.device)
        # pooled is (global batch, local columns) row-major: each batch owner's rows are contiguous.
        codec = ctx.fwd_codec
        if self.alone:
            width = self.widths[0]
            out = codec.decode(codec.encode(pooled.detach()).view(local_batch, codec.units(width)), width)
            return out, ShardForward(pooled=pooled, local_batch=local_batch)
        send = codec.encode(pooled.detach())
        recv_splits = [local_batch * codec.units(wd) for wd in self.widths]
        send_splits = [local_batch * codec.units(self.widths[ctx.rank])] * ctx.world_size
        received = torch.empty(sum(recv_splits), device=ctx.device, dtype=send.dtype)
        ctx.count_all_to_all("pooled_fwd", send_splits, recv_splits, received.element_size())
        ctx.wait(all_to_all_single(
            received, send.reshape(-1), output_split_sizes=recv_splits,
            input_split_sizes=send_splits, group=ctx.pg, async_op=True,
        ))
        by_rank = [codec.decode(c.view(local_batch, codec.units(wd)), wd)
                   for c, wd in zip(received.split(recv_splits), self.widths)]
        out = torch.cat(by_rank, dim=1).index_select(1, self.in_cols)
        return out, ShardForward(pooled=pooled, local_batch=local_batch)

    def start_backward(self, fwd: ShardForward, grad: torch.Tensor) -> BackwardInFlight:
        """Send each shard's owner its columns of the pooled gradient (async)."""
        ctx, b, codec = self.ctx, fwd.local_batch, self.ctx.bwd_codec
        if self.alone:  # the whole gradient is this rank's, columns in order (the forward's comment)
            return BackwardInFlight(fwd, codec.encode(grad).contiguous(), Done())
        grouped = grad.index_select(1, self.out_cols)
        send = torch.cat([codec.encode(c).reshape(-1) for c in grouped.split(self.widths, dim=1)])
        mine = codec.units(self.widths[ctx.rank])
        received = torch.empty(b * ctx.world_size * mine, device=ctx.device, dtype=send.dtype)
        recv_splits, send_splits = [b * mine] * ctx.world_size, [b * codec.units(wd) for wd in self.widths]
        ctx.count_all_to_all("pooled_bwd", send_splits, recv_splits, received.element_size())
        work = all_to_all_single(received, send, output_split_sizes=recv_splits, input_split_sizes=send_splits,
                                      group=ctx.pg, async_op=True)
        return BackwardInFlight(fwd, received, work)

    def finish_backward(self, flight: BackwardInFlight) -> None:
        """Wait for the gradients of this rank's shards, then the fused backward-and-update."""
        self.ctx.wait(flight.work)
        if self.tbe is not None:
            rows = flight.received.view(flight.fwd.local_batch * self.ctx.world_size, -1)
            flight.fwd.pooled.backward(self.ctx.bwd_codec.decode(rows, self.widths[self.ctx.rank]))

    def shard_weights(self) -> list[tuple[int, Shard, torch.Tensor]]:
        if self.tbe is None:
            return []
        return [(t, s, w) for (_, t, s), w in zip(self.local, self.tbe.split_embedding_weights())]
