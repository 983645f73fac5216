"""Roofline: analytic work per stage (hand-computed for a toy config), achieved rates and fractions."""

import dataclasses

import pytest

from harness.names import STAGES
from harness.report.api import ReportError, load_run
from harness.report.roofline import dense_shape, roofline_table, stage_work
from harness.config import ModelConfig
from harness.records.manifest import RankInfo
from model.sharding import Shard, TablePlan, grid_shard, table_wise
from harness.records.manifest import RunManifest
from tests.report_builders import rewrite_manifest, sequential, write_run


def rank_info(rank, gemm, copy):
    return RankInfo(run_id="toy", rank=rank, node=0, host="h", pid=1, device="cpu", backend="gloo", threads=1,
                    gemm_gflops=gemm, copy_gbps=copy)

MODEL = ModelConfig(table_rows=(10, 20, 30), multi_hot=(2, 3, 1), num_dense=3, embedding_dim=4, bottom_mlp=(5, 4),
                    cross_layers=1, cross_rank=2, top_mlp=(6, 1))
# Stage durations (ms) of every rank: stage index -> ms.
MS = [1.0, 1.0, 2.0, 4.0, 0.5]


def uniq(rows, draws):
    """Expected distinct rows among `draws` ids drawn uniformly from `rows` rows (by hand: a row is
    missed by every draw with probability (1 - 1/rows)^draws)."""
    return rows * (1 - (1 - 1 / rows) ** draws)


def toy_run(root, *, ranks_info=True, optimizer="exact_adagrad", plan=(0, 1, 1), nodes=1, plans=None,
            id_exponent=0.0):
    """The toy model's run; its ids uniform (id_exponent 0) unless asked, so unique rows have a hand value."""
    spans, iters = [], {}
    for r in (0, 1):
        sp, it = sequential(r, range(3), lambda rank, i, s: MS[s], warmup_iters=1)
        spans += sp
        iters.update(it)
    manifest = {"model": MODEL, "embedding_optimizer": optimizer, "dense_flops_per_sample": 1206.0,
                "plan": plans or tuple(table_wise(r, 4, o) for r, o in zip(MODEL.table_rows, plan))}
    if ranks_info:
        # Peaks chosen so the dense stage of rank 0 runs at exactly half of each; rank 1 measured no copy rate.
        manifest["ranks"] = (rank_info(0, 4824 / 0.002 / 1e9 * 2, 7972 / 0.002 / 1e9 * 2),
                             rank_info(1, 1.0, float("nan")))
    d = write_run(root, "toy", spans, iters, world_size=2, nodes=nodes, samples=4, warmup_iters=1, manifest=manifest)
    cfg = RunManifest.from_json((d / "manifest.json").read_text()).config
    rewrite_manifest(d, config=cfg.replace(data=dataclasses.replace(cfg.data, id_exponent=id_exponent)))
    return load_run(d)


def test_dense_shape_by_hand():
    # P: bottom 3*5+5 + 5*4+4 = 44; cross 16*2 + 2*16 + 16 = 80; top 16*6+6 + 6+1 = 109.
    # MACs: 15 + 20 + 2*16*2 + 96 + 6 = 201, FLOPs = 6 * 201. A = 3 + 9 + 16 + (2 + 32) + 7.
    assert dense_shape(MODEL) == (233, 69, 1206)


def test_dense_shape_matches_the_model():
    torch = pytest.importorskip("torch")
    from model.dense import DenseArch, dense_flops_per_sample

    kw = dict(num_dense=13, embedding_dim=16, bottom_mlp=[32, 16], cross_layers=2, cross_rank=8, top_mlp=[32, 8, 1])
    arch = DenseArch(num_sparse=26, **kw)
    params, _, flops = dense_shape(ModelConfig(table_rows=(1,) * 26, multi_hot=(1,) * 26,
                                               **{k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()}))
    assert params == sum(p.numel() for p in arch.parameters())
    assert flops == dense_flops_per_sample(num_sparse=26, **kw)
    del torch


def test_stage_work_by_hand(tmp_path):
    w = stage_work(toy_run(tmp_path)).set_index(["rank", "stage"])
    # B=4, G=8, F=3, D=4; rank 0 owns table 0 (hotness 2): ids_in 16, 1 table; ids_out = 4*6 = 24.
    r0 = w.loc[0]
    assert r0.loc["input_dist", "flops"] == 0
    assert r0.loc["input_dist", "bytes"] == 8 * (24 + 12 + 16 + 8)
    assert r0.loc["emb_fwd", "flops"] == 4 * 16
    assert r0.loc["emb_fwd", "bytes"] == 256 + 128 + 128 + 4 * (32 + 48)
    assert r0.loc["dense_fwd_bwd", "flops"] == 1206 * 4
    assert r0.loc["dense_fwd_bwd", "bytes"] == 20 * 233 + 12 * 4 * 69
    # emb_bwd: the 16 ids' gradients summed (16*4 FLOPs) and read (4*16*4 bytes), but the weights and
    # Adagrad state of each distinct row once: u of the 10 rows touched by 16 uniform ids.
    u = uniq(10, 16)
    assert r0.loc["emb_bwd", "flops"] == pytest.approx(64 + 6 * 4 * u)
    assert r0.loc["emb_bwd", "bytes"] == pytest.approx(128 + 256 + 32 * u + 32 * u + 128 + 3 * 64)
    assert r0.loc["dense_update", "flops"] == 6 * 233
    assert r0.loc["dense_update", "bytes"] == 24 * 233
    # rank 1 owns tables 1 and 2 (hotness 3 + 1): ids_in 32, 2 tables.
    assert w.loc[(1, "emb_fwd"), "flops"] == 4 * 32
    assert w.loc[(1, "input_dist"), "bytes"] == 8 * (24 + 12 + 32 + 16)


def test_grid_table_by_hand(tmp_path):
    """Two nodes of one rank; table 1 (R 20, H 3) whole on rank 0, then as a grid of two 2-column
    blocks (rank 0 columns 0-1, rank 1 columns 2-3): the difference is the grid's work minus the
    table's, both by hand (tables 0 and 2 stay where they are)."""
    whole = stage_work(toy_run(tmp_path / "tw", nodes=2, plan=(0, 0, 1))).set_index(["rank", "stage"])
    plans = (table_wise(10, 4, 0), grid_shard(20, 4, [0, 1], 1), table_wise(30, 4, 1))
    grid = stage_work(toy_run(tmp_path / "grid", nodes=2, plans=plans)).set_index(["rank", "stage"])
    d = grid - whole
    # Whole on rank 0 (n = G*H = 24 ids, c 4): 96 FLOPs; bytes 4*n*c + 8*n + 4*G*c written and sent
    # = 384 + 192 + 128 + 128, and every rank receives 4*B*c = 64. A grid block (n 24, c 2): 48 FLOPs;
    # bytes 4*n*c + 8*n + 4*G*c partial sums + 4*G*c / L sent across = 192 + 192 + 64 + 64 (no ring in
    # a node of one), and every rank receives 4*B*c / L = 32 from each block.
    assert d.loc[(0, "emb_fwd"), "flops"] == 48 - 96 and d.loc[(1, "emb_fwd"), "flops"] == 48
    assert d.loc[(0, "emb_fwd"), "bytes"] == (512 + 64) - (832 + 64)
    assert d.loc[(1, "emb_fwd"), "bytes"] == (512 + 64) - 64


def test_rowwise_and_sgd_state(tmp_path):
    adagrad = stage_work(toy_run(tmp_path / "a")).set_index(["rank", "stage"])
    rowwise = stage_work(toy_run(tmp_path / "b", optimizer="exact_rowwise_adagrad")).set_index(["rank", "stage"])
    sgd = stage_work(toy_run(tmp_path / "c", optimizer="exact_sgd")).set_index(["rank", "stage"])
    # rank 0's 16 ids touch u distinct rows of 4: state per element (8*4u bytes), per row (8u), none.
    u = uniq(10, 16)
    assert adagrad.loc[(0, "emb_bwd"), "bytes"] - sgd.loc[(0, "emb_bwd"), "bytes"] == pytest.approx(8 * 4 * u)
    assert rowwise.loc[(0, "emb_bwd"), "bytes"] - sgd.loc[(0, "emb_bwd"), "bytes"] == pytest.approx(8 * u)
    assert sgd.loc[(0, "emb_bwd"), "flops"] == pytest.approx(64 + 2 * 4 * u)


def test_roofline_fractions(tmp_path):
    run = toy_run(tmp_path)
    per_rank = roofline_table(run, per_rank=True).set_index(["rank", "stage"])
    d0 = per_rank.loc[(0, "dense_fwd_bwd")]
    assert d0["mean_ms"] == pytest.approx(2.0)
    assert d0["achieved_gflops"] == pytest.approx(4824 / 0.002 / 1e9)
    assert d0["flops_frac"] == pytest.approx(0.5)
    assert d0["bytes_frac"] == pytest.approx(0.5)
    # Rank 1 measured no copy bandwidth: n/a, not zero.
    assert per_rank.loc[(1, "dense_fwd_bwd"), "copy_gbps"] != per_rank.loc[(1, "dense_fwd_bwd"), "copy_gbps"]
    assert per_rank.loc[(1, "emb_fwd"), "bound"] == "n/a"
    summary = roofline_table(run).set_index("stage")
    assert list(summary.index) == ["input_dist", "emb_fwd", "dense_fwd_bwd", "emb_bwd", "dense_update"]
    # Mean over ranks: emb_fwd work (64 + 128) / 2 FLOPs in 1 ms.
    assert summary.loc["emb_fwd", "gflop"] == pytest.approx(96 / 1e9)
    assert summary.loc["emb_fwd", "achieved_gflops"] == pytest.approx(96 / 1e-3 / 1e9)
    assert summary.loc["dense_fwd_bwd", "gemm_gflops"] == pytest.approx((4824 / 0.002 / 1e9 * 2 + 1.0) / 2)


def test_no_peaks_and_no_config(tmp_path):
    t = roofline_table(toy_run(tmp_path / "a", ranks_info=False))
    assert t["flops_frac"].isna().all() and t["bytes_frac"].isna().all()
    assert t["achieved_gflops"].notna().all()
    run = toy_run(tmp_path / "b")
    run.manifest = None  # records without a manifest (an nsys trace): the formulas have no config
    with pytest.raises(ReportError, match="roofline n/a: no manifest"):
        roofline_table(run)


def shard(rank, rows, cols):
    return Shard(rank=rank, row_start=rows[0], row_end=rows[1], col_start=cols[0], col_end=cols[1])


def test_shard_plan_kinds_by_hand(tmp_path):
    run = toy_run(tmp_path)
    # table 0 (R 10, H 2) column-wise 2+2 columns; table 1 (R 20, H 3) row-wise 10+10 rows;
    # table 2 (R 30, H 1) replicated.
    run.manifest = dataclasses.replace(run.manifest, plan=(
        TablePlan("column_wise", (shard(0, (0, 10), (0, 2)), shard(1, (0, 10), (2, 4)))),
        TablePlan("row_wise", (shard(0, (0, 10), (0, 4)), shard(1, (10, 20), (0, 4)))),
        TablePlan("data_parallel", (shard(0, (0, 30), (0, 4)), shard(1, (0, 30), (0, 4)))),
    ))
    w = stage_work(run).set_index(["rank", "stage"]).loc[0]
    # input_dist: column-wise, each shard: receive 8*G*(H+1) = 192 (own shard), send 8*B*(H+1) = 96 (both);
    # row-wise f = 1/2: receive 8*8*(1.5+1) = 160, send 8*4*2.5 = 80 to each of 2 shards; replicated: 0.
    assert w.loc["input_dist", "bytes"] == 192 + 2 * 96 + 160 + 2 * 80
    # emb_fwd: column-wise n = 16 ids x 2 columns: 32 FLOPs, 128 + 128 + 64 + 64 bytes, plus 4*B*2
    # received from each shard; row-wise n = 12 ids x 4: 48 FLOPs, 192 + 96 + 128 + ring 128;
    # replicated: 16 FLOPs, 64 + 32 + 64.
    assert w.loc["emb_fwd", "flops"] == 32 + 48 + 16
    assert w.loc["emb_fwd", "bytes"] == 384 + 2 * 32 + 544 + 160
    # emb_bwd: column-wise, 16 ids over all 10 rows touch u rows: 32 + 6*2u FLOPs; 64 + 128 + rows
    # 16u + state 16u + 128 bytes, plus 4*B*2 sent to each shard. Row-wise, the table's 24 ids over
    # its 20 rows touch v of the shard's 10: 48 + 6*4v FLOPs; ring 128 + 192 + 32v + state 32v + 96.
    # Replicated: 16 + 6*120 FLOPs, 64 + 480 + ring 480 + 20*120.
    u, v = uniq(10, 16), 10 * (1 - (1 - 1 / 20) ** 24)
    assert w.loc["emb_bwd", "flops"] == pytest.approx((32 + 12 * u) + (48 + 24 * v) + 736)
    assert w.loc["emb_bwd", "bytes"] == pytest.approx((320 + 32 * u) + 2 * 32 + (416 + 64 * v) + 3424)


def test_peaks_of_a_run_still_going_come_from_rank_notes(tmp_path):
    run = toy_run(tmp_path, ranks_info=False)
    d = tmp_path / "toy"
    for r, gemm in ((0, 10.0), (1, 30.0)):
        (d / f"rank{r:05d}" / "rank.json").write_text(rank_info(r, gemm, 5.0).to_json())
    run = load_run(d)
    assert [x.gemm_gflops for x in run.manifest.ranks] == [10.0, 30.0]
    t = roofline_table(run).set_index("stage")
    assert t.loc["dense_fwd_bwd", "gemm_gflops"] == pytest.approx(20.0)
    assert t.loc["emb_fwd", "copy_gbps"] == pytest.approx(5.0)


def test_roofline_of_a_real_tiny_run(tmp_path, capsys):
    """End to end: a real run's manifest (config, plan, rank peaks) feeds the roofline; the totals
    are checked against the preset and the model's own FLOP count, not the formulas under test."""
    from harness.cli import main
    from harness.presets import tiny
    from harness.report.tables import stage_stats
    from model.dense import dense_flops_per_sample

    runs = tmp_path / "runs"
    # Table-wise with two data-parallel tables: every stage moves bytes (an all-data-parallel
    # plan, which the planner picks for tiny on CPU, has no input dist).
    assert main(["bench", "--device", "cpu", "--preset", "tiny", "--iters", "3", "--warmup", "1", "--sharding",
                 "table_wise", "--shard", "5=data_parallel,7=data_parallel", "--runs-root", str(runs)]) == 0
    run = load_run(next(runs.iterdir()))
    m = tiny().model
    G, W = tiny().data.global_batch_size, run.manifest.world_size
    work = stage_work(run)
    # Sum pooling reads every id's row once, whatever the sharding: G * (ids a sample) * D FLOPs in all.
    assert work.loc[work["stage"] == "emb_fwd", "flops"].sum() == pytest.approx(G * sum(m.multi_hot) * m.embedding_dim)
    per_sample = dense_flops_per_sample(num_dense=m.num_dense, num_sparse=len(m.table_rows),
                                        embedding_dim=m.embedding_dim, bottom_mlp=list(m.bottom_mlp),
                                        cross_layers=m.cross_layers, cross_rank=m.cross_rank, top_mlp=list(m.top_mlp))
    dense = work[work["stage"] == "dense_fwd_bwd"]
    assert len(dense) == W and (dense["flops"] == per_sample * G // W).all()
    roof = roofline_table(run).set_index("stage")
    assert list(roof.index) == list(STAGES)
    # Peaks were measured by every rank, so every fraction is a finite positive number.
    assert (roof["gemm_gflops"] > 0).all() and (roof["copy_gbps"] > 0).all()
    assert (roof["bytes_frac"] > 0).all() and roof["bound"].isin(["compute", "memory"]).all()
    stats = stage_stats(run).set_index("stage")
    # The roofline's time is a stage's duration: for input_dist its whole span, beside its exposed part.
    times = stats["mean_ms"].where(stats["span_ms"].isna(), stats["span_ms"])
    assert roof["mean_ms"].to_numpy() == pytest.approx(times.loc[list(STAGES)].to_numpy())
