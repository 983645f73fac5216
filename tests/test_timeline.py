"""The timeline: stage spans nest in their iteration, names are checked, and 'off' takes only iterations."""

from __future__ import annotations

import time

import pytest
import torch

from harness.names import STAGES
from harness.timeline import Timeline


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

    import harness.timeline as timeline_mod

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
