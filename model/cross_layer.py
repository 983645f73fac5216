"""One DCNv2 low-rank cross layer, x_next = x0 * (W (V x) + b) + x, as one autograd function.

The same math as the layer written out for autograd (model/dense.py's LowRankCrossNet, fused=False),
in fewer passes over the (batch, width) activations, which are what the layer's device time is
on a GPU (docs/gpu-session-2-notes.md: on small at 8192 a GPU under bf16 autocast, the elementwise
work and casts over 8192 x 3456 activations took more device time than the GEMMs):

- forward: x + x0 * y in one addcmul (autograd: a multiply, then an add);
- backward: d/dy = g * x0 rounded straight to the GEMM dtype (autograd: an fp32 product, then a
  cast); the residual's gradient added to the GEMM's in one mixed-dtype add under bf16
  (autograd: a cast of the bf16 gradient to fp32, then an add), inside the GEMM itself in fp32
  (addmm's epilogue).

Mixed precision is autocast's: with `gemm_dtype` bf16, the GEMMs take x, V, W and b rounded to
bf16 and give bf16 (as torch.autocast's linear does), the elementwise work is fp32 (as autocast's
type promotion gives), and the weight gradients come back in the parameters' dtype. One function
a layer, not one for the whole net, so that each layer's parameter gradients are ready as soon as
its backward ends, as the bucketed gradient all-reduce expects (harness/run/dense_gradients.py).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


def _as(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return t if dtype is None or t.dtype == dtype else t.to(dtype)


class CrossLayer(torch.autograd.Function):
    """apply(x, x0, V, W, b, gemm_dtype) -> x0 * (x V^T W^T + b) + x (module docstring)."""

    @staticmethod
    def forward(ctx, x, x0, V, W, b, gemm_dtype):  # noqa: N803 (the layer's own names)
        with torch.autocast(x.device.type, enabled=False):  # the casts below are autocast's, made once
            xc, Vc, Wc, bc = (_as(t, gemm_dtype) for t in (x, V, W, b))
            u = torch.mm(xc, Vc.t())
            y = torch.addmm(bc, u, Wc.t())
            out = torch.addcmul(x, x0, y)
        ctx.save_for_backward(x0, xc, u, y, Vc, Wc)
        ctx.param_dtypes = (V.dtype, W.dtype, b.dtype)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        x0, xc, u, y, Vc, Wc = ctx.saved_tensors
        with torch.autocast(g.device.type, enabled=False):
            # in y's dtype: under bf16 the fp32 product rounded once, as autograd's cast of it does
            gy = torch.mul(g, x0, out=torch.empty_like(y))
            g_x0 = g * y
            g_b = gy.sum(0)
            g_W = gy.t().mm(u)
            g_u = gy.mm(Wc)
            g_V = g_u.t().mm(xc)
            # the residual's gradient g plus the V GEMM's: in the GEMM's epilogue when both are fp32
            g_x = torch.addmm(g, g_u, Vc) if g.dtype == g_u.dtype else g + g_u.mm(Vc)
        v_dt, w_dt, b_dt = ctx.param_dtypes
        return g_x, g_x0, g_V.to(v_dt), g_W.to(w_dt), g_b.to(b_dt), None
