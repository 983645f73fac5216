"""The projected report's images, flag mechanisms and plans section (issue 46): harness/projection/render.py,
harness/tools/project.py, harness/report/plots.py plot_lanes.

The Gantt frame is checked against a timeline worked out by hand; the plans section on tiny at 2 x 2
against the projections it reports (TorchRec plans tiny there in about 2 s).
"""

from __future__ import annotations

import contextlib
import io
import re
import struct
from pathlib import Path

import numpy as np
import pytest

import harness.projection.project as project_module
from harness.names import OPTIMIZATION_FLAGS
from harness.projection import render
from harness.projection.kernels import StageKernels
from harness.projection.project import Projection
from harness.projection.timeline import Collective, Host, Launch, Sync, simulate
from harness.projection.work import Work
from harness.report.plots import plot_waterfall
from harness.tools import project as tool

CALIBRATION = Path(__file__).parent / "data" / "h100-runs-2" / "s-bf16-r0"
ARGS_2X2 = ["--preset", "tiny", "--nodes", "2", "--gpus-per-node", "2", "--hardware", "h100",
            "--calibrate", str(CALIBRATION)]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
KERNELS = StageKernels(input_dist=0, emb_fwd=0, dense_fwd_bwd=0, emb_bwd=0, dense_update=0, dense_buckets=0)


def _projection(ops: list, ranks: int, label: str = "hand", flags: dict | None = None,
                kernels: StageKernels = KERNELS) -> Projection:
    result = simulate(ops, ranks=ranks, async_device=True)
    return Projection(label=label, flags=flags or {}, result=result, kernels=kernels, world_size=ranks)


def _hand_ops() -> list:
    """input_dist launches and drains the stream (a pageable sync), the ids exchange (4 ms), a lookup
    rank 1 takes 2 ms longer, the forward exchange, the dense step, 1 ms between iterations."""
    return [Launch("input_dist", 0.001, 0.0), Sync("input_dist", 0.0, drain=True),
            Collective("ids", "input_dist", 0.004),
            Launch("emb_fwd", 0.001, np.array([0.001, 0.003]), waits=("ids",)),
            Collective("forward", "emb_fwd", 0.001),
            Launch("dense_fwd_bwd", 0.002, 0.005, waits=("forward",)), Host("between_iterations", 0.001)]


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; fails unless the file starts as a PNG does."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_MAGIC and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_gantt_frame_matches_the_timeline_worked_by_hand():
    """Steady state by hand (ms): the device runs 13 ms an iteration (ids 4, lookup 1 or 3, forward 1,
    dense 5) while the host needs 4, so the host launches input_dist 9 ms before the iteration
    starts (the end of the previous one's dense step) and waits in the sync until it does."""
    p = _projection(_hand_ops(), ranks=2)
    assert p.period_ms == pytest.approx(13.0)
    df = render.lane_spans(p)
    got = {(int(r.rank), r.lane, r.stage, round(r.start_ms, 6), round(r.end_ms, 6)) for r in df.itertuples()}
    want = set()
    for rank, lookup_end in ((0, 5.0), (1, 7.0)):
        want |= {(rank, "host", "input_dist", -9.0, -8.0), (rank, "host", "input_dist", -8.0, 0.0),
                 (rank, "comm", "input_dist", 0.0, 4.0), (rank, "host", "emb_fwd", 0.0, 1.0),
                 (rank, "compute", "emb_fwd", 4.0, lookup_end), (rank, "comm", "emb_fwd", 7.0, 8.0),
                 (rank, "host", "dense_fwd_bwd", 1.0, 3.0), (rank, "compute", "dense_fwd_bwd", 8.0, 13.0),
                 (rank, "host", "between_iterations", 3.0, 4.0)}
    assert got == want  # input_dist's launch has no device work: no compute span
    assert list(render.lane_spans(p, [1])["rank"].unique()) == [1]


def test_shown_ranks_past_eight_keep_rank_0_and_the_slowest():
    """12 ranks, rank 7's dense_update (after the last collective) 3 ms longer: it ends last."""
    update = np.full(12, 0.001)
    update[7] = 0.004
    ops = [Launch("emb_fwd", 0.001, 0.001), Collective("forward", "emb_fwd", 0.001),
           Launch("dense_update", 0.001, update, waits=("forward",)), Host("between_iterations", 0.001)]
    p = _projection(ops, ranks=12)
    ranks, which = render.shown_ranks(p)
    # others 1-6, 8-11 at positions round(linspace(0, 9, 6)) = 0, 2, 4, 5, 7, 9: ranks 1, 3, 5, 6, 9, 11
    assert ranks == [0, 1, 3, 5, 6, 7, 9, 11]
    assert "slowest 7" in which and "8 of 12" in which
    small = _projection(_hand_ops(), ranks=2)
    assert render.shown_ranks(small) == ([0, 1], "ranks 0-1")


def test_plot_lanes_and_waterfall_write_pngs(tmp_path):
    p = _projection(_hand_ops(), ranks=2)
    paths = [render.plot_gantt(p, tmp_path / "timeline.png"),
             plot_waterfall(render.waterfall_contrib(p, {"skip_splits_a2a": p}), p.period_ms, p.period_ms,
                            tmp_path / "waterfall.png", title="PROJECTED")]
    for path in paths:
        w, h = _png_size(path)
        assert w > 600 and h > 200 and path.stat().st_size > 10_000


def test_waterfall_credits_each_flag_its_saving_and_mechanism():
    """Hand periods: base 13 ms; a flag alone at 10 ms saved 3 ms; an inactive one (turned off by
    the profile) is n/a, not 0."""
    base = _projection(_hand_ops(), ranks=2, label="base")
    faster = _projection([*_hand_ops()[:2], Collective("ids", "input_dist", 0.001), *_hand_ops()[3:]], ranks=2,
                         flags={"skip_splits_a2a": True})
    inactive = _projection(_hand_ops(), ranks=2, flags={"cuda_graphs": False})
    alone = {"skip_splits_a2a": faster, "cuda_graphs": inactive}
    contrib = render.waterfall_contrib(base, alone).set_index("flag")["alone_ms"]
    assert contrib["skip_splits_a2a"] == pytest.approx(3.0) and np.isnan(contrib["cuda_graphs"])
    wf = render.waterfall(base, alone, faster).set_index("config")["mechanism"]
    assert wf["+skip_splits_a2a alone"] == render.MECHANISMS["skip_splits_a2a"]
    assert wf["+cuda_graphs alone"].startswith("inactive")


def test_every_flag_has_a_mechanism_the_model_names():
    assert set(OPTIMIZATION_FLAGS) == set(render.MECHANISMS)
    doc = project_module.__doc__
    for flag in render.MECHANISMS:  # the line restates project.py's docstring: the flag is named there
        assert f"- {flag}" in doc, flag


def test_exchange_mb_is_the_busiest_rank_a_level():
    """Hand bytes (levels, out/in, ranks): ids in the node, rank 1 receives 3 MB; across nodes rank 0 sends 5 MB."""
    ids = np.zeros((2, 2, 2))
    ids[0, 1, 1], ids[0, 0, 0], ids[1, 0, 0], ids[1, 1, 1] = 3e6, 1e6, 5e6, 2e6
    work = Work(world_size=2, ranks_per_node=1, local_batch=1, dense_flops=0.0, dense_bytes=0.0, update_bytes=0.0,
                params=0, lookup_fwd=np.zeros(2), lookup_bwd=np.zeros(2), exchange={"ids": ids}, groups=("pooled",),
                group_exchange={"pooled": {"ids": ids}}, kinds=("table_wise",), spans_nodes=True)
    assert render.exchange_mb(work) == {("ids", "intra"): pytest.approx(3.0), ("ids", "inter"): pytest.approx(5.0)}


class _Figures:
    """The figures plan_costs reads (HBM speed, the lookups' share of it, a launch), by hand."""

    def value(self, name: str) -> float:
        return {"hbm_gbps": 1.0, "lookup_eff": 0.5, "launch_us": 10.0}[name]


def _plan(name: str, forward_s: float, lookup_bytes: float, emb_fwd_kernels: int) -> render.PlanProjection:
    """A hand plan on 2 ranks whose forward exchange takes `forward_s`, whose busiest rank looks up
    `lookup_bytes` (forward and backward) and whose emb_fwd launches `emb_fwd_kernels`, every stage present."""
    ops = [Launch("input_dist", 0.001, 0.0), Sync("input_dist", 0.0, drain=True),
           Collective("ids", "input_dist", 0.004), Launch("emb_fwd", 0.001, 0.001, waits=("ids",)),
           Collective("forward", "emb_fwd", forward_s), Launch("dense_fwd_bwd", 0.001, 0.002, waits=("forward",)),
           Launch("emb_bwd", 0.001, 0.001), Launch("dense_update", 0.001, 0.001), Host("between_iterations", 0.001)]
    p = _projection(ops, ranks=2, label=name, kernels=StageKernels(1, emb_fwd_kernels, 0, 2, 0, 0))
    work = Work(world_size=2, ranks_per_node=2, local_batch=1, dense_flops=0.0, dense_bytes=0.0, update_bytes=0.0,
                params=0, lookup_fwd=np.array([0.0, lookup_bytes / 3]),
                lookup_bwd=np.array([0.0, 2 * lookup_bytes / 3]),
                exchange={"forward": np.zeros((2, 2, 2))}, groups=("pooled",),
                group_exchange={"pooled": {"forward": np.zeros((2, 2, 2))}}, kinds=("table_wise",),
                spans_nodes=False)
    return render.PlanProjection(name, (), work, p, p)


def test_plan_mechanism_names_the_difference_largest_first():
    """Hand: b's forward exchange takes 3 ms, a's 1 ms (the comm lane's embedding exchanges, ids 4 ms
    included: 5 -> 7 ms), its lookups 2 MB more bytes (at 0.5 GB/s: 0 -> 4 ms), its emb_fwd 100
    kernels more (at 10 us: 0.03 -> 1.03 ms with input_dist's 1 and emb_bwd's 2). The dense step
    waits for the exchange: its stage and the period grow by 2 ms; no other stage moves (the
    simulated ops carry no launch count)."""
    a, b = _plan("a", 0.001, 0.0, 0), _plan("b", 0.003, 2e6, 100)
    line = render.plan_mechanism(a, b, _Figures())
    assert line.startswith("b against a: baseline period +2.000 ms; modelled differences, largest first: "
                           "lookups on the busiest rank 0.000 -> 4.000 ms (lookup bytes 0.00 -> 2.00 MB); "
                           "embedding exchanges on the comm lane 5.000 -> 7.000 ms"), line
    assert line.endswith("kernel launches of input_dist, emb_fwd, emb_bwd 0.030 -> 1.030 ms (sharding groups "
                         "1 -> 1, each its own kernels: 3 -> 103 kernels)"), line
    table = render.plans_stage_table([a, b]).set_index("stage")
    assert list(table.index) == ["period", "dense_fwd_bwd"]
    assert table.loc["period", "b baseline_ms"] - table.loc["period", "a baseline_ms"] == pytest.approx(2.0)
    assert table.loc["dense_fwd_bwd", "b all_flags_ms"] - table.loc["dense_fwd_bwd", "a all_flags_ms"] \
        == pytest.approx(2.0)


@pytest.fixture(scope="module")
def two_by_two(tmp_path_factory):
    """The tool on tiny at 2 x 2 with its default plans (both): (its printed lines, its report folder)."""
    out = tmp_path_factory.mktemp("proj2x2")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert tool.main([*ARGS_2X2, "--out", str(out)]) == 0
    return printed.getvalue().splitlines(), out


def test_report_links_valid_pngs(two_by_two):
    _, out = two_by_two
    text = (out / "projection.md").read_text()
    for name in ("timeline.png", "waterfall.png"):
        assert f"]({name})" in text
        w, h = _png_size(out / name)
        assert w > 600 and h > 300 and (out / name).stat().st_size > 10_000


def test_plans_section_on_two_by_two(two_by_two):
    lines, out = two_by_two
    text = (out / "projection.md").read_text()
    section = text[text.index("## Plans (projected)"):text.index("## Assumptions")]
    assert "TorchRec planning (2 x 2 ranks) ..." in lines
    secs = [float(m.group(1)) for line in lines if (m := re.match(r"TorchRec plan in ([\d.]+) s", line))]
    assert len(secs) == 1 and secs[0] < 20
    for name in ("harness", "torchrec"):
        line = next(x for x in lines if x.startswith(f"plan {name}:"))
        base, every = map(float, re.search(r"baseline ([\d.]+) ms, all flags ([\d.]+) ms", line).groups())
        assert line in section and every < base
        assert "| period | " in section
    # The harness plan's baseline and all-flags periods are the waterfall's first and last rows.
    wf = (out / "waterfall.csv").read_text().splitlines()
    harness = next(x for x in lines if x.startswith("plan harness:"))
    assert f"baseline {float(wf[1].split(',')[1]):.2f} ms" in harness
    assert f"all flags {float(wf[-1].split(',')[1]):.2f} ms" in harness
    assert "- mechanism: torchrec against harness:" in section and "modelled differences, largest first" in section
    assert "| exchange | harness intra_MB | harness inter_MB | torchrec intra_MB | torchrec inter_MB |" in section


def test_plans_bogus_exits_2_before_any_work(capsys, monkeypatch):
    def no_work(*_a, **_k):
        raise AssertionError("calibrated before refusing --plans")
    monkeypatch.setattr(tool, "calibrate", no_work)
    assert tool.main([*ARGS_2X2, "--plans", "bogus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bogus" in err[0] and "harness, torchrec" in err[0]


def test_default_plans_follow_the_world_size():
    assert tool.default_plans(1) == ["harness"]
    assert tool.default_plans(4) == (["harness", "torchrec"] if tool.torchrec_installed() else ["harness"])
    assert tool.parse_plans("torchrec,harness,torchrec") == ["torchrec", "harness"]


def test_a_plan_torchrec_cannot_make_is_left_out_with_a_line(monkeypatch):
    from torchrec.distributed.planner.types import PlannerError

    def no_fit(name, cfg, log):
        raise PlannerError("no plan fits\ndetails")
    monkeypatch.setattr(tool, "plan_of", no_fit)
    lines = []
    assert tool.project_plans(None, ["torchrec"], None, None, lines.append) == []
    assert lines == ["plan torchrec: TorchRec found no plan (no plan fits); left out of the report"]
    monkeypatch.setattr(tool, "plan_of", lambda *_: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # anything else is a bug, not a missing plan
        tool.project_plans(None, ["torchrec"], None, None, lines.append)
