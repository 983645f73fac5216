"""What a train loop hands to the run folder between iterations: spans, sub-spans, losses, split counts.

Losses stay on the device until a flush, so the timed region never waits for a device-to-host
copy; a flush happens between iterations (every --flush-every, 100 by default: a write's cost
hardly depends on how many iterations it holds; at the end; after a failure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.run.pinned_d2h import HostCopy, HostCopies
from harness.records.writer import RankRecorder
from harness.run.timeline import Cut, Timeline


class NonFiniteLoss(RuntimeError):
    """A loss came back NaN or inf: every iteration after it would train on garbage."""


@dataclass
class _Started:
    """A lagged flush's half begun: its marks' cut, its losses' copy (maybe in flight) and counts."""

    cut: Cut | None
    """None: everything the timeline holds (a full flush)."""
    its: list[int]
    copy: HostCopy | None
    exchanged: dict[int, int]
    moved: dict[int, dict[str, tuple[int, int]]]


class RecordFlusher:
    """host: the copies of the losses. On CUDA they are asynchronous (pinned), so that the loop's
    flushes can lag: each writes what the one before began and begins the next, and the host never
    waits for the device there. A flush that waited cost the first H100 runs 2 to 3 ms an iteration
    (a device-wide sync and a drained queue every 10 iterations, then the GPU idle while the host
    wrote parquet)."""

    def __init__(self, *, timeline: Timeline, host: HostCopies, recorder: RankRecorder | None) -> None:
        self.timeline, self.host, self.recorder = timeline, host, recorder
        self.pending: dict[int, torch.Tensor] = {}
        """Iteration -> its loss, still on the device."""
        self.exchanged: dict[int, int] = {}
        """Iteration -> splits all-to-alls its input dist ran (engines that count them)."""
        self.losses: list[float] = []
        """Every flushed loss, in iteration order."""
        self.moved: dict[int, dict[str, tuple[int, int]]] = {}
        """Iteration -> exchange phase -> (bytes sent, bytes received) (model/collective_bytes.py)."""
        self._started: _Started | None = None

    def flush(self, *, lag: bool = False) -> None:
        """Write what was marked and recorded so far (waiting for the device where it must). lag:
        the loop's periodic flush; with asynchronous loss copies it writes only what the previous
        lagged flush began (finished by now) and begins the rest; a later flush without lag (the
        end, an evaluation, a failure) writes everything."""
        # Each half begun is taken before it is written: a write that fails (a non-finite loss)
        # leaves nothing to be written twice by the flush after the failure.
        if lag and self.host.active:
            started, self._started = self._started, None
            if started is not None:  # first: a cut counts the marks the timeline holds
                self._write(started)
            self._started = self._begin(self.timeline.cut())
            return
        started, self._started = self._started, None
        if started is not None:
            self._write(started)
        self._write(self._begin(None))

    def _begin(self, cut: Cut | None) -> _Started:
        its = sorted(self.pending)
        copy = self.host.copy(torch.stack([self.pending[i] for i in its])) if its else None
        started = _Started(cut=cut, its=its, copy=copy, exchanged=self.exchanged, moved=self.moved)
        self.pending, self.exchanged, self.moved = {}, {}, {}
        return started

    def _write(self, started: _Started) -> None:
        values = dict(zip(started.its, started.copy.tolist())) if started.copy is not None else {}
        subs = self.timeline.drain_sub(started.cut)
        stage_spans, iter_spans = self.timeline.drain(started.cut)
        self.losses.extend(values[i] for i in started.its)
        if self.recorder is not None:
            self.recorder.write(stage_spans, iter_spans, values, splits_exchanged=started.exchanged,
                                moved=started.moved)
            self.recorder.write_subspans(subs)
        bad = [i for i in started.its if not math.isfinite(values[i])]
        if bad:  # read here, on the host, with the records written: the loop itself never waits for a loss
            raise NonFiniteLoss(f"the loss is {values[bad[0]]} at iteration {bad[0]} (first non-finite loss; the "
                                "data or --learning-rate may be to blame): the run stops here")
