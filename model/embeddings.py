"""fbgemm table-batched embeddings with the optimizer fused into backward."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)

# The fused optimizers fbgemm's CPU and CUDA kernels both support (Adam is CUDA-only).
EMBEDDING_OPTIMIZERS = {
    "exact_adagrad": EmbOptimType.EXACT_ADAGRAD,
    "exact_rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    "exact_sgd": EmbOptimType.EXACT_SGD,
}


def build_tbe(
    *,
    rows: Sequence[int],
    dim: int,
    device: torch.device,
    optimizer: str,
    learning_rate: float,
    eps: float,
) -> SplitTableBatchedEmbeddingBagsCodegen:
    """One table-batched embedding holding `rows` tables of width `dim`, sum-pooled.

    backward() on its output updates the weights in place (the optimizer is fused), so the
    embedding gradients never exist as tensors.
    """
    if device.type == "cuda":
        location, compute = EmbeddingLocation.DEVICE, ComputeDevice.CUDA
    else:
        location, compute = EmbeddingLocation.HOST, ComputeDevice.CPU
    return SplitTableBatchedEmbeddingBagsCodegen(
        [(r, dim, location, compute) for r in rows],
        optimizer=EMBEDDING_OPTIMIZERS[optimizer],
        learning_rate=learning_rate,
        eps=eps,
        pooling_mode=PoolingMode.SUM,
        device=device,
    )


def init_table_(weight: torch.Tensor, *, table: int, seed: int) -> None:
    """TorchRec's default init, U(-1/sqrt(rows), 1/sqrt(rows)), from a stream owned by this table alone.

    Seeding per table (not per rank) makes the weights independent of the sharding plan and
    the world size, which is what lets a sharded run be compared with an unsharded one.
    """
    bound = weight.shape[0] ** -0.5
    gen = torch.Generator(device=weight.device)
    gen.manual_seed(seed * 1_000_003 + table)
    with torch.no_grad():
        weight.uniform_(-bound, bound, generator=gen)
