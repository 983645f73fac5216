"""Synthetic batches drawn on the GPU: the synthetic stream's numbers (harness/data/synthetic.py),
made on the stream the batch is loaded on, by one Triton kernel (the Philox words, each to its
place) and about twenty elementwise ops (the float64 math), instead of by host threads.

Why: a host core takes 25-40 ms to draw small's 8192-sample batch (numpy's `pow` over 1.75 M
float64 draws), so a 5 ms H100 iteration needs six to eight cores drawing without pause, and it
waited 0.8-1.3 ms an iteration for its batch all the same (docs/gpu-session-3-notes.md).

The same numbers: numpy's Philox4x64-10 (Triton's own `philox_impl`, Random123's rounds and
constants; numpy increments the counter before each block of four words), then the same float64
operations in the same order, each its own op (no fused multiply-add), ids truncated and clipped
as `power_law_ids` does, the label's sums added left to right as numpy adds four values. The integer work is exact; the float64 `log1p`, `exp` and `pow`
are the device's, within an ulp or two of the host's, so a value can differ where a draw falls
within an ulp of a rounding or truncation boundary: the battery compares device batches with the
host stream and counts what differs. Ragged batches (`--ragged-every`) are drawn on the host.
"""

from __future__ import annotations

import numpy as np
import torch

from harness.data.synthetic import Batch, SyntheticCriteo, power_law_scale
from model.features import SparseFeatures

BLOCK = 256
"""Philox counters a Triton program draws (four words each)."""

_KERNEL = None


def unavailable() -> str | None:
    """Why batches cannot be drawn on a GPU here (Triton missing), or None."""
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"Triton is not installed ({exc})"
    return None


def _kernel():
    """The Triton kernel, built on first use (CPU runs never import Triton)."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def draw(first_ctr, key0, key1, n_ctr, words, heads, n_cols, head_out, col_base, col_stride, u_out,
             BLOCK: tl.constexpr):
        # BLOCK consecutive counters of the batch, four words each: each word's uniform, to the
        # sample's head (dense draws and the label's) or to its id's place in the values.
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = i < n_ctr
        zero = tl.zeros([BLOCK], dtype=tl.uint64)
        # numpy increments its counter before each block of four words. Scalars are added to
        # tensors, not converted: Triton passes an integer argument equal to 1 as a constant.
        x0, x1, x2, x3 = tl.philox_impl(zero + first_ctr + 1 + i, zero, zero, zero, zero + key0, zero + key1)
        for lane in tl.static_range(4):
            if lane == 0:
                raw = x0
            elif lane == 1:
                raw = x1
            elif lane == 2:
                raw = x2
            else:
                raw = x3
            u = (raw >> 11).to(tl.float64) * 1.1102230246251565e-16  # 2^-53
            w = 4 * i + lane
            sample = w // words
            col = w % words
            tl.store(head_out + sample * heads + col, u, mask=live & (col < heads))
            c = col - heads
            is_id = live & (c >= 0) & (c < n_cols)
            cc = tl.where(is_id, c, 0)
            at = tl.load(col_base + cc, mask=is_id, other=0) + sample * tl.load(col_stride + cc, mask=is_id, other=0)
            tl.store(u_out + at, u, mask=is_id)

    _KERNEL = draw
    return draw


class DeviceSynthetic:
    """`host`'s batches drawn on `device` (the current stream), fixed-hotness ones; ragged ones by
    `host` on the host. Everything but local_batch and samples is the host source's own."""

    def __init__(self, host: SyntheticCriteo, device: torch.device) -> None:
        self.host, self.device = host, device
        model, exponent = host.model, host.data.id_exponent
        hot = [int(h) for h in model.multi_hot]
        self.hot = hot
        # Id column c (feature f, its h-th id) of sample j of a batch of n lands in the values at
        # n * (hot of the features before f) + j * hot_f + h.
        before, within, stride, done = [], [], [], 0
        for h in hot:
            before += [done] * h
            within += list(range(h))
            stride += [h] * h
            done += h
        put = dict(device=device)
        self.col_before = torch.tensor(before, dtype=torch.int64, **put)
        self.col_within = torch.tensor(within, dtype=torch.int64, **put)
        self.col_stride = torch.tensor(stride, dtype=torch.int64, **put)
        self._per_count: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        """Batch size -> (each id column's first place in the values, each value's table scale and
        largest id): made once, each batch of that size reuses them (fewer launches a batch)."""
        self.table_rows = torch.tensor(model.table_rows, dtype=torch.int64, **put)
        # Every id column of a feature is its table's: one scale a table (power_law_scale's bits).
        self.table_scale = torch.as_tensor(power_law_scale(np.asarray(model.table_rows, dtype=np.int64), exponent),
                                           dtype=torch.float64).to(device)
        self.exponent = exponent
        self.heads = model.num_dense + 1
        self.hot_on_device = torch.tensor(hot, dtype=torch.int64, **put)

    def __getattr__(self, name: str):
        return getattr(self.host, name)

    def samples(self, start: int, count: int) -> Batch:
        """Samples start .. start+count-1 of the stream, fixed hotness, on the device."""
        host, dev = self.host, self.device
        words = host.words_per_sample
        n_ctr = count * words // 4
        seed = host.data.seed
        head = torch.empty((count, self.heads), dtype=torch.float64, device=dev)
        u = torch.empty(count * sum(self.hot), dtype=torch.float64, device=dev)
        if count not in self._per_count:
            per, n = self.hot_on_device * count, u.numel()
            self._per_count[count] = (self.col_before * count + self.col_within,
                                      torch.repeat_interleave(self.table_scale, per, output_size=n),
                                      torch.repeat_interleave(self.table_rows, per, output_size=n) - 1)
        col_base, scale, largest = self._per_count[count]
        grid = (-(-n_ctr // BLOCK),)
        _kernel()[grid](start * words // 4, seed & ((1 << 64) - 1), seed >> 64, n_ctr, words, self.heads,
                        len(self.col_stride), head, col_base, self.col_stride, u, BLOCK=BLOCK)
        values = self._ids(u, scale, largest)
        nd = host.model.num_dense
        d64 = torch.log1p(-torch.log1p(-head[:, :nd]) * 8.0)
        # numpy adds four values left to right; a device reduction may pair them otherwise.
        a = ((d64[:, 0] + d64[:, 1]) + d64[:, 2]) + d64[:, 3]
        b = ((d64[:, 4] + d64[:, 5]) + d64[:, 6]) + d64[:, 7]
        logit = 0.6 * (a - b) - 1.0
        labels = (head[:, nd] < 1.0 / (1.0 + torch.exp(-logit))).to(torch.float32)
        lengths = self.hot_on_device[:, None].expand(-1, count).contiguous()
        return Batch(dense=d64.to(torch.float32), labels=labels,
                     sparse=SparseFeatures(lengths=lengths, values=values,
                                           feature_values=tuple(h * count for h in self.hot)))

    def _ids(self, u: torch.Tensor, scale: torch.Tensor, largest: torch.Tensor) -> torch.Tensor:
        """power_law_ids over the feature-major uniforms: each op as numpy runs it (one rounding
        each, no fused multiply-add), each value with its table's scale and largest id."""
        if self.exponent == 0:
            k = u * scale
        elif self.exponent == 1:
            k = torch.pow(scale, u) - 1
        else:
            k = torch.pow(u * scale + 1.0, 1.0 / (1.0 - self.exponent)) - 1
        return torch.minimum(k.to(torch.int64), largest)

    def local_batch(self, iteration: int, rank: int, world_size: int, *, pin: bool = False) -> Batch:
        """Rank's share of global batch `iteration`, on the device (ragged ones from the host)."""
        if not self.host.is_regular(iteration):
            return self.host.local_batch(iteration, rank, world_size, pin=pin)
        local = self.host.data.global_batch_size // world_size
        return self.samples(iteration * self.host.data.global_batch_size + rank * local, local)
