"""A rank's parts, built once before its first iteration: `build_rank(cfg) -> RankParts` for the
harness engine (harness/run/engine_torchrec.py builds the TorchRec engine's).

The order of construction is the same on every rank: process groups are made, and with
--cuda-graphs the dense step's capture runs collectives, so no rank may build them out of turn.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.distributed as dist

from harness.config import BenchConfig
from harness.data.source import BatchSource
from harness.records.manifest import ResolvedFlags
from harness.records.writer import RankRecorder
from harness.run.dense_gradients import FlatGradients
from harness.run.dense_step import DenseStep
from harness.run.dynamic_setup import dynamic_setup
from harness.run.evaluate import EvalResult, evaluate
from harness.run.flush import RecordFlusher
from harness.run.input_pipeline import InputFeeder
from harness.run.input_streams import InputStreams, input_streams
from harness.run.optimizations import draw_asked, input_thread_launches, resolve
from harness.run.pinned_d2h import HostCopies
from harness.run.step import HarnessStep, Step
from harness.run.timeline import Timeline
from model.adagrad import Adagrad
from model.collective_bytes import CollectiveBytes
from model.collective_wait import WAITS, WaitFn
from model.dense import DenseArch
from model.dynamic_table import DynamicSettings
from model.ids_all_to_all import HostTransfer
from model.names import NODE_BLOCKED_KINDS
from model.sharded_embeddings import ShardedEmbeddingCollection
from model.shardings import ShardingContext
from model.sharding import TablePlan


@dataclass
class RankParts:
    """What the loop (harness/run/loop.py) drives."""

    step: Step
    """The engine's iteration."""
    timeline: Timeline
    """Where stage and iteration boundaries are marked."""
    records: RecordFlusher
    """What goes to the run folder between iterations."""
    data: BatchSource
    """The run's batches (the result log counts its samples)."""
    evaluate: Callable[[], EvalResult] | None = None
    """AUROC on the held-out day as the model stands; None: the engine does not evaluate."""
    close: Callable[[bool], None] = field(default=lambda completed: None)
    """Releases what outlives the loop (a dynamic table's parameter store), told whether the run
    completed (its stored rows go) or failed (they stay, for a look)."""


@dataclass(frozen=True, kw_only=True)
class RankEnv:
    """Who this rank is and where it runs: what every builder below needs."""

    cfg: BenchConfig
    rank: int
    device: torch.device
    recorder: RankRecorder | None
    plan: list[TablePlan]
    group: dist.ProcessGroup | None = None
    """The job's process group (None: the default one, or no process group on one rank)."""


def build_dense(cfg: BenchConfig, device: torch.device, *, fused_cross: bool = True) -> DenseArch:
    """Same seed on every rank: data-parallel replicas start identical without a broadcast.
    fused_cross: the manifest's cross-layer choice (ResolvedFlags.cross_net)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.data.seed)
        return DenseArch(**cfg.model.dense_arch_kwargs(), fused_cross=fused_cross).to(device)


def dense_optimizer(grads: FlatGradients, cfg: BenchConfig, impl: str) -> Adagrad:
    """Adagrad on the one flat dense parameter (FlatGradients.flat_parameter), as `impl` (the
    manifest's choice for the device, harness/run/optimizations.py dense_adagrad): fused, one pass
    over the tensor, or foreach, a few. Either differs from the for-loop Adagrad in the last bits
    only, and every run on a device uses the same one, flags or not."""
    if impl not in ("fused", "foreach"):
        raise ValueError(f"dense optimizer implementation {impl!r}: the harness engine runs fused or foreach")
    return Adagrad(grads.flat_parameter(), lr=cfg.optimizer.learning_rate, eps=cfg.optimizer.eps, impl=impl)


def process_groups(env: RankEnv) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
    """(ids_pg, node_pg): the ids exchange's own group (model/shardings/base.py ShardingContext.ids_pg)
    and this rank's node's group when a table is blocked by node (None where not needed)."""
    cfg, world = env.cfg, env.cfg.run.world_size
    if world == 1 or not dist.is_initialized():
        return env.group, None
    timeout = dt.timedelta(seconds=cfg.run.collective_timeout_s)  # new_group would otherwise wait 30 min on a hung peer
    ids_pg = dist.new_group(list(range(world)), timeout=timeout)
    node_pg = None
    if any(tp.kind in NODE_BLOCKED_KINDS for tp in env.plan):
        # One group per node, made by every rank in the same order (new_subgroups does all of them).
        node_pg, _ = dist.new_subgroups(group_size=cfg.run.gpus_per_node, timeout=timeout)
    return ids_pg, node_pg


def build_embeddings(env: RankEnv, *, host: HostCopies, wait: WaitFn, moved: CollectiveBytes,
                     dynamic: DynamicSettings | None) -> ShardedEmbeddingCollection:
    cfg = env.cfg
    ids_pg, node_pg = process_groups(env)
    ctx = ShardingContext(
        rank=env.rank,
        world_size=cfg.run.world_size,
        pg=env.group,
        ids_pg=ids_pg,
        device=env.device,
        ranks_per_node=cfg.run.gpus_per_node,
        node_pg=node_pg,
        table_rows=cfg.model.table_rows,
        dim=cfg.model.embedding_dim,
        multi_hot=cfg.model.multi_hot,
        optimizer=cfg.optimizer.embedding_optimizer,
        learning_rate=cfg.optimizer.learning_rate,
        eps=cfg.optimizer.eps,
        init_seed=cfg.data.seed,
        table_precision=cfg.precision.tables,
        transfer=HostTransfer(start=host.copy, non_blocking=host.active),
        wait=wait,
        bytes_moved=moved,
        comm_fwd=cfg.precision.comm,
        comm_bwd=cfg.precision.wire_bwd,
        dynamic=dynamic,
    )
    return ShardedEmbeddingCollection(ctx, env.plan)


def resolved_flags(env: RankEnv) -> ResolvedFlags:
    """What takes effect, resolved here: for callers that launched nothing (tests; the launcher
    writes it to the manifest otherwise)."""
    cfg = env.cfg
    return resolve(cfg.optimizations, cuda=env.device.type == "cuda", plan_kinds=[tp.kind for tp in env.plan],
                   precision=cfg.precision, engine=cfg.run.engine, ahead=cfg.data.ahead,
                   local_ranks=cfg.run.gpus_per_node, world_size=cfg.run.world_size,
                   draw_on=draw_asked(cfg.data))


def build_rank(env: RankEnv, data: BatchSource, flags: ResolvedFlags | None = None) -> RankParts:
    """The harness engine's parts. `flags`: what takes effect (the manifest's resolution); None
    resolves the config here (resolved_flags)."""
    cfg, device, world = env.cfg, env.device, env.cfg.run.world_size
    flags = flags or resolved_flags(env)
    on, wait = flags.effective, WAITS[flags.collective_wait.effective]
    dense = build_dense(cfg, device, fused_cross=flags.cross_net.impl == "fused")
    moved = CollectiveBytes()  # every collective counts the bytes it moves here; each iteration's go to its records
    grads = FlatGradients(dense, world_size=world, group=env.group, wait=wait, bytes_moved=moved,
                          compute_dtype=torch.bfloat16 if flags.dense_weights.impl == "bf16 copy" else None,
                          gather=flags.dense_grads.impl == "gather")
    dense_opt = dense_optimizer(grads, cfg, flags.dense_optimizer.impl)
    host = HostCopies(device=device, pinned=on["pinned_d2h"])
    timeline = Timeline(cuda=device.type == "cuda", stages=cfg.run.timeline, device=device)
    streams = input_streams(device)
    dynamic, close_store = dynamic_setup(cfg, env.plan, rank=env.rank, recorder=env.recorder,
                                         span=lambda name: timeline.sub_span("input_dist", name),
                                         before_slots=streams.wait_for_compute)
    embeddings = build_embeddings(env, host=host, wait=wait, moved=moved, dynamic=dynamic)
    streams.wait_for_compute()  # the embeddings' index tensors, made on the compute stream, read by input dist
    dense_step = DenseStep(
        dense=dense, grads=grads, world_size=world, local_batch=cfg.local_batch_size, num_dense=cfg.model.num_dense,
        pooled_width=cfg.model.num_sparse * cfg.model.embedding_dim, device=device, graphed=on["cuda_graphs"],
        precision=cfg.precision.dense,
    )
    feeder_for = partial(_feeder, env, embeddings=embeddings, data=data, timeline=timeline, flags=flags,
                         streams=streams)
    step = HarnessStep(embeddings=embeddings, dense=dense, dense_step=dense_step, grads=grads, dense_opt=dense_opt,
                       timeline=timeline, moved=moved, local_batch=cfg.local_batch_size, feeder_for=feeder_for)
    scores = None
    if cfg.evaluation.every_samples:
        scores = partial(evaluate, files=data, stage=cfg.evaluation.stage, embeddings=embeddings, dense=dense,
                         rank=env.rank, world_size=world, device=device, group=env.group,
                         fp32_weights=grads.master_weights)
    return RankParts(step=step, timeline=timeline, records=records_flusher(env, timeline),
                     data=data, evaluate=scores, close=close_store)


def records_flusher(env: RankEnv, timeline: Timeline) -> RecordFlusher:
    """The rank's records: the losses' copies to the host are the harness's own instrumentation, so
    pinned and asynchronous on CUDA whatever --pinned-d2h says (that flag is the step's copies)."""
    return RecordFlusher(timeline=timeline, host=HostCopies(device=env.device, pinned=True), recorder=env.recorder)


def _feeder(env: RankEnv, first: int, end: int, *, embeddings: ShardedEmbeddingCollection, data: BatchSource,
            timeline: Timeline, flags: ResolvedFlags, streams: InputStreams) -> InputFeeder:
    """The input feeder of iterations first .. end-1 (a segment of the run)."""
    cuda = env.device.type == "cuda"
    return InputFeeder(
        embeddings=embeddings, data=data, rank=env.rank, world_size=env.cfg.run.world_size, device=env.device,
        total=end, first=first, pipeline=env.cfg.optimizations.pipeline, threaded=flags.effective["threaded_input_dist"],
        skip_splits=flags.effective["skip_splits_a2a"], timeline=timeline, thread_launches=input_thread_launches(cuda),
        streams=streams,
    )
