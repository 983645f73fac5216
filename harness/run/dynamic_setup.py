"""What a rank's dynamic tables need from the harness: their settings and this rank's parameter
store, opened before training (an unreachable Redis fails the run before its first iteration)
and closed after it, whatever happens."""

from __future__ import annotations

import json
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path

from harness.config import BenchConfig
from harness.run.param_store import kept_where, open_store, remove_rows
from harness.store_url import real_store_url
from harness.records.writer import RankRecorder
from model.dynamic_table import DynamicCounts, DynamicSettings
from model.names import DYNAMIC_KINDS
from model.sharding import TablePlan

GIB = 2**30


def dynamic_setup(cfg: BenchConfig, plan: Sequence[TablePlan], *, rank: int, recorder: RankRecorder | None,
                  span: Callable[[str], AbstractContextManager],
                  before_slots: Callable[[], None] = lambda: None) -> tuple[DynamicSettings | None, Callable[[bool], None]]:
    """(settings, close) for this rank; (None, a no-op) when the plan has no dynamic table.
    close(completed): a completed run's stored rows are removed, a failed one's kept (said where).

    The embedded store spills under the rank's folder of the run (rankNNNNN/ps/); without a run
    folder (a test calling train directly) under a temporary folder that close() removes. Redis
    keys are prefixed with the run id and the rank, so runs sharing a server never mix rows.
    span(name): times a piece of a dynamic table's work (the transform runs as the ids are waited
    for, inside input_dist); before_slots: called before a batch's ids turn into slots (the input
    stream waits for the compute stream there: model/dynamic_table.py DynamicSettings.before_slots)."""
    if not any(tp.kind in DYNAMIC_KINDS for tp in plan):
        return None, lambda completed: None
    d = cfg.dynamic
    scratch = None
    if recorder is not None:
        where, run_id = recorder.dir, recorder.keys["run_id"]
    else:
        scratch = tempfile.mkdtemp(prefix="dlrm-ps-")
        where, run_id = Path(scratch), f"direct-{secrets.token_hex(4)}"
    url = real_store_url(d.ps) if d.ps is not None else None
    store = open_store(url, run_dir=where, memory_bytes=int(d.ps_memory_gib * GIB), spill_bytes=int(d.ps_spill_gib * GIB),
                       prefix=f"dlrm:{run_id}:rank{rank}")

    def close(completed: bool) -> None:
        try:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
            elif not completed and (kept := kept_where(store)):
                print(f"rank {rank}: the parameter store's rows are kept: {kept} "
                      "(make clean-runs removes those of old runs)", file=sys.stderr, flush=True)
            else:
                remove_rows(store)
        finally:
            store.close()

    return DynamicSettings(policy=d.policy, half_life=d.half_life, store=store, span=span,
                           before_slots=before_slots), close


def write_counts(recorder: RankRecorder | None, counts: dict[int, DynamicCounts]) -> None:
    """rankNNNNN/dynamic.json: what each dynamic table on the rank moved between its slots and the store."""
    if recorder is not None and counts:
        (recorder.dir / "dynamic.json").write_text(json.dumps({str(t): asdict(c) for t, c in counts.items()}, indent=1))
