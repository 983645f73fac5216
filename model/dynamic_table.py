"""A dynamic table on its owner rank: a fixed number of slots hold the rows of the ids in use.

The ID transformer (model/id_transformer.py) maps each id to a slot, admitting new ids and
evicting the coldest when the slots are full. Before an evicted id's slot is reused, its row and
its optimizer state go to the parameter store (a key-value store: (table, id) -> one float32
vector, harness/run/param_store.py); an admitted id's row comes back from the store when it was
evicted before, or else is the table's own init for that id (model/embeddings.py init_rows), with
a zero optimizer state, as a static table's never-touched row has. So a row's values follow its
id whatever slot it sits in, and a run that evicts computes what a run that never evicts does.

The slots are the rows of a fused TBE (the optimizer fused into its backward); this module reads
and writes them, and their optimizer state, through fbgemm's views of them.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Protocol

import torch

from model.embeddings import init_rows
from model.id_transformer import IdTransformer


class RowStore(Protocol):
    """What a dynamic table needs of a parameter store (harness/run/param_store.py implements it)."""

    def put(self, table: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Store rows[i] (float32, (n, width)) as ids[i]'s (int64, distinct); all or nothing."""

    def get(self, table: int, ids: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(found: bool (n,), rows: float32 (n, width), zeros where not found)."""


@dataclass(frozen=True, kw_only=True)
class DynamicSettings:
    """How a rank's dynamic tables run."""

    policy: str
    """Eviction policy (model/names.py DYNAMIC_POLICIES)."""
    half_life: int
    """Id occurrences after which a hybrid counter halves."""
    store: RowStore
    """Where evicted rows go (this rank's: a dynamic table lives on one rank)."""
    span: Callable[[str], AbstractContextManager] = lambda name: nullcontext()
    """Times a named piece of the work (the harness records it as a sub-span of input_dist)."""
    before_slots: Callable[[], None] = lambda: None
    """Called before a batch's ids are turned into slots, which reads and writes slot rows and
    their optimizer state. The harness runs that on its input stream, and makes it wait there for
    the compute stream: the iterations queued before still update those rows (fused backward), and
    a row written back early would miss their updates, a reassigned slot take the evicted id's."""


@dataclass
class DynamicCounts:
    """What moved between a table's slots and the store, over the run."""

    transformed: int = 0
    """Ids looked up (occurrences)."""
    admitted: int = 0
    """Ids given a slot."""
    fetched: int = 0
    """Admitted ids whose row came back from the store."""
    evicted: int = 0
    """Ids whose row went to the store."""
    transformer_host_bytes: int = 0
    """Host memory of the table's ID transformer as of the last count (IdTransformer.host_bytes):
    host memory the slots' budget does not count."""


@dataclass
class DynamicTable:
    """One dynamic table's slots on its owner rank."""

    table: int
    table_rows: int
    weights: torch.Tensor
    """The slot rows, (slots, dim): fbgemm's view of them (live)."""
    states: list[torch.Tensor]
    """The optimizer state of the slots, fbgemm's views: (slots, dim) for Adagrad, (slots,) for
    row-wise Adagrad, none for SGD."""
    transformer: IdTransformer
    store: RowStore
    seed: int
    counts: DynamicCounts = field(default_factory=DynamicCounts)
    span: Callable[[str], AbstractContextManager] = lambda name: nullcontext()
    """Times each piece of transform(): `dynamic_transform`, `dynamic_write_back`, `dynamic_fetch`."""

    @property
    def dim(self) -> int:
        return self.weights.shape[1]

    @property
    def width(self) -> int:
        """Floats a row takes in the store: its weights, then its optimizer state."""
        return self.dim + sum(s[0].numel() for s in self.states)

    def _read(self, slots: torch.Tensor) -> torch.Tensor:
        """Rows and optimizer state of `slots`, as the store keeps them (float32 on the host)."""
        slots = slots.to(self.weights.device)
        parts = [self.weights.index_select(0, slots).float()]
        parts += [s.index_select(0, slots).float().reshape(slots.numel(), -1) for s in self.states]
        return torch.cat(parts, dim=1).cpu()

    def _write(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        slots, rows = slots.to(self.weights.device), rows.to(self.weights.device)
        with torch.no_grad():
            self.weights.index_copy_(0, slots, rows[:, : self.dim].to(self.weights.dtype))
            at = self.dim
            for s in self.states:
                n = s[0].numel()
                s.index_copy_(0, slots, rows[:, at : at + n].reshape(-1, *s.shape[1:]).to(s.dtype))
                at += n

    def _fresh(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows never seen: the table's init for those ids, optimizer state zero."""
        rows = torch.zeros(ids.numel(), self.width)
        rows[:, : self.dim] = init_rows(ids, table=self.table, table_rows=self.table_rows, table_dim=self.dim,
                                        seed=self.seed)
        return rows

    def transform(self, ids: torch.Tensor) -> torch.Tensor:
        """The slot of each id (int64, on the host), its row in place: evicted rows written to
        the store first (their slots are about to be reused), then admitted rows fetched or
        initialised into their slots. A store failure raises before any slot is overwritten."""
        lo, hi = torch.aminmax(ids) if ids.numel() else (0, 0)  # one pass over the ids
        if int(lo) < 0 or int(hi) >= self.table_rows:
            raise ValueError(f"table {self.table}: ids must be in 0..{self.table_rows - 1}")
        with self.span("dynamic_transform"):
            try:
                moved = self.transformer.transform(ids)
            except ValueError as exc:  # refused whole: nothing admitted, nothing moved
                raise ValueError(f"table {self.table}: {exc}; raise --dynamic-slots or --dynamic-memory-gib") from None
        if moved.evicted_ids.numel():
            with self.span("dynamic_write_back"):
                self.store.put(self.table, moved.evicted_ids, self._read(moved.evicted_slots))
        if moved.admitted_ids.numel():
            with self.span("dynamic_fetch"):
                found, rows = self.store.get(self.table, moved.admitted_ids, self.width)
                fresh = ~found
                if bool(fresh.any()):
                    rows[fresh] = self._fresh(moved.admitted_ids[fresh])
                self._write(moved.admitted_slots, rows)
            self.counts.fetched += int(found.sum())
        c = self.counts
        c.transformed += ids.numel()
        c.admitted += moved.admitted_ids.numel()
        c.evicted += moved.evicted_ids.numel()
        return moved.slots

    def rows_of(self, ids: torch.Tensor) -> torch.Tensor:
        """The current rows of `ids` (float32, host), wherever each lives: its slot, the store, or
        (never seen) the init. Reads only; the slots and the store are left as they are."""
        ids = ids.to(torch.int64).cpu()
        out = self._fresh(ids)[:, : self.dim].to(self.weights.dtype).float()  # as a slot would hold it
        slots = self.transformer.lookup(ids)
        resident = slots >= 0
        if bool(resident.any()):
            out[resident] = self._read(slots[resident])[:, : self.dim]
        away = ~resident
        if bool(away.any()):
            found, rows = self.store.get(self.table, ids[away], self.width)
            idx = away.nonzero().view(-1)[found]
            out[idx] = rows[found][:, : self.dim]
        return out
