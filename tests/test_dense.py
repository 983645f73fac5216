"""The dense arch against hand-written float64 math, and its FLOP count against a hand count."""

from __future__ import annotations

import torch

from harness.presets import mlperf, tiny
from model.dense import DenseArch, dense_flops_per_sample


def test_dense_arch_matches_float64_formula():
    cfg = tiny()
    torch.manual_seed(0)
    arch = DenseArch(**cfg.model.dense_arch_kwargs()).double()
    p = {k: v.detach() for k, v in arch.state_dict().items()}
    dense = torch.rand(5, 13, dtype=torch.float64)
    pooled = torch.randn(5, 26 * 16, dtype=torch.float64)

    h = torch.relu(dense @ p["bottom.0.weight"].T + p["bottom.0.bias"])
    h = torch.relu(h @ p["bottom.2.weight"].T + p["bottom.2.bias"])
    x0 = torch.cat([h, pooled], 1)
    x = x0
    for layer in range(2):  # x_{l+1} = x0 * (W (V x) + b) + x
        x = x0 * ((x @ p[f"cross.V.{layer}.weight"].T) @ p[f"cross.W.{layer}.weight"].T + p[f"cross.W.{layer}.bias"]) + x
    t = torch.relu(x @ p["top.0.weight"].T + p["top.0.bias"])
    t = torch.relu(t @ p["top.2.weight"].T + p["top.2.bias"])
    logits = (t @ p["top.4.weight"].T + p["top.4.bias"]).squeeze(1)

    torch.testing.assert_close(arch(dense, pooled), logits, rtol=1e-12, atol=1e-12)
    assert p["cross.V.0.weight"].shape == (8, 27 * 16) and "cross.V.0.bias" not in p


def test_mlperf_shapes_and_flops():
    cfg = mlperf()
    arch = DenseArch(**cfg.model.dense_arch_kwargs())
    shapes = {k: tuple(v.shape) for k, v in arch.state_dict().items()}
    assert shapes["bottom.0.weight"] == (512, 13) and shapes["bottom.4.weight"] == (128, 256)
    assert shapes["cross.V.2.weight"] == (512, 3456) and shapes["cross.W.2.weight"] == (3456, 512)
    assert shapes["top.0.weight"] == (1024, 3456) and shapes["top.8.weight"] == (1, 256)
    # Hand count of multiply-adds: bottom 13*512+512*256+256*128; cross 3*2*3456*512;
    # top 3456*1024+1024*1024+1024*512+512*256+256*1.
    macs = (6656 + 131072 + 32768) + 10616832 + (3538944 + 1048576 + 524288 + 131072 + 256)
    assert dense_flops_per_sample(**cfg.model.dense_arch_kwargs()) == 6 * macs  # ~96 MFLOP (design.md)


def test_cross_layers_start_as_torchrecs_xavier_normal_with_zero_bias():
    """Each cross kernel's spread within 10% of xavier-normal's sqrt(2 / (fan_in + fan_out)), mean
    near 0, and every bias exactly 0 (MLPerf's shapes: 3456 wide, rank 512)."""
    import math

    from model.dense import LowRankCrossNet

    torch.manual_seed(0)
    net = LowRankCrossNet(width=3456, num_layers=3, rank=512)
    xavier = math.sqrt(2.0 / (3456 + 512))
    for v, w in zip(net.V, net.W):
        for kernel in (v.weight, w.weight):
            assert abs(kernel.std().item() / xavier - 1) < 0.1
            assert abs(kernel.mean().item()) < 0.01 * xavier * 10
        assert torch.count_nonzero(w.bias) == 0
