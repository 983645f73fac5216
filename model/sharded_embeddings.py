"""The sharded embedding collection: every table placed by a plan, batches data-parallel.

Tables are grouped by how they are distributed (table/column-wise, row-wise, table-row-wise and
grid, dynamic, dynamic row-wise, data-parallel), one sharding each, as TorchRec does. The phases are separate methods (not
one autograd function) so the harness can time each stage and overlap the input distribution of
the next batch with the compute of this one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from model.collective_bytes import CollectiveBytes
from model.collective_wait import WaitFn, block
from model.dynamic_table import DynamicCounts, DynamicSettings
from model.embedding_shardings import (
    BackwardInFlight, DataParallelSharding, DynamicRowWiseSharding, DynamicSharding, EmbeddingSharding, NodeBlock,
    PooledAllToAllSharding, RowWiseSharding, ShardForward, ShardingContext, TableRowWiseSharding,
)
from model.features import FeatureOrder, SparseFeatures
from model.ids_all_to_all import PLAIN_TRANSFER, HostTransfer, PendingIds, Ready
from model.names import NODE_BLOCKED_KINDS
from model.sharding import Shard, TablePlan, check_plan, grid_nodes, grid_shard, table_row_wise


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
    def __init__(
        self,
        *,
        table_rows: Sequence[int],
        embedding_dim: int,
        plan: Sequence[TablePlan],
        rank: int,
        world_size: int,
        pg: dist.ProcessGroup | None,
        ids_pg: dist.ProcessGroup | None,
        device: torch.device,
        optimizer: str,
        learning_rate: float,
        eps: float,
        init_seed: int,
        multi_hot: Sequence[int],
        transfer: HostTransfer = PLAIN_TRANSFER,
        wait: WaitFn = block,
        ranks_per_node: int | None = None,
        node_pg: dist.ProcessGroup | None = None,
        table_precision: str = "fp32",
        bytes_moved: CollectiveBytes | None = None,
        comm_fwd: str = "fp32",
        comm_bwd: str = "fp32",
        dynamic: DynamicSettings | None = None,
    ) -> None:
        """multi_hot: ids a sample has in each feature when hotness is fixed (what makes splits
        computable in advance); ids_pg: the process group of the ids exchange; ranks_per_node and
        node_pg (this rank's node's group): what table-row-wise tables need (None: one node);
        table_precision: the fused tables' weights (fp32 or fp16); bytes_moved: where every exchange
        counts the bytes it moves (None: not counted); comm_fwd / comm_bwd: the pooled embeddings'
        and their gradients' precision on the wire; dynamic: how dynamic tables run (their policy and
        this rank's parameter store; needed when the plan has one)."""
        check_plan(plan, table_rows, embedding_dim, world_size)
        ctx = ShardingContext(rank=rank, world_size=world_size, pg=pg, ids_pg=ids_pg, device=device,
                              ranks_per_node=ranks_per_node, node_pg=node_pg,
                              transfer=transfer, wait=wait, dim=embedding_dim, optimizer=optimizer,
                              learning_rate=learning_rate, eps=eps, init_seed=init_seed,
                              table_precision=table_precision, bytes_moved=bytes_moved,
                              comm_fwd=comm_fwd, comm_bwd=comm_bwd)
        self.num_features, self.dim, self.device = len(table_rows), embedding_dim, device
        kinds = [tp.kind for tp in plan]
        pooled = [t for t, k in enumerate(kinds) if k in ("table_wise", "column_wise")]
        row_wise = [t for t, k in enumerate(kinds) if k == "row_wise"]
        per_node = ranks_per_node or world_size
        # Table-row-wise and grid tables share one sharding: each column block row-wise in a node.
        node_blocked = sorted((grid_nodes(plan[t], per_node), t) for t, k in enumerate(kinds) if k in NODE_BLOCKED_KINDS)
        blocks = []
        for p, (nodes, t) in enumerate(node_blocked):
            # The sharding derives the row blocks from the rows: the plan must agree.
            made = (table_row_wise(table_rows[t], embedding_dim, nodes[0], per_node) if kinds[t] == "table_row_wise"
                    else grid_shard(table_rows[t], embedding_dim, nodes, per_node))
            if plan[t] != made:
                raise ValueError(f"table {t}: a {kinds[t]} plan needs row blocks over its nodes' {per_node} ranks, "
                                 f"as model.sharding.{kinds[t]} makes them")
            width = embedding_dim // len(nodes)
            blocks += [NodeBlock(p, n, i * width, (i + 1) * width) for i, n in enumerate(nodes)]
        replicated = [t for t, k in enumerate(kinds) if k == "data_parallel"]
        dynamic_tables = [t for t, k in enumerate(kinds) if k == "dynamic"]
        dynamic_row_wise = [t for t, k in enumerate(kinds) if k == "dynamic_row_wise"]
        if (dynamic_tables or dynamic_row_wise) and dynamic is None:
            raise ValueError(f"tables {dynamic_tables + dynamic_row_wise} are dynamic: their policy and parameter store "
                             "are needed")
        self.shardings: list[EmbeddingSharding] = []
        self.dynamic: list[DynamicSharding | DynamicRowWiseSharding] = []
        if pooled:
            slots = [(p, t, s) for p, t in enumerate(pooled) for s in plan[t].shards]
            self.shardings.append(PooledAllToAllSharding(ctx, features=pooled, slots=slots, table_rows=table_rows,
                                                         multi_hot=multi_hot))
        if row_wise:
            self.shardings.append(RowWiseSharding(ctx, features=row_wise, table_rows=table_rows))
        if node_blocked:
            self.shardings.append(TableRowWiseSharding(ctx, features=[t for _, t in node_blocked], blocks=blocks,
                                                       table_rows=table_rows))
        if dynamic_tables:
            slots = [(p, t, s) for p, t in enumerate(dynamic_tables) for s in plan[t].shards]
            self.dynamic.append(DynamicSharding(ctx, features=dynamic_tables, slots=slots, table_rows=table_rows,
                                                multi_hot=multi_hot, settings=dynamic))
        if dynamic_row_wise:
            self.dynamic.append(DynamicRowWiseSharding(ctx, features=dynamic_row_wise, table_rows=table_rows,
                                                       slots=[plan[t].shards[rank].rows for t in dynamic_row_wise],
                                                       settings=dynamic))
        self.shardings += self.dynamic
        if replicated:
            self.shardings.append(DataParallelSharding(ctx, features=replicated, table_rows=table_rows))
        self.select = [FeatureOrder.of(s.features, device) for s in self.shardings]
        sharding_order = [t for s in self.shardings for t in s.features]
        self.sharding_order = torch.tensor(sharding_order, dtype=torch.int64, device=device)
        self.to_feature_order = torch.argsort(self.sharding_order)

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
        grouped = torch.cat(outs, dim=1).view(local_batch, self.num_features, self.dim)
        fwd = EmbeddingForward(shards=fwds, local_batch=local_batch)
        if out is not None:
            with torch.no_grad():  # out may be a leaf that requires grad (the graph's static input)
                torch.index_select(grouped, 1, self.to_feature_order, out=out.view(local_batch, self.num_features, self.dim))
            return out, fwd
        pooled = grouped.index_select(1, self.to_feature_order).reshape(local_batch, -1)
        return pooled.requires_grad_(True), fwd

    def start_backward(self, fwd: EmbeddingForward, grad: torch.Tensor) -> PendingBackward:
        """Launch the exchanges of the pooled gradient (`grad`, (local_batch, F * dim) in feature
        order); nothing waits here, so the caller may launch this as soon as the gradient exists
        (from a hook inside the dense backward) and wait when it has nothing else to do."""
        b = fwd.local_batch
        grouped = grad.view(b, self.num_features, self.dim).index_select(1, self.sharding_order)
        parts = grouped.split([len(s.features) for s in self.shardings], dim=1)
        flights = [s.start_backward(s_fwd, part.reshape(b, -1)) for s, s_fwd, part in zip(self.shardings, fwd.shards, parts)]
        return PendingBackward(self.shardings, flights)

    def dynamic_counts(self) -> dict[int, DynamicCounts]:
        """What each dynamic table on this rank moved between its slots and the store."""
        return {t: c for s in self.dynamic for t, c in s.counts().items()}

    def shard_weights(self) -> list[tuple[int, Shard, torch.Tensor]]:
        """(table, shard, live weights) for every shard this rank holds (a dynamic table: all its
        rows or, row-wise, its row block's, a copy; see DynamicSharding.shard_weights)."""
        return [item for s in self.shardings for item in s.shard_weights()]
