"""A rank's seconds outside its timed iterations (RankInfo.startup_s, harness/run/startup.py), as
reports show them: before the first iteration (start_s), and each phase's mean over runs."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

from harness.names import STARTUP_PHASES


def start_s(phases: dict | None) -> float:
    """From the process's start to its first iteration; NaN where a phase was not recorded."""
    before = [(phases or {}).get(p) for p in STARTUP_PHASES if p != "loop"]
    return float(sum(before)) if None not in before else math.nan


def startup_line(run_dirs: list[Path]) -> str:
    """Each phase's mean seconds over the runs' rank 0 that recorded them, and how many runs."""
    from harness.records.manifest import RunManifest

    recorded, walls = [], []
    for d in run_dirs:
        try:
            manifest = RunManifest.from_json((Path(d) / "manifest.json").read_text())
        except (OSError, ValueError):
            continue
        first = min(manifest.ranks, key=lambda r: r.rank, default=None)
        if first is not None and first.startup_s:
            recorded.append(first.startup_s)
            if manifest.end_time:
                walls.append((dt.datetime.fromisoformat(manifest.end_time)
                              - dt.datetime.fromisoformat(manifest.start_time)).total_seconds())
    if not recorded:
        return "not recorded"
    means = {p: sum(r.get(p, 0.0) for r in recorded) / len(recorded) for p in STARTUP_PHASES}
    wall = f"; the manifest's start to end {sum(walls) / len(walls):.1f}" if walls else ""
    return ", ".join(f"{p} {s:.1f}" for p, s in means.items()) + f"{wall} (rank 0, mean of {len(recorded)} runs)"
