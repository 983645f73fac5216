"""Stage timing of every iteration: NVTX ranges plus timers, resolved without a sync per stage.

On CPU the clock is perf_counter_ns. On CUDA each boundary is a CUDA event recorded on the
rank's device's current stream; events are resolved to nanoseconds only when the records are
drained (between iterations, outside the timed region). A span's start is placed against an
anchor (a host/device clock pair) and its length is the start-to-end event difference, so the
float32 milliseconds `elapsed_time` returns cost at most a rounding of each (1 us at a second,
about 60 us at ten minutes from one anchor); the anchor is taken again at every drain, so the
offsets stay as short as a flush interval however long the run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import nvtx
import torch

from harness.names import BETWEEN_ITERATIONS, STAGES


@dataclass
class StageSpan:
    iteration: int
    stage: str
    start_ns: int
    end_ns: int


@dataclass
class SubSpan:
    """A named piece of work inside one stage of an iteration (a dynamic table's id transform, its
    rows written to the store, fetched back): what the stage's time went to, not a stage."""

    iteration: int
    stage: str
    name: str
    start_ns: int
    end_ns: int


class _HostClock:
    def mark(self) -> int:
        return time.perf_counter_ns()

    def resolve(self, start: int, end: int) -> tuple[int, int]:
        return start, end

    def drained(self) -> None:
        pass

    def rebase(self, mark: int, host_ns: int) -> None:
        pass


class DeviceEvent(Protocol):
    """What the event clock needs of an event (torch.cuda.Event; a fake in tests)."""

    def record(self) -> None: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end: "DeviceEvent") -> float: ...


@dataclass(frozen=True)
class _Anchor:
    event: DeviceEvent
    host_ns: int


class EventClock:
    """Device events resolved to host-clock ns: each mark keeps the anchor current when it was
    recorded, so a span begun before a drain and ended after it still resolves forward in time."""

    def __init__(self, *, new_event: Callable[[], DeviceEvent], synchronize: Callable[[], None],
                 now_ns: Callable[[], int] = time.perf_counter_ns) -> None:
        self._new_event, self._synchronize, self._now_ns = new_event, synchronize, now_ns
        self._anchor = self._take_anchor()

    def _take_anchor(self) -> _Anchor:
        self._synchronize()
        event = self._new_event()
        event.record()
        event.synchronize()
        return _Anchor(event, self._now_ns())

    def mark(self) -> tuple[DeviceEvent, _Anchor]:
        event = self._new_event()
        event.record()
        return event, self._anchor

    def resolve(self, start: tuple[DeviceEvent, _Anchor], end: tuple[DeviceEvent, _Anchor]) -> tuple[int, int]:
        (s, anchor), (e, _) = start, end
        e.synchronize()
        start_ns = anchor.host_ns + round(anchor.event.elapsed_time(s) * 1e6)
        return start_ns, start_ns + round(s.elapsed_time(e) * 1e6)

    def drained(self) -> None:
        """Take a new anchor (after a drain: the device is idle up to the last mark anyway)."""
        self._anchor = self._take_anchor()

    def rebase(self, mark: tuple[DeviceEvent, _Anchor], host_ns: int) -> None:
        """Anchor later marks on `mark`, a finished event already resolved to `host_ns`: keeps the
        offsets as short as a flush interval without the device-wide sync a new anchor costs (the
        rounding this adds is that of one flush interval in float32 ms, about 8 ns at 100 ms)."""
        self._anchor = _Anchor(mark[0], host_ns)


def cuda_clock(device: torch.device) -> EventClock:
    """Events on `device`, which must be the calling thread's current device: an event records on
    the current device's stream, and one made on another GPU would time that GPU's work."""
    if torch.cuda.current_device() != device.index:
        raise RuntimeError(f"the timeline of a rank on {device} was made while cuda:{torch.cuda.current_device()} "
                           "is current: its events would be recorded on another GPU")
    return EventClock(new_event=lambda: torch.cuda.Event(enable_timing=True),
                      synchronize=lambda: torch.cuda.synchronize(device))


def maybe_record_function(on: bool, name: str) -> contextlib.AbstractContextManager:
    """A torch.profiler range named `name` when `on` (the profiler is recording), else nothing."""
    return torch.profiler.record_function(name) if on else contextlib.nullcontext()


class Timeline:
    """Marks stage and iteration boundaries; `drain()` hands back finished spans.

    With stages=False only iteration boundaries are taken (no NVTX, no per-stage marks),
    which is how the instrumentation's own cost is measured.
    """

    def __init__(self, *, cuda: bool, stages: bool, device: torch.device | None = None,
                 clock: EventClock | None = None) -> None:
        """device: the rank's CUDA device (None: the current one); clock: stands in for the
        CUDA event clock (tests)."""
        if clock is None and cuda:
            clock = cuda_clock(device or torch.device("cuda", torch.cuda.current_device()))
        self.clock = clock or _HostClock()
        self.stages_on, self.cuda = stages, cuda
        self.annotate = False
        """Also open a torch.profiler range a stage (a --profile window is open: harness/run/profile_window.py)."""
        self._stage_marks: list[tuple[int, str, object, object]] = []
        self._iter_marks: list[tuple[int, object, object]] = []
        self._sub_marks: list[tuple[int, str, str, object, object]] = []
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
            with maybe_record_function(self.annotate, name):
                yield
        finally:
            self._stage_marks.append((self._iter, name, start, self.clock.mark()))
            nvtx.pop_range()

    def sub_span(self, stage: str, name: str) -> contextlib.AbstractContextManager:
        """Time `name`, a piece of `stage`, in the iteration under way (nothing outside one: an
        evaluation's work is no iteration's). Its NVTX range is `stage:name`, nested in the stage's."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
        return self._sub_mark(self._iter, stage, name)

    def between(self, after: int | None, name: str) -> contextlib.AbstractContextManager:
        """Time `name`, work the loop does between iteration `after`'s end and the next one's start
        (a sub-span of BETWEEN_ITERATIONS on iteration `after`: an iteration's time is the period
        between starts, so this belongs to it). after=None (before a segment's first iteration,
        which no iteration of the segment precedes): not recorded."""
        return self._sub_mark(after, BETWEEN_ITERATIONS, name)

    @contextmanager
    def _sub_mark(self, iteration: int | None, stage: str, name: str):
        if not self.stages_on or iteration is None:
            yield
            return
        nvtx.push_range(f"{stage}:{name}")
        start = self.clock.mark()
        try:
            with maybe_record_function(self.annotate, f"{stage}:{name}"):
                yield
        finally:
            self._sub_marks.append((iteration, stage, name, start, self.clock.mark()))
            nvtx.pop_range()

    def drain_sub(self, upto: "Cut | None" = None) -> list[SubSpan]:
        """Sub-spans finished since the last drain_sub, or those marked before `upto` (on CUDA
        this waits for the marked work)."""
        n = len(self._sub_marks) if upto is None else upto.subs
        r = self.clock.resolve
        subs = [SubSpan(i, st, n_, *r(a, b)) for i, st, n_, a, b in self._sub_marks[:n]]
        del self._sub_marks[:n]
        return subs

    def cut(self) -> "Cut":
        """Where the marks held now end: the next drain(upto=) takes those and leaves the rest (a
        cut counts from the front, so it holds until the next drain)."""
        return Cut(stages=len(self._stage_marks), iterations=len(self._iter_marks), subs=len(self._sub_marks))

    def part(self, stage: str, name: str) -> contextlib.AbstractContextManager:
        """A piece of `stage`'s span done now on this thread, when the span itself is open across
        iterations or threads (open_span): under a --profile window, a torch.profiler range
        `stage:name` on this thread, so the trace charges what it launches to `stage`
        (harness/report/profile_trace.py). Nothing is recorded: the span times the stage."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
        return maybe_record_function(self.stages_on and self.annotate, f"{stage}:{name}")

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

    def drain(self, upto: "Cut | None" = None) -> tuple[list[StageSpan], list[StageSpan]]:
        """(stage spans, iteration spans) since the last drain. On CUDA this waits for the marked
        work: all of it, and the device is synchronized for a new anchor; with `upto` (a cut taken
        a flush ago, its work long finished) only the marks before it, with no device-wide sync."""
        ns, ni = (len(self._stage_marks), len(self._iter_marks)) if upto is None else (upto.stages, upto.iterations)
        r = self.clock.resolve
        stages = [StageSpan(i, n, *r(a, b)) for i, n, a, b in self._stage_marks[:ns]]
        iters = [StageSpan(i, "iteration", *r(a, b)) for i, a, b in self._iter_marks[:ni]]
        last = self._iter_marks[ni - 1][2] if ni else None
        del self._stage_marks[:ns], self._iter_marks[:ni]
        if upto is None:
            self.clock.drained()
        elif last is not None:
            self.clock.rebase(last, iters[-1].end_ns)
        return stages, iters


@dataclass(frozen=True)
class Cut:
    """How many marks of each kind a Timeline held at a point (Timeline.cut)."""

    stages: int
    iterations: int
    subs: int
