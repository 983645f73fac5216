"""report_main end to end: the files of a run report, self-contained HTML, incomplete runs, errors."""

import re

import numpy as np
import pandas as pd
import pytest

from harness.report.api import report_main
from harness.report.html import Doc, fmt
from harness.report.load import FLAGS
from tests.report_builders import flags_for, rewrite_manifest, sequential, write_run
from tests.test_report_tables import dur, four_ranks

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def two_node_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("r")
    d = four_ranks(root / "runs")
    rewrite_manifest(d, optimizations=flags_for(
        {f: True for f in FLAGS}, {"cuda_graphs": "CUDA only: this run is on cpu"},
        notes={"skip_splits_a2a": "row-wise tables still exchange their splits"}))
    assert report_main(run="latest", runs_root=root / "runs", reports_root=root / "rep") == 0
    return root / "rep" / "two-nodes"


def test_run_report_files(two_node_report):
    out = two_node_report
    names = {p.name for p in out.iterdir()}
    assert {"report.md", "report.html", "stages.csv", "stages_by_rank.csv",
            "stages_by_node.csv", "iteration_stats.csv", "iterations.csv", "stragglers.csv",
            "input_dist_overlap.csv", "stage_bars.png", "timeline.png", "iteration_time.png"} <= names
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == PNG
    strag = pd.read_csv(out / "stragglers.csv").set_index("stage")
    assert strag.loc["dense_fwd_bwd", "slowest_rank"] == 3
    stages = pd.read_csv(out / "stages.csv").set_index("stage")
    x = [dur(r, i, 2) for r in range(4) for i in (1, 2, 3)]
    assert stages.loc["dense_fwd_bwd", "p99_ms"] == pytest.approx(np.percentile(x, 99))


def test_run_report_markdown_and_html(two_node_report):
    md = (two_node_report / "report.md").read_text()
    for heading in ("## Iterations", "## Stages, all ranks", "## Stages per rank (mean ms)",
                    "## Stages per node (mean ms)", "## Stragglers", "## Input distribution hidden by the pipeline",
                    "## Roofline", "## Optimizations", "## Plots"):
        assert heading in md
    assert "roofline n/a" not in md
    # Findings first, by hand: job iteration = rank 3's, 33.75/35/36.25 ms back to back, so the
    # periods are 33.75 and 35 (the last has none); dense_fwd_bwd means 8.5, 9, 9.5 and 20 ms on
    # ranks 0-3 (11.75 overall); over the iterations with a period it takes 93 of the ranks'
    # 185 ms of periods (50%); median rank 9.25, so rank 3 is +116%.
    findings = md[md.index("## Findings"):md.index("## Setup")]
    assert md.index("## Findings") < md.index("## Iterations")
    assert "iteration period 34.38 ms" in findings and "timed window (iter_ms) 35 ms" in findings
    assert "between iterations: 0 ms of every period (0%)" in findings
    assert "dominant stage: dense_fwd_bwd, 11.75 ms a rank (50% of the iteration period)" in findings
    assert "straggler: worst is rank 3 (node 1) in dense_fwd_bwd, 20 ms vs the median rank's 9.25 ms (+116%)" in findings
    assert "cuda_graphs requested but inactive: CUDA only: this run is on cpu" in findings
    assert "| cuda_graphs | yes | no | CUDA only: this run is on cpu |  |" in md
    assert "| skip_splits_a2a | yes | yes |  | row-wise tables still exchange their splits |" in md
    assert "![Per-rank timeline" in md and "(timeline.png)" in md
    html = (two_node_report / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3
    # Self-contained: no image, script or stylesheet fetched from elsewhere.
    assert not re.search(r'(src|href)="(?!data:)', html)
    assert html.count("<table>") == md.count("\n| ---")  # every markdown table is an HTML table
    assert "<td class=n>35.000</td>" in html  # the job's mean iteration (slowest rank)


def test_failed_partial_run_is_flagged(tmp_path, capsys):
    sp0, it0 = sequential(0, range(4), lambda r, i, s: 1.0, warmup_iters=1)
    sp1, it1 = sequential(1, range(3), lambda r, i, s: 1.0, warmup_iters=1)
    write_run(tmp_path / "runs", "bad", sp0 + sp1, {**it0, **it1}, world_size=3, status="failed", warmup_iters=1)
    assert report_main(run="bad", runs_root=tmp_path / "runs", reports_root=tmp_path / "rep") == 0
    md = (tmp_path / "rep" / "bad" / "report.md").read_text()
    assert "> **!!** run FAILED: RuntimeError: boom" in md
    assert "> **!!** rank(s) 2 of world size 3 have no records" in md
    assert "1 not recorded by every rank excluded" in md
    html = (tmp_path / "rep" / "bad" / "report.html").read_text()
    assert "<div class=warn>run FAILED: RuntimeError: boom" in html
    assert "FAILED" in capsys.readouterr().out


def test_run_without_stage_timing(tmp_path):
    _, its = sequential(0, range(5), lambda r, i, s: 2.0, warmup_iters=2)
    write_run(tmp_path / "runs", "notl", [], its, world_size=1, warmup_iters=2,
              manifest={"timeline": False})
    assert report_main(run="notl", runs_root=tmp_path / "runs", reports_root=tmp_path / "rep") == 0
    out = tmp_path / "rep" / "notl"
    assert "No stage records" in (out / "report.md").read_text()
    assert (out / "iteration_time.png").is_file() and not (out / "timeline.png").exists()


@pytest.mark.parametrize("kwargs, msg", [
    ({}, "give exactly one of --run, --ablation, --nsys (got none)"),
    ({"run": "latest", "ablation": "x"}, "give exactly one of --run, --ablation, --nsys (got run and ablation)"),
])
def test_exactly_one_source(tmp_path, capsys, kwargs, msg):
    assert report_main(runs_root=tmp_path, reports_root=tmp_path / "rep", **kwargs) == 2
    assert capsys.readouterr().err == f"report: error: {msg}\n"


def test_report_of_nothing_writes_nothing(tmp_path, capsys):
    _, its = sequential(0, range(2), lambda r, i, s: 2.0, warmup_iters=2)
    write_run(tmp_path / "runs", "warm", [], its, world_size=1, warmup_iters=2)
    assert report_main(run="warm", runs_root=tmp_path / "runs", reports_root=tmp_path / "rep") == 2
    assert report_main(run="latest", runs_root=tmp_path / "none", reports_root=tmp_path / "rep") == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "no non-warm-up iterations" in err[0] and "no runs under" in err[1]
    assert not (tmp_path / "rep").exists()


def test_cell_formatting_and_escaping(tmp_path):
    assert fmt(float("nan")) == "n/a" and fmt(None) == "n/a" and fmt(pd.NA) == "n/a"
    assert fmt(0.1234, pct=True) == "12.3%" and fmt(np.int64(7)) == "7" and fmt(True) == "yes"
    assert fmt(12.34567) == "12.346" and fmt(4.9e10) == "4.9e+10" and fmt(1234.56) == "1234.6"
    doc = Doc("t")
    doc.table(pd.DataFrame({"note": ["a|b <x>"], "share": [0.5]}))
    assert "| a\\|b <x> | 50.0% |" in doc.markdown()
    assert "<td>a|b &lt;x&gt;</td>" in doc.html()


def test_splits_exchanged_is_reported_per_rank(tmp_path):
    sp, it = sequential(0, range(4), lambda r, i, s: 1.0, warmup_iters=1)
    d = write_run(tmp_path / "runs", "sk", sp, it, world_size=1, warmup_iters=1)
    part = d / "rank00000" / "iterations-00000.parquet"
    its = pd.read_parquet(part)
    its["splits_exchanged"] = [1, 0, 1, 0]  # iteration 0 is warm-up: not counted
    its.to_parquet(part)
    assert report_main(run="sk", runs_root=tmp_path / "runs", reports_root=tmp_path / "rep") == 0
    csv = pd.read_csv(tmp_path / "rep" / "sk" / "splits_exchanged.csv")
    assert csv.to_dict("records") == [{"rank": 0, "iterations": 3, "splits_exchanged": 1,
                                       "iterations_with_exchange": 1}]
    assert "## Splits all-to-alls" in (tmp_path / "rep" / "sk" / "report.md").read_text()


def test_waterfall_keeps_every_bar_and_label_inside_the_axes(tmp_path, monkeypatch):
    from harness.report import plots as report_plots

    figs = []
    monkeypatch.setattr(report_plots, "_save", lambda fig, path: figs.append(fig) or path)
    # A flag that slows things climbs to 16 ms, above both totals (10 and 13).
    contrib = pd.DataFrame({"flag": ["cuda_graphs", "threaded_input_dist", "skip_splits_a2a"],
                            "alone_ms": [np.nan, -6.0, 2.0]})
    report_plots.plot_waterfall(contrib, 10.0, 13.0, tmp_path / "w.png")
    ax = figs[0].axes[0]
    low, high = ax.get_ylim()
    tops = [p.get_y() + p.get_height() for p in ax.patches]
    assert max(tops) == pytest.approx(16.0) and high > 16.0 and low == 0
    assert all(low <= t.get_position()[1] < high for t in ax.texts)
