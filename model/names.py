"""Names model/ owns, importable without torch or fbgemm (the report side and the Makefile read them).

model/embeddings.py maps the optimizer names to fbgemm's enum; model/sharding.py builds the kinds.
"""

import enum


class ShardingType(str, enum.Enum):
    """How one embedding table is spread over ranks (model/sharding.py; one sharding family each in
    model/shardings/). str-valued: a member equals, hashes and prints as its string, so records,
    manifests and the command line keep the plain strings."""

    TABLE_WISE = "table_wise"
    COLUMN_WISE = "column_wise"
    ROW_WISE = "row_wise"
    TABLE_ROW_WISE = "table_row_wise"
    GRID_SHARD = "grid_shard"
    DATA_PARALLEL = "data_parallel"
    DYNAMIC = "dynamic"
    DYNAMIC_ROW_WISE = "dynamic_row_wise"

    # The string, not "ShardingType.ROW_WISE", in messages and printed plans.
    __str__ = str.__str__
    __format__ = str.__format__


SHARDING_TYPES = tuple(k.value for k in ShardingType)
"""The sharding types' strings, in ShardingType's order (the Makefile and the CLI's choices)."""

DYNAMIC_KINDS = frozenset({ShardingType.DYNAMIC, ShardingType.DYNAMIC_ROW_WISE})
"""Kinds whose slots hold only the ids in use (model/dynamic_table.py): the whole id space on one
rank, or row-wise, each rank the slots of its row block's ids."""

NODE_BLOCKED_KINDS = frozenset({ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD})
"""Kinds whose column blocks are row-wise inside one node each: they share one sharding, and need
a process group a node (model/shardings/table_row_wise.py)."""

ROW_BLOCKED_KINDS = frozenset({ShardingType.ROW_WISE, ShardingType.DYNAMIC_ROW_WISE, *NODE_BLOCKED_KINDS})
"""Kinds whose ids go to a rank by row block: their splits depend on the ids, and their shards'
partial sums are reduced (over the world, or inside a node)."""

KNOWN_SPLITS_KINDS = frozenset({ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.DYNAMIC})
"""Kinds whose ids go whole to each rank holding a column block: with a fixed hotness the splits
are known without exchanging them (--skip-splits-a2a)."""

COLUMN_BLOCKED_KINDS = frozenset({ShardingType.COLUMN_WISE, ShardingType.GRID_SHARD})
"""Kinds whose tables are cut into column blocks, one a rank (column-wise) or a node (grid)."""

DYNAMIC_POLICIES = ("lru", "lfu", "hybrid")
"""Eviction policies of a dynamic table's slots (model/id_transformer.py): least recent; fewest
accesses (least recent among equals); accesses with decaying counters (least recent among equals)."""

EMBEDDING_OPTIMIZERS = ("exact_adagrad", "exact_rowwise_adagrad", "exact_sgd")
"""The fused optimizers fbgemm's CPU and CUDA kernels both support (Adam is CUDA-only)."""

TABLE_PRECISIONS = ("fp32", "fp16")
"""Weights precision of the fused (fbgemm) tables; the fused optimizer's state stays fp32 as
fbgemm keeps it, and lookups come out in fp32. fp16 changes the numbers by design."""

WEIGHT_BYTES = {"fp32": 4, "fp16": 2}
"""Bytes a weight element takes at each table precision (for memory planning)."""

EXCHANGE_PHASES = ("ids", "pooled_fwd", "pooled_bwd", "table_grads", "dense_grads")
"""What a collective's bytes are counted as (model/collective_bytes.py). ids: the ids and splits
all-to-alls; pooled_fwd / pooled_bwd: the pooled embeddings and their gradients; table_grads: the
data-parallel tables' gradient all-reduce; dense_grads: the dense arch's."""

COMM_PRECISIONS = ("fp32", "fp16", "bf16", "fp8")
"""Precision of the pooled embeddings and their gradients on the wire (TorchRec's qcomms): encoded
before each exchange, decoded to fp32 after; fp8 rows carry a per-row scale (model/wire_codec.py)."""

COLLECTIVE_WAITS = ("poll", "block")
"""How the host waits for a collective it launched (model/collective_wait.py)."""

STATE_PER_ELEMENT = {"exact_adagrad": 1.0, "exact_rowwise_adagrad": 0.0, "exact_sgd": 0.0}
"""Optimizer state a weight element carries, in floats per element (for memory planning)."""

STATE_PER_ROW = {"exact_adagrad": 0.0, "exact_rowwise_adagrad": 1.0, "exact_sgd": 0.0}
"""Optimizer state a weight row carries, in floats per row (row-wise Adagrad keeps one a row)."""
