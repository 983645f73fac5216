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
