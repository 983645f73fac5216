"""Names model/ owns, importable without torch or fbgemm (the report side and the Makefile read them).

model/embeddings.py maps the optimizer names to fbgemm's enum; model/sharding.py builds the kinds.
"""

SHARDING_TYPES = ("table_wise", "column_wise", "row_wise", "table_row_wise", "grid_shard", "data_parallel", "dynamic",
                  "dynamic_row_wise")
"""How one embedding table is spread over ranks (model/sharding.py)."""

DYNAMIC_KINDS = ("dynamic", "dynamic_row_wise")
"""Kinds whose slots hold only the ids in use (model/dynamic_table.py): the whole id space on one
rank, or row-wise, each rank the slots of its row block's ids."""

DYNAMIC_POLICIES = ("lru", "lfu", "hybrid")
"""Eviction policies of a dynamic table's slots (model/id_transformer.py): least recent; fewest
accesses (least recent among equals); accesses with decaying counters (least recent among equals)."""

NODE_BLOCKED_KINDS = ("table_row_wise", "grid_shard")
"""Kinds whose column blocks are row-wise inside one node each: they share one sharding, and need
a process group a node (model/embedding_shardings.py TableRowWiseSharding)."""

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
