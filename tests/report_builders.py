"""Hand-built run folders and ablations for the report tests (no tests here, only builders).

Times are given in ms (exact in ns) so expectations can be written by hand.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

from harness.config import DataConfig, ModelConfig, OptimizerConfig, RunConfig
from harness.records.manifest import GitState, PlanEstimate, RankEstimate, ResolvedFlags, RunManifest, RunStatus, Versions
from harness.names import OPTIMIZATION_FLAGS, STAGES
from harness.presets import tiny
from model.sharding import table_wise

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
    """A run folder: manifest.json and per-rank parquet parts. iters: {(rank, it): (start_ms, end_ms)};
    manifest: keyword arguments of manifest_for."""
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
    d.mkdir(parents=True, exist_ok=True)
    m = manifest_for(run_id, world_size=world_size, nodes=nodes, status=status, samples=samples,
                     warmup_iters=warmup_iters, **(manifest or {}))
    (d / "manifest.json").write_text(m.to_json())
    return d


def flags_for(requested: dict | None = None, reasons: dict | None = None, *, pipeline: bool = False,
              notes: dict | None = None) -> ResolvedFlags:
    """Resolved flags: the named ones requested, effective unless they have a reason."""
    req = {f: bool((requested or {}).get(f)) for f in OPTIMIZATION_FLAGS}
    return ResolvedFlags(pipeline=pipeline, requested=req,
                         effective={f: v and f not in (reasons or {}) for f, v in req.items()},
                         inactive_reasons=dict(reasons or {}), notes=dict(notes or {}))


def manifest_for(run_id: str, *, world_size: int, nodes: int = 1, status: str = "completed", samples: int = 4,
                 warmup_iters: int = 0, start_time: str = "2024-05-01T10:00:00+00:00", error: str | None = None,
                 model: ModelConfig | None = None, embedding_optimizer: str = "exact_adagrad",
                 timeline: bool = True, flags: ResolvedFlags | None = None, plan: tuple | None = None,
                 ranks: tuple = (), dense_flops_per_sample: float = 1000.0) -> RunManifest:
    """A complete manifest of a `tiny` run (or of `model`), table-wise tables round robin over the ranks."""
    cfg = tiny()
    model = model or cfg.model
    cfg = cfg.replace(
        model=model, optimizer=OptimizerConfig(embedding_optimizer=embedding_optimizer),
        data=DataConfig(global_batch_size=samples * world_size),
        run=RunConfig(preset="tiny", nodes=nodes, gpus_per_node=world_size // nodes, warmup_iters=warmup_iters,
                      timeline=timeline),
    )
    if plan is None:
        plan = tuple(table_wise(r, model.embedding_dim, t % world_size) for t, r in enumerate(model.table_rows))
    if error is None and status == "failed":
        error = "RuntimeError: boom"
    return RunManifest(
        run_id=run_id, config=cfg, status=RunStatus(state=status, error=error), start_time=start_time,
        launcher="local-simulation", launcher_host="test", argv=(), node_commands=(), device="cpu",
        optimizations=flags or flags_for(), plan=plan,
        plan_estimate=PlanEstimate(hardware="cpu", memory_gib=1.0, memory_gbps=1.0, intra_node_gbps=1.0,
                                   inter_node_gbps=1.0, link="intra-node",
                                   ranks=tuple(RankEstimate(rank=r, node=0, memory_gib=0.0, est_ms=0.0, shards=())
                                               for r in range(world_size))),
        dense_flops_per_sample=dense_flops_per_sample,
        versions=Versions(python="3", torch="t", fbgemm_gpu="f", numpy="n", pandas="p"),
        git=GitState(commit=None, dirty=None), ranks=ranks,
    )


def rewrite_manifest(run_dir: Path, **changes) -> None:
    """Replace fields of a written run's manifest (as a test wants it)."""
    path = Path(run_dir) / "manifest.json"
    path.write_text(dataclasses.replace(RunManifest.from_json(path.read_text()), **changes).to_json())


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
    extra = {} if flags is None else {"flags": flags_for(flags, reasons)}
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


def write_subspans(run_dir: Path, rows: list[dict]) -> None:
    """Sub-span records (rankNNNNN/subspans-00000.parquet): rows of rank, iteration, stage, name,
    start_ms, end_ms (node 0, warm-up as given, default False)."""
    run_id = Path(run_dir).name
    for rank in sorted({r["rank"] for r in rows}):
        pd.DataFrame([dict(run_id=run_id, rank=rank, node=0, iteration=r["iteration"], stage=r["stage"], name=r["name"],
                           start_ns=round(r["start_ms"] * 1e6), end_ns=round(r["end_ms"] * 1e6),
                           duration_ms=r["end_ms"] - r["start_ms"], warmup=r.get("warmup", False))
                      for r in rows if r["rank"] == rank]).to_parquet(
            Path(run_dir) / f"rank{rank:05d}" / "subspans-00000.parquet")


def write_evals(run_dir: Path, ranks: list[int], after: list[int]) -> None:
    """An evaluation after each iteration of `after`, recorded by every rank of `ranks` (1 ms each)."""
    run_id = Path(run_dir).name
    for rank in ranks:
        pd.DataFrame([dict(run_id=run_id, rank=rank, node=0, index=k, after_iteration=i, trained_samples=4 * (i + 1),
                           auc=0.6, eval_samples=8, eval_ms=1.0, start_ns=0, end_ns=10**6, reached_target=False)
                      for k, i in enumerate(after)]).to_parquet(Path(run_dir) / f"rank{rank:05d}" / "evals-00000.parquet")
