"""Data-parallel dense gradients: one flat buffer, one all-reduce."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class FlatGradients:
    """Every dense parameter's .grad is a view into one buffer, so the all-reduce is a single
    collective with no packing copies, and zeroing is one fill. Static buffers are also what
    a CUDA graph of the dense step needs.
    """

    def __init__(self, module: nn.Module, *, world_size: int, group: dist.ProcessGroup | None) -> None:
        params = [p for p in module.parameters() if p.requires_grad]
        self.buffer = torch.zeros(sum(p.numel() for p in params), device=params[0].device, dtype=params[0].dtype)
        offset = 0
        for p in params:
            p.grad = self.buffer[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        self.world_size, self.group = world_size, group

    def all_reduce(self) -> None:
        """Sum over ranks (each rank's loss was already divided by the world size)."""
        if self.world_size > 1:
            dist.all_reduce(self.buffer, group=self.group)

    def zero(self) -> None:
        self.buffer.zero_()
