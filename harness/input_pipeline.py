"""How each iteration gets its batch and its distributed ids: the one place that schedules
input distribution (plain, pipelined, or pipelined from a thread) and applies skip_splits_a2a.

- plain: batch i's input dist runs, start to finish, at the start of iteration i;
- pipelined (TorchRec's TrainPipelineSparseDist): in iteration i, right after batch i's ids
  are waited for, batch i+1 is bucketized and its splits all-to-all launched (nothing waits);
  after batch i's embedding forward the splits are read (by then they have landed) and batch
  i+1's ids all-to-alls launched, so they run under batch i's dense and backward work;
- threaded: a thread loads batches and runs their input dist up to the launched ids exchange,
  ahead, handing them over through a bounded queue; the main thread only waits for the ids.
  Its collectives use a process group of their own (`ids_pg`), which on gloo keeps each group's
  order on every rank; NCCL needs more (see harness/optimizations.py).

Batches are loaded (generated, copied to the device) outside the timed iteration, in every mode.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import torch

from harness.data import Batch, SyntheticCriteo
from harness.timeline import Timeline
from model.features import SparseFeatures
from model.sharded_embeddings import PendingInputDist, ShardedEmbeddingCollection


def maybe_set_thread_device(device: torch.device) -> None:
    """Make `device` the calling thread's current CUDA device (nothing to do on a CPU)."""
    if device.type != "cuda":
        return
    torch.cuda.set_device(device)


@dataclass
class Started:
    batch: Batch
    pending: PendingInputDist
    span: tuple


class InputFeeder:
    def __init__(
        self, *, embeddings: ShardedEmbeddingCollection, data: SyntheticCriteo, rank: int, world_size: int,
        device: torch.device, total: int, pipeline: bool, threaded: bool, skip_splits: bool, timeline: Timeline,
    ) -> None:
        self.emb, self.data, self.rank, self.world, self.device = embeddings, data, rank, world_size, device
        self.total, self.pipeline, self.threaded, self.skip = total, pipeline, threaded, skip_splits
        self.timeline = timeline
        self._loaded: dict[int, Batch] = {}
        self._ahead: Started | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- outside the timed region -----------------------------------------------------
    def _load(self, it: int) -> Batch:
        return self.data.local_batch(it, self.rank, self.world).to(self.device, non_blocking=True)

    def prepare(self, it: int) -> None:
        """Before iteration `it` begins: load what this iteration will start."""
        if self.threaded:
            if self._thread is None:
                self._thread = threading.Thread(target=self._produce, name="input-dist", daemon=True)
                self._thread.start()
            return
        if not self.pipeline:
            self._loaded[it] = self._load(it)
            return
        if it == 0:
            self._ahead = self._start(0, self._load(0))
        if it + 1 < self.total:
            self._loaded[it + 1] = self._load(it + 1)

    # ---- inside the timed region ------------------------------------------------------
    def _start(self, it: int, batch: Batch) -> Started:
        span = self.timeline.open_span("input_dist", it)
        # Every rank knows which global batches have the fixed hotness: no collective needed to agree.
        known = self.skip and self.data.is_regular(it)
        return Started(batch, self.emb.start_input_dist(batch.sparse, splits_known=known), span)

    def _finish(self, started: Started) -> tuple[Batch, list[SparseFeatures], int]:
        ids = started.pending.wait()
        self.timeline.close_span(started.span)
        return started.batch, ids, started.pending.splits_exchanged

    def next(self, it: int) -> tuple[Batch, list[SparseFeatures], int]:
        """Iteration `it`'s batch, its ids ready for lookup, and how many splits exchanges it took."""
        if self.threaded:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise RuntimeError(f"input-dist thread failed at iteration {it}: {item!r}") from item
            return self._finish(item)
        if not self.pipeline:
            return self._finish(self._start(it, self._loaded.pop(it)))
        out = self._finish(self._ahead)
        self._ahead = self._start(it + 1, self._loaded.pop(it + 1)) if it + 1 < self.total else None
        return out

    def after_forward(self) -> None:
        """Called after this iteration's embedding forward: the next batch's splits have had the
        forward to land, so reading them now costs little, and its ids exchange launched now
        overlaps the dense step and the backward (the pipelined loop only)."""
        if self._ahead is not None:
            self._ahead.pending.launch()

    # ---- the thread ---------------------------------------------------------------------
    def _put(self, item: object) -> bool:
        """Hand over, unless the main thread has stopped taking (it failed or finished)."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            # The current CUDA device is per thread and starts at cuda:0: without this, a rank
            # with LOCAL_RANK > 0 would make its batches, events and a stray context on GPU 0.
            maybe_set_thread_device(self.device)
            for it in range(self.total):
                started = self._start(it, self._load(it))
                started.pending.launch()
                if not self._put(started):
                    return
        except BaseException as exc:  # handed to the main thread, which fails the run with it
            self._put(exc)

    def close(self) -> None:
        """Stop and join the thread, so a run never leaves one behind."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            if self._thread.is_alive():
                raise RuntimeError("input-dist thread did not stop within 30 s (stuck in a collective?)")
