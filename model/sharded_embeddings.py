"""The sharded embedding collection: every table placed by a plan, batches data-parallel.

Tables are grouped by how they are distributed (table/column-wise, row-wise, table-row-wise and
grid, dynamic, dynamic row-wise, data-parallel), one sharding each, as TorchRec does
(model/shardings/). The phases are separate methods (not one autograd function) so the harness
can time each stage and overlap the input distribution of the next batch with the compute of this one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from model.dynamic_table import DynamicCounts
from model.features import FeatureOrder, SparseFeatures
from model.ids_all_to_all import PendingIds, Ready
from model.sharding import Shard, TablePlan, check_plan
from model.shardings import BackwardInFlight, EmbeddingSharding, ShardForward, ShardingContext, build_shardings
from model.shardings.dynamic import DynamicSlots

__all__ = ["EmbeddingForward", "PendingBackward", "PendingInputDist", "ShardedEmbeddingCollection", "ShardingContext"]


@dataclass
class PendingInputDist:
    """One batch's input distribution under way, one pending object per sharding."""

    pending: list[PendingIds | Ready]

    @property
    def splits_exchanged(self) -> int:
        """Shardings that ran the splits all-to-all for this batch (0 when all were known in advance)."""
        return sum(p.splits_exchanged for p in self.pending)

    def start_splits(self) -> None:
        """Launch the splits all-to-alls (the batch's first collectives); idempotent."""
        for p in self.pending:
            p.start_splits()

    def launch(self) -> None:
        """Read the splits (the host sync) and launch the ids all-to-alls; idempotent."""
        for p in self.pending:
            p.launch()

    def wait(self) -> list[SparseFeatures]:
        """The ids of every sharding, ready for lookup (launches what is not launched yet)."""
        return [p.wait() for p in self.pending]


@dataclass
class EmbeddingForward:
    shards: list[ShardForward]
    local_batch: int


@dataclass
class PendingBackward:
    """The pooled gradient's exchanges launched, one per sharding; `wait()` applies the updates."""

    shardings: list[EmbeddingSharding]
    flights: list[BackwardInFlight]

    def wait(self) -> None:
        for s, flight in zip(self.shardings, self.flights):
            s.finish_backward(flight)


class ShardedEmbeddingCollection:
    """Every table of a plan on its ranks, one sharding a family (model/shardings/registry.py)."""

    def __init__(self, ctx: ShardingContext, plan: Sequence[TablePlan]) -> None:
        """ctx: the job, the tables, the wire and the dynamic settings (model/shardings/base.py);
        plan: one TablePlan a table, checked here against the tables and the world size."""
        check_plan(plan, ctx.table_rows, ctx.dim, ctx.world_size)
        self.num_features, self.dim, self.device = len(ctx.table_rows), ctx.dim, ctx.device
        self.shardings: list[EmbeddingSharding] = build_shardings(ctx, plan)
        self.dynamic: list[DynamicSlots] = [s for s in self.shardings if isinstance(s, DynamicSlots)]
        self.select = [FeatureOrder.of(s.features, ctx.device) for s in self.shardings]
        # Each sharding's columns of the pooled tensor, moved in one copy each way (a gather or a
        # scatter of the sharding's features), or none where one sharding holds every feature in order.
        self.columns = [torch.tensor(s.features, dtype=torch.int64, device=ctx.device) for s in self.shardings]
        self.in_order = [list(s.features) for s in self.shardings] == [list(range(self.num_features))]

    # ---- input distribution: bucketize, splits all-to-all (host sync), ids all-to-alls ---
    def prepare_input_dist(self, features: SparseFeatures, *, splits_known: bool = False) -> PendingInputDist:
        """Bucketize and count the splits (or take them as computed locally when `splits_known`:
        every rank's batch has the fixed hotness, which the caller knows without asking the
        others). Device work only, no collective: any thread may call it; the caller then
        launches the collectives through the returned object."""
        return PendingInputDist([
            s.prepare_input_dist(features.permute(sel), splits_known=splits_known)
            for s, sel in zip(self.shardings, self.select)
        ])

    # ---- lookup, output distribution, and back ------------------------------------------
    def forward(self, ids: list[SparseFeatures], local_batch: int,
                out: torch.Tensor | None = None) -> tuple[torch.Tensor, EmbeddingForward]:
        """Pooled embeddings of this rank's samples, (local_batch, F * dim) in feature order.

        The returned tensor is a leaf that requires grad: the dense backward fills its .grad,
        which `start_backward` sends back to the tables. `out`: a (local_batch, F * dim) buffer
        to write them into and return instead (a CUDA graph's static input: no copy a step).
        """
        outs, fwds = [], []
        for s, s_ids in zip(self.shardings, ids):
            s_out, s_fwd = s.forward(s_ids, local_batch)
            outs.append(s_out)
            fwds.append(s_fwd)
        fwd = EmbeddingForward(shards=fwds, local_batch=local_batch)
        if self.in_order and out is None:
            return outs[0].reshape(local_batch, -1).requires_grad_(True), fwd
        pooled = out if out is not None else torch.empty(local_batch, self.num_features * self.dim,
                                                         dtype=outs[0].dtype, device=outs[0].device)
        grouped = pooled.view(local_batch, self.num_features, self.dim)
        with torch.no_grad():  # out may be a leaf that requires grad (the graph's static input)
            if self.in_order:
                grouped.copy_(outs[0].reshape(local_batch, self.num_features, self.dim))
            else:
                for cols, s_out in zip(self.columns, outs):
                    grouped.index_copy_(1, cols, s_out.reshape(local_batch, len(cols), self.dim))
        return pooled if out is not None else pooled.requires_grad_(True), fwd

    def start_backward(self, fwd: EmbeddingForward, grad: torch.Tensor) -> PendingBackward:
        """Launch the exchanges of the pooled gradient (`grad`, (local_batch, F * dim) in feature
        order); nothing waits here, so the caller may launch this as soon as the gradient exists
        (from a hook inside the dense backward) and wait when it has nothing else to do."""
        b = fwd.local_batch
        if self.in_order:
            parts = [grad.contiguous()]
        else:
            grouped = grad.view(b, self.num_features, self.dim)
            parts = [grouped.index_select(1, cols).view(b, -1) for cols in self.columns]
        flights = [s.start_backward(s_fwd, part) for s, s_fwd, part in zip(self.shardings, fwd.shards, parts)]
        return PendingBackward(self.shardings, flights)

    def dynamic_counts(self) -> dict[int, DynamicCounts]:
        """What each dynamic table on this rank moved between its slots and the store."""
        return {t: c for s in self.dynamic for t, c in s.counts().items()}

    def shard_weights(self) -> list[tuple[int, Shard, torch.Tensor]]:
        """(table, shard, live weights) for every shard this rank holds (a dynamic table: all its
        rows or, row-wise, its row block's, a copy; see model/shardings/dynamic.py DynamicSharding.shard_weights)."""
        return [item for s in self.shardings for item in s.shard_weights()]
