"""The bench's progress line: every few seconds, iteration, ms an iteration, ETA."""

from __future__ import annotations

import io

from harness.run.progress import Progress


def test_a_line_every_interval_with_the_rate_since_the_last_line_and_the_eta():
    now = [100.0]
    out = io.StringIO()
    p = Progress(total=50, every_s=5.0, out=out, clock=lambda: now[0])
    for it in range(10):  # 10 iterations of 0.6 s: a line after the 9th (5.4 s), none before
        now[0] += 0.6
        p.done(it)
    assert out.getvalue().splitlines() == ["iteration 9/50: 600.0 ms an iteration (last 5 s), ETA 25 s"]
    for it in range(10, 20):  # 2 s each: the next line counts iteration 9 (0.6 s) and 10..12 (2 s each)
        now[0] += 2.0
        p.done(it)
    lines = out.getvalue().splitlines()
    assert lines[1] == "iteration 13/50: 1650.0 ms an iteration (last 7 s), ETA 61 s"
    assert [ln.split(":")[0] for ln in lines] == ["iteration 9/50", "iteration 13/50", "iteration 16/50", "iteration 19/50"]


def test_a_segment_after_an_evaluation_counts_from_its_first_iteration():
    now = [0.0]
    out = io.StringIO()
    p = Progress(total=100, first=40, every_s=1.0, out=out, clock=lambda: now[0])
    now[0] = 2.0
    p.done(43)  # 4 iterations (40..43) in 2 s
    assert out.getvalue() == "iteration 44/100: 500.0 ms an iteration (last 2 s), ETA 28 s\n"
