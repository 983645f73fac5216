"""The bytes each collective moves, as the records hold them (issue 16, part 3): counted at each
launch (model/collective_bytes.py), checked against counts made here by hand from the plan."""

from __future__ import annotations

import pandas as pd
import pytest

from harness.cli import main
from harness.report.api import load_run, resolve_run
from model.collective_bytes import CollectiveBytes


def test_a_rank_counts_what_it_sends_and_receives_from_others_only():
    c = CollectiveBytes()
    c.all_to_all("pooled_fwd", send_splits=[3, 5, 7], recv_splits=[2, 4, 6], element_size=4, rank=1)
    c.ring("dense_grads", nbytes=300, world_size=3, passes=2)  # all-reduce: 2 (w-1)/w n each way
    c.ring("pooled_bwd", nbytes=300, world_size=3, passes=1)   # all-gather: (w-1)/w n
    c.ring("table_grads", nbytes=300, world_size=1, passes=2)  # alone: nothing moves
    assert c.take() == {"ids": (0, 0), "pooled_fwd": ((3 + 7) * 4, (2 + 6) * 4), "pooled_bwd": (200, 200),
                        "table_grads": (0, 0), "dense_grads": (400, 400)}
    assert c.take()["pooled_fwd"] == (0, 0)  # taken: counting starts again


@pytest.mark.parametrize("comm, fwd_bytes, bwd_bytes", [("fp32", 4, 4), ("bf16", 2, 2)])
def test_records_hold_the_bytes_of_every_exchange(tmp_path, comm, fwd_bytes, bwd_bytes):
    """tiny on 2 ranks, every table table-wise, splits exchanged every iteration: per rank and
    iteration, the pooled rows it sends its peer (forward) and gets back (backward), the ids
    (lengths and values, int64) and their splits, the dense gradients' all-reduce. With the
    pooled embeddings sent in fp16 or bf16 (their gradients then in bf16), those take 2 bytes a
    value: exactly half of fp32."""
    runs = tmp_path / "runs"
    assert main(["bench", "--preset", "tiny", "--iters", "3", "--warmup", "1", "--sharding", "table_wise",
                 "--no-skip-splits-a2a", "--comm-precision", comm, "--runs-root", str(runs)]) == 0
    run = load_run(resolve_run(runs, "latest"))
    cfg, plan = run.manifest.config, run.manifest.plan
    b, dim, hot = cfg.local_batch_size, cfg.model.embedding_dim, cfg.model.multi_hot
    from harness.run.rank import build_dense
    import torch

    dense_params = sum(p.numel() for p in build_dense(cfg, torch.device("cpu")).parameters())
    tables_of = {r: [t for t, tp in enumerate(plan) if tp.shards[0].rank == r] for r in (0, 1)}
    assert all(tp.kind == "table_wise" for tp in plan) and all(tables_of.values())
    expected = {}
    for r, peer in ((0, 1), (1, 0)):
        ids_to_peer = sum(b + b * hot[t] for t in tables_of[peer])  # lengths + values of the peer's tables
        ids_from_peer = sum(b + b * hot[t] for t in tables_of[r])
        expected[r] = {
            "input_dist": (8 * (ids_to_peer + 2), 8 * (ids_from_peer + 2)),  # + 2 split counts each way
            "emb_fwd": (fwd_bytes * b * dim * len(tables_of[r]), fwd_bytes * b * dim * len(tables_of[peer])),
            "emb_bwd": (bwd_bytes * b * dim * len(tables_of[peer]), bwd_bytes * b * dim * len(tables_of[r])),
            "dense_fwd_bwd": (4 * dense_params, 4 * dense_params),  # 2 (w - 1) / w = 1 at 2 ranks
            "dense_update": (0, 0),
        }
    st = run.stages[run.stages["iteration"] >= 1]  # iteration 0 also launches batch 1's ids exchange
    for (rank, stage), rows in st.groupby(["rank", "stage"]):
        last = rows[rows["iteration"] == rows["iteration"].max()]  # the last launches no next batch
        steady = rows[rows["iteration"] < rows["iteration"].max()]
        want = expected[rank][stage]
        if stage == "input_dist":
            assert (steady["sent_bytes"] == want[0]).all() and (steady["recv_bytes"] == want[1]).all(), (rank, steady)
            assert (last["sent_bytes"] == 0).all()
        else:
            assert (rows["sent_bytes"] == want[0]).all() and (rows["recv_bytes"] == want[1]).all(), (rank, stage, rows)
    its = run.iterations.set_index(["rank", "iteration"])
    by_it = run.stages.groupby(["rank", "iteration"])[["sent_bytes", "recv_bytes"]].sum()
    pd.testing.assert_frame_equal(its[["sent_bytes", "recv_bytes"]].sort_index(), by_it.sort_index(), check_names=False)


def test_the_report_table_averages_an_iteration_and_rates_over_the_stages_time():
    from harness.report.tables import bytes_moved_table

    stages = pd.DataFrame({
        "rank": [0, 0, 1, 1, 0], "iteration": [1, 1, 1, 1, 0], "warmup": [False, False, False, False, True],
        "stage": ["emb_fwd", "dense_update", "emb_fwd", "dense_update", "emb_fwd"],
        "sent_bytes": [2_000_000, 0, 4_000_000, 0, 9_000_000], "recv_bytes": [1_000_000, 0, 3_000_000, 0, 9_000_000],
        "duration_ms": [2.0, 1.0, 8.0, 1.0, 1.0],
    })
    t = bytes_moved_table(stages).set_index("stage")
    assert list(t.index) == ["emb_fwd", "dense_update"]  # stage order; the warm-up row left out
    assert t.loc["emb_fwd", "sent_mb"] == pytest.approx(3.0) and t.loc["emb_fwd", "recv_mb"] == pytest.approx(2.0)
    assert t.loc["emb_fwd", "achieved_gbps"] == pytest.approx(10e6 / 10e-3 / 1e9)  # 10 MB over 10 ms: 1 GB/s
    assert t.loc["dense_update", "achieved_gbps"] == 0
    assert bytes_moved_table(stages.drop(columns=["sent_bytes", "recv_bytes"])).empty  # older records


def test_row_wise_exchanges_move_half_the_bytes_at_16_bits(tmp_path):
    """2 nodes x 2 ranks, a row-wise and a table-row-wise table among table-wise ones, fp16 forward
    and (auto) bf16 backward: every pooled exchange (reduce-scatters, all-to-alls, all-gathers)
    moves exactly half the fp32 bytes, and nothing else changes."""
    comm = "fp16"
    moved = {}
    for c in ("fp32", comm):
        runs = tmp_path / c
        assert main(["bench", "--preset", "tiny", "--nodes", "2", "--gpus-per-node", "2", "--iters", "2",
                     "--warmup", "1", "--sharding", "table_wise", "--shard", "0=row_wise,20=table_row_wise",
                     "--comm-precision", c, "--runs-root", str(runs)]) == 0
        st = load_run(resolve_run(runs, "latest")).stages
        assert {"row_wise", "table_row_wise"} <= {tp.kind for tp in load_run(resolve_run(runs, "latest")).manifest.plan}
        moved[c] = st.groupby(["rank", "iteration", "stage"])[["sent_bytes", "recv_bytes"]].sum()
    for stage in ("emb_fwd", "emb_bwd"):
        full = moved["fp32"].xs(stage, level="stage")
        assert (full > 0).all().all()
        pd.testing.assert_frame_equal(moved[comm].xs(stage, level="stage") * 2, full)
    for stage in ("input_dist", "dense_fwd_bwd"):
        pd.testing.assert_frame_equal(moved[comm].xs(stage, level="stage"), moved["fp32"].xs(stage, level="stage"))


def _row_bytes(precision: str, width: int) -> int:
    """Bytes one row of `width` pooled values takes on the wire, by hand: 4 or 2 a value, or fp8's
    byte a value plus the row's fp32 scale."""
    return {"fp32": 4 * width, "bf16": 2 * width, "fp16": 2 * width, "fp8": width + 4}[precision]


def test_fp8_rows_move_at_most_30_percent_of_the_fp32_bytes(tmp_path):
    """tiny on 2 ranks, table-wise but table 0 row-wise, pooled embeddings and gradients in fp8:
    the records hold, per rank and iteration, a byte a value plus 4 bytes of scale a row in
    every pooled exchange: the all-to-alls (a row is a sample's values for all the tables one
    rank owns) and row-wise's exchanged partial sums and all-gathered gradients (a row is one
    table wide). Against the fp32 run's records: at most 30% in both directions, the ids and
    the dense gradients unchanged."""
    moved, runs_of = {}, {}
    for comm in ("fp32", "fp8"):
        runs = tmp_path / comm
        assert main(["bench", "--preset", "tiny", "--iters", "3", "--warmup", "1", "--sharding", "table_wise",
                     "--shard", "0=row_wise", "--comm-precision", comm, "--comm-precision-bwd", comm,
                     "--runs-root", str(runs)]) == 0
        runs_of[comm] = run = load_run(resolve_run(runs, "latest"))
        moved[comm] = run.stages.groupby(["rank", "iteration", "stage"])[["sent_bytes", "recv_bytes"]].sum()
    cfg, plan = runs_of["fp8"].manifest.config, runs_of["fp8"].manifest.plan
    b, dim = cfg.local_batch_size, cfg.model.embedding_dim
    assert plan[0].kind == "row_wise" and all(tp.kind == "table_wise" for tp in plan[1:])
    width = {r: dim * sum(tp.kind == "table_wise" and tp.shards[0].rank == r for tp in plan) for r in (0, 1)}
    for rank, peer in ((0, 1), (1, 0)):
        for comm in ("fp32", "fp8"):
            # 2 ranks: the row-wise reduce (or fp8's exchange of partial sums) and the all-gather
            # each move the peer's half of the global batch's rows, b rows one table wide.
            rw = b * _row_bytes(comm, dim)
            want = {"emb_fwd": (b * _row_bytes(comm, width[rank]) + rw, b * _row_bytes(comm, width[peer]) + rw),
                    "emb_bwd": (b * _row_bytes(comm, width[peer]) + rw, b * _row_bytes(comm, width[rank]) + rw)}
            got = moved[comm].xs(rank, level="rank")
            for stage, (sent, recv) in want.items():
                rows = got.xs(stage, level="stage")
                assert (rows["sent_bytes"] == sent).all() and (rows["recv_bytes"] == recv).all(), (comm, rank, stage, rows)
    for stage in ("emb_fwd", "emb_bwd"):
        ratio = moved["fp8"].xs(stage, level="stage") / moved["fp32"].xs(stage, level="stage")
        assert (ratio <= 0.30).all().all() and (ratio > 0.25).all().all(), (stage, ratio)
    for stage in ("input_dist", "dense_fwd_bwd"):
        pd.testing.assert_frame_equal(moved["fp8"].xs(stage, level="stage"), moved["fp32"].xs(stage, level="stage"))


def test_precision_perf_counts_pooled_bytes_a_rank_and_timed_iteration():
    from types import SimpleNamespace

    from harness.tools.precision_perf import pooled_bytes

    stages = pd.DataFrame({
        "rank": [0, 0, 0, 1, 1, 0], "iteration": [1, 1, 1, 1, 1, 0], "warmup": [False] * 5 + [True],
        "stage": ["emb_fwd", "emb_bwd", "input_dist", "emb_fwd", "dense_fwd_bwd", "emb_fwd"],
        "sent_bytes": [100, 60, 7, 40, 9, 1000],
    })
    # Two (rank, iteration) pairs timed; pooled stages sent 100 + 60 + 40 bytes.
    assert pooled_bytes(SimpleNamespace(stages=stages)) == 100.0
