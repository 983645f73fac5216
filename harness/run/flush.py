"""What a train loop hands to the run folder between iterations: spans, sub-spans, losses, split counts.

Losses stay on the device until a flush, so the timed region never waits for a device-to-host
copy; a flush happens between iterations (every --flush-every, at the end, after a failure).
"""

from __future__ import annotations

import torch

from harness.run.pinned_d2h import HostCopies
from harness.records.writer import RankRecorder
from harness.run.timeline import Timeline


class RecordFlusher:
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

    def flush(self) -> None:
        subs = self.timeline.drain_sub()
        stage_spans, iter_spans = self.timeline.drain()
        its = sorted(self.pending)
        values = dict(zip(its, self.host.copy(torch.stack([self.pending[i] for i in its])).tolist())) if its else {}
        self.losses.extend(values[i] for i in its)
        self.pending.clear()
        if self.recorder is not None:
            self.recorder.write(stage_spans, iter_spans, values, splits_exchanged=self.exchanged, moved=self.moved)
            self.recorder.write_subspans(subs)
        self.exchanged.clear()
        self.moved.clear()
