"""fbgemm table-batched embeddings, their optimizers, and the weights' deterministic init."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    DenseTableBatchedEmbeddingBagsCodegen,
    SplitTableBatchedEmbeddingBagsCodegen,
)

from model.extensions import extension
from model.names import EMBEDDING_OPTIMIZERS as EMBEDDING_OPTIMIZER_NAMES
from model.names import TABLE_PRECISIONS

# fbgemm's CPU dense TBE registers its backward the old way and torch warns on every backward;
# its gradients equal nn.EmbeddingBag's exactly (tests/test_embeddings.py checks them).
warnings.filterwarnings("ignore", message="fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel")

# fbgemm's enum for each optimizer name (the names live torch-free in model/names.py).
EMBEDDING_OPTIMIZERS = {name: getattr(EmbOptimType, name.upper()) for name in EMBEDDING_OPTIMIZER_NAMES}

# fbgemm's weights precision for each table precision name (model/names.py).
WEIGHTS_PRECISIONS = {"fp32": SparseType.FP32, "fp16": SparseType.FP16}
if set(WEIGHTS_PRECISIONS) != set(TABLE_PRECISIONS):  # a name added there needs its type here
    raise ImportError(f"model/embeddings.py maps {sorted(WEIGHTS_PRECISIONS)}, model/names.py names {TABLE_PRECISIONS}")

INIT_BLOCK_ROWS = 8192
"""Rows init_shard_ computes at once (bounds the int64 scratch: 8192 x 128 x 8 B = 8 MiB)."""


def _int64(x: int) -> int:
    """A 64-bit pattern as the int64 torch stores it."""
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN = _int64(0x9E3779B97F4A7C15)
_MIX1 = _int64(0xBF58476D1CE4E5B9)
_MIX2 = _int64(0x94D049BB133111EB)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 (multiplication wraps; the masks make the shifts logical)."""
    z = (z ^ ((z >> 30) & ((1 << 34) - 1))) * _MIX1
    z = (z ^ ((z >> 27) & ((1 << 37) - 1))) * _MIX2
    return z ^ ((z >> 31) & ((1 << 33) - 1))


def _stream(seed: int, table: int) -> int:
    """The table's key: splitmix64's finaliser of (seed * 1000003 + table), as int64."""
    z = (seed * 1_000_003 + table) & ((1 << 64) - 1)
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        z = ((z ^ (z >> shift)) * mult) & ((1 << 64) - 1)
    return _int64(z ^ (z >> 31))


def init_values(rows: torch.Tensor, *, col_start: int, cols: int, table: int, table_rows: int, table_dim: int,
                seed: int) -> torch.Tensor:
    """The table's init of `rows` (int64, any order) x columns col_start.., float32 on rows' device.

    TorchRec's default U(-1/sqrt(rows), 1/sqrt(rows)), counter-based: element (r, c) is a hash of
    (seed, table, r * table_dim + c) alone (splitmix64: state r * table_dim + c steps of its golden
    gamma from the table's key, then its finaliser), its top 24 bits u / 2^24 mapped to
    -b + 2b * u in float64, then rounded to float32. So any row's values are the same whichever
    shard, slot or batch of rows asks for them, and one row costs what one row is: a dynamic
    table initialises the rows it admits, one by one, from ids anywhere in a 40M-row id space."""
    b = table_rows**-0.5
    if rows.device.type == "cpu":  # the same bits in one pass (csrc/row_init.cpp): 10x the torch ops below
        return extension("model._row_init", "row init").init_values(rows.to(torch.int64), col_start, cols, table_dim,
                                                                   _stream(seed, table), b)
    return _init_values_torch(rows, col_start=col_start, cols=cols, table_dim=table_dim, key=_stream(seed, table), b=b)


def _init_values_torch(rows: torch.Tensor, *, col_start: int, cols: int, table_dim: int, key: int,
                       b: float) -> torch.Tensor:
    """init_values in torch's element-wise ops, on any device (the host takes csrc/row_init.cpp)."""
    x = rows.to(torch.int64).view(-1, 1) * table_dim + torch.arange(col_start, col_start + cols, device=rows.device)
    z = _mix(x * _GOLDEN + key)
    u = ((z >> 40) & 0xFFFFFF).to(torch.float64) / (1 << 24)
    return (u * (2 * b) - b).to(torch.float32)


def tbe_placement(device: torch.device) -> tuple[EmbeddingLocation, ComputeDevice]:
    """Where fbgemm keeps a fused table's weights and runs its kernels: in GPU memory with CUDA
    kernels on a GPU (not managed/UVM memory: the tables fit, and UVM would page), on the host with
    CPU kernels elsewhere."""
    if device.type == "cuda":
        return EmbeddingLocation.DEVICE, ComputeDevice.CUDA
    return EmbeddingLocation.HOST, ComputeDevice.CPU


def build_fused_tbe(
    *, rows: Sequence[int], dims: Sequence[int], device: torch.device, optimizer: str, learning_rate: float, eps: float,
    precision: str = "fp32",
) -> SplitTableBatchedEmbeddingBagsCodegen:
    """Sum-pooled tables whose backward() updates the weights in place (optimizer fused):
    the embedding gradients never exist as tensors. precision: the weights' (fp32 or fp16); the
    optimizer state stays fp32 and the pooled output is fp32 either way."""
    location, compute = tbe_placement(device)
    return SplitTableBatchedEmbeddingBagsCodegen(
        [(r, d, location, compute) for r, d in zip(rows, dims)],
        optimizer=EMBEDDING_OPTIMIZERS[optimizer],
        learning_rate=learning_rate,
        eps=eps,
        pooling_mode=PoolingMode.SUM,
        device=device,
        weights_precision=WEIGHTS_PRECISIONS[precision],
        output_dtype=SparseType.FP32,
    )


def build_dense_tbe(*, rows: Sequence[int], dims: Sequence[int], device: torch.device) -> DenseTableBatchedEmbeddingBagsCodegen:
    """Sum-pooled tables with an ordinary dense weight gradient (for replicated, data-parallel tables)."""
    return DenseTableBatchedEmbeddingBagsCodegen(
        list(zip(rows, dims)), pooling_mode=PoolingMode.SUM, use_cpu=device.type != "cuda"
    ).to(device)


def init_shard_(
    weight: torch.Tensor, *, table: int, table_rows: int, table_dim: int, row_start: int, col_start: int, seed: int
) -> None:
    """Fill a shard (rows row_start.., columns col_start..) with its slice of the table's init
    (init_values, computed on the weight's device), INIT_BLOCK_ROWS rows at a time."""
    rows, cols = weight.shape
    with torch.no_grad():
        for first in range(0, rows, INIT_BLOCK_ROWS):
            n = min(INIT_BLOCK_ROWS, rows - first)
            block = init_values(torch.arange(row_start + first, row_start + first + n, device=weight.device),
                                col_start=col_start, cols=cols,
                                table=table, table_rows=table_rows, table_dim=table_dim, seed=seed)
            weight[first : first + n].copy_(block)


def init_rows(ids: torch.Tensor, *, table: int, table_rows: int, table_dim: int, seed: int) -> torch.Tensor:
    """The init of the table's rows `ids` (int64, any order), (len(ids), table_dim) float32 on the
    host: the values init_shard_ gives those rows (a dynamic table's row is its id's, not its slot's)."""
    return init_values(ids, col_start=0, cols=table_dim, table=table, table_rows=table_rows, table_dim=table_dim,
                       seed=seed)
