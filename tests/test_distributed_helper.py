"""tests/distributed.py's spawn helper: a rank that aborts after its work is done is a warning, with
the results kept; one that aborts during its work still fails the test."""

from __future__ import annotations

import multiprocessing.util
import os

import pytest
import torch.multiprocessing as mp

from tests.distributed import spawn_ranks


def _abort_at_exit(rank: int, world: int, device, value: int) -> int:
    if rank == 0:
        # Runs as the rank's process exits, after the result and the barrier. multiprocessing's own
        # exit hook, not atexit: a rank forked from the forkserver leaves by os._exit, which skips
        # atexit, while this runs under every start method.
        multiprocessing.util.Finalize(None, os.abort, exitpriority=0)
    return value + rank


def _abort_in_work(rank: int, world: int, device, value: int) -> int:
    if rank == 0:
        os.abort()
    return value + rank


def test_an_abort_in_teardown_after_every_result_is_saved_is_a_warning(tmp_path):
    with pytest.warns(RuntimeWarning, match="process 0 terminated with signal SIGABRT after every rank had saved"):
        assert spawn_ranks(_abort_at_exit, 2, tmp_path, 10) == [10, 11]


def test_an_abort_during_the_work_fails(tmp_path):
    with pytest.raises(mp.ProcessExitedException, match="SIGABRT"):
        spawn_ranks(_abort_in_work, 2, tmp_path, 10)
