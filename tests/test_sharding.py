"""Table-wise plans and the feature permutations input distribution is built on."""

from __future__ import annotations

import torch

from model.features import SparseFeatures
from model.sharding import table_wise_plan


def test_plan_balances_bytes_and_is_deterministic():
    sizes = [40, 100, 10, 90, 30, 50]
    owners = table_wise_plan(sizes, 2)
    # By hand, largest first to the lightest rank (ties to rank 0): 100->0, 90->1, 50->1,
    # 40->0, 30->0 (140 vs 140), 10->1.
    assert owners == [0, 0, 1, 1, 0, 1]
    assert owners == table_wise_plan(sizes, 2)


def test_plan_with_more_ranks_than_tables_leaves_ranks_empty():
    owners = table_wise_plan([5, 4, 3], 5)
    assert sorted(owners) == [0, 1, 2]


def test_permute_reorders_whole_features():
    lengths = torch.tensor([[1, 2], [0, 1], [2, 0]])
    values = torch.tensor([10, 11, 12, 20, 30, 31])  # f0: [10], [11, 12]; f1: [], [20]; f2: [30, 31], []
    out = SparseFeatures(lengths=lengths, values=values).permute(torch.tensor([2, 0, 1], dtype=torch.int32))
    assert out.lengths.tolist() == [[2, 0], [1, 2], [0, 1]]
    assert out.values.tolist() == [30, 31, 10, 11, 12, 20]
    assert out.offsets().tolist() == [0, 2, 2, 3, 5, 5, 6]
