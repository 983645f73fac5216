"""Presets: plain functions returning a full config (design.md, "Presets")."""

from __future__ import annotations

from collections.abc import Callable

from harness.config import BenchConfig, DataConfig, DynamicConfig, ModelConfig, RunConfig, ShardingConfig
from harness.names import ShardingType

MLPERF_TABLE_ROWS = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)
MLPERF_MULTI_HOT = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)


def mlperf(**run: object) -> BenchConfig:
    """MLPerf Training DLRM-DCNv2 exactly: full tables, global batch 65536, planned for H100 nodes."""
    return BenchConfig(
        model=ModelConfig(table_rows=MLPERF_TABLE_ROWS, multi_hot=MLPERF_MULTI_HOT),
        data=DataConfig(global_batch_size=65536),
        sharding=ShardingConfig(hardware="h100"),
        run=RunConfig(preset="mlperf", **run),
    )


def small(**run: object) -> BenchConfig:
    """The MLPerf model with every table capped at 100k rows and a global batch 2 CPU cores train in about 3 s an iteration."""
    return BenchConfig(
        model=ModelConfig(table_rows=tuple(min(r, 100_000) for r in MLPERF_TABLE_ROWS), multi_hot=MLPERF_MULTI_HOT),
        data=DataConfig(global_batch_size=4096),
        run=RunConfig(preset="small", **run),
    )


MLPERF_IDS_SLOTS = 65536
"""Slots of each dynamic table of mlperf-ids: every table with more rows is dynamic. Its batch of
512 has at most 512 x 100 = 51,200 ids of table 20 (the hottest), so no batch outgrows them."""


MLPERF_IDS_RSS_BUDGET_GIB = 4.0
"""What a rank of mlperf-ids may hold (peak resident memory; make perf-dynamic checks it): its
dynamic tables' slots and Adagrad state (at most 8 x 64 MiB), the embedded store's rows in memory
(--ps-memory-gib, 1 GiB; more spill to a file), the other tables, the dense model, batches and
the runtime. The same tables static would take about 200 GiB of weights and Adagrad state."""


def mlperf_ids(**run: object) -> BenchConfig:
    """MLPerf's full id spaces (five 40M-row tables) and hotness with small's model and a global
    batch of 512: every table of more than MLPERF_IDS_SLOTS rows is dynamic (8 tables), the rest
    planned as usual, so this machine trains the real id space in bounded memory (about 64 MiB of
    slots and Adagrad state a dynamic table, where one static 40M-row table would take 40 GiB)."""
    return BenchConfig(
        model=ModelConfig(table_rows=MLPERF_TABLE_ROWS, multi_hot=MLPERF_MULTI_HOT),
        data=DataConfig(global_batch_size=512),
        sharding=ShardingConfig(per_table=tuple((t, ShardingType.DYNAMIC.value)
                                                for t, r in enumerate(MLPERF_TABLE_ROWS) if r > MLPERF_IDS_SLOTS)),
        dynamic=DynamicConfig(slots=MLPERF_IDS_SLOTS),
        run=RunConfig(preset="mlperf-ids", **run),
    )


def tiny(**run: object) -> BenchConfig:
    """Same 26 features and hotness, shrunk dims and rows <= 1000: millisecond, latency-bound iterations.

    The global batch 96 divides by 1, 2, 3, 4, 6, 8, 12, 16, 32 and 48 ranks.
    """
    return BenchConfig(
        model=ModelConfig(
            table_rows=tuple(min(r, 1000) for r in MLPERF_TABLE_ROWS),
            multi_hot=MLPERF_MULTI_HOT,
            embedding_dim=16,
            bottom_mlp=(32, 16),
            cross_layers=2,
            cross_rank=8,
            top_mlp=(32, 16, 1),
        ),
        data=DataConfig(global_batch_size=96),
        run=RunConfig(preset="tiny", **run),
    )


PRESETS: dict[str, Callable[..., BenchConfig]] = {"mlperf": mlperf, "small": small, "tiny": tiny, "mlperf-ids": mlperf_ids}
