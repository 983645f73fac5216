"""Data-parallel dense gradients: one flat buffer, all-reduced in buckets while backward runs.

The gradients end in one buffer: the optimizer works on it as it is (one flat parameter). The
buffer is all-reduced in buckets, contiguous ranges of it, each launched (async) as soon as
backward has produced all of its parameters' gradients, as DDP does: the collective of the last
layers then runs while backward still computes the first ones.

How they get there, two ways (the `gather` argument):
- views (a CUDA graph's): every parameter's .grad is a view into the buffer and autograd adds
  each new gradient into it, one kernel a parameter, after a zero fill a step; the graph gets the
  static buffers it needs;
- gather (eager): no .grad between steps, so autograd keeps each new gradient as it is (no
  kernel), and one cat a bucket (one a step at world size 1) copies them into the buffer: a
  kernel a bucket where the views take one a parameter and a fill (small: 25 + 1 against 16
  buckets, or 1 at world size 1). The same bits: a gradient added to zero is itself.

bf16 weight copy (compute_dtype=torch.bfloat16): the module's parameters become bf16 views of
one buffer, a copy of the fp32 weights (the masters) refreshed in one cast after each update, and
backward accumulates their bf16 gradients into a bf16 buffer cast to the fp32 one per bucket. Under
bf16 autocast that is the same arithmetic as fp32 parameters cast by autocast (each parameter is
used once: its bf16 gradient, added to zero, is exact), with one cast a step each way where
autocast makes one a parameter each way (25 a forward and 25 a backward on DLRM-DCNv2).

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
    """The dense parameters' gradients as views of `buffer`, summed over ranks in buckets, and the
    parameters themselves as views of one buffer (the optimizer's one flat parameter).

    Use per step: backward (hooks launch each bucket's all-reduce when it is complete), then
    `finish()` (launches what is left, in bucket order, and waits for all), optimizer step,
    `updated()`. Each rank's loss must already be divided by the world size.

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
        compute_dtype: torch.dtype | None = None,
        gather: bool = False,
    ) -> None:
        """bytes_moved: where each bucket's all-reduce is counted (the records' bytes moved).
        compute_dtype: the dtype the module's parameters take for forward and backward (the bf16
        weight copy, module docstring); None: the weights' own.
        gather: collect the gradients autograd leaves in .grad with a cat a bucket; False: .grad
        are views of the buffer, added into (module docstring; a CUDA graph needs the views)."""
        self.bytes_moved = bytes_moved
        self._counting = True
        if not bucket_mib > 0:
            raise ValueError(f"bucket_mib must be > 0, got {bucket_mib}")
        params = [p for p in module.parameters() if p.requires_grad]
        self.params = params
        self.offsets = [0, *itertools.accumulate(p.numel() for p in params)][:-1]
        total = sum(p.numel() for p in params)
        # master: the weights, laid out as the gradients (the optimizer's flat parameter); buffer:
        # the gradients in the weights' dtype, what the all-reduce sums and the optimizer reads;
        # weights: what the module's parameters are views of, the masters or their copy in
        # compute_dtype; staging: where backward accumulates, the buffer or one in compute_dtype
        # cast to it bucket by bucket.
        self.master = torch.empty(total, device=params[0].device, dtype=params[0].dtype)
        self.buffer = torch.zeros_like(self.master)
        with torch.no_grad():
            for p, off in zip(params, self.offsets):
                self.master[off : off + p.numel()].copy_(p.reshape(-1))
        if compute_dtype is None or compute_dtype == self.master.dtype:
            self.weights, self.staging = self.master, self.buffer
        else:
            self.weights = self.master.to(compute_dtype)
            self.staging = torch.zeros_like(self.weights)
        self._place(self.weights)
        self.gather = gather
        for p, off in zip(params, self.offsets):
            p.grad = None if gather else self.staging[off : off + p.numel()].view_as(p)
        cap = max(1, int(bucket_mib * 2**20) // self.buffer.element_size())
        self.buckets = bucket_ranges([p.numel() for p in params], cap)
        self.world_size, self.group, self.wait = world_size, group, wait
        self._handles = []
        self._works: list[dist.Work] = []
        # Each bucket's parameters, in buffer order: found once here, not in each step's hooks.
        self._members: list[list[nn.Parameter]] = [[] for _ in self.buckets]
        for p, off in zip(params, self.offsets):
            bucket = next(i for i, (start, end) in enumerate(self.buckets) if start <= off < end)
            self._members[bucket].append(p)
            if world_size > 1:
                self._handles.append(p.register_post_accumulate_grad_hook(self._on_ready(bucket)))
        self._sizes = [len(m) for m in self._members]
        self._reset()

    def _place(self, flat: torch.Tensor) -> None:
        """Make each parameter a view of `flat` (same Parameter objects, so modules and hooks keep them)."""
        for p, off in zip(self.params, self.offsets):
            p.data = flat[off : off + p.numel()].view(p.shape)

    @property
    def copies_weights(self) -> bool:
        """Whether the module computes on a copy of the weights in another dtype (the bf16 weight copy)."""
        return self.weights is not self.master

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
        self._gather(self._members[bucket], start, end)
        if self.staging is not self.buffer:
            self.buffer[start:end].copy_(self.staging[start:end])
        self._works.append(dist.all_reduce(self.buffer[start:end], group=self.group, async_op=True))
        self._next = bucket + 1

    def _gather(self, params: list[nn.Parameter], start: int, end: int) -> None:
        """With gather: the gradients of `params`, which fill [start, end), into `staging`, one cat
        (a parameter that got none this step gives zeros, as an untouched view would hold)."""
        if not self.gather:
            return
        parts = [p.grad.reshape(-1) if p.grad is not None else self.staging.new_zeros(p.numel()) for p in params]
        torch.cat(parts, out=self.staging[start:end])

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
        """The weights as one Parameter over `master`, with the gradient buffer as its .grad: the
        module's parameters are views of it (or, with a weight copy, of its copy, which
        `updated()` refreshes).

        For the optimizer: the fused Adagrad then runs one kernel on one tensor (tiny: 0.08 ms a
        step against 0.39 per parameter; docs/dense-gradients-notes.md), with the same bits
        (Adagrad is element-wise; tests/test_dense_gradients.py checks it against the per-parameter
        optimizer)."""
        param = nn.Parameter(self.master)
        param.grad = self.buffer
        return param

    @contextlib.contextmanager
    def master_weights(self):
        """The module's parameters are the fp32 weights inside (evaluation in fp32, the final
        weights); nothing to do without a weight copy. No backward may run inside."""
        if not self.copies_weights:
            yield
            return
        self._place(self.master)
        try:
            yield
        finally:
            self._place(self.weights)

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
        else:
            self._gather(self.params, 0, self.staging.numel())
            if self.staging is not self.buffer:
                self.buffer.copy_(self.staging)
        for work in self._works:
            self.wait(work)
        self._works.clear()
        self._reset()

    def zero(self) -> None:
        """Zero what backward accumulates into (a separate fp32 buffer is overwritten by its casts);
        with gather, drop the step's gradients: autograd then keeps the next ones as they come."""
        if not self.gather:
            self.staging.zero_()
            return
        for p in self.params:
            p.grad = None

    def updated(self) -> None:
        """After the optimizer step: refresh the weight copy from the masters (one cast), then zero
        the gradients for the next step."""
        if self.copies_weights:
            with torch.no_grad():
                self.weights.copy_(self.master)
        self.zero()
