"""One iteration's work, as the loop (harness/run/loop.py) drives it for either engine.

An engine supplies a `Step`; the loop owns everything around it (iteration boundaries, records,
segments, evaluation, faults, clean-up). `HarnessStep` is this project's engine: the five stages
of design.md, each under its timeline stage; harness/run/engine_torchrec.py supplies stock
TorchRec's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from harness.run.dense_gradients import FlatGradients
from harness.run.dense_step import DenseStep
from harness.run.input_pipeline import InputFeeder
from harness.run.timeline import Timeline
from model.adagrad import Adagrad
from model.collective_bytes import CollectiveBytes
from model.dense import DenseArch
from model.dynamic_table import DynamicCounts
from model.sharded_embeddings import PendingBackward, ShardedEmbeddingCollection
from model.sharding import Shard


@dataclass
class StepOutput:
    loss: torch.Tensor
    """This rank's mean loss over its local batch, still on the device; the loop keeps it until a
    flush (copied first where `loss_reused`)."""
    loss_reused: bool = False
    """The loss is a buffer the next step overwrites (a CUDA graph's static output): the loop copies
    it, after the iteration's timed window. An eager step's loss is a new tensor each step, kept
    without a copy kernel."""
    splits_exchanged: int | None = None
    """Splits all-to-alls the iteration's input dist ran; None: the engine does not count them."""


class Step(Protocol):
    """What an engine gives the loop. Iterations run in segments (an evaluation ends one), each
    opened by `begin_segment` and closed by `end_segment`."""

    def begin_segment(self, first: int, end: int) -> None:
        """Iterations first .. end-1 follow."""

    def prepare(self, it: int) -> None:
        """Before iteration `it` begins: what it needs loaded (outside its timed window)."""

    def run(self, it: int) -> StepOutput:
        """Iteration `it`, inside its timed window."""

    def bytes_moved(self) -> dict[str, tuple[int, int]] | None:
        """Bytes the last iteration's collectives moved, by exchange phase; None: not counted."""

    def end_segment(self) -> None:
        """Stop what the segment started (a thread); safe to call twice, and after a failure."""

    def dynamic_counts(self) -> dict[int, DynamicCounts]:
        """What this rank's dynamic tables moved between their slots and the parameter store."""

    def final_weights(self) -> tuple[dict[str, torch.Tensor], list[tuple[int, Shard, torch.Tensor]]]:
        """(dense parameters by the harness's names, (table, shard, weights) of this rank's shards), on the host."""


class HarnessStep:
    """The harness engine's iteration: input dist (its span may start an iteration earlier),
    emb_fwd, dense_fwd_bwd (the pooled gradient's exchange launched from inside backward),
    emb_bwd, dense_update."""

    def __init__(self, *, embeddings: ShardedEmbeddingCollection, dense: DenseArch, dense_step: DenseStep,
                 grads: FlatGradients, dense_opt: Adagrad, timeline: Timeline, moved: CollectiveBytes,
                 local_batch: int, feeder_for: Callable[[int, int], InputFeeder]) -> None:
        """feeder_for(first, end): the input feeder of a segment (harness/run/input_pipeline.py)."""
        self.embeddings, self.dense, self.dense_step = embeddings, dense, dense_step
        self.grads, self.dense_opt, self.timeline, self.moved = grads, dense_opt, timeline, moved
        self.local_batch, self.feeder_for = local_batch, feeder_for
        self.feeder: InputFeeder | None = None

    def begin_segment(self, first: int, end: int) -> None:
        self.feeder = self.feeder_for(first, end)

    def prepare(self, it: int) -> None:
        self.feeder.prepare(it)

    def run(self, it: int) -> StepOutput:
        tl, emb = self.timeline, self.embeddings
        batch, ids, exchanged = self.feeder.next(it)  # times itself: its input_dist span may start earlier
        with tl.stage("emb_fwd"):
            pooled, emb_fwd = emb.forward(ids, self.local_batch, out=self.dense_step.pooled_input())
        self.feeder.after_forward()  # the next batch's ids exchange, launched to overlap what follows
        emb_bwd: list[PendingBackward] = []
        with tl.stage("dense_fwd_bwd"):
            # The pooled gradient's exchange is launched the moment backward produces it, so it
            # runs under the rest of the dense backward (its launch is timed in this stage).
            loss, _ = self.dense_step.run(batch.dense, pooled, batch.labels,
                                          on_pooled_grad=lambda g: emb_bwd.append(emb.start_backward(emb_fwd, g)))
        with tl.stage("emb_bwd"):
            emb_bwd.pop().wait()
        with tl.stage("dense_update"):
            self.dense_step.finish_gradients()
            self.dense_opt.step()
            self.grads.updated()
        return StepOutput(loss=loss, loss_reused=self.dense_step.graphed, splits_exchanged=exchanged)

    def bytes_moved(self) -> dict[str, tuple[int, int]]:
        return self.moved.take()

    def end_segment(self) -> None:
        if self.feeder is not None:
            feeder, self.feeder = self.feeder, None
            feeder.close()

    def dynamic_counts(self) -> dict[int, DynamicCounts]:
        return self.embeddings.dynamic_counts()

    def final_weights(self) -> tuple[dict[str, torch.Tensor], list[tuple[int, Shard, torch.Tensor]]]:
        with self.grads.master_weights():  # the fp32 weights, not a bf16 copy of them
            dense = {k: v.detach().cpu().clone() for k, v in self.dense.state_dict().items()}
        return dense, [(t, s, w.detach().cpu().clone()) for t, s, w in self.embeddings.shard_weights()]
