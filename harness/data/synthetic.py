"""Synthetic Criteo-shaped batches: the one source of batches for the train loop.

Sample j of the stream is a pure function of (seed, j): every sample owns a fixed slice of
a Philox counter space, so a rank draws only its own samples and any world size sees the
same global batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from harness.config import DataConfig, ModelConfig
from model.features import SparseFeatures


@dataclass(frozen=True)
class Batch:
    dense: torch.Tensor  # (B, num_dense) float32
    sparse: SparseFeatures  # (F, B) lengths, ids feature-major
    labels: torch.Tensor  # (B,) float32 in {0, 1}

    def to(self, device: torch.device, *, non_blocking: bool = False) -> "Batch":
        return Batch(
            dense=self.dense.to(device, non_blocking=non_blocking),
            sparse=self.sparse.to(device, non_blocking=non_blocking),
            labels=self.labels.to(device, non_blocking=non_blocking),
        )

    def pin(self) -> "Batch":
        """The batch in page-locked host memory: a copy to a GPU from it can run asynchronously."""
        sparse = SparseFeatures(lengths=self.sparse.lengths.pin_memory(), values=self.sparse.values.pin_memory(),
                                feature_values=self.sparse.feature_values)
        return Batch(dense=self.dense.pin_memory(), sparse=sparse, labels=self.labels.pin_memory())


def power_law_ids(u: np.ndarray, rows: int, exponent: float, out: np.ndarray | None = None) -> np.ndarray:
    """Ids in [0, rows) from uniforms u in [0, 1), p(k) ~ (k+1)^-exponent (inverse CDF of the continuous law).
    out: an int64 array of u's shape to write them into (a batch's own values buffer)."""
    if exponent == 0:
        k = u * rows
    elif exponent == 1:
        k = np.power(rows + 1.0, u) - 1
    else:
        e = 1.0 - exponent
        k = np.power(u * (np.power(rows + 1.0, e) - 1.0) + 1.0, 1.0 / e) - 1
    return np.minimum(k.astype(np.int64), rows - 1, out=out)


def host_buffer(shape: tuple[int, ...], dtype: torch.dtype, pin: bool) -> tuple[torch.Tensor, np.ndarray]:
    """An empty host tensor (page-locked when pin) and a numpy view of it to fill in place."""
    t = torch.empty(shape, dtype=dtype, pin_memory=pin)
    return t, t.numpy()


class SyntheticCriteo:
    """13 log-scaled dense floats, 26 fixed-hotness multi-hot features, 0/1 labels that depend on the dense part."""

    def __init__(self, model: ModelConfig, data: DataConfig) -> None:
        self.model, self.data = model, data
        self.hot_offsets = np.concatenate([[0], np.cumsum(model.multi_hot)])
        draws = model.num_dense + 1 + int(self.hot_offsets[-1])
        # Philox yields 4 words a counter step: round up so each sample starts on a step boundary.
        self.words_per_sample = -(-draws // 4) * 4

    def samples(self, start: int, count: int, *, ragged: bool = False, pin: bool = False) -> Batch:
        """Samples start .. start+count-1 of the stream; ragged: odd samples keep half their ids.
        pin: made in page-locked memory (the numbers are written there, not copied after)."""
        bits = np.random.Philox(key=self.data.seed, counter=[start * self.words_per_sample // 4, 0, 0, 0])
        u = (bits.random_raw(count * self.words_per_sample).reshape(count, -1) >> 11) * (1.0 / (1 << 53))
        nd = self.model.num_dense
        dense_t, dense = host_buffer((count, nd), torch.float32, pin)
        d64 = np.log1p(-np.log1p(-u[:, :nd]) * 8.0)  # log(1 + exponential counts), as Criteo's preprocessing
        dense[:] = d64
        logit = 0.6 * (d64[:, :4].sum(1) - d64[:, 4:8].sum(1)) - 1.0
        labels_t, labels = host_buffer((count,), torch.float32, pin)
        labels[:] = u[:, nd] < 1.0 / (1.0 + np.exp(-logit))
        hot = np.asarray(self.model.multi_hot, dtype=np.int64)
        lengths = np.repeat(hot[:, None], count, axis=1)
        if ragged:  # by global sample index, so any world size sees the same batch
            odd = (np.arange(start, start + count) % 2 == 1)
            lengths[:, odd] = (hot[:, None] + 1) // 2
        per_feature = lengths.sum(1)
        values_t, values = host_buffer((int(per_feature.sum()),), torch.int64, pin)
        at = 0
        for f, rows in enumerate(self.model.table_rows):
            ids_u = u[:, nd + 1 + self.hot_offsets[f] : nd + 1 + self.hot_offsets[f + 1]]
            out = values[at : at + per_feature[f]]
            if ragged:  # row-major: sample by sample, each sample's first ids
                keep = np.arange(hot[f])[None, :] < lengths[f][:, None]
                out[:] = power_law_ids(ids_u, rows, self.data.id_exponent)[keep]
            else:
                power_law_ids(ids_u, rows, self.data.id_exponent, out=out.reshape(count, hot[f]))
            at += per_feature[f]
        lengths_t, lengths_np = host_buffer(lengths.shape, torch.int64, pin)
        lengths_np[:] = lengths
        return Batch(dense=dense_t, labels=labels_t,
                     sparse=SparseFeatures(lengths=lengths_t, values=values_t,
                                           feature_values=tuple(int(n) for n in per_feature)))

    def is_regular(self, iteration: int) -> bool:
        """Whether global batch `iteration` has the fixed hotness (every rank can tell alone)."""
        k = self.data.ragged_every
        return k == 0 or (iteration + 1) % k != 0

    def global_batch(self, iteration: int) -> Batch:
        return self.samples(iteration * self.data.global_batch_size, self.data.global_batch_size,
                            ragged=not self.is_regular(iteration))

    def local_batch(self, iteration: int, rank: int, world_size: int, *, pin: bool = False) -> Batch:
        """Rank's share of global batch `iteration`: samples in rank order, as the reference sees them.
        pin: in page-locked memory, for an asynchronous copy to a GPU."""
        local = self.data.global_batch_size // world_size
        return self.samples(iteration * self.data.global_batch_size + rank * local, local,
                            ragged=not self.is_regular(iteration), pin=pin)
