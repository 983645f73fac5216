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


def power_law_ids(u: np.ndarray, rows: int | np.ndarray, exponent: float, out: np.ndarray | None = None,
                  *, scale: float | np.ndarray | None = None) -> np.ndarray:
    """Ids in [0, rows) from uniforms u in [0, 1), p(k) ~ (k+1)^-exponent (inverse CDF of the continuous law).
    rows: one table size, or one per column of u (an int64 array over u's last axis: several
    tables' columns side by side, each column's ids the ones it alone would give).
    out: an int64 array of u's shape to write them into (a batch's own values buffer).
    scale: power_law_scale(rows, exponent), when the caller keeps it."""
    scale = power_law_scale(rows, exponent) if scale is None else scale
    if exponent == 0:
        k = u * scale
    elif exponent == 1:
        k = np.power(scale, u) - 1
    else:
        k = np.power(u * scale + 1.0, 1.0 / (1.0 - exponent)) - 1
    return np.minimum(k.astype(np.int64), rows - 1, out=out)


def power_law_scale(rows: int | np.ndarray, exponent: float) -> float | np.ndarray:
    """power_law_ids' constant of a table: rows (exponent 0), rows + 1 (exponent 1), else
    (rows + 1)^(1 - exponent) - 1; for an array of sizes, each computed alone as a scalar, so
    that columns side by side get the bits each table alone would."""
    if isinstance(rows, np.ndarray):
        return np.array([power_law_scale(int(r), exponent) for r in rows], dtype=np.float64)
    if exponent == 0:
        return float(rows)
    if exponent == 1:
        return rows + 1.0
    return float(np.power(rows + 1.0, 1.0 - exponent) - 1.0)


def host_buffer(shape: tuple[int, ...], dtype: torch.dtype, pin: bool) -> tuple[torch.Tensor, np.ndarray]:
    """An empty host tensor (page-locked when pin) and a numpy view of it to fill in place."""
    t = torch.empty(shape, dtype=dtype, pin_memory=pin)
    return t, t.numpy()


ID_BLOCK = 256
"""Samples whose ids are drawn together: 256 x 214 float64 temporaries (440 KB) stay in the caches."""


class SyntheticCriteo:
    """13 log-scaled dense floats, 26 fixed-hotness multi-hot features, 0/1 labels that depend on the dense part."""

    def __init__(self, model: ModelConfig, data: DataConfig) -> None:
        self.model, self.data = model, data
        self.hot_offsets = np.concatenate([[0], np.cumsum(model.multi_hot)])
        draws = model.num_dense + 1 + int(self.hot_offsets[-1])
        # Philox yields 4 words a counter step: round up so each sample starts on a step boundary.
        self.words_per_sample = -(-draws // 4) * 4
        self.column_rows = np.repeat(np.asarray(model.table_rows, dtype=np.int64), model.multi_hot)
        """The table size of each id column of a sample's draws (a feature's hotness columns each)."""
        self.column_scale = power_law_scale(self.column_rows, data.id_exponent)

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
        # Every feature's ids in one pass over the id columns (26 passes cost tiny's batch most of
        # its time), a block of samples at a time (small's whole batch would make each temporary
        # 14 MB, out of the caches), then copied feature by feature into the feature-major values.
        ids_u = u[:, nd + 1 : nd + 1 + self.hot_offsets[-1]]
        ids = np.empty(ids_u.shape, dtype=np.int64)
        for a in range(0, count, ID_BLOCK):
            power_law_ids(ids_u[a : a + ID_BLOCK], self.column_rows, self.data.id_exponent,
                          out=ids[a : a + ID_BLOCK], scale=self.column_scale)
        at = 0
        for f in range(len(self.model.table_rows)):
            block = ids[:, self.hot_offsets[f] : self.hot_offsets[f + 1]]
            out = values[at : at + per_feature[f]]
            if ragged:  # row-major: sample by sample, each sample's first ids
                out[:] = block[np.arange(hot[f])[None, :] < lengths[f][:, None]]
            else:
                out.reshape(count, hot[f])[:] = block
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
