"""Stage timing of every iteration: NVTX ranges plus timers, resolved without a sync per stage.

On CPU the clock is perf_counter_ns. On CUDA each boundary is a CUDA event recorded on the
current stream; events are resolved to nanoseconds only when the records are drained
(between iterations, outside the timed region), anchored to one host/device clock pair.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import nvtx
import torch

from harness.names import STAGES


@dataclass
class StageSpan:
    iteration: int
    stage: str
    start_ns: int
    end_ns: int


class _HostClock:
    def mark(self) -> int:
        return time.perf_counter_ns()

    def resolve(self, mark: int) -> int:
        return mark


class _CudaClock:
    """CUDA events; times are host-clock ns via an anchor event recorded right after a sync."""

    def __init__(self) -> None:
        torch.cuda.synchronize()
        self.anchor = torch.cuda.Event(enable_timing=True)
        self.anchor.record()
        torch.cuda.synchronize()
        self.anchor_ns = time.perf_counter_ns()

    def mark(self) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def resolve(self, mark: torch.cuda.Event) -> int:
        mark.synchronize()
        return self.anchor_ns + int(self.anchor.elapsed_time(mark) * 1e6)


class Timeline:
    """Marks stage and iteration boundaries; `drain()` hands back finished spans.

    With stages=False only iteration boundaries are taken (no NVTX, no per-stage marks),
    which is how the instrumentation's own cost is measured.
    """

    def __init__(self, *, cuda: bool, stages: bool) -> None:
        self.clock = _CudaClock() if cuda else _HostClock()
        self.stages_on = stages
        self._stage_marks: list[tuple[int, str, object, object]] = []
        self._iter_marks: list[tuple[int, object, object]] = []
        self._iter: int | None = None
        self._iter_start: object = None

    def begin_iteration(self, iteration: int) -> None:
        self._iter = iteration
        self._iter_start = self.clock.mark()

    def end_iteration(self) -> None:
        self._iter_marks.append((self._iter, self._iter_start, self.clock.mark()))
        self._iter = None

    @contextmanager
    def stage(self, name: str):
        if name not in STAGES:
            raise ValueError(f"unknown stage {name!r}; stages are {', '.join(STAGES)}")
        if not self.stages_on:
            yield
            return
        nvtx.push_range(name)
        start = self.clock.mark()
        try:
            yield
        finally:
            self._stage_marks.append((self._iter, name, start, self.clock.mark()))
            nvtx.pop_range()

    def open_span(self, stage: str, iteration: int) -> tuple[int, str, object, object]:
        """Start a span that ends elsewhere (a pipelined input dist ends in a later iteration,
        possibly begun on another thread); close it with close_span. Its NVTX range is a
        start/end range (nvtxRangeStartEx/End), which unlike push/pop may end on another thread."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
        if not self.stages_on:
            return (iteration, stage, None, None)
        return (iteration, stage, self.clock.mark(), nvtx.start_range(message=stage))

    def close_span(self, token: tuple[int, str, object, object]) -> None:
        if self.stages_on:
            iteration, stage, start, nvtx_range = token
            self._stage_marks.append((iteration, stage, start, self.clock.mark()))
            nvtx.end_range(nvtx_range)

    def drain(self) -> tuple[list[StageSpan], list[StageSpan]]:
        """(stage spans, iteration spans) since the last drain. On CUDA this waits for the marked work."""
        r = self.clock.resolve
        stages = [StageSpan(i, n, r(a), r(b)) for i, n, a, b in self._stage_marks]
        iters = [StageSpan(i, "iteration", r(a), r(b)) for i, a, b in self._iter_marks]
        self._stage_marks, self._iter_marks = [], []
        return stages, iters
