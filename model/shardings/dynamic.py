"""Dynamic tables (model/dynamic_table.py): only the ids in use hold a slot, placed as table-wise
(`dynamic`) or row-wise (`dynamic_row_wise`); TorchRec's dynamic embedding keeps its ID
transformer beside its shardings the same way."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from model.dynamic_table import DynamicCounts, DynamicTable
from model.embeddings import build_fused_tbe
from model.features import SparseFeatures
from model.id_transformer import IdTransformer
from model.ids_all_to_all import PendingIds
from model.sharding import Shard, TablePlan
from model.shardings.base import ShardingContext
from model.shardings.row_wise import RowWiseSharding
from model.shardings.table_wise import PooledAllToAllSharding


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

    def _open_tables(self, tables: Sequence[int], slots: Sequence[int], id_offsets: Sequence[int]) -> None:
        """A DynamicTable for each table of self.tbe (in its order), with its slots, run as the
        context's dynamic settings say."""
        self.tables, self.id_offsets = [], list(id_offsets)
        if self.tbe is None:
            return
        ctx, settings = self.ctx, self.ctx.dynamic
        states = self.tbe.split_optimizer_states() if ctx.optimizer != "exact_sgd" else [[] for _ in tables]
        self.tables = [
            DynamicTable(table=t, table_rows=ctx.table_rows[t], weights=w, states=list(st),
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
        self.ctx.dynamic.before_slots()  # queued updates of the slots land first (DynamicSettings.before_slots)
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

    def __init__(self, ctx: ShardingContext, *, features: Sequence[int],
                 slots: Sequence[tuple[int, int, Shard]]) -> None:
        """slots: (position in `features`, table, its one shard: the slot table, rows 0..slots)."""
        super().__init__(ctx, features=features, slots=slots)
        self._open_tables([t for _, t, _ in self.local], [s.rows for _, _, s in self.local],
                          id_offsets=[0] * len(self.local))

    def _init_weights(self) -> None:
        self._empty_slots(self.tbe)

    def shard_weights(self) -> list[tuple[int, Shard, torch.Tensor]]:
        """Each dynamic table whole, as its ids' rows wherever they live (slot, store, or the
        init of an id never seen): a copy, not the live slots."""
        return [(d.table, Shard(s.rank, 0, d.table_rows, 0, s.cols), d.rows_of(torch.arange(d.table_rows)))
                for (_, _, s), d in zip(self.local, self.tables)]


class DynamicRowWiseSharding(DynamicSlots, RowWiseSharding):
    """Dynamic tables row-wise (model/sharding.py dynamic_row_wise): ids go to the rank of their row
    block as row-wise ids do, and each rank keeps slots for its blocks' ids only, turns the ids it
    receives into slots (DynamicSlots), looks the whole global batch up in its slots, and the
    partial sums are reduce-scattered as row-wise ones are. Each rank's ID transformer and
    parameter store see only the ids of its blocks, which arrive rebased to the block's first row:
    the tables take them whole again (an id's init and its key in the store are its table's)."""

    def __init__(self, ctx: ShardingContext, *, features: Sequence[int], slots: Sequence[int]) -> None:
        """slots: this rank's slots for each feature (its shard of the table's plan)."""
        self.slots = list(slots)
        super().__init__(ctx, features=features)
        self._open_tables(self.features, self.slots, id_offsets=[s.row_start for s in self.local])

    @classmethod
    def from_plan(cls, ctx: ShardingContext, plan: Sequence[TablePlan], tables: list[int]) -> DynamicRowWiseSharding:
        """This rank's shard of each table's plan gives its slots."""
        return cls(ctx, features=tables, slots=[plan[t].shards[ctx.rank].rows for t in tables])

    def _build_tbe(self):
        """Slots, not row blocks."""
        tbe = build_fused_tbe(rows=self.slots, dims=[self.ctx.dim] * len(self.slots), device=self.ctx.device,
                              optimizer=self.ctx.optimizer, learning_rate=self.ctx.learning_rate, eps=self.ctx.eps,
                              precision=self.ctx.table_precision)
        self._empty_slots(tbe)
        return tbe

    def shard_weights(self) -> list[tuple[int, Shard, torch.Tensor]]:
        """This rank's row block of each table, as its ids' rows wherever they live: a copy."""
        return [(d.table, s, d.rows_of(torch.arange(s.row_start, s.row_end))) for s, d in zip(self.local, self.tables)]
