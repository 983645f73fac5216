"""How each iteration gets its batch and its distributed ids: the one place that schedules
input distribution (plain, pipelined, or pipelined with a preparing thread) and applies
skip_splits_a2a.

- plain: batch i's input dist runs, start to finish, at the start of iteration i;
- pipelined (TorchRec's TrainPipelineSparseDist): in iteration i, right after batch i's ids
  are waited for, batch i+1 is bucketized and its splits all-to-all launched (nothing waits);
  after batch i's embedding forward the splits are read (by then they have landed) and batch
  i+1's ids all-to-alls launched, so they run under batch i's dense and backward work;
- threaded: a thread loads batches and prepares their input dist (copy to the device,
  bucketize, permutes, split counts) ahead, handing them over through a bounded queue. How far
  it goes depends on the backend (`thread_launches`):
  - NCCL: the thread issues no collective. The main thread runs the pipelined schedule on the
    prepared batches, launching every collective at that schedule's points.
  - gloo: the thread also launches the batch's splits exchange, reads the splits and launches
    its ids exchange, all on a process group of its own (`ids_pg`); the main thread only waits
    for the ids. Faster on CPU than the NCCL design on gloo, as the second core does that host
    work beside the main thread's (tiny p50 5.06 vs 5.73 ms; docs/input-pipeline-notes.md).

Why the thread issues no collective on NCCL: NCCL needs every rank to submit the operations of
its communicators in one order (NCCL user guide, "Using multiple NCCL communicators
concurrently": "applications should ensure operations are submitted in the same order across
ranks"; torch's `new_group` documentation warns the same of process groups used at once). A
thread issuing the ids exchange while the main thread issues the pooled exchanges and gradient
all-reduces would interleave them in an order set by thread timing, different per rank. So one
thread, the main one, issues all collectives, in an order fixed by the iteration number and the
config: the same on every rank. gloo needs only one order per process group (each group runs its
collectives in issue order on worker threads of its own), which a group only the thread uses has.

Device work of input dist goes to its own stream (harness/run/input_streams.py); batches are
loaded (generated, copied to the device) outside the timed iteration in every mode.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import torch

from harness.data.handoff import put_unless_stopped, stop_and_join
from harness.data.source import BatchSource
from harness.data.synthetic import Batch
from harness.run.input_streams import InputStreams, SameStream
from harness.run.timeline import Timeline
from model.features import SparseFeatures
from model.sharded_embeddings import PendingInputDist, ShardedEmbeddingCollection


def maybe_set_thread_device(device: torch.device) -> None:
    """Make `device` the calling thread's current CUDA device (nothing to do on a CPU)."""
    if device.type != "cuda":
        return
    torch.cuda.set_device(device)


@dataclass
class Loaded:
    """A batch whose copy to the device was issued on the copy stream, and the mark to wait for."""

    batch: Batch
    copied: object


@dataclass
class Prepared:
    """A batch on the device with its input dist prepared: no collective launched yet."""

    batch: Batch
    pending: PendingInputDist


@dataclass
class Started:
    batch: Batch
    pending: PendingInputDist
    span: tuple


class InputFeeder:
    def __init__(
        self, *, embeddings: ShardedEmbeddingCollection, data: BatchSource, rank: int, world_size: int,
        device: torch.device, total: int, pipeline: bool, threaded: bool, skip_splits: bool, timeline: Timeline,
        thread_launches: bool = False, streams: InputStreams | None = None, first: int = 0,
    ) -> None:
        """Feeds iterations first .. total-1 (a segment of the run: evaluations end one, so no input
        dist is in flight while they run). thread_launches: the input thread launches the
        collectives too (gloo only; see the module docstring); streams: where input dist's device
        work goes (harness/run/input_streams.py; None: the current stream)."""
        if threaded and not pipeline:  # the config refuses this; a direct caller gets the same line
            raise ValueError("a threaded input dist runs the pipelined schedule: it needs pipeline=True")
        if thread_launches and device.type == "cuda":
            raise ValueError("an input thread that launches collectives is for gloo: on NCCL the main thread must")
        self.emb, self.data, self.rank, self.world, self.device = embeddings, data, rank, world_size, device
        self.first, self.total, self.pipeline, self.threaded, self.skip = first, total, pipeline, threaded, skip_splits
        self.timeline, self.thread_launches = timeline, threaded and thread_launches
        self.streams = streams or SameStream()
        self._loaded: dict[int, Loaded] = {}
        self._ahead: Started | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- outside the timed region -----------------------------------------------------
    def _load(self, it: int) -> Loaded:
        with self.streams.load():
            batch = self.data.local_batch(it, self.rank, self.world).to(self.device, non_blocking=True)
            return Loaded(batch, self.streams.loaded())

    def prepare(self, it: int) -> None:
        """Before iteration `it` begins: load what this iteration will start."""
        if not self.pipeline:
            self._loaded[it] = self._load(it)
            return
        if self.threaded and self._thread is None:
            self._thread = threading.Thread(target=self._produce, name="input-dist", daemon=True)
            self._thread.start()
        if not self.threaded:
            for ahead in (it, it + 1) if it == self.first else (it + 1,):
                if ahead < self.total:
                    self._loaded[ahead] = self._load(ahead)
        if it == self.first and not self.thread_launches:
            self._ahead = self._start(it, self._take(it))

    # ---- inside the timed region ------------------------------------------------------
    def _prepare(self, it: int, loaded: Loaded) -> Prepared:
        """Bucketize and count: device work only (the input thread may run it)."""
        # Every rank knows which global batches have the fixed hotness: no collective needed to agree.
        known = self.skip and self.data.is_regular(it)
        b = loaded.batch
        with self.streams.input():
            self.streams.wait_loaded(loaded.copied, [b.dense, b.labels, b.sparse.lengths, b.sparse.values])
            return Prepared(b, self.emb.prepare_input_dist(b.sparse, splits_known=known))

    def _take(self, it: int) -> Loaded | Prepared | Started:
        """Batch `it`, loaded (by this thread, earlier), or prepared (or started, with its ids
        exchange launched: `thread_launches`) by the input thread."""
        if not self.threaded:
            return self._loaded.pop(it)
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise RuntimeError(f"input-dist thread failed at iteration {it}: {item!r}") from item
        return item

    def _start(self, it: int, item: Loaded | Prepared) -> Started:
        """Open the input_dist span, prepare unless the thread did, launch the splits exchanges."""
        span = self.timeline.open_span("input_dist", it)
        with self.timeline.part("input_dist", "start"):
            prepared = item if isinstance(item, Prepared) else self._prepare(it, item)
            with self.streams.input():
                prepared.pending.start_splits()
        return Started(prepared.batch, prepared.pending, span)

    def _finish(self, started: Started) -> tuple[Batch, list[SparseFeatures], int]:
        with self.timeline.part("input_dist", "wait"):
            with self.streams.input():
                ids = started.pending.wait()
            b = started.batch
            self.streams.hand_over([b.dense, b.labels, *(t for f in ids for t in (f.lengths, f.values))])
        self.timeline.close_span(started.span)
        return b, ids, started.pending.splits_exchanged

    def next(self, it: int) -> tuple[Batch, list[SparseFeatures], int]:
        """Iteration `it`'s batch, its ids ready for lookup, and how many splits exchanges it took."""
        if not self.pipeline:
            return self._finish(self._start(it, self._take(it)))
        if self.thread_launches:
            return self._finish(self._take(it))
        out = self._finish(self._ahead)
        self._ahead = self._start(it + 1, self._take(it + 1)) if it + 1 < self.total else None
        return out

    def after_forward(self) -> None:
        """Called after this iteration's embedding forward: the next batch's splits have had the
        forward to land, so reading them now costs little, and its ids exchange launched now
        overlaps the dense step and the backward (the pipelined loop only)."""
        if self._ahead is not None:
            with self.timeline.part("input_dist", "launch"), self.streams.input():
                self._ahead.pending.launch()

    # ---- the thread ---------------------------------------------------------------------
    def _put(self, item: object) -> bool:
        """Hand over, unless the main thread has stopped taking (it failed or finished)."""
        return put_unless_stopped(self._queue, item, self._stop)

    def _produce(self) -> None:
        try:
            # The current CUDA device is per thread and starts at cuda:0: without this, a rank
            # with LOCAL_RANK > 0 would make its batches and a stray context on GPU 0.
            maybe_set_thread_device(self.device)
            for it in range(self.first, self.total):
                loaded = self._load(it)
                with self.timeline.part("input_dist", "prepare"):
                    item = self._prepare(it, loaded)
                if self.thread_launches:
                    item = self._start(it, item)
                    with self.timeline.part("input_dist", "launch"):
                        item.pending.launch()
                if not self._put(item):
                    return
        except BaseException as exc:  # handed to the main thread, which fails the run with it
            self._put(exc)

    def close(self) -> None:
        """Stop and join the thread, so a run never leaves one behind."""
        stop_and_join(self._thread, self._stop, "input-dist thread")
