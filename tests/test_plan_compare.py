"""The analytic plan traffic by hand, and the planner comparison against TorchRec's (planning only)."""

from __future__ import annotations

import pytest

from model.plan_traffic import Geometry, PlanTraffic
from model.planner import TableSpec, plan_footprint
from model.sharding import grid_shard, row_wise, table_wise


def test_traffic_of_a_table_wise_table_by_hand():
    # 2 nodes of 1 rank, global batch 4 (2 a rank), one id a sample, dim 4, the table on rank 0.
    geo = Geometry(world_size=2, ranks_per_node=1, global_batch=4, state_per_element=1.0)
    t = PlanTraffic.of(plan_footprint([table_wise(10, 4, 0)], [TableSpec(rows=10, dim=4, pooling=1.0)], geo))
    # Rank 1 sends its ids (2 values + 2 lengths, 8 B each = 32 B) and its 2 rows' gradients
    # (2 x 4 floats = 32 B); rank 0 sends rank 1 its 2 pooled rows (32 B). All between nodes.
    assert t.inter_out.tolist() == [32, 64] and t.inter_in.tolist() == [64, 32]
    assert t.intra_out.tolist() == [0, 0]
    # Rank 0: 10 x 4 weights + Adagrad state (320 B), all ids (4 values + 4 lengths: 64 B), pooled
    # rows and gradients of the global batch (2 x 4 x 16 = 128 B), its own rows in and out (64 B).
    assert t.memory.tolist() == [320 + 64 + 128 + 64, 64]


def test_row_wise_traffic_is_charged_to_both_ends_by_link_level():
    # 4 ranks, 2 a node: rank 0 exchanges with rank 1 inside its node and with 2, 3 across.
    geo = Geometry(world_size=4, ranks_per_node=2, global_batch=8, state_per_element=0.0)
    t = PlanTraffic.of(plan_footprint([row_wise(8, 4, 4)], [TableSpec(rows=8, dim=4, pooling=2.0)], geo))
    assert t.intra_out.sum() == t.intra_in.sum() and t.inter_out.sum() == t.inter_in.sum()
    # Per pair (s, q), s != q: ids 8 * (2 * 2 * 1/4 + 2) = 24 B, partial sums 2 * 4 * 4 = 32 B, gradients 32 B.
    assert t.intra_out[0] == 24 + 32 + 32 and t.inter_out[0] == 2 * (24 + 32 + 32)


def test_grid_traffic_by_hand():
    # 2 nodes of 2 ranks, global batch 8 (2 a rank), 2 ids a sample; 8 rows x dim 8 in two column
    # blocks of 4, block 0 on node 0 (ranks 0, 1: rows 0-3, 4-7), block 1 on node 1 (ranks 2, 3).
    geo = Geometry(world_size=4, ranks_per_node=2, global_batch=8, state_per_element=0.0)
    fp = plan_footprint([grid_shard(8, 8, [0, 1], 2)], [TableSpec(rows=8, dim=8, pooling=2.0)], geo)
    t = PlanTraffic.of(fp)
    # Rank 0, per exchange:
    # - ids: every other rank sends it the ids of its rows, 8 B x (2 x 2 x 1/2 values + 2 lengths)
    #   = 32 B (rank 1 inside the node, ranks 2 and 3 across), and it sends each other shard 32 B;
    # - forward: the in-node reduce-scatter, 4 x 4 partial sums of a 4-sample slice = 64 B each way
    #   with rank 1; the summed rows of slice 0 (ranks 0, 1's samples, 2 x 4 floats = 32 B) to rank 1;
    #   from rank 2 (slice 0 of block 1) 32 B across;
    # - backward: the same in reverse.
    assert (t.intra_out[0], t.intra_in[0]) == (32 + 64 + 32 + 64, 32 + 64 + 64 + 32)
    assert (t.inter_out[0], t.inter_in[0]) == (2 * 32 + 32, 2 * 32 + 32)
    assert t.intra_out.sum() == t.intra_in.sum() and t.inter_out.sum() == t.inter_in.sum()
    # Lookup: 3 x 4 B for each of its 8 ids x 4 columns (384), the 8 samples' partial sums written
    # and their gradients read (2 x 8 x 4 x 4 = 256).
    assert fp[0, 0] == 384 + 256


@pytest.mark.filterwarnings("ignore")
def test_plan_compare_prints_both_plans_scored_three_ways(capsys):
    from harness.tools.plan_compare import main

    assert main(["--layouts", "2x8"]) == 0
    out = capsys.readouterr().out
    for label in ("inter-node MB, busiest rank (analytic)", "TorchRec perf model, ms, busiest rank",
                  "harness cost model, ms, busiest rank", "ranks holding no shard"):
        assert label in out
    assert "harness plan" in out and "TorchRec plan" in out


@pytest.mark.filterwarnings("ignore")
def test_at_16x8_this_plan_is_no_worse_than_torchrecs_and_at_2x8_no_rank_is_empty():
    """Issue 11's bar, planning only, both planners given the h100 profile and the same kinds (grid
    included): the busiest rank's memory and bytes between nodes no worse than TorchRec's plan, nor
    its busiest rank by TorchRec's own perf model, nor the iteration by this cost model; at 2 x 8
    every rank holds a shard. Table 20 (40M rows, 100 ids a sample) is what decides it: whole
    table-row-wise on one node it costs that node's ranks 0.753 ms by TorchRec's model, in column
    blocks on several nodes a fraction of that."""
    from harness.tools.plan_compare import _silence_torchrec, score, torchrec_plan
    from harness.launch.planning import make_plan
    from harness.presets import mlperf

    _silence_torchrec()
    cfg = mlperf(nodes=16, gpus_per_node=8)
    ours, _ = make_plan(cfg, ranks_per_host=8)
    mine, theirs = score(cfg, ours, 16, 8), score(cfg, torchrec_plan(cfg, 16, 8), 16, 8)
    assert ours[20].kind == "grid_shard"
    for field in ("memory_gib_max", "inter_mb_max", "torchrec_ms_max", "harness_step_ms"):
        assert getattr(mine, field) <= getattr(theirs, field) * (1 + 1e-9), (field, mine, theirs)
    assert mine.empty_ranks == 0
    cfg2 = mlperf(nodes=2, gpus_per_node=8)
    plan2, _ = make_plan(cfg2, ranks_per_host=8)
    assert score(cfg2, plan2, 2, 8).empty_ranks == 0
