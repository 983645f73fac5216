"""Slots of dynamic tables from a memory budget (`--dynamic-memory-gib`): how many rows each
dynamic table keeps resident when they share a number of bytes rather than each being given a
number of slots.

The budget is split in proportion to each table's ids a sample (its pooling factor): a table
looked up more often brings more distinct ids a batch, so it needs more slots for the same hit
rate. A table is never given more slots than it has rows; what it cannot use goes to the others,
again by pooling (water-filling). A slot costs its row and the row's optimizer state, as the
planner counts a shard (model/plan_traffic.shard_bytes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class DynamicDemand:
    """What the split needs to know of one dynamic table."""

    rows: int
    """Its id space: the most slots it can use."""
    pooling: float
    """Its ids a sample, its claim on the budget."""
    slot_bytes: float
    """Bytes one slot holds (a row and its optimizer state)."""


def budget_slots(tables: Mapping[int, DynamicDemand], budget_bytes: float) -> dict[int, int]:
    """Each table's slots: its share of budget_bytes by pooling, at most its rows, floored to
    whole slots. Raises ValueError when a table's share does not hold one slot."""
    if not budget_bytes > 0:
        raise ValueError(f"a dynamic memory budget must be > 0 bytes, got {budget_bytes}")
    share: dict[int, float] = {}
    open_tables = dict(tables)
    left = float(budget_bytes)
    while open_tables:
        weight = sum(d.pooling for d in open_tables.values())
        capped = {t: d for t, d in open_tables.items() if left * d.pooling / weight >= d.rows * d.slot_bytes}
        if not capped:  # every remaining table takes its pooling share
            for t, d in open_tables.items():
                share[t] = left * d.pooling / weight
            break
        for t, d in capped.items():  # these get all their rows; the rest share what is left
            share[t] = d.rows * d.slot_bytes
            left -= share[t]
            del open_tables[t]
    slots = {}
    for t, d in tables.items():
        slots[t] = min(d.rows, math.floor(share[t] / d.slot_bytes))
        if slots[t] < 1:
            raise ValueError(f"table {t}: its share of the dynamic memory budget, {share[t]:,.0f} bytes, holds no slot "
                             f"of {d.slot_bytes:,.0f} bytes; raise --dynamic-memory-gib")
    return dict(sorted(slots.items()))
