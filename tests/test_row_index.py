"""The embedded store's id -> position index (csrc/row_index.cpp) against a Python dict doing the
same job, through growth, overwrites and ids across the whole non-negative int64 range."""

from __future__ import annotations

import pytest
import torch

from harness.run._row_index import ABSENT, RowIndex


def test_the_index_answers_as_a_dict_does_through_growth_and_overwrites():
    gen = torch.Generator().manual_seed(0)
    index, reference = RowIndex(), {}
    start_bytes = index.table_bytes
    for step in range(30):
        # Ids spread over [0, 2^63) and dense small ones, so both far and colliding homes occur.
        wide = torch.randint(0, 1 << 62, (400,), generator=gen) * 2 + torch.randint(0, 2, (400,), generator=gen)
        dense = torch.randint(0, 3000, (400,), generator=gen)
        ids = torch.cat([wide, dense]).unique()  # a put's ids are distinct
        ids = ids[torch.randperm(ids.numel(), generator=gen)]
        positions = torch.randint(-(1 << 40), 1 << 40, (ids.numel(),), generator=gen)
        index.insert(ids, positions)
        reference.update(zip(ids.tolist(), positions.tolist()))
        asked = torch.cat([ids[::3], torch.randint(0, 1 << 62, (200,), generator=gen), torch.arange(0, 4000, 7)])
        want = [reference.get(i, ABSENT) for i in asked.tolist()]
        assert index.find(asked).tolist() == want, f"step {step}"
    assert len(index) == len(reference)
    assert index.table_bytes >= 2 * 16 * len(reference) > start_bytes  # grew, and kept its load <= 1/2


def test_the_index_refuses_what_it_cannot_hold_in_one_line():
    index = RowIndex()
    with pytest.raises(ValueError, match="row index: ids must be non-negative"):
        index.insert(torch.tensor([3, -2]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="row index: ids must be an int64 CPU tensor"):
        index.find(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="row index: positions must be an int64 CPU tensor, one an id"):
        index.insert(torch.tensor([3, 4]), torch.tensor([0]))
    assert len(index) == 0 and index.find(torch.tensor([3])).tolist() == [ABSENT]  # nothing half-done
