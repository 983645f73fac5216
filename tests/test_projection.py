"""The projection (harness/projection/, issue 46): calibrated on recorded H100 run folders and on
short CPU runs, checked against what other configurations measured.

Known misses (docs/projection.md): calibrated on the H100 bf16 defaults, tiny's period is
projected about 26% long (input_dist and emb_fwd carry small's host time), and --cuda-graphs'
dense step short (an eager run's stage time does not give its device time; its --profile trace does).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.projection.calibrate import calibrate, measured, project_run
from harness.projection.kernels import dense_impl, dense_kernels
from harness.projection.project import project
from harness.projection.timeline import Collective, Host, Launch, Sync, simulate
from harness.report.api import load_run
from harness.report.roofline import dense_shape

H100 = Path(__file__).parent / "data" / "h100-runs-2"
CALIBRATION = H100 / "s-bf16-r0"


def _err(run: str, profile, cal) -> tuple[float, dict[str, float], dict[str, float]]:
    m = measured(H100 / run)
    p = project_run(m, profile, cal)
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


def test_a_flush_is_calibrated_from_the_records_and_projected_at_the_runs_cadence(h100_cal):
    """The calibration run flushed every 10 iterations (a device sync then): one flush's cost is its
    records' flush_records parts over the flushes they hold, read here straight from the parquet;
    projected every 100 iterations instead, the period is 90% of a tenth of it shorter."""
    import dataclasses

    import pandas as pd

    profile, cal = h100_cal
    sub = pd.concat(pd.read_parquet(p) for p in (CALIBRATION / "rank00000").glob("subspans-*.parquet"))
    flushes = sub[(sub["name"] == "flush_records") & ~sub["warmup"]]["duration_ms"]
    assert len(flushes) >= 5 and cal.flush_s * 1e3 == pytest.approx(flushes.mean(), rel=0.25)
    m = measured(CALIBRATION)
    assert m.flush_every == 10
    run = m.run.manifest.config.run
    rare = m.run.manifest.config.replace(run=dataclasses.replace(run, flush_every=100))
    every10 = project_run(m, profile, cal).period_ms
    every100 = project(rare, m.work, profile, cal, dense=dense_impl(m.run.manifest.optimizations),
                       drawn=(False, 1)).period_ms
    assert every10 - every100 == pytest.approx(cal.flush_s * 1e3 * (1 / 10 - 1 / 100), rel=1e-6)


@pytest.mark.parametrize("run", ["s-bf16-skip-splits-a2a-r0", "s-bf16-pinned-d2h-r0", "s-bf16-threaded-input-dist-r0",
                                 "s-bf16-skip-splits-a2a-r1", "s-bf16-pinned-d2h-r1"])
def test_h100_other_flag_sets_within_25_percent(h100_cal, run):
    err, _, _ = _err(run, *h100_cal)
    assert abs(err) < 0.25, f"{run}: projected period off by {err:+.0%}"


def test_h100_tiny_dense_step_within_25_percent_period_a_known_miss(h100_cal):
    """tiny (fp32, 96 samples) from small bf16's calibration: its dense step (launch-bound, 96
    kernels at the calibrated launch cost) lands within 25%; its period does not (about +26%):
    input_dist and emb_fwd carry small's host time, which tiny does not pay (a second run of small
    at another batch would split it, as make gpu-bench's projection check does)."""
    err, got, meas = _err("t-r0", *h100_cal)
    assert abs(got["dense_fwd_bwd"] / meas["dense_fwd_bwd"] - 1) < 0.25
    assert 0.2 < err < 0.35, f"tiny's period off by {err:+.0%}: update docs/projection.md if it moved"


FIRST = Path(__file__).parent / "data" / "h100-runs"
"""The first H100 run (fp32, small at 8192; its code drew each batch on the host between iterations)."""


def test_first_h100_run_calibrated_on_one_run_projects_the_others():
    """Calibrated on one run of the first H100 session (the defaults, r0 of a compare): its host
    waited for the device before drawing the next batch (the timeline reproduces its period with
    that wait, 38% off without), and the gap was the batch drawn (a part a sample). Projected within
    25%: the same config's other run, --pinned-d2h, --skip-splits-a2a, --cuda-graphs and tiny
    (measured -2%, -6%, -2%, +19%, -20%). --threaded-input-dist drew the batch on its thread in that
    code; it is inactive on one GPU now (batches are drawn ahead), so the projection, which models
    today's code path, credits it nothing: +48% off, a known miss."""
    profile, cal, _ = calibrate([FIRST / "20261126-102122-compare-small-1x1-415d-r0-harness"])
    assert cal.between_drains and cal.between_s == 0.0 and cal.between_per_sample_s > 0
    errs = {}
    for run in ("20261126-102122-compare-small-1x1-415d-r1-harness", "g-pinned-d2h", "g-skip-splits-a2a",
                "g-cuda-graphs", "g-tiny", "g-threaded-input-dist"):
        m = measured(FIRST / run)
        errs[run] = project_run(m, profile, cal).period_ms / (m.period_s * 1e3) - 1
    threaded = errs.pop("g-threaded-input-dist")
    assert all(abs(e) < 0.25 for e in errs.values()), errs
    assert threaded > 0.3
    assert not calibrate([CALIBRATION])[1].between_drains  # launch-bound: nothing tells the wait; none


def test_h100_cuda_graphs_needs_a_graphed_calibration_run():
    """From the eager run alone, the graphed dense step's device time is a spec-sheet guess (about
    30% short); with the graphed run in the calibration it is measured and the period lands within 25%."""
    one = calibrate([CALIBRATION])[:2]
    both = calibrate([CALIBRATION, H100 / "s-bf16-cuda-graphs-r0"])[:2]
    assert _err("s-bf16-cuda-graphs-r0", *one)[0] < -0.2
    assert abs(_err("s-bf16-cuda-graphs-r1", *both)[0]) < 0.25
    assert both[0].figures["dense_eff_bf16"].source == "calibrated: s-bf16-cuda-graphs-r0 dense_fwd_bwd"


def test_an_eager_runs_trace_gives_the_graphed_dense_steps_device_time():
    """Calibrated on the profiled eager run alone (one run), its trace's GPU busy time in the dense
    step (5.23 ms; the stage itself is launch-bound at 7.3) sets the dense efficiency: the graphed
    runs' dense step, measured independently at 5.38 ms, is projected within 5%, and their periods
    within 25% (about -17% and -15%; -26% and -25% from the spec guess), the other flag sets too.
    The profile window's iterations, which sat in that run's timed ones, are left out of its means."""
    profile, cal, runs = calibrate([H100 / "s-bf16-prof"])  # rank00000/trace.json.gz: its --profile trace
    assert "--profile trace" in profile.figures["dense_eff_bf16"].source
    assert runs[0].traced_dense_s * 1e3 == pytest.approx(5.23, abs=0.01)
    with_window = load_run(H100 / "s-bf16-prof").stages
    assert len(with_window[~with_window["warmup"]]) - len(runs[0].run.stages[~runs[0].run.stages["warmup"]]) == 3 * 5
    for run in ("s-bf16-cuda-graphs-r0", "s-bf16-cuda-graphs-r1"):
        err, got, meas = _err(run, profile, cal)
        assert got["dense_fwd_bwd"] == pytest.approx(meas["dense_fwd_bwd"], rel=0.05)
        assert abs(err) < 0.25, f"{run}: {err:+.0%}"
    for run in ("s-bf16-r1", "s-bf16-skip-splits-a2a-r0", "s-bf16-pinned-d2h-r0", "s-bf16-threaded-input-dist-r0"):
        assert abs(_err(run, profile, cal)[0]) < 0.25, run


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
    # The trace's run predates the fused cross layers, and its manifest says so (read as autograd).
    assert measured(CALIBRATION).run.manifest.optimizations.cross_net.impl == "autograd"
    # Hand counts (kernels.py's docstring): 14 Linears x 13 + 3 cross layers x 7 + 10 = 213 with
    # autograd's cross layers; fused, each layer one addcmul for a multiply and an add and two casts
    # fewer backward: 213 - 3 x 3 = 204.
    fused, _ = dense_kernels(m, bf16=True, params=dense_shape(m)[0], world_size=1, fused_cross=True)
    assert (k, fused) == (213, 204)
    # The bf16 weight copy: 4 casts fewer a Linear, 204 - 14 x 4 = 148; bf16-pure: fp32's kernels
    # (14 x 8 + 3 x (7 - 2) + 10 = 137) and the 3 casts of its inputs and pooled gradient, 140.
    copy, _ = dense_kernels(m, bf16=True, params=dense_shape(m)[0], world_size=1, fused_cross=True, weight_copy=True)
    pure, _ = dense_kernels(m, bf16=False, params=dense_shape(m)[0], world_size=1, fused_cross=True, pure=True)
    assert (copy, pure) == (148, 140)
    # Gathered gradients: no add a parameter tensor (2 x 14 - 3 = 25: V has no bias), 148 - 25 = 123;
    # on 2 ranks a cat more a bucket (61 MiB in 4 MiB buckets: 16).
    gathered, _ = dense_kernels(m, bf16=True, params=dense_shape(m)[0], world_size=1, fused_cross=True,
                                weight_copy=True, gather=True)
    views2, b2 = dense_kernels(m, bf16=True, params=dense_shape(m)[0], world_size=2, fused_cross=True, weight_copy=True)
    gathered2, _ = dense_kernels(m, bf16=True, params=dense_shape(m)[0], world_size=2, fused_cross=True,
                                 weight_copy=True, gather=True)
    assert (gathered, b2, views2 - gathered2) == (123, 16, 25 - 16)


def test_a_data_parallel_group_launches_no_input_dist(tmp_path):
    """A run's own trace (2 CPU ranks, tiny's data-parallel plan): no op under input dist's ranges;
    so the projection counts none for that group, where an exchanging group beyond one rank counts
    its 9 (8 on one rank and 1 moving its ids; 2 of them its splits', which skip_splits_a2a removes
    from the table-wise group alone), and in emb_fwd its lookup's 4 against an exchanging group's
    11; several groups each a permute (7) and a column copy (kernels.py's docstring: hand counts;
    the one-rank counts are checked against the H100 traces in
    tests/test_projection_gpu_bench_runs.py)."""
    from harness.cli import main
    from harness.presets import tiny
    from harness.projection.kernels import stage_kernels

    runs = tmp_path / "runs"
    assert main(["bench", "--preset", "tiny", "--iters", "3", "--warmup", "3", "--profile", "1:2",
                 "--runs-root", str(runs)]) == 0
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    assert {tp["kind"] for tp in json.loads((run_dir / "manifest.json").read_text())["plan"]} == {"data_parallel"}
    for rank in ("rank00000", "rank00001"):
        ranges = [e for e in json.loads((run_dir / rank / "trace.json").read_text())["traceEvents"]
                  if e.get("ph") == "X"]
        parts = [e for e in ranges if e["name"].startswith("input_dist:")]
        assert parts, "no input dist range in the window"
        assert not [e for e in ranges for p in parts if e.get("cat") == "cpu_op" and e.get("tid") == p.get("tid")
                    and p["ts"] <= e["ts"] <= p["ts"] + p["dur"]]
    cfg = tiny()

    def kernels(groups, skip=False):
        k = stage_kernels(cfg, groups=groups, params=1000, world_size=2, flags={"skip_splits_a2a": skip})
        return k.input_dist, k.emb_fwd, k.emb_bwd

    assert kernels(("data_parallel",)) == (0, 4, 5)
    assert kernels(("pooled",)) == (8 + 1, 6 + 5, 25)
    assert kernels(("pooled", "data_parallel"), skip=True) == (8 + 1 - 2 + 2 * 7, 6 + 5 + 4 + 2, 25 + 5)
    assert kernels(("row_wise",), skip=True) == (8 + 1, 6 + 5, 25)


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


def test_a_cpu_rank_waits_for_a_collective_before_it_runs_the_stage():
    """On a synchronous device (gloo) the host blocks in the wait and only then runs the stage's
    ops: emb_bwd = the 3 ms exchange + 1 ms of host ops + 1 ms of work, not the 3 ms with the ops
    hidden under it (as a GPU host launching ahead of its stream would)."""
    ops = [Launch("dense_fwd_bwd", 0.002, 0.0), Collective("backward", "dense_fwd_bwd", 0.003, blocks_host=False),
           Launch("emb_bwd", 0.001, 0.001, waits=("backward",)), Host("between_iterations", 0.001)]
    cpu = simulate(ops, ranks=2, async_device=False)
    assert cpu.stage_s["emb_bwd"] == pytest.approx([0.005, 0.005])
    gpu = simulate(ops, ranks=2, async_device=True)
    assert gpu.stage_s["emb_bwd"] == pytest.approx([0.004, 0.004])  # launched under the exchange, then its work


def test_the_backward_exchanges_where_the_code_launches_them():
    """tiny on 2 CPU ranks of one core (dense_gradients.py, step.py): its one gradient bucket holds
    the bottom MLP, so it is all-reduced after the pooled gradient's exchange, which starts before
    the bottom MLP's backward; gloo's thread moves each collective's bytes on the rank's core."""
    from harness.names import OPTIMIZATION_FLAGS
    from harness.presets import tiny
    from harness.projection.hardware import cpu
    from harness.projection.project import Calibration, iteration_ops
    from harness.projection.work import dense_schedule

    late, flops, layers = dense_schedule(tiny().model)
    assert late == 1.0 and layers == pytest.approx(2 / 9)  # 2 bottom of 2 + 2 x 2 cross + 3 top Linears
    # MACs a sample: bottom 13x32 + 32x16 = 928; cross 2 layers x 2 x 432 x 8 = 13824; top
    # 432x32 + 32x16 + 16x1 = 14352.
    assert flops == pytest.approx(928 / (928 + 13824 + 14352))
    m = measured(CPU_RECORDED / "tiny-2-r0")
    p = cpu(cores=2, rank_cores=2)
    ops, _ = iteration_ops(m.run.manifest.config, m.work, p, Calibration(), {f: False for f in OPTIMIZATION_FLAGS})
    dense = [op for op in ops if op.stage == "dense_fwd_bwd"]
    kinds = [(type(op).__name__, getattr(op, "name", "")) for op in dense]
    assert kinds == [("Launch", ""), ("Host", ""), ("Collective", "allreduce_early"), ("Launch", ""), ("Host", ""),
                     ("Collective", "backward"), ("Launch", ""), ("Host", ""), ("Collective", "allreduce")]
    assert dense[1].host_s == 0.0 and dense[2].seconds == 0.0  # no early bucket
    assert dense[3].dev_s / dense[6].dev_s == pytest.approx((1 - flops) / flops)
    assert dense[7].host_s == pytest.approx(4 * m.work.params / (p.value("all_reduce_gbps") * 1e9))


def test_the_splits_are_read_after_the_forward_where_the_pipelined_loop_reads_them():
    """harness/run/input_pipeline.py, pipelined on the main thread: the next batch's splits exchange
    is launched at the iteration's start and read after the embedding forward, where its ids
    exchange is launched; not pipelined, both at the start, the splits waited there. So a rank
    that starts its iteration 3 ms before another (its emb_bwd 1 ms, the other's 4) waits in
    emb_fwd's exchange, the first it blocks in (hand-worked: 1 ms of lookup, 1 ms of work, 3 ms
    waiting, 1 ms of exchange), not in input_dist (1 ms, its launches)."""
    from dataclasses import replace

    from harness.names import OPTIMIZATION_FLAGS
    from harness.projection.hardware import cpu
    from harness.projection.project import Calibration, iteration_ops

    m = measured(CPU_RECORDED / "small-2-r0")
    cfg, flags = m.run.manifest.config, {f: False for f in OPTIMIZATION_FLAGS}
    assert cfg.optimizations.pipeline and "pooled" in m.work.groups  # a group that exchanges its splits

    def order(cfg, flags):
        ops, _ = iteration_ops(cfg, m.work, cpu(cores=2, rank_cores=1), Calibration(), flags)
        head = ops[:[getattr(op, "name", "") for op in ops].index("forward") + 3]
        return [(type(op).__name__, op.stage, getattr(op, "name", getattr(op, "on", ""))) for op in head], head

    piped, ops = order(cfg, flags)
    assert piped == [("Launch", "input_dist", ""), ("Collective", "input_dist", "splits"),
                     ("Launch", "emb_fwd", ""), ("Collective", "emb_fwd", "forward"),
                     ("Sync", "input_dist", "splits"), ("Collective", "input_dist", "ids")]
    assert not ops[1].blocks_host and not ops[5].blocks_host
    plain, ops = order(replace(cfg, optimizations=replace(cfg.optimizations, pipeline=False)), flags)
    assert plain[:4] == [("Launch", "input_dist", ""), ("Collective", "input_dist", "splits"),
                         ("Sync", "input_dist", "splits"), ("Collective", "input_dist", "ids")]
    assert ops[1].blocks_host and ops[3].blocks_host
    threaded, _ = order(cfg, {**flags, "threaded_input_dist": True})
    assert [k for k, _, _ in threaded[:4]] == ["Launch", "Collective", "Host", "Collective"]

    hand = [Launch("input_dist", 0.001, 0.0), Collective("splits", "input_dist", 0.0005, blocks_host=False),
            Launch("emb_fwd", 0.001, 0.001, waits=("ids@prev",)), Collective("forward", "emb_fwd", 0.001),
            Sync("input_dist", 0.0, drain=False, on="splits"), Collective("ids", "input_dist", 0.001, blocks_host=False),
            Launch("emb_bwd", np.array([0.001, 0.004]), 0.0), Host("between_iterations", 0.001)]
    res = simulate(hand, ranks=2, async_device=False)
    assert res.stage_s["emb_fwd"] == pytest.approx([0.006, 0.003])
    assert res.stage_s["input_dist"] == pytest.approx([0.001, 0.001])


def test_two_gloo_collectives_in_flight_share_the_host():
    """gloo runs a process group's collectives on two worker threads, so two in flight run at once,
    each at 1/r of its speed alone (r = 2 on ranks that fill the cores). Hand-worked at r = 1.5: c1 (4 ms) at 0, c2 (4 ms) at 1 ms; from 1 ms
    both run at 1/1.5 of their speed, so c1's last 3 ms take 4.5 (it ends at 5.5 ms) and c2 then has
    1 ms left (6.5 ms). One after the other (no ratio, a GPU's stream order): 4 and 8 ms. A third
    (1 ms) launched while two are in flight waits for the first of them to end."""
    from dataclasses import replace

    from harness.projection.project import pair_ratio

    ops = [Collective("c1", "s1", 0.004, blocks_host=False), Host("s1", 0.001),
           Collective("c2", "s1", 0.004, blocks_host=False), Launch("s2", 0.0, 0.0, waits=("c1",)),
           Launch("s3", 0.0, 0.0, waits=("c2",)), Host("between_iterations", 0.01)]
    shared = simulate(ops, ranks=2, async_device=False, pair_ratio=1.5)
    assert [shared.stage_s[s][0] for s in ("s1", "s2", "s3")] == pytest.approx([0.001, 0.0045, 0.001])
    serial = simulate(ops, ranks=2, async_device=False)
    assert [serial.stage_s[s][0] for s in ("s1", "s2", "s3")] == pytest.approx([0.001, 0.003, 0.004])
    three = [Collective("c1", "s1", 0.004, blocks_host=False), Collective("c2", "s1", 0.004, blocks_host=False),
             Collective("c3", "s1", 0.001, blocks_host=False), Launch("s2", 0.0, 0.0, waits=("c3",)),
             Host("between_iterations", 0.01)]
    # c1 and c2 together from 0: both end at 1.5 x 4 = 6 ms; c3 starts then and ends at 7.
    assert simulate(three, ranks=1, async_device=False, pair_ratio=1.5).stage_s["s2"][0] == pytest.approx(0.007)

    # Where: CPU ranks that fill the host's cores (2 and 4 ranks on 2 cores), not a GPU's, not one
    # rank (no collective), not ranks with a core to spare (unmeasured: one after the other).
    from harness.projection.hardware import HARDWARE, cpu
    for ranks, cores, used in ((2, 2, 2.0), (4, 2, 2.0), (1, 2, None), (2, 4, None)):
        m = measured(CPU_RECORDED / f"tiny-{min(ranks, 4)}-r0")
        work = replace(m.work, world_size=ranks, ranks_per_node=ranks)
        assert pair_ratio(cpu(cores=cores, rank_cores=2), work) == used, (ranks, cores)
    assert pair_ratio(HARDWARE["h100"](), measured(CPU_RECORDED / "tiny-2-r0").work) is None


def test_each_lane_s_work_is_counted_without_its_waits():
    """Hand-worked, a GPU rank: the host launches a (1 ms, 0.5 ms of kernels), the exchange (3 ms)
    follows a's kernels, b's launch (0.2 ms) waits for it and its kernels take 2 ms, a sync drains
    the stream and costs 0.1 ms besides: a's kernels end with its launches (1 ms), c at 4, b's
    kernels at 6, the next iteration starts at 6.1. The host works 1.3 ms of it (the sync's wait,
    4.8 ms, is no work), the device 2.5, the comm lane 3."""
    ops = [Launch("a", 0.001, 0.0005), Collective("c", "a", 0.003), Launch("b", 0.0002, 0.002, waits=("c",)),
           Sync("b", 0.0001), Host("between_iterations", 0.0)]
    res = simulate(ops, ranks=2, async_device=True)
    assert res.period_s == pytest.approx(0.0061)
    want = {("a", "host"): 0.001, ("a", "device"): 0.0005, ("a", "comm"): 0.003, ("b", "host"): 0.0003,
            ("b", "device"): 0.002, ("between_iterations", "host"): 0.0}
    assert {k: pytest.approx([v, v]) for k, v in want.items()} == res.work_s


def _projected(ops: list, flags: dict | None = None, async_device: bool = True) -> "Projection":
    from harness.projection.kernels import StageKernels
    from harness.projection.project import Projection
    return Projection(label="hand", flags=flags or {}, result=simulate(ops, ranks=2, async_device=async_device),
                      kernels=StageKernels(input_dist=10, emb_fwd=4, dense_fwd_bwd=100, emb_bwd=5, dense_update=3,
                                           dense_buckets=1), world_size=2)


def test_what_bounds_a_period_and_the_stage_carrying_it():
    """render.bound, hand-worked on GPU ranks (launch_us 40 us): bound by the host when its work
    fills the period (input_dist 2 ms and the dense step 1 ms, the step's 0.5 ms of kernels
    hidden under the launches): input_dist, 10 launches (0.40 ms) and 1.60 ms beyond them; by the
    device when the kernels fill it (the dense step's 6 ms; the host launches the next iteration
    under them); by neither when the period is a wait for an exchange (8 ms): no stage, the stage
    exchanging named; a graphed dense step's host time is no launches. On a CPU the host runs both
    lanes' work: its ops and its compute."""
    from harness.projection.hardware import cpu, h100
    from harness.projection.render import bound

    profile = h100()
    profile.set("launch_us", 40.0, "us", "hand")
    host = _projected([Launch("input_dist", 0.002, 0.0), Launch("dense_fwd_bwd", 0.001, 0.0005),
                       Host("between_iterations", 0.0)])
    assert bound(host, profile) == (
        "bound by the host: host 3.00 of 3.00 ms an iteration, device 0.50; most in input_dist 2.00, dense_fwd_bwd 1.00",
        "input_dist, 2.00 ms on the host (10 launches at 40.0 us, hand: 0.40 ms; 1.60 ms its host time beyond them)")
    dev = _projected([Launch("input_dist", 0.001, 0.0), Launch("dense_fwd_bwd", 0.001, 0.006),
                      Host("between_iterations", 0.0)])
    assert bound(dev, profile) == ("bound by the device: device 6.00 of 6.00 ms an iteration, host 2.00; most in "
                                   "dense_fwd_bwd 6.00", "dense_fwd_bwd, 6.00 ms on the device")
    wait = _projected([Launch("emb_fwd", 0.001, 0.0), Collective("forward", "emb_fwd", 0.008),
                       Launch("dense_fwd_bwd", 0.001, 0.001, waits=("forward",)), Host("between_iterations", 0.0)])
    assert bound(wait, profile) == ("neither lane busy half the period (host 2.00 ms, device 1.00): waits for the "
                                    "exchanges and the other ranks, the most exchanged in emb_fwd (8.00 ms)", None)
    # graphed, the dense step's host work is one replay: no launches to price
    graphed = _projected([Launch("input_dist", 0.001, 0.0), Launch("dense_fwd_bwd", 0.002, 0.0005),
                          Host("between_iterations", 0.0)], flags={"cuda_graphs": True})
    assert bound(graphed, profile)[1] == "dense_fwd_bwd, 2.00 ms on the host"
    on_cpu = _projected([Launch("dense_fwd_bwd", 0.001, 0.003), Host("between_iterations", 0.0)], async_device=False)
    assert bound(on_cpu, cpu())[0] == ("bound by the compute: compute 3.00 of 4.00 ms an iteration, host ops 1.00; "
                                       "most in dense_fwd_bwd 3.00")


def test_the_gathered_gradients_cat_is_counted_where_it_runs():
    """harness/run/dense_gradients.py: one cat a step in finish_gradients (dense_update) on one rank,
    one a bucket in the backward's hooks (dense_fwd_bwd) beyond; each reads a parameter's fp32
    gradient and writes the buffer (8 bytes a parameter); the views (a CUDA graph's) cat nothing.
    tiny's dense parameters by hand: bottom 13x32+32 + 32x16+16, cross 2 x (432x8 + 8x432+432),
    top 432x32+32 + 32x16+16 + 16+1: 976 + 14688 + 14401 = 30065."""
    from harness.projection.calibrate import _work
    from harness.projection.work import gathered

    for run, ws in (("tiny-1-r0", 1), ("tiny-2-r0", 2)):
        m = measured(CPU_RECORDED / run)
        assert m.work.world_size == ws and m.work.params == 30065
        w = _work(m)  # the recorded runs gathered (eager CPU steps)
        assert (w.update_bytes - m.work.update_bytes, w.dense_bytes - m.work.dense_bytes) == (
            (8 * 30065, 0) if ws == 1 else (0, 8 * 30065))
        assert gathered(m.work, False) == m.work


def test_tool_writes_a_projected_report(tmp_path):
    from harness.tools.project import main
    assert main(["--preset", "tiny", "--hardware", "h100", "--calibrate", str(CALIBRATION), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "projection.md").read_text()
    assert "PROJECTED" in text and "calibrated: s-bf16-r0" in text and "assumption" in text
    assert main(["--calibrate", "no-such-run"]) == 2


CPU_LAYOUTS = {"tiny": (1, 2, 4), "small": (1, 2, 4)}
CPU_ITERS = {"tiny": ("60", "10"), "small": ("3", "1")}
"""(iterations, warm-up): small trains about 3 s an iteration on 2 cores."""
CPU_BATCH = {"tiny": 96, "small": 4096}
CPU_RECORDED = Path(__file__).parent / "data" / "cpu-runs-2core"
CPU_TARGET, CPU_BOUND = 0.25, 0.35


CPU_REPEATS = 2
"""Each run is made twice, a whole set apart, and projected and calibrated as the mean of both
(calibrate.pooled): one run's period on this VM moves by a fifth to a half (docs/projection.md)."""


def cpu_runs(root: Path, name: str) -> list[Path]:
    return [root / f"{name}-r{k}" for k in range(CPU_REPEATS)]


def cpu_calibration_runs(root: Path) -> list[Path]:
    """Each preset on one rank at its batch and at a quarter of it (the local batch of 4 ranks): a
    stage's host time a sample, per model (calibrate.py)."""
    return [p for preset in CPU_LAYOUTS for q in ("", "-quarter") for p in cpu_runs(root, f"{preset}-1{q}")]


def _bench(root: Path, preset: str, ranks: int, run_id: str, *extra: str) -> None:
    from harness.cli import main
    iters, warmup = CPU_ITERS[preset]
    assert main(["bench", "--preset", preset, "--gpus-per-node", str(ranks), "--iters", iters, "--warmup", warmup,
                 "--runs-root", str(root), "--run-id", run_id, *extra]) == 0


def _mean_figures(probes: list[dict]) -> dict:
    return {k: sum(p[k] for p in probes) / len(probes) for k in probes[0]}


def record_cpu_runs(root: Path) -> dict[int, dict[str, float]]:
    """tiny and small on 1, 2 and 4 local CPU ranks and on one rank at a quarter of the batch under
    `root`, CPU_REPEATS sets one after the other, each followed by the gloo probe at 2 and 4
    processes and the dense step on 2 threads and its share on 1; their means in root/gloo.json
    and root/threads.json: what tests/data/cpu-runs-2core/ holds, made so."""
    from harness.projection.probe import dense_threads, gloo_collectives
    gloo: dict[int, list] = {2: [], 4: []}
    threads = []
    for k in range(CPU_REPEATS):
        for preset, layouts in CPU_LAYOUTS.items():
            for ranks in layouts:
                _bench(root, preset, ranks, f"{preset}-{ranks}-r{k}")
            _bench(root, preset, 1, f"{preset}-1-quarter-r{k}", "--global-batch", str(CPU_BATCH[preset] // 4))
        for n in gloo:
            gloo[n].append(gloo_collectives(n))
        m = measured(root / f"small-1-r{k}")  # the probed run (calibrate.probed_run): the most dense FLOPs
        threads.append({str(t): v for t, v in dense_threads(m.run.manifest.config.model, m.work.local_batch, 2).items()})
    figures = {n: _mean_figures(v) for n, v in gloo.items()}
    (root / "gloo.json").write_text(json.dumps(figures, indent=1))
    (root / "threads.json").write_text(json.dumps(_mean_figures(threads)))
    return figures


def _cpu_errors(root: Path, gloo: dict) -> dict[str, tuple[float, dict[str, float]]]:
    """Calibrated on the 1-rank runs of tiny and small: each layout's period error and the errors
    of its stages that carry a fifth of its period (each layout's repeats pooled)."""
    from harness.projection.calibrate import pooled
    from harness.projection.hardware import set_gloo, set_thread_gain
    profile, cal, _ = calibrate(cpu_calibration_runs(root))
    set_thread_gain(profile, {int(k): v for k, v in json.loads((root / "threads.json").read_text()).items()})
    out = {}
    for preset, layouts in CPU_LAYOUTS.items():
        for ranks in layouts:
            p = profile.copy()
            if ranks > 1:
                set_gloo(p, gloo[ranks], ranks)
            m = pooled([measured(r) for r in cpu_runs(root, f"{preset}-{ranks}")])
            proj = project_run(m, p, cal)
            got = proj.stage_ms("mean")
            stages = {s: got[s] / (v * 1e3) - 1 for s, v in m.stage_s.items() if v > 0.2 * m.period_s}
            out[f"{preset}-{ranks}"] = (proj.period_ms / (m.period_s * 1e3) - 1, stages)
    return out


def _check_cpu(errs: dict) -> None:
    """Each layout's period within CPU_BOUND, the 1-rank runs' big stages within 10%, every
    layout's dense_fwd_bwd (the stage carrying most) within the issue's CPU_TARGET; the periods and
    big stages beyond CPU_TARGET are printed."""
    assert all(abs(e) < CPU_BOUND for e, _ in errs.values()), errs
    for run in ("tiny-1", "small-1"):
        assert all(abs(e) < 0.1 for e in errs[run][1].values()), errs[run]
    assert all(abs(stages["dense_fwd_bwd"]) < CPU_TARGET for _, stages in errs.values()), errs
    missed = {run: f"{e:+.0%}" for run, (e, _) in errs.items() if abs(e) >= CPU_TARGET}
    stages = {f"{run} {s}": f"{e:+.0%}" for run, (_, st) in errs.items() for s, e in st.items() if abs(e) >= CPU_TARGET}
    print(f"CPU projection periods: {({run: f'{e:+.0%}' for run, (e, _) in errs.items()})}; beyond 25%: {missed}; "
          f"stages beyond 25%: {stages}")


def _recorded_gloo() -> dict[int, dict[str, float]]:
    return {int(k): v for k, v in json.loads((CPU_RECORDED / "gloo.json").read_text()).items()}


def test_cpu_calibration_on_one_rank_projects_two_and_four_recorded():
    """The recorded runs (record_cpu_runs on this 2-core VM, two sets, each layout their mean):
    calibrated on tiny and small at one rank (each at its batch and a quarter of it: the host time
    a sample, per model), with the gloo probe for the exchanges, the cores each rank gets (4 ranks
    on 2 cores take turns) and the one-thread probe, each layout's period is projected within
    CPU_BOUND and its dense step within CPU_TARGET. This set (2026-11-28): periods tiny -23% and
    -14% on 2 and 4 ranks, small -4% and -6%; dense_fwd_bwd -3%, +7%, -4%, -3%. The big stages
    beyond 25%: emb_bwd, -48% on tiny-2 and -29% on tiny-4: its wait for the slowest rank's
    backward, as the ranks' dense steps spread and jitter on shared cores (this set's tiny-2 ranks:
    means 2.2-3.2 ms, standard deviations 0.3-1.6 ms, against 0.12-0.14 at one rank), which the
    model has not (docs/projection.md)."""
    _check_cpu(_cpu_errors(CPU_RECORDED, _recorded_gloo()))


@pytest.mark.slow
def test_cpu_calibration_on_one_rank_projects_two_and_four_live(tmp_path):
    """The same on runs made now (about 5 minutes; make test-slow)."""
    _check_cpu(_cpu_errors(tmp_path, record_cpu_runs(tmp_path)))


def test_each_model_is_calibrated_on_its_own_runs():
    """tiny's and small's host time a sample come from their own pairs of batches (a line through
    tiny at 96 and small at 4096 puts tiny's input dist at nothing below 96 samples); a model no run
    calibrates takes the first run's; a part a sample below zero is held at the pair's ends."""
    from harness.presets import mlperf, small, tiny
    _, cal, _ = calibrate(cpu_calibration_runs(CPU_RECORDED))
    assert cal.of(tiny().model) is cal and cal.batches == (96, 24)
    own = cal.of(small().model)
    assert own is not cal and own.batches == (4096, 1024) and cal.of(mlperf().model) is cal
    for c, (lo, hi) in ((cal, (24, 96)), (own, (1024, 4096))):
        for stage, per in c.host_per_sample_s.items():
            fixed = c.host_fixed_s[stage]
            if per < 0:  # held: below the pair as at its smaller batch, above as at its larger
                assert c.host(stage, lo // 2, 0.0) == pytest.approx(max(0.0, fixed + per * lo))
                assert c.host(stage, hi * 2, 0.0) == pytest.approx(max(0.0, fixed + per * hi))
            else:
                assert c.host(stage, hi * 2, 0.0) == pytest.approx(max(0.0, fixed + per * hi * 2))


def test_a_one_thread_rank_computes_at_the_probed_gain():
    """The dense step probed at 2.4 s on 2 threads and 2.0 s for one thread's share on 1: a rank of
    one thread (2 ranks on 2 cores) computes at half the probed rank's cores times 1.2; a rank of
    half a core (4 ranks) at a quarter times 1.2; the probed layout itself at 1."""
    from harness.projection.hardware import cpu, set_thread_gain
    from harness.projection.project import cpu_share

    p = cpu(cores=2, rank_cores=2)
    set_thread_gain(p, {2: 2.4, 1: 2.0})
    assert p.value("one_thread_gain") == pytest.approx(1.2)
    speeds = {n: cpu_share(p, measured(CPU_RECORDED / f"small-{n}-r0").work) for n in (1, 2, 4)}
    assert speeds[1] == (1.0, 1.0)
    assert speeds[2] == (pytest.approx(0.6), 1.0) and speeds[4] == (pytest.approx(0.3), 2.0)


def test_runs_of_one_configuration_calibrate_as_their_mean():
    """Two runs of the same configuration (the H100 bf16 defaults, r0 and r1) are pooled: the
    calibration sees one run whose period and stages are their means."""
    from harness.projection.calibrate import by_config

    paths = [H100 / f"s-bf16-r{k}" for k in (0, 1)]
    runs = [measured(p) for p in paths]
    (one,) = by_config(runs)
    assert one.period_s == pytest.approx((runs[0].period_s + runs[1].period_s) / 2)
    assert one.stage_s["dense_fwd_bwd"] == pytest.approx(sum(r.stage_s["dense_fwd_bwd"] for r in runs) / 2)
    assert len(by_config([runs[0], measured(H100 / "t-r0")])) == 2


def test_cpu_projection_needs_the_cores_and_the_probe():
    """Without the shared cores (each rank at the 1-rank run's speed) the 4-rank small projection
    misses by far more than 25%: the model's terms matter."""
    profile, cal, _ = calibrate(cpu_calibration_runs(CPU_RECORDED))
    profile.set("cores", 8.0, "cores", "test: as if each rank had the probed rank's 2 cores")
    m = measured(CPU_RECORDED / "small-4-r0")
    err = project_run(m, profile, cal).period_ms / (m.period_s * 1e3) - 1
    assert err < -0.5, err


def test_a_flag_the_harness_would_record_inactive_is_credited_nothing(tmp_path):
    """mlperf on 16 x 8 H100: this planner's plan has no table/column-wise table, so the harness
    records --skip-splits-a2a as inactive (run/optimizations.resolve); the projection credits it
    nothing and says why. The published 16 x 8 figures are set beside mlperf on h100 only."""
    import pandas as pd

    from harness.tools.project import main
    assert main(["--preset", "mlperf", "--nodes", "16", "--gpus-per-node", "8", "--hardware", "h100",
                 "--plans", "harness", "--out", str(tmp_path / "m")]) == 0
    wf = pd.read_csv(tmp_path / "m" / "waterfall.csv").set_index("config")
    assert wf.loc["+skip_splits_a2a alone", "vs_baseline"] == 1.0
    assert wf.loc["+skip_splits_a2a alone", "mechanism"].startswith("inactive: no table/column-wise table")
    assert "TorchRec baseline 7.6 ms" in (tmp_path / "m" / "projection.md").read_text()
    assert main(["--preset", "tiny", "--hardware", "h100", "--out", str(tmp_path / "t")]) == 0
    assert "7.6 ms" not in (tmp_path / "t" / "projection.md").read_text()


def test_the_time_between_iterations_follows_where_the_batches_are_drawn():
    """Hand values: calibrated on runs that drew one batch a draw on the GPU (29 launches at 10 us,
    0.29 ms of their 1.0 ms between iterations), a run drawing four a draw keeps the rest and pays
    a quarter of the launches; a host-drawn run keeps the rest (its threads assumed to keep up);
    calibrated on host-drawn runs (0.4 ms fixed, 1 us a sample of batch wait), a GPU-drawn run
    pays its launches instead of the wait."""
    from harness.projection.hardware import h100
    from harness.projection.project import Calibration, draw_launches_s

    profile = h100()
    assert draw_launches_s(profile, True, 1) == pytest.approx(290e-6)
    assert draw_launches_s(profile, True, 4) == pytest.approx(72.5e-6)
    assert draw_launches_s(profile, False, 4) == 0.0
    gpu = Calibration(between_s=1.0e-3, drawn_on_device=True, draw_s=290e-6)
    assert gpu.between(512, 100, True, 72.5e-6) == pytest.approx(1.0e-3 - 290e-6 + 72.5e-6)
    assert gpu.between(512, 100, True, 290e-6) == pytest.approx(1.0e-3)
    assert gpu.between(512, 100, False) == pytest.approx(1.0e-3 - 290e-6)
    host = Calibration(between_s=0.4e-3, between_per_sample_s=1e-6)
    assert host.between(512, 100, False) == pytest.approx(0.4e-3 + 512e-6)
    assert host.between(512, 100, True, 72.5e-6) == pytest.approx(0.4e-3 + 72.5e-6)


def test_a_run_folder_is_read_once_until_its_files_change(tmp_path):
    """measured keeps its answer for a folder while the folder's files stay as they were: asked
    again it gives the same answer without reading; once a record part is rewritten (every
    iteration 3 ms later than the one before it, so every period 3 ms longer) it reads the folder
    again, and its period is the report's of the rewritten records."""
    import shutil

    import pandas as pd

    from harness.report.api import iteration_summary

    run = tmp_path / "tiny-1-r0"
    shutil.copytree(CPU_RECORDED / "tiny-1-r0", run)
    first = measured(run)
    assert measured(run) is first
    part = next(run.glob("rank00000/iterations-*.parquet"))
    its = pd.read_parquet(part)
    shift = (its["iteration"] - its["iteration"].min()) * 3_000_000
    its.assign(start_ns=its["start_ns"] + shift, end_ns=its["end_ns"] + shift).to_parquet(part)
    again = measured(run)
    assert again is not first
    assert again.period_s * 1e3 == pytest.approx(iteration_summary(load_run(run))["period_ms_mean"])
    assert again.period_s == pytest.approx(first.period_s + 0.003, rel=1e-6)
