"""`make ablation`: the baseline, each flag alone, all flags, and all but one, each repeated.

One run folder per run (ordinary bench runs), plus runs/ablations/<id>/ablation.json that
links them, written as the ablation goes. Each config is the user's config with its
optimizations replaced (`cfg.replace`), nothing else changed. A config whose requested flags
all turn out inactive on this device is run once and marked, not repeated: its runs would
only measure the baseline again.
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


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


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
    print(f"ablation {ablation_id}: {len(configs)} configs x {repeats} repeats -> {folder}", flush=True)
    failed = []
    for i, (c, (derived, res)) in enumerate(zip(configs, resolved)):
        asked = [f for f in OPTIMIZATION_FLAGS if c["requested"][f]]
        all_inactive = bool(asked) and not any(res.effective[f] for f in asked)
        entry = {**c, "all_inactive": all_inactive,
                 "inactive_reasons": {f: r for f, r in res.inactive_reasons.items() if f in asked},
                 "runs": [], "failed_runs": []}
        manifest["configs"].append(entry)
        for k in range(1 if all_inactive else repeats):
            run_id = f"{ablation_id}-c{i:02d}-r{k}"
            print(f"== {c['name']} ({k + 1}/{1 if all_inactive else repeats})"
                  + (" [all requested flags inactive here: run once]" if all_inactive else ""), flush=True)
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
