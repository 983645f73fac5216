"""--profile FIRST:LAST: a torch.profiler window a rank, its Chrome trace in the run folder with each
stage a range over its ops (issue 45: kernels under the stages, loadable in Perfetto and HTA)."""

from __future__ import annotations

import json

import pytest

from harness.cli import main
from harness.config import RunConfig
from harness.presets import tiny
from harness.report import profile_trace as pt


def test_the_window_writes_a_trace_a_rank_with_every_stage_in_it(tmp_path):
    runs = tmp_path / "runs"
    # Table-wise: tiny's own plan is data-parallel, whose input dist exchanges nothing and runs no op.
    assert main(["bench", "--preset", "tiny", "--iters", "3", "--warmup", "3", "--profile", "1:2",
                 "--sharding", "table_wise", "--runs-root", str(runs)]) == 0
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    for rank in ("rank00000", "rank00001"):
        events = json.loads((run_dir / rank / "trace.json").read_text())["traceEvents"]
        ranges = [e for e in events if e.get("ph") == "X"]
        names = {e["name"] for e in ranges}
        assert {"emb_fwd", "dense_fwd_bwd", "emb_bwd", "dense_update"} <= names
        # Two iterations in the window: each stage's range twice; ops run inside them (aten::...).
        assert sum(e["name"] == "dense_fwd_bwd" for e in ranges) == 2
        dense = [e for e in ranges if e["name"] == "dense_fwd_bwd"][0]
        inside = [e for e in ranges if e["name"].startswith("aten::") and e.get("tid") == dense.get("tid")
                  and dense["ts"] <= e["ts"] <= dense["ts"] + dense["dur"]]
        assert inside, "no op under the dense stage's range"
        # The pipelined input dist, a span across iterations, is annotated by its pieces on the
        # thread that does each: the 2-rank exchange's start, launch and wait, each op-bearing.
        parts = [e for e in ranges if e["name"] in ("input_dist:start", "input_dist:launch", "input_dist:wait")]
        assert {e["name"] for e in parts} == {"input_dist:start", "input_dist:launch", "input_dist:wait"}
        assert any(e["name"].startswith(("aten::", "fbgemm::", "c10d::", "gloo:")) and e.get("tid") == p.get("tid")
                   and p["ts"] <= e["ts"] <= p["ts"] + p["dur"] for p in parts for e in ranges)
        assert "input_dist" in set(pt.analyze(run_dir / rank / "trace.json").stages["stage"])


def test_a_window_outside_the_run_is_refused():
    cfg = tiny(iters=3, warmup_iters=1)
    with pytest.raises(ValueError, match=r"run.profile 2:4 is not a window of the run's iterations 0..3"):
        cfg.replace(run=RunConfig(**{**cfg.run.__dict__, "profile": (2, 4)}))
    with pytest.raises(ValueError, match="run.profile 3:2"):
        cfg.replace(run=RunConfig(**{**cfg.run.__dict__, "profile": (3, 2)}))
