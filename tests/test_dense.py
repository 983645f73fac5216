"""The dense arch against hand-written float64 math, and its FLOP count against a hand count."""

from __future__ import annotations

import pytest
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


def _cross_step(net, x0: torch.Tensor, bf16: bool):
    """The cross net's output, and the gradients of a weighted sum of it: x0's and each parameter's."""
    x = x0.clone().requires_grad_(True)
    with torch.autocast(x0.device.type, dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
        y = net(x)
    (y.double() * torch.linspace(-1, 1, y.shape[1], dtype=torch.float64, device=y.device)).sum().backward()
    return [t.cpu() for t in (y.detach(), x.grad, *(p.grad for p in net.parameters()))]


def _hand_cross(net, x0: torch.Tensor) -> list[torch.Tensor]:
    """The same in float64, from the written formula x_{l+1} = x0 * (W (V x) + b) + x, through autograd."""
    p = [q.detach().cpu().double().requires_grad_(True) for q in net.parameters()]
    V, W, b = p[: len(net.V)], p[len(net.V) :: 2], p[len(net.V) + 1 :: 2]
    x0 = x0.cpu().double().requires_grad_(True)
    x = x0
    for v, w, bias in zip(V, W, b):
        x = x0 * ((x @ v.T) @ w.T + bias) + x
    (x * torch.linspace(-1, 1, x.shape[1], dtype=torch.float64)).sum().backward()
    grads = {id(q): q.grad for q in p}
    order = [*V, *(t for pair in zip(W, b) for t in pair)]  # nn.Module's order: V.0.., then W.0 weight, bias, ...
    assert [tuple(q.shape) for q in order] == [tuple(q.shape) for q in net.parameters()]
    return [x.detach(), x0.grad, *(grads[id(q)] for q in order)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])]
"""CUDA runs the mixed-dtype multiplies and adds in its own kernels (a CPU makes temporaries)."""


@pytest.mark.parametrize("device", DEVICES)
def test_fused_cross_layers_match_the_formula_in_float64(device):
    """The fused layers (model/cross_layer.py): output and every gradient against the formula
    differentiated by autograd in float64, to float64's and to float32's rounding."""
    from model.dense import LowRankCrossNet

    torch.manual_seed(0)
    net = LowRankCrossNet(width=48, num_layers=3, rank=6).to(device)
    for w in net.W:  # a non-zero bias, so that its gradient and its place in the product are checked
        torch.nn.init.normal_(w.bias)
    x0 = torch.randn(20, 48).to(device)
    want = _hand_cross(net, x0)
    got32 = _cross_step(net, x0, bf16=False)
    assert all(_rel(g, w) < 1e-5 for g, w in zip(got32, want)), [_rel(g, w) for g, w in zip(got32, want)]
    net64 = net.double()
    for q in net64.parameters():
        q.grad = None
    got64 = _cross_step(net64, x0.double(), bf16=False)
    assert all(_rel(g, w) < 1e-13 for g, w in zip(got64, want)), [_rel(g, w) for g, w in zip(got64, want)]


@pytest.mark.parametrize("device", DEVICES)
def test_fused_cross_layers_round_as_autocast_does_in_bf16(device):
    """Under bf16 autocast the fused layers round where torch's autocast + autograd round the
    formula (GEMMs in bf16, elementwise in fp32): within a bf16 unit of them (GEMM layouts may
    round one element differently), while both are far further from fp32."""
    import copy

    from model.dense import LowRankCrossNet

    torch.manual_seed(1)
    fused = LowRankCrossNet(width=64, num_layers=3, rank=8).to(device)
    for w in fused.W:
        torch.nn.init.normal_(w.bias)
    formula = copy.deepcopy(fused)
    formula.fused = False
    fp32 = copy.deepcopy(formula)
    x0 = torch.randn(32, 64).to(device)
    got, auto, exact = _cross_step(fused, x0, True), _cross_step(formula, x0, True), _cross_step(fp32, x0, False)
    bf16_unit = 2.0**-8
    for g, a, e in zip(got, auto, exact):
        assert g.dtype == a.dtype == torch.float32
        assert _rel(g, a) <= bf16_unit, _rel(g, a)
        assert _rel(a, e) > 4 * _rel(g, a)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("bf16", [False, True])
def test_fused_cross_layers_replay_in_a_cuda_graph(bf16):
    """Captured in a CUDA graph (as --cuda-graphs captures the dense step), forward and backward
    replay what the eager layers compute, with new inputs copied into the captured buffers (within
    what another cuBLAS algorithm may round differently)."""
    import copy

    from model.dense import LowRankCrossNet

    torch.manual_seed(2)
    eager = LowRankCrossNet(width=64, num_layers=3, rank=8).cuda()
    graphed = copy.deepcopy(eager)
    static = torch.randn(32, 64, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up outside the capture
            _cross_step(graphed, static, bf16)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        x = static.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
            out = graphed(x)
        out.float().sum().backward()
    for seed in range(2):
        x0 = torch.randn(32, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        static.copy_(x0)
        for q in graphed.parameters():
            q.grad.zero_()
        graph.replay()
        for q in eager.parameters():
            q.grad = None
        xe = x0.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
            ye = eager(xe)
        ye.float().sum().backward()
        tol = {"rtol": 1e-2, "atol": 1e-3} if bf16 else {"rtol": 1e-5, "atol": 1e-6}
        torch.testing.assert_close(out, ye, **tol)
        for qg, qe in zip(graphed.parameters(), eager.parameters()):
            torch.testing.assert_close(qg.grad, qe.grad, **tol)

