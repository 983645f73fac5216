"""`make ablation`: the baseline, each flag alone, all flags, and all but one, each repeated.

One run folder per run (ordinary bench runs), plus runs/ablations/<id>/ablation.json that
links them, written as the ablation goes. A config whose requested flags all turn out
inactive on this device is run once and marked, not repeated: its runs would only measure
the baseline again.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from harness.config import OPTIMIZATION_FLAGS


def ablation_configs(flags: tuple[str, ...] = OPTIMIZATION_FLAGS) -> list[dict[str, Any]]:
    none = {f: False for f in flags}
    configs = [{"name": "baseline", "kind": "baseline", "flag": None, "requested": dict(none)}]
    configs += [{"name": f"+{f}", "kind": "alone", "flag": f, "requested": {**none, f: True}} for f in flags]
    configs.append({"name": "all", "kind": "all", "flag": None, "requested": {f: True for f in flags}})
    configs += [{"name": f"all-{f}", "kind": "all_but", "flag": f,
                 "requested": {**{g: True for g in flags}, f: False}} for f in flags]
    return configs


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def run_ablation(args: argparse.Namespace, *, bench, check) -> int:
    """bench(namespace) -> exit code runs one config; check(namespace) -> effective-flags
    resolution (or raises ValueError) without running."""
    from harness.records import new_run_id, now_iso

    configs = ablation_configs()
    # Check every config before anything runs: a bad flag combination stops the whole ablation.
    resolved = []
    for c in configs:
        ns = copy.copy(args)
        ns.opts = "none"
        for f in OPTIMIZATION_FLAGS:
            setattr(ns, f, c["requested"][f])
        resolved.append((ns, check(ns)))
    ablation_id = new_run_id(f"ablation-{args.preset}", args.nodes, args.gpus_per_node)
    folder = Path(args.runs_root) / "ablations" / ablation_id
    folder.mkdir(parents=True)
    manifest: dict[str, Any] = {
        "ablation_id": ablation_id, "start_time": now_iso(), "end_time": None, "status": "running",
        "preset": args.preset, "nodes": args.nodes, "gpus_per_node": args.gpus_per_node,
        "repeats": args.repeats, "pipeline": args.pipeline, "flags": list(OPTIMIZATION_FLAGS), "configs": [],
    }
    print(f"ablation {ablation_id}: {len(configs)} configs x {args.repeats} repeats -> {folder}", flush=True)
    failed = []
    for i, (c, (ns, res)) in enumerate(zip(configs, resolved)):
        asked = [f for f in OPTIMIZATION_FLAGS if c["requested"][f]]
        all_inactive = bool(asked) and not any(res["effective"][f] for f in asked)
        entry = {**c, "all_inactive": all_inactive,
                 "inactive_reasons": {f: r for f, r in res["inactive_reasons"].items() if f in asked},
                 "runs": [], "failed_runs": []}
        manifest["configs"].append(entry)
        for k in range(1 if all_inactive else args.repeats):
            ns_k = copy.copy(ns)
            ns_k.run_id = f"{ablation_id}-c{i:02d}-r{k}"
            print(f"== {c['name']} ({k + 1}/{1 if all_inactive else args.repeats})"
                  + (" [all requested flags inactive here: run once]" if all_inactive else ""), flush=True)
            code = bench(ns_k)
            (entry["runs"] if code == 0 else entry["failed_runs"]).append(ns_k.run_id)
            if code != 0:
                failed.append(ns_k.run_id)
            _write(folder / "ablation.json", manifest)
    manifest.update(end_time=now_iso(), status="failed" if failed else "completed",
                    error=f"failed runs: {', '.join(failed)}" if failed else None)
    _write(folder / "ablation.json", manifest)
    print(f"ablation {ablation_id} {manifest['status']}; report: make report ABLATION={ablation_id}")
    return 1 if failed else 0
