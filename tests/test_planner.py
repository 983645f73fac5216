"""The planner: memory respected, cost balanced, forced types honoured, impossible plans refused."""

from __future__ import annotations

import pytest

from harness.config import ShardingConfig
from harness.launch.planning import make_plan
from harness.presets import mlperf, small, tiny
import numpy as np

from model.plan_traffic import BACKWARD, FOOTPRINT_ROWS, FORWARD, IDS, LOOKUP, MEMORY, Geometry, row, table_footprint
from model.planner import PlanError, TableSpec, Topology, plan_tables, rank_seconds, step_seconds, work_seconds
from model.sharding import row_wise, table_wise

GIB = 2**30


def topo(world=4, per_node=4, memory_gib=1.0):
    return Topology(world_size=world, ranks_per_node=per_node, memory_bytes=memory_gib * GIB,
                    memory_bw=10e9, intra_node_bw=1e9, inter_node_bw=0.5e9)


def test_cost_model_by_hand():
    """Rank 0 looks up 100 B, rank 1 sends 50 B between nodes forward and receives 30 B backward;
    memory 100 B/s, between nodes 10 B/s. Each rank's seconds add its own resources; the step
    adds each resource's busiest rank (the collectives wait for it): 1 s + 5 s + 3 s."""
    t = Topology(world_size=2, ranks_per_node=1, memory_bytes=GIB, memory_bw=100.0, intra_node_bw=1000.0,
                 inter_node_bw=10.0)
    fp = np.zeros((FOOTPRINT_ROWS, 2))
    fp[LOOKUP] = [100.0, 0.0]
    fp[row(FORWARD, 1, False)] = [0.0, 50.0]
    fp[row(FORWARD, 1, True)] = [50.0, 0.0]
    fp[row(BACKWARD, 1, True)] = [0.0, 30.0]
    fp[row(BACKWARD, 1, False)] = [30.0, 0.0]
    assert rank_seconds(fp, t).tolist() == pytest.approx([1 + 5 + 3, 5 + 3])
    assert step_seconds(fp, t) == pytest.approx(1 + 5 + 3)
    # An exchange is full duplex, two exchanges are not: 50 B out forward and 30 B in backward take 8 s.
    assert work_seconds(fp, t) == pytest.approx(1 + 80 / 10)


def test_table_wise_footprint_by_hand():
    """One table-wise table on rank 0 of 2 ranks (a node each), global batch 4, 1 id a sample, dim 4."""
    geo = Geometry(world_size=2, ranks_per_node=1, global_batch=4, state_per_element=1.0)
    fp = table_footprint(table_wise(10, 4, 0), rows=10, dim=4, pooling=1.0, geo=geo)
    # Rank 1 sends its 2 ids and 2 lengths (32 B), gets its 2 pooled rows (32 B), sends their gradients.
    assert fp[row(IDS, 1, False)].tolist() == [0, 32] and fp[row(IDS, 1, True)].tolist() == [32, 0]
    assert fp[row(FORWARD, 1, False)].tolist() == [32, 0] and fp[row(BACKWARD, 1, True)].tolist() == [32, 0]
    # Rank 0 reads 4 rows of 16 B forward, reads and writes them backward: 192 B.
    assert fp[LOOKUP].tolist() == [192, 0]
    assert fp[row(FORWARD, 0, False)].sum() == 0  # nothing inside a node: one rank a node


def test_small_tables_stay_whole():
    # Nine equal tables on 3 ranks: none costs more than a rank's share, so none is split.
    plan, loads = plan_tables([TableSpec(rows=1000, dim=16, pooling=1)] * 9, topo(world=3, per_node=3),
                              global_batch=64, state_per_element=1.0)
    assert {tp.kind for tp in plan} <= {"table_wise", "data_parallel"}


def test_memory_budget_is_respected_and_big_tables_split():
    tables = [TableSpec(rows=4_000_000, dim=64, pooling=1)] + [TableSpec(rows=1000, dim=64, pooling=1)] * 6
    # The big table is 1 GiB of weights + 1 GiB of Adagrad state: no rank of 0.75 GiB holds it whole.
    plan, loads = plan_tables(tables, topo(memory_gib=0.75), global_batch=256, state_per_element=1.0)
    assert plan[0].kind in ("row_wise", "column_wise") and len(plan[0].shards) >= 3
    assert all(ld.memory_bytes <= 0.75 * GIB for ld in loads)


def test_forced_kinds_and_impossible_plans():
    tables = [TableSpec(rows=100, dim=6, pooling=1)] * 3
    plan, _ = plan_tables(tables, topo(), global_batch=8, state_per_element=1.0, forced={1: "row_wise", 2: "data_parallel"})
    assert [tp.kind for tp in plan][1:] == ["row_wise", "data_parallel"]
    with pytest.raises(PlanError, match="table 0: column_wise needs 2..4 blocks .* of a multiple of 4 columns each; dim is 6"):
        plan_tables(tables, topo(), global_batch=8, state_per_element=1.0, forced={0: "column_wise"}, column_shards=4)
    cw, _ = plan_tables([TableSpec(rows=100, dim=16, pooling=1)], topo(), global_batch=8, state_per_element=1.0,
                        forced={0: "column_wise"}, column_shards=4)
    assert len(cw[0].shards) in (2, 4) and all(s.cols % 4 == 0 for s in cw[0].shards)
    with pytest.raises(PlanError, match="table 0 .* fits on no rank"):
        plan_tables([TableSpec(rows=10**9, dim=128, pooling=1)], topo(), global_batch=8, state_per_element=1.0,
                    forced={0: "table_wise"})


def test_auto_plan_balances_better_than_one_rank():
    cfg = small(nodes=1, gpus_per_node=4)
    _, desc = make_plan(cfg, ranks_per_host=4)
    single = sum(r.est_ms for r in desc.ranks)
    assert desc.est_ms_max < 0.5 * single  # four ranks share the work
    assert len({s.split(":")[0] for r in desc.ranks for s in r.shards}) == 26


def test_mlperf_on_16_nodes_of_8_h100_fits():
    cfg = mlperf(nodes=16, gpus_per_node=8)
    plan, desc = make_plan(cfg, ranks_per_host=8)
    assert len(desc.ranks) == 128 and desc.memory_gib_max <= 64
    assert desc.link == "inter-node"
    assert len(plan) == 26


def test_config_rejects_unknown_kinds_and_tables():
    with pytest.raises(ValueError, match="sharding.kind 'diagonal'"):
        ShardingConfig(kind="diagonal")
    with pytest.raises(ValueError, match="names table 30"):
        tiny().replace(sharding=ShardingConfig(per_table=((30, "row_wise"),)))


def test_forced_table_row_wise_goes_to_the_least_loaded_node():
    """Two nodes of two ranks: the first forced table lands on node 0, the next (as big) on node 1;
    each table's row blocks stay on its node's ranks."""
    from model.planner import Topology, TableSpec, plan_tables

    topo = Topology(world_size=4, ranks_per_node=2, memory_bytes=2**30, memory_bw=1e10, intra_node_bw=1e10,
                    inter_node_bw=1e9)
    tables = [TableSpec(rows=1000, dim=8, pooling=2.0), TableSpec(rows=1000, dim=8, pooling=2.0)]
    plan, loads = plan_tables(tables, topo, global_batch=64, state_per_element=1.0,
                              forced={0: "table_row_wise", 1: "table_row_wise"})
    assert [sorted(s.rank for s in tp.shards) for tp in plan] == [[0, 1], [2, 3]]
    assert [(s.row_start, s.row_end) for s in plan[0].shards] == [(0, 500), (500, 1000)]
    assert all(ld.shards for ld in loads)


def test_memory_counts_row_state_and_exchange_buffers_by_hand():
    spec = dict(rows=100, dim=8, pooling=2.0)
    # Row-wise Adagrad, 4 ranks, global batch 12 (3 a rank).
    geo = Geometry(world_size=4, ranks_per_node=4, global_batch=12, state_per_element=0.0, state_per_row=1.0)
    tw = table_footprint(table_wise(100, 8, 0), **spec, geo=geo)[MEMORY]
    # Its rank: 100 x 8 weights (3200 B) + a float a row (400 B); ids 8 B x 12 x (2 values + 1 length)
    # = 288 B; pooled rows and gradients of the global batch 2 x 12 x 8 x 4 = 768 B. Every rank: its
    # own 3 pooled rows and gradients, 2 x 3 x 8 x 4 = 192 B.
    assert tw.tolist() == [3200 + 400 + 288 + 768 + 192] + [192] * 3
    rw = table_footprint(row_wise(100, 8, 4), **spec, geo=geo)[MEMORY]
    # 25 rows a rank: a quarter of the values, full-width partial sums and gradients of the batch.
    assert rw[1] == 800 + 100 + 8 * 12 * (2 * 0.25 + 1) + 768 + 192


def test_a_sharding_in_use_costs_every_rank_its_latency_once():
    """Each sharding's collectives cost a latency whatever its tables hold: with latency dominating,
    one sharding serves every table, and every rank carries that sharding's latency once."""
    from model.planner import group_latency_s

    slow = Topology(world_size=4, ranks_per_node=2, memory_bytes=GIB, memory_bw=10e9, intra_node_bw=1e9,
                    inter_node_bw=0.5e9, intra_node_latency_s=1e-3, inter_node_latency_s=2e-3)
    # 4 exchanges across nodes (2 ms each); table-row-wise 2 more inside its node (1 ms each);
    # data-parallel one all-reduce.
    assert group_latency_s("pooled", slow) == pytest.approx(8e-3)
    assert group_latency_s("table_row_wise", slow) == pytest.approx(10e-3)
    assert group_latency_s("data_parallel", slow) == pytest.approx(2e-3)
    tables = [TableSpec(rows=1000, dim=16, pooling=1)] * 8
    plan, loads = plan_tables(tables, slow, global_batch=64, state_per_element=1.0)
    assert {tp.kind for tp in plan} == {"data_parallel"}
    assert min(ld.cost_s for ld in loads) >= 2e-3
    free = Topology(world_size=4, ranks_per_node=2, memory_bytes=GIB, memory_bw=10e9, intra_node_bw=1e9,
                    inter_node_bw=0.5e9)
    assert group_latency_s("pooled", free) == 0.0


def test_a_dynamic_row_wise_table_moves_what_row_wise_moves_and_holds_only_its_slots():
    """Its ids go by row block as row_wise's do, so every exchange row and its lookups equal
    row_wise's; its memory holds 100 slots a rank where row_wise holds the 500-row blocks."""
    from model.sharding import dynamic_row_wise

    geo = Geometry(world_size=2, ranks_per_node=2, global_batch=64, state_per_element=1.0)
    rw = table_footprint(row_wise(1000, 16, 2), rows=1000, dim=16, pooling=3, geo=geo)
    dyn = table_footprint(dynamic_row_wise(1000, 16, 2, 100), rows=1000, dim=16, pooling=3, geo=geo)
    others = [i for i in range(FOOTPRINT_ROWS) if i != MEMORY]
    assert np.array_equal(dyn[others], rw[others])
    # A row: 16 fp32 weights and 16 Adagrad floats = 128 bytes; 400 fewer rows a rank.
    assert dyn[MEMORY].tolist() == pytest.approx((rw[MEMORY] - 400 * 128).tolist())
