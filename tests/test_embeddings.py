"""Embedding init slices, and the dense (data-parallel) TBE against nn.EmbeddingBag."""

from __future__ import annotations

import torch

from model.embeddings import build_dense_tbe, init_shard_
from tests.reference import embedding_init


def test_any_shard_is_a_slice_of_the_full_table_init():
    rows, dim = 150_000, 8  # three init chunks of 65536 rows
    full = embedding_init(rows, dim, table=3, seed=7)
    for r0, r1, c0, c1 in [(0, rows, 0, dim), (60_000, 140_000, 4, 8), (131_071, 131_073, 0, 4), (5, 6, 2, 3)]:
        shard = torch.empty(r1 - r0, c1 - c0)
        init_shard_(shard, table=3, table_rows=rows, table_dim=dim, row_start=r0, col_start=c0, seed=7)
        assert torch.equal(shard, full[r0:r1, c0:c1])
    assert full.abs().max() <= rows**-0.5


def test_dense_tbe_forward_and_grad_match_embedding_bag():
    tbe = build_dense_tbe(rows=[10, 5], dims=[4, 4], device=torch.device("cpu"))
    ids = torch.tensor([1, 2, 2, 3, 4, 0])
    offsets = torch.tensor([0, 2, 3, 4, 6])  # t0: [1, 2] | [2]; t1: [3] | [4, 0]
    out = tbe(ids, offsets)
    grad = torch.randn_like(out)
    out.backward(grad)
    w = tbe.weights.detach()
    bags = [torch.nn.EmbeddingBag(n, 4, mode="sum", include_last_offset=True) for n in (10, 5)]
    with torch.no_grad():
        bags[0].weight.copy_(w[:40].view(10, 4))
        bags[1].weight.copy_(w[40:].view(5, 4))
    ref = torch.cat([bags[0](ids[:3], torch.tensor([0, 2, 3])), bags[1](ids[3:], torch.tensor([0, 1, 3]))], 1)
    ref.backward(grad)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(tbe.weights.grad, torch.cat([b.weight.grad.flatten() for b in bags]))
