"""Dynamic tables (issue 15), table-wise and row-wise: a row follows its id through eviction and
back exactly, a dynamic table with room for every id trains bitwise like the same table static,
and one that evicts every batch trains like the unsharded reference, which never evicts, while
evicting what a Python dict model of its policy evicts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.data.source import open_batches
from harness.config import DynamicConfig, OptimizerConfig, ShardingConfig
from harness.run.param_store import EmbeddedStore
from harness.launch.planning import make_plan
from harness.presets import tiny
from model.dynamic_table import DynamicTable
from model.embeddings import build_fused_tbe, init_shard_
from model.id_transformer import IdTransformer
from model.sharding import check_plan, dynamic, dynamic_row_wise
from tests.distributed import run_ranks
from tests.test_id_transformer import DictModel
from tests.test_sharded_training import STEPS, assemble, close, reference_run

ROWS, DIM = 50, 8


def small_table(tmp_path: Path, optimizer: str, precision: str, slots: int = 4) -> tuple[DynamicTable, object]:
    tbe = build_fused_tbe(rows=[slots], dims=[DIM], device=torch.device("cpu"), optimizer=optimizer,
                          learning_rate=0.1, eps=1e-2, precision=precision)
    states = tbe.split_optimizer_states()[0] if optimizer != "exact_sgd" else []
    store = EmbeddedStore(memory_bytes=1 << 20, spill_dir=tmp_path, spill_bytes=0)
    table = DynamicTable(table=3, table_rows=ROWS, weights=tbe.split_embedding_weights()[0], states=list(states),
                         transformer=IdTransformer(slots, "lru", 1 << 20), store=store, seed=11)
    return table, tbe


def slot_state(table: DynamicTable, ids: list[int]) -> list[torch.Tensor]:
    """Weights and optimizer state of `ids`' slots, copied as they sit there."""
    slots = table.transformer.lookup(torch.tensor(ids))
    assert bool((slots >= 0).all())
    return [table.weights[slots].clone()] + [s[slots].clone() for s in table.states]


@pytest.mark.parametrize("optimizer, precision", [("exact_adagrad", "fp32"), ("exact_rowwise_adagrad", "fp32"),
                                                  ("exact_sgd", "fp32"), ("exact_adagrad", "fp16")])
def test_an_evicted_row_comes_back_exactly(tmp_path, optimizer, precision):
    table, tbe = small_table(tmp_path, optimizer, precision)
    # Four ids fill the four slots with their init (the table's own, whatever the slot) ...
    slots = table.transform(torch.tensor([7, 40, 3, 12]))
    expected = torch.empty(ROWS, DIM)
    init_shard_(expected, table=3, table_rows=ROWS, table_dim=DIM, row_start=0, col_start=0, seed=11)
    assert torch.equal(table.weights[slots].float(), expected[[7, 40, 3, 12]].to(table.weights.dtype).float())
    # ... a few fused updates give their weights and optimizer state values no init has ...
    for _ in range(3):
        ids = table.transform(torch.tensor([7, 40, 3, 12, 7]))
        pooled = tbe(ids, torch.tensor([0, 2, 5]))
        pooled.backward(torch.randn_like(pooled))
    before = slot_state(table, [7, 40])
    if optimizer != "exact_sgd":
        assert bool((before[1] != 0).any())
    # ... two new ids evict the two least recent (7 and 40 were touched last at positions 0, 1) ...
    table.transform(torch.tensor([3, 12, 5, 6]))
    assert table.transformer.lookup(torch.tensor([7, 40])).tolist() == [-1, -1]
    assert table.counts.evicted == 2
    # ... and when they come back, their rows and optimizer state are bit for bit what they were.
    table.transform(torch.tensor([40, 7]))
    after = slot_state(table, [7, 40])
    for b, a in zip(before, after):
        assert torch.equal(b, a)
    assert table.counts.fetched == 2
    # rows_of reads a row wherever it is: a slot, the store (5 and 6 were just evicted), the init.
    assert torch.equal(table.rows_of(torch.tensor([7])), before[0][:1].float())
    assert torch.equal(table.rows_of(torch.tensor([49])), expected[[49]].to(table.weights.dtype).float())
    table.store.close()


def test_a_batch_wider_than_the_slots_is_refused_in_one_line(tmp_path):
    table, _ = small_table(tmp_path, "exact_adagrad", "fp32")
    with pytest.raises(ValueError, match=r"^table 3: .*more distinct ids than the table's 4 slots; raise --dynamic-slots or --dynamic-memory-gib$"):
        table.transform(torch.tensor([1, 2, 3, 4, 5]))
    with pytest.raises(ValueError, match="ids must be in 0..49"):
        table.transform(torch.tensor([50]))


def test_a_dynamic_plan_counts_its_slots():
    tp = dynamic(1000, 16, 1, 64)
    assert [(s.rank, s.rows, s.cols) for s in tp.shards] == [(1, 64, 16)]
    assert dynamic(10, 16, 0, 64).shards[0].rows == 10  # never more slots than rows
    check_plan([tp], [1000], 16, 2)
    with pytest.raises(ValueError, match="one shard of 1..1000 slots"):
        check_plan([dynamic(2000, 16, 0, 1500)], [1000], 16, 2)


def test_a_dynamic_row_wise_plan_has_slots_on_every_rank_for_its_row_block():
    tp = dynamic_row_wise(1000, 16, 3, 300)  # blocks of 334, 334 and 332 rows
    assert [(s.rank, s.rows, s.cols) for s in tp.shards] == [(0, 300, 16), (1, 300, 16), (2, 300, 16)]
    assert [s.rows for s in dynamic_row_wise(1000, 16, 3, 333).shards] == [333, 333, 332]  # at most its block
    check_plan([tp], [1000], 16, 3)
    with pytest.raises(ValueError, match="one shard a rank"):
        check_plan([dynamic_row_wise(1000, 16, 2, 300)], [1000], 16, 3)
    with pytest.raises(ValueError, match="a row a rank"):
        dynamic_row_wise(5, 16, 8, 4)  # blocks of 1 row: ranks 5..7 would have none


DYNAMIC_TABLES = (2, 6)
"""tiny tables of 1000 rows and one id a sample: a batch of 96 fits in 100 slots, five batches do not."""


def tiny_with(slots: int, policy: str, kind: str = "dynamic"):
    cfg = tiny(nodes=1, gpus_per_node=2, iters=STEPS, warmup_iters=0)
    return cfg.replace(optimizer=OptimizerConfig(learning_rate=0.05, eps=1e-2),
                       sharding=ShardingConfig(kind="auto", per_table=tuple((t, kind) for t in DYNAMIC_TABLES)),
                       dynamic=DynamicConfig(slots=slots, policy=policy))


@pytest.mark.parametrize("static_kind", ["table_wise", "row_wise"])
def test_with_room_for_every_id_a_dynamic_table_trains_bitwise_like_static(static_kind, tmp_path):
    """dynamic against table-wise, dynamic_row_wise against row-wise (blocks of 500 rows, so 1000
    slots a rank hold every id of the block)."""
    cfg = tiny_with(1000, "lru", kind=static_kind)
    static, _ = make_plan(cfg, ranks_per_host=2)
    plan = list(static)
    rows, dim = 1000, cfg.model.embedding_dim
    for t in DYNAMIC_TABLES:  # the same plan but for these tables: the other tables' numerics are untouched
        plan[t] = (dynamic(rows, dim, static[t].shards[0].rank, 1000) if static_kind == "table_wise"
                   else dynamic_row_wise(rows, dim, 2, 1000))
    (tmp_path / "static").mkdir()
    (tmp_path / "dynamic").mkdir()
    a = run_ranks(cfg, static, tmp_path / "static")
    b = run_ranks(cfg, plan, tmp_path / "dynamic")
    for ra, rb in zip(a, b):
        assert ra["losses"] == rb["losses"]
    for t in DYNAMIC_TABLES:
        assert torch.equal(assemble(a, t, rows, dim), assemble(b, t, rows, dim))
    moved = [(t, c) for r in b for t, c in r["dynamic"].items()]  # each table's owner, or each rank's block
    assert {t for t, _ in moved} == set(DYNAMIC_TABLES) and all(c.evicted == 0 and c.admitted > 0 for _, c in moved)


def dict_model_counts(cfg, table: int, slots: int, policy: str, rows: range | None = None) -> tuple[int, int, int]:
    """(admitted, evicted, fetched) of a Python dict model of the policy on the ids the table's
    owner transforms: each global batch's ids of the table, in sample order (rows: only those in
    this row block, what a dynamic_row_wise rank transforms)."""
    data, model, seen_evicted = open_batches(cfg), DictModel(slots, policy, cfg.dynamic.half_life), set()
    admitted = evicted = fetched = 0
    f = table
    for it in range(STEPS):
        b = data.samples(it * cfg.data.global_batch_size, cfg.data.global_batch_size)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), b.sparse.lengths.reshape(-1).cumsum(0)])
        g = b.sparse.lengths.shape[1]
        ids = b.sparse.values[offsets[f * g]:offsets[(f + 1) * g]].tolist()
        if rows is not None:
            ids = [i for i in ids if i in rows]
        _, adm, ev = model.transform(ids)
        fetched += sum(i in seen_evicted for i, _ in adm)
        seen_evicted |= {i for i, _ in ev}
        admitted, evicted = admitted + len(adm), evicted + len(ev)
    return admitted, evicted, fetched


@pytest.mark.parametrize("kind, policy", [("dynamic", "lru"), ("dynamic", "lfu"), ("dynamic", "hybrid"),
                                          ("dynamic_row_wise", "lru"), ("dynamic_row_wise", "hybrid")])
def test_evicting_every_batch_trains_like_the_reference_that_never_evicts(kind, policy, tmp_path):
    slots = 100 if kind == "dynamic" else 60  # row-wise: 60 a rank, for blocks of 500 rows
    cfg = tiny_with(slots, policy, kind=kind)
    plan, _ = make_plan(cfg, ranks_per_host=2)
    assert [plan[t].kind for t in DYNAMIC_TABLES] == [kind, kind]
    ranks = run_ranks(cfg, plan, tmp_path)
    ref_losses, ref = reference_run(cfg)
    losses = torch.tensor([r["losses"] for r in ranks], dtype=torch.float64).mean(0)
    close(losses, torch.tensor(ref_losses, dtype=torch.float64))
    for t, rows in enumerate(cfg.model.table_rows):
        close(assemble(ranks, t, rows, cfg.model.embedding_dim), ref.tables[t].weight.detach())
    # Each transformer moved what a dict model of the ids it saw moves: a table's owner saw all of
    # the table's ids, a row-wise rank its block's.
    round_trips = 0
    for rank, r in enumerate(ranks):
        for t, c in r["dynamic"].items():
            block = None if kind == "dynamic" else range(500 * rank, 500 * rank + 500)
            assert (c.admitted, c.evicted, c.fetched) == dict_model_counts(cfg, t, slots, policy, block)
            round_trips += c.evicted > 0 and c.fetched > 0  # rows did go to the store and come back
    assert {t for r in ranks for t in r["dynamic"]} == set(DYNAMIC_TABLES)
    assert round_trips >= (2 if kind == "dynamic" else 1)
