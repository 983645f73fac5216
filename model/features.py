"""Sparse features in the layout every stage of input distribution uses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
import torch


@dataclass(frozen=True)
class FeatureOrder:
    """A reordering of features (it may drop or repeat some), held both ways: on the device for
    fbgemm's kernel, and on the host so output sizes can be computed without reading the device."""

    host: tuple[int, ...]
    device: torch.Tensor

    @classmethod
    def of(cls, order: Sequence[int], device: torch.device) -> "FeatureOrder":
        host = tuple(int(i) for i in order)
        return cls(host=host, device=torch.tensor(host, dtype=torch.int32, device=device))


@dataclass(frozen=True)
class SparseFeatures:
    """Multi-hot ids of F features for B samples, feature-major (as TorchRec's KeyedJaggedTensor).

    lengths: (F, B) int64, ids of feature f for sample b; values: all ids, feature by feature,
    sample by sample within a feature.
    """

    lengths: torch.Tensor
    values: torch.Tensor
    feature_values: tuple[int, ...] | None = None
    """How many values each feature has, when the host knows it without reading the device (the
    loader does; an exchange's receiver knows only totals). Permutes then size their output on
    the host: fbgemm would otherwise read the size from the device, a host sync on a GPU."""

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
            feature_values=self.feature_values,
        )

    def permute(self, order: FeatureOrder, *, total_values: int | None = None) -> "SparseFeatures":
        """Features reordered so that feature i of the result is feature order.host[i] of this one
        (this one itself where that is every feature in its place).

        The output's size comes from `feature_values` when known, else from `total_values`;
        with neither, fbgemm reads it from the device (a host sync on a GPU; on a CPU a read).
        """
        if order.host == tuple(range(self.lengths.shape[0])):  # every feature where it is: no kernel
            return self
        counts = None
        if self.feature_values is not None:
            counts = tuple(self.feature_values[i] for i in order.host)
            total_values = sum(counts)
        elif total_values is None and len(set(order.host)) != len(order.host):
            # fbgemm cannot size a permute that repeats features by itself: read it (callers
            # on the per-iteration path pass feature_values and never get here).
            total_values = int(self.lengths.sum(1).index_select(0, order.device.long()).sum())
        lengths, values, _ = torch.ops.fbgemm.permute_2D_sparse_data(
            order.device, self.lengths, self.values, None, total_values
        )
        return SparseFeatures(lengths=lengths, values=values, feature_values=counts)
