"""Embedding init slices, and the dense (data-parallel) TBE against nn.EmbeddingBag."""

from __future__ import annotations

import pytest
import torch

from model.embeddings import _init_values_torch, _stream, build_dense_tbe, init_rows, init_shard_
from tests.reference import embedding_init, embedding_init_rows


def test_any_shard_is_a_slice_of_the_full_table_init():
    rows, dim = 150_000, 8  # blocks of 8192 rows in init_shard_, of 65536 in the reference
    full = embedding_init(rows, dim, table=3, seed=7)
    for r0, r1, c0, c1 in [(0, rows, 0, dim), (60_000, 140_000, 4, 8), (131_071, 131_073, 0, 4), (5, 6, 2, 3)]:
        shard = torch.empty(r1 - r0, c1 - c0)
        init_shard_(shard, table=3, table_rows=rows, table_dim=dim, row_start=r0, col_start=c0, seed=7)
        assert torch.equal(shard, full[r0:r1, c0:c1])
    # A dynamic table's rows, asked for by id in any order, repeats included.
    ids = torch.tensor([149_999, 3, 70_000, 3, 0])
    assert torch.equal(init_rows(ids, table=3, table_rows=rows, table_dim=dim, seed=7), full[ids])
    # U(-b, b), b = 1/sqrt(rows): within b (as float32 rounds it), mean 0 and std b/sqrt(3) within
    # 1% (1.2M draws: the std of the sample std is about 0.06% of it).
    b = torch.tensor(rows**-0.5, dtype=torch.float32)
    assert full.abs().max() <= b
    assert abs(float(full.double().mean())) < 0.01 * float(b)
    assert abs(float(full.double().std()) / (float(b) / 3**0.5) - 1) < 0.01
    # Another table or seed draws other values.
    for other in (embedding_init(rows, dim, table=4, seed=7), embedding_init(rows, dim, table=3, seed=8)):
        assert (other != full).float().mean() > 0.99


def test_the_host_init_and_the_torch_init_give_the_reference_bits():
    # The host takes csrc/row_init.cpp, a GPU the torch ops: both must be the documented rule.
    # Ids far into a 40M-row space, and a table whose b is not a power of two.
    rows, dim = 40_000_000, 16
    ids = torch.tensor([39_999_999, 0, 12_345_678, 12_345_678, 2**24 + 1])
    want = torch.from_numpy(embedding_init_rows(ids.numpy(), dim, rows=rows, table=5, seed=3))
    host = init_rows(ids, table=5, table_rows=rows, table_dim=dim, seed=3)
    torch_ops = _init_values_torch(ids, col_start=0, cols=dim, table_dim=dim, key=_stream(3, 5), b=rows**-0.5)
    assert torch.equal(host.view(torch.int32), want.view(torch.int32))
    assert torch.equal(torch_ops.view(torch.int32), want.view(torch.int32))


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


@pytest.mark.parametrize("mixed", [False, True])
def test_pooled_output_written_into_a_given_buffer_matches_embedding_bag(tmp_path, mixed):
    """The graphed dense step's static input is filled by the embedding forward itself (out=):
    the same values as torch.nn.EmbeddingBag over each full table, and the buffer is what comes back.
    mixed: every other table data-parallel, so two shardings' columns interleave (each written in
    place by a scatter); else one sharding holds every table in order (its output is the pooled
    tensor itself). Its gradient goes back to each sharding's own tables."""
    import torch.distributed as dist

    from harness.data.synthetic import SyntheticCriteo
    from harness.presets import tiny
    from model.sharded_embeddings import ShardedEmbeddingCollection
    from model.sharding import data_parallel, table_wise
    from model.shardings import ShardingContext

    cfg = tiny(nodes=1, gpus_per_node=1)
    m = cfg.model
    plan = [data_parallel(r, m.embedding_dim, 1) if mixed and t % 2 else table_wise(r, m.embedding_dim, 0)
            for t, r in enumerate(m.table_rows)]
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        emb = ShardedEmbeddingCollection(ShardingContext(
            table_rows=m.table_rows, dim=m.embedding_dim, rank=0, world_size=1, pg=None,
            ids_pg=None, device=torch.device("cpu"), optimizer="exact_adagrad", learning_rate=0.1, eps=1e-8,
            init_seed=0, multi_hot=m.multi_hot), plan)
        batch = SyntheticCriteo(m, cfg.data).local_batch(0, 0, 1)
        pending = emb.prepare_input_dist(batch.sparse)
        pending.start_splits()
        ids = pending.wait()
        b = batch.dense.shape[0]
        static = torch.zeros(b, m.num_sparse * m.embedding_dim).requires_grad_(True)
        written, _ = emb.forward(ids, b, out=static)
        fresh, fwd = emb.forward(ids, b)
        # A gradient on the even tables' columns only: those tables move, the odd ones must not.
        before = {t: w.detach().clone() for t, _, w in emb.shard_weights()}
        grad = torch.cat([torch.full((b, m.embedding_dim), float(t % 2 == 0)) for t in range(m.num_sparse)], dim=1)
        emb.start_backward(fwd, grad).wait()
        moved = {t: bool((w.detach() != before[t]).any()) for t, _, w in emb.shard_weights()}
    finally:
        dist.destroy_process_group()
    assert written is static and static.requires_grad
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), batch.sparse.lengths.reshape(-1).cumsum(0)])
    expected = []
    for t in range(m.num_sparse):  # the weights the forward read, before the update
        bag = torch.nn.EmbeddingBag.from_pretrained(before[t], mode="sum")
        lo, hi = offsets[t * b], offsets[(t + 1) * b]
        expected.append(bag(batch.sparse.values[lo:hi], offsets[t * b:(t + 1) * b] - lo))
    torch.testing.assert_close(static.detach(), torch.cat(expected, dim=1))
    assert torch.equal(static.detach(), fresh.detach())
    assert moved == {t: t % 2 == 0 for t in range(m.num_sparse)}
