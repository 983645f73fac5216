"""Where a dynamic table's rows live: the ID transformer (csrc/id_transformer.cpp, built by
`make ext`) maps global ids to a fixed number of slots, admitting new ids and evicting the
coldest under an LRU, LFU or hybrid (decayed LFU, LRU ties) policy.

`IdTransformer.transform(ids)` gives each id's slot and what moved: the ids admitted (in the
order they first occur in the batch) with their slots, and the ids evicted (coldest first) with
the slots they left, which the admitted ids reuse. A row evicted goes to the parameter server
before its slot is reused; a row admitted is initialised or fetched from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model.extensions import extension
from model.names import DYNAMIC_POLICIES

POLICIES = DYNAMIC_POLICIES
"""Eviction policies: least recent; fewest accesses (least recent among equals); accesses with
their counter halved every `half_life` id occurrences since the last, least recent among equals."""


TRANSFORM_PARTS = ("scan", "victims", "admit")
"""What a transform's time goes to, in order: the scan (each id to its slot, or listed as new; for a
batch large enough, after a pass that warms the table's address translations), the victims'
choice (lru: off its log's front; lfu, hybrid: the coldest slots) and admit (each victim out of
the table, a new id into its slot). The outputs' allocation between them is in none."""


DEFAULT_HALF_LIFE = 1 << 20
"""Id occurrences after which a hybrid counter halves (about 10 batches of small's 4096 x 26 ids)."""


def _extension():
    return extension("model._id_transformer", "ID transformer")


@dataclass(frozen=True)
class Transformed:
    slots: torch.Tensor
    """The slot of each id, in the shape of the ids."""
    admitted_ids: torch.Tensor
    admitted_slots: torch.Tensor
    evicted_ids: torch.Tensor
    evicted_slots: torch.Tensor


class IdTransformer:
    """A table's id -> slot map with `capacity` slots (thread-safe; see csrc/id_transformer.cpp)."""

    def __init__(self, capacity: int, policy: str = "hybrid", half_life: int = DEFAULT_HALF_LIFE) -> None:
        if policy not in POLICIES:
            raise ValueError(f"id transformer policy {policy!r} is not one of {', '.join(POLICIES)}")
        self._impl = _extension().IdTransformer(capacity, policy, half_life)
        self.policy = policy

    @property
    def capacity(self) -> int:
        return self._impl.capacity

    @property
    def table_bytes(self) -> int:
        """Bytes of the id -> slot hash table (the structure every id reads at a random place)."""
        return self._impl.table_bytes

    @property
    def host_bytes(self) -> int:
        """Host memory it holds now: the hash table, lru's access log and its dead bits or lfu's and
        hybrid's slot state, and the working lists kept between batches (they grow to the largest
        batch seen). Not part of the slots' budget (--dynamic-memory-gib counts device rows)."""
        return self._impl.host_bytes

    def transform(self, ids: torch.Tensor) -> Transformed:
        """Raises ValueError when the batch has more distinct ids than slots; the table is then
        left exactly as it was (nothing admitted, no recency or count changed)."""
        return Transformed(*self._impl.transform(ids))

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Each id's slot, -1 where it is not resident; recency and counts are left alone."""
        return self._impl.lookup(ids)

    def homes(self, ids: torch.Tensor) -> torch.Tensor:
        """Each id's home bucket in the hash table, where its probe starts (of table_bytes / 16
        buckets, a multiple of 4: homes are cache-line starts); for building ids that collide."""
        return self._impl.homes(ids)

    def slot_ids(self) -> torch.Tensor:
        """The id each slot holds, -1 for slots never used."""
        return self._impl.slot_ids()

    def resident(self) -> int:
        return self._impl.resident()

    def log_compactions(self) -> int:
        """lru: how many times its access log was compacted (0 for the other policies)."""
        return self._impl.log_compactions()

    def set_vector_scan(self, mode: str) -> None:
        """lru's scan of 8 ids at a time (AVX-512; the same results): "auto" (the default: where the
        CPU has AVX-512 and the batch before had a quarter or more new ids), "always" (ValueError
        where the CPU lacks AVX-512) or "never" (ValueError for anything else, from the extension)."""
        self._impl.set_vector_scan(mode)

    def vector_scanned_ids(self) -> int:
        """Ids lru's vector scan has taken, 8 a step (not those it left to the scalar steps)."""
        return self._impl.vector_scanned_ids()

    def part_seconds(self) -> dict[str, float]:
        """Seconds transform has spent so far in each of its parts (TRANSFORM_PARTS), by name."""
        return dict(zip(TRANSFORM_PARTS, self._impl.part_seconds()))


def log_room_per_slot() -> int:
    """lru's access log is a ring of room for at least this many entries a slot: evictions free
    its front, and it is compacted (its dead entries dropped) only when a batch would reach the
    front, which takes the least recent resident id's access being that far behind."""
    return int(_extension().log_room_per_slot)


def random_read_rate(table_bytes: int, reads: int = 1 << 20) -> float:
    """Random 16-byte reads a second from a table of `table_bytes` on this machine, prefetched as
    the transformer's loops prefetch: the ceiling of a loop that reads such a table once an item."""
    return _extension().random_read_rate(table_bytes, reads)
