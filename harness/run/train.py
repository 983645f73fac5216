"""The train loop of one rank: five timed stages an iteration, records flushed between iterations."""

from __future__ import annotations

import datetime as dt
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from harness.config import BenchConfig
from harness.data.source import open_batches
from harness.run.dense_step import DenseStep
from harness.run.evaluate import EvalRecord, eval_iterations, evaluate
from harness.run.dense_gradients import FlatGradients
from harness.run.dynamic_setup import dynamic_setup, write_counts
from harness.run.flush import RecordFlusher
from harness.run.input_pipeline import InputFeeder
from harness.run.progress import Progress
from harness.records.manifest import ResolvedFlags
from harness.run.mlperf_log import ResultLog
from harness.run.input_streams import input_streams
from harness.run.optimizations import input_thread_launches, resolve
from harness.run.pinned_d2h import HostCopies
from harness.records.writer import RankRecorder
from harness.run.timeline import Timeline
from model.collective_bytes import CollectiveBytes
from model.collective_wait import WAITS
from model.dense import DenseArch
from model.dynamic_table import DynamicCounts
from model.ids_all_to_all import HostTransfer
from model.names import NODE_BLOCKED_KINDS
from model.sharded_embeddings import PendingBackward, ShardedEmbeddingCollection
from model.sharding import Shard, TablePlan


class InjectedFault(RuntimeError):
    """Raised on purpose by --fail-at, to test how the harness handles a rank dying."""


@dataclass
class TrainResult:
    losses: list[float]
    """This rank's loss (mean over its local batch) at every iteration, warm-up included."""
    dense_state: dict[str, torch.Tensor]
    """Final dense parameters (identical on every rank); empty unless train(keep_weights=True)."""
    shards: list[tuple[int, Shard, torch.Tensor]]
    """(table, shard, final weights) of every shard this rank holds, copied to the host; empty
    unless train(keep_weights=True) (on mlperf that copy would be tens of GiB a rank)."""
    evals: list[EvalRecord] = field(default_factory=list)
    """Every evaluation, in order (the same on every rank); empty without --eval-every."""
    dynamic: dict[int, DynamicCounts] = field(default_factory=dict)
    """What each dynamic table on this rank moved between its slots and the parameter store."""


def maybe_inject_fault(cfg: BenchConfig, rank: int, it: int, recorder: RankRecorder | None) -> None:
    """--fail-at raises here; --stall-at hangs here (after leaving a note naming the cause)."""
    if cfg.run.fail_at == (rank, it):
        raise InjectedFault(f"injected fault on rank {rank} at iteration {it} (--fail-at)")
    if cfg.run.stall_at == (rank, it):
        if recorder is not None:
            recorder.write_fault(f"injected stall on rank {rank} at iteration {it} (--stall-at)")
        while True:
            time.sleep(3600)


def build_dense(cfg: BenchConfig, device: torch.device) -> DenseArch:
    """Same seed on every rank: data-parallel replicas start identical without a broadcast."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.data.seed)
        return DenseArch(**cfg.model.dense_arch_kwargs()).to(device)


def train(
    cfg: BenchConfig,
    *,
    rank: int,
    device: torch.device,
    recorder: RankRecorder | None,
    plan: list[TablePlan],
    flags: ResolvedFlags | None = None,
    group: dist.ProcessGroup | None = None,
    keep_weights: bool = False,
) -> TrainResult:
    """Train this rank. `flags`: what takes effect (the manifest's resolution); None resolves the
    config here, for callers that launched nothing (tests).
    keep_weights: return the final weights (tests compare them with a reference)."""
    if cfg.run.engine == "torchrec":  # imported here: torchrec is needed only by runs that ask for it
        from harness.run.engine_torchrec import train_torchrec

        return train_torchrec(cfg, rank=rank, device=device, recorder=recorder, plan=plan, keep_weights=keep_weights)
    if flags is None:
        flags = resolve(cfg.optimizations, cuda=device.type == "cuda", plan_kinds=[tp.kind for tp in plan],
                        precision=cfg.precision)
    on = flags.effective
    wait = WAITS[flags.collective_wait.effective]
    world = cfg.run.world_size
    local_batch = cfg.local_batch_size
    data = open_batches(cfg)
    evals_after = eval_iterations(cfg)
    result_log = ResultLog(recorder.dir.parent if recorder is not None else None, enabled=rank == 0 and bool(evals_after))
    if evals_after:
        result_log.init_start(cfg, platform=f"{cfg.run.nodes}x{cfg.run.gpus_per_node} {device.type}",
                              train_samples=data.train_rows, eval_samples=data.held_out_scored(cfg.evaluation.stage))
    dense = build_dense(cfg, device)
    # Every collective counts the bytes it moves here; each iteration's go to its records.
    moved = CollectiveBytes()
    grads = FlatGradients(dense, world_size=world, group=group, wait=wait, bytes_moved=moved)
    # fused: one pass over each tensor (the for-loop Adagrad makes several over 64 MB on small);
    # it differs from that loop in the last bits only (measured), and every run uses it, flags or not.
    # It updates the parameters as one flat tensor (FlatGradients.flat_parameter): one kernel call.
    dense_opt = torch.optim.Adagrad([grads.flat_parameter()], lr=cfg.optimizer.learning_rate, eps=cfg.optimizer.eps,
                                    fused=True)
    host = HostCopies(device=device, pinned=on["pinned_d2h"])
    # The ids exchange gets a process group of its own (see ShardingContext.ids_pg). (A third one
    # for the pooled embeddings' exchanges was tried, so the embedding backward's all-to-all would
    # not queue behind the dense gradient buckets: no difference on tiny or small, and with that
    # all-to-all launched from the backward hook, slower on small bf16: 275-287 vs 259-269 ms.)
    ids_pg = group
    if world > 1 and dist.is_initialized():  # new_group would otherwise wait 30 min on a hung peer
        ids_pg = dist.new_group(list(range(world)), timeout=dt.timedelta(seconds=cfg.run.collective_timeout_s))
    node_pg = None
    if any(tp.kind in NODE_BLOCKED_KINDS for tp in plan) and world > 1 and dist.is_initialized():
        # One group per node, made by every rank in the same order (new_subgroups does all of them).
        node_pg, _ = dist.new_subgroups(group_size=cfg.run.gpus_per_node,
                                        timeout=dt.timedelta(seconds=cfg.run.collective_timeout_s))
    timeline = Timeline(cuda=device.type == "cuda", stages=cfg.run.timeline, device=device)
    dynamic, close_store = dynamic_setup(cfg, plan, rank=rank, recorder=recorder,
                                         span=lambda name: timeline.sub_span("input_dist", name))
    embeddings = ShardedEmbeddingCollection(
        table_rows=cfg.model.table_rows,
        embedding_dim=cfg.model.embedding_dim,
        plan=plan,
        rank=rank,
        world_size=world,
        pg=group,
        ids_pg=ids_pg,
        device=device,
        optimizer=cfg.optimizer.embedding_optimizer,
        learning_rate=cfg.optimizer.learning_rate,
        eps=cfg.optimizer.eps,
        init_seed=cfg.data.seed,
        multi_hot=cfg.model.multi_hot,
        transfer=HostTransfer(start=host.copy, non_blocking=host.active),
        wait=wait,
        ranks_per_node=cfg.run.gpus_per_node,
        node_pg=node_pg,
        table_precision=cfg.precision.tables,
        bytes_moved=moved,
        comm_fwd=cfg.precision.comm,
        comm_bwd=cfg.precision.wire_bwd,
        dynamic=dynamic,
    )
    step = DenseStep(
        dense=dense, grads=grads, world_size=world, local_batch=local_batch, num_dense=cfg.model.num_dense,
        pooled_width=cfg.model.num_sparse * cfg.model.embedding_dim, device=device, graphed=on["cuda_graphs"],
        precision=cfg.precision.dense,
    )
    total = cfg.run.warmup_iters + cfg.run.iters

    def feeder_for(first: int, end: int) -> InputFeeder:
        return InputFeeder(
            embeddings=embeddings, data=data, rank=rank, world_size=world, device=device, total=end, first=first,
            pipeline=cfg.optimizations.pipeline, threaded=on["threaded_input_dist"], skip_splits=on["skip_splits_a2a"],
            timeline=timeline, thread_launches=input_thread_launches(device.type == "cuda"), streams=input_streams(device),
        )

    records = RecordFlusher(timeline=timeline, host=host, recorder=recorder)
    flush = records.flush
    evals: list[EvalRecord] = []
    feeder: InputFeeder | None = None
    global_batch = cfg.data.global_batch_size
    result_log.run_start()
    try:
        first = 0
        # The run in segments that each end with an evaluation (one segment without any): no input
        # dist is in flight while one runs, and its time stays out of every iteration's.
        for last in evals_after or [total - 1]:
            feeder = feeder_for(first, last + 1)
            progress = Progress(total=total, first=first) if rank == 0 else None
            result_log.block_start(samples=first * global_batch,
                                   epoch=first * global_batch / data.train_rows if evals_after else 0.0)
            for it in range(first, last + 1):
                feeder.prepare(it)
                maybe_inject_fault(cfg, rank, it, recorder)
                timeline.begin_iteration(it)
                batch, ids, records.exchanged[it] = feeder.next(it)  # times itself: its input_dist span may start earlier
                with timeline.stage("emb_fwd"):
                    pooled, emb_fwd = embeddings.forward(ids, local_batch, out=step.pooled_input())
                feeder.after_forward()  # the next batch's ids exchange, launched to overlap what follows
                emb_bwd: list[PendingBackward] = []
                with timeline.stage("dense_fwd_bwd"):
                    # The pooled gradient's exchange is launched the moment backward produces it, so it
                    # runs under the rest of the dense backward (its launch is timed in this stage).
                    loss, _ = step.run(batch.dense, pooled, batch.labels,
                                       on_pooled_grad=lambda g: emb_bwd.append(embeddings.start_backward(emb_fwd, g)))
                with timeline.stage("emb_bwd"):
                    emb_bwd.pop().wait()
                with timeline.stage("dense_update"):
                    step.finish_gradients()
                    dense_opt.step()
                    grads.zero()
                timeline.end_iteration()
                records.pending[it] = loss.clone()  # a graphed step's loss is a static buffer the next replay overwrites
                records.moved[it] = moved.take()
                if progress is not None:
                    progress.done(it)
                if (it + 1) % cfg.run.flush_every == 0:
                    flush()
            feeder.close()
            feeder = None
            first = last + 1
            if evals_after:
                flush()
                result = evaluate(files=data, stage=cfg.evaluation.stage, embeddings=embeddings, dense=dense,
                                  rank=rank, world_size=world, device=device, group=group)
                moved.take()  # an evaluation's exchanges are no iteration's bytes
                evals.append(EvalRecord.of(result, index=len(evals), after_iteration=last,
                                           trained_samples=(last + 1) * global_batch, target=cfg.evaluation.target_auc))
                result_log.evaluation(auc=result.auc, samples=(last + 1) * global_batch,
                                      epoch=(last + 1) * global_batch / data.train_rows)
                if recorder is not None:
                    recorder.write_evals(evals[-1:])
                if rank == 0:
                    print(evals[-1].line(), flush=True)
                if evals[-1].reached_target:
                    break
    except BaseException:
        # What finished before the failure goes to disk first; the original error is the one
        # to report, so errors while cleaning up are only printed.
        def log_aborted() -> None:
            result_log.run_stop(success=False, samples=len(records.losses) * global_batch)

        def keep_counts() -> None:
            write_counts(recorder, embeddings.dynamic_counts())

        for cleanup in (flush, log_aborted, keep_counts, close_store, *((feeder.close,) if feeder is not None else ())):
            try:
                cleanup()
            except Exception as cleanup_exc:
                print(f"rank {rank}: {cleanup.__name__} after the failure failed: {cleanup_exc!r}", file=sys.stderr)
        raise
    flush()
    counts = embeddings.dynamic_counts()
    write_counts(recorder, counts)
    result_log.run_stop(success=bool(evals) and evals[-1].reached_target, samples=first * global_batch)
    try:
        if not keep_weights:
            return TrainResult(losses=records.losses, dense_state={}, shards=[], evals=evals, dynamic=counts)
        return TrainResult(
            losses=records.losses, evals=evals, dynamic=counts,
            dense_state={k: v.detach().cpu().clone() for k, v in dense.state_dict().items()},
            shards=[(t, s, w.detach().cpu().clone()) for t, s, w in embeddings.shard_weights()],
        )
    finally:
        close_store()
