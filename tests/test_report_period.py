"""The iteration as a benchmark times it (issue 43, item 4): the period from one iteration's start
to the next one's start, samples/s over the timed wall time, and what runs between iterations as a
segment of its own. Every expectation is a hand value of the synthetic records below.

Run A, two ranks, iteration 0 warm-up, times in ms (start-end of each iteration's record):

    rank 0:  0-12   20-30   35-45   55-62   70-78
    rank 1:  1-13   21-31   37-47   56-66   71-79

Periods of the timed iterations 1, 2, 3 (4, the last, has none): rank 0 15, 20, 15; rank 1 16, 19,
15; the job's (slowest rank) 16, 20, 15, mean 17. Gaps (next start - end): rank 0 5, 10, 8; rank 1
6, 9, 5; the job's 6, 10, 8. The timed windows (iter_ms): rank 0 10, 10, 7, 8; rank 1 10, 10, 10, 8.
"""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from harness.report.api import format_summary, iteration_summary, load_run, report_main, write_compare_report
from harness.report.ablation import ablation_table, load_ablation
from harness.report.compare import compare_runs
from harness.report.findings import run_findings
from harness.report.tables import (
    critical_stage_means, iteration_table, job_iterations, rank_iterations, stage_stats, subspan_table,
)
from harness.names import STAGES
from harness.records.manifest import RunManifest
from tests.report_builders import (
    config, rewrite_manifest, sequential, span, write_ablation, write_evals, write_run, write_subspans,
)

STARTS = {0: [0, 20, 35, 55, 70], 1: [1, 21, 37, 56, 71]}
ENDS = {0: [12, 30, 45, 62, 78], 1: [13, 31, 47, 66, 79]}
SAMPLES = 4  # a rank an iteration


def run_a(root, run_id="a"):
    """Run A: each iteration's window split in five equal stages, back to back."""
    spans, iters = [], {}
    for rank in (0, 1):
        for i, (a, b) in enumerate(zip(STARTS[rank], ENDS[rank])):
            d = (b - a) / 5
            spans += [span(rank, i, name, a + s * d, a + (s + 1) * d, warmup=i == 0) for s, name in enumerate(STAGES)]
            iters[(rank, i)] = (a, b)
    return write_run(root, run_id, spans, iters, world_size=2, samples=SAMPLES, warmup_iters=1)


# What ran in the gaps: (rank, iteration, name, start, end). The gap after the warm-up iteration 0
# and after the last iteration 4 have no period and count nowhere.
BETWEEN = [
    (0, 0, "next_batch", 12, 20),
    (0, 1, "next_batch", 30, 34), (0, 2, "next_batch", 45, 49), (0, 2, "flush_records", 49, 54),
    (0, 3, "next_batch", 62, 67),
    (1, 1, "next_batch", 31, 36), (1, 2, "next_batch", 47, 52), (1, 2, "flush_records", 52, 55),
    (1, 3, "next_batch", 66, 70),
    (0, 4, "flush_records", 78, 80),
]


def with_between(root, run_id="c"):
    d = run_a(root, run_id)
    write_subspans(d, [dict(rank=r, iteration=i, stage="between_iterations", name=n, start_ms=a, end_ms=b,
                            warmup=i == 0) for r, i, n, a, b in BETWEEN])
    return d


def test_period_and_gap_from_the_iteration_records(tmp_path):
    run = load_run(run_a(tmp_path))
    ri = rank_iterations(run).set_index(["rank", "iteration"])
    assert ri.loc[0, "period_ms"].tolist()[:3] == pytest.approx([15, 20, 15])
    assert ri.loc[1, "period_ms"].tolist()[:3] == pytest.approx([16, 19, 15])
    assert ri.loc[0, "between_ms"].tolist()[:3] == pytest.approx([5, 10, 8])
    assert ri.loc[1, "between_ms"].tolist()[:3] == pytest.approx([6, 9, 5])
    assert ri.loc[(0, 4), ["period_ms", "between_ms"]].isna().all()  # the last iteration has no period
    job = job_iterations(run).set_index("iteration")
    assert job["period_ms"].tolist()[:3] == pytest.approx([16, 20, 15]) and np.isnan(job.loc[4, "period_ms"])
    assert job["between_ms"].tolist()[:3] == pytest.approx([6, 10, 8])


def test_the_iteration_table_and_summary_lead_with_the_period(tmp_path):
    run = load_run(run_a(tmp_path))
    job = iteration_table(run, "job").iloc[0]
    assert job["iterations"] == 4 and job["periods"] == 3
    assert job["period_ms_mean"] == pytest.approx(17.0) and job["period_ms_p50"] == pytest.approx(16.0)
    assert job["between_ms_mean"] == pytest.approx(8.0)
    assert job["iter_ms_mean"] == pytest.approx(9.5)  # the timed window: 10, 10, 10, 8
    # samples/s over the timed wall time: 3 iterations x 8 samples in 16 + 20 + 15 ms (not 32 in 38).
    assert job["samples_per_s"] == pytest.approx(24 / 0.051)
    its = iteration_summary(run)
    assert its["samples_per_s"] == pytest.approx(24 / 0.051) and its["period_ms_mean"] == pytest.approx(17.0)
    text = format_summary(run)
    line = next(x for x in text.splitlines() if x.startswith("iteration:"))
    assert line.startswith("iteration: period mean 17.000  p50 16.000")
    assert f"samples_per_s {24 / 0.051:.1f}  (timed window iter_ms mean 9.500" in line
    assert "not broken down" in text  # no record says what ran between the iterations


def test_an_evaluation_is_no_iterations_time(tmp_path):
    d = run_a(tmp_path)
    write_evals(d, [0, 1], after=[2])
    run = load_run(d)
    job = iteration_table(run, "job").iloc[0]
    # Iteration 2's next start comes after an evaluation: no period. Left: 16 and 15.
    assert job["periods"] == 2 and job["period_ms_mean"] == pytest.approx(15.5)
    assert job["samples_per_s"] == pytest.approx(16 / 0.031)


def test_the_between_iterations_row_and_its_named_parts(tmp_path):
    run = load_run(with_between(tmp_path))
    t = stage_stats(run, "job").set_index("stage")
    assert list(t.index) == [*STAGES, "between_iterations", "between_iterations/flush_records",
                             "between_iterations/next_batch", "between_iterations/other"]
    # Six gaps (2 ranks x iterations 1-3): 5, 10, 8, 6, 9, 5; the periods sum to 100 ms.
    assert t.loc["between_iterations", "mean_ms"] == pytest.approx(43 / 6)
    assert t.loc["between_iterations", "count"] == 6 and t.loc["between_iterations", "share"] == pytest.approx(0.43)
    # next_batch 4, 4, 5 | 5, 5, 4; flush_records only after iteration 2 (5 and 3 ms), 0 elsewhere;
    # other = what they leave: 1, 1, 3 | 1, 1, 1.
    nb, fl, ot = (t.loc[f"between_iterations/{p}"] for p in ("next_batch", "flush_records", "other"))
    assert nb["mean_ms"] == pytest.approx(4.5) and nb["count"] == 6 and nb["share"] == pytest.approx(0.27)
    assert fl["mean_ms"] == pytest.approx(8 / 6) and fl["count"] == 2 and fl["p50_ms"] == 0
    assert fl["share"] == pytest.approx(0.08)
    assert ot["mean_ms"] == pytest.approx(8 / 6) and ot["share"] == pytest.approx(0.08)
    # Each stage is a fifth of the windows: 57 ms of the 100 ms of periods.
    assert t.loc["dense_fwd_bwd", "share"] == pytest.approx(57 / 5 / 100)
    assert t.loc[list(STAGES) + ["between_iterations"], "share"].sum() == pytest.approx(1.0)
    # Per record, the sub-span table has them too (flush_records: 5, 3 and, after the last
    # iteration, 2 ms; against the 43/6 ms gap); what runs between iterations is no stage's piece:
    # the summary lists it in the stage table only.
    subs = subspan_table(run).set_index(["stage", "name"])
    assert subs.loc[("between_iterations", "flush_records"), "mean_ms"] == pytest.approx(10 / 3)
    assert subs.loc[("between_iterations", "flush_records"), "share_of_stage"] == pytest.approx(10 / 3 / (43 / 6))
    assert "inside the stages:" not in format_summary(run)
    wide = critical_stage_means(run, "rank")
    assert wide.loc[0, "between_iterations/next_batch"] == pytest.approx(13 / 3)
    assert wide.loc[0, "period_ms"] == pytest.approx(50 / 3)
    findings = run_findings(run, None)
    assert findings[0].startswith("iteration period 17 ms")
    assert findings[1].startswith("between iterations: 7.167 ms of every period (43%)")
    assert findings[1].endswith("flush_records 1.333 ms, next_batch 4.5 ms, other 1.333 ms")


def test_no_share_above_the_period_and_input_dist_shown_exposed(tmp_path):
    """One rank, iterations every 20 ms: a 10 ms window, then 10 ms between iterations. Pipelined:
    iteration i's input_dist is launched under iteration i-1's compute (1 ms in) and waited for 1 ms
    into iteration i: a 20 ms span, 9 ms of it hidden, 10 between iterations, 1 exposed."""
    spans, iters = [], {}
    for i in range(6):
        s0 = 100.0 + 20 * i
        spans.append(span(0, i, "input_dist", s0 - 19 if i else s0, s0 + 1, warmup=i == 0))
        for name, a, b in zip(STAGES[1:], (1, 2, 7, 8), (2, 7, 8, 10)):
            spans.append(span(0, i, name, s0 + a, s0 + b, warmup=i == 0))
        iters[(0, i)] = (s0, s0 + 10)
    run = load_run(write_run(tmp_path, "piped", spans, iters, world_size=1, warmup_iters=1))
    t = stage_stats(run, "job").set_index("stage")
    assert t.loc["input_dist", "mean_ms"] == pytest.approx(1.0) and t.loc["input_dist", "span_ms"] == pytest.approx(20.0)
    expected = {"input_dist": 0.05, "emb_fwd": 0.05, "dense_fwd_bwd": 0.25, "emb_bwd": 0.05, "dense_update": 0.1,
                "between_iterations": 0.5}
    assert t["share"].to_dict() == pytest.approx(expected)
    assert (t["share"] <= 1).all() and t["share"].sum() == pytest.approx(1.0)
    rows = {x.split()[0]: x.split() for x in format_summary(run).splitlines() if x.split()}
    assert rows["input_dist"][1] == "1.000" and rows["input_dist"][5:] == ["5.0%", "20.000"]
    assert rows["between_iterations"][5] == "50.0%"


def gapped(root, run_id, *, gap, engine="harness"):
    """Two ranks, iterations of 10 ms (stages of 1, 2, 4, 2, 1 ms) with `gap` ms between them."""
    spans, iters = [], {}
    for rank in (0, 1):
        sp, it = sequential(rank, range(6), lambda r, i, s: (1, 2, 4, 2, 1)[s], warmup_iters=1, gap=gap)
        spans += sp if engine == "harness" else [x for x in sp if x["stage"] == "dense_update"]
        iters.update(it)
    d = write_run(root, run_id, spans, iters, world_size=2, warmup_iters=1)
    if engine != "harness":
        cfg = RunManifest.from_json((d / "manifest.json").read_text()).config
        rewrite_manifest(d, config=cfg.replace(run=dataclasses.replace(cfg.run, engine=engine)))
    return d


def test_compare_judges_the_period(tmp_path, monkeypatch):
    from harness.report import plots

    base, cand = gapped(tmp_path, "slow", gap=10.0), gapped(tmp_path, "fast", gap=0.0)
    c = compare_runs({"slow": [load_run(base)], "fast": [load_run(cand)]})
    # The same timed window (10 ms) on both sides; the periods are 20 and 10 ms.
    assert c.iter_ms["mean"].tolist() == pytest.approx([10.0, 10.0])
    assert c.ratio == pytest.approx(0.5) and c.period_ms["mean"].tolist() == pytest.approx([20.0, 10.0])
    gap = c.stages.set_index("stage").loc["between_iterations"]
    assert gap["baseline_ms"] == pytest.approx(10.0) and gap["delta_ms"] == pytest.approx(-10.0)
    # A TorchRec-engine side: its own breakdown, the rest of its window not broken down.
    trec = gapped(tmp_path, "trec", gap=10.0, engine="torchrec")
    legends, save = [], plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: legends.append(
        [t.get_text() for lg in fig.legends for t in lg.get_texts()]) or save(fig, path))
    write_compare_report({"trec": [trec], "fast": [cand]}, tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    findings = md[md.index("## Findings"):md.index("## Setup")].splitlines()
    assert findings[2] == "- fast vs trec: iteration period 10 ms vs 20 ms, ratio 0.500 (95% CI 0.500-0.500): fast is faster"
    assert findings[3].startswith("- where the period changed: timed window (iter_ms) 10 ms -> 10 ms (+0 ms); "
                                  "between iterations 10 ms -> 0 ms (-10 ms)")
    assert "trec: not broken down" in md and "untimed / waiting" not in md
    (labels,) = legends
    assert "not broken down (the engine does not time these stages)" in labels and "between iterations" in labels
    assert not any("untimed" in x or "waiting" in x for x in labels)
    breakdown = pd.read_csv(tmp_path / "rep" / "compare_breakdown.csv").set_index("label")
    assert np.isnan(breakdown.loc["trec", "dense_fwd_bwd"]) and breakdown.loc["fast", "dense_fwd_bwd"] == 4.0
    assert breakdown.loc["trec", "between_iterations"] == pytest.approx(10.0)


def test_ablation_judges_the_period(tmp_path):
    runs = tmp_path / "runs"
    gapped(runs, "b1", gap=10.0)
    gapped(runs, "s1", gap=0.0)
    path = write_ablation(runs, "ab", [config("baseline", "baseline", None, ["b1"]),
                                       config("+skip_splits_a2a", "alone", "skip_splits_a2a", ["s1"],
                                              requested={"skip_splits_a2a": True})])
    t = ablation_table(load_ablation(path, runs)).set_index("config")
    assert t.loc["baseline", "period_ms"] == pytest.approx(20.0) and t.loc["+skip_splits_a2a", "period_ms"] == 10.0
    assert t.loc["+skip_splits_a2a", "speedup"] == pytest.approx(2.0)
    assert t.loc["+skip_splits_a2a", "iter_ms"] == pytest.approx(t.loc["baseline", "iter_ms"])
    assert report_main(ablation="ab", runs_root=runs, reports_root=tmp_path / "rep") == 0
    findings = (tmp_path / "rep" / "ablation-ab" / "report.md").read_text().split("## Setup")[0]
    assert "baseline iteration period 20 ms" in findings and "+skip_splits_a2a, 2.000x the baseline" in findings
