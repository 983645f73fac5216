"""Sparse features in the layout every stage of input distribution uses."""

from __future__ import annotations

from dataclasses import dataclass

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
import torch


@dataclass(frozen=True)
class SparseFeatures:
    """Multi-hot ids of F features for B samples, feature-major (as TorchRec's KeyedJaggedTensor).

    lengths: (F, B) int64, ids of feature f for sample b; values: all ids, feature by feature,
    sample by sample within a feature.
    """

    lengths: torch.Tensor
    values: torch.Tensor

    @property
    def num_features(self) -> int:
        return self.lengths.shape[0]

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[1]

    def offsets(self) -> torch.Tensor:
        """The F*B+1 offsets fbgemm's table-batched embedding takes."""
        return torch.ops.fbgemm.asynchronous_complete_cumsum(self.lengths.reshape(-1))

    def to(self, device: torch.device, *, non_blocking: bool = False) -> "SparseFeatures":
        return SparseFeatures(
            lengths=self.lengths.to(device, non_blocking=non_blocking),
            values=self.values.to(device, non_blocking=non_blocking),
        )

    def permute(self, order: torch.Tensor, *, total_values: int | None = None) -> "SparseFeatures":
        """Features reordered so that feature i of the result is feature order[i] of this one.

        `order` (int32) may drop or repeat features; when it repeats one, fbgemm needs the
        result's number of values, `total_values`.
        """
        lengths, values, _ = torch.ops.fbgemm.permute_2D_sparse_data(order, self.lengths, self.values, None, total_values)
        return SparseFeatures(lengths=lengths, values=values)
