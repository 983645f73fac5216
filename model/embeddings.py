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

INIT_CHUNK_ROWS = 65536
"""Init draws come in chunks of this many full rows, each from its own seed: any shard's
weights are a slice of the same full-table init, whatever the plan, without materialising
the full table."""


def build_fused_tbe(
    *, rows: Sequence[int], dims: Sequence[int], device: torch.device, optimizer: str, learning_rate: float, eps: float,
    precision: str = "fp32",
) -> SplitTableBatchedEmbeddingBagsCodegen:
    """Sum-pooled tables whose backward() updates the weights in place (optimizer fused):
    the embedding gradients never exist as tensors. precision: the weights' (fp32 or fp16); the
    optimizer state stays fp32 and the pooled output is fp32 either way."""
    if device.type == "cuda":
        location, compute = EmbeddingLocation.DEVICE, ComputeDevice.CUDA
    else:
        location, compute = EmbeddingLocation.HOST, ComputeDevice.CPU
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
    """Fill a shard (rows row_start.., columns col_start..) with its slice of the table's init.

    The table's init is TorchRec's default U(-1/sqrt(rows), 1/sqrt(rows)); chunk k of its
    rows is drawn at the table's full width from a generator seeded by (seed, table, k) alone.
    """
    bound = table_rows**-0.5
    rows, cols = weight.shape
    row, end = row_start, row_start + rows
    with torch.no_grad():
        while row < end:
            k = row // INIT_CHUNK_ROWS
            first = k * INIT_CHUNK_ROWS
            gen = torch.Generator().manual_seed((seed * 1_000_003 + table) * 1_000_003 + k)
            chunk = torch.empty(min(INIT_CHUNK_ROWS, table_rows - first), table_dim).uniform_(-bound, bound, generator=gen)
            take = min(end, first + chunk.shape[0]) - row
            weight[row - row_start : row - row_start + take].copy_(
                chunk[row - first : row - first + take, col_start : col_start + cols]
            )
            row += take
