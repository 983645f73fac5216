"""Adagrad on one tensor: torch's own Adagrad function, without torch.optim's Optimizer class.

`torch.optim.adagrad.adagrad` is the function `torch.optim.Adagrad.step` calls, so the kernels and
the bits are torch's (tests/test_adagrad.py checks them against torch.optim.Adagrad). The class
is left out because its constructor and its step import torch._dynamo, 0.75 s of every rank
process's start on a 2-core VM, and its step wraps the call in about 13 us of Python a step
(docs/dense-gradients-notes.md, 2026-11-27).
"""

from __future__ import annotations

import torch
from torch.optim.adagrad import adagrad

IMPLS = ("fused", "foreach", None)
"""torch's implementations: one fused kernel, a few foreach kernels, or None: torch's pick for the
device (what torch.optim.Adagrad() without fused/foreach runs)."""


class Adagrad:
    """Adagrad (no weight decay, no learning-rate decay, zero initial sum) on `param`, reading
    `param.grad` at each `step()`; a step without a gradient does nothing, as in torch.optim."""

    def __init__(self, param: torch.Tensor, *, lr: float, eps: float, impl: str | None) -> None:
        if impl not in IMPLS:
            raise ValueError(f"Adagrad implementation {impl!r} is not one of {list(IMPLS)}")
        if not lr >= 0 or not eps >= 0:
            raise ValueError(f"Adagrad needs lr >= 0 and eps >= 0, got lr={lr}, eps={eps}")
        self.param, self.lr, self.eps = param, lr, eps
        self.fused, self.foreach = (None, None) if impl is None else (impl == "fused", impl == "foreach")
        self.sum = torch.zeros_like(param, memory_format=torch.preserve_format)
        # The step count as torch.optim.Adagrad keeps it: fp32 on the device for the fused kernel,
        # otherwise a CPU scalar of the default dtype's precision.
        wide = torch.get_default_dtype() == torch.float64 and not self.fused
        self.steps = torch.zeros((), dtype=torch.float64 if wide else torch.float32,
                                 device=param.device if self.fused else "cpu")

    def step(self) -> None:
        grad = self.param.grad
        if grad is None:
            return
        with torch.no_grad():
            adagrad([self.param], [grad], [self.sum], [self.steps], fused=self.fused, foreach=self.foreach,
                    has_sparse_grad=grad.is_sparse, lr=self.lr, weight_decay=0.0, lr_decay=0.0, eps=self.eps,
                    maximize=False)
