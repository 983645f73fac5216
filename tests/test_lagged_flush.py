"""The loop's periodic flush on CUDA lags one flush behind and never synchronizes the device: it
writes what the flush before began (finished by then) and begins the rest. Checked on a fake
device clock (tests/test_timeline.py's) that counts device-wide syncs, against hand values."""

from __future__ import annotations

import torch

from harness.run.flush import RecordFlusher
from harness.run.pinned_d2h import HostCopy
from harness.run.timeline import EventClock, Timeline
from tests.test_timeline import _FakeDevice, _FakeEvent


class _CountingDevice(_FakeDevice):
    def __init__(self) -> None:
        super().__init__()
        self.syncs = 0

    def synchronize(self) -> None:
        self.syncs += 1


class _AsyncCopies:
    """Stands in for pinned HostCopies on CUDA: asynchronous (active), each copy counted."""

    active = True

    def __init__(self) -> None:
        self.copies = 0

    def copy(self, t: torch.Tensor) -> HostCopy:
        self.copies += 1
        return HostCopy.ready(t.clone())


class _Recorder:
    def __init__(self) -> None:
        self.writes: list[tuple[list[int], list[int], dict[int, float]]] = []

    def write(self, stage_spans, iter_spans, values, *, splits_exchanged, moved) -> None:
        self.writes.append(([s.iteration for s in stage_spans], [s.iteration for s in iter_spans], dict(values)))

    def write_subspans(self, subs) -> None:
        pass


def _timeline(device: _CountingDevice) -> Timeline:
    clock = EventClock(new_event=lambda: _FakeEvent(device), synchronize=device.synchronize,
                       now_ns=lambda: device.now_ns)
    return Timeline(cuda=True, stages=True, clock=clock)


def _iteration(tl: Timeline, flusher: RecordFlusher, device: _CountingDevice, it: int) -> None:
    tl.begin_iteration(it)
    with tl.stage("emb_fwd"):
        device.now_ns += 1_000_000
    tl.end_iteration()
    device.now_ns += 10_000
    flusher.pending[it] = torch.tensor(float(it))


def test_lagged_flushes_write_a_flush_late_and_never_sync():
    device = _CountingDevice()
    tl = _timeline(device)
    recorder = _Recorder()
    flusher = RecordFlusher(timeline=tl, host=_AsyncCopies(), recorder=recorder)
    syncs_at_start = device.syncs  # the first anchor
    for it in range(10):
        _iteration(tl, flusher, device, it)
        if it % 3 == 2:
            flusher.flush(lag=True)
    assert device.syncs == syncs_at_start
    # flushes after iterations 2, 5, 8: the first writes nothing, the others what the one before began
    assert recorder.writes == [([0, 1, 2], [0, 1, 2], {0: 0.0, 1: 1.0, 2: 2.0}),
                               ([3, 4, 5], [3, 4, 5], {3: 3.0, 4: 4.0, 5: 5.0})]
    assert flusher.losses == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    flusher.flush()  # the end: everything, in order, with the one device sync of a new anchor
    assert recorder.writes[2:] == [([6, 7, 8], [6, 7, 8], {6: 6.0, 7: 7.0, 8: 8.0}), ([9], [9], {9: 9.0})]
    assert flusher.losses == [float(i) for i in range(10)]
    assert device.syncs == syncs_at_start + 1


def test_without_asynchronous_copies_a_periodic_flush_writes_everything():
    """On CPU (and any host whose loss copies are synchronous) lagging would buy nothing."""
    device = _CountingDevice()
    tl = _timeline(device)
    recorder = _Recorder()
    copies = _AsyncCopies()
    copies.active = False
    flusher = RecordFlusher(timeline=tl, host=copies, recorder=recorder)
    for it in range(3):
        _iteration(tl, flusher, device, it)
    flusher.flush(lag=True)
    assert recorder.writes == [([0, 1, 2], [0, 1, 2], {0: 0.0, 1: 1.0, 2: 2.0})]


def test_rebased_anchors_keep_spans_exact_and_placement_within_50_us_after_ten_minutes():
    """Lagged drains re-anchor on a finished event instead of a sync: each adds at most one float32
    rounding of a flush interval. 6,000 flushes 100 ms apart (10 minutes): every span's length
    within 1 us, its placement within 50 us of the device's (host = device + 3 s here)."""
    device = _CountingDevice()
    offset = 3_000_000_000
    clock = EventClock(new_event=lambda: _FakeEvent(device), synchronize=device.synchronize,
                       now_ns=lambda: device.now_ns + offset)
    tl = Timeline(cuda=True, stages=True, clock=clock)
    truth, spans, cut = {}, [], None
    for it in range(6000):
        device.now_ns += 98_765_432
        tl.begin_iteration(it)
        start = device.now_ns
        with tl.stage("emb_fwd"):
            device.now_ns += 1_234_567
        tl.end_iteration()
        truth[it] = (start + offset, device.now_ns + offset)
        if cut is not None:
            stages, iters = tl.drain(upto=cut)
            spans += iters
            assert all(abs((s.end_ns - s.start_ns) - 1_234_567) <= 1_000 for s in stages)
        cut = tl.cut()
    assert device.syncs == 1 and len(spans) == 5999
    worst = max(max(abs(s.start_ns - truth[s.iteration][0]), abs(s.end_ns - truth[s.iteration][1])) for s in spans)
    assert worst <= 50_000, worst


def test_a_flush_imports_nothing():
    """A flush runs inside the timed iterations: whatever its first call would import (pyarrow's
    first array imports pandas) must be imported when the recorder is built, at the rank's start."""
    import subprocess
    import sys

    code = ("import sys, tempfile; from pathlib import Path; "
            "from harness.records.writer import RankRecorder; from harness.run.timeline import StageSpan, SubSpan; "
            "rec = RankRecorder(Path(tempfile.mkdtemp()), run_id='r', rank=0, node=0, warmup_iters=1, local_batch=4); "
            "before = set(sys.modules); "
            "spans = [StageSpan(iteration=i, stage='emb_fwd', start_ns=i, end_ns=i + 1) for i in range(3)]; "
            "rec.write(spans, spans, {0: 0.5}, moved={0: {'ids': (1, 2)}}); "
            "rec.write_subspans([SubSpan(iteration=0, stage='emb_fwd', name='x', start_ns=0, end_ns=1)]); "
            "print(sorted(set(sys.modules) - before))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
