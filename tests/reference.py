"""An unsharded single-process DLRM-DCNv2 written independently of model/ and harness/run/train.py.

Plain torch.nn.EmbeddingBag tables (sparse gradients, torch.optim.Adagrad) and the dense
math written out with F.linear, so a sharding or data-parallel bug cannot hide behind
shared code. Only the initial weights are taken from the code under test's rules.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


MASK64 = (1 << 64) - 1


def _finish_int(z: int) -> int:
    """splitmix64's finaliser on a Python int, masked to 64 bits."""
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        z = ((z ^ (z >> shift)) * mult) & MASK64
    return z ^ (z >> 31)


def _finish_u64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on numpy uint64 (multiplication wraps)."""
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        z = (z ^ (z >> np.uint64(shift))) * np.uint64(mult)
    return z ^ (z >> np.uint64(31))


def embedding_init(rows: int, dim: int, *, table: int, seed: int) -> torch.Tensor:
    """The documented init rule (model/embeddings.py init_values) for a whole table of `rows`."""
    out = np.empty((rows, dim), dtype=np.float32)
    for first in range(0, rows, 65536):
        r = np.arange(first, min(rows, first + 65536), dtype=np.uint64)
        out[first : first + len(r)] = embedding_init_rows(r, dim, rows=rows, table=table, seed=seed)
    return torch.from_numpy(out)


def embedding_init_rows(ids: np.ndarray, dim: int, *, rows: int, table: int, seed: int) -> np.ndarray:
    """The documented init rule for the rows `ids` of a table of `rows`, in numpy's unsigned
    64-bit arithmetic: element (r, c) is splitmix64's finaliser of key + (r * dim + c) * golden
    gamma, key the finaliser of seed * 1000003 + table; its top 24 bits u / 2^24 give -b + 2b * u
    in float64 (b = 1/sqrt(rows)), rounded to float32."""
    key = np.uint64(_finish_int((seed * 1_000_003 + table) & MASK64))
    b = rows**-0.5
    r = np.asarray(ids, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = r[:, None] * np.uint64(dim) + np.arange(dim, dtype=np.uint64)[None, :]
        z = _finish_u64(x * np.uint64(0x9E3779B97F4A7C15) + key)
        u = (z >> np.uint64(40)).astype(np.float64) / float(1 << 24)
        return (u * (2 * b) - b).astype(np.float32)


class ReferenceDLRM:
    def __init__(self, *, table_rows, dim, dense_state: dict[str, torch.Tensor], seed: int, lr: float, eps: float):
        self.tables = []
        for t, rows in enumerate(table_rows):
            bag = nn.EmbeddingBag(rows, dim, mode="sum", sparse=True, include_last_offset=True)
            with torch.no_grad():
                bag.weight.copy_(embedding_init(rows, dim, table=t, seed=seed))
            self.tables.append(bag)
        # Dense weights by role, read off the state dict's names (Linear layers in order).
        self.dense = {k: v.clone().requires_grad_(True) for k, v in dense_state.items()}
        self.bottom = self._linears("bottom.")
        self.top = self._linears("top.")
        self.cross = list(zip(self._linears("cross.V."), self._linears("cross.W.")))
        self.emb_opt = torch.optim.Adagrad([b.weight for b in self.tables], lr=lr, eps=eps)
        self.dense_opt = torch.optim.Adagrad(list(self.dense.values()), lr=lr, eps=eps)

    def _linears(self, prefix: str) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        idx = sorted({int(k[len(prefix):].split(".")[0]) for k in self.dense if k.startswith(prefix)})
        return [(self.dense[f"{prefix}{i}.weight"], self.dense.get(f"{prefix}{i}.bias")) for i in idx]

    def loss(self, dense_x, lengths, values, labels) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(self.logits(dense_x, lengths, values), labels)

    def logits(self, dense_x, lengths, values) -> torch.Tensor:
        x = dense_x
        for w, b in self.bottom:
            x = F.relu(F.linear(x, w, b))
        pooled, start = [x], 0
        for f, bag in enumerate(self.tables):
            n = int(lengths[f].sum())
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths[f].cumsum(0)])
            pooled.append(bag(values[start : start + n], offsets))
            start += n
        x0 = torch.cat(pooled, dim=1)
        x = x0
        for (v, _), (w, b) in self.cross:
            x = x0 * F.linear(F.linear(x, v), w, b) + x
        for i, (w, b) in enumerate(self.top):
            x = F.linear(x, w, b)
            if i < len(self.top) - 1:
                x = F.relu(x)
        return x.squeeze(1)

    def step(self, dense_x, lengths, values, labels) -> float:
        self.emb_opt.zero_grad()
        self.dense_opt.zero_grad()
        loss = self.loss(dense_x, lengths, values, labels)
        loss.backward()
        self.emb_opt.step()
        self.dense_opt.step()
        return loss.item()
