"""Reports that are true on a GPU (issue 43, item 5): a figure above its measured peak is a probe
defect said in words, never an efficiency; emb_bwd counts the distinct rows fbgemm's fused
backward updates; one rank says that nothing crossed a link. Hand-built runs, hand values."""

import re

import numpy as np
import pandas as pd
import pytest

from harness.records.manifest import RankInfo
from harness.report.api import format_summary, load_run, report_main
from harness.report.findings import run_findings
from harness.report.roofline import roofline_table
from harness.report.tables import rank_table
from harness.names import STAGES
from tests.report_builders import sequential, write_run

MS = (0.5, 0.5, 4.0, 0.5, 0.5)  # dense_fwd_bwd dominates
PCT = re.compile(r"(\d+(?:\.\d+)?)%")


def probe_run(root, *, gemm_gflops):
    """One rank, 4 samples an iteration, dense_fwd_bwd 4 ms at 1000 FLOP a sample: the dense step
    runs at 4000 / 0.004 = 1e6 FLOP/s = 0.001 GFLOP/s."""
    sp, it = sequential(0, range(4), lambda r, i, s: MS[s], warmup_iters=1)
    note = RankInfo(run_id="p", rank=0, node=0, host="h", pid=1, device="cuda", backend="nccl", threads=1,
                    gemm_gflops=gemm_gflops, copy_gbps=1e6)
    return write_run(root, "p", sp, it, world_size=1, samples=4, warmup_iters=1,
                     manifest={"ranks": (note,), "dense_flops_per_sample": 1000.0})


def test_a_figure_above_its_probe_is_a_probe_defect(tmp_path):
    # The probe measured half of what the dense step ran at: a 200% "efficiency" is a wrong probe.
    run = load_run(probe_run(tmp_path, gemm_gflops=0.0005))
    ranks = rank_table(run)
    assert ranks.loc[0, "dense_gflops"] == pytest.approx(0.001)
    assert np.isnan(ranks.loc[0, "dense_vs_gemm"])
    assert ranks.loc[0, "peak_note"].startswith("the dense step ran at 0.001 GFLOP/s, above the GEMM probe's "
                                                 "0.0005 GFLOP/s: the probe under-measures this device's peak")
    assert ranks.loc[0, "peak_note"].endswith("no efficiency stated")
    roof = roofline_table(run).set_index("stage")
    assert np.isnan(roof.loc["dense_fwd_bwd", "flops_frac"])
    assert "dense_fwd_bwd ran at" in roof.loc["dense_fwd_bwd", "peak_note"]
    assert (roof["flops_frac"].dropna() <= 1).all() and (roof["bytes_frac"].dropna() <= 1).all()
    dominant = next(x for x in run_findings(run, roofline_table(run)) if x.startswith("dominant stage"))
    assert "above the GEMM probe" in dominant and "no efficiency stated" in dominant
    assert "% of the measured GEMM" not in dominant
    text = format_summary(run)
    assert "rank 0: the dense step ran at" in text
    assert max(float(x) for x in PCT.findall(text)) <= 100
    assert report_main(run="p", runs_root=tmp_path, reports_root=tmp_path / "rep") == 0
    md = (tmp_path / "rep" / "p" / "report.md").read_text()
    assert max(float(x) for x in PCT.findall(md)) <= 100
    assert "- dense_fwd_bwd ran at" in md  # the roofline's note, under its table
    csv = pd.read_csv(tmp_path / "rep" / "p" / "roofline.csv")
    assert (csv[["flops_frac", "bytes_frac"]].fillna(0) <= 1).all().all()


def test_a_figure_within_its_probe_is_an_efficiency(tmp_path):
    run = load_run(probe_run(tmp_path, gemm_gflops=0.004))
    assert rank_table(run).loc[0, "dense_vs_gemm"] == pytest.approx(0.25)
    assert "peak_note" not in rank_table(run)
    roof = roofline_table(run).set_index("stage")
    assert roof.loc["dense_fwd_bwd", "flops_frac"] == pytest.approx(0.25) and roof.loc["dense_fwd_bwd", "peak_note"] == ""
    dominant = next(x for x in run_findings(run, roofline_table(run)) if x.startswith("dominant stage"))
    assert "compute-bound, at 25.0% of the measured GEMM FLOP/s" in dominant


def test_one_rank_says_nothing_crossed_a_link(tmp_path):
    sp, it = sequential(0, range(4), lambda r, i, s: MS[s], warmup_iters=1)
    d = write_run(tmp_path / "runs", "one", sp, it, world_size=1, warmup_iters=1)
    part = d / "rank00000" / "stages-00000.parquet"
    st = pd.read_parquet(part)
    st["sent_bytes"], st["recv_bytes"] = 0, 0  # what a rank alone records: zero bytes each stage
    st.to_parquet(part)
    assert report_main(run="one", runs_root=tmp_path / "runs", reports_root=tmp_path / "rep") == 0
    out = tmp_path / "rep" / "one"
    md = (out / "report.md").read_text()
    assert "One rank: nothing crossed a link" in md and "One rank: there is no other rank to straggle against" in md
    assert "| sent_mb |" not in md and "| gap_ms |" not in md
    assert not (out / "bytes_moved.csv").exists() and not (out / "stragglers.csv").exists()


def test_unique_rows_by_hand():
    from harness.report.roofline import unique_rows

    # Uniform ids: a row is missed by all n draws with probability (1 - 1/R)^n.
    assert unique_rows(16, 10, (0, 10), 0.0) == pytest.approx(10 * (1 - 0.9 ** 16))
    # A block of a row-wise table: its rows' share of the draws.
    assert unique_rows(24, 20, (10, 20), 0.0) == pytest.approx(10 * (1 - 0.95 ** 24))
    # Ids from files: the law is unknown, the upper bound min(draws, rows).
    assert unique_rows(16, 10, (0, 10), None) == 10 and unique_rows(6, 10, (0, 10), None) == 6


@pytest.mark.parametrize("rows, draws, exponent", [(1000, 5000, 1.05), (200_000, 100_000, 1.05), (5000, 3000, 1.0)])
def test_unique_rows_matches_the_synthetic_data(rows, draws, exponent):
    """Against the data's own generator (harness/data/synthetic.py): the mean distinct count of
    many draws of `draws` ids (the binned tail past 65,536 rows included)."""
    pytest.importorskip("torch")
    from harness.data.synthetic import power_law_ids
    from harness.report.roofline import unique_rows

    rng = np.random.default_rng(3)
    counts = [len(np.unique(power_law_ids(rng.random(draws), rows, exponent))) for _ in range(40)]
    assert unique_rows(draws, rows, (0, rows), exponent) == pytest.approx(np.mean(counts), rel=0.01)


def test_emb_bwd_counts_each_distinct_row_once(tmp_path):
    """Hot ids repeat: with 1000 ids a table over 10 rows, fbgemm updates at most 10 rows, and the
    analytic bytes must not count the weights and state of 1000."""
    from harness.config import ModelConfig

    model = ModelConfig(table_rows=(10,), multi_hot=(250,), num_dense=3, embedding_dim=4, bottom_mlp=(5, 4),
                        cross_layers=1, cross_rank=2, top_mlp=(6, 1))
    sp, it = sequential(0, range(3), lambda r, i, s: 1.0, warmup_iters=1)
    run = load_run(write_run(tmp_path, "hot", sp, it, world_size=1, samples=4, warmup_iters=1,
                             manifest={"model": model}))
    bwd = roofline_table(run).set_index("stage").loc["emb_bwd"]
    # 4 samples x 250 ids = 1000 ids, c = 4 columns: gradients received 4*4*4 = 64 and sent 64 (the
    # one rank is both sides), read per id 4*1000*4 = 16,000, ids 8,000; at most 10 rows: weights
    # read and written 8*10*4 = 320, Adagrad state 320. Counted per id, those two would be 32,000 each.
    assert bwd["mb"] * 1e6 <= 128 + 16_000 + 8_000 + 320 + 320 + 1e-6
    assert bwd["mb"] * 1e6 > 128 + 16_000 + 8_000
    assert list(roofline_table(run)["stage"]) == list(STAGES)
