"""One registry from sharding type to the family that runs it, and the shardings of a plan.

Several types share a family (table-wise and column-wise one pooled all-to-all sharding,
table-row-wise and grid one node-blocked sharding): a plan's tables of those types go into one
sharding instance, as TorchRec groups tables by sharding type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from model.names import ShardingType
from model.sharding import TablePlan
from model.shardings.base import EmbeddingSharding, ShardingContext
from model.shardings.data_parallel import DataParallelSharding
from model.shardings.dynamic import DynamicRowWiseSharding, DynamicSharding
from model.shardings.row_wise import RowWiseSharding
from model.shardings.table_row_wise import TableRowWiseSharding
from model.shardings.table_wise import PooledAllToAllSharding


@dataclass(frozen=True)
class Family:
    """A way of distributing tables: one sharding over all the plan's tables of its types."""

    name: str
    """The family's name (model/planner.py GROUP_OF_KIND prices each family's collectives once)."""
    build: Callable[[ShardingContext, Sequence[TablePlan], list[int]], EmbeddingSharding]
    """Its sharding of the given tables (ascending indices into the plan)."""


POOLED = Family("pooled", PooledAllToAllSharding.from_plan)
ROW_WISE = Family("row_wise", RowWiseSharding.from_plan)
NODE_BLOCKED = Family("table_row_wise", TableRowWiseSharding.from_plan)
DYNAMIC = Family("dynamic", DynamicSharding.from_plan)
DYNAMIC_ROW_WISE = Family("dynamic_row_wise", DynamicRowWiseSharding.from_plan)
DATA_PARALLEL = Family("data_parallel", DataParallelSharding.from_plan)

FAMILY_OF: dict[ShardingType, Family] = {
    ShardingType.TABLE_WISE: POOLED,
    ShardingType.COLUMN_WISE: POOLED,
    ShardingType.ROW_WISE: ROW_WISE,
    ShardingType.TABLE_ROW_WISE: NODE_BLOCKED,
    ShardingType.GRID_SHARD: NODE_BLOCKED,
    ShardingType.DYNAMIC: DYNAMIC,
    ShardingType.DYNAMIC_ROW_WISE: DYNAMIC_ROW_WISE,
    ShardingType.DATA_PARALLEL: DATA_PARALLEL,
}
"""The family of every sharding type."""

FAMILIES = (POOLED, ROW_WISE, NODE_BLOCKED, DYNAMIC, DYNAMIC_ROW_WISE, DATA_PARALLEL)
"""The order a plan's shardings are built and run in: every rank issues their collectives in
this order, so it is part of the numbers (losses are compared bit for bit across engines and flags)."""
if set(FAMILIES) != set(FAMILY_OF.values()) or set(FAMILY_OF) != set(ShardingType):
    raise ImportError("model/shardings/registry.py: FAMILY_OF must name every sharding type, FAMILIES every family")


def build_shardings(ctx: ShardingContext, plan: Sequence[TablePlan]) -> list[EmbeddingSharding]:
    """One sharding for each family the plan uses, over its tables (ascending), in FAMILIES order.
    The plan is checked already (model.sharding.check_plan)."""
    dynamic = [t for k in (ShardingType.DYNAMIC, ShardingType.DYNAMIC_ROW_WISE)
               for t, tp in enumerate(plan) if tp.kind == k]
    if dynamic and ctx.dynamic is None:
        raise ValueError(f"tables {dynamic} are dynamic: their policy and parameter store are needed")
    tables: dict[Family, list[int]] = {f: [] for f in FAMILIES}
    for t, tp in enumerate(plan):
        tables[FAMILY_OF[tp.kind]].append(t)
    return [f.build(ctx, plan, ts) for f, ts in tables.items() if ts]
