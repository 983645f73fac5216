"""Where input distribution's device work is issued: its own CUDA stream on a GPU, as TorchRec's
TrainPipelineSparseDist does with its data-dist stream; nothing on a CPU.

On one stream, the splits' device-to-host copy (pinned or not) would queue behind all the
compute issued before it, and the async all-to-alls, which start when the issuing stream reaches
them, would wait for that compute too: neither pinned copies nor a pipelined schedule could
overlap much. On a stream of its own, a batch's bucketize and permutes, its collectives and the
splits' copy to the host run beside the compute, and the compute stream waits for that batch's
input dist only where it needs the ids: `hand_over`, before the lookup.

A batch's copy to the device goes to a third stream (TorchRec's memcpy stream), which input
dist's stream waits for before it reads the batch (`wait_loaded`). On input dist's stream, the
next batch's copy, queued before this iteration's hand-over, would hold the compute stream's
lookup until it landed (about 16 MB on small at 8192 a GPU; found by reading, 2026-11-27).

A tensor made on the input stream and then used on the compute stream needs `record_stream`:
the caching allocator otherwise hands its block back to the input stream when Python drops it,
and the input stream could overwrite it while the compute stream still reads it (the
torch.cuda "CUDA semantics" notes on streams and the caching allocator). Tensors the
collectives use are kept alive by ProcessGroupNCCL until the issuing stream waited for them
(the default since torch 2.8; see harness/run/optimizations.py), and every wait here is issued on
the input stream, so those need nothing more.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Protocol

import torch


class InputStreams(Protocol):
    """The seam the input feeder issues its work through (a fake records it in tests)."""

    def input(self) -> contextlib.AbstractContextManager:
        """Inside: device work and collectives go to input dist's stream (per thread: the input
        thread enters it too)."""
        ...

    def hand_over(self, tensors: Iterable[torch.Tensor]) -> None:
        """The calling thread's current (compute) stream waits for what input dist issued so far,
        and `tensors`, made on the input stream, are marked as used by the compute stream."""
        ...

    def wait_for_compute(self) -> None:
        """Input dist's stream waits for what the compute stream issued so far (before it reads or
        writes what the compute stream updates: a dynamic table's slots)."""
        ...

    def load(self) -> contextlib.AbstractContextManager:
        """Inside: a batch's copy to the device goes to the copy stream (per thread)."""
        ...

    def loaded(self) -> object:
        """A mark of what was issued inside `load` so far, for `wait_loaded` (call it inside)."""
        ...

    def wait_loaded(self, mark: object, tensors: Iterable[torch.Tensor]) -> None:
        """Input dist's stream waits for `mark`, and `tensors`, made on the copy stream, are marked
        as used by input dist's stream."""
        ...


class SameStream:
    """No stream of its own (CPU: ops run when called): each call costs a Python call, no more."""

    _NOTHING = contextlib.nullcontext()  # reusable: entering it does nothing

    def input(self) -> contextlib.AbstractContextManager:
        return self._NOTHING

    def hand_over(self, tensors: Iterable[torch.Tensor]) -> None:
        pass

    def wait_for_compute(self) -> None:
        pass

    def load(self) -> contextlib.AbstractContextManager:
        return self._NOTHING

    def loaded(self) -> object:
        return None

    def wait_loaded(self, mark: object, tensors: Iterable[torch.Tensor]) -> None:
        pass


class CudaInputStream:
    """Input dist's own CUDA stream on the rank's device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self.copies = torch.cuda.Stream(device=device)
        """Where batches are copied to the device (`load`)."""
        self.compute = torch.cuda.current_stream(device)
        """The main thread's stream, where the iterations' compute goes (made before any thread enters `input`)."""
        # What the compute stream issued before (the rank's build calls wait_for_compute again
        # once the embeddings' index tensors are on the device).
        self.stream.wait_stream(self.compute)

    def input(self) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(self.stream)

    def hand_over(self, tensors: Iterable[torch.Tensor]) -> None:
        compute = torch.cuda.current_stream(self.device)
        # Everything issued on the input stream so far: this batch's ids, and (threaded) maybe a
        # later batch's bucketize, behind that batch's copy.
        compute.wait_stream(self.stream)
        for t in tensors:
            t.record_stream(compute)

    def wait_for_compute(self) -> None:
        self.stream.wait_stream(self.compute)

    def load(self) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(self.copies)

    def loaded(self) -> object:
        event = torch.cuda.Event()
        event.record(self.copies)
        return event

    def wait_loaded(self, mark: object, tensors: Iterable[torch.Tensor]) -> None:
        self.stream.wait_event(mark)
        for t in tensors:
            t.record_stream(self.stream)


def input_streams(device: torch.device) -> InputStreams:
    """The input-dist streams of a rank on `device`."""
    return CudaInputStream(device) if device.type == "cuda" else SameStream()
