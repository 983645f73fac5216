"""The train loop of one rank: five timed stages an iteration, records flushed between iterations."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness.config import BenchConfig
from harness.data import SyntheticCriteo
from harness.data_parallel import FlatGradients
from harness.records import RankRecorder
from harness.timeline import Timeline
from model.dense import DenseArch
from model.sharded_embeddings import ShardedEmbeddingCollection
from model.sharding import Shard, TablePlan


class InjectedFault(RuntimeError):
    """Raised on purpose by --fail-at, to test how the harness handles a rank dying."""


@dataclass
class TrainResult:
    losses: list[float]
    """This rank's loss (mean over its local batch) at every iteration, warm-up included."""
    dense_state: dict[str, torch.Tensor]
    """Final dense parameters (identical on every rank)."""
    shards: list[tuple[int, Shard, torch.Tensor]]
    """(table, shard, final weights) of every shard this rank holds."""


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
    group: dist.ProcessGroup | None = None,
) -> TrainResult:
    world = cfg.run.world_size
    local_batch = cfg.local_batch_size
    data = SyntheticCriteo(cfg.model, cfg.data)
    dense = build_dense(cfg, device)
    grads = FlatGradients(dense, world_size=world, group=group)
    dense_opt = torch.optim.Adagrad(dense.parameters(), lr=cfg.optimizer.learning_rate, eps=cfg.optimizer.eps)
    embeddings = ShardedEmbeddingCollection(
        table_rows=cfg.model.table_rows,
        embedding_dim=cfg.model.embedding_dim,
        plan=plan,
        rank=rank,
        world_size=world,
        group=group,
        device=device,
        optimizer=cfg.optimizer.embedding_optimizer,
        learning_rate=cfg.optimizer.learning_rate,
        eps=cfg.optimizer.eps,
        init_seed=cfg.data.seed,
    )
    timeline = Timeline(cuda=device.type == "cuda", stages=cfg.run.timeline)
    total = cfg.run.warmup_iters + cfg.run.iters
    pending: dict[int, torch.Tensor] = {}  # losses stay on the device until a flush, outside the timed region
    losses: list[float] = []

    def flush() -> None:
        stage_spans, iter_spans = timeline.drain()
        values = {i: float(v) for i, v in pending.items()}
        losses.extend(values[i] for i in sorted(values))
        pending.clear()
        if recorder is not None:
            recorder.write(stage_spans, iter_spans, values)

    try:
        for it in range(total):
            batch = data.local_batch(it, rank, world).to(device)
            maybe_inject_fault(cfg, rank, it, recorder)
            timeline.begin_iteration(it)
            with timeline.stage("input_dist"):
                ids = embeddings.input_dist(batch.sparse)
            with timeline.stage("emb_fwd"):
                pooled, emb_fwd = embeddings.forward(ids, local_batch)
            with timeline.stage("dense_fwd_bwd"):
                loss = F.binary_cross_entropy_with_logits(dense(batch.dense, pooled), batch.labels)
                # Each rank's mean over its share, divided by the world size and summed by the
                # all-reduce, is the gradient of the mean over the global batch.
                (loss / world).backward()
                grads.all_reduce()
            with timeline.stage("emb_bwd"):
                embeddings.backward(emb_fwd, pooled.grad)
            with timeline.stage("dense_update"):
                dense_opt.step()
                grads.zero()
            timeline.end_iteration()
            pending[it] = loss.detach()
            if (it + 1) % cfg.run.flush_every == 0:
                flush()
    except BaseException:
        try:
            flush()  # what finished before the failure stays on disk
        except Exception as flush_exc:  # the original error is the one to report
            print(f"rank {rank}: could not write the last records: {flush_exc!r}", file=sys.stderr)
        raise
    flush()
    return TrainResult(
        losses=losses,
        dense_state={k: v.detach().cpu().clone() for k, v in dense.state_dict().items()},
        shards=[(t, s, w.detach().cpu().clone()) for t, s, w in embeddings.shard_weights()],
    )
