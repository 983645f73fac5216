"""Table-wise sharded embedding collection: input dist -> lookup -> output dist, and back.

The three phases are separate methods (not one autograd function) so the harness can time
each stage on its own and, later, overlap the input distribution of the next batch with the
compute of this one. Collectives go through torch.distributed on the group passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from model.embeddings import build_tbe, init_table_
from model.features import SparseFeatures


@dataclass
class IdsInFlight:
    """Lengths/values all-to-alls launched but not yet waited on."""

    lengths: torch.Tensor
    values: torch.Tensor
    works: list
    batch_per_source: int


@dataclass
class EmbeddingForward:
    """What the backward pass needs from the forward: the local lookup's output (with its graph)."""

    pooled: torch.Tensor
    local_batch: int


class TableWiseShardedEmbeddings:
    """26 (or any number of) tables, each whole on one rank; batches data-parallel over ranks."""

    def __init__(
        self,
        *,
        table_rows: Sequence[int],
        embedding_dim: int,
        owners: Sequence[int],
        rank: int,
        world_size: int,
        group: dist.ProcessGroup | None,
        device: torch.device,
        optimizer: str,
        learning_rate: float,
        eps: float,
        init_seed: int,
    ) -> None:
        if len(owners) != len(table_rows):
            raise ValueError(f"plan names {len(owners)} owners for {len(table_rows)} tables")
        self.dim = embedding_dim
        self.rank, self.world_size, self.group, self.device = rank, world_size, group, device
        self.num_features = len(table_rows)
        self.tables_of = [[t for t, o in enumerate(owners) if o == r] for r in range(world_size)]
        self.local_tables = self.tables_of[rank]
        # Features grouped by destination rank: the order ids travel in and pooled rows come back in.
        send_order = [t for r in range(world_size) for t in self.tables_of[r]]
        self.send_order = torch.tensor(send_order, dtype=torch.int32, device=device)  # fbgemm permutes take int32
        self.inverse_order = torch.argsort(self.send_order)
        self.features_per_rank = torch.tensor([len(t) for t in self.tables_of], device=device)
        self.dest_of_grouped = torch.tensor(
            [r for r in range(world_size) for _ in self.tables_of[r]], dtype=torch.int64, device=device
        )
        # Received rows come as (source rank, local feature); the lookup wants (local feature, source rank).
        n_local = len(self.local_tables)
        self.recv_order = (
            torch.arange(world_size * n_local, dtype=torch.int32, device=device).view(world_size, n_local).t().reshape(-1)
        )
        self.tbe = None
        if self.local_tables:
            self.tbe = build_tbe(
                rows=[table_rows[t] for t in self.local_tables],
                dim=embedding_dim,
                device=device,
                optimizer=optimizer,
                learning_rate=learning_rate,
                eps=eps,
            )
            for weight, t in zip(self.tbe.split_embedding_weights(), self.local_tables):
                init_table_(weight, table=t, seed=init_seed)

    # ---- input distribution -------------------------------------------------------------
    def bucketize(self, features: SparseFeatures) -> tuple[SparseFeatures, torch.Tensor]:
        """Ids regrouped by destination rank, and per destination [lengths count, values count]."""
        grouped = features.permute(self.send_order)
        counts = torch.zeros(self.world_size, 2, dtype=torch.int64, device=self.device)
        counts[:, 0] = self.features_per_rank * features.batch_size
        counts[:, 1].index_add_(0, self.dest_of_grouped, grouped.lengths.sum(dim=1))
        return grouped, counts

    def exchange_splits(self, counts: torch.Tensor) -> tuple[list[list[int]], list[list[int]]]:
        """The splits all-to-all, then the host sync TorchRec pays for it.

        Returns ([lengths, values] sent to each rank, [lengths, values] received from each),
        read to the host in one device-to-host copy.
        """
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.group)
        sent, recv = torch.stack([counts, received]).tolist()
        return sent, recv

    def start_ids_exchange(
        self, grouped: SparseFeatures, send_sizes: list[list[int]], splits: list[list[int]]
    ) -> IdsInFlight:
        """Launch the lengths and values all-to-alls (async), given both sides' sizes from the host."""
        recv_lengths = torch.empty(sum(s[0] for s in splits), dtype=torch.int64, device=self.device)
        recv_values = torch.empty(sum(s[1] for s in splits), dtype=grouped.values.dtype, device=self.device)
        works = [
            dist.all_to_all_single(
                recv_lengths, grouped.lengths.reshape(-1),
                output_split_sizes=[s[0] for s in splits], input_split_sizes=[s[0] for s in send_sizes],
                group=self.group, async_op=True,
            ),
            dist.all_to_all_single(
                recv_values, grouped.values,
                output_split_sizes=[s[1] for s in splits], input_split_sizes=[s[1] for s in send_sizes],
                group=self.group, async_op=True,
            ),
        ]
        n_local = len(self.local_tables)
        batches = {s[0] // n_local for s in splits} if n_local else {grouped.batch_size}
        if len(batches) != 1:
            raise ValueError(f"ranks sent different batch sizes {sorted(batches)}; table-wise input dist needs one")
        return IdsInFlight(recv_lengths, recv_values, works, batches.pop())

    def finish_ids_exchange(self, flight: IdsInFlight) -> SparseFeatures:
        """Wait, then turn (source, feature) blocks into feature-major ids over the global batch."""
        for work in flight.works:
            work.wait()
        n_local, w = len(self.local_tables), self.world_size
        lengths = flight.lengths.view(w * n_local, flight.batch_per_source)
        received = SparseFeatures(lengths=lengths, values=flight.values).permute(self.recv_order)
        return SparseFeatures(
            lengths=received.lengths.reshape(n_local, w * flight.batch_per_source), values=received.values
        )

    def input_dist(self, features: SparseFeatures) -> SparseFeatures:
        """All of input distribution in order, blocking: bucketize, splits a2a, ids a2a."""
        grouped, counts = self.bucketize(features)
        sent, received = self.exchange_splits(counts)
        return self.finish_ids_exchange(self.start_ids_exchange(grouped, sent, received))

    # ---- lookup and output distribution -------------------------------------------------
    def forward(self, local_ids: SparseFeatures, local_batch: int) -> tuple[torch.Tensor, EmbeddingForward]:
        """Pooled embeddings of this rank's samples, (local_batch, F * dim) in feature order.

        The returned tensor is a leaf that requires grad: the dense backward fills its .grad,
        which `backward` sends to the owners.
        """
        global_batch = local_batch * self.world_size
        if self.tbe is not None:
            pooled = self.tbe(local_ids.values, local_ids.offsets())
        else:
            pooled = torch.zeros(global_batch, 0, device=self.device)
        # pooled is (global batch, local dims) row-major: each destination's rows are contiguous.
        received = torch.empty(local_batch * self.num_features * self.dim, device=self.device)
        dist.all_to_all_single(
            received, pooled.detach().reshape(-1),
            output_split_sizes=[local_batch * len(t) * self.dim for t in self.tables_of],
            input_split_sizes=[local_batch * len(self.local_tables) * self.dim] * self.world_size,
            group=self.group,
        )
        by_rank = [
            chunk.view(local_batch, -1)
            for chunk in received.split([local_batch * len(t) * self.dim for t in self.tables_of])
        ]
        grouped = torch.cat(by_rank, dim=1).view(local_batch, self.num_features, self.dim)
        out = grouped.index_select(1, self.inverse_order).reshape(local_batch, -1)
        return out.requires_grad_(True), EmbeddingForward(pooled=pooled, local_batch=local_batch)

    def backward(self, fwd: EmbeddingForward, grad: torch.Tensor) -> None:
        """Send pooled-embedding gradients back to the owners; the fused optimizer updates there."""
        b = fwd.local_batch
        grouped = grad.view(b, self.num_features, self.dim).index_select(1, self.send_order)
        send = torch.cat([c.reshape(-1) for c in grouped.split([len(t) for t in self.tables_of], dim=1)])
        received = torch.empty(b * self.world_size * len(self.local_tables) * self.dim, device=self.device)
        dist.all_to_all_single(
            received, send,
            output_split_sizes=[b * len(self.local_tables) * self.dim] * self.world_size,
            input_split_sizes=[b * len(t) * self.dim for t in self.tables_of],
            group=self.group,
        )
        if self.tbe is not None:
            fwd.pooled.backward(received.view(b * self.world_size, -1))

    def table_weights(self) -> dict[int, torch.Tensor]:
        """This rank's tables by global table index (views of the live weights)."""
        if self.tbe is None:
            return {}
        return dict(zip(self.local_tables, self.tbe.split_embedding_weights()))
