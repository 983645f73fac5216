"""One sharding per way of distributing tables, as TorchRec groups tables by sharding type.

Every sharding takes its features' ids (local batch) and gives back its features' pooled
embeddings for the local batch, (B, n_features * dim) in its feature order, through one
protocol (`EmbeddingSharding`): `prepare_input_dist` (bucketize, count the splits or take them as
known; no collective) returns a pending object whose `start_splits()` launches the splits
exchange, `launch()` the ids exchange, and whose `wait()` gives the ids; `forward` (lookup + output distribution); `start_backward` (gradient
distribution, launched) and `finish_backward` (its wait + fused update); `shard_weights`.
"Group" is kept for process groups (`pg`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from model.collective_bytes import CollectiveBytes
from model.collective_wait import WaitFn, block
from model.dynamic_table import DynamicCounts, DynamicSettings, DynamicTable
from model.embeddings import build_dense_tbe, build_fused_tbe, init_shard_
from model.features import FeatureOrder, SparseFeatures
from model.id_transformer import IdTransformer
from model.ids_all_to_all import PLAIN_TRANSFER, HostTransfer, IdsAllToAll, PendingIds, Ready
from model.sharding import Shard, row_block
from model.wire_codec import BACKWARD_CODECS, FORWARD_CODECS, WireCodec


@dataclass(frozen=True, kw_only=True)
class ShardingContext:
    """What every sharding needs to know about the job."""

    rank: int
    world_size: int
    pg: dist.ProcessGroup | None
    """The process group of the pooled embeddings' exchanges (forward and backward)."""
    ids_pg: dist.ProcessGroup | None
    """A process group of its own for the ids exchange. On gloo an input thread may issue on it
    alone while the main thread uses `pg` (each group keeps its own order); on NCCL it is a
    communicator with a stream of its own, so the ids exchange runs beside the pooled exchanges
    and gradient all-reduces (all issued by one thread, in one order on every rank)."""
    device: torch.device
    ranks_per_node: int | None = None
    """Ranks of a node (a node's ranks are consecutive); None: one node of world_size ranks."""
    node_pg: dist.ProcessGroup | None = None
    """The process group of this rank's node (table-row-wise tables reduce inside it)."""
    transfer: HostTransfer = PLAIN_TRANSFER
    """How the splits reach the host (plain copies, or non-blocking through pinned buffers)."""
    wait: WaitFn = block
    """How the host waits for a collective (model/collective_wait.py): every exchange here is
    launched async and waited for through this."""
    dim: int
    optimizer: str
    learning_rate: float
    eps: float
    init_seed: int
    bytes_moved: CollectiveBytes | None = None
    """Where the exchanges count the bytes they move (model/collective_bytes.py); None: not counted."""
    table_precision: str = "fp32"
    """Weights precision of the fused tables (model/names.py TABLE_PRECISIONS); data-parallel
    tables stay fp32 (their dense gradient is all-reduced and updated by torch's Adagrad)."""

    comm_fwd: str = "fp32"
    """Precision of the pooled embeddings on the wire, forward (model/names.py COMM_PRECISIONS):
    encoded before each exchange, decoded to fp32 after (model/wire_codec.py; a reduce-scatter
    sums in a 16-bit precision, fp8 rows are summed after decoding)."""
    comm_bwd: str = "fp32"
    """Precision of the pooled embeddings' gradients on the wire, backward."""

    @property
    def fwd_codec(self) -> WireCodec:
        return FORWARD_CODECS[self.comm_fwd]

    @property
    def bwd_codec(self) -> WireCodec:
        return BACKWARD_CODECS[self.comm_bwd]

    def reduce_scatter_rows(self, phase: str, rows: torch.Tensor, ranks: int, group) -> torch.Tensor:
        """Sum `rows` (ranks x b rows of partial sums, block j for rank j of `group`) over the
        group's ranks, leaving this rank its b summed rows (fp32; the wire carried the forward
        codec's units).

        Blocking whatever `wait` is: gloo's reduce_scatter work never reports completion to a
        poll (is_completed() stays False, it has no future)."""
        codec, width = self.fwd_codec, rows.shape[1]
        b = rows.shape[0] // ranks
        wire = codec.encode(rows)
        if codec.sums_on_wire:
            out = torch.empty(b, wire.shape[1], device=self.device, dtype=wire.dtype)
            self.count_ring(phase, wire, ranks, passes=1)
            dist.reduce_scatter_single(out, wire, group=group)
            return codec.decode(out, width)
        # Encoded rows cannot be summed in flight: every rank's block for this rank comes whole
        # (the bytes a ring reduce-scatter would move), decoded and summed here in fp32.
        parts = torch.empty(wire.numel(), device=self.device, dtype=wire.dtype)  # flat: splits count units
        splits = [b * wire.shape[1]] * ranks
        self.count_all_to_all(phase, splits, splits, wire.element_size(),
                              group_rank=self.rank if group is None else dist.get_rank(group))
        self.wait(dist.all_to_all_single(parts, wire.reshape(-1), output_split_sizes=splits, input_split_sizes=splits,
                                         group=group, async_op=True))
        return codec.decode(parts.view(ranks * b, -1), width).view(ranks, b, width).sum(dim=0)

    def count_all_to_all(self, phase: str, send_splits: Sequence[int], recv_splits: Sequence[int],
                         element_size: int, *, group_rank: int | None = None) -> None:
        """An all-to-all launched (bytes_moved; splits in elements), over the world group or one
        where this rank is `group_rank` (its own block moves nothing)."""
        if self.bytes_moved is not None:
            self.bytes_moved.all_to_all(phase, send_splits=send_splits, recv_splits=recv_splits,
                                        element_size=element_size,
                                        rank=self.rank if group_rank is None else group_rank)

    def count_ring(self, phase: str, whole: torch.Tensor, ranks: int, *, passes: int) -> None:
        """A reduce-scatter or all-gather (passes=1) or all-reduce (2) of `whole` over `ranks` ranks."""
        if self.bytes_moved is not None:
            self.bytes_moved.ring(phase, nbytes=whole.numel() * whole.element_size(), world_size=ranks, passes=passes)


@dataclass
class ShardForward:
    """What backward needs from forward: the local lookup's output, with its graph."""

    pooled: torch.Tensor
    local_batch: int


@dataclass
class BackwardInFlight:
    """A sharding's gradient exchange launched (async): `received` fills in once `work` is done."""

    fwd: ShardForward
    received: torch.Tensor
    work: dist.Work | None


class PooledAllToAllSharding:
    """Table-wise and column-wise shards: each shard's owner looks up the whole global batch
    for its (feature, column block) and sends every batch owner its rows back."""

    def __init__(self, ctx: ShardingContext, *, features: Sequence[int], slots: Sequence[tuple[int, int, Shard]],
                 table_rows: Sequence[int], multi_hot: Sequence[int]) -> None:
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
        self.hot_to = [sum(multi_hot[self.features[p]] for p, _, _ in r_slots) for r_slots in by_rank]
        self.slots_to = [len(r_slots) for r_slots in by_rank]
        # Column j of what arrives (ranks in order, their slots in order) is output column out_cols[j].
        out_cols = [p * ctx.dim + s.col_start + j for r_slots in by_rank for p, _, s in r_slots for j in range(s.cols)]
        self.out_cols = torch.tensor(out_cols, dtype=torch.int64, device=ctx.device)
        self.in_cols = torch.argsort(self.out_cols)
        self.tbe = None
        if self.local:
            self.tbe = build_fused_tbe(rows=[s.rows for *_, s in self.local], dims=[s.cols for *_, s in self.local],
                                       device=ctx.device, optimizer=ctx.optimizer,
                                       learning_rate=ctx.learning_rate, eps=ctx.eps, precision=ctx.table_precision)
            self._init_weights(table_rows)

    def _init_weights(self, table_rows: Sequence[int]) -> None:
        """Each shard its slice of its table's init."""
        for w_t, (_, t, s) in zip(self.tbe.split_embedding_weights(), self.local):
            init_shard_(w_t, table=t, table_rows=table_rows[t], table_dim=self.ctx.dim, row_start=s.row_start,
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
        send = codec.encode(pooled.detach())
        recv_splits = [local_batch * codec.units(wd) for wd in self.widths]
        send_splits = [local_batch * codec.units(self.widths[ctx.rank])] * ctx.world_size
        received = torch.empty(sum(recv_splits), device=ctx.device, dtype=send.dtype)
        ctx.count_all_to_all("pooled_fwd", send_splits, recv_splits, received.element_size())
        ctx.wait(dist.all_to_all_single(
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
        grouped = grad.index_select(1, self.out_cols)
        send = torch.cat([codec.encode(c).reshape(-1) for c in grouped.split(self.widths, dim=1)])
        mine = codec.units(self.widths[ctx.rank])
        received = torch.empty(b * ctx.world_size * mine, device=ctx.device, dtype=send.dtype)
        recv_splits, send_splits = [b * mine] * ctx.world_size, [b * codec.units(wd) for wd in self.widths]
        ctx.count_all_to_all("pooled_bwd", send_splits, recv_splits, received.element_size())
        work = dist.all_to_all_single(received, send, output_split_sizes=recv_splits, input_split_sizes=send_splits,
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


class TransformedIds:
    """A pending ids exchange whose ids are rewritten as they are waited for (a dynamic table's
    ids into its slots): same protocol as PendingIds."""

    def __init__(self, pending: PendingIds, rewrite: Callable[[SparseFeatures], SparseFeatures]) -> None:
        self._pending, self._rewrite = pending, rewrite

    @property
    def splits_exchanged(self) -> int:
        return self._pending.splits_exchanged

    def start_splits(self) -> None:
        self._pending.start_splits()

    def launch(self) -> None:
        self._pending.launch()

    def wait(self) -> SparseFeatures:
        return self._rewrite(self._pending.wait())


class DynamicSlots:
    """What a sharding of dynamic tables adds to the sharding it places them as (mixed in before
    it): a DynamicTable over each of its TBE's tables, and the ids turned into slots as they are
    waited for (the ID transformer and the rows it moves to and from the store run on the host,
    in the main thread, after the previous iteration's fused update), so the lookup and the
    update run on slots."""

    tables: list[DynamicTable]
    id_offsets: list[int]
    """What each table's received ids lack of their table's ids (row-wise: the block's first row)."""

    def _open_tables(self, tables: Sequence[int], slots: Sequence[int], table_rows: Sequence[int],
                     settings: DynamicSettings, id_offsets: Sequence[int]) -> None:
        """A DynamicTable for each table of self.tbe (in its order), with its slots."""
        self.tables, self.id_offsets = [], list(id_offsets)
        if self.tbe is None:
            return
        ctx = self.ctx
        states = self.tbe.split_optimizer_states() if ctx.optimizer != "exact_sgd" else [[] for _ in tables]
        self.tables = [
            DynamicTable(table=t, table_rows=table_rows[t], weights=w, states=list(st),
                         transformer=IdTransformer(n, settings.policy, settings.half_life), store=settings.store,
                         seed=ctx.init_seed, span=settings.span)
            for t, n, w, st in zip(tables, slots, self.tbe.split_embedding_weights(), states)
        ]

    @staticmethod
    def _empty_slots(tbe) -> None:
        """Slots start empty: a row is written into its slot when its id is admitted."""
        with torch.no_grad():
            for w in tbe.split_embedding_weights():
                w.zero_()

    def prepare_input_dist(self, ids: SparseFeatures, *, splits_known: bool) -> TransformedIds:
        return TransformedIds(super().prepare_input_dist(ids, splits_known=splits_known), self._to_slots)

    def _to_slots(self, local: SparseFeatures) -> SparseFeatures:
        if not self.tables:
            return local
        # The transformer runs on the host: on a GPU this reads the ids back (a sync), as
        # TorchRec's dynamic embedding does.
        counts = local.lengths.sum(dim=1).tolist()
        values = local.values.cpu().split(counts)
        slots = torch.cat([d.transform(v + off if off else v) for d, v, off in zip(self.tables, values, self.id_offsets)])
        return SparseFeatures(lengths=local.lengths, values=slots.to(local.values.device))

    def counts(self) -> dict[int, DynamicCounts]:
        """Each table's counts, its transformer's host memory as of now."""
        for d in self.tables:
            d.counts.transformer_host_bytes = d.transformer.host_bytes
        return {d.table: d.counts for d in self.tables}


class DynamicSharding(DynamicSlots, PooledAllToAllSharding):
    """Dynamic tables (model/dynamic_table.py), each placed as table-wise: its ids go to its rank,
    which turns them into slots (DynamicSlots), looks the whole global batch up in the table's
    slots and sends every batch owner its rows."""

    def __init__(self, ctx: ShardingContext, *, features: Sequence[int], slots: Sequence[tuple[int, int, Shard]],
                 table_rows: Sequence[int], multi_hot: Sequence[int], settings: DynamicSettings) -> None:
        """slots: (position in `features`, table, its one shard: the slot table, rows 0..slots)."""
        super().__init__(ctx, features=features, slots=slots, table_rows=table_rows, multi_hot=multi_hot)
        self._open_tables([t for _, t, _ in self.local], [s.rows for _, _, s in self.local], table_rows, settings,
                          id_offsets=[0] * len(self.local))

    def _init_weights(self, table_rows: Sequence[int]) -> None:
        self._empty_slots(self.tbe)

    def shard_weights(self) -> list[tuple[int, Shard, torch.Tensor]]:
        """Each dynamic table whole, as its ids' rows wherever they live (slot, store, or the
        init of an id never seen): a copy, not the live slots."""
        return [(d.table, Shard(s.rank, 0, d.table_rows, 0, s.cols), d.rows_of(torch.arange(d.table_rows)))
                for (_, _, s), d in zip(self.local, self.tables)]


def row_block_tbe(ctx: ShardingContext, tables: Sequence[int], shards: Sequence[Shard], table_rows: Sequence[int]):
    """A fused TBE of row blocks (of a table's columns, all of them or a grid block's), one a
    table, each initialised as its table's slice.
    A block past a small table's last row is empty: a 1-row stand-in keeps the TBE's layout one
    table a feature; no id is ever routed to it."""
    tbe = build_fused_tbe(rows=[max(1, s.rows) for s in shards], dims=[s.cols for s in shards], device=ctx.device,
                          optimizer=ctx.optimizer, learning_rate=ctx.learning_rate, eps=ctx.eps,
                          precision=ctx.table_precision)
    for w_t, t, s in zip(tbe.split_embedding_weights(), tables, shards):
        if s.rows:
            init_shard_(w_t, table=t, table_rows=table_rows[t], table_dim=ctx.dim, row_start=s.row_start,
                        col_start=s.col_start, seed=ctx.init_seed)
    return tbe


class RowWiseSharding:
    """Row-wise tables: ids bucketized by row block to the block's rank; each rank pools the
    rows it holds for the whole global batch; partial sums are reduce-scattered to the owners."""

    def __init__(self, ctx: ShardingContext, *, features: Sequence[int], table_rows: Sequence[int]) -> None:
        self.ctx, self.features = ctx, list(features)
        w, r = ctx.world_size, ctx.rank
        rows = [table_rows[t] for t in self.features]
        self.blocks = [row_block(n, w) for n in rows]
        self.block_sizes = torch.tensor(self.blocks, dtype=torch.int64, device=ctx.device)
        self.local = [Shard(r, min(n, r * b), min(n, (r + 1) * b), 0, ctx.dim) for n, b in zip(rows, self.blocks)]
        self.ids = IdsAllToAll(send_slots=[len(self.features)] * w, recv_slots=len(self.features),
                               world_size=w, group=ctx.ids_pg, device=ctx.device, transfer=ctx.transfer, wait=ctx.wait,
                               count=ctx.count_all_to_all)
        self.tbe = self._build_tbe(table_rows)

    def _build_tbe(self, table_rows: Sequence[int]):
        """The fused table of this rank's row blocks, each initialised as its table's slice."""
        return row_block_tbe(self.ctx, self.features, self.local, table_rows)

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
        work = dist.all_gather_single(full, send, group=self.ctx.pg, async_op=True)
        return BackwardInFlight(fwd, full, work)

    def finish_backward(self, flight: BackwardInFlight) -> None:
        self.ctx.wait(flight.work)
        flight.fwd.pooled.backward(self.ctx.bwd_codec.decode(flight.received, flight.fwd.pooled.shape[1]))

    def shard_weights(self) -> list[tuple[int, Shard, torch.Tensor]]:
        return [(t, s, w) for t, s, w in zip(self.features, self.local, self.tbe.split_embedding_weights()) if s.rows]


class DynamicRowWiseSharding(DynamicSlots, RowWiseSharding):
    """Dynamic tables row-wise (model/sharding.py dynamic_row_wise): ids go to the rank of their row
    block as row-wise ids do, and each rank keeps slots for its blocks' ids only, turns the ids it
    receives into slots (DynamicSlots), looks the whole global batch up in its slots, and the
    partial sums are reduce-scattered as row-wise ones are. Each rank's ID transformer and
    parameter store see only the ids of its blocks, which arrive rebased to the block's first row:
    the tables take them whole again (an id's init and its key in the store are its table's)."""

    def __init__(self, ctx: ShardingContext, *, features: Sequence[int], slots: Sequence[int],
                 table_rows: Sequence[int], settings: DynamicSettings) -> None:
        """slots: this rank's slots for each feature (its shard of the table's plan)."""
        self.slots = list(slots)
        super().__init__(ctx, features=features, table_rows=table_rows)
        self._open_tables(self.features, self.slots, table_rows, settings,
                          id_offsets=[s.row_start for s in self.local])

    def _build_tbe(self, table_rows: Sequence[int]):
        """Slots, not row blocks."""
        tbe = build_fused_tbe(rows=self.slots, dims=[self.ctx.dim] * len(self.slots), device=self.ctx.device,
                              optimizer=self.ctx.optimizer, learning_rate=self.ctx.learning_rate, eps=self.ctx.eps,
                              precision=self.ctx.table_precision)
        self._empty_slots(tbe)
        return tbe

    def shard_weights(self) -> list[tuple[int, Shard, torch.Tensor]]:
        """This rank's row block of each table, as its ids' rows wherever they live: a copy."""
        return [(d.table, s, d.rows_of(torch.arange(s.row_start, s.row_end))) for s, d in zip(self.local, self.tables)]


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

    def __init__(self, ctx: ShardingContext, *, features: Sequence[int], blocks: Sequence[NodeBlock],
                 table_rows: Sequence[int]) -> None:
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
        rows = [table_rows[t] for t in self.features]
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
        self.tbe = row_block_tbe(ctx, self.mine, self.local, table_rows) if mine else None

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
        ctx.wait(dist.all_to_all_single(received, summed.reshape(-1), output_split_sizes=recv, input_split_sizes=send,
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
        work = dist.all_to_all_single(received, send, output_split_sizes=send_back, input_split_sizes=recv_back,
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
        dist.all_gather_single(full, rows, group=self.ctx.node_pg)
        pooled.backward(codec.decode(full, pooled.shape[1]))

    def shard_weights(self) -> list[tuple[int, Shard, torch.Tensor]]:
        if self.tbe is None:
            return []
        return [(t, s, w) for t, s, w in zip(self.mine, self.local, self.tbe.split_embedding_weights()) if s.rows]


class DataParallelSharding:
    """Replicated tables: local lookup, gradient all-reduced, dense Adagrad (the same math as
    fbgemm's EXACT_ADAGRAD: untouched rows get a zero gradient and do not move)."""

    def __init__(self, ctx: ShardingContext, *, features: Sequence[int], table_rows: Sequence[int]) -> None:
        self.ctx, self.features = ctx, list(features)
        rows = [table_rows[t] for t in self.features]
        self.tbe = build_dense_tbe(rows=rows, dims=[ctx.dim] * len(rows), device=ctx.device)
        offsets = self.tbe.weights_offsets.tolist()
        with torch.no_grad():
            for i, (t, n) in enumerate(zip(self.features, rows)):
                view = self.tbe.weights[offsets[i] : offsets[i] + n * ctx.dim].view(n, ctx.dim)
                init_shard_(view, table=t, table_rows=n, table_dim=ctx.dim, row_start=0, col_start=0,
                            seed=ctx.init_seed)
        self.rows = rows
        self.offsets = offsets
        self.opt = torch.optim.Adagrad([self.tbe.weights], lr=ctx.learning_rate, eps=ctx.eps)

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


class EmbeddingSharding(Protocol):
    """What the sharded collection asks of each sharding (see the module docstring)."""

    features: list[int]

    def prepare_input_dist(self, ids: SparseFeatures, *, splits_known: bool) -> PendingIds | Ready: ...

    def forward(self, local_ids: SparseFeatures, local_batch: int) -> tuple[torch.Tensor, ShardForward]: ...

    def start_backward(self, fwd: ShardForward, grad: torch.Tensor) -> BackwardInFlight: ...

    def finish_backward(self, flight: BackwardInFlight) -> None: ...

    def shard_weights(self) -> list[tuple[int, Shard, torch.Tensor]]: ...
