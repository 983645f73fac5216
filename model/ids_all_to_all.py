"""Two-phase exchange of sparse ids, as TorchRec's KJTAllToAll does it.

The sender has its local batch's ids grouped by destination rank: for destination r,
`send_slots[r]` slots (a feature, or a feature's bucket of rows) of `B` lengths each, then
their values. Phase 1 exchanges the sizes (the "splits") and reads them on the host; phase
2 launches the lengths and values all-to-alls with those sizes. The receiver gets
`recv_slots` slots from every source and reorders them slot-major over the global batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from model.features import SparseFeatures


@dataclass
class IdsInFlight:
    """Lengths/values all-to-alls launched but not yet waited on."""

    lengths: torch.Tensor
    values: torch.Tensor
    works: list
    batch_per_source: int


class IdsAllToAll:
    def __init__(
        self, *, send_slots: Sequence[int], recv_slots: int, world_size: int, group, device: torch.device,
        to_host: Callable[[torch.Tensor], list],
    ) -> None:
        """to_host reads a small device tensor into a (nested) list: where a D2H copy strategy plugs in."""
        self.world_size, self.group, self.device, self.to_host = world_size, group, device, to_host
        self.recv_slots = recv_slots
        self.send_slots = torch.tensor(list(send_slots), dtype=torch.int64, device=device)
        self.dest_of_slot = torch.repeat_interleave(
            torch.arange(world_size, device=device), self.send_slots
        )
        # Received rows come (source, slot); the lookup wants (slot, source).
        self.recv_order = (
            torch.arange(world_size * recv_slots, dtype=torch.int32, device=device)
            .view(world_size, recv_slots).t().reshape(-1)
        )

    def counts(self, grouped: SparseFeatures) -> torch.Tensor:
        """(world, 2) int64 on the device: [lengths, values] this rank sends to each rank."""
        counts = torch.zeros(self.world_size, 2, dtype=torch.int64, device=self.device)
        counts[:, 0] = self.send_slots * grouped.batch_size
        counts[:, 1].index_add_(0, self.dest_of_slot, grouped.lengths.sum(dim=1))
        return counts

    def exchange_splits(self, counts: torch.Tensor) -> tuple[list[list[int]], list[list[int]]]:
        """The splits all-to-all, then the host sync TorchRec pays for it.

        Returns ([lengths, values] sent to each rank, [lengths, values] received from each),
        read to the host in one device-to-host copy.
        """
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.group)
        sent, recv = self.to_host(torch.stack([counts, received]))
        return sent, recv

    def start(self, grouped: SparseFeatures, sent: list[list[int]], received: list[list[int]]) -> IdsInFlight:
        """Launch the lengths and values all-to-alls (async), given both sides' sizes on the host."""
        recv_lengths = torch.empty(sum(s[0] for s in received), dtype=grouped.lengths.dtype, device=self.device)
        recv_values = torch.empty(sum(s[1] for s in received), dtype=grouped.values.dtype, device=self.device)
        works = [
            dist.all_to_all_single(
                recv_lengths, grouped.lengths.reshape(-1),
                output_split_sizes=[s[0] for s in received], input_split_sizes=[s[0] for s in sent],
                group=self.group, async_op=True,
            ),
            dist.all_to_all_single(
                recv_values, grouped.values,
                output_split_sizes=[s[1] for s in received], input_split_sizes=[s[1] for s in sent],
                group=self.group, async_op=True,
            ),
        ]
        batches = {s[0] // self.recv_slots for s in received} if self.recv_slots else {grouped.batch_size}
        if len(batches) != 1:
            raise ValueError(f"ranks sent different batch sizes {sorted(batches)}; this input dist needs one")
        return IdsInFlight(recv_lengths, recv_values, works, batches.pop())

    def finish(self, flight: IdsInFlight) -> SparseFeatures:
        """Wait, then lay the ids out slot-major over the global batch (sources in rank order)."""
        for work in flight.works:
            work.wait()
        lengths = flight.lengths.view(self.world_size * self.recv_slots, flight.batch_per_source)
        received = SparseFeatures(lengths=lengths, values=flight.values).permute(self.recv_order)
        return SparseFeatures(
            lengths=received.lengths.reshape(self.recv_slots, self.world_size * flight.batch_per_source),
            values=received.values,
        )
