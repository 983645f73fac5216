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
                                        "autograd_cross", "views_grads", "autocast_casts", "bf16_pure",
                                        "bf16_pure_all"))])
def test_every_small_run_of_the_bench_within_25_percent(cal, run):
    """The same config's other runs, each flag alone, --opts all, the dense step's own variants and
    the all-bf16 step: measured -17% to +2% (the defaults' runs measured 8.9 to 10.3 ms apart)."""
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


def test_drawn_on_the_gpu_tiny_within_25_percent_by_its_period_not_its_stages(cal_4):
    """tiny's three runs pooled: +24% (single runs +40%, +7%, +29%), its stages off both ways:
    emb_bwd 0.93 ms projected against 0.22-0.34 (its 25 kernels at the dense step's 37 us a launch;
    small's emb_bwd is the GPU's, hiding that price), dense_update 0.75 against 0.27-0.47, the dense
    step 3.08 against 3.29-3.80 (docs/projection.md)."""
    err = _err_4(TINY_4, *cal_4)
    assert abs(err) < 0.25, f"tiny's period off by {err:+.0%}"


def test_drawn_on_the_gpu_the_all_bf16_graphed_step_a_known_miss(cal_4):
    """bf16-pure with every flag +30%: its graphed dense step took 2.98 ms where the autocast one's
    efficiency gives 4.25; no calibration run measures the all-bf16 step's own (another precision)."""
    err = _err_4([f"{BENCH_4}-bf16_pure_all-r0"], *cal_4)
    assert 0.2 < err < 0.4, f"bf16_pure_all off by {err:+.0%}: update docs/projection.md if it moved"
