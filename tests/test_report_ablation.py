"""Ablation report: bootstrap CIs, per-config rows, marginal contributions, inactive flags, outputs."""

import numpy as np
import pandas as pd
import pytest

from harness.report.api import ReportError, report_main
from harness.report.ablation import (
    ablation_table, bootstrap_mean_ci, config_stage_means, flag_contributions, load_ablation, resolve_ablation,
)
from tests.report_builders import config, iter_run, write_ablation

REASON = "CUDA only: this run is on cpu"
# Run id -> per-rank non-warm-up iteration periods (rank 0, rank 1). Job period = max over ranks.
# Iterations run back to back, so each is its period; every run ends with one more iteration of
# CLOSE ms, which starts the last listed one's successor and, the last of its run, has no period.
CLOSE = 10.0
RUNS = {
    "b1": ([10, 12, 11], [9, 13, 10]),        # job 10, 13, 11 -> 34/3
    "b2": ([11, 11, 11], [10, 10, 10]),       # 11
    "b3": ([12, 10, 14, 12], [11, 9, 13, 11]),  # 12
    "c1": ([11.5, 11.5], [11, 11]),           # 11.5 (cuda_graphs requested, inactive)
    "s1": ([8, 9, 10], [7, 8, 9]),            # 9
    "s2": ([9, 10, 9.5], [8, 9, 8.5]),        # 9.5
    "s3": ([10, 10, 10], [9, 9, 9]),          # 10
    "a1": ([8, 8, 8], [7, 7, 7]),             # 8
    "a2": ([8.5, 8.5, 8.5], [8, 8, 8]),       # 8.5
    "a3": ([9, 9, 9], [8, 8, 8]),             # 9
    "ac1": ([8.4, 8.6], [8, 8]),              # 8.5: all minus cuda_graphs
    "as1": ([11, 11.5], [10, 10]),            # 11.25: all minus skip_splits_a2a
}
BASE = np.mean([34 / 3, 11, 12])


def build(runs_root, *, missing=False):
    for run_id, (r0, r1) in RUNS.items():
        iter_run(runs_root, run_id, {0: [*r0, CLOSE], 1: [*r1, CLOSE]}, warmup=[100.0])
    off = {"cuda_graphs": False, "skip_splits_a2a": False}
    cg = {"cuda_graphs": REASON}
    configs = [
        config("baseline", "baseline", None, ["b1", "b2", "b3"], requested=off),
        config("+cuda_graphs", "alone", "cuda_graphs", ["c1"], requested={**off, "cuda_graphs": True},
               all_inactive=True, reasons=cg),
        config("+skip_splits_a2a", "alone", "skip_splits_a2a", ["s1", "s2", "s3", *(["ghost"] if missing else [])],
               requested={**off, "skip_splits_a2a": True}),
        config("all", "all", None, ["a1", "a2", "a3"], requested={"cuda_graphs": True, "skip_splits_a2a": True},
               reasons=cg),
        {**config("all-cuda_graphs", "all_but", "cuda_graphs", ["ac1"], requested={**off, "skip_splits_a2a": True}),
         "failed_runs": ["crashed1"]},
        config("all-skip_splits_a2a", "all_but", "skip_splits_a2a", ["as1"],
               requested={**off, "cuda_graphs": True}, all_inactive=True, reasons=cg),
    ]
    return write_ablation(runs_root, "ab1", configs)


@pytest.fixture(scope="module")
def ab(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return load_ablation(build(root, missing=True), root)


@pytest.fixture(scope="module")
def table(ab):
    return ablation_table(ab)


def test_bootstrap_point_is_the_mean_of_group_means():
    point, lo, hi, boot = bootstrap_mean_ci([np.array([1.0, 2, 3]), np.array([10.0, 20])])
    assert point == pytest.approx((2 + 15) / 2)
    assert lo <= point <= hi and len(boot) == 2000
    again = bootstrap_mean_ci([np.array([1.0, 2, 3]), np.array([10.0, 20])])
    assert (again[1], again[2]) == (lo, hi)  # seeded: reports are reproducible


def test_bootstrap_ci_contains_the_true_mean_and_shrinks():
    rng = np.random.default_rng(7)
    small = [rng.normal(50, 5, 20) for _ in range(4)]
    large = [rng.normal(50, 5, 500) for _ in range(4)]
    _, lo_s, hi_s, _ = bootstrap_mean_ci(small)
    _, lo_l, hi_l, _ = bootstrap_mean_ci(large)
    assert lo_s < 50 < hi_s and lo_l < 50 < hi_l
    assert (hi_l - lo_l) < (hi_s - lo_s) / 3  # 25x the data: about 1/5 the width
    hits = 0
    for k in range(40):
        groups = [rng.normal(50, 5, 30) for _ in range(5)]
        _, lo, hi, _ = bootstrap_mean_ci(groups, n_boot=1000, rng=np.random.default_rng(k))
        hits += lo < 50 < hi
    assert hits >= 32  # nominal 95%; a percentile bootstrap of 5 groups runs a little narrow


def test_bootstrap_resamples_runs_too():
    # Runs that differ a lot but are flat inside: all the spread comes from resampling runs.
    groups = [np.full(50, 10.0), np.full(50, 20.0), np.full(50, 30.0)]
    _, lo, hi, _ = bootstrap_mean_ci(groups)
    assert lo < 17 and hi > 23


def test_config_rows(table):
    t = table.set_index("config")
    assert list(table["config"]) == ["baseline", "+cuda_graphs", "+skip_splits_a2a", "all", "all-cuda_graphs",
                                     "all-skip_splits_a2a"]
    assert t.loc["baseline", "period_ms"] == pytest.approx(BASE)
    assert t.loc["baseline", "runs"] == 3 and t.loc["baseline", "iterations"] == 10
    assert t.loc["+skip_splits_a2a", "period_ms"] == pytest.approx(9.5)
    assert t.loc["all", "period_ms"] == pytest.approx(8.5)
    for name, row in t.iterrows():
        assert row["ci_low"] <= row["period_ms"] <= row["ci_high"], name
    # The timed window of the same iterations: back to back, the same figure.
    assert t.loc["all", "iter_ms"] == pytest.approx(8.5)
    assert t.loc["+skip_splits_a2a", "speedup"] == pytest.approx(BASE / 9.5)
    assert t.loc["all", "speedup"] == pytest.approx(BASE / 8.5)
    assert t.loc["all", "speedup_low"] <= BASE / 8.5 <= t.loc["all", "speedup_high"]
    assert pd.isna(t.loc["baseline", "speedup"])
    # All requested flags inactive: measured, but no speedup claimed, and the reason shown.
    assert pd.isna(t.loc["+cuda_graphs", "speedup"]) and REASON in t.loc["+cuda_graphs", "note"]
    assert t.loc["+cuda_graphs", "period_ms"] == pytest.approx(11.5)
    assert "1 repeat" in t.loc["+cuda_graphs", "note"]
    assert "run ghost unreadable" in t.loc["+skip_splits_a2a", "note"]
    assert "failed run(s) left out: crashed1" in t.loc["all-cuda_graphs", "note"]


def test_flag_contributions(ab, table):
    c = flag_contributions(ab, table).set_index("flag")
    assert c.loc["skip_splits_a2a", "alone_ms"] == pytest.approx(BASE - 9.5)
    assert c.loc["skip_splits_a2a", "alone_pct"] == pytest.approx(100 * (BASE - 9.5) / BASE)
    assert c.loc["skip_splits_a2a", "removal_ms"] == pytest.approx(11.25 - 8.5)
    assert c.loc["skip_splits_a2a", "alone_low"] <= BASE - 9.5 <= c.loc["skip_splits_a2a", "alone_high"]
    assert c.loc["skip_splits_a2a", "note_alone"] == "" and c.loc["skip_splits_a2a", "note_removal"] == ""
    assert pd.isna(c.loc["cuda_graphs", "alone_ms"]) and pd.isna(c.loc["cuda_graphs", "removal_ms"])
    assert c.loc["cuda_graphs", "note_alone"] == f"n/a: {REASON}"
    assert c.loc["cuda_graphs", "note_removal"] == f"n/a: {REASON}"


def test_config_stage_means(ab):
    wide = config_stage_means(ab)
    # Stages split each iteration in five equal parts; over the iterations with a period (the
    # closing one has none), the baseline's mean a rank over its runs, each run weighing the same:
    b = np.mean([np.mean([x for rank in RUNS[r] for x in rank]) for r in ("b1", "b2", "b3")])
    assert wide.loc["baseline", "emb_fwd"] == pytest.approx(b / 5)
    assert (wide["between_iterations"] == 0).all()
    assert wide.loc["baseline", "period_ms"] == pytest.approx(b)
    assert list(wide.index)[:2] == ["baseline", "+cuda_graphs"]


def test_report_main_ablation_writes_everything(tmp_path, capsys):
    runs = tmp_path / "runs"
    build(runs)
    assert report_main(ablation="latest", runs_root=runs, reports_root=tmp_path / "rep") == 0
    out = tmp_path / "rep" / "ablation-ab1"
    for name in ("report.md", "report.html", "ablation.csv", "contributions.csv", "stages_by_config.csv",
                 "waterfall.png", "stage_bars.png"):
        assert (out / name).is_file(), name
    md = (out / "report.md").read_text()
    assert "# Ablation ab1" in md and REASON in md and "n/a" in md
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2 and "<table>" in html
    csv = pd.read_csv(out / "ablation.csv")
    assert csv.loc[csv["config"] == "all", "period_ms"].iloc[0] == pytest.approx(8.5)
    printed = capsys.readouterr().out
    assert "ablation ab1" in printed and str(out / "report.html") in printed


def test_empty_or_unreadable_ablations_are_one_line_errors(tmp_path, capsys):
    runs = tmp_path / "runs"
    write_ablation(runs, "empty", [])
    assert report_main(ablation="empty", runs_root=runs, reports_root=tmp_path / "rep") == 2
    write_ablation(runs, "ghosts", [config("baseline", "baseline", None, ["nope1"])])
    assert report_main(ablation="ghosts", runs_root=runs, reports_root=tmp_path / "rep") == 2
    assert report_main(ablation="missing", runs_root=runs, reports_root=tmp_path / "rep") == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3
    assert "lists no configs" in err[0] and "none of its configs has a readable run" in err[1]
    assert "no ablation 'missing'" in err[2] and "empty" in err[2]
    assert not (tmp_path / "rep").exists()
    with pytest.raises(ReportError, match="no ablations"):
        resolve_ablation(tmp_path / "elsewhere", "latest")


def test_ablation_findings_first_and_the_final_loss_check(tmp_path):
    runs = tmp_path / "runs"
    build(runs)
    # One run of "all" ends on another loss: the report must say that a flag changed the math.
    part = runs / "a1" / "rank00000" / "iterations-00000.parquet"
    its = pd.read_parquet(part)
    its.loc[its["iteration"] == its["iteration"].max(), "loss"] = 0.51
    its.to_parquet(part)
    assert report_main(ablation="ab1", runs_root=runs, reports_root=tmp_path / "rep") == 0
    out = tmp_path / "rep" / "ablation-ab1"
    md = (out / "report.md").read_text()
    findings = md[md.index("## Findings"):md.index("## Setup")]
    assert md.index("## Findings") < md.index("## Configs")
    assert f"baseline iteration period {BASE:.4g} ms" in findings
    assert f"fastest config: all, {BASE / 8.5:.3f}x the baseline" in findings
    assert f"biggest flag effect: skip_splits_a2a alone saves {BASE - 9.5:.4g} ms an iteration" in findings
    assert f"cuda_graphs: {REASON}" in findings
    assert "final loss differs from the baseline's in: all" in findings
    loss = pd.read_csv(out / "final_loss.csv").set_index("config")
    assert loss.loc["all", "final_loss"] == pytest.approx(0.51) and loss.loc["baseline", "final_loss"] == 0.5
    assert not loss.loc["all", "equals_baseline"] and loss.loc["+skip_splits_a2a", "equals_baseline"]


def test_a_config_given_another_configs_runs_reports_their_period_and_says_whose(tmp_path):
    """make ablation gives a config that resolves as an earlier one that config's runs (same_as):
    its row is their period (hand value: the skip runs' 9, 9.5 and 10, mean 9.5) and says so."""
    for run_id in ("s1", "s2", "s3"):
        r0, r1 = RUNS[run_id]
        iter_run(tmp_path, run_id, {0: [*r0, CLOSE], 1: [*r1, CLOSE]}, warmup=[100.0])
    skip = {"cuda_graphs": False, "skip_splits_a2a": True}
    configs = [config("+skip_splits_a2a", "alone", "skip_splits_a2a", ["s1", "s2", "s3"], requested=skip),
               {**config("all", "all", None, ["s1", "s2", "s3"], requested={**skip, "cuda_graphs": True},
                         reasons={"cuda_graphs": REASON}), "same_as": "+skip_splits_a2a"}]
    t = ablation_table(load_ablation(write_ablation(tmp_path, "ab-same", configs), tmp_path)).set_index("config")
    assert t.loc["all", "period_ms"] == pytest.approx(9.5) == t.loc["+skip_splits_a2a", "period_ms"]
    assert "the runs of +skip_splits_a2a: it resolves to the same effective flags here" in t.loc["all", "note"]
    assert "the runs of" not in t.loc["+skip_splits_a2a", "note"]
