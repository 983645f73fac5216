"""Sharding plans: which rank owns which embedding table."""

from __future__ import annotations

from collections.abc import Sequence


def table_wise_plan(table_bytes: Sequence[int], world_size: int) -> list[int]:
    """Owner rank of each table, balancing bytes per rank (largest table first, to the lightest rank).

    Deterministic: ties go to the lowest rank, so every rank computes the same plan alone.
    Ranks may own no table when there are more ranks than tables.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    load = [0] * world_size
    owners = [0] * len(table_bytes)
    for t in sorted(range(len(table_bytes)), key=lambda t: (-table_bytes[t], t)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owners[t] = r
        load[r] += table_bytes[t]
    return owners
