"""The projection (harness/projection/, issue 46): calibrated on recorded H100 run folders and on
short CPU runs, checked against what other configurations measured.

Known misses (docs/projection.md): calibrated on the H100 bf16 defaults, tiny's period is
projected about 31% long (input_dist and emb_fwd carry small's host time), and --cuda-graphs'
dense step short (its device time is not identified by an eager run).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.projection.calibrate import calibrate, measured
from harness.projection.kernels import dense_kernels
from harness.projection.project import project
from harness.projection.timeline import Collective, Host, Launch, simulate
from harness.report.roofline import dense_shape

H100 = Path(__file__).parent / "data" / "h100-runs-2"
CALIBRATION = H100 / "s-bf16-r0"


def _err(run: str, profile, cal) -> tuple[float, dict[str, float], dict[str, float]]:
    m = measured(H100 / run)
    p = project(m.run.manifest.config, m.work, profile, cal)
    return p.period_ms / (m.period_s * 1e3) - 1, p.stage_ms("mean"), {s: v * 1e3 for s, v in m.stage_s.items()}


@pytest.fixture(scope="module")
def h100_cal():
    profile, cal, _ = calibrate([CALIBRATION])
    return profile, cal


def test_launch_cost_comes_from_the_calibration_run(h100_cal):
    profile, _ = h100_cal
    f = profile.figures["launch_us"]
    assert f.source == "calibrated: s-bf16-r0 dense_fwd_bwd"
    assert 20 < f.value < 50  # 7.29 ms over 213 kernels


@pytest.mark.parametrize("run", ["s-bf16-skip-splits-a2a-r0", "s-bf16-pinned-d2h-r0", "s-bf16-threaded-input-dist-r0",
                                 "s-bf16-skip-splits-a2a-r1", "s-bf16-pinned-d2h-r1"])
def test_h100_other_flag_sets_within_25_percent(h100_cal, run):
    err, _, _ = _err(run, *h100_cal)
    assert abs(err) < 0.25, f"{run}: projected period off by {err:+.0%}"


def test_h100_tiny_dense_step_within_25_percent_period_a_known_miss(h100_cal):
    """tiny (fp32, 96 samples) from small bf16's calibration: its dense step (launch-bound, 96
    kernels at the calibrated launch cost) lands within 25%; its period does not (about +31%):
    input_dist and emb_fwd carry small's host time, which tiny does not pay."""
    err, got, meas = _err("t-r0", *h100_cal)
    assert abs(got["dense_fwd_bwd"] / meas["dense_fwd_bwd"] - 1) < 0.25
    assert 0.25 < err < 0.40, f"tiny's period off by {err:+.0%}: update docs/projection.md if it moved"


def test_h100_cuda_graphs_needs_a_graphed_calibration_run():
    """From the eager run alone, the graphed dense step's device time is a spec-sheet guess (about
    30% short); with the graphed run in the calibration it is measured and the period lands within 25%."""
    one = calibrate([CALIBRATION])[:2]
    both = calibrate([CALIBRATION, H100 / "s-bf16-cuda-graphs-r0"])[:2]
    assert _err("s-bf16-cuda-graphs-r0", *one)[0] < -0.2
    assert abs(_err("s-bf16-cuda-graphs-r1", *both)[0]) < 0.25
    assert both[0].figures["dense_eff_bf16"].source == "calibrated: s-bf16-cuda-graphs-r0 dense_fwd_bwd"


def test_projection_moves_with_its_calibration(h100_cal):
    """A projection that ignored its figures could not fail: doubling the launch cost moves it."""
    profile, cal = h100_cal
    slow = profile.copy()
    slow.set("launch_us", 2 * profile.value("launch_us"), "us", "test")
    assert abs(_err("s-bf16-pinned-d2h-r0", slow, cal)[0]) > 0.25


def test_dense_kernel_count_matches_the_trace():
    """small in bf16: 213 counted from the code path, 217 in the H100 trace."""
    m = measured(CALIBRATION).run.manifest.config.model
    k, buckets = dense_kernels(m, bf16=True, params=dense_shape(m)[0], world_size=1)
    assert buckets == 0 and abs(k - 217) / 217 < 0.05


def test_collective_waits_for_the_slowest_rank_and_pipelining_hides_it():
    ops = [Launch("input_dist", 0.001, 0.0), Collective("ids", "input_dist", np.array([0.004, 0.004])),
           Launch("emb_fwd", 0.001, np.array([0.001, 0.003]), waits=("ids@prev",)),
           Collective("forward", "emb_fwd", 0.001),
           Launch("dense_fwd_bwd", 0.002, 0.005, waits=("forward",)), Host("between_iterations", 0.001)]
    piped = simulate(ops, ranks=2, async_device=True)
    plain = simulate([*ops[:2], Launch("emb_fwd", 0.001, np.array([0.001, 0.003]), waits=("ids",)), *ops[3:]],
                     ranks=2, async_device=True)
    # rank 0's lookup ends 2 ms early; its dense step waits for the exchange rank 1 starts late
    assert piped.stage_s["dense_fwd_bwd"][0] == pytest.approx(piped.stage_s["dense_fwd_bwd"][1] + 0.002)
    assert plain.period_s > piped.period_s + 0.0029  # the ids exchange (4 ms) less what the step hides


def test_tool_writes_a_projected_report(tmp_path):
    from harness.tools.project import main
    assert main(["--preset", "tiny", "--hardware", "h100", "--calibrate", str(CALIBRATION), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "projection.md").read_text()
    assert "PROJECTED" in text and "calibrated: s-bf16-r0" in text and "assumption" in text
    assert main(["--calibrate", "no-such-run"]) == 2


def test_cpu_calibration_on_short_runs(tmp_path):
    """tiny on 1 and 2 local CPU ranks (12 iterations), calibrated on the 1-rank run. The 1-rank
    projection reproduces its own run; the 2-rank one misses the 25% target (about +107% when
    measured) and is checked loosely (docs/projection.md)."""
    from harness.cli import main
    for rid, ranks in (("t1", 1), ("t2", 2)):
        assert main(["bench", "--preset", "tiny", "--gpus-per-node", str(ranks), "--iters", "12", "--warmup", "3",
                     "--runs-root", str(tmp_path), "--run-id", rid]) == 0
    profile, cal, _ = calibrate([tmp_path / "t1"])
    assert profile.name == "cpu" and profile.figures["hbm_gbps"].source.startswith("probe")
    errs = {}
    for rid in ("t1", "t2"):
        m = measured(tmp_path / rid)
        p = project(m.run.manifest.config, m.work, profile, cal)
        errs[rid] = p.period_ms / (m.period_s * 1e3) - 1
    assert abs(errs["t1"]) < 0.25, errs
    if abs(errs["t2"]) >= 0.25:
        # Known miss (docs/projection.md): the 2-rank period was projected +107% and +689% in two
        # runs on this loaded 2-core VM (its GEMM probe read 0.08 to 68 GFLOP/s): not within 25%.
        pytest.xfail(f"CPU 2-rank projection off by {errs['t2']:+.0%} (issue 46 target: 25%)")
