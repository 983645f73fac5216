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

DRAW_BLOCK = 4
"""A rank's batches drawn at once (local_batch): a draw's 29 launches are host time between
iterations, 0.4-1.0 ms a draw in the H100's eager runs (docs/gpu-session-4-notes.md); four at a
time, a quarter of that an iteration, for four batches' memory (small's: 4 x 28 MB while drawn)."""

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
    def draw(first_ctr, iter_ctr, key0, key1, per_ctr, n_ctr, words, heads, n_cols, count, per_vals, head_out,
             col_base, col_stride, u_out, BLOCK: tl.constexpr):
        # BLOCK consecutive counters of the block's batches (batch b's counters start iter_ctr after
        # batch b-1's), four words each: each word's uniform, to its sample's head (dense draws and
        # the label's) or to its id's place in its batch's values.
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = i < n_ctr
        b = i // per_ctr
        local = i - b * per_ctr
        zero = tl.zeros([BLOCK], dtype=tl.uint64)
        # numpy increments its counter before each block of four words. Scalars are added to
        # tensors, not converted: Triton passes an integer argument equal to 1 as a constant.
        ctr = zero + first_ctr + 1 + b.to(tl.int64) * iter_ctr + local
        x0, x1, x2, x3 = tl.philox_impl(ctr, zero, zero, zero, zero + key0, zero + key1)
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
            w = 4 * local + lane
            sample = w // words
            col = w % words
            tl.store(head_out + (b * count + sample) * heads + col, u, mask=live & (col < heads))
            c = col - heads
            is_id = live & (c >= 0) & (c < n_cols)
            cc = tl.where(is_id, c, 0)
            at = b * per_vals + tl.load(col_base + cc, mask=is_id, other=0) + sample * tl.load(col_stride + cc, mask=is_id, other=0)
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
        self._drawn: dict[tuple[int, int, int], Batch] = {}
        """(iteration, rank, world size) -> a batch drawn with an earlier one, not yet asked for."""
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
        return self.block(start, count, 1, 0)[0]

    def block(self, start: int, count: int, n: int, stride: int) -> list[Batch]:
        """n batches of `count` samples, the b-th from sample start + b * stride, fixed hotness, on
        the device: one kernel and one pass of each float64 op over all of them."""
        host, dev = self.host, self.device
        words = host.words_per_sample
        per_ctr = count * words // 4
        seed = host.data.seed
        head = torch.empty((n * count, self.heads), dtype=torch.float64, device=dev)
        per_vals = count * sum(self.hot)
        u = torch.empty(n * per_vals, dtype=torch.float64, device=dev)
        if count not in self._per_count:
            per = self.hot_on_device * count
            self._per_count[count] = (self.col_before * count + self.col_within,
                                      torch.repeat_interleave(self.table_scale, per, output_size=per_vals),
                                      torch.repeat_interleave(self.table_rows, per, output_size=per_vals) - 1)
        col_base, scale, largest = self._per_count[count]
        grid = (-(-n * per_ctr // BLOCK),)
        _kernel()[grid](start * words // 4, stride * words // 4, seed & ((1 << 64) - 1), seed >> 64, per_ctr,
                        n * per_ctr, words, self.heads, len(self.col_stride), count, per_vals, head, col_base,
                        self.col_stride, u, BLOCK=BLOCK)
        values = self._ids(u.view(n, per_vals), scale, largest)
        nd = host.model.num_dense
        d64 = torch.log1p(-torch.log1p(-head[:, :nd]) * 8.0)
        # numpy adds four values left to right; a device reduction may pair them otherwise.
        a = ((d64[:, 0] + d64[:, 1]) + d64[:, 2]) + d64[:, 3]
        b = ((d64[:, 4] + d64[:, 5]) + d64[:, 6]) + d64[:, 7]
        logit = 0.6 * (a - b) - 1.0
        labels = (head[:, nd] < 1.0 / (1.0 + torch.exp(-logit))).to(torch.float32)
        lengths = self.hot_on_device[None, :, None].expand(n, -1, count).contiguous()
        dense = d64.to(torch.float32)
        at = tuple(h * count for h in self.hot)
        return [Batch(dense=dense[k * count:(k + 1) * count], labels=labels[k * count:(k + 1) * count],
                      sparse=SparseFeatures(lengths=lengths[k], values=values[k], feature_values=at))
                for k in range(n)]

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
        """Rank's share of global batch `iteration`, on the device (ragged ones from the host): drawn
        with the rank's next DRAW_BLOCK - 1 batches of fixed hotness, kept until asked for."""
        if not self.host.is_regular(iteration):
            return self.host.local_batch(iteration, rank, world_size, pin=pin)
        kept = self._drawn.pop((iteration, rank, world_size), None)
        if kept is not None:
            return kept
        its = [iteration]
        while len(its) < DRAW_BLOCK and self.host.is_regular(its[-1] + 1):
            its.append(its[-1] + 1)
        g = self.host.data.global_batch_size
        local = g // world_size
        drawn = self.block(iteration * g + rank * local, local, len(its), g)
        # A new block replaces what the rank had left (asked out of order: the loop restarted).
        self._drawn = {k: v for k, v in self._drawn.items() if k[1:] != (rank, world_size)}
        self._drawn.update({(it, rank, world_size): b for it, b in zip(its[1:], drawn[1:])})
        return drawn[0]
