"""A small dense model, its inputs, and an independent float64 reference of one data-parallel dense step."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

B, ND, PW = 6, 5, 12  # local batch, dense features, pooled width


class SmallDense(nn.Module):
    """Same interface as DenseArch: (dense_x, pooled) in, logits (B,) out."""

    def __init__(self) -> None:
        super().__init__()
        self.bottom = nn.Linear(ND, 4)
        self.top = nn.Sequential(nn.Linear(4 + PW, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, dense_x: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return self.top(torch.cat([torch.relu(self.bottom(dense_x)), pooled], 1)).squeeze(1)


def adagrad(params, *, lr: float, device: str = "cpu", **kw) -> torch.optim.Adagrad:
    """torch's Adagrad as the harness picks it on `device`: fused where this torch runs it there,
    else foreach (torch 2.11 refuses a fused Adagrad on CUDA: harness/run/optimizations.py)."""
    from harness.run.optimizations import fused_adagrad_registered

    fused = fused_adagrad_registered(device)
    return torch.optim.Adagrad(params, lr=lr, fused=fused, foreach=not fused, **kw)


def make_model(device: str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    return SmallDense().to(device)


def make_inputs(seed: int, batch: int = B, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    dense_x = torch.randn(batch, ND, generator=g)
    pooled = torch.randn(batch, PW, generator=g)
    labels = (torch.rand(batch, generator=g) < 0.5).float()
    return dense_x.to(device), pooled.to(device), labels.to(device)


def reference_step(model: nn.Module, shards: list[tuple[torch.Tensor, ...]]) -> dict:
    """What a data-parallel dense step must produce, from a float64 copy of `model`, plain
    torch.autograd and a sum over ranks by hand: each rank's (dense_x, pooled, labels) shard
    gives its mean loss; the all-reduced gradient is the sum over ranks of d(loss_r / world),
    flattened in parameter order (the flat buffer's layout)."""
    ref = copy.deepcopy(model).double()
    params = list(ref.parameters())
    world = len(shards)
    total = [torch.zeros_like(p) for p in params]
    losses, pooled_grads = [], []
    for dense_x, pooled, labels in shards:
        pooled64 = pooled.detach().double().requires_grad_(True)
        loss = F.binary_cross_entropy_with_logits(ref(dense_x.double(), pooled64), labels.double())
        *grads, pooled_grad = torch.autograd.grad(loss / world, [*params, pooled64])
        for t, g in zip(total, grads):
            t += g
        losses.append(loss.detach())
        pooled_grads.append(pooled_grad)
    return {"losses": losses, "pooled_grads": pooled_grads, "grads": torch.cat([t.flatten() for t in total])}


def assert_close_to_float64(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """float32 math against float64: a few float32 roundings per element of a small model."""
    torch.testing.assert_close(actual.double().cpu(), expected.cpu(), rtol=1e-5, atol=1e-6)
