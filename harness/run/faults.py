"""Faults injected on purpose (--fail-at, --stall-at), to test how the harness handles a rank
dying or hanging."""

from __future__ import annotations

import time

from harness.config import BenchConfig
from harness.records.writer import RankRecorder


class InjectedFault(RuntimeError):
    """Raised on purpose by --fail-at, to test how the harness handles a rank dying."""


def maybe_inject_fault(cfg: BenchConfig, rank: int, it: int, recorder: RankRecorder | None) -> None:
    """--fail-at raises here; --stall-at hangs here (after leaving a note naming the cause)."""
    if cfg.run.fail_at == (rank, it):
        raise InjectedFault(f"injected fault on rank {rank} at iteration {it} (--fail-at)")
    if cfg.run.stall_at == (rank, it):
        if recorder is not None:
            recorder.write_fault(f"injected stall on rank {rank} at iteration {it} (--stall-at)")
        while True:
            time.sleep(3600)
