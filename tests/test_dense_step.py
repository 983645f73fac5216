"""The dense step: eager against the train loop's inline code (bitwise), graphed against eager (CUDA)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from harness.dense_step import DenseStep, graph_input_shapes
from harness.dense_gradients import FlatGradients

B, ND, PW = 6, 5, 12


class SmallDense(nn.Module):
    """Same interface as DenseArch: (dense_x, pooled) in, logits (B,) out."""

    def __init__(self) -> None:
        super().__init__()
        self.bottom = nn.Linear(ND, 4)
        self.top = nn.Sequential(nn.Linear(4 + PW, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, dense_x: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return self.top(torch.cat([torch.relu(self.bottom(dense_x)), pooled], 1)).squeeze(1)


def make_inputs(seed: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    dense_x = torch.randn(B, ND, generator=g)
    pooled = torch.randn(B, PW, generator=g)
    labels = (torch.rand(B, generator=g) < 0.5).float()
    return dense_x.to(device), pooled.to(device), labels.to(device)


def make_model(device: str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    return SmallDense().to(device)


def build(model: nn.Module, *, graphed: bool, device: str = "cpu") -> tuple[DenseStep, FlatGradients]:
    grads = FlatGradients(model, world_size=1, group=None)
    step = DenseStep(dense=model, grads=grads, world_size=1, local_batch=B, num_dense=ND, pooled_width=PW,
                     device=torch.device(device), graphed=graphed)
    return step, grads


def test_graph_input_shapes():
    assert graph_input_shapes(32, 13, 26 * 128) == {"dense_x": (32, 13), "pooled": (32, 3328), "labels": (32,)}
    with pytest.raises(ValueError, match="local_batch"):
        graph_input_shapes(0, 13, 16)


def test_graphed_needs_cuda():
    with pytest.raises(ValueError, match="CUDA"):
        build(make_model(), graphed=True, device="cpu")


def test_eager_is_bitwise_the_inline_step_with_updates_between():
    """Several iterations, each followed by the optimizer step and zeroing, as in the train loop."""
    ref_model, step_model = make_model(), make_model()
    ref_grads = FlatGradients(ref_model, world_size=1, group=None)
    step, grads = build(step_model, graphed=False)
    ref_opt = torch.optim.Adagrad(ref_model.parameters(), lr=0.1)
    opt = torch.optim.Adagrad(step_model.parameters(), lr=0.1)

    for it in range(4):
        dense_x, pooled_src, labels = make_inputs(it)

        # The train loop's inline code, the independent reference.
        ref_pooled = pooled_src.clone().requires_grad_(True)
        ref_loss = F.binary_cross_entropy_with_logits(ref_model(dense_x, ref_pooled), labels)
        (ref_loss / 1).backward()
        ref_grads.all_reduce()

        pooled = pooled_src.clone().requires_grad_(True)
        loss, pooled_grad = step.run(dense_x, pooled, labels)

        assert loss.dim() == 0 and not loss.requires_grad
        assert pooled_grad.shape == (B, PW)
        assert torch.equal(loss, ref_loss.detach())
        assert torch.equal(pooled_grad, ref_pooled.grad)
        assert torch.equal(grads.buffer, ref_grads.buffer)
        assert grads.buffer.abs().sum() > 0
        # The params' .grad are still views of the flat buffer (what the optimizer reads).
        first = next(step_model.parameters())
        assert first.grad.data_ptr() == grads.buffer.data_ptr()

        ref_opt.step()
        ref_grads.zero()
        opt.step()
        grads.zero()

    for a, b in zip(ref_model.parameters(), step_model.parameters()):
        assert torch.equal(a, b)


def test_world_size_scales_the_gradients_not_the_loss():
    """The step divides by world_size before backward; grads built for one rank skip the collective."""
    m1, m2 = make_model(), make_model()
    g1 = FlatGradients(m1, world_size=1, group=None)
    g2 = FlatGradients(m2, world_size=1, group=None)
    s1 = DenseStep(dense=m1, grads=g1, world_size=1, local_batch=B, num_dense=ND, pooled_width=PW,
                   device=torch.device("cpu"), graphed=False)
    s2 = DenseStep(dense=m2, grads=g2, world_size=2, local_batch=B, num_dense=ND, pooled_width=PW,
                   device=torch.device("cpu"), graphed=False)
    dense_x, pooled, labels = make_inputs(3)
    l1, pg1 = s1.run(dense_x, pooled.clone().requires_grad_(True), labels)
    l2, pg2 = s2.run(dense_x, pooled.clone().requires_grad_(True), labels)
    assert torch.equal(l1, l2)
    torch.testing.assert_close(pg2 * 2, pg1, rtol=0, atol=0)
    torch.testing.assert_close(g2.buffer * 2, g1.buffer, rtol=0, atol=0)


def test_wrong_shapes_and_non_leaf_pooled_are_refused():
    step, _ = build(make_model(), graphed=False)
    dense_x, pooled, labels = make_inputs(0)
    with pytest.raises(ValueError, match="dense_x has shape"):
        step.run(dense_x[:-1], pooled.requires_grad_(True), labels)
    with pytest.raises(ValueError, match="require grad"):
        step.run(dense_x, pooled.detach(), labels)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphed_matches_eager_over_several_steps():
    # Replays and eager kernels may differ in the last bits (e.g. cuBLAS picking other algorithms
    # on another stream), hence allclose rather than equal.
    eager_model = make_model("cuda")
    graphed_model = copy.deepcopy(eager_model)
    eager, eager_grads = build(eager_model, graphed=False, device="cuda")
    graphed, graphed_grads = build(graphed_model, graphed=True, device="cuda")
    assert torch.count_nonzero(graphed_grads.buffer) == 0, "warm-up gradients leaked into the buffer"
    eager_opt = torch.optim.Adagrad(eager_model.parameters(), lr=0.1)
    graphed_opt = torch.optim.Adagrad(graphed_model.parameters(), lr=0.1)

    for it in range(4):
        dense_x, pooled, labels = make_inputs(it, "cuda")
        e_loss, e_pg = eager.run(dense_x, pooled.clone().requires_grad_(True), labels)
        g_loss, g_pg = graphed.run(dense_x, pooled.clone().requires_grad_(True), labels)
        torch.testing.assert_close(g_loss, e_loss)
        torch.testing.assert_close(g_pg, e_pg)
        torch.testing.assert_close(graphed_grads.buffer, eager_grads.buffer)
        eager_opt.step()
        eager_grads.zero()
        graphed_opt.step()
        graphed_grads.zero()

    for a, b in zip(eager_model.parameters(), graphed_model.parameters()):
        torch.testing.assert_close(a, b)
