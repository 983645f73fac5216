"""The dense step of every iteration (forward, backward, gradient all-reduce), eager or as one CUDA graph.

The gradient all-reduce runs in buckets launched during backward (harness/run/dense_gradients.py).
`cuda_graphs` optimization: the dense step is many small kernels plus the collectives, so on a
GPU its cost is mostly launch overhead. Captured once and replayed, it is one launch. The
bucketed collectives are captured too: each is launched async from a backward hook and waited
for before the capture ends, so the graph holds them with their dependencies on the compute,
as it does for DDP's bucketed all-reduces in a whole-network capture.

`precision` "bf16": the dense forward runs under torch.autocast(bfloat16) (matmuls in bf16,
weights, gradients and optimizer state stay fp32, the loss is taken in fp32), as GPU MLPerf
submissions do. It changes the numbers by design. The module's parameters may be a bf16 copy of
the weights (FlatGradients' compute_dtype): autocast then has no weight to cast, same bits.
"bf16-pure": no autocast; the inputs are cast to bf16 and every activation, elementwise op and
gradient of the step stays bf16 (the cross layers' residual stream too), on the bf16 weight copy;
the loss is taken in fp32 and the pooled gradient comes back fp32, through the input's cast.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from harness.names import DENSE_PRECISIONS
from harness.run.dense_gradients import FlatGradients

AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "bf16-pure": None}
"""Autocast dtype of each dense precision (None: no autocast)."""
INPUT_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": None, "bf16-pure": torch.bfloat16}
"""The dtype each precision casts the step's inputs to, so that every op runs in it (None: none)."""
assert set(AUTOCAST_DTYPES) == set(INPUT_DTYPES) == set(DENSE_PRECISIONS)  # a precision added needs both here

# Enough for the lazy one-time work (cuBLAS handles and workspaces, autograd's per-stream
# state, the NCCL communicator) to happen outside the capture, where it is not allowed.
WARMUP_ITERS = 3


def graph_input_shapes(local_batch: int, num_dense: int, pooled_width: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the static input buffers a captured dense step reads on every replay."""
    for name, value in (("local_batch", local_batch), ("num_dense", num_dense), ("pooled_width", pooled_width)):
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    return {
        "dense_x": (local_batch, num_dense),
        "pooled": (local_batch, pooled_width),
        "labels": (local_batch,),
    }


class DenseStep:
    """`run(dense_x, pooled, labels) -> (loss, pooled_grad)`, then `finish_gradients()`, leaving the
    all-reduced dense gradients in `grads.buffer`, exactly as the eager step

        with autocast(precision):  # none for fp32
            logits = dense(dense_x, pooled)
        loss = binary_cross_entropy_with_logits(logits.float(), labels)
        (loss / world_size).backward()   # hooks launch gradient buckets' all-reduces meanwhile
        grads.finish()                   # eager: in finish_gradients(), after the embedding backward

    does. Gradients accumulate (into the buffer's views, or in .grad until gathered: FlatGradients'
    gather), so the caller must zero them between calls, as the train loop's `grads.updated()`
    does after the optimizer step.

    graphed=True captures that step in a CUDA graph at construction. With world_size > 1 the
    construction runs collectives (warm-up all-reduces and the captured ones), so every rank must
    construct its DenseStep at the same point, with the same arguments.
    """

    def __init__(
        self,
        *,
        dense: nn.Module,
        grads: FlatGradients,
        world_size: int,
        local_batch: int,
        num_dense: int,
        pooled_width: int,
        device: torch.device,
        graphed: bool,
        precision: str,
    ) -> None:
        if graphed and grads.gather:
            raise ValueError("a captured dense step adds into the gradients' static views: build FlatGradients "
                             "with gather=False for graphed=True")
        if graphed and device.type != "cuda":
            raise ValueError(f"graphed=True needs a CUDA device (CUDA graphs), got device {device}")
        if precision not in AUTOCAST_DTYPES:
            raise ValueError(f"precision {precision!r} is not one of {list(AUTOCAST_DTYPES)}")
        self.dense, self.grads, self.world_size = dense, grads, world_size
        self._autocast_dtype, self._input_dtype = AUTOCAST_DTYPES[precision], INPUT_DTYPES[precision]
        if self._input_dtype is not None and {p.dtype for p in dense.parameters()} != {self._input_dtype}:
            raise ValueError(f"precision {precision} computes on a {self._input_dtype} copy of the weights: build "
                             f"FlatGradients with compute_dtype={self._input_dtype}")
        self.device, self.graphed = device, graphed
        self.shapes = graph_input_shapes(local_batch, num_dense, pooled_width)
        if graphed:
            self._capture()

    def run(
        self, dense_x: torch.Tensor, pooled: torch.Tensor, labels: torch.Tensor,
        *, on_pooled_grad: Callable[[torch.Tensor], None] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (detached local mean loss, d(loss / world_size)/d(pooled)).

        Eager: `pooled` must be a leaf with requires_grad; the returned gradient is its .grad.
        Graphed: both returned tensors are the graph's static outputs, overwritten by the next
        `run`; use (or copy) them before calling again.

        on_pooled_grad: called with d(loss / world_size)/d(pooled) as soon as it exists. Eager,
        that is inside backward, before the bottom MLP's backward and the last gradient buckets'
        all-reduces are launched, so a collective it launches is not queued behind them; graphed,
        right after the replay.
        """
        self._check_shapes(dense_x=dense_x, pooled=pooled, labels=labels)
        if self.graphed:
            loss, pooled_grad = self._replay(dense_x, pooled, labels)
            self.grads.count_step()  # the replay ran the captured all-reduces
            if on_pooled_grad is not None:
                on_pooled_grad(pooled_grad)
            return loss, pooled_grad
        if not pooled.requires_grad:
            raise ValueError("pooled must require grad: its .grad is the embedding backward's input")
        hook = None
        if on_pooled_grad is not None:
            # The hook fires at the same point of the same graph on every rank, so collectives it
            # launches keep one order across ranks relative to the bucket all-reduces.
            hook = pooled.register_post_accumulate_grad_hook(lambda p: on_pooled_grad(p.grad))
        try:
            loss = self._forward_backward(dense_x, pooled, labels)
        finally:
            if hook is not None:
                hook.remove()
        assert pooled.grad is not None
        return loss, pooled.grad

    def pooled_input(self) -> torch.Tensor | None:
        """Where the embedding forward should write the pooled input: a graphed step's static
        buffer (then `run` copies nothing for it; about 109 MB a step at 8192 samples a rank on
        mlperf), None eager."""
        return self._static_pooled if self.graphed else None

    def _check_shapes(self, **tensors: torch.Tensor) -> None:
        # A batch of another shape would silently read stale rows of the static buffers.
        for name, t in tensors.items():
            if tuple(t.shape) != self.shapes[name]:
                raise ValueError(f"{name} has shape {tuple(t.shape)}, the dense step was built for {self.shapes[name]}")

    def _forward_backward(self, dense_x: torch.Tensor, pooled: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self._input_dtype is not None:  # bf16-pure: every op after these casts runs in bf16
            dense_x, pooled = dense_x.to(self._input_dtype), pooled.to(self._input_dtype)
        with self._maybe_autocast():
            logits = self.dense(dense_x, pooled)
        # The loss in fp32 whatever the precision: in bf16 each sample's loss and its gradient
        # (sigmoid - label) would keep only 8 bits.
        loss = F.binary_cross_entropy_with_logits(logits.float(), labels)
        # Each rank's mean over its share, divided by the world size and summed by the
        # all-reduce, is the gradient of the mean over the global batch.
        (loss / self.world_size).backward()
        if self.graphed:  # a captured collective must be waited for inside the capture
            self.grads.finish()
        return loss.detach()

    def finish_gradients(self) -> None:
        """Wait for the dense gradients' all-reduce, before the optimizer step. Eager, `run` leaves
        its last buckets in flight so that they overlap the embedding backward (its all-to-all and
        the fused update); a graphed step already waited inside the graph."""
        if not self.graphed:
            self.grads.finish()

    def _maybe_autocast(self) -> contextlib.AbstractContextManager:
        if self._autocast_dtype is None:
            return contextlib.nullcontext()
        # No weight-cast cache: each weight is cast at most once a forward anyway, and a cache kept
        # across a CUDA graph capture would hold tensors outside the graph's memory pool.
        return torch.autocast(self.device.type, dtype=self._autocast_dtype, cache_enabled=False)

    # ---- CUDA only below: reached only when graphed=True, which the constructor limits to CUDA.

    def _capture(self) -> None:
        with self.grads.uncounted():  # warm-up and capture are no training step: their bytes count nowhere
            self._warm_up_and_capture()

    def _warm_up_and_capture(self) -> None:
        dtype = self.grads.buffer.dtype
        static = {name: torch.zeros(shape, device=self.device, dtype=dtype) for name, shape in self.shapes.items()}
        self._static_dense_x, self._static_labels = static["dense_x"], static["labels"]
        self._static_pooled = static["pooled"].requires_grad_(True)

        with torch.cuda.device(self.device):
            # One side stream for warm-up and capture: the autograd nodes and library handles
            # the warm-up sets up are then the ones the capture uses.
            stream = torch.cuda.Stream(device=self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(WARMUP_ITERS):
                    self._static_pooled.grad = None
                    self._forward_backward(self._static_dense_x, self._static_pooled, self._static_labels)
            torch.cuda.current_stream(self.device).wait_stream(stream)

            # Warm-up is not a training step: its gradients must not reach the first update.
            # The dense .grad views stay in place (capture must add into the flat buffer the
            # optimizer and the all-reduce use), but pooled.grad is dropped so that capture
            # allocates it in the graph's pool and each replay overwrites it instead of
            # adding to it.
            self.grads.zero()
            self.grads.buffer.zero_()  # a weight copy's warm-up finish() cast its gradients there too
            self._static_pooled.grad = None

            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph, stream=stream):
                self._static_loss = self._forward_backward(
                    self._static_dense_x, self._static_pooled, self._static_labels
                )
        assert self._static_pooled.grad is not None
        self._static_pooled_grad = self._static_pooled.grad

    def _replay(
        self, dense_x: torch.Tensor, pooled: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # no_grad: the static pooled buffer is a leaf that requires grad, which forbids an
        # in-place copy under autograd; the copy itself needs no gradient.
        with torch.no_grad():
            self._static_dense_x.copy_(dense_x)
            if pooled is not self._static_pooled:  # written in place by the embedding forward otherwise
                self._static_pooled.copy_(pooled)
            self._static_labels.copy_(labels)
        self._graph.replay()
        return self._static_loss, self._static_pooled_grad
