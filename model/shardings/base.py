"""What every sharding family shares: the job's context, the protocol, and the shared helpers.

Every sharding takes its features' ids (local batch) and gives back its features' pooled
embeddings for the local batch, (B, n_features * dim) in its feature order, through one
protocol (`EmbeddingSharding`): `prepare_input_dist` (bucketize, count the splits or take them as
known; no collective) returns a pending object whose `start_splits()` launches the splits
exchange, `launch()` the ids exchange, and whose `wait()` gives the ids; `forward` (lookup +
output distribution); `start_backward` (gradient distribution, launched) and `finish_backward`
(its wait + fused update); `shard_weights`. "Group" is kept for process groups (`pg`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from model.collective_ops import all_to_all_single, reduce_scatter_single
from model.collective_bytes import CollectiveBytes
from model.collective_wait import WaitFn, block
from model.dynamic_table import DynamicSettings
from model.embeddings import build_fused_tbe, init_shard_
from model.features import SparseFeatures
from model.ids_all_to_all import PLAIN_TRANSFER, HostTransfer, PendingIds, Ready
from model.sharding import Shard, TablePlan
from model.wire_codec import BACKWARD_CODECS, FORWARD_CODECS, WireCodec


@dataclass(frozen=True, kw_only=True)
class ShardingContext:
    """Everything the sharded collection and its shardings need to know about the job: this
    rank and its process groups, the tables, the wire, and how dynamic tables run."""

    # ---- the job ----
    rank: int
    """This rank, 0..world_size - 1."""
    world_size: int
    """Ranks in the job."""
    pg: dist.ProcessGroup | None
    """The process group of the pooled embeddings' exchanges (forward and backward)."""
    ids_pg: dist.ProcessGroup | None
    """A process group of its own for the ids exchange. On gloo an input thread may issue on it
    alone while the main thread uses `pg` (each group keeps its own order); on NCCL it is a
    communicator with a stream of its own, so the ids exchange runs beside the pooled exchanges
    and gradient all-reduces (all issued by one thread, in one order on every rank)."""
    device: torch.device
    """Where the tables, the ids and the pooled embeddings live."""
    ranks_per_node: int | None = None
    """Ranks of a node (a node's ranks are consecutive); None: one node of world_size ranks."""
    node_pg: dist.ProcessGroup | None = None
    """The process group of this rank's node (table-row-wise tables reduce inside it); None when
    no table needs it."""

    # ---- the tables ----
    table_rows: tuple[int, ...]
    """Rows of every table, in feature order."""
    dim: int
    """Embedding dim of every table."""
    multi_hot: tuple[int, ...]
    """Ids a sample has in each feature when hotness is fixed (what makes splits computable in advance)."""
    optimizer: str
    """The fused optimizer (model/names.py EMBEDDING_OPTIMIZERS); data-parallel tables use dense Adagrad."""
    learning_rate: float
    """The embedding optimizer's learning rate."""
    eps: float
    """The embedding optimizer's epsilon (Adagrad)."""
    init_seed: int
    """Seed of the tables' init: a shard is initialised as its slice of its whole table's."""
    table_precision: str = "fp32"
    """Weights precision of the fused tables (model/names.py TABLE_PRECISIONS); data-parallel
    tables stay fp32 (their dense gradient is all-reduced and updated by torch's Adagrad)."""

    # ---- the wire ----
    transfer: HostTransfer = PLAIN_TRANSFER
    """How the splits reach the host (plain copies, or non-blocking through pinned buffers)."""
    wait: WaitFn = block
    """How the host waits for a collective (model/collective_wait.py): every exchange here is
    launched async and waited for through this."""
    bytes_moved: CollectiveBytes | None = None
    """Where the exchanges count the bytes they move (model/collective_bytes.py); None: not counted."""
    comm_fwd: str = "fp32"
    """Precision of the pooled embeddings on the wire, forward (model/names.py COMM_PRECISIONS):
    encoded before each exchange, decoded to fp32 after (model/wire_codec.py; a reduce-scatter
    sums in a 16-bit precision, fp8 rows are summed after decoding)."""
    comm_bwd: str = "fp32"
    """Precision of the pooled embeddings' gradients on the wire, backward."""

    # ---- dynamic tables ----
    dynamic: DynamicSettings | None = None
    """How dynamic tables run (their policy and this rank's parameter store); needed when the
    plan has one."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "table_rows", tuple(self.table_rows))
        object.__setattr__(self, "multi_hot", tuple(self.multi_hot))

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
            reduce_scatter_single(out, wire, group=group)
            return codec.decode(out, width)
        # Encoded rows cannot be summed in flight: every rank's block for this rank comes whole
        # (the bytes a ring reduce-scatter would move), decoded and summed here in fp32.
        parts = torch.empty(wire.numel(), device=self.device, dtype=wire.dtype)  # flat: splits count units
        splits = [b * wire.shape[1]] * ranks
        self.count_all_to_all(phase, splits, splits, wire.element_size(),
                              group_rank=self.rank if group is None else dist.get_rank(group))
        self.wait(all_to_all_single(parts, wire.reshape(-1), output_split_sizes=splits, input_split_sizes=splits,
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


class EmbeddingSharding(Protocol):
    """What the sharded collection asks of each sharding (see the module docstring)."""

    features: list[int]

    @classmethod
    def from_plan(cls, ctx: ShardingContext, plan: Sequence[TablePlan], tables: list[int]) -> EmbeddingSharding:
        """The sharding of `tables` (ascending indices into `plan`, all of this family's types)."""
        ...

    def prepare_input_dist(self, ids: SparseFeatures, *, splits_known: bool) -> PendingIds | Ready: ...

    def forward(self, local_ids: SparseFeatures, local_batch: int) -> tuple[torch.Tensor, ShardForward]: ...

    def start_backward(self, fwd: ShardForward, grad: torch.Tensor) -> BackwardInFlight: ...

    def finish_backward(self, flight: BackwardInFlight) -> None: ...

    def shard_weights(self) -> list[tuple[int, Shard, torch.Tensor]]: ...


def row_block_tbe(ctx: ShardingContext, tables: Sequence[int], shards: Sequence[Shard]):
    """A fused TBE of row blocks (of a table's columns, all of them or a grid block's), one a
    table, each initialised as its table's slice.
    A block past a small table's last row is empty: a 1-row stand-in keeps the TBE's layout one
    table a feature; no id is ever routed to it."""
    tbe = build_fused_tbe(rows=[max(1, s.rows) for s in shards], dims=[s.cols for s in shards], device=ctx.device,
                          optimizer=ctx.optimizer, learning_rate=ctx.learning_rate, eps=ctx.eps,
                          precision=ctx.table_precision)
    for w_t, t, s in zip(tbe.split_embedding_weights(), tables, shards):
        if s.rows:
            init_shard_(w_t, table=t, table_rows=ctx.table_rows[t], table_dim=ctx.dim, row_start=s.row_start,
                        col_start=s.col_start, seed=ctx.init_seed)
    return tbe
