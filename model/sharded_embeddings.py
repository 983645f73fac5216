"""The sharded embedding collection: every table placed by a plan, batches data-parallel.

Tables are grouped by how they are distributed (table/column-wise, row-wise, data-parallel),
one group each, as TorchRec does. The phases are separate methods (not one autograd
function) so the harness can time each stage and overlap the input distribution of the next
batch with the compute of this one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from model.embedding_groups import DataParallelGroup, GroupContext, GroupForward, PooledAllToAllGroup, RowWiseGroup
from model.features import SparseFeatures
from model.ids_all_to_all import IdsInFlight
from model.sharding import Shard, TablePlan, check_plan


@dataclass
class InputDistInFlight:
    """Input distribution after the splits exchange, with the ids all-to-alls under way."""

    flights: list[IdsInFlight | None]
    local: list[SparseFeatures | None]  # data-parallel groups need no exchange
    splits_exchanged: int
    """Groups that ran the splits all-to-all for this batch (0 when all were known in advance)."""


@dataclass
class EmbeddingForward:
    groups: list[GroupForward]
    local_batch: int


class ShardedEmbeddingCollection:
    def __init__(
        self,
        *,
        table_rows: Sequence[int],
        embedding_dim: int,
        plan: Sequence[TablePlan],
        rank: int,
        world_size: int,
        group: dist.ProcessGroup | None,
        ids_group: dist.ProcessGroup | None,
        device: torch.device,
        optimizer: str,
        learning_rate: float,
        eps: float,
        init_seed: int,
        multi_hot: Sequence[int],
        to_host: Callable[[torch.Tensor], list] = torch.Tensor.tolist,
    ) -> None:
        """multi_hot: ids a sample has in each feature when hotness is fixed (what makes splits
        computable in advance); ids_group: the process group of the ids exchange."""
        check_plan(plan, table_rows, embedding_dim, world_size)
        ctx = GroupContext(rank=rank, world_size=world_size, group=group, ids_group=ids_group, device=device,
                           to_host=to_host, dim=embedding_dim, optimizer=optimizer, learning_rate=learning_rate,
                           eps=eps, init_seed=init_seed)
        self.num_features, self.dim, self.device = len(table_rows), embedding_dim, device
        kinds = [tp.kind for tp in plan]
        pooled = [t for t, k in enumerate(kinds) if k in ("table_wise", "column_wise")]
        row_wise = [t for t, k in enumerate(kinds) if k == "row_wise"]
        replicated = [t for t, k in enumerate(kinds) if k == "data_parallel"]
        self.groups: list = []
        if pooled:
            slots = [(p, t, s) for p, t in enumerate(pooled) for s in plan[t].shards]
            self.groups.append(PooledAllToAllGroup(ctx, features=pooled, slots=slots, table_rows=table_rows,
                                                   multi_hot=multi_hot))
        if row_wise:
            self.groups.append(RowWiseGroup(ctx, features=row_wise, table_rows=table_rows))
        if replicated:
            self.groups.append(DataParallelGroup(ctx, features=replicated, table_rows=table_rows))
        self.select = [torch.tensor(g.features, dtype=torch.int32, device=device) for g in self.groups]
        group_order = [t for g in self.groups for t in g.features]
        self.group_order = torch.tensor(group_order, dtype=torch.int64, device=device)
        self.to_feature_order = torch.argsort(self.group_order)

    # ---- input distribution: bucketize, splits all-to-all (host sync), ids all-to-alls ---
    def start_input_dist(self, features: SparseFeatures, *, splits_known: bool = False) -> InputDistInFlight:
        """Bucketize, get the splits (exchanged, or computed locally when `splits_known`: every
        rank's batch has the fixed hotness, which the caller knows without asking the others),
        and launch the ids all-to-alls."""
        flights, local, exchanged = [], [], 0
        for g, sel in zip(self.groups, self.select):
            ids = features.permute(sel)
            if not g.distributes_ids:
                flights.append(None)
                local.append(ids)
                continue
            grouped = g.bucketize(ids)
            if splits_known and g.static_splits is not None:
                sent, received = g.static_splits(features.batch_size)
            else:
                sent, received = g.ids.exchange_splits(g.ids.counts(grouped))
                exchanged += 1
            flights.append(g.ids.start(grouped, sent, received))
            local.append(None)
        return InputDistInFlight(flights=flights, local=local, splits_exchanged=exchanged)

    def finish_input_dist(self, flight: InputDistInFlight) -> list[SparseFeatures]:
        return [
            g.ids.finish(f) if f is not None else loc for g, f, loc in zip(self.groups, flight.flights, flight.local)
        ]

    # ---- lookup, output distribution, and back ------------------------------------------
    def forward(self, ids: list[SparseFeatures], local_batch: int) -> tuple[torch.Tensor, EmbeddingForward]:
        """Pooled embeddings of this rank's samples, (local_batch, F * dim) in feature order.

        The returned tensor is a leaf that requires grad: the dense backward fills its .grad,
        which `backward` sends back to the tables.
        """
        outs, fwds = [], []
        for g, g_ids in zip(self.groups, ids):
            out, fwd = g.forward(g_ids, local_batch)
            outs.append(out)
            fwds.append(fwd)
        grouped = torch.cat(outs, dim=1).view(local_batch, self.num_features, self.dim)
        pooled = grouped.index_select(1, self.to_feature_order).reshape(local_batch, -1)
        return pooled.requires_grad_(True), EmbeddingForward(groups=fwds, local_batch=local_batch)

    def backward(self, fwd: EmbeddingForward, grad: torch.Tensor) -> None:
        b = fwd.local_batch
        grouped = grad.view(b, self.num_features, self.dim).index_select(1, self.group_order)
        parts = grouped.split([len(g.features) for g in self.groups], dim=1)
        for g, g_fwd, part in zip(self.groups, fwd.groups, parts):
            g.backward(g_fwd, part.reshape(b, -1))

    def shard_weights(self) -> list[tuple[int, Shard, torch.Tensor]]:
        """(table, shard, live weights) for every shard this rank holds."""
        return [item for g in self.groups for item in g.shard_weights()]
