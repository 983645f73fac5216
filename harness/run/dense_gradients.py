"""Data-parallel dense gradients: one flat buffer, all-reduced in buckets while backward runs.

Every dense parameter's .grad is a view into one buffer: zeroing is one fill, the optimizer
can work on it as it is, and a CUDA graph of the dense step gets the static buffers it needs.
The buffer is all-reduced in buckets, contiguous ranges of it, each launched (async) as soon as
backward has accumulated all of its parameters' gradients, as DDP does: the collective of the
last layers then runs while backward still computes the first ones.

Bitwise: with 2 ranks every element is a + b whatever the bucketing (float addition is
commutative), so any bucket size gives the same bits as one all-reduce of the whole buffer.
With 3 or more ranks gloo's ring all-reduce sums each chunk of a bucket starting at a different
rank, and the chunks depend on the bucket's size, so another bucket size may change the last
bits; a fixed bucket size gives the same bits run after run, whatever the optimization flags.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from model.collective_bytes import CollectiveBytes
from model.collective_wait import WaitFn, block

DEFAULT_BUCKET_MIB = 4.0
"""Bucket cap. DDP's 25 MiB cuts the small/mlperf dense part's 61 MiB of gradients into only 3
buckets: the bytes of a bucket wait until backward reaches its earliest layer. On small's dense
step 1-8 MiB measured within the noise of each other and ahead of 25 MiB; 4 MiB is the middle of
them (docs/dense-gradients-notes.md)."""


def bucket_ranges(sizes: list[int], cap: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges of a buffer laid out as `sizes` (element counts, parameter
    order), in reverse parameter order (about the order backward produces gradients): each bucket
    holds whole parameters, at most `cap` elements unless one parameter alone is bigger."""
    if cap < 1:
        raise ValueError(f"bucket cap must be at least one element, got {cap}")
    ends = list(itertools.accumulate(sizes))
    ranges: list[tuple[int, int]] = []
    end = ends[-1] if ends else 0
    start = end
    for i in reversed(range(len(sizes))):
        p_start = ends[i] - sizes[i]
        if end - p_start > cap and start < end:
            ranges.append((start, end))
            end = start
        start = p_start
    if start < end:
        ranges.append((start, end))
    return ranges


class FlatGradients:
    """The dense parameters' gradients as views of `buffer`, summed over ranks in buckets.

    Use per step: backward (hooks launch each bucket's all-reduce when it is complete), then
    `finish()` (launches what is left, in bucket order, and waits for all), optimizer step,
    `zero()`. Each rank's loss must already be divided by the world size.

    Every rank launches the buckets in the same order (bucket 0 first), whatever order its
    hooks fire in, as collectives on one process group must be issued in the same order.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        world_size: int,
        group: dist.ProcessGroup | None,
        bucket_mib: float = DEFAULT_BUCKET_MIB,
        wait: WaitFn = block,
        bytes_moved: CollectiveBytes | None = None,
    ) -> None:
        """bytes_moved: where each bucket's all-reduce is counted (the records' bytes moved)."""
        self.bytes_moved = bytes_moved
        self._counting = True
        if not bucket_mib > 0:
            raise ValueError(f"bucket_mib must be > 0, got {bucket_mib}")
        params = [p for p in module.parameters() if p.requires_grad]
        self.params = params
        self.buffer = torch.zeros(sum(p.numel() for p in params), device=params[0].device, dtype=params[0].dtype)
        offsets = []
        offset = 0
        for p in params:
            p.grad = self.buffer[offset : offset + p.numel()].view_as(p)
            offsets.append(offset)
            offset += p.numel()
        self.offsets = offsets
        cap = max(1, int(bucket_mib * 2**20) // self.buffer.element_size())
        self.buckets = bucket_ranges([p.numel() for p in params], cap)
        self.world_size, self.group, self.wait = world_size, group, wait
        self._handles = []
        self._works: list[dist.Work] = []
        self._sizes = [0] * len(self.buckets)
        if world_size > 1:
            for p, off in zip(params, offsets):
                bucket = next(i for i, (start, end) in enumerate(self.buckets) if start <= off < end)
                self._sizes[bucket] += 1
                self._handles.append(p.register_post_accumulate_grad_hook(self._on_ready(bucket)))
        self._reset()

    def _reset(self) -> None:
        self._waiting = list(self._sizes)
        self._next = 0

    def _on_ready(self, bucket: int) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            self._waiting[bucket] -= 1
            while self._next < len(self.buckets) and self._waiting[self._next] == 0:
                self._launch(self._next)

        return hook

    def _launch(self, bucket: int) -> None:
        self._count(bucket)
        start, end = self.buckets[bucket]
        self._works.append(dist.all_reduce(self.buffer[start:end], group=self.group, async_op=True))
        self._next = bucket + 1

    def _count(self, bucket: int) -> None:
        start, end = self.buckets[bucket]
        if self.bytes_moved is not None and self._counting:
            self.bytes_moved.ring("dense_grads", nbytes=(end - start) * self.buffer.element_size(),
                                  world_size=self.world_size, passes=2)

    def count_step(self) -> None:
        """Count one step's all-reduces as launched: a CUDA graph's replay runs the buckets captured
        once, without passing through `_launch` again, so each replayed step counts here."""
        if self.world_size > 1:
            for bucket in range(len(self.buckets)):
                self._count(bucket)

    @contextlib.contextmanager
    def uncounted(self):
        """Launches inside are no training step's (a CUDA graph's warm-up and capture)."""
        self._counting = False
        try:
            yield
        finally:
            self._counting = True

    def flat_parameter(self) -> nn.Parameter:
        """The parameters as one: each becomes a view of one buffer laid out as the gradients are,
        and the returned Parameter over that buffer has the gradient buffer as its .grad.

        For the optimizer: the fused Adagrad then runs one kernel on one tensor (tiny: 0.08 ms a
        step against 0.39 per parameter; docs/dense-gradients-notes.md), with the same bits
        (Adagrad is element-wise; tests/test_dense_gradients.py checks it against the per-parameter
        optimizer)."""
        flat = torch.empty_like(self.buffer)
        with torch.no_grad():
            for p, off in zip(self.params, self.offsets):
                flat[off : off + p.numel()].copy_(p.reshape(-1))
                p.data = flat[off : off + p.numel()].view_as(p)  # same Parameter object, storage shared
        param = nn.Parameter(flat)
        param.grad = self.buffer
        return param

    @property
    def in_flight(self) -> int:
        """Buckets launched and not yet waited for (for tests and diagnostics)."""
        return len(self._works)

    def finish(self) -> None:
        """After backward: launch the buckets not launched yet (a parameter that got no gradient
        this step leaves its bucket incomplete; its zeros must still be summed), then wait for
        every bucket. On CUDA the wait orders the current stream after the collectives (inside
        a CUDA graph capture too), on CPU it blocks until the sums are in `buffer`."""
        if self.world_size > 1:
            while self._next < len(self.buckets):
                self._launch(self._next)
        for work in self._works:
            self.wait(work)
        self._works.clear()
        self._reset()

    def zero(self) -> None:
        self.buffer.zero_()
