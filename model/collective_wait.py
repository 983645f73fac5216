"""How the host waits for a collective it launched asynchronously.

`block` is `work.wait()`: the thread sleeps on a condition variable until the collective's
worker wakes it. `poll` asks `work.is_completed()` in a loop, yielding the core between asks, as
MPI libraries progress their requests: the thread never sleeps, so its core never goes idle.
On a virtual machine an idle vCPU halts and the host takes its time to run it again when a
wake-up arrives, which costs a small blocked collective several times its polled time
(docs/model-notes.md); the yield lets the collective's own threads run.

Both give the same results: only the waiting differs. `poll` is for host-side collectives (gloo);
on NCCL `wait()` does not block the host (it orders the current stream after the collective),
and `is_completed()` would query the device, so a CUDA run must use `block`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch.distributed as dist

from model.names import COLLECTIVE_WAITS

WaitFn = Callable[[dist.Work], None]


def block(work: dist.Work) -> None:
    """Sleep until the collective is done (torch's own wait)."""
    work.wait()


SPIN_LIMIT_S = 0.02
"""How long `poll` spins before it blocks. A wait that long is not latency-bound (a wake-up costs
well under a millisecond of it); a stalled peer then costs no core, and a work that never reports
completion (gloo's reduce_scatter, whose is_completed() stays False) still ends."""


def poll(work: dist.Work) -> None:
    """Spin until the collective is done, yielding the core on every turn; block after SPIN_LIMIT_S."""
    deadline = time.perf_counter() + SPIN_LIMIT_S
    while not work.is_completed() and time.perf_counter() < deadline:
        os.sched_yield()
    work.wait()  # returns at once when done; raises the collective's error if it failed


WAITS: dict[str, WaitFn] = {"block": block, "poll": poll}
"""Wait strategy by name (model/names.py COLLECTIVE_WAITS)."""
if set(WAITS) != set(COLLECTIVE_WAITS):  # a name added there needs its function here
    raise ImportError(f"model/collective_wait.py implements {sorted(WAITS)}, model/names.py names {COLLECTIVE_WAITS}")
