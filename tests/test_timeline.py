"""The timeline: stage spans nest in their iteration, names are checked, and 'off' takes only iterations."""

from __future__ import annotations

import time

import pytest
import torch

from harness.names import STAGES
from harness.run.timeline import Timeline


def test_spans_follow_the_clock_and_nest():
    tl = Timeline(cuda=False, stages=True)
    for it in range(2):
        tl.begin_iteration(it)
        for s in STAGES:
            with tl.stage(s):
                time.sleep(0.002)
        tl.end_iteration()
    stages, iters = tl.drain()
    assert [s.stage for s in stages] == list(STAGES) * 2
    assert [i.iteration for i in iters] == [0, 1]
    for s in stages:
        assert s.end_ns - s.start_ns >= 2_000_000  # slept 2 ms inside
        it = iters[s.iteration]
        assert it.start_ns <= s.start_ns <= s.end_ns <= it.end_ns
    assert tl.drain() == ([], [])


def test_unknown_stage_is_refused():
    tl = Timeline(cuda=False, stages=True)
    tl.begin_iteration(0)
    with pytest.raises(ValueError, match="unknown stage 'lookup'"):
        with tl.stage("lookup"):
            pass


def test_stages_off_keeps_iterations_only():
    tl = Timeline(cuda=False, stages=False)
    tl.begin_iteration(0)
    with tl.stage("emb_fwd"):
        pass
    tl.end_iteration()
    stages, iters = tl.drain()
    assert stages == [] and len(iters) == 1


def test_input_dist_span_has_an_nvtx_range_that_may_end_on_another_thread(monkeypatch):
    import threading

    import harness.run.timeline as timeline_mod

    calls: list[tuple] = []
    monkeypatch.setattr(timeline_mod.nvtx, "start_range",
                        lambda message: calls.append(("start", message, threading.get_ident())) or ("range", 7))
    monkeypatch.setattr(timeline_mod.nvtx, "end_range", lambda rid: calls.append(("end", rid, threading.get_ident())))
    tl = Timeline(cuda=False, stages=True)
    opener = threading.Thread(target=lambda: calls.append(("token", tl.open_span("input_dist", 3))))
    opener.start()
    opener.join()
    token = calls.pop()[1]
    tl.begin_iteration(3)
    tl.close_span(token)
    tl.end_iteration()
    (start, end) = calls
    assert start[:2] == ("start", "input_dist") and end[:2] == ("end", ("range", 7))
    assert start[2] != end[2]  # begun on the input thread, ended on the main one
    stages, _ = tl.drain()
    assert [(s.iteration, s.stage) for s in stages] == [(3, "input_dist")]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_events_resolve_to_host_time():
    tl = Timeline(cuda=True, stages=True)
    a = torch.randn(2048, 2048, device="cuda")
    t0 = time.perf_counter_ns()
    tl.begin_iteration(0)
    with tl.stage("dense_fwd_bwd"):
        for _ in range(20):
            a = a @ a / 2048
    tl.end_iteration()
    stages, iters = tl.drain()
    t1 = time.perf_counter_ns()
    (s,) = stages
    assert s.end_ns > s.start_ns and t0 - 1_000_000 <= iters[0].start_ns <= s.start_ns and s.end_ns <= t1


class _FakeDevice:
    """A device clock in ns that tests move by hand."""

    def __init__(self) -> None:
        self.now_ns = 0


class _FakeEvent:
    """An event on the fake device; elapsed_time rounds to float32 milliseconds as CUDA's does."""

    def __init__(self, device: _FakeDevice) -> None:
        self.device, self.at_ns = device, None

    def record(self) -> None:
        self.at_ns = self.device.now_ns

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "_FakeEvent") -> float:
        return float(torch.tensor((end.at_ns - self.at_ns) / 1e6, dtype=torch.float32))


def test_event_times_keep_microseconds_ten_minutes_into_a_run():
    """float32 ms from one anchor would be off by tens of microseconds after 10 minutes; spans
    measured start to end, against an anchor taken again at each drain, stay within 1 us."""
    from harness.run.timeline import EventClock

    device = _FakeDevice()
    host_offset = 5_000_000_000  # the host clock reads the device clock + 5 s
    clock = EventClock(new_event=lambda: _FakeEvent(device), synchronize=lambda: None,
                       now_ns=lambda: device.now_ns + host_offset)
    tl = Timeline(cuda=True, stages=True, clock=clock)
    spans = []
    for minute in range(1, 11):
        device.now_ns = minute * 60_000_000_000  # a minute later each time, a flush a second before
        tl.drain()
        device.now_ns += 1_000_123_457
        tl.begin_iteration(minute)
        device.now_ns += 1_000
        with tl.stage("emb_fwd"):
            device.now_ns += 1_234_567  # 1.234567 ms of work
        device.now_ns += 2_000
        tl.end_iteration()
        stages, iters = tl.drain()
        spans.append((stages[0], iters[0], device.now_ns))
    for stage, it, end in spans:
        assert abs((stage.end_ns - stage.start_ns) - 1_234_567) <= 1_000
        assert abs(it.end_ns - (end + host_offset)) <= 1_000  # absolute placement, too
    # What one anchor at time 0 gives at the 10th minute (the old way): tens of microseconds off.
    first = _FakeEvent(device)
    first.at_ns = 0
    last = _FakeEvent(device)
    last.at_ns = spans[-1][2]
    assert abs(first.elapsed_time(last) * 1e6 - spans[-1][2]) > 10_000


def test_a_span_open_across_a_drain_resolves_against_its_own_anchor():
    from harness.run.timeline import EventClock

    device = _FakeDevice()
    clock = EventClock(new_event=lambda: _FakeEvent(device), synchronize=lambda: None, now_ns=lambda: device.now_ns)
    tl = Timeline(cuda=True, stages=True, clock=clock)
    token = tl.open_span("input_dist", 1)  # a pipelined input dist: begun before the flush
    device.now_ns = 7_000_000
    tl.drain()  # re-anchors at 7 ms
    device.now_ns = 9_000_000
    tl.close_span(token)
    (span,), _ = tl.drain()
    assert (span.start_ns, span.end_ns) == (0, 9_000_000)


def test_perf_times_a_stage_with_the_clock_a_run_uses(monkeypatch):
    """make perf's per-stage cost: host clock on CPU; on CUDA the events a CUDA run records, with the
    device synchronized around the loop (a stand-in clock and sync record that here)."""
    import harness.tools.perf as perf
    from harness.run.timeline import EventClock

    assert 0 < perf.stage_cost_ns(1000) < 1e6
    syncs = []
    device = _FakeDevice()
    monkeypatch.setattr(perf, "Timeline", lambda cuda, stages: Timeline(
        cuda=cuda, stages=stages, clock=EventClock(new_event=lambda: _FakeEvent(device), synchronize=lambda: None)
        if cuda else None))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: syncs.append("sync"))
    assert perf.stage_cost_ns(100, cuda=True) > 0
    assert syncs == ["sync", "sync"]


def test_sub_spans_belong_to_the_iteration_under_way_and_only_to_one():
    tl = Timeline(cuda=False, stages=True)
    with tl.sub_span("input_dist", "dynamic_transform"):  # no iteration: an evaluation's work
        pass
    tl.begin_iteration(4)
    with tl.stage("input_dist"):
        with tl.sub_span("input_dist", "dynamic_fetch"):
            time.sleep(0.002)
    tl.end_iteration()
    (sub,) = tl.drain_sub()
    (stage,), _ = tl.drain()
    assert (sub.iteration, sub.stage, sub.name) == (4, "input_dist", "dynamic_fetch")
    assert stage.start_ns <= sub.start_ns and sub.end_ns <= stage.end_ns and sub.end_ns - sub.start_ns >= 2e6
    assert tl.drain_sub() == []
    with pytest.raises(ValueError, match="unknown stage 'lookup'"):
        with tl.sub_span("lookup", "x"):
            pass
    off = Timeline(cuda=False, stages=False)
    off.begin_iteration(0)
    with off.sub_span("input_dist", "dynamic_fetch"):
        pass
    assert off.drain_sub() == []
