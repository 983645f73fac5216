"""--dynamic-memory-gib (issue 15): dynamic tables' slots from a memory budget, split by ids a
sample and capped at each table's rows, against hand-computed splits; the preset's slots give way
to a budget given on the command line; a run sized by a budget trains and records its slots."""

from __future__ import annotations

import pytest

from harness.cli import main
from harness.launch.options import add_config_options, config_from_args
from harness.launch.planning import make_plan
from harness.report.api import load_run, resolve_run
from model.dynamic_budget import DynamicDemand, budget_slots


def test_the_budget_is_split_by_pooling_and_a_small_table_gives_back_what_it_cannot_use():
    # 100,000 bytes at 100 a slot over poolings 1, 1, 2: the 10-row table would get 25,000 bytes
    # but holds only 1,000; the other 99,000 go 1:2.
    tables = {0: DynamicDemand(rows=10, pooling=1, slot_bytes=100),
              1: DynamicDemand(rows=10**6, pooling=1, slot_bytes=100),
              2: DynamicDemand(rows=10**6, pooling=2, slot_bytes=100)}
    assert budget_slots(tables, 100_000) == {0: 10, 1: 330, 2: 660}
    # Capping cascades: once table 0 is capped, table 1's larger share caps it too.
    tables[1] = DynamicDemand(rows=300, pooling=1, slot_bytes=100)
    assert budget_slots(tables, 100_000) == {0: 10, 1: 300, 2: 690}  # 100,000 - 1,000 - 30,000
    # A budget larger than every table: each keeps all its rows.
    assert budget_slots({0: DynamicDemand(rows=7, pooling=5, slot_bytes=3)}, 1e9) == {0: 7}


def test_a_budget_that_holds_no_slot_of_a_table_is_refused():
    with pytest.raises(ValueError, match="table 1: its share of the dynamic memory budget, 50 bytes, holds no slot of 100"):
        budget_slots({0: DynamicDemand(rows=10**6, pooling=99, slot_bytes=100),
                      1: DynamicDemand(rows=10**6, pooling=1, slot_bytes=100)}, 5_000)
    with pytest.raises(ValueError, match="must be > 0"):
        budget_slots({0: DynamicDemand(rows=1, pooling=1, slot_bytes=1)}, 0)


def parse(argv: list[str]):
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="tiny")
    add_config_options(p)
    return config_from_args(p.parse_args(argv))


def test_a_budget_on_the_command_line_replaces_the_presets_slots_and_bounds_the_plan():
    assert parse(["--preset", "mlperf-ids"]).dynamic.slots == 65536
    cfg = parse(["--preset", "mlperf-ids", "--dynamic-memory-gib", "0.5", "--nodes", "1", "--gpus-per-node", "2"])
    assert cfg.dynamic.slots is None and cfg.dynamic.memory_gib == 0.5
    plan, _ = make_plan(cfg, ranks_per_host=2)
    dynamic = {t: tp.shards[0].rows for t, tp in enumerate(plan) if tp.kind == "dynamic"}
    assert len(dynamic) == 8
    # A slot of mlperf-ids: 128 fp32 weights and 128 Adagrad floats = 1,024 bytes.
    assert sum(dynamic.values()) * 1024 <= 0.5 * 2**30 < (sum(dynamic.values()) + len(dynamic)) * 1024
    hot = cfg.model.multi_hot
    # Slots follow ids a sample: table 20 (100 ids a sample) against table 0 (3).
    assert dynamic[20] == int(0.5 * 2**30 * 100 / sum(hot[t] for t in dynamic) / 1024)
    assert dynamic[0] == int(0.5 * 2**30 * 3 / sum(hot[t] for t in dynamic) / 1024)


def test_a_run_sized_by_a_budget_trains_and_records_its_slots(tmp_path):
    # tiny: 1000-row tables of 16 columns (128 bytes a slot with Adagrad); table 2 has 1 id a
    # sample, table 20 has 100: 0.0002 GiB = 214,748 bytes gives them 16 and 1,661 -> 1,000 (all
    # its rows, 128,000 bytes), then table 2 the remaining 86,748 bytes = 677 slots.
    argv = ["bench", "--device", "cpu", "--run-id", "budget", "--runs-root", str(tmp_path), "--preset", "tiny",
            "--iters", "3", "--warmup", "1", "--shard", "2=dynamic,20=dynamic", "--dynamic-memory-gib", "0.0002"]
    assert main(argv) == 0
    r = load_run(resolve_run(tmp_path, "budget"))
    slots = {t: tp.shards[0].rows for t, tp in enumerate(r.manifest.plan) if tp.kind == "dynamic"}
    assert slots == {2: 677, 20: 1000}
    assert r.manifest.config.dynamic.memory_gib == 0.0002 and r.manifest.config.dynamic.slots is None
    assert r.iterations["loss"].notna().all()


def test_a_row_wise_dynamic_tables_share_is_split_over_the_ranks():
    # As the run above: 677 and 1,000 slots for tables 2 and 20, here over 2 ranks each.
    cfg = parse(["--shard", "2=dynamic_row_wise,20=dynamic", "--dynamic-memory-gib", "0.0002",
                 "--nodes", "1", "--gpus-per-node", "2"])
    plan, _ = make_plan(cfg, ranks_per_host=2)
    assert [s.rows for s in plan[2].shards] == [338, 338] and [s.rows for s in plan[20].shards] == [1000]
