"""The gather and reduce-scatter collectives under the names the installed torch has.

torch 2.13 names them `all_gather_single` and `reduce_scatter_single` and deprecates the older
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


def all_gather_single(output, input, group=None, async_op=False):
    """Every rank's `input`, concatenated into `output`. Looked up at each call, so a wrapper put
    on torch.distributed (tests log every collective) sees it."""
    return pick(dist, "all_gather_single", "all_gather_into_tensor")(output, input, group=group, async_op=async_op)


def reduce_scatter_single(output, input, group=None, async_op=False):
    """The sum over ranks of `input`, block r into rank r's `output` (looked up at each call)."""
    return pick(dist, "reduce_scatter_single", "reduce_scatter_tensor")(output, input, group=group, async_op=async_op)
