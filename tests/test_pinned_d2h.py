"""Host copies: plain path on CPU, the buffer-ring logic with CPU stand-ins, the pinned path on CUDA."""

from __future__ import annotations

import pytest
import torch

from harness.run.pinned_d2h import BufferRings, HostCopies, buffer_key


class Done:
    """Stand-in for a CUDA event; a CPU copy_ is already complete when it returns."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def synchronize(self) -> None:
        self.log.append(self.name)

    def query(self) -> bool:
        return True


def cpu_rings(depth: int = 2) -> tuple[BufferRings, list[str], list[tuple]]:
    synced: list[str] = []
    allocated: list[tuple] = []
    copies = iter(range(1000))

    def allocate(shape, dtype):
        allocated.append((shape, dtype))
        return torch.empty(shape, dtype=dtype)

    rings = BufferRings(depth=depth, allocate=allocate, record=lambda src: Done(synced, f"copy{next(copies)}"))
    return rings, synced, allocated


def test_buffer_key():
    assert buffer_key(torch.zeros(2, 3)) == ((2, 3), torch.float32)
    assert buffer_key(torch.zeros((), dtype=torch.int64)) == ((), torch.int64)
    assert buffer_key(torch.zeros(2, 3)) != buffer_key(torch.zeros(3, 2))
    assert buffer_key(torch.zeros(4)) != buffer_key(torch.zeros(4, dtype=torch.int32))


@pytest.mark.parametrize("pinned", [False, True])
def test_cpu_host_copies_round_trip_without_buffers(pinned):
    copies = HostCopies(torch.device("cpu"), pinned)
    assert not copies.active  # pinned_d2h cannot take effect on CPU
    t = torch.tensor([1.5, -2.0, 3.25])
    assert torch.equal(copies.copy(t).wait(), t)
    assert copies.copy(torch.tensor([4, 5], dtype=torch.int64)).tolist() == [4, 5]
    assert copies.copy(torch.tensor(0.75)).wait().item() == 0.75
    assert copies.buffers(buffer_key(t)) == []


def test_ring_round_trips_and_reuses_buffers_per_key():
    rings, synced, allocated = cpu_rings(depth=2)
    vals = [torch.tensor([float(i), i + 0.5]) for i in range(5)]
    for v in vals:
        assert torch.equal(rings.copy(v).wait(), v)
    key = ((2,), torch.float32)
    assert allocated == [key, key]  # two buffers for five copies, allocated once each
    assert len({b.data_ptr() for b in rings.buffers(key)}) == 2
    assert synced == [f"copy{i}" for i in range(5)]  # each wait waited on its own copy, once

    lengths = rings.copy(torch.tensor([3, 1], dtype=torch.int64))
    scalar = rings.copy(torch.tensor(2.0))
    assert lengths.tolist() == [3, 1] and scalar.wait().item() == 2.0
    assert allocated[2:] == [((2,), torch.int64), ((), torch.float32)]  # other keys, other buffers
    ptrs = [b.data_ptr() for k in (key, ((2,), torch.int64), ((), torch.float32)) for b in rings.buffers(k)]
    assert len(set(ptrs)) == 4


def test_wait_result_is_not_the_reused_buffer():
    rings, _, _ = cpu_rings(depth=1)
    first = rings.copy(torch.tensor([1.0, 2.0])).wait()
    rings.copy(torch.tensor([7.0, 8.0])).wait()
    assert first.tolist() == [1.0, 2.0]
    assert first.data_ptr() != rings.buffers(((2,), torch.float32))[0].data_ptr()


def test_ring_wrap_resolves_the_unwaited_copy_before_overwriting():
    rings, synced, _ = cpu_rings(depth=2)
    a = rings.copy(torch.tensor([1.0, 2.0]))  # slot 0
    b = rings.copy(torch.tensor([3.0, 4.0]))  # slot 1
    assert synced == []  # nothing waited on yet: both copies may still be in flight
    c = rings.copy(torch.tensor([5.0, 6.0]))  # wraps onto slot 0, still owned by a
    assert synced == ["copy0"]  # only a's copy had to be waited on, and only because of the wrap
    slot0 = rings.buffers(((2,), torch.float32))[0]
    assert slot0.tolist() == [5.0, 6.0]  # the buffer really was overwritten ...
    assert a.wait().tolist() == [1.0, 2.0]  # ... yet a kept its own values
    assert synced == ["copy0"]  # a was already resolved: no second wait
    assert c.tolist() == [5.0, 6.0] and b.tolist() == [3.0, 4.0]
    assert synced == ["copy0", "copy2", "copy1"]


def test_ring_skips_the_wait_when_the_previous_owner_was_waited():
    rings, synced, _ = cpu_rings(depth=1)
    rings.copy(torch.tensor([1.0])).wait()
    rings.copy(torch.tensor([2.0]))
    assert synced == ["copy0"]  # reusing the buffer of a waited copy costs no extra wait


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        BufferRings(depth=0, allocate=lambda s, d: torch.empty(s, dtype=d), record=lambda src: None)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_pinned_copies_match_cpu():
    copies = HostCopies(torch.device("cuda"), pinned=True)
    assert copies.active
    a = torch.randn(2048, 2048, device="cuda")
    handles, expected = [], []
    for i in range(5):  # more copies than the ring is deep, none waited on until the end
        t = (a @ a).sum(0)[:16] + i  # a slow producer: the copy is queued behind a matmul
        handles.append(copies.copy(t))
        expected.append(t.cpu())
    lengths = torch.arange(7, device="cuda")
    lh = copies.copy(lengths)
    for h, e in zip(handles, expected):
        assert torch.equal(h.wait(), e)
    assert lh.tolist() == list(range(7))
    buffers = copies.buffers(((16,), torch.float32))
    # The ring grew in place of waiting for a copy in flight: at most one buffer a copy, no wait.
    assert 2 <= len(buffers) <= 5 and all(b.is_pinned() for b in buffers) and copies._rings.waits == 0
    assert all(b.is_pinned() for b in copies.buffers(((7,), torch.int64)))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_unpinned_is_plain_cpu():
    copies = HostCopies(torch.device("cuda"), pinned=False)
    assert not copies.active
    t = torch.arange(5.0, device="cuda")
    assert torch.equal(copies.copy(t).wait(), t.cpu())
    assert copies.buffers(buffer_key(t)) == []


class InFlight:
    """A copy still running until `land()`: what a pinned D2H copy is while the GPU is busy."""

    def __init__(self, waits: list[str], name: str) -> None:
        self.waits, self.name, self.landed = waits, name, False

    def land(self) -> None:
        self.landed = True

    def query(self) -> bool:
        return self.landed

    def synchronize(self) -> None:
        if not self.landed:
            self.waits.append(self.name)  # the host would block here until the copy lands
        self.landed = True


def test_splits_of_three_shardings_two_batches_in_flight_never_wait():
    """Three shardings' splits a batch (same shape and dtype), two batches pipelined: six copies in
    flight at once. The ring grows rather than wait for one of them (a wait in feeder.next is a
    host stall inside the timed iteration); each copy keeps its own values; a ring reuses a
    buffer once its copy has landed."""
    waits: list[str] = []
    events: list[InFlight] = []
    names = iter(range(1000))

    def record(src):
        events.append(InFlight(waits, f"copy{next(names)}"))
        return events[-1]

    rings = BufferRings(depth=2, allocate=lambda s, d: torch.empty(s, dtype=d), record=record)
    handles = [rings.copy(torch.tensor([b, s, 0])) for b in range(2) for s in range(3)]  # batch b, sharding s
    assert waits == [] and rings.waits == 0
    key = ((3,), torch.int64)
    assert len(rings.buffers(key)) == 6
    for e in events:
        e.land()
    assert [h.tolist() for h in handles] == [[b, s, 0] for b in range(2) for s in range(3)]
    more = [rings.copy(torch.tensor([2, s, 0])) for s in range(3)]  # the next batch reuses landed buffers
    assert len(rings.buffers(key)) == 6 and waits == [] and rings.waits == 0
    assert [h.tolist() for h in more] == [[2, s, 0] for s in range(3)]
