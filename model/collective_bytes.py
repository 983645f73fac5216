"""Bytes each collective moves, counted where it is launched (the records' bytes moved).

A rank counts what it sends to other ranks and receives from them: its own share of an
all-to-all moves nothing. For the collectives whose algorithm the library picks (all-reduce,
reduce-scatter, all-gather) the count is what a ring moves, which is also the least any
algorithm moves per rank: an all-reduce of n bytes over w ranks sends and receives
2 (w - 1) / w n each, a reduce-scatter or an all-gather of n bytes in all (w - 1) / w n.

Counts are by exchange phase, which the harness maps to its stages; `take()` hands them over
and starts again. The input thread may launch the ids exchange while the main thread counts the
others, so the counts are guarded by a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from model.names import EXCHANGE_PHASES as PHASES


class CollectiveBytes:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent = dict.fromkeys(PHASES, 0)
        self._received = dict.fromkeys(PHASES, 0)

    def _add(self, phase: str, sent: float, received: float) -> None:
        with self._lock:
            self._sent[phase] += int(round(sent))
            self._received[phase] += int(round(received))

    def all_to_all(self, phase: str, *, send_splits: Sequence[int], recv_splits: Sequence[int], element_size: int,
                   rank: int) -> None:
        """An all-to-all of these splits (elements to / from each rank, in rank order)."""
        self._add(phase, (sum(send_splits) - send_splits[rank]) * element_size,
                  (sum(recv_splits) - recv_splits[rank]) * element_size)

    def ring(self, phase: str, *, nbytes: int, world_size: int, passes: int) -> None:
        """A collective over `nbytes` in all: passes=2 for an all-reduce, 1 for a reduce-scatter
        or an all-gather (nbytes: the whole gathered / scattered tensor)."""
        if world_size > 1:
            moved = passes * (world_size - 1) / world_size * nbytes
            self._add(phase, moved, moved)

    def take(self) -> dict[str, tuple[int, int]]:
        """phase -> (bytes sent, bytes received) since the last take; the counts start again."""
        with self._lock:
            out = {p: (self._sent[p], self._received[p]) for p in PHASES}
            self._sent = dict.fromkeys(PHASES, 0)
            self._received = dict.fromkeys(PHASES, 0)
        return out
