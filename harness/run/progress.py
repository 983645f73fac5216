"""A line every few seconds while a run trains (rank 0): iteration, ms an iteration, ETA.

Read from the host clock between iterations only, outside every timed stage, and never from the
device: the loss stays where it is until a flush. A run that finishes within the first interval
prints nothing; the summary follows it anyway.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

EVERY_S = 5.0
"""Seconds between lines."""


class Progress:
    def __init__(self, *, total: int, first: int = 0, every_s: float = EVERY_S, out: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """total: the run's iterations (warm-up included); first: the iteration this segment starts at."""
        self.total, self.every_s, self.out, self.clock = total, every_s, out, clock
        self._since_t, self._since_it = clock(), first

    def done(self, it: int) -> None:
        """Iteration `it` finished: a line when `every_s` passed since the last one (or the start)."""
        now = self.clock()
        if now - self._since_t < self.every_s:
            return
        ms = 1e3 * (now - self._since_t) / max(1, it + 1 - self._since_it)
        eta = ms * (self.total - it - 1) / 1e3
        print(f"iteration {it + 1}/{self.total}: {ms:.1f} ms an iteration (last {now - self._since_t:.0f} s), "
              f"ETA {eta:.0f} s", file=self.out or sys.stdout, flush=True)
        self._since_t, self._since_it = now, it + 1
