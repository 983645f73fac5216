"""Hand-built run folders and ablations for the report tests (no tests here, only builders).

Times are given in ms (exact in ns) so expectations can be written by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from harness.stages import STAGES

FLAGS2 = ["cuda_graphs", "skip_splits_a2a"]


def span(rank, iteration, stage, start_ms, end_ms, *, node=0, warmup=False):
    return dict(rank=rank, node=node, iteration=iteration, stage=stage, start_ms=start_ms, end_ms=end_ms,
                warmup=warmup)


def sequential(rank, iterations, durations, *, node=0, warmup_iters=0, t0=0.0, gap=0.0):
    """Stages back to back; durations(rank, iteration, stage_index) -> ms. Returns (spans, iter_ms)."""
    spans, iters, t = [], {}, t0
    for i in iterations:
        start = t
        for s, name in enumerate(STAGES):
            d = durations(rank, i, s)
            spans.append(span(rank, i, name, t, t + d, node=node, warmup=i < warmup_iters))
            t += d
        iters[(rank, i)] = (start, t)
        t += gap
    return spans, iters


def write_run(root: Path, run_id: str, spans: list[dict], iters: dict, *, world_size: int, nodes: int = 1,
              status: str = "completed", samples: int = 4, manifest: dict | None = None,
              warmup_iters: int = 0) -> Path:
    """A run folder: manifest.json and per-rank parquet parts. iters: {(rank, it): (start_ms, end_ms)}."""
    d = Path(root) / run_id
    ranks = sorted({s["rank"] for s in spans} | {r for r, _ in iters})
    node_of = {s["rank"]: s["node"] for s in spans}
    for r in ranks:
        (d / f"rank{r:05d}").mkdir(parents=True, exist_ok=True)
        st = pd.DataFrame([dict(run_id=run_id, rank=r, node=s["node"], iteration=s["iteration"], stage=s["stage"],
                                start_ns=round(s["start_ms"] * 1e6), end_ns=round(s["end_ms"] * 1e6),
                                duration_ms=s["end_ms"] - s["start_ms"], warmup=s["warmup"])
                           for s in spans if s["rank"] == r],
                          columns=["run_id", "rank", "node", "iteration", "stage", "start_ns", "end_ns",
                                   "duration_ms", "warmup"])
        it = pd.DataFrame([dict(run_id=run_id, rank=r, node=node_of.get(r, 0), iteration=i,
                                start_ns=round(a * 1e6), end_ns=round(b * 1e6), iter_ms=b - a, loss=0.5,
                                samples=samples, warmup=i < warmup_iters)
                           for (rr, i), (a, b) in sorted(iters.items()) if rr == r])
        if not st.empty:
            st.to_parquet(d / f"rank{r:05d}" / "stages-00000.parquet")
        if not it.empty:
            it.to_parquet(d / f"rank{r:05d}" / "iterations-00000.parquet")
    m = dict(run_id=run_id, status=status, error=None if status == "completed" else "RuntimeError: boom",
             start_time="2024-05-01T10:00:00+00:00", end_time=None, preset="tiny", world_size=world_size,
             nodes=nodes, gpus_per_node=world_size // nodes, device="cpu", global_batch_size=samples * world_size,
             config={"model": {}, "run": {"timeline": True, "warmup_iters": warmup_iters}})
    m.update(manifest or {})
    d.mkdir(parents=True, exist_ok=True)
    (d / "manifest.json").write_text(json.dumps(m))
    return d


def iter_run(root: Path, run_id: str, iter_ms: dict[int, list[float]], *, warmup: list[float] = (),
             flags: dict | None = None, reasons: dict | None = None) -> Path:
    """A run whose ranks take the given iteration times (rank -> list), stages splitting each
    iteration in five equal parts; `warmup` times come first on every rank, marked warm-up."""
    spans, iters = [], {}
    for rank, times in iter_ms.items():
        t = 0.0
        for i, ms in enumerate([*warmup, *times]):
            for s, name in enumerate(STAGES):
                spans.append(span(rank, i, name, t + s * ms / 5, t + (s + 1) * ms / 5, warmup=i < len(warmup)))
            iters[(rank, i)] = (t, t + ms)
            t += ms
    extra = {}
    if flags is not None:
        extra["optimizations"] = {"requested": flags, "effective": {f: v and f not in (reasons or {})
                                                                    for f, v in flags.items()},
                                  "inactive_reasons": reasons or {}}
    return write_run(root, run_id, spans, iters, world_size=len(iter_ms), warmup_iters=len(warmup), manifest=extra)


def write_ablation(runs_root: Path, ablation_id: str, configs: list[dict], *, status="completed",
                   flags=FLAGS2) -> Path:
    d = Path(runs_root) / "ablations" / ablation_id
    d.mkdir(parents=True)
    (d / "ablation.json").write_text(json.dumps({
        "ablation_id": ablation_id, "start_time": "2024-05-01T10:00:00+00:00", "end_time": None,
        "status": status, "preset": "tiny", "nodes": 1, "gpus_per_node": 2, "repeats": 3, "flags": flags,
        "configs": configs}))
    return d / "ablation.json"


def config(name, kind, flag, runs, *, requested=None, all_inactive=False, reasons=None):
    return {"name": name, "kind": kind, "flag": flag, "requested": requested or {}, "all_inactive": all_inactive,
            "inactive_reasons": reasons or {}, "runs": runs}
