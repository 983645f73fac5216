"""Host against device per stage, from a --profile Chrome trace (harness/report/profile_trace.py).

A synthetic trace with every figure worked out by hand; the real H100 trace
(tests/data/h100-runs-2/s-bf16-prof/rank00000/trace.json.gz: small preset, 8192 samples, bf16 dense, three
profiled iterations), which is launch-bound; and the run report's section, present with a trace
and absent without one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from harness.report import profile_trace as pt
from harness.report.api import report_main
from harness.report.html import Doc

DATA = Path(__file__).parent / "data"
H100_TRACE = DATA / "h100-runs-2" / "s-bf16-prof" / "rank00000" / "trace.json.gz"
H100_RUNS = DATA / "h100-runs"
H100_RUN = "20261126-102122-compare-small-1x1-415d-r0-harness"
BASE_US = 4.85e12  # a trace's timestamps are microseconds on the host's clock: large numbers
SECTION = "## Host against device (profiled iterations)"


def _x(cat: str, name: str, start_ms: float, end_ms: float, *, tid: int = 1, **args) -> dict:
    """A complete event as torch.profiler writes it (times in µs)."""
    return {"ph": "X", "cat": cat, "name": name, "pid": 1 if cat in pt.LAUNCH_CATS + (pt.ANNOTATION_CAT,) else 0,
            "tid": tid, "ts": BASE_US + 1e3 * start_ms, "dur": 1e3 * (end_ms - start_ms), "args": args}


def _iteration(t0: float, corr: int, *, next_batch: bool) -> list[dict]:
    """One iteration at t0 ms. emb_fwd [0, 10]: three 1 ms kernels, each launched 0.5 ms before it
    starts and 1.5 ms after the previous one ended (launch-bound). dense_fwd_bwd [10, 12]: three
    3 ms kernels launched at once (one by the driver API, one on another thread), back to back but
    for a 0.1 ms gap (kernel-bound). A memset launched at 20, outside every stage."""
    ev = [_x("user_annotation", "emb_fwd", t0, t0 + 10), _x("user_annotation", "nccl:all_to_all", t0 + 1, t0 + 1.2),
          _x("user_annotation", "dense_fwd_bwd", t0 + 10, t0 + 12)]
    launches = [("cuda_runtime", "cudaLaunchKernel", 1.0, 1, "kernel", 1.5, 2.5),
                ("cuda_runtime", "cudaLaunchKernel", 4.0, 1, "kernel", 4.5, 5.5),
                ("cuda_runtime", "cudaLaunchKernel", 7.0, 1, "kernel", 7.5, 8.5),
                ("cuda_runtime", "cudaLaunchKernel", 10.2, 1, "kernel", 10.5, 13.5),
                ("cuda_driver", "cuLaunchKernel", 10.4, 1, "kernel", 13.5, 16.5),
                ("cuda_runtime", "cudaMemcpyAsync", 10.6, 2, "gpu_memcpy", 16.6, 19.6),
                ("cuda_runtime", "cudaMemsetAsync", 20.0, 1, "gpu_memset", 20.5, 21.0)]
    for i, (cat, name, at, tid, kcat, ks, ke) in enumerate(launches):
        ev.append(_x(cat, name, t0 + at, t0 + at + 0.1, tid=tid, correlation=corr + i))
        ev.append(_x(kcat, f"k{i}", t0 + ks, t0 + ke, tid=7, correlation=corr + i, stream=7, device=0))
    # A host call that launches nothing: its time is no launch's.
    ev.append(_x("cuda_runtime", "cudaStreamSynchronize", t0 + 11.0, t0 + 11.5, correlation=corr + 50))
    if next_batch:
        ev.append(_x("user_annotation", "between_iterations:next_batch", t0 + 22, t0 + 23))
    return ev


def _synthetic(path: Path) -> Path:
    events = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}}]
    events += _iteration(0.0, 1, next_batch=True) + _iteration(25.0, 101, next_batch=False)
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


# stage: iterations, host, kernels, launch calls, kernel, busy, window, idle, launch wait, verdict
HAND = {
    # window 1.5-8.5; busy 3 of it; each of the two 2 ms gaps waits 1.5 ms for its launch call.
    "emb_fwd": (2, 10.0, 3, 0.3, 3.0, 3.0, 7.0, 4.0, 3.0, "launch-bound"),
    # window 10.5-19.6; the 0.1 ms gap's kernel was launched long before: no launch wait.
    "dense_fwd_bwd": (2, 2.0, 3, 0.3, 9.0, 9.0, 9.1, 0.1, 0.0, "kernel-bound"),
    "between_iterations/next_batch": (1, 1.0, 0, 0.0, 0.0, 0.0, None, None, None, pt.NO_KERNELS),
    pt.OUTSIDE: (2, None, 1, 0.1, 0.5, 0.5, None, None, None, pt.NO_VERDICT),
}


def _same(value, hand) -> bool:
    return pd.isna(value) if hand is None else value == pytest.approx(hand, abs=1e-6)


def test_synthetic_trace_every_figure_by_hand(tmp_path):
    """Every figure of the stage table and of the window's summary against its hand value."""
    profile = pt.analyze(_synthetic(tmp_path / "trace.json"))
    table = profile.stages.set_index("stage")
    assert list(table.index) == list(HAND)  # STAGES order, then between iterations, then outside
    numbers = ["iterations", "host_ms", "kernels", "launch_ms", "kernel_ms", "gpu_busy_ms", "gpu_window_ms",
               "gpu_idle_ms", "launch_wait_ms"]
    for stage, hand in HAND.items():
        row = table.loc[stage]
        for column, value in zip(numbers, hand[:-1]):
            assert _same(row[column], value), (stage, column, row[column], value)
        assert row["verdict"] == hand[-1], stage
        assert _same(row["idle_frac"], None if hand[7] is None else hand[7] / hand[6]), stage
    # Period 25 (start to start); busy 3 + 9 + 0.5; launch waits 1.5 + 1.5 + 1.7 (before dense_fwd_bwd's
    # first launch) + 0.4 (the memset) + 5.0 (to iteration 1's first launch); between iterations:
    # 19.6 to 26.5 less the memset's 0.5 ms.
    hand = dict(iterations=2, period_ms=25.0, gpu_busy_ms=12.5, gpu_idle_ms=12.5, idle_frac=0.5,
                launch_wait_ms=10.1, between_idle_ms=6.4)
    for key, value in hand.items():
        assert profile.summary[key] == pytest.approx(value, abs=1e-6), key
    assert profile.summary["verdict"] == "launch-bound"  # busy 50% < 80%; 10.1 of the 12.5 ms idle waited
    assert profile.finding == (
        "launch-bound: the GPU is busy 12.5 of 25.0 ms an iteration (50% idle, 10.1 ms of it waiting for a "
        "launch, 6.4 ms between iterations); emb_fwd's host range takes 10.0 ms for 3.0 ms of kernels "
        "(3 launches, 0.3 ms in launch calls; launch-bound, GPU busy 43% of its window)")


def test_verdict_thresholds():
    """Kernel-bound from the busy share alone; below it, launch-bound when most idle waited for a launch."""
    assert pt.verdict(pt.KERNEL_BOUND_BUSY, 0.0) == "kernel-bound"
    assert pt.verdict(0.79, pt.LAUNCH_WAIT_SHARE) == "launch-bound"
    assert pt.verdict(0.3, 0.49) == "mixed"
    assert pt.verdict(float("nan"), 0.0) == pt.NO_KERNELS


def test_cpu_trace_has_host_ranges_only(tmp_path):
    """A trace without device work (a CPU run) reads: host ranges, no kernels, no verdict on the GPU."""
    events = [_x("user_annotation", s, 10.0 * i, 10.0 * i + 4) for i, s in enumerate(["emb_fwd", "dense_fwd_bwd"] * 2)]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(events))  # the bare-list form Chrome also reads
    profile = pt.analyze(path)
    assert list(profile.stages["stage"]) == ["emb_fwd", "dense_fwd_bwd"]
    assert (profile.stages["kernels"] == 0).all() and (profile.stages["verdict"] == pt.NO_KERNELS).all()
    assert profile.summary["period_ms"] == pytest.approx(20.0) and profile.summary["verdict"] == pt.NO_KERNELS
    assert profile.finding.startswith("no kernels in the trace")


def test_input_dist_parts_are_charged_to_input_dist_on_their_own_thread(tmp_path):
    """A pipelined input dist is annotated only by its parts (`input_dist:<piece>`), on the thread
    that does each. By hand: the wait part [0, 2] on the loop's thread (tid 1) launches a 1 ms
    copy; the input thread's (tid 2) prepare part [12, 16], with a nested sub-span [13, 14],
    launches a kernel at 13, while the loop's thread launches a dense kernel at 14 inside both
    dense_fwd_bwd [10, 20] and that part's time. The parts open no iteration (the wait before
    emb_fwd belongs to the iteration before it), a nested part's host time counts once, and their
    kernels are not what the GPU idles between iterations for."""
    events = []
    for t0, corr in ((0.0, 1), (30.0, 101)):
        events += [_x("user_annotation", "input_dist:wait", t0, t0 + 2),
                   _x("user_annotation", "emb_fwd", t0 + 3, t0 + 10),
                   _x("user_annotation", "dense_fwd_bwd", t0 + 10, t0 + 20),
                   _x("user_annotation", "input_dist:prepare", t0 + 12, t0 + 16, tid=2),
                   _x("user_annotation", "input_dist:transform", t0 + 13, t0 + 14, tid=2)]
        for i, (at, tid, ks, ke) in enumerate([(1.0, 1, 1.5, 2.5), (5.0, 1, 5.5, 6.5), (13.0, 2, 13.2, 13.4),
                                               (14.0, 1, 14.5, 17.5)]):
            events.append(_x("cuda_runtime", "cudaLaunchKernel", t0 + at, t0 + at + 0.1, tid=tid, correlation=corr + i))
            events.append(_x("kernel", f"k{i}", t0 + ks, t0 + ke, tid=7, correlation=corr + i, stream=7, device=0))
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = pt.parse(pt.read_events(path))
    by_launch = dict(zip(trace.kernels["launch"].round(3), trace.kernels["stage"]))
    assert by_launch[1.0] == pt.OUTSIDE  # the wait part before iteration 0's emb_fwd: no profiled iteration's
    assert [by_launch[t] for t in (31.0, 35.0, 43.0, 44.0)] == ["input_dist", "emb_fwd", "input_dist", "dense_fwd_bwd"]
    profile = pt.analyze(path)
    stages = profile.stages.set_index("stage")
    assert profile.summary["iterations"] == 2 and profile.summary["period_ms"] == pytest.approx(30.0)
    # iteration 0: prepare [12, 16] (its nested range not again) and the next wait [30, 32]; iteration 1:
    # prepare [42, 46], its next wait past the window's edge: cut (2 parts of 3), left out.
    assert stages.loc["input_dist", "iterations"] == 1
    assert stages.loc["input_dist", "host_ms"] == pytest.approx(6.0)
    assert stages.loc["dense_fwd_bwd", "kernels"] == 1
    # Between iterations: dense's last kernel ends at 17.5, iteration 1's emb_fwd kernel starts at
    # 35.5; the wait part's copy [31.5, 32.5] in between is busy: 18 - 1 = 17 ms idle.
    assert profile.summary["between_idle_ms"] == pytest.approx(17.0)


def test_an_iteration_the_window_cuts_is_left_out_of_the_stage_table():
    """The fifth H100 session's profiled small run (tests/data/h100-runs-5/): input dist launches 8
    kernels an iteration (read from the trace by hand: a cat, the splits' copy to the host, a fill,
    a shift, a device copy, a sum, an index add and a device copy); the window's last iteration
    holds 2 of them, its next batch's parts falling past the window's end. The table counts the
    two whole iterations."""
    folder = DATA / "h100-runs-5" / "gpu-bench-20261127-191643-profiled" / "rank00000"
    stages = pt.analyze(folder / "trace.json.gz").stages.set_index("stage")
    assert stages.loc["input_dist", "iterations"] == 2 and stages.loc["input_dist", "kernels"] == 8
    assert stages.loc["emb_fwd", "iterations"] == 3 and stages.loc["emb_fwd", "kernels"] == 6


def test_h100_trace_is_launch_bound():
    """The real H100 trace: the GPU idles more than 40% of the period, dense_fwd_bwd is launch-bound."""
    profile = pt.analyze(H100_TRACE)
    table = profile.stages.set_index("stage")
    assert {"emb_fwd", "dense_fwd_bwd", "emb_bwd", "dense_update"} <= set(table.index)
    assert (table.loc[["emb_fwd", "dense_fwd_bwd", "emb_bwd", "dense_update"], "iterations"] == 3).all()
    dense = table.loc["dense_fwd_bwd"]
    assert dense["verdict"] == "launch-bound"
    assert dense["host_ms"] > dense["gpu_window_ms"] * 0.95 > dense["gpu_busy_ms"]  # the GPU keeps up, and waits
    assert 6.0 <= profile.summary["gpu_busy_ms"] <= 8.5
    assert profile.summary["idle_frac"] > 0.4
    assert profile.summary["verdict"] == "launch-bound"
    assert profile.finding.startswith("launch-bound: the GPU is busy ")
    assert "dense_fwd_bwd's host range takes" in profile.finding


def test_unreadable_trace_is_a_warning(tmp_path):
    """A torn trace (a run killed while exporting) is named in the section, never fatal."""
    (tmp_path / "rank00000").mkdir()
    (tmp_path / "rank00000" / "trace.json.gz").write_bytes(H100_TRACE.read_bytes()[:1000])
    run = pt.read_run(tmp_path)
    assert not run.profiles and "cannot read trace" in run.problems[0]
    doc, csvs = Doc("x"), {}
    pt.add_section(doc, csvs, run)
    assert not csvs and any(kind == "warn" and "rank 0" in part for kind, part, *_ in doc.parts)
    assert pt.read_run(None).findings() == [] and pt.read_run(tmp_path / "none").profiles == {}


def _writable_copy(src: Path, dst: Path) -> Path:
    """A copy of a run folder of tests/data (read-only in the repository), made writable."""
    shutil.copytree(src, dst)
    for folder, _, files in os.walk(dst):
        os.chmod(folder, 0o755)
        for f in files:
            os.chmod(Path(folder) / f, 0o644)
    return dst


def test_run_report_has_the_section_only_with_a_trace(tmp_path):
    """The first H100 run's folder reported as is: no section, no CSV; with the H100 trace copied
    in as rank00000/trace.json.gz: the section, its finding among the Findings, and its CSVs."""
    runs = tmp_path / "runs"
    run_dir = _writable_copy(H100_RUNS / H100_RUN, runs / H100_RUN)
    assert report_main(run=H100_RUN, runs_root=runs, reports_root=tmp_path / "plain") == 0
    plain = tmp_path / "plain" / H100_RUN
    assert SECTION not in (plain / "report.md").read_text()
    assert not list(plain.glob("host_device_*.csv"))

    shutil.copy(H100_TRACE, run_dir / "rank00000" / "trace.json.gz")
    assert report_main(run=H100_RUN, runs_root=runs, reports_root=tmp_path / "traced") == 0
    out = tmp_path / "traced" / H100_RUN
    md = (out / "report.md").read_text()
    assert SECTION in md and "Host against device" in (out / "report.html").read_text()
    findings = md.split("## Findings")[1].split("\n## ")[0]
    assert "profiled iterations, rank 0: launch-bound: the GPU is busy" in findings
    stages = pd.read_csv(out / "host_device_stages.csv")
    assert set(stages["rank"]) == {0} and "dense_fwd_bwd" in set(stages["stage"])
    assert list(stages.columns) == [*pt.STAGE_COLUMNS, "rank"]
    summary = pd.read_csv(out / "host_device_summary.csv")
    assert len(summary) == 1 and summary.loc[0, "verdict"] == "launch-bound"
