"""Two runs side by side: ratios and deltas against hand-computed values, absent stages, errors."""

import numpy as np
import pandas as pd
import pytest

from harness.report.api import ReportError, load_run, report_main, write_compare_report
from harness.report.compare import compare_runs
from harness.names import STAGES
from tests.report_builders import iter_run, sequential, write_run


def test_ratio_and_stage_deltas_by_hand(tmp_path):
    # Back to back, an iteration's period is its time; the last (7 and 3 ms) has none. Job period =
    # slowest rank: baseline 10, 12 -> mean 11; candidate 5, 6 -> 5.5.
    base = iter_run(tmp_path, "base", {0: [10.0, 12.0, 7.0], 1: [9.0, 11.0, 7.0]}, warmup=[100.0])
    cand = iter_run(tmp_path, "cand", {0: [5.0, 6.0, 3.0], 1: [4.0, 4.0, 3.0]}, warmup=[100.0])
    c = compare_runs({"base": [load_run(base)], "cand": [load_run(cand)]})
    assert c.labels == ("base", "cand")
    per = c.period_ms.set_index("label")
    assert per.loc["base", "mean"] == pytest.approx(11.0) and per.loc["cand", "mean"] == pytest.approx(5.5)
    assert per.loc["base", "iterations"] == 2 and per.loc["cand", "runs"] == 1
    assert c.ratio == pytest.approx(0.5)
    assert c.ratio_ci[0] <= 0.5 <= c.ratio_ci[1]
    # The timed window of the same iterations: here the whole period.
    assert c.iter_ms.set_index("label").loc["cand", "mean"] == pytest.approx(5.5)
    # Every stage is a fifth of each rank's iteration; a stage's ms is the mean over ranks and iterations.
    st = c.stages.set_index("stage")
    assert list(st.index) == [*STAGES, "between_iterations"]
    assert st.loc["emb_fwd", "baseline_ms"] == pytest.approx(np.mean([10, 12, 7, 9, 11, 7]) / 5)
    assert st.loc["emb_fwd", "candidate_ms"] == pytest.approx(np.mean([5, 6, 3, 4, 4, 3]) / 5)
    assert st.loc["emb_fwd", "delta_ms"] == pytest.approx((25 / 6 - 56 / 6) / 5)
    assert st.loc["emb_fwd", "ratio"] == pytest.approx(25 / 56)
    assert st.loc["between_iterations", "baseline_ms"] == 0 and st.loc["between_iterations", "candidate_ms"] == 0
    st = st.loc[list(STAGES)]
    assert (st["ratio_low"] <= st["ratio"]).all() and (st["ratio"] <= st["ratio_high"]).all()


def test_identical_runs_compare_as_one_with_a_ci_around_it(tmp_path):
    rng = np.random.default_rng(1)
    times = {0: list(10 + rng.random(30)), 1: list(10 + rng.random(30))}
    a, b = iter_run(tmp_path, "a", times), iter_run(tmp_path, "b", times)
    c = compare_runs({"a": [load_run(a)], "b": [load_run(b)]})
    assert c.ratio == pytest.approx(1.0)
    assert c.ratio_ci[0] < 1.0 < c.ratio_ci[1]  # independent resamples of the same data


def test_several_runs_a_label_weigh_the_same(tmp_path):
    runs = [load_run(iter_run(tmp_path, f"r{i}", {0: t})) for i, t in enumerate([[10.0] * 2, [20.0] * 8])]
    other = load_run(iter_run(tmp_path, "o", {0: [15.0, 15.0]}))
    c = compare_runs({"two": runs, "one": [other]})
    # Periods: the first run's one (10), the second's seven (20); pooled they would give 150 / 8.
    assert c.period_ms.set_index("label").loc["two", "mean"] == pytest.approx(15.0)
    assert c.ratio == pytest.approx(1.0)


def test_a_stage_one_side_did_not_record_is_absent_not_zero(tmp_path):
    sp, it = sequential(0, range(3), lambda r, i, s: 1.0)
    full = write_run(tmp_path, "full", sp, it, world_size=1)
    # A TorchRec-like run: no dense_update records, the same iteration times.
    partial = write_run(tmp_path, "partial", [s for s in sp if s["stage"] != "dense_update"], it, world_size=1)
    c = compare_runs({"full": [load_run(full)], "partial": [load_run(partial)]})
    assert "dense_update" not in set(c.stages["stage"])
    stages = c.stages[c.stages["stage"] != "between_iterations"]
    assert len(stages) == 4 and (stages["candidate_ms"] > 0).all()
    assert "between_iterations" in set(c.stages["stage"])  # from the iteration records: both sides have it
    out = tmp_path / "rep"
    write_compare_report({"full": [full], "partial": [partial]}, out)
    md = (out / "report.md").read_text()
    assert "stage dense_update recorded only by full: not compared" in md
    assert md.index("## Findings") < md.index("## Iteration period")


def test_write_compare_report_files_and_findings(tmp_path):
    base = iter_run(tmp_path, "base", {0: [10.0, 10.0, 10.0]})
    cand = iter_run(tmp_path, "cand", {0: [8.0, 8.0, 8.0]})
    c = write_compare_report({"base": [base], "cand": [cand]}, tmp_path / "rep")
    names = {p.name for p in (tmp_path / "rep").iterdir()}
    assert {"report.md", "report.html", "compare_iterations.csv", "compare_stages.csv", "stage_bars.png"} <= names
    csv = pd.read_csv(tmp_path / "rep" / "compare_stages.csv").set_index("stage")
    assert csv.loc["emb_bwd", "ratio"] == pytest.approx(0.8)
    md = (tmp_path / "rep" / "report.md").read_text()
    assert md.startswith("# Compare cand vs base\n\n## Findings")
    assert "cand vs base: iteration period 8 ms vs 10 ms, ratio 0.800 (95% CI 0.800-0.800): cand is faster" in md
    assert c.ratio == pytest.approx(0.8)


def test_make_report_run_a_comma_b(tmp_path, capsys):
    iter_run(tmp_path / "runs", "a", {0: [10.0, 10.0]})
    iter_run(tmp_path / "runs", "b", {0: [12.0, 12.0]})
    assert report_main("a,b", tmp_path / "runs", tmp_path / "rep") == 0
    assert "ratio 1.200" in capsys.readouterr().out
    assert (tmp_path / "rep" / "compare-a-vs-b" / "report.html").is_file()
    assert report_main("a,a", tmp_path / "runs", tmp_path / "rep") == 2
    assert report_main("a,b,c", tmp_path / "runs", tmp_path / "rep") == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "same run twice" in err[0] and "two separated by a comma" in err[1]


def test_comparison_needs_two_labels_with_runs(tmp_path):
    run = load_run(iter_run(tmp_path, "a", {0: [10.0]}))
    with pytest.raises(ReportError, match="exactly two labels"):
        compare_runs({"a": [run]})
    with pytest.raises(ReportError, match="label 'b' has no runs"):
        compare_runs({"a": [run], "b": []})


def test_a_precision_that_changes_the_numbers_is_a_finding(tmp_path):
    import dataclasses

    from harness.records.manifest import PrecisionEntry, RunManifest

    base = iter_run(tmp_path, "base", {0: [10.0, 10.0]})
    cand = iter_run(tmp_path, "cand", {0: [6.0, 6.0]})
    path = cand / "manifest.json"
    m = RunManifest.from_json(path.read_text())
    bf16 = PrecisionEntry(dense="bf16", numerics_changed=True, note="by design")
    path.write_text(dataclasses.replace(m, optimizations=dataclasses.replace(m.optimizations, precision=bf16)).to_json())
    write_compare_report({"base": [base], "cand": [cand]}, tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    findings = md[md.index("## Findings"):md.index("## Setup")]
    assert "- cand: dense precision bf16: by design" in findings and "- base:" not in findings
