"""The projection check of issue 46 on the third and fourth H100 sessions' `make gpu-bench` runs
(tests/data/h100-runs-3/: batches drawn by host threads; h100-runs-4/: drawn on the GPU, today's
default; bf16, small at 8192 and tiny, one GPU), as gpu-bench runs it: calibrated on the defaults
at both batch sizes and the profiled or graphed run, every other run's period projected against
what it measured (docs/gpu-session-3-notes.md and gpu-session-4-notes.md have the figures)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.projection.calibrate import calibrate, measured, project_run

RUNS = Path(__file__).parent / "data" / "h100-runs-3"
BENCH = "gpu-bench-20261127-150902"
DEFAULTS = "20261127-150905-compare-small-1x1-f118"


@pytest.fixture(scope="module")
def cal():
    profile, cal, _ = calibrate([RUNS / f"{DEFAULTS}-r0-harness", RUNS / f"{BENCH}-quarter", RUNS / f"{BENCH}-profiled"])
    return profile, cal


def _err(run: str, profile, cal) -> float:
    m = measured(RUNS / run)
    return project_run(m, profile, cal).period_ms / (m.period_s * 1e3) - 1


@pytest.mark.parametrize("run", [
    f"{DEFAULTS}-r1-harness", "20261127-150928-compare-small-1x1-3d54-r0-harness",
    *(f"{BENCH}-{name}-r0" for name in ("defaults", "cuda_graphs", "pinned_d2h", "skip_splits_a2a", "opts_all",
                                        "autograd_cross", "views_grads", "autocast_casts", "bf16_pure"))])
def test_every_small_run_of_the_bench_within_25_percent(cal, run):
    """The same config's other runs, each flag alone, --opts all, the dense step's own variants and
    the all-bf16 eager step: measured -17% to +2% (the defaults' runs measured 8.9 to 10.3 ms apart)."""
    err = _err(run, *cal)
    assert abs(err) < 0.25, f"{run}: projected period off by {err:+.0%}"


def test_tiny_from_smalls_calibration_a_known_miss(cal):
    """tiny projected +55%: small's emb_bwd and dense_update took as long at 2048 samples as at
    8192 (0.79-0.80 and 0.65-0.76 ms, host-bound), and the calibration's host time beyond their
    launches, fitted through both batches and held at 2048 for tiny's 96, gives tiny 0.55 and
    0.64 ms of it where tiny's data-parallel path measured 0.25 and 0.31 ms in all
    (docs/projection.md: a per-stage launch cost tried for it)."""
    err = _err("20261127-151120-compare-tiny-1x1-e659-r0-harness", *cal)
    assert 0.4 < err < 0.7, f"tiny's period off by {err:+.0%}: update docs/projection.md if it moved"


def test_host_drawn_all_bf16_graphed_a_known_miss_its_dense_step_within_10_percent(cal):
    """bf16-pure with every flag, its batches drawn by the host's threads: -27%, as the 1.4 ms
    between its iterations (1.33 of them waiting for the next batch: the threads did not keep up
    with a 4.3 ms step, which nothing in the eager calibration runs shows) are projected as none;
    its graphed dense step lands (3.05 ms measured; the trace's GEMMs and other kernels apart)."""
    m = measured(RUNS / f"{BENCH}-bf16_pure_all-r0")
    got = project_run(m, *cal)
    assert -0.35 < got.period_ms / (m.period_s * 1e3) - 1 < -0.2
    assert abs(got.stage_ms("mean")["dense_fwd_bwd"] / (m.stage_s["dense_fwd_bwd"] * 1e3) - 1) < 0.1


# The fourth H100 session's runs (tests/data/h100-runs-4/): the batches drawn on the GPU, today's
# default; the call ended before its profiled run, so the dense step's device time comes from the
# graphed run. Calibrated as gpu-bench and make project's default take them.
RUNS_4 = Path(__file__).parent / "data" / "h100-runs-4"
BENCH_4 = "gpu-bench-20261127-173609"
DEFAULTS_4 = [f"20261127-173624-compare-small-1x1-a52f-r{k}-harness" for k in range(3)]
TINY_4 = [f"20261127-173819-compare-tiny-1x1-e27d-r{k}-harness" for k in range(3)]


@pytest.fixture(scope="module")
def cal_4():
    profile, cal, _ = calibrate([RUNS_4 / r for r in (*DEFAULTS_4, f"{BENCH_4}-quarter", f"{BENCH_4}-cuda_graphs-r0")])
    return profile, cal


def _err_4(runs: list[str], profile, cal) -> float:
    from harness.projection.calibrate import pooled

    m = pooled([measured(RUNS_4 / r) for r in runs])
    return project_run(m, profile, cal).period_ms / (m.period_s * 1e3) - 1


@pytest.mark.parametrize("run", [
    *(f"{BENCH_4}-{name}-r0" for name in ("defaults", "pinned_d2h", "skip_splits_a2a", "opts_all", "autograd_cross",
                                          "views_grads", "graphs_autograd_cross", "host_draw", "opts_all_host_draw",
                                          "bf16_pure")),
    f"{BENCH_4}-autocast_casts-r0-spawned", "20261127-173651-compare-small-1x1-7f29-r0-harness"])
def test_drawn_on_the_gpu_every_small_run_within_25_percent(cal_4, run):
    """Each flag, --opts all, the dense step's variants and the host's batch threads (--draw-on
    host: the calibration's fixed part, its threads taken to keep up): measured -11% to +18%."""
    err = _err_4([run], *cal_4)
    assert abs(err) < 0.25, f"{run}: projected period off by {err:+.0%}"


def test_drawn_on_the_gpu_tiny_a_known_miss(cal_4):
    """tiny's three runs pooled: +26% (+24% counting a data-parallel group's kernels as a table-wise
    one's): its stages carry small's Python host time beyond their launches, the table-wise path's
    (input_dist 0.57 ms projected against 0.32, emb_fwd 0.62 against 0.30, dense_update 0.75
    against 0.35); no trace in this set splits the dense step (tests below: with one, +4%)."""
    err = _err_4(TINY_4, *cal_4)
    assert 0.2 < err < 0.35, f"tiny's period off by {err:+.0%}: update docs/projection.md if it moved"


def test_drawn_on_the_gpu_the_all_bf16_graphed_step_within_25_percent(cal_4):
    """bf16-pure with every flag +7% (+30% before its activations were counted at 2 bytes an
    element: work.py), though no run of this set measures the all-bf16 step's efficiency."""
    err = _err_4([f"{BENCH_4}-bf16_pure_all-r0"], *cal_4)
    assert abs(err) < 0.25, f"bf16_pure_all off by {err:+.0%}"


# The fifth H100 session's runs (tests/data/h100-runs-5/, docs/gpu-session-5-notes.md): three rounds
# of every row, and profiled runs of the defaults, the quarter batch, tiny and the all-bf16 step.
# Calibrated as make project's default takes them (harness/tools/project.py H100_RUNS); each
# row's three runs pooled against its projection.
RUNS_5 = Path(__file__).parent / "data" / "h100-runs-5"
BENCH_5 = "gpu-bench-20261127-191643"


@pytest.fixture(scope="module")
def cal_5():
    from harness.tools.project import H100_RUNS

    profile, cal, _ = calibrate([Path(r) for r in H100_RUNS])
    return profile, cal


def _err_5(runs: list[str], profile, cal) -> float:
    from harness.projection.calibrate import pooled

    m = pooled([measured(RUNS_5 / r) for r in runs])
    return project_run(m, profile, cal).period_ms / (m.period_s * 1e3) - 1


def _rounds(row: str) -> list[str]:
    return [f"{BENCH_5}-{row}-r{k}" for k in range(3)]


@pytest.mark.parametrize("row", ["defaults", "cuda_graphs", "pinned_d2h", "skip_splits_a2a", "opts_all",
                                 "views_grads", "graphs_autograd_cross", "autocast_casts", "bf16_pure",
                                 "bf16_pure_all"])
def test_fifth_session_every_row_within_25_percent(cal_5, row):
    """Each flag, --opts all, the dense step's variants and the all-bf16 step, eager and graphed
    (pooled: -12% to +18%; the all-bf16 graphed step -2%, its GEMMs at the autocast trace's
    efficiency and its other kernels' bytes halved)."""
    err = _err_5(_rounds(row), *cal_5)
    assert abs(err) < 0.25, f"{row}: projected period off by {err:+.0%}"


def test_fifth_session_tiny_within_25_percent(cal_5):
    """tiny's three runs pooled: +4% (its data-parallel group's kernels counted from its own code
    path, kernels.py; its dense step within 10%)."""
    runs = [f"20261127-192136-compare-tiny-1x1-7533-r{k}-harness" for k in range(3)]
    assert abs(_err_5(runs, *cal_5)) < 0.25
    m = measured(RUNS_5 / runs[0])
    got = project_run(m, *cal_5).stage_ms("mean")["dense_fwd_bwd"]
    assert abs(got / (m.stage_s["dense_fwd_bwd"] * 1e3) - 1) < 0.15


@pytest.mark.parametrize("row, lo, hi", [("autograd_cross", 0.2, 0.35), ("host_draw", -0.35, -0.15),
                                         ("opts_all_host_draw", -0.5, -0.3)])
def test_fifth_session_known_misses(cal_5, row, lo, hi):
    """autograd's cross layers +27%: measured faster than the fused ones in eager (0.83x, CI
    0.71-0.92) though they launch 9 kernels more: the fused layers' Python autograd.Function costs
    host time no kernel count sees, and no calibration run ran without them. The host's batch
    threads -25% and, with every flag, -39%: the threads did not keep up (9.2 and 3.4 ms more a
    period than the GPU draw), which runs drawing on the GPU cannot show (docs/projection.md)."""
    err = _err_5(_rounds(row), *cal_5)
    assert lo < err < hi, f"{row} off by {err:+.0%}: update docs/projection.md if it moved"


@pytest.mark.parametrize("run", [f"{BENCH_5}-profiled", f"{BENCH_5}-profiled-tiny", f"{BENCH_5}-profiled-quarter",
                                 f"{BENCH_5}-profiled-bf16_pure", "call-2/mixed-profiled",
                                 "call-2/autograd_cross-profiled"])
def test_kernel_counts_match_the_fifth_sessions_traces(run):
    """The embedding stages' kernels counted from the code path (kernels.py) against what the
    profiled runs' traces launched an iteration (profile_trace's stage table): small's table-wise
    group, tiny's data-parallel one and the two together (small with mlperf's 12 data-parallel
    tables), exactly; the dense step within 10% (cuBLAS's memsets are not counted; autograd's cross
    layers 9 more, as traced)."""
    from harness.projection.calibrate import _kernels
    from harness.projection.hardware import HARDWARE
    from harness.report.profile_trace import read_run

    folder = RUNS_5 / run
    traced = read_run(folder).profiles[0].stages.set_index("stage")["kernels"]
    k, _ = _kernels(measured(folder), HARDWARE["h100"]())
    for stage in ("input_dist", "emb_fwd", "emb_bwd", "dense_update"):
        assert k.of(stage) == traced[stage], (run, stage, k.of(stage), traced[stage])
    assert abs(k.dense_fwd_bwd / traced["dense_fwd_bwd"] - 1) < 0.1, (run, k.dense_fwd_bwd, traced["dense_fwd_bwd"])


def test_two_sharding_groups_on_one_gpu_within_25_percent(cal_5):
    """small with the 16 x 8 mlperf plan's 12 data-parallel tables (two groups on one rank, the
    fifth session's second call, another machine than the calibration's): +21% (its three runs
    pooled); its input_dist, with the groups' permutes, +17% (1.29 ms projected; 1.10 measured,
    0.60 with one group)."""
    from harness.projection.calibrate import pooled

    runs = [f"call-2/mixed-r{k}" for k in range(3)]
    assert abs(_err_5(runs, *cal_5)) < 0.25
    m = pooled([measured(RUNS_5 / r) for r in runs])
    got = project_run(m, *cal_5).stage_ms("mean")["input_dist"]
    assert abs(got / (m.stage_s["input_dist"] * 1e3) - 1) < 0.25
