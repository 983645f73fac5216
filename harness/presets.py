"""Presets: plain functions returning a full config (design.md, "Presets")."""

from __future__ import annotations

from collections.abc import Callable

from harness.config import BenchConfig, DataConfig, ModelConfig, RunConfig, ShardingConfig

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


PRESETS: dict[str, Callable[..., BenchConfig]] = {"mlperf": mlperf, "small": small, "tiny": tiny}
