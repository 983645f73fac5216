"""Evaluation on the held-out day: every rank scores its slice, AUROC over all ranks' scores.

The held-out half (harness/data/criteo_files.py: the last day's first half validates, the second
tests) is cut into whole global batches of the training size; rank r scores rows
[jG + rB, jG + (r+1)B) of batch j, through the same sharded lookup as training (no backward)
and the dense arch in float32. The AUROC is torchmetrics' exact binary AUROC (thresholds=None,
as the MLPerf reference computes it) over the scores of every rank, gathered. Rows past the last
whole global batch (fewer than G) are not scored, so every rank's exchanges keep one size.

Evaluation runs between iterations, with no input dist in flight (train.py ends the input
pipeline's segment first); its time goes to its own records, never into an iteration's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from harness.data.criteo_files import CriteoFiles
from model.dense import DenseArch
from model.sharded_embeddings import ShardedEmbeddingCollection

if TYPE_CHECKING:
    from harness.config import BenchConfig


@dataclass(frozen=True)
class EvalResult:
    auc: float
    samples: int
    """Held-out samples scored, all ranks."""
    start_ns: int
    end_ns: int
    """perf_counter_ns at its start and end (device synchronised at both), the iteration records' clock."""

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass(frozen=True)
class EvalRecord:
    """One evaluation as the run records it (rankNNNNN/evals-*.parquet, one row each)."""

    index: int
    after_iteration: int
    trained_samples: int
    """Training samples seen when it ran, all ranks (warm-up iterations train too)."""
    auc: float
    eval_samples: int
    eval_ms: float
    start_ns: int
    end_ns: int
    """On the clock of the rank's iteration records (perf_counter_ns)."""
    reached_target: bool
    """Its AUROC reached --target-auc (the run stopped there); False without a target."""

    @classmethod
    def of(cls, result: EvalResult, *, index: int, after_iteration: int, trained_samples: int,
           target: float | None) -> EvalRecord:
        return cls(index=index, after_iteration=after_iteration, trained_samples=trained_samples, auc=result.auc,
                   eval_samples=result.samples, eval_ms=result.seconds * 1e3, start_ns=result.start_ns,
                   end_ns=result.end_ns, reached_target=target is not None and result.auc >= target)

    def line(self) -> str:
        reached = ", target reached: training stops" if self.reached_target else ""
        return (f"eval {self.index} after iteration {self.after_iteration} ({self.trained_samples:,} samples trained): "
                f"AUROC {self.auc:.4f} over {self.eval_samples:,} held-out samples in {self.eval_ms / 1e3:.2f} s{reached}")


def eval_iterations(cfg: BenchConfig) -> list[int]:
    """The iterations an evaluation follows: the first to reach each multiple of --eval-every
    training samples, and the last; none without --eval-every."""
    every, g = cfg.evaluation.every_samples, cfg.data.global_batch_size
    total = cfg.run.warmup_iters + cfg.run.iters
    if not every:
        return []
    reach = {-(-k * every // g) - 1 for k in range(1, total * g // every + 1)}  # (i + 1) g >= k every
    return sorted(i for i in reach | {total - 1} if i < total)


def gathered_auroc(scores: torch.Tensor, labels: torch.Tensor, group: dist.ProcessGroup | None = None) -> float:
    """The exact binary AUROC of every rank's (scores, labels) together: torchmetrics gathers the
    states of all ranks in `group` (the default group when distributed is initialised) before
    computing, so each rank gets the same value."""
    from torchmetrics.classification import BinaryAUROC

    metric = BinaryAUROC(thresholds=None, process_group=group).to(scores.device)
    metric.update(scores, labels.to(torch.int64))
    return float(metric.compute())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def evaluate(*, files: CriteoFiles, stage: str, embeddings: ShardedEmbeddingCollection, dense: DenseArch,
             rank: int, world_size: int, device: torch.device, group: dist.ProcessGroup | None = None,
             fp32_weights: Callable[[], AbstractContextManager] = nullcontext) -> EvalResult:
    """AUROC of the model as it stands over `stage`'s half of the held-out day (val or test).
    fp32_weights: makes the dense arch's parameters its fp32 weights for the block (a bf16 run
    trains on a copy of them, FlatGradients.master_weights)."""
    _sync(device)
    start = time.perf_counter_ns()
    g = files.global_batch_size
    local = g // world_size
    scored = files.held_out_scored(stage)
    scores, labels = [], []
    with torch.no_grad(), fp32_weights():
        for j in range(scored // g):
            batch = files.held_out_batch(stage, j * g + rank * local, local).to(device)
            pending = embeddings.prepare_input_dist(batch.sparse, splits_known=False)
            pending.start_splits()
            pending.launch()
            pooled, _ = embeddings.forward(pending.wait(), local)
            scores.append(torch.sigmoid(dense(batch.dense, pooled.detach()).float()))
            labels.append(batch.labels)
    auc = gathered_auroc(torch.cat(scores), torch.cat(labels), group)
    _sync(device)
    return EvalResult(auc=auc, samples=scored, start_ns=start, end_ns=time.perf_counter_ns())
