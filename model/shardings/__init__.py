"""The sharding families, one module each (as TorchRec lays out tw_sharding.py, rw_sharding.py,
twrw_sharding.py, dp_sharding.py), and the registry from sharding type to family.

- base.py: the job's context (ShardingContext), the protocol every sharding follows, shared helpers;
- table_wise.py: table-wise and column-wise (PooledAllToAllSharding);
- row_wise.py: row-wise;
- table_row_wise.py: table-row-wise and grid (NodeBlock);
- data_parallel.py: data-parallel;
- dynamic.py: dynamic and dynamic row-wise;
- registry.py: ShardingType -> family, and the shardings of a plan in their fixed order.
"""

from model.shardings.base import BackwardInFlight, EmbeddingSharding, ShardForward, ShardingContext
from model.shardings.registry import FAMILIES, FAMILY_OF, Family, build_shardings

__all__ = ["FAMILIES", "FAMILY_OF", "BackwardInFlight", "EmbeddingSharding", "Family", "ShardForward",
           "ShardingContext", "build_shardings"]
