"""Tests for harness/report/api.py on small run folders built by hand.

Durations are chosen by hand so the expected numbers can be computed here
independently (numpy on the raw lists, or by hand), and warm-up rows carry huge
values so that counting them would visibly change every statistic.
"""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.report.api import (
    STAGES, ReportError, format_summary, iteration_summary, load_run, report_main,
    resolve_run, stage_stats,
)
from tests.report_builders import manifest_for

WARMUP = {0, 1}  # iterations 0 and 1 are warm-up in every hand-built run
WARMUP_MS = 1000.0

SAMPLES = 4  # local samples a rank an iteration
# iter_ms by rank, iterations 0..4; the first two are warm-up.
ITER_MS = {0: [500.0, 400.0, 10.0, 12.0, 14.0],
           1: [600.0, 450.0, 11.0, 11.0, 20.0]}
# Where each iteration starts (ms), on both ranks: the periods of the timed iterations 2 and 3 are
# 50 and 60 ms (4, the last, has none); the warm-up stages (5 x 1000 ms) end before the next start.
START_MS = [0, 10_000, 20_000, 20_050, 20_110]


def stage_ms(rank: int, iteration: int, s: int) -> float:
    """Hand-chosen, distinct per rank/iteration/stage; warm-up rows are huge."""
    if iteration in WARMUP:
        return WARMUP_MS
    return (s + 1) * (1 + rank) + 0.25 * iteration


def stage_rows(run_id, rank, iterations, stages=STAGES):
    rows = []
    for i in iterations:
        t = START_MS[i] * 1_000_000
        for s, name in enumerate(stages):
            d = stage_ms(rank, i, s)
            rows.append(dict(run_id=run_id, rank=rank, node=0, iteration=i, stage=name,
                             start_ns=t, end_ns=t + int(d * 1e6), duration_ms=d,
                             warmup=i in WARMUP))
            t += int(d * 1e6)
    return pd.DataFrame(rows)


def iteration_rows(run_id, rank, iterations):
    return pd.DataFrame([dict(run_id=run_id, rank=rank, node=0, iteration=i,
                              start_ns=START_MS[i] * 10**6, end_ns=START_MS[i] * 10**6 + int(ITER_MS[rank][i] * 1e6),
                              iter_ms=ITER_MS[rank][i], loss=0.7 - 0.01 * i, samples=SAMPLES,
                              warmup=i in WARMUP) for i in iterations])


def make_run(root: Path, run_id: str, *, start_time="2024-05-01T10:00:00+00:00",
             status="completed", error=None, rank1_iterations=range(5)) -> Path:
    """Two ranks, five iterations; rank 0 is split over two parquet parts."""
    d = root / run_id
    for r in (0, 1):
        (d / f"rank{r:05d}").mkdir(parents=True)
    manifest = manifest_for(run_id, world_size=2, status=status, error=error, start_time=start_time, samples=SAMPLES)
    (d / "manifest.json").write_text(manifest.to_json())
    r0 = d / "rank00000"
    stage_rows(run_id, 0, range(0, 3)).to_parquet(r0 / "stages-00000.parquet")
    stage_rows(run_id, 0, range(3, 5)).to_parquet(r0 / "stages-00001.parquet")
    iteration_rows(run_id, 0, range(0, 3)).to_parquet(r0 / "iterations-00000.parquet")
    iteration_rows(run_id, 0, range(3, 5)).to_parquet(r0 / "iterations-00001.parquet")
    r1 = d / "rank00001"
    stage_rows(run_id, 1, rank1_iterations).to_parquet(r1 / "stages-00000.parquet")
    iteration_rows(run_id, 1, rank1_iterations).to_parquet(r1 / "iterations-00000.parquet")
    return d


@pytest.fixture
def run_dir(tmp_path):
    return make_run(tmp_path / "runs", "r1")


def test_parts_of_all_ranks_are_concatenated(run_dir):
    run = load_run(run_dir)
    assert len(run.iterations) == 10  # 5 iterations x 2 ranks, rank 0 over two parts
    assert len(run.stages) == 10 * len(STAGES)
    assert sorted(run.stages.loc[run.stages["rank"] == 0, "iteration"].unique()) == [0, 1, 2, 3, 4]


def test_stage_stats_exclude_warmup(run_dir):
    table = stage_stats(load_run(run_dir))
    assert list(table["stage"]) == [*STAGES, "between_iterations"]
    assert list(table.columns) == ["run_id", "stage", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "count", "share",
                                   "span_ms"]
    for s, name in enumerate(STAGES):
        raw = [stage_ms(r, i, s) for r in (0, 1) for i in (2, 3, 4)]
        row = table[table["stage"] == name].iloc[0]
        assert row["count"] == 6
        assert row["mean_ms"] == pytest.approx(np.mean(raw))
        assert row["p50_ms"] == pytest.approx(np.percentile(raw, 50))
        assert row["p90_ms"] == pytest.approx(np.percentile(raw, 90))
    # One value by hand: input_dist non-warm-up = rank0 {1.5,1.75,2.0}, rank1 {2.5,2.75,3.0}.
    assert table.iloc[0]["mean_ms"] == pytest.approx(13.5 / 6)
    assert table["mean_ms"].max() < WARMUP_MS / 10


def test_stage_stats_keep_stage_order_and_only_present_stages(tmp_path):
    d = make_run(tmp_path, "r")
    for p in d.glob("rank*/stages-*.parquet"):
        df = pd.read_parquet(p)
        df[df["stage"] != "emb_fwd"].iloc[::-1].to_parquet(p)  # reversed, emb_fwd gone
    assert list(stage_stats(load_run(d))["stage"]) == [
        "input_dist", "dense_fwd_bwd", "emb_bwd", "dense_update", "between_iterations"]


def test_iteration_summary_uses_slowest_rank(run_dir):
    its = iteration_summary(load_run(run_dir))
    # Job iteration times = max over ranks of iterations 2..4: 11, 12, 20 ms.
    assert its["iterations"] == 3
    assert its["warmup_iterations"] == 2
    assert its["partial_iterations"] == 0
    assert its["iter_ms_mean"] == pytest.approx(43 / 3)
    assert its["iter_ms_p50"] == pytest.approx(12.0)
    assert its["iter_ms_p90"] == pytest.approx(18.4)  # 12 + 0.8 * (20 - 12)
    # The period: iterations 2 and 3 start 50 and 60 ms before the next; 4 is the last.
    assert its["periods"] == 2
    assert its["period_ms_mean"] == pytest.approx(55.0) and its["period_ms_p90"] == pytest.approx(59.0)
    # Gaps after the timed window, slowest rank: max(50-10, 50-11) = 40, max(60-12, 60-11) = 49.
    assert its["between_ms_mean"] == pytest.approx(44.5)
    # 2 iterations x 2 ranks x 4 samples = 16 samples in 110 ms of periods (the timed wall time).
    assert its["samples_per_s"] == pytest.approx(16 / 0.110)


def test_latest_is_greatest_start_time(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "b-old", start_time="2024-05-01T09:00:00+00:00")
    make_run(runs, "a-new", start_time="2024-05-01T10:00:00+00:00")
    # Later as a string but 09:30 UTC: must not be taken for the latest.
    make_run(runs, "c-mid", start_time="2024-05-01T11:30:00+02:00")
    (runs / "junk").mkdir()  # no manifest: ignored when ranking
    assert resolve_run(runs, "latest") == runs / "a-new"
    assert resolve_run(runs, "b-old") == runs / "b-old"


def test_unknown_run_lists_existing_ids_newest_last(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "zz", start_time="2024-01-01T00:00:00")
    make_run(runs, "aa", start_time="2024-02-01T00:00:00")
    with pytest.raises(ReportError) as e:
        resolve_run(runs, "nope")
    msg = str(e.value)
    assert "no run 'nope'" in msg and msg.endswith("runs there: zz, aa")
    assert "\n" not in msg
    with pytest.raises(ReportError):
        resolve_run(runs, "..")


@pytest.mark.parametrize("create", [True, False])
def test_no_runs_says_how_to_make_one(tmp_path, create):
    runs = tmp_path / "runs"
    if create:
        runs.mkdir()
    with pytest.raises(ReportError, match="make bench"):
        resolve_run(runs, "latest")
    with pytest.raises(ReportError, match="none.*make bench"):
        resolve_run(runs, "x")


def test_missing_manifest(tmp_path):
    (tmp_path / "r").mkdir()
    with pytest.raises(ReportError, match="manifest.json"):
        load_run(tmp_path / "r")


def test_unknown_stage_name_is_an_error(tmp_path):
    d = make_run(tmp_path, "r")
    stage_rows("r", 1, [2], stages=["emb_lookup"]).to_parquet(d / "rank00001" / "stages-00001.parquet")
    with pytest.raises(ReportError, match="emb_lookup"):
        load_run(d)


def test_failed_run_reports_what_was_written(tmp_path):
    # Rank 1 died before recording iteration 4: that iteration is excluded, not
    # timed by rank 0 alone.
    d = make_run(tmp_path, "bad", status="failed", error="Traceback ...\nRuntimeError: boom",
                 rank1_iterations=range(4))
    run = load_run(d)
    its = iteration_summary(run)
    assert its["iterations"] == 2 and its["partial_iterations"] == 1
    assert its["iter_ms_mean"] == pytest.approx(11.5)
    # Iteration 3 has no period on rank 1 (no record of 4): only iteration 2's, 50 ms.
    assert its["periods"] == 1 and its["period_ms_mean"] == pytest.approx(50.0)
    text = format_summary(run)
    assert "FAILED" in text and "RuntimeError: boom" in text
    assert "1 not recorded by every rank" in text
    assert stage_stats(run).loc[0, "count"] == 5  # stage records are still all used


def test_running_run_is_flagged_incomplete(tmp_path):
    run = load_run(make_run(tmp_path, "r", status="running"))
    assert "DID NOT FINISH (status running" in format_summary(run)
    assert "DID NOT FINISH" not in format_summary(load_run(make_run(tmp_path, "ok")))


def test_only_warmup_is_an_error(tmp_path):
    d = tmp_path / "w"
    (d / "rank00000").mkdir(parents=True)
    (d / "manifest.json").write_text(manifest_for("w", world_size=1, status="running").to_json())
    stage_rows("w", 0, [0, 1]).to_parquet(d / "rank00000" / "stages-00000.parquet")
    iteration_rows("w", 0, [0, 1]).to_parquet(d / "rank00000" / "iterations-00000.parquet")
    run = load_run(d)
    with pytest.raises(ReportError, match="no non-warm-up"):
        format_summary(run)
    empty = tmp_path / "e"
    empty.mkdir()
    (empty / "manifest.json").write_text(manifest_for("e", world_size=1, status="running").to_json())
    with pytest.raises(ReportError, match="no non-warm-up"):
        format_summary(load_run(empty))


def test_format_summary_contents(run_dir):
    text = format_summary(load_run(run_dir))
    assert "r1" in text and "tiny" in text and "cpu" in text
    assert "world size 2 (1 node(s) x 2 per node)" in text
    assert "3 counted, 2 warm-up excluded" in text
    assert all(s in text for s in STAGES)
    assert "iteration: period mean 55.000  p50 55.000  p90 59.000  samples_per_s 145.5" in text
    assert "(timed window iter_ms mean 14.333" in text


def test_report_main_success(tmp_path, capsys):
    make_run(tmp_path / "runs", "r1")
    assert report_main("latest", tmp_path / "runs", tmp_path / "reports") == 0
    out = capsys.readouterr().out
    assert "dense_update" in out and str(tmp_path / "reports" / "r1" / "report.md") in out
    # One report: no second summary beside it.
    files = {p.name for p in (tmp_path / "reports" / "r1").iterdir()}
    assert "report.md" in files and "report.html" in files
    assert not files & {"summary.md", "summary.csv"}
    md = (tmp_path / "reports" / "r1" / "report.md").read_text()
    # Findings come first; job periods 50, 60 ms -> mean 55; 16 samples in 110 ms; the timed
    # windows (11, 12, 20 ms) beside it.
    assert md.index("## Findings") < md.index("## Iterations")
    assert "iteration period 55 ms" in md and "145 samples/s" in md and "timed window (iter_ms) 14.33 ms" in md


def test_report_main_unknown_run(tmp_path, capsys):
    make_run(tmp_path / "runs", "r1")
    assert report_main("nope", tmp_path / "runs", tmp_path / "reports") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("report: error: no run 'nope'")
    assert "r1" in lines[0]
    assert not (tmp_path / "reports").exists()
