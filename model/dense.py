"""Dense part of DLRM-DCNv2: bottom MLP, low-rank DCNv2 cross net, top MLP."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from model.cross_layer import CrossLayer


def mlp(in_features: int, widths: Sequence[int], *, last_relu: bool) -> nn.Sequential:
    """Linear layers of the given widths with ReLU between them (and after the last if asked)."""
    layers: list[nn.Module] = []
    for i, width in enumerate(widths):
        layers.append(nn.Linear(in_features, width))
        if last_relu or i < len(widths) - 1:
            layers.append(nn.ReLU())
        in_features = width
    return nn.Sequential(*layers)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast runs matmuls in here, None when autocast is off."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


class LowRankCrossNet(nn.Module):
    """DCNv2 cross layers: x_{l+1} = x0 * (W_l (V_l x_l) + b_l) + x_l, V_l without bias.

    fused: each layer is one autograd function (model/cross_layer.py), the same math in fewer
    passes over the activations; False: the formula as written, autograd's graph of it (what
    stock TorchRec runs).
    """

    def __init__(self, width: int, num_layers: int, rank: int, *, fused: bool = True) -> None:
        super().__init__()
        self.fused = fused
        self.V = nn.ModuleList(nn.Linear(width, rank, bias=False) for _ in range(num_layers))
        self.W = nn.ModuleList(nn.Linear(rank, width, bias=True) for _ in range(num_layers))
        # As TorchRec's LowRankCrossNet (the MLPerf reference's DLRM_DCN): xavier-normal kernels,
        # zero bias; nn.Linear's own init (kaiming-uniform, a non-zero bias) is not the reference's.
        for v, w in zip(self.V, self.W):
            nn.init.xavier_normal_(v.weight)
            nn.init.xavier_normal_(w.weight)
            nn.init.zeros_(w.bias)

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        if self.fused:
            dtype = autocast_dtype(x0.device.type)
            for V, W in zip(self.V, self.W):
                x = CrossLayer.apply(x, x0, V.weight, W.weight, W.bias, dtype)
            return x
        for V, W in zip(self.V, self.W):
            x = x0 * W(V(x)) + x
        return x


class DenseArch(nn.Module):
    """Everything of DLRM-DCNv2 that is data-parallel: dense features and pooled embeddings in, logits out."""

    def __init__(
        self,
        *,
        num_dense: int,
        num_sparse: int,
        embedding_dim: int,
        bottom_mlp: Sequence[int],
        cross_layers: int,
        cross_rank: int,
        top_mlp: Sequence[int],
        fused_cross: bool = True,
    ) -> None:
        """fused_cross: LowRankCrossNet's `fused` (config optimizations.fused_cross)."""
        super().__init__()
        self.bottom = mlp(num_dense, bottom_mlp, last_relu=True)
        width = (num_sparse + 1) * embedding_dim
        self.cross = LowRankCrossNet(width, cross_layers, cross_rank, fused=fused_cross)
        self.top = mlp(width, top_mlp, last_relu=False)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """dense: (B, num_dense); pooled: (B, num_sparse * dim) in feature order. Returns logits (B,)."""
        x0 = torch.cat([self.bottom(dense), pooled], dim=1)
        return self.top(self.cross(x0)).squeeze(1)


def dense_flops_per_sample(
    *,
    num_dense: int,
    num_sparse: int,
    embedding_dim: int,
    bottom_mlp: Sequence[int],
    cross_layers: int,
    cross_rank: int,
    top_mlp: Sequence[int],
) -> int:
    """Matrix-multiply FLOPs of one sample's forward plus backward (2 per MAC; backward = 2x forward).

    Element-wise work (ReLU, the cross layer's product and sum, bias adds) is left out: it is
    memory-bound and small next to the GEMMs, which is what a FLOP/s figure is meant to rate.
    """
    macs = 0
    width_in = num_dense
    for width in bottom_mlp:
        macs += width_in * width
        width_in = width
    width = (num_sparse + 1) * embedding_dim
    macs += cross_layers * 2 * width * cross_rank
    width_in = width
    for w in top_mlp:
        macs += width_in * w
        width_in = w
    return 3 * 2 * macs
