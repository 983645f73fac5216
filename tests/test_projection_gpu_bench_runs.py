"""The projection check of issue 46 on the third H100 session's `make gpu-bench` runs
(tests/data/h100-runs-3/: today's code, bf16, small at 8192 and tiny, one GPU), as gpu-bench
runs it: calibrated on the defaults at both batch sizes and the profiled run, every other run's
period projected against what it measured (docs/gpu-session-3-notes.md has the figures)."""

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
