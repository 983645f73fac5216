"""The one train loop, for every engine: iteration boundaries, records, segments ended by
evaluations, faults, the MLPerf result log and clean-up. What an iteration does is the engine's
`Step` (harness/run/step.py); how a rank is built is harness/run/rank.py.

The run goes in segments that each end with an evaluation (one segment without any): no input
dist is in flight while one runs, and its time stays out of every iteration's.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

from harness.config import BenchConfig
from harness.records.writer import RankRecorder
from harness.run.dynamic_setup import write_counts
from harness.run.evaluate import EvalRecord, eval_iterations
from harness.run.faults import maybe_inject_fault
from harness.run.mlperf_log import ResultLog
from harness.run.profile_window import ProfileWindow
from harness.run.progress import Progress
from harness.run.rank import RankParts
from model.dynamic_table import DynamicCounts
from model.sharding import Shard


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


def open_result_log(cfg: BenchConfig, *, rank: int, device: torch.device, recorder: RankRecorder | None,
                    data) -> ResultLog:
    """The MLPerf result log (rank 0 of an evaluating run), its init started before the rank is built."""
    evaluating = bool(eval_iterations(cfg))
    log = ResultLog(recorder.dir.parent if recorder is not None else None, enabled=rank == 0 and evaluating)
    if evaluating:
        log.init_start(cfg, platform=f"{cfg.run.nodes}x{cfg.run.gpus_per_node} {device.type}",
                       train_samples=data.train_rows, eval_samples=data.held_out_scored(cfg.evaluation.stage))
    return log


class Loop:
    def __init__(self, cfg: BenchConfig, parts: RankParts, *, rank: int, recorder: RankRecorder | None,
                 result_log: ResultLog) -> None:
        self.cfg, self.parts, self.rank, self.recorder, self.log = cfg, parts, rank, recorder, result_log
        self.total = cfg.run.warmup_iters + cfg.run.iters
        self.global_batch = cfg.data.global_batch_size
        self.evals_after = eval_iterations(cfg)
        """The iterations an evaluation follows (none without --eval-every)."""
        self.evals: list[EvalRecord] = []
        self.trained = 0
        """Iterations of the segments finished so far."""
        self.profile = ProfileWindow(cfg.run.profile, out=recorder.dir / "trace.json" if recorder is not None else None,
                                     cuda=parts.timeline.cuda)

    def run(self, *, keep_weights: bool) -> TrainResult:
        parts = self.parts
        try:
            self._segments()
            parts.records.flush()  # inside: a non-finite loss found only by the last flush fails the run too
        except BaseException:
            self._clean_up_after_failure()
            raise
        counts = parts.step.dynamic_counts()
        write_counts(self.recorder, counts)
        self.log.run_stop(success=bool(self.evals) and self.evals[-1].reached_target,
                          samples=self.trained * self.global_batch)
        try:
            losses = parts.records.losses
            if not keep_weights:
                return TrainResult(losses=losses, dense_state={}, shards=[], evals=self.evals, dynamic=counts)
            dense_state, shards = parts.step.final_weights()
            return TrainResult(losses=losses, dense_state=dense_state, shards=shards, evals=self.evals, dynamic=counts)
        finally:
            parts.close(True)

    def _segments(self) -> None:
        self.log.run_start()
        for last in self.evals_after or [self.total - 1]:
            self._segment(self.trained, last)
            self.trained = last + 1
            if self.evals_after and self._evaluate(last).reached_target:
                break

    def _segment(self, first: int, last: int) -> None:
        parts, records, step = self.parts, self.parts.records, self.parts.step
        step.begin_segment(first, last + 1)
        progress = Progress(total=self.total, first=first) if self.rank == 0 else None
        epoch = first * self.global_batch / self.parts.data.train_rows if self.evals_after else 0.0
        self.log.block_start(samples=first * self.global_batch, epoch=epoch)
        tl = parts.timeline
        for it in range(first, last + 1):
            with tl.between(it - 1 if it > first else None, "next_batch"):
                step.prepare(it)
            maybe_inject_fault(self.cfg, self.rank, it, self.recorder)
            self.profile.maybe_start(it)
            tl.annotate = self.profile.active
            tl.begin_iteration(it)
            out = step.run(it)
            tl.end_iteration()
            self.profile.maybe_stop(it)
            records.pending[it] = out.loss.clone() if out.loss_reused else out.loss
            if out.splits_exchanged is not None:
                records.exchanged[it] = out.splits_exchanged
            moved = step.bytes_moved()
            if moved is not None:
                records.moved[it] = moved
            if progress is not None:
                progress.done(it)
            if (it + 1) % self.cfg.run.flush_every == 0:
                with tl.between(it if it < last else None, "flush_records"):
                    records.flush(lag=True)
        step.end_segment()

    def _evaluate(self, last: int) -> EvalRecord:
        self.parts.records.flush()
        result = self.parts.evaluate()
        self.parts.step.bytes_moved()  # an evaluation's exchanges are no iteration's bytes
        trained = (last + 1) * self.global_batch
        record = EvalRecord.of(result, index=len(self.evals), after_iteration=last, trained_samples=trained,
                               target=self.cfg.evaluation.target_auc)
        self.evals.append(record)
        self.log.evaluation(auc=result.auc, samples=trained, epoch=trained / self.parts.data.train_rows)
        if self.recorder is not None:
            self.recorder.write_evals([record])
        if self.rank == 0:
            print(record.line(), flush=True)
        return record

    def _clean_up_after_failure(self) -> None:
        """What finished before the failure goes to disk first; the original error is the one to
        report, so errors while cleaning up are only printed."""
        parts = self.parts

        def log_aborted() -> None:
            self.log.run_stop(success=False, samples=len(parts.records.losses) * self.global_batch)

        def keep_counts() -> None:
            write_counts(self.recorder, parts.step.dynamic_counts())

        def close_after_failure() -> None:
            parts.close(False)

        for cleanup in (parts.records.flush, log_aborted, keep_counts, self.profile.close, close_after_failure,
                        parts.step.end_segment):
            try:
                cleanup()
            except Exception as cleanup_exc:
                print(f"rank {self.rank}: {cleanup.__name__} after the failure failed: {cleanup_exc!r}", file=sys.stderr)
