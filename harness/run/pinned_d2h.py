"""Device-to-host copies of small tensors (splits, lengths, loss), plain or into reused pinned buffers.

`pinned_d2h` optimization: `.cpu()` on a CUDA tensor allocates pageable host memory and blocks
the host until the whole device queue has drained up to the copy. A non-blocking copy into
page-locked memory lets the host go on queueing work, and waiting on an event recorded right
after the copy blocks only until that copy is done.

Reuse: a buffer is reused by later copies of the same (shape, dtype), in a ring per key. Before a
buffer is overwritten, the copy still owning it (issued but never waited on) is resolved: its
values are moved out, so a slow reader never sees another copy's values. A ring that would wrap
onto a copy still in flight grows by a buffer instead of waiting for it: several shardings'
splits of one batch, two batches pipelined, share a key, and a wait there would stall the host
inside the timed iteration (`feeder.next`). Rings stop growing at MAX_RING buffers a key, and
only then does the host wait.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

BufferKey = tuple[tuple[int, ...], torch.dtype]


def buffer_key(t: torch.Tensor) -> BufferKey:
    """Copies with the same key can share a host buffer."""
    return tuple(t.shape), t.dtype


MAX_RING = 64
"""The most host buffers a key's ring grows to (copies in flight at once, of one shape and dtype)."""


class CopyDone(Protocol):
    """What a copy's completion is waited on with: a torch.cuda.Event on CUDA."""

    def synchronize(self) -> None: ...

    def query(self) -> bool:
        """Whether the copy has completed (no wait)."""
        ...


class _Slot:
    """One host buffer of a ring, and the copy whose values it still holds (None once moved out)."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self.buffer = buffer
        self.owner: HostCopy | None = None


class HostCopy:
    """A device-to-host copy that may still be in flight. `wait()` returns a host tensor of its own."""

    def __init__(self, *, value: torch.Tensor | None = None, slot: _Slot | None = None, done: CopyDone | None = None):
        self._value, self._slot, self._done = value, slot, done

    @classmethod
    def ready(cls, value: torch.Tensor) -> HostCopy:
        return cls(value=value)

    def wait(self) -> torch.Tensor:
        if self._value is None:
            self._resolve()
        assert self._value is not None
        return self._value

    def tolist(self) -> list:
        return self.wait().tolist()

    def _resolve(self) -> None:
        """Wait for the copy and move its values out of the shared buffer, freeing the slot."""
        assert self._slot is not None and self._done is not None
        self._done.synchronize()
        # A clone, not the buffer: the caller may keep the result past the buffer's next reuse.
        self._value = self._slot.buffer.clone()
        if self._slot.owner is self:
            self._slot.owner = None
        self._slot = self._done = None


class BufferRings:
    """The reuse logic, kept apart from CUDA: `allocate` makes a host buffer, `record` marks the
    end of a copy just issued from a source tensor and returns what to wait on.
    """

    def __init__(
        self,
        *,
        depth: int,
        allocate: Callable[[tuple[int, ...], torch.dtype], torch.Tensor],
        record: Callable[[torch.Tensor], CopyDone],
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.depth, self._allocate, self._record = depth, allocate, record
        self._rings: dict[BufferKey, list[_Slot]] = {}
        self._next: dict[BufferKey, int] = {}

        self.waits = 0
        """Times the host waited for a copy in flight to reuse its buffer (a full ring of MAX_RING)."""

    def buffers(self, key: BufferKey) -> list[torch.Tensor]:
        """The host buffers allocated so far for a key."""
        return [slot.buffer for slot in self._rings.get(key, [])]

    def copy(self, t: torch.Tensor) -> HostCopy:
        slot = self._take_slot(buffer_key(t))
        if slot.owner is not None:
            if not slot.owner._done.query():
                self.waits += 1
            slot.owner._resolve()
        slot.buffer.copy_(t, non_blocking=True)
        handle = HostCopy(slot=slot, done=self._record(t))
        slot.owner = handle
        return handle

    def _take_slot(self, key: BufferKey) -> _Slot:
        ring = self._rings.setdefault(key, [])
        i = self._next.get(key, 0)
        in_flight = i < len(ring) and ring[i].owner is not None and not ring[i].owner._done.query()
        if i == len(ring) or (in_flight and len(ring) < MAX_RING):
            # Lazily up to depth; beyond it only in place of a wait. The new buffer takes the place
            # the ring was about to reuse, so the copy in flight there is reached last again.
            ring.insert(i, _Slot(self._allocate(*key)))
        self._next[key] = (i + 1) % max(len(ring), self.depth)
        return ring[i]


class HostCopies:
    """Starts device-to-host copies: through reused pinned buffers when `pinned` and the device is
    CUDA (`active`), else a synchronous `.cpu()`.
    """

    def __init__(self, device: torch.device, pinned: bool, *, depth: int = 2) -> None:
        self.device = device
        self.active = pinned and device.type == "cuda"
        self._rings = BufferRings(depth=depth, allocate=_pinned_empty, record=_record_cuda_event) if self.active else None

    def copy(self, t: torch.Tensor) -> HostCopy:
        if self._rings is None or t.device.type != "cuda":
            return HostCopy.ready(t.cpu())
        return self._rings.copy(t)

    def buffers(self, key: BufferKey) -> list[torch.Tensor]:
        return [] if self._rings is None else self._rings.buffers(key)


# ---- CUDA only: reached only through an active HostCopies, which needs a CUDA device.


def _pinned_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, pin_memory=True)


def _record_cuda_event(src: torch.Tensor) -> torch.cuda.Event:
    # A non-blocking D2H copy is queued on the current stream of the source's device, so the
    # event recorded there right after it completes exactly when the copy has.
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(src.device))
    return event
