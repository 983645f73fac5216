"""Batches drawn ahead: a thread of its own makes the next batches while the iterations run.

A synthetic batch is drawn on the host (numpy: Philox, logs and powers), a file batch read from
memory-mapped arrays; in the loop, that happened between iterations while the GPU waited (27 of
51 ms an iteration on the first H100, small at 8192 samples). `Ahead` wraps a batch source and
hands out the very batches the source makes (the same function of the iteration, only earlier):
`local_batch(it)` returns the one the thread made, in pinned host memory on CUDA so that its copy
to the device is asynchronous on the input stream.

Iterations are asked for in order (each engine's loop does); a request off that order is made in
place, and the thread starts again after it.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import torch

from harness.data.handoff import put_unless_stopped, stop_and_join
from harness.data.source import BatchSource
from harness.data.synthetic import Batch


class Ahead:
    """`data` with its next `depth` local batches made on a thread (rank `rank` of `world`,
    iterations up to `total`, the run's); on a CUDA `device` each batch goes to page-locked memory."""

    def __init__(self, data: BatchSource, *, rank: int, world: int, total: int, depth: int,
                 device: torch.device) -> None:
        if depth < 1:
            raise ValueError(f"batches ahead: depth must be at least 1, got {depth}")
        self.data, self.rank, self.world, self.total, self.depth = data, rank, world, total, depth
        self.device, self.pin = device, device.type == "cuda"
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next = 0
        """The iteration the thread's queue starts at."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.data, name)  # everything but local_batch is the source's own

    def local_batch(self, iteration: int, rank: int, world_size: int) -> Batch:
        if (rank, world_size) != (self.rank, self.world) or not 0 <= iteration < self.total:
            return self.data.local_batch(iteration, rank, world_size)
        if self._thread is None or iteration != self._next:
            self._restart(iteration)
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise RuntimeError(f"the batch thread failed at iteration {iteration}: {item!r}") from item
        self._next = iteration + 1
        return item

    def _restart(self, first: int) -> None:
        self.close()
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.depth)
        self._next = first
        self._thread = threading.Thread(target=self._make, args=(first, self._queue, self._stop), name="batches-ahead",
                                        daemon=True)
        self._thread.start()

    def _make(self, first: int, out: queue.Queue, stop: threading.Event) -> None:
        try:
            if self.pin:
                # Pinned memory belongs to the thread's current CUDA device, cuda:0 unless set: a
                # rank on another GPU would make a stray context there.
                torch.cuda.set_device(self.device)
            for it in range(first, self.total):
                batch = self.data.local_batch(it, self.rank, self.world)
                if not put_unless_stopped(out, batch.pin() if self.pin else batch, stop):
                    return
        except BaseException as exc:  # handed to the loop, which fails the run with it
            put_unless_stopped(out, exc, stop)

    def close(self) -> None:
        """Stop and join the thread (a run never leaves one behind)."""
        stop_and_join(self._thread, self._stop, "the batch thread")
        self._thread = None


def maybe_ahead(data: BatchSource, depth: int, *, rank: int, world: int, total: int,
                device: torch.device) -> BatchSource | Ahead:
    """`data` with `depth` batches drawn ahead (data itself when depth is 0)."""
    if depth == 0:
        return data
    return Ahead(data, rank=rank, world=world, total=total, depth=depth, device=device)
