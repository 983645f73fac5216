"""How a local simulation's rank processes begin (launcher._run_local): spawned, or forked from a
server that has done their imports.

A spawned rank is a fresh interpreter that imports torch, fbgemm-gpu and the harness before its
entry: about 3.5 s of a core a rank on a 2-core VM, paid again by every run of an ablation, a
compare or the tests (119 rank starts in one `make test`, 747 s of rank time before the entry,
2026-12-07). The fork server imports them once; each rank is then a fork of it, at its entry a
few hundredths of a second after it began. multiprocessing starts the server by exec, not fork,
so it holds nothing of the launcher's but what a fresh interpreter inherits: the environment and
the standard streams of the moment it started. Where either has changed since (a variable set, a
stream redirected), the server is replaced before the ranks start, so a rank sees what a spawned
one would. A forked rank is the server's child: it stops with the launcher by watching it
(harness/run/launcher_watch.py).

CUDA ranks are spawned: a process forked after CUDA was initialised cannot use it ("Cannot
re-initialize CUDA in forked subprocess", the first H100 run's test helper), and whether the
server's imports (fbgemm-gpu's CUDA build, torchrec) initialise it is untried on a GPU.
"""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing import forkserver

START_METHODS = ("forkserver", "spawn")
"""How a local simulation's ranks may begin (bench --start-method)."""

PRELOAD = ("torch", "torch.distributed", "harness.run.worker", "harness.run.train")
"""What the server imports before its first fork: everything a rank imports before its first iteration."""

UNWATCHED = frozenset({"PYTEST_CURRENT_TEST"})
"""Variables a change of which does not replace the server: pytest rewrites this one at every phase
of every test (the launcher runs inside the tests), and no rank reads it."""

_started_with: tuple | None = None
"""The process state the running server started with (_state()); None before the first."""


def start_method(cuda: bool) -> str:
    """The multiprocessing start method of a local simulation's ranks unless asked for one."""
    return "spawn" if cuda else "forkserver"


def ready_server(extra: tuple[str, ...] = ()) -> None:
    """Start the fork server with PRELOAD and `extra` imported, or replace it if this process's
    environment or standard streams moved since it started (or it was started elsewhere, in a
    state not known here). Call right before the ranks start."""
    global _started_with
    state = _state()
    server = forkserver._forkserver  # the one the forkserver context forks from
    if state != _started_with and server._forkserver_pid is not None:
        server._stop()  # waits for it to exit; the start below makes one with today's state
    if server._forkserver_pid is None:
        multiprocessing.get_context("forkserver").set_forkserver_preload([*PRELOAD, *extra])
    forkserver.ensure_running()
    _started_with = state


def _state() -> tuple:
    """What a spawned rank would take from this process and a forked one takes from the server."""
    return tuple(sorted(kv for kv in os.environ.items() if kv[0] not in UNWATCHED)), _stream(1), _stream(2)


def _stream(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino
