"""Kernels (ops on CPU) each stage launches an iteration, counted from the code path the flags select.

Counted per layer from what the dense step runs (model/dense.py, harness/run/dense_step.py):

- a Linear forward: its addmm and its ReLU (2); backward: the two GEMMs (input and weight
  gradients), the bias gradient's sum and the ReLU's backward (4), plus the gradient's copy into
  the flat buffer for weight and bias (2): 8 a Linear in fp32;
- under bf16 autocast, 3 more forward (weight, bias and input cast to bf16) and 2 more backward
  (weight and bias gradients cast back to fp32): 13 a Linear;
- a DCNv2 cross layer is two Linears (V: 3456->512, W: 512->3456) plus x0 * (.) and + x_l forward
  (2) and their backward (4) and the residual's gradient add (1): 7 elementwise kernels;
- fused cross layers (model/cross_layer.py, the harness's default): x0 * y + x in one addcmul
  forward (1 fewer), and backward the residual's gradient added inside the GEMM in fp32 (1 fewer)
  or, in bf16, d/dy rounded to bf16 in its multiply and the V GEMM's bf16 gradient added to the
  fp32 one in one mixed-dtype add (2 fewer casts): 2 fewer kernels a layer in fp32, 3 in bf16;
- the bf16 weight copy (harness/run/dense_gradients.py, the harness's default in bf16): the weight
  and bias casts are gone both ways (4 fewer a Linear: 9); the gradients' cast to fp32 moves into
  one copy a step (world size 1, in dense_update, where the eager step waits for its gradients) or
  one a bucket, and the copy's refresh after the update is one more in dense_update;
- bf16-pure: as fp32 (no autocast cast anywhere), plus the two inputs' casts to bf16 and the
  pooled gradient's back (3), and the weight copy's gradient cast and refresh;
- the interaction's concat and its gradient's split, the BCE-with-logits loss forward (3) and
  backward (3), the backward's seed and the loss's copy: 10 a step;
- world size > 1: each 4 MiB gradient bucket (harness/run/dense_gradients.py DEFAULT_BUCKET_MIB)
  one copy and one all-reduce;
- gathered gradients (harness/run/dense_gradients.py, eager steps since 2026-11-27; a CUDA graph
  keeps the views): autograd's add of each gradient into its view of the buffer is gone (2 a
  Linear, less the cross layers' V, which has no bias), and one cat a bucket gathers them (world
  size 1: one a step, in dense_update, where the views' zero fill is gone).

small in bf16 with autograd's cross layers: 14 Linears x 13 + 3 cross layers x 7 + 10 = 213
kernels in dense_fwd_bwd; the H100 trace (docs/gpu-session-2-notes.md,
tests/data/h100-runs-2/s-bf16-prof/rank00000/trace.json.gz, made before the fused layers) counted 217; fused,
204, and with the bf16 weight copy 14 x 9 + 3 x 4 + 10 = 148; gathered, 123 (the fifth session's trace
of that step held 129, cuBLAS's memsets among them).

The embedding stages are counted by sharding group from the fifth H100 session's traces of
today's code on one rank (tests/data/h100-runs-5/, GROUP_KERNELS; an iteration's, as the
profile's stage table gives them): a table-wise group (small) launches 8 in input_dist, 6 in
emb_fwd and 25 in emb_bwd (fbgemm's backward with its Adagrad fused); a data-parallel group
(tiny) none in input_dist, 4 in emb_fwd (its lookup), and its backward runs inside the dense
backward (start_backward, from the pooled gradient's hook: fbgemm's dense-gradient backward, 22
kernels in dense_fwd_bwd), its Adagrad (torch's foreach, 5) in emb_bwd. Several groups (small
with mlperf's 12 data-parallel tables, traced in the same session's second call): each group's
features permuted out of the batch (7 kernels in input_dist: fbgemm's 2-D permutes and their
offsets) and its columns copied each way (emb_fwd and the backward; model/sharded_embeddings.py).
Beyond one rank an exchanging group moves its ids and rows, which one rank skips
(model/shardings/table_wise.py): the second session's one-rank trace, made when one rank still
moved them, counted 9 in input_dist and 11 in emb_fwd (EXCHANGING_MOVES: 1 and 5 more); a
data-parallel group adds its gradient's all-reduce. No multi-GPU run has been traced: the counts
beyond one rank are these, stated in the output as an assumption.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

KERNELS_FP32_LINEAR = 8
KERNELS_BF16_LINEAR = 13
KERNELS_CROSS_ELEMENTWISE = 7
FUSED_CROSS_SAVES = {False: 2, True: 3}
"""Kernels a fused cross layer launches fewer than autograd's, in fp32 (False) and bf16 (True)."""
WEIGHT_COPY_SAVES = 4
"""Kernels a Linear launches fewer with the bf16 weight copy (its weight and bias casts, both ways)."""
KERNELS_DENSE_FIXED = 10
PURE_CASTS = 3
"""bf16-pure: the dense and pooled inputs cast to bf16, the pooled gradient back to fp32."""
DRAW_OPS = 29
"""A batch drawn on the GPU (harness/data/device_draw.py, the default on CUDA since 2026-11-27):
its Philox kernel, the ids' power law (6 ops), the dense features' logs (5), the label's sums,
logit and draw (15), the lengths and the dense cast (2), launched between iterations on the load
stream; their device time (under 0.1 ms for small's batch) runs beside the compute and is left out."""

BUCKET_BYTES = 4 * 2**20
KERNELS_A_BUCKET = 2

DENSE_UPDATE = 6


@dataclass(frozen=True)
class GroupKernels:
    """Kernels one sharding group launches on one rank in one iteration, by stage (module docstring)."""

    input_dist: int
    """Its ids' bucketize and permutes, its lengths and values moved, and its splits'."""
    splits: int
    """Of input_dist: the splits' exchange and their copy to the host (skip_splits_a2a removes
    them from the table-wise group, whose splits are known in advance)."""
    emb_fwd: int
    emb_bwd: int
    backward: int = 0
    """Launched inside dense_fwd_bwd, from the pooled gradient's hook (start_backward)."""

    def plus(self, more: GroupKernels) -> GroupKernels:
        return GroupKernels(**{f.name: getattr(self, f.name) + getattr(more, f.name) for f in fields(self)})


EXCHANGING_GROUP = GroupKernels(input_dist=8, splits=2, emb_fwd=6, emb_bwd=25)
EXCHANGING_MOVES = GroupKernels(input_dist=1, splits=0, emb_fwd=5, emb_bwd=0)
"""What an exchanging group launches more beyond one rank (module docstring)."""
GROUP_KERNELS = {"data_parallel": GroupKernels(input_dist=0, splits=0, emb_fwd=4, emb_bwd=5, backward=22)}
"""A group by its name (model/planner.py GROUP_OF_KIND): data-parallel tables as the module docstring
says; every other group EXCHANGING_GROUP."""
DATA_PARALLEL_MOVES = GroupKernels(input_dist=0, splits=0, emb_fwd=0, emb_bwd=0, backward=1)
"""Beyond one rank: the tables' gradient all-reduce, launched in the hook."""


SEVERAL_GROUPS = GroupKernels(input_dist=7, splits=0, emb_fwd=1, emb_bwd=0, backward=1)
"""What each group launches more where several share the tables: its features permuted out of the
batch, its columns copied into the pooled tensor and its gradient's out of it."""
GROUP_COUNTS = ("input_dist / emb_fwd / emb_bwd on one rank: table-wise 8 / 6 / 25; data-parallel 0 / 4 / 5, "
                "and 22 in dense_fwd_bwd (its backward); several groups 7 / 1 / 0 and 1 in dense_fwd_bwd each")
GROUP_COUNTS_BEYOND_ONE = ("beyond one rank (assumption: no multi-GPU trace): an exchanging group 1 more in input_dist "
                           "and 5 in emb_fwd (an older one-rank trace that still moved them), a data-parallel group "
                           "its gradient's all-reduce")


def group_kernels(group: str, world_size: int = 1) -> GroupKernels:
    """The group's kernels on a rank of a world of world_size (module docstring)."""
    k = GROUP_KERNELS.get(group, EXCHANGING_GROUP)
    if world_size == 1:
        return k
    return k.plus(DATA_PARALLEL_MOVES if group == "data_parallel" else EXCHANGING_MOVES)


@dataclass(frozen=True)
class StageKernels:
    input_dist: int
    emb_fwd: int
    dense_fwd_bwd: int
    emb_bwd: int
    dense_update: int
    dense_buckets: int
    """Gradient all-reduce buckets (0 on one rank)."""

    def of(self, stage: str) -> int:
        return int(getattr(self, stage))


def linear_count(model) -> int:
    return len(model.bottom_mlp) + len(model.top_mlp) + 2 * model.cross_layers


def dense_impl(res) -> dict[str, bool]:
    """The dense step's kernel choices a run resolved (ResolvedFlags: cross_net, dense_weights,
    dense_grads), as stage_kernels' keyword arguments."""
    return {"fused_cross": res.cross_net.impl == "fused", "weight_copy": res.dense_weights.impl == "bf16 copy",
            "gather": res.dense_grads.impl == "gather"}


def dense_kernels(model, *, bf16: bool, params: int, world_size: int, fused_cross: bool = False,
                  weight_copy: bool = False, pure: bool = False, gather: bool = False) -> tuple[int, int]:
    """(kernels of dense_fwd_bwd, gradient buckets). weight_copy: the bf16 weight copy (bf16 only);
    pure: bf16-pure, every tensor of the step in bf16 (it computes on the weight copy): fp32's
    kernels, with no autocast cast, plus the inputs' casts and the pooled gradient's back;
    gather: the gradients gathered by a cat a bucket, not added into views (module docstring)."""
    if pure:
        bf16, weight_copy = False, False
    copy = bf16 and weight_copy
    per_linear = (KERNELS_BF16_LINEAR - WEIGHT_COPY_SAVES * copy) if bf16 else KERNELS_FP32_LINEAR
    buckets = math.ceil(4 * params / BUCKET_BYTES) if world_size > 1 else 0
    cross = KERNELS_CROSS_ELEMENTWISE - (FUSED_CROSS_SAVES[bf16] if fused_cross else 0)
    k = linear_count(model) * per_linear + model.cross_layers * cross + KERNELS_DENSE_FIXED + PURE_CASTS * pure
    k -= gather * (2 * linear_count(model) - model.cross_layers)  # one add a parameter tensor
    return k + (KERNELS_A_BUCKET + (copy or pure) + gather) * buckets, buckets


def stage_kernels(cfg, *, groups: Sequence[str], params: int, world_size: int, flags: dict[str, bool],
                  fused_cross: bool = False, weight_copy: bool = False, gather: bool = False) -> StageKernels:
    """Kernels a stage launches on one rank in one iteration (module docstring). groups: the plan's
    sharding groups (Work.groups); skip_splits_a2a removes the table-wise group's splits exchange
    (its splits are known; the others' depend on the ids). fused_cross: how
    the cross layers run (ResolvedFlags.cross_net); weight_copy: whether the dense parameters are a
    bf16 copy (ResolvedFlags.dense_weights); gather: whether the gradients are gathered
    (ResolvedFlags.dense_grads)."""
    bf16, pure = cfg.precision.dense == "bf16", cfg.precision.dense == "bf16-pure"
    dense, buckets = dense_kernels(cfg.model, bf16=bf16, params=params, world_size=world_size,
                                   fused_cross=fused_cross, weight_copy=weight_copy, pure=pure, gather=gather)
    copy = (bf16 and weight_copy) or pure
    per = [group_kernels(g, world_size) for g in groups]
    known = sum(k.splits for g, k in zip(groups, per) if g == "pooled") if flags.get("skip_splits_a2a") else 0
    several = len(groups) if len(groups) > 1 else 0
    return StageKernels(
        input_dist=sum(k.input_dist for k in per) - known + several * SEVERAL_GROUPS.input_dist,
        emb_fwd=sum(k.emb_fwd for k in per) + several * SEVERAL_GROUPS.emb_fwd,
        dense_fwd_bwd=dense + sum(k.backward for k in per) + several * SEVERAL_GROUPS.backward,
        emb_bwd=sum(k.emb_bwd for k in per),
        dense_update=DENSE_UPDATE + copy * (1 + (world_size == 1)) + gather * ((world_size == 1) - 1),
        dense_buckets=buckets,
    )
