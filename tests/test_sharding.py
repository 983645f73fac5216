"""Shard layouts, plan checks, and the feature permutations input distribution is built on."""

from __future__ import annotations

import pytest
import torch

from model.features import FeatureOrder, SparseFeatures
from model.sharding import check_plan, column_wise, data_parallel, grid_nodes, grid_shard, row_wise, table_wise


def test_row_wise_blocks_cover_rows_and_skip_empty_ranks():
    tp = row_wise(10, 4, 4)  # block ceil(10/4) = 3: rows 0-2, 3-5, 6-8, 9
    assert [(s.rank, s.row_start, s.row_end) for s in tp.shards] == [(0, 0, 3), (1, 3, 6), (2, 6, 9), (3, 9, 10)]
    tp = row_wise(3, 4, 4)  # block 1: rank 3 holds nothing
    assert [s.rank for s in tp.shards] == [0, 1, 2]


def test_column_wise_needs_divisible_dim():
    assert [(s.col_start, s.col_end) for s in column_wise(5, 16, [2, 0]).shards] == [(0, 8), (8, 16)]
    with pytest.raises(ValueError, match="divisible"):
        column_wise(5, 16, [0, 1, 2])


def test_grid_shard_is_a_column_block_row_wise_on_each_node():
    # 10 rows, dim 8, 2 column blocks on nodes 2 and 0 of 2 ranks: block ceil(10/2) = 5 rows a rank.
    tp = grid_shard(10, 8, [2, 0], 2)
    assert [(s.rank, s.row_start, s.row_end, s.col_start, s.col_end) for s in tp.shards] == [
        (4, 0, 5, 0, 4), (5, 5, 10, 0, 4), (0, 0, 5, 4, 8), (1, 5, 10, 4, 8)]
    assert grid_nodes(tp, 2) == [2, 0]
    check_plan([tp], [10], 8, 6)
    assert [s.rank for s in grid_shard(1, 8, [0, 1], 2).shards] == [0, 2]  # empty row blocks absent
    with pytest.raises(ValueError, match="distinct nodes"):
        grid_shard(10, 8, [1, 1], 2)
    with pytest.raises(ValueError, match="divisible"):
        grid_shard(10, 8, [0, 1, 2], 2)


def test_check_plan_catches_gaps_and_bad_ranks():
    rows = [10, 20]
    check_plan([table_wise(10, 4, 1), data_parallel(20, 4, 2)], rows, 4, 2)
    with pytest.raises(ValueError, match="outside"):
        check_plan([table_wise(10, 4, 2), table_wise(20, 4, 0)], rows, 4, 2)
    with pytest.raises(ValueError, match="cover"):
        check_plan([table_wise(10, 4, 0), table_wise(19, 4, 0)], rows, 4, 2)


def test_permute_reorders_drops_and_repeats_whole_features():
    lengths = torch.tensor([[1, 2], [0, 1], [2, 0]])
    values = torch.tensor([10, 11, 12, 20, 30, 31])  # f0: [10], [11, 12]; f1: [], [20]; f2: [30, 31], []
    cpu = torch.device("cpu")
    for known in (None, (3, 1, 2)):  # sizes read from the device, or known on the host
        f = SparseFeatures(lengths=lengths, values=values, feature_values=known)
        out = f.permute(FeatureOrder.of([2, 0, 1], cpu))
        assert out.lengths.tolist() == [[2, 0], [1, 2], [0, 1]]
        assert out.values.tolist() == [30, 31, 10, 11, 12, 20]
        assert out.offsets().tolist() == [0, 2, 2, 3, 5, 5, 6]
        rep = f.permute(FeatureOrder.of([1, 1], cpu))
        assert rep.values.tolist() == [20, 20]
        assert f.permute(FeatureOrder.of([2], cpu)).values.tolist() == [30, 31]
    # Host-known sizes follow the permute, so the next permute needs no device read either.
    g = SparseFeatures(lengths=lengths, values=values, feature_values=(3, 1, 2)).permute(FeatureOrder.of([2, 0, 0], cpu))
    assert g.feature_values == (2, 3, 3)
    assert g.values.tolist() == [30, 31, 10, 11, 12, 10, 11, 12]


def test_block_bucketize_routes_ids_to_row_blocks():
    # The op row-wise input dist relies on: ids go to rank id // block, rebased to the block.
    lengths = torch.tensor([2, 1, 0, 3])  # 2 features x batch 2
    values = torch.tensor([0, 5, 7, 1, 8, 9])
    out_lengths, out_values, *_ = torch.ops.fbgemm.block_bucketize_sparse_features(
        lengths, values, False, False, torch.tensor([4, 5]), 2, None
    )
    # rank 0: f0 [0] | [], f1 [] | [1]; rank 1: f0 [5-4] | [7-4], f1 [] | [8-5, 9-5]
    assert out_lengths.tolist() == [1, 0, 0, 1, 1, 1, 0, 2]
    assert out_values.tolist() == [0, 1, 1, 3, 3, 4]


def test_sharding_type_is_its_string_in_plans_and_json():
    """A str-valued enum: a plan's kind equals, hashes and prints as today's string, a plain string
    becomes the member, and JSON keeps the string (manifests and records unchanged)."""
    import json

    from model.names import SHARDING_TYPES, ShardingType
    from model.sharding import TablePlan

    assert SHARDING_TYPES == tuple(k.value for k in ShardingType)
    tp = TablePlan("row_wise", row_wise(4, 4, 2).shards)
    assert tp.kind is ShardingType.ROW_WISE and tp == row_wise(4, 4, 2)
    assert f"{tp.kind}" == str(tp.kind) == "row_wise" and {"row_wise": 1}[tp.kind] == 1
    assert json.dumps([tp.kind]) == '["row_wise"]'
    assert TablePlan("diagonal", ()).kind == "diagonal"  # unknown: kept for check_plan to name
    with pytest.raises(ValueError, match="unknown sharding type 'diagonal'"):
        check_plan([TablePlan("diagonal", table_wise(4, 4, 0).shards)], [4], 4, 1)


def test_every_sharding_type_has_one_family_priced_as_the_planner_groups_it():
    """The registry names each type's family; types sharing a family share the planner's group
    (one set of collectives), and the families run in the fixed order."""
    from model.names import ShardingType
    from model.planner import GROUP_OF_KIND
    from model.shardings.registry import FAMILIES, FAMILY_OF

    assert set(FAMILY_OF) == set(ShardingType)
    assert all(FAMILY_OF[k].name == GROUP_OF_KIND[k] for k in ShardingType)
    assert FAMILY_OF[ShardingType.TABLE_WISE] is FAMILY_OF[ShardingType.COLUMN_WISE]
    assert FAMILY_OF[ShardingType.TABLE_ROW_WISE] is FAMILY_OF[ShardingType.GRID_SHARD]
    assert [f.name for f in FAMILIES] == ["pooled", "row_wise", "table_row_wise", "dynamic", "dynamic_row_wise",
                                          "data_parallel"]
