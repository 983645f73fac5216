"""The all-to-all, gather and reduce-scatter collectives the shardings call.

all_to_all_single: in a group of one rank the exchange is the identity, so it is a copy on the
rank's stream instead of an NCCL launch (the first H100 trace of one GPU showed four all-to-alls
an iteration, about 0.1 ms of host time each, moving nothing).

torch 2.13 names the others `all_gather_single` and `reduce_scatter_single` and deprecates the older
`all_gather_into_tensor` and `reduce_scatter_tensor`; torches before the rename (GPU hosts often
carry an older container torch) have only the older names. Same arguments either way.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch.distributed as dist


def pick(module: ModuleType, name: str, older: str) -> Callable:
    """`module.name` where it exists, else `module.older` (module: torch.distributed, or a stand-in in tests)."""
    found = getattr(module, name, None) or getattr(module, older, None)
    if found is None:
        raise ImportError(f"torch.distributed has neither {name} nor {older}")
    return found


class Done:
    """The handle of an exchange that finished when it was issued (a one-rank group's)."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
    """torch.distributed.all_to_all_single (looked up at each call, so a wrapper put on it in tests
    sees it), except in a one-rank group: `output` gets `input`'s elements by a copy."""
    if dist.get_world_size(group) == 1:
        if not output.is_contiguous() or output.numel() != input.numel():
            raise ValueError(f"all_to_all_single in a one-rank group: output of {output.numel()} elements "
                             f"(contiguous: {output.is_contiguous()}) cannot take the {input.numel()} sent")
        output.view(-1).copy_(input.reshape(-1))
        return Done() if async_op else None
    return dist.all_to_all_single(output, input, output_split_sizes=output_split_sizes,
                                  input_split_sizes=input_split_sizes, group=group, async_op=async_op)


def all_gather_single(output, input, group=None, async_op=False):
    """Every rank's `input`, concatenated into `output`. Looked up at each call, so a wrapper put
    on torch.distributed (tests log every collective) sees it."""
    return pick(dist, "all_gather_single", "all_gather_into_tensor")(output, input, group=group, async_op=async_op)


def reduce_scatter_single(output, input, group=None, async_op=False):
    """The sum over ranks of `input`, block r into rank r's `output` (looked up at each call)."""
    return pick(dist, "reduce_scatter_single", "reduce_scatter_tensor")(output, input, group=group, async_op=async_op)
