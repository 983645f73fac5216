"""The synthetic data: deterministic per (seed, sample) whatever the world size; Criteo-shaped."""

from __future__ import annotations

import numpy as np
import torch

from harness.data.synthetic import SyntheticCriteo, power_law_ids
from harness.presets import MLPERF_MULTI_HOT, small, tiny


def test_local_batches_tile_the_global_batch_at_any_world_size():
    cfg = tiny()
    data = SyntheticCriteo(cfg.model, cfg.data)
    whole = data.samples(2 * 96, 96)  # global batch 2
    for world in (1, 2, 3, 4):
        parts = [data.local_batch(2, r, world) for r in range(world)]
        assert torch.equal(torch.cat([p.dense for p in parts]), whole.dense)
        assert torch.equal(torch.cat([p.labels for p in parts]), whole.labels)
        assert torch.equal(torch.cat([p.sparse.lengths for p in parts], dim=1), whole.sparse.lengths)
        # Feature-major ids: feature f of the whole batch is feature f of each part, in rank order.
        per_feature = [torch.split(p.sparse.values, (p.sparse.lengths.sum(1)).tolist()) for p in parts]
        whole_f = torch.split(whole.sparse.values, whole.sparse.lengths.sum(1).tolist())
        for f in range(26):
            assert torch.equal(torch.cat([pf[f] for pf in per_feature]), whole_f[f])


def test_shapes_ranges_and_seed():
    cfg = small()
    data = SyntheticCriteo(cfg.model, cfg.data)
    b = data.samples(0, 64)
    assert b.dense.shape == (64, 13) and b.dense.dtype == torch.float32 and (b.dense >= 0).all()
    assert set(b.labels.unique().tolist()) <= {0.0, 1.0}
    assert b.sparse.lengths.shape == (26, 64)
    assert b.sparse.lengths[:, 0].tolist() == list(MLPERF_MULTI_HOT)
    assert b.sparse.values.numel() == 214 * 64
    for f, ids in enumerate(torch.split(b.sparse.values, b.sparse.lengths.sum(1).tolist())):
        assert 0 <= ids.min() and ids.max() < cfg.model.table_rows[f]
    other = SyntheticCriteo(cfg.model, type(cfg.data)(global_batch_size=4096, seed=1)).samples(0, 64)
    assert not torch.equal(other.dense, b.dense)


def test_power_law_matches_its_distribution():
    rng = np.random.default_rng(0)
    u = rng.random(200_000)
    rows, a = 1000, 1.2
    ids = power_law_ids(u, rows, a)
    # Independent reference: the continuous law's CDF at k+1, F(x) = ((x+1)^(1-a) - 1) / ((rows+1)^(1-a) - 1).
    cdf = lambda x: ((x + 1.0) ** (1 - a) - 1) / ((rows + 1.0) ** (1 - a) - 1)
    for k in (0, 1, 9, 99):
        assert abs((ids <= k).mean() - cdf(k + 1)) < 0.005
    uniform = power_law_ids(u, rows, 0.0)
    assert abs((uniform < 100).mean() - 0.1) < 0.005
    assert ids.min() >= 0 and ids.max() < rows
