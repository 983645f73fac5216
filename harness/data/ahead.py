"""Batches drawn ahead: a thread of its own makes the next batches while the iterations run.

A synthetic batch is drawn on the host (numpy: Philox, logs and powers), a file batch read from
memory-mapped arrays; in the loop, that happened between iterations while the GPU waited (27 of
51 ms an iteration on the first H100, small at 8192 samples). `Ahead` wraps a batch source and
hands out the very batches the source makes (the same function of the iteration, only earlier):
`local_batch(it)` returns the one a thread made, in pinned host memory on CUDA so that its copy
to the device is asynchronous on the copy stream (harness/run/input_streams.py). One thread made
small's 8192-sample batch in about 40 ms on the H100 host, slower than the GPU's iteration, hence
several.

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
    """`data` with its next local batches made on `workers` threads (rank `rank` of `world`,
    iterations up to `total`, the run's), each thread a whole batch in turn (thread k makes
    iterations first+k, first+k+workers, ...), each keeping up to ceil(depth / workers) ready; on a
    CUDA `device` each batch is made in page-locked memory."""

    def __init__(self, data: BatchSource, *, rank: int, world: int, total: int, depth: int,
                 device: torch.device, workers: int = 1) -> None:
        if depth < 1 or workers < 1:
            raise ValueError(f"batches ahead: depth and workers must be at least 1, got {depth} and {workers}")
        self.data, self.rank, self.world, self.total, self.depth = data, rank, world, total, depth
        self.workers = workers
        self.device, self.pin = device, device.type == "cuda"
        self._queues: list[queue.Queue] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._first = 0
        """The iteration the threads started at."""
        self._next = 0
        """The iteration the loop takes next."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.data, name)  # everything but local_batch is the source's own

    def local_batch(self, iteration: int, rank: int, world_size: int) -> Batch:
        if (rank, world_size) != (self.rank, self.world) or not 0 <= iteration < self.total:
            return self.data.local_batch(iteration, rank, world_size)
        if not self._threads or iteration != self._next:
            self._restart(iteration)
        item = self._queues[(iteration - self._first) % self.workers].get()
        if isinstance(item, BaseException):
            raise RuntimeError(f"the batch thread failed at iteration {iteration}: {item!r}") from item
        self._next = iteration + 1
        return item

    def _restart(self, first: int) -> None:
        self.close()
        self._stop = threading.Event()
        self._first = self._next = first
        per_thread = -(-self.depth // self.workers)
        self._queues = [queue.Queue(maxsize=per_thread) for _ in range(self.workers)]
        self._threads = [threading.Thread(target=self._make, args=(first + k, self._queues[k], self._stop),
                                          name=f"batches-ahead-{k}", daemon=True) for k in range(self.workers)]
        for t in self._threads:
            t.start()

    def _make(self, first: int, out: queue.Queue, stop: threading.Event) -> None:
        try:
            if self.pin:
                # Pinned memory belongs to the thread's current CUDA device, cuda:0 unless set: a
                # rank on another GPU would make a stray context there.
                torch.cuda.set_device(self.device)
            for it in range(first, self.total, self.workers):
                batch = self.data.local_batch(it, self.rank, self.world, pin=self.pin)
                if not put_unless_stopped(out, batch, stop):
                    return
        except BaseException as exc:  # handed to the loop, which fails the run with it
            put_unless_stopped(out, exc, stop)

    def close(self) -> None:
        """Stop and join the threads (a run never leaves one behind)."""
        for t in self._threads:
            stop_and_join(t, self._stop, "a batch thread")
        self._threads = []


def maybe_ahead(data: BatchSource, depth: int, *, rank: int, world: int, total: int,
                device: torch.device, workers: int = 1) -> BatchSource | Ahead:
    """`data` with `depth` batches drawn ahead on `workers` threads (data itself when depth is 0)."""
    if depth == 0:
        return data
    return Ahead(data, rank=rank, world=world, total=total, depth=depth, device=device, workers=workers)
