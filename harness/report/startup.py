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
    """Each phase's mean seconds over the runs' rank 0 that recorded them, and how many runs; one
    part a launcher where they differ (an in-process run pays no imports: harness/launch/launcher.py,
    nor does a rank forked from the launcher's fork server: harness/launch/fork_server.py)."""
    from harness.records.manifest import RunManifest

    recorded: dict[str, list[dict]] = {}
    walls: dict[str, list[float]] = {}
    for d in run_dirs:
        try:
            manifest = RunManifest.from_json((Path(d) / "manifest.json").read_text())
        except (OSError, ValueError):
            continue
        first = min(manifest.ranks, key=lambda r: r.rank, default=None)
        if first is not None and first.startup_s:
            how = f"{manifest.launcher} ({manifest.start_method})" if manifest.start_method else manifest.launcher
            recorded.setdefault(how, []).append(first.startup_s)
            if manifest.end_time:
                walls.setdefault(how, []).append(
                    (dt.datetime.fromisoformat(manifest.end_time)
                     - dt.datetime.fromisoformat(manifest.start_time)).total_seconds())
    if not recorded:
        return "not recorded"
    parts = []
    for how, runs in sorted(recorded.items()):
        means = {p: sum(r.get(p, 0.0) for r in runs) / len(runs) for p in STARTUP_PHASES}
        w = walls.get(how, [])
        wall = f"; the manifest's start to end {sum(w) / len(w):.1f}" if w else ""
        head = f"{how}: " if len(recorded) > 1 else ""
        parts.append(head + ", ".join(f"{p} {s:.1f}" for p, s in means.items())
                     + f"{wall} (rank 0, mean of {len(runs)} runs)")
    return "; ".join(parts)
