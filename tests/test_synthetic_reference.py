"""The synthetic stream against a reference written out here the plain way (numpy arrays, a
boolean mask for every feature, one concatenation, as the stream was first written): the faster
generator (buffers filled in place, page-locked on request) must give the very same numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.config import DataConfig
from harness.data.synthetic import SyntheticCriteo
from harness.presets import small, tiny


def reference(model, data, start: int, count: int, ragged: bool):
    hot_offsets = np.concatenate([[0], np.cumsum(model.multi_hot)])
    wps = -(-(model.num_dense + 1 + int(hot_offsets[-1])) // 4) * 4
    bits = np.random.Philox(key=data.seed, counter=[start * wps // 4, 0, 0, 0])
    u = (bits.random_raw(count * wps).reshape(count, -1) >> 11) * (1.0 / (1 << 53))
    nd = model.num_dense
    dense = np.log1p(-np.log1p(-u[:, :nd]) * 8.0)
    logit = 0.6 * (dense[:, :4].sum(1) - dense[:, 4:8].sum(1)) - 1.0
    labels = (u[:, nd] < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    hot = np.asarray(model.multi_hot, dtype=np.int64)
    lengths = np.repeat(hot[:, None], count, axis=1)
    if ragged:
        lengths[:, np.arange(start, start + count) % 2 == 1] = (hot[:, None] + 1) // 2
    values = []
    for f, rows in enumerate(model.table_rows):
        x = u[:, nd + 1 + hot_offsets[f]: nd + 1 + hot_offsets[f + 1]]
        e = data.id_exponent
        if e == 0:
            k = x * rows
        elif e == 1:
            k = (rows + 1.0) ** x - 1
        else:
            k = (x * ((rows + 1.0) ** (1.0 - e) - 1.0) + 1.0) ** (1.0 / (1.0 - e)) - 1
        ids = np.minimum(k.astype(np.int64), rows - 1)
        values.append(ids[np.arange(hot[f])[None, :] < lengths[f][:, None]])
    return dense.astype(np.float32), labels, lengths, np.concatenate(values)


@pytest.mark.parametrize("preset,exponent", [(tiny, 1.05), (small, 1.05), (tiny, 0.0), (tiny, 1.0)])
@pytest.mark.parametrize("pin", [False, pytest.param(True, marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="page-locked memory needs CUDA")])])
def test_the_stream_is_the_reference(preset, exponent, pin):
    cfg = preset()
    data = DataConfig(global_batch_size=64, id_exponent=exponent, ragged_every=2, seed=7)
    source = SyntheticCriteo(cfg.model, data)
    for it in range(3):  # iteration 1 is ragged
        for rank, world in ((0, 1), (1, 2)):
            got = source.local_batch(it, rank, world, pin=pin)
            local = 64 // world
            want = reference(cfg.model, data, it * 64 + rank * local, local, ragged=not source.is_regular(it))
            assert np.array_equal(got.dense.numpy(), want[0]) and np.array_equal(got.labels.numpy(), want[1])
            assert np.array_equal(got.sparse.lengths.numpy(), want[2])
            assert np.array_equal(got.sparse.values.numpy(), want[3])
            assert got.sparse.feature_values == tuple(int(n) for n in want[2].sum(1))
            assert got.dense.is_pinned() == pin and got.sparse.values.is_pinned() == pin
