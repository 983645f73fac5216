"""`make ablation`: the baseline, each flag alone, all flags, and all but one, each repeated,
the repeats interleaved (round by round).

One run folder per run (ordinary bench runs), plus runs/ablations/<id>/ablation.json that
links them, written as the ablation goes. Each config is the user's config with its
optimizations replaced (`cfg.replace`), nothing else changed. A config that resolves to what an
earlier config runs (the same effective flags and every other resolved choice; its requested
flags that cannot take effect here aside) is not run again: it is given that config's runs and
marked `same_as`. On a CPU, where three flags are CUDA-only, that is 8 of the 12 configs; with
tiny's data-parallel plan, where skip_splits_a2a has nothing to skip, 10; on one GPU 4 (the
input-dist thread has nothing to overlap, and torch >= 2.8 avoids record_stream anyway). Its own
runs would only measure the other config again, and their difference would be noise read as an
effect.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.config import BenchConfig
from harness.records.manifest import ResolvedFlags
from harness.names import OPTIMIZATION_FLAGS


def ablation_configs(flags: tuple[str, ...] = OPTIMIZATION_FLAGS) -> list[dict[str, Any]]:
    none = {f: False for f in flags}
    configs = [{"name": "baseline", "kind": "baseline", "flag": None, "requested": dict(none)}]
    configs += [{"name": f"+{f}", "kind": "alone", "flag": f, "requested": {**none, f: True}} for f in flags]
    configs.append({"name": "all", "kind": "all", "flag": None, "requested": {f: True for f in flags}})
    configs += [{"name": f"all-{f}", "kind": "all_but", "flag": f,
                 "requested": {**{g: True for g in flags}, f: False}} for f in flags]
    return configs


def with_flags(cfg: BenchConfig, requested: dict[str, bool]) -> BenchConfig:
    """`cfg` with exactly these optimization flags (the loop's shape and everything else kept)."""
    return cfg.replace(optimizations=dataclasses.replace(cfg.optimizations, **requested))


def runs_as(res: ResolvedFlags) -> str:
    """What a config runs, as the resolution decides it: every resolved choice but what was asked,
    why some of it cannot take effect and the notes (the code reads the effective flags alone)."""
    chosen = dataclasses.asdict(res)
    for key in ("requested", "inactive_reasons", "notes"):
        chosen.pop(key)
    return json.dumps(chosen, sort_keys=True)


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _entries(configs: list[dict[str, Any]], resolved: list[tuple[BenchConfig, ResolvedFlags]]
             ) -> tuple[list[dict[str, Any]], list[tuple[int, dict[str, Any], BenchConfig]]]:
    """The manifest's entry of every config, and (position, entry, config) of those that run: the
    first of each runs_as; the others are given its runs (`same_as`, the same lists, which fill as
    it runs)."""
    entries: list[dict[str, Any]] = []
    first: dict[str, dict[str, Any]] = {}
    running = []
    for i, (c, (derived, res)) in enumerate(zip(configs, resolved)):
        asked = [f for f in OPTIMIZATION_FLAGS if c["requested"][f]]
        entry = {**c, "all_inactive": bool(asked) and not any(res.effective[f] for f in asked),
                 "inactive_reasons": {f: r for f, r in res.inactive_reasons.items() if f in asked},
                 "runs": [], "failed_runs": []}
        entries.append(entry)
        same = first.setdefault(runs_as(res), entry)
        if same is entry:
            running.append((i, entry, derived))
        else:
            entry.update(same_as=same["name"], runs=same["runs"], failed_runs=same["failed_runs"])
    return entries, running


def run_ablation(cfg: BenchConfig, *, repeats: int, runs_root: Path,
                 bench: Callable[[BenchConfig, str], int], check: Callable[[BenchConfig], ResolvedFlags]) -> int:
    """bench(config, run_id) -> exit code runs one config; check(config) -> the resolved flags
    (or raises ValueError) without running."""
    from harness.records.writer import new_run_id, now_iso

    configs = ablation_configs()
    # Check every config before anything runs: a bad flag combination stops the whole ablation.
    resolved = []
    for c in configs:
        try:
            derived = with_flags(cfg, c["requested"])
            resolved.append((derived, check(derived)))
        except ValueError as exc:
            raise ValueError(f"ablation config {c['name']}: {exc}") from None
    run = cfg.run
    ablation_id = new_run_id(f"ablation-{run.preset}", run.nodes, run.gpus_per_node)
    folder = Path(runs_root) / "ablations" / ablation_id
    folder.mkdir(parents=True)
    manifest: dict[str, Any] = {
        "ablation_id": ablation_id, "start_time": now_iso(), "end_time": None, "status": "running",
        "preset": run.preset, "nodes": run.nodes, "gpus_per_node": run.gpus_per_node,
        "repeats": repeats, "pipeline": cfg.optimizations.pipeline, "flags": list(OPTIMIZATION_FLAGS), "configs": [],
    }
    manifest["configs"], running = _entries(configs, resolved)
    _write(folder / "ablation.json", manifest)
    print(f"ablation {ablation_id}: {len(configs)} configs, {len(running)} of them distinct here, x {repeats} "
          f"repeats, interleaved -> {folder}", flush=True)
    for c in manifest["configs"]:
        if "same_as" in c:
            print(f"   {c['name']}: resolves as {c['same_as']} here (the same effective flags): its runs", flush=True)
    failed = []
    # Round by round, each distinct config once a round: what drifts over the ablation (the host's
    # load, its clocks) falls on every config alike, not on the last ones.
    for k in range(repeats):
        for i, entry, derived in running:
            run_id = f"{ablation_id}-c{i:02d}-r{k}"
            print(f"== {entry['name']} ({k + 1}/{repeats})", flush=True)
            code = bench(derived, run_id)
            (entry["runs"] if code == 0 else entry["failed_runs"]).append(run_id)
            if code != 0:
                failed.append(run_id)
            _write(folder / "ablation.json", manifest)
    manifest.update(end_time=now_iso(), status="failed" if failed else "completed",
                    error=f"failed runs: {', '.join(failed)}" if failed else None)
    _write(folder / "ablation.json", manifest)
    print(f"ablation {ablation_id} {manifest['status']}; report: make report ABLATION={ablation_id}")
    return 1 if failed else 0
