"""Two-phase exchange of sparse ids, as TorchRec's KJTAllToAll does it.

The sender has its local batch's ids grouped by destination rank: for destination r,
`send_slots[r]` slots (a feature, or a feature's bucket of rows) of `B` lengths each, then
their values. Phase 1 exchanges the sizes (the "splits") and reads them on the host; phase
2 launches the lengths-and-values all-to-all with those sizes. The receiver gets
`recv_slots` slots from every source and reorders them slot-major over the global batch.

Both phases are asynchronous and split into launch and wait, so a pipeline can launch the
splits exchange of batch i+1 before batch i's forward, read them after it, and wait for the
ids before batch i+1's forward (TorchRec's TrainPipelineSparseDist does the same). What comes
before the first collective (regrouping the ids, counting what goes where) is kept apart from
it (`PendingIds` is made with nothing launched), so one thread may prepare a batch while
another issues its collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from model.collective_ops import Done, all_to_all_single
from model.collective_wait import WaitFn, block
from model.features import FeatureOrder, SparseFeatures

Splits = list[list[int]]
"""[lengths, values] per rank, on the host."""


CountFn = Callable[[str, Sequence[int], Sequence[int], int], None]
"""count(phase, send splits, recv splits, element size) of an all-to-all launched."""


class HostRead(Protocol):
    """A device-to-host copy that may still be in flight."""

    def tolist(self) -> list: ...


@dataclass(frozen=True)
class HostTransfer:
    """How small device tensors (the splits) reach the host.

    start: begins a copy and returns what `.tolist()` reads it with.
    non_blocking: `start` returns before the copy lands (pinned buffers on CUDA). Then the copy is
    queued right behind the splits collective, where waiting on the collective only orders the
    device stream; otherwise the copy is made when the splits are needed, after the host waited.
    """

    start: Callable[[torch.Tensor], HostRead]
    non_blocking: bool = False


PLAIN_TRANSFER = HostTransfer(start=lambda t: t.cpu())


@dataclass
class SplitsInFlight:
    """The splits all-to-all launched: what this rank sends each rank, and where the answer lands."""

    counts: torch.Tensor
    received: torch.Tensor
    work: Any
    read: HostRead | None = None


@dataclass
class IdsInFlight:
    """The ids all-to-all launched but not yet waited on."""

    received: torch.Tensor
    work: Any
    received_splits: Splits
    lengths_dtype: torch.dtype
    batch_per_source: int
    local: SparseFeatures | None = None
    """One rank: the ids themselves, exchanged with nobody (`received` then unused)."""


class IdsAllToAll:
    def __init__(
        self, *, send_slots: Sequence[int], recv_slots: int, world_size: int, group, device: torch.device,
        transfer: HostTransfer = PLAIN_TRANSFER, wait: WaitFn = block, count: CountFn | None = None,
    ) -> None:
        """count(phase, send splits, recv splits, element size): told of every exchange launched
        (ShardingContext.count_all_to_all: the bytes moved records); None: nothing counts."""
        self.world_size, self.group, self.device, self.transfer = world_size, group, device, transfer
        self.wait = wait
        self.count = count or (lambda *_: None)
        self.recv_slots = recv_slots
        self.send_slots = torch.tensor(list(send_slots), dtype=torch.int64, device=device)
        self.dest_of_slot = torch.repeat_interleave(
            torch.arange(world_size, device=device), self.send_slots
        )
        # Received rows come (source, slot); the lookup wants (slot, source).
        self.recv_order = FeatureOrder.of(
            torch.arange(world_size * recv_slots).view(world_size, recv_slots).t().reshape(-1).tolist(), device
        )

    def counts(self, grouped: SparseFeatures) -> torch.Tensor:
        """(world, 2) int64 on the device: [lengths, values] this rank sends to each rank."""
        counts = torch.zeros(self.world_size, 2, dtype=torch.int64, device=self.device)
        counts[:, 0] = self.send_slots * grouped.batch_size
        counts[:, 1].index_add_(0, self.dest_of_slot, grouped.lengths.sum(dim=1))
        return counts

    def start_splits(self, counts: torch.Tensor) -> SplitsInFlight:
        """Launch the splits all-to-all of `counts` (from `counts()`); nothing here waits for it."""
        received = torch.empty_like(counts)
        self.count("ids", [2] * self.world_size, [2] * self.world_size, counts.element_size())
        work = all_to_all_single(received, counts, group=self.group, async_op=True)
        flight = SplitsInFlight(counts=counts, received=received, work=work)
        if self.transfer.non_blocking:
            # On NCCL wait() only makes the current stream wait for the collective, so the copy
            # queued after it starts the moment the splits land, and the host goes on.
            self.wait(work)
            flight.read = self.transfer.start(torch.stack([counts, received]))
        return flight

    def finish_splits(self, flight: SplitsInFlight) -> tuple[Splits, Splits]:
        """([lengths, values] sent to each rank, [lengths, values] received from each), on the host:
        the host sync TorchRec pays for the splits, in one device-to-host copy."""
        if flight.read is None:
            self.wait(flight.work)
            flight.read = self.transfer.start(torch.stack([flight.counts, flight.received]))
        sent, recv = flight.read.tolist()
        return sent, recv

    def start(self, grouped: SparseFeatures, sent: Splits, received: Splits) -> IdsInFlight:
        """Launch the ids exchange (async), given both sides' sizes on the host.

        Lengths and values travel in one all-to-all (TorchRec sends one per tensor): each rank's
        chunk is its lengths then its values, in the values' dtype. A collective costs a launch
        and a rendezvous whatever its size, and an iteration of a small batch is mostly those.
        """
        batches = {s[0] // self.recv_slots for s in received} if self.recv_slots else {grouped.batch_size}
        if len(batches) != 1:
            raise ValueError(f"ranks sent different batch sizes {sorted(batches)}; this input dist needs one")
        if self.world_size == 1:  # one rank: the ids stay, no pack, copy or unpack
            return IdsInFlight(grouped.values, Done(), received, grouped.lengths.dtype, batches.pop(), local=grouped)
        values = grouped.values
        lengths = grouped.lengths.reshape(-1).to(values.dtype)
        chunks = zip(lengths.split([s[0] for s in sent]), values.split([s[1] for s in sent]))
        packed = torch.cat([t for pair in chunks for t in pair])
        out = torch.empty(sum(s[0] + s[1] for s in received), dtype=values.dtype, device=self.device)
        recv_splits, send_splits = [s[0] + s[1] for s in received], [s[0] + s[1] for s in sent]
        self.count("ids", send_splits, recv_splits, out.element_size())
        work = all_to_all_single(out, packed, output_split_sizes=recv_splits, input_split_sizes=send_splits,
                                      group=self.group, async_op=True)
        return IdsInFlight(out, work, received, grouped.lengths.dtype, batches.pop())

    def finish(self, flight: IdsInFlight) -> SparseFeatures:
        """Wait, then lay the ids out slot-major over the global batch (sources in rank order)."""
        self.wait(flight.work)
        if flight.local is not None:
            return SparseFeatures(lengths=flight.local.lengths.reshape(self.recv_slots, flight.batch_per_source),
                                  values=flight.local.values)
        parts = flight.received.split([n for s in flight.received_splits for n in s])
        lengths = torch.cat(parts[0::2]).to(flight.lengths_dtype)
        values = torch.cat(parts[1::2])
        by_source = SparseFeatures(
            lengths=lengths.view(self.world_size * self.recv_slots, flight.batch_per_source), values=values
        )
        received = by_source.permute(self.recv_order, total_values=values.numel())
        return SparseFeatures(
            lengths=received.lengths.reshape(self.recv_slots, self.world_size * flight.batch_per_source),
            values=received.values,
        )


class PendingIds:
    """One group's input distribution of one batch, from the splits to the ids ready for lookup.

    Made with nothing launched: the ids regrouped by destination and, unless the splits are
    `known` on the host, what this rank sends each rank counted on the device (no collective, so
    any thread may make it). `start_splits()` launches the splits exchange; `launch()` reads the
    splits and launches the ids exchange; `wait()` returns the ids. Each step does the earlier
    ones it finds undone. Callers choose when each happens; the order of collectives per process
    group is the same on every rank as long as every rank calls these in the same order.
    """

    def __init__(self, a2a: IdsAllToAll, grouped: SparseFeatures, *, known: tuple[Splits, Splits] | None = None) -> None:
        self._a2a, self._grouped, self._known = a2a, grouped, known
        self._counts = a2a.counts(grouped) if known is None else None
        self._splits: SplitsInFlight | None = None
        self._ids: IdsInFlight | None = None
        self.splits_exchanged = int(known is None)

    def start_splits(self) -> None:
        """Launch the splits all-to-all (nothing to launch when the splits are known); idempotent."""
        if self._counts is not None:
            self._splits = self._a2a.start_splits(self._counts)
            self._counts = None

    def launch(self) -> None:
        if self._ids is not None:
            return
        self.start_splits()
        sent, received = self._known if self._known is not None else self._a2a.finish_splits(self._splits)
        self._ids = self._a2a.start(self._grouped, sent, received)
        self._grouped = self._splits = None  # the send buffers are the collectives' now

    def wait(self) -> SparseFeatures:
        self.launch()
        return self._a2a.finish(self._ids)


class Ready:
    """Ids that need no exchange (data-parallel tables): already there, as TorchRec's NoWait."""

    splits_exchanged = 0

    def __init__(self, ids: SparseFeatures) -> None:
        self._ids = ids

    def start_splits(self) -> None:
        pass

    def launch(self) -> None:
        pass

    def wait(self) -> SparseFeatures:
        return self._ids
