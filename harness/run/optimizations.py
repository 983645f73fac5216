"""Which requested optimizations can take effect here, and why the others cannot.

Decided once, by the launcher, from the device and backend the ranks will use; written to the
manifest and printed once. Ranks read the effective flags from the manifest, so each flag has
one reading site and nothing is dropped silently.
"""

from __future__ import annotations

import dataclasses
import os

from collections.abc import Callable, Sequence
from importlib import metadata

from harness.config import OptimizationsConfig, PrecisionConfig
from harness.records.manifest import (AheadEntry, CrossNetEntry, DenseGradsEntry, DenseOptimizerEntry, DenseWeightsEntry,
                                      PrecisionEntry, ResolvedFlags, WaitEntry)
from harness.names import OPTIMIZATION_FLAGS
from model.names import KNOWN_SPLITS_KINDS, ROW_BLOCKED_KINDS, ShardingType


AVOID_RECORD_STREAMS_DEFAULT_SINCE = (2, 8)
"""The torch release from which ProcessGroupNCCL always stashes a collective's tensors until the
user stream syncs with it (what TORCH_NCCL_AVOID_RECORD_STREAMS=1 used to switch on) and answers
the variable with "TORCH_NCCL_AVOID_RECORD_STREAMS is the default now, this environment variable
is thus deprecated" (ProcessGroupNCCL.cpp; pytorch/pytorch#194701 later removed the stale
mentions). torch 2.13's ProcessGroupNCCL.hpp still documents the variable; the .cpp decides."""


def torch_avoids_record_streams(torch_version: str) -> bool:
    """Whether this torch (its version string, e.g. "2.13.0+cu128") avoids recordStream anyway."""
    major, minor = (int(part) for part in torch_version.split("+")[0].split(".")[:2])
    return (major, minor) >= AVOID_RECORD_STREAMS_DEFAULT_SINCE


def input_thread_launches(cuda: bool) -> bool:
    """Whether the threaded input dist's thread launches collectives: on gloo only, whose process
    groups each keep their own order; NCCL needs one order over all (harness/run/input_pipeline.py)."""
    return not cuda


def fused_adagrad_registered(device_type: str) -> bool:
    """Whether the installed torch runs a fused Adagrad on `device_type`, asked without touching a
    device (so the launcher may ask before any rank starts). Two gates: the dispatcher must have
    the kernel, and torch.optim.Adagrad's own device check must accept the device. torch 2.11
    registers a CUDA kernel yet its Adagrad refuses CUDA at the first step (`cuda_unsupported=True`),
    which is what killed every CUDA run of the first two H100 sessions."""
    import inspect

    import torch

    key = {"cpu": "CPU", "cuda": "CUDA"}.get(device_type)
    if key is None or not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_adagrad_", key):
        return False
    if device_type == "cuda":
        return "cuda_unsupported=True" not in inspect.getsource(inspect.getmodule(torch.optim.Adagrad))
    return True


def dense_adagrad(device_type: str, *, engine: str = "harness",
                  has_kernel: Callable[[str], bool] = fused_adagrad_registered) -> DenseOptimizerEntry:
    """The harness's dense Adagrad on `device_type`: fused where torch has the kernel, else foreach,
    both on the one flat parameter (FlatGradients.flat_parameter), so one or a few kernels a step.
    has_kernel: stands in for torch's answer (tests)."""
    if engine != "harness" and device_type == "cuda":
        # torch picks foreach on CUDA only when every parameter is a plain Tensor or Parameter, and
        # TorchRec hands data-parallel tables over as TableBatchedEmbeddingSlice: its loop cost
        # tiny's TorchRec runs 2.85 ms of dense_update a step on the H100 (the harness: 0.29).
        return DenseOptimizerEntry(impl="foreach", reason=f"the {engine} engine's torch.optim.Adagrad, foreach asked "
                                   "for (torch would fall back to its per-parameter loop for TorchRec's table slices)")
    if engine != "harness":
        return DenseOptimizerEntry(impl="default", reason=f"the {engine} engine builds torch.optim.Adagrad as "
                                   "stock (torch's default on a CPU: the for-loop)")
    if has_kernel(device_type):
        return DenseOptimizerEntry(impl="fused", reason=f"torch's fused Adagrad kernel for {device_type}")
    return DenseOptimizerEntry(impl="foreach", reason=f"this torch has no fused Adagrad kernel for {device_type}")


AHEAD_ON_CUDA = 2
"""Batches drawn ahead on CUDA: the one the next iteration takes and the one after it."""

AHEAD_WORKERS_MAX = 8
"""At most this many batch threads a rank: small at 8192 samples takes about 25 ms of one core
(numpy), so 8 keep up with a 4 ms iteration; more would only take cores from the launching thread."""


def ahead_workers(depth: int, *, local_ranks: int, cores: int | None = None) -> int:
    """Threads making batches for one of `local_ranks` ranks on a host of `cores` (the CPUs this
    process may use): two cores a rank are left to its launching thread and the runtime."""
    if depth == 0:
        return 0
    cores = cores or len(os.sched_getaffinity(0))
    return max(1, min(AHEAD_WORKERS_MAX, cores // max(1, local_ranks) - 2))


def draw_asked(data) -> str | None:
    """config data.draw_on as batches_ahead takes it: host where the batches are read (--data) or
    asked to be drawn ahead by host threads (--ahead), else as given (None: left out)."""
    if data.draw_on is None and (data.path is not None or data.ahead is not None):
        return "host"
    return data.draw_on


def batches_ahead(requested: int | None, *, cuda: bool, local_ranks: int = 1, cores: int | None = None,
                  draw_on: str | None = None, triton_missing: Callable[[], str | None] | None = None) -> AheadEntry:
    """config data.ahead resolved for the device: as asked, or left out 2 on CUDA and 0 on CPU;
    with the threads that make them (ahead_workers). draw_on (draw_asked) device, or
    left out on CUDA: drawn on the GPU with Triton installed, none ahead; elsewhere the host draws
    them and the reason says why where the GPU was asked for or would have drawn them.
    triton_missing: why Triton cannot be imported, or None (a seam for tests)."""
    not_on_device = None
    if draw_on == "device" and not cuda:
        not_on_device = "--draw-on device needs a CUDA device: drawn on the host"
    elif cuda and draw_on != "host":
        from harness.data.device_draw import DRAW_BLOCK, unavailable

        asked = "--draw-on device" if draw_on == "device" else "the default on CUDA"
        missing = (triton_missing or unavailable)()
        if missing is None:
            return AheadEntry(depth=0, workers=0, on_device=True, draw_block=DRAW_BLOCK,
                              reason=f"drawn on the GPU ({asked}: a Triton kernel and float64 ops for "
                                     f"{DRAW_BLOCK} batches at a time; ragged batches on the host)")
        not_on_device = f"{asked}, but {missing}; drawn on the host"
    entry = _host_ahead(requested, cuda=cuda, local_ranks=local_ranks, cores=cores)
    return dataclasses.replace(entry, reason=f"{not_on_device}; {entry.reason}") if not_on_device else entry


def _host_ahead(requested: int | None, *, cuda: bool, local_ranks: int, cores: int | None) -> AheadEntry:
    if requested is not None or cuda:
        depth = AHEAD_ON_CUDA if requested is None else requested
        workers = ahead_workers(depth, local_ranks=local_ranks, cores=cores)
        why = "as asked (--ahead)" if requested is not None else "CUDA: the host draws while the GPU computes"
        return AheadEntry(depth=depth, workers=workers,
                          reason=why + (f"; {workers} thread(s) of {cores or len(os.sched_getaffinity(0))} cores "
                                        f"shared by {local_ranks} rank(s)" if depth else ""))
    return AheadEntry(depth=0, reason="CPU ranks: a thread drawing batches would share their cores (measured: no "
                      "gain, docs/input-pipeline-notes.md)")


def resolve(
    opts: OptimizationsConfig, *, cuda: bool, plan_kinds: Sequence[str], precision: PrecisionConfig = PrecisionConfig(),
    engine: str = "harness", torch_version: str | None = None, ahead: int | None = None, local_ranks: int = 1,
    world_size: int = 2, draw_on: str | None = None, triton_missing: Callable[[], str | None] | None = None,
) -> ResolvedFlags:
    """torch_version: the installed torch's when None (a seam for tests); triton_missing: as
    batches_ahead takes it (the projection of another host's run: lambda: None)."""
    torch_version = torch_version or metadata.version("torch")
    requested = opts.requested()
    reasons: dict[str, str] = {}
    notes: dict[str, str] = {}
    device = "cuda" if cuda else "cpu"
    if requested["cuda_graphs"] and not cuda:
        reasons["cuda_graphs"] = f"CUDA only: this run is on {device}"
    if requested["pinned_d2h"] and not cuda:
        reasons["pinned_d2h"] = f"CUDA only (pinned host memory and async copies): this run is on {device}"
    if requested["avoid_record_streams"] and not cuda:
        reasons["avoid_record_streams"] = "NCCL only: this run uses gloo"
    elif requested["avoid_record_streams"] and torch_avoids_record_streams(torch_version):
        reasons["avoid_record_streams"] = (f"torch {torch_version} already avoids recordStream in ProcessGroupNCCL "
                                           "and ignores the variable (deprecated since torch 2.8)")
    if requested["threaded_input_dist"] and world_size == 1:
        reasons["threaded_input_dist"] = (
            "one rank: the input dist exchanges nothing (a local copy at most), so there is no collective to hide, "
            "and a second thread contends for the GIL and the rank's cores (the defaults' period: one H100, small "
            "at 8192, 1.13x; one CPU rank, tiny 1.16x, small 0.96x (95% CI 0.90-1.02); docs/optimizations.md)")
    elif requested["threaded_input_dist"]:
        notes["threaded_input_dist"] = (
            "the input thread also launches the splits and ids exchanges, on a process group of its own"
            if input_thread_launches(cuda) else
            "the input thread loads and prepares batches; the main thread launches every collective")
    if requested["skip_splits_a2a"]:
        static = sum(k in KNOWN_SPLITS_KINDS for k in plan_kinds)
        if not static:
            reasons["skip_splits_a2a"] = ("no table/column-wise table: (table-)row-wise and grid splits depend on the "
                                          "ids and data-parallel tables exchange none")
        elif any(k in ROW_BLOCKED_KINDS for k in plan_kinds):
            notes["skip_splits_a2a"] = ("(table-)row-wise, dynamic row-wise and grid tables still exchange their "
                                        "splits (they depend on the ids)")
    effective = {f: requested[f] and f not in reasons for f in OPTIMIZATION_FLAGS}
    return ResolvedFlags(pipeline=opts.pipeline, requested=requested, effective=effective,
                         inactive_reasons=reasons, notes=notes,
                         precision=_precision_entry(precision, plan_kinds, cuda=cuda),
                         collective_wait=_wait_entry(opts.collective_wait, cuda=cuda, engine=engine),
                         dense_optimizer=dense_adagrad("cuda" if cuda else "cpu", engine=engine),
                         batches_ahead=batches_ahead(ahead, cuda=cuda, local_ranks=local_ranks, draw_on=draw_on,
                                                     triton_missing=triton_missing),
                         cross_net=_cross_entry(opts.fused_cross, engine=engine),
                         dense_weights=_dense_weights_entry(opts.bf16_weight_copy, precision.dense, engine=engine),
                         dense_grads=_dense_grads_entry(opts.gather_grads, effective["cuda_graphs"], engine=engine))


def inactive_whatever_the_plan(flags: Sequence[str], *, cuda: bool, world_size: int) -> dict[str, str]:
    """Those of `flags` that cannot take effect on the device and world size whatever the sharding
    plan, with why (`resolve`'s reasons; skip_splits_a2a depends on the plan: never among them).
    A run of one is a run of the defaults again (make gpu-bench runs none)."""
    out = {}
    for f in flags:
        if f == "skip_splits_a2a":
            continue
        res = resolve(OptimizationsConfig(**{f: True}), cuda=cuda, plan_kinds=[], world_size=world_size,
                      local_ranks=world_size)
        if f in res.inactive_reasons:
            out[f] = res.inactive_reasons[f]
    return out


def _dense_grads_entry(gather: bool, graphed: bool, *, engine: str) -> DenseGradsEntry:
    if engine != "harness":
        return DenseGradsEntry(impl="ddp", reason=f"the {engine} engine's dense arch is under DDP, as stock")
    if graphed:
        return DenseGradsEntry(impl="views", reason="cuda_graphs: the captured step adds into static views of the buffer")
    return DenseGradsEntry(impl="gather" if gather else "views")


def _cross_entry(fused: bool, *, engine: str) -> CrossNetEntry:
    if fused and engine != "harness":
        return CrossNetEntry(impl="autograd", reason=f"the {engine} engine runs its own (stock) cross layers")
    return CrossNetEntry(impl="fused" if fused else "autograd")


def _dense_weights_entry(copy: bool, dense: str, *, engine: str) -> DenseWeightsEntry:
    if dense == "fp32":
        return DenseWeightsEntry(impl="fp32")
    if dense == "bf16-pure":  # the torchrec engine refuses it (engine_torchrec.check_config)
        return DenseWeightsEntry(impl="bf16 copy", reason="" if copy else (
            "bf16-pure computes on the bf16 copy: --no-bf16-weight-copy takes no effect"))
    if copy and engine != "harness":
        return DenseWeightsEntry(impl="autocast casts",
                                 reason=f"the {engine} engine keeps stock fp32 parameters under autocast")
    return DenseWeightsEntry(impl="bf16 copy" if copy else "autocast casts")


def _wait_entry(requested: str, *, cuda: bool, engine: str) -> WaitEntry:
    if requested == "poll" and engine != "harness":
        return WaitEntry(requested=requested, effective="block",
                         reason=f"the {engine} engine waits its own way (torch's blocking wait())")
    if requested == "poll" and cuda:
        # ProcessGroupNCCL's wait() makes the current stream wait for the collective's event and
        # returns; is_completed() queries that event, so polling it would sync the host with the GPU.
        return WaitEntry(requested=requested, effective="block",
                         reason="NCCL waits order the stream and never block the host; polling would sync with the GPU")
    return WaitEntry(requested=requested, effective=requested)


def _precision_entry(precision: PrecisionConfig, plan_kinds: Sequence[str] = (), *, cuda: bool = False) -> PrecisionEntry:
    notes = []
    if precision.dense == "bf16-pure":
        notes.append("dense activations and gradients all in bf16 (fp32 weights, optimizer state and loss)")
    elif precision.dense != "fp32":
        notes.append(f"dense forward under {precision.dense} autocast (fp32 weights, optimizer state and loss)")
    tf32 = precision.tf32 and cuda
    if tf32:
        notes.append("fp32 matmuls on TF32 tensor cores (10-bit significands)")
    no_tf32 = "; tf32 takes no effect: TF32 is a CUDA tensor-core format, this run is on cpu" * (precision.tf32 and not cuda)
    fused = any(k != ShardingType.DATA_PARALLEL for k in plan_kinds) or not plan_kinds
    wire = (precision.comm, precision.wire_bwd)
    if wire != ("fp32", "fp32") and fused:
        how = ("row-wise partial sums are exchanged whole and summed in fp32" if wire[0] == "fp8"
               else f"a reduce-scatter sums in {wire[0]}")
        how += "; fp8 rows carry a per-row fp32 scale" if "fp8" in wire else ""
        notes.append(f"pooled embeddings sent in {wire[0]} and their gradients in {wire[1]}, decoded to fp32 on "
                     f"arrival ({how})")
    if precision.tables != "fp32" and fused:
        dp = " (its data-parallel tables stay fp32)" if ShardingType.DATA_PARALLEL in plan_kinds else ""
        notes.append(f"fused tables' weights in {precision.tables}, their optimizer state and pooled output fp32{dp}")
    if not notes:
        # A table or wire precision asked of a plan with no fused table changes nothing: said, not hidden.
        asked = [f"tables {precision.tables}"] * (precision.tables != "fp32") + [f"comm {wire[0]}/{wire[1]}"] * (
            wire != ("fp32", "fp32"))
        idle = (f"{' and '.join(asked)} take no effect: every table of this plan is data-parallel, and those stay "
                "fp32 and exchange no pooled embeddings") if asked else "fp32 throughout"
        return PrecisionEntry(tables=precision.tables, comm=wire[0], comm_bwd=wire[1], note=idle + no_tf32)
    return PrecisionEntry(dense=precision.dense, tables=precision.tables, comm=wire[0], comm_bwd=wire[1], tf32=tf32,
                          numerics_changed=True,
                          note="; ".join(notes) + ": losses and weights differ from fp32 runs by design" + no_tf32)


def describe(res: ResolvedFlags) -> str:
    """One line per requested flag: on, or requested-but-inactive with the reason."""
    lines = [f"loop: {'pipelined' if res.pipeline else 'plain'}"]
    for f in OPTIMIZATION_FLAGS:
        if not res.requested[f]:
            continue
        if res.effective[f]:
            note = res.notes.get(f)
            lines.append(f"{f}: on" + (f" ({note})" if note else ""))
        else:
            lines.append(f"{f}: requested but INACTIVE: {res.inactive_reasons[f]}")
    if len(lines) == 1:
        lines.append("optimization flags: none requested")
    wait = res.collective_wait
    lines.append(f"collective wait: {wait.effective}" + (f" (requested {wait.requested}: {wait.reason})" if wait.reason else ""))
    ahead = res.batches_ahead
    lines.append(f"batches ahead: {ahead.depth}" + (f" ({ahead.reason})" if ahead.reason else ""))
    cross = res.cross_net
    lines.append(f"cross layers: {cross.impl}" + (f" ({cross.reason})" if cross.reason else ""))
    weights = res.dense_weights
    lines.append(f"dense weights: {weights.impl}" + (f" ({weights.reason})" if weights.reason else ""))
    dgrads = res.dense_grads
    lines.append(f"dense gradients: {dgrads.impl}" + (f" ({dgrads.reason})" if dgrads.reason else ""))
    dense_opt = res.dense_optimizer
    lines.append(f"dense optimizer: Adagrad {dense_opt.impl}" + (f" ({dense_opt.reason})" if dense_opt.reason else ""))
    prec = res.precision
    lines.append(f"precision: dense {prec.dense}{' (TF32 matmuls)' if prec.tf32 else ''}, tables {prec.tables}, "
                 f"comm {prec.comm}/{prec.comm_bwd}"
                 + (f": NUMERICS CHANGED, {prec.note}" if prec.numerics_changed
                    else f": {prec.note}" if prec.note != "fp32 throughout" else ""))
    return "\n".join(lines)
