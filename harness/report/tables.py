"""The per-stage tables of one or many runs, computed from the flat frame of report_load.

Every function takes loaded runs: the frame `load_runs` returns, one `Run`, or a list of
them, and returns a DataFrame keyed by run_id (so one call serves a comparison of runs).
Warm-up records are never summarised. Durations are in ms; quantiles are pandas' linear
interpolation (numpy.percentile's default).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from harness.report.load import Run, as_records, rank_notes
from harness.names import STAGES

Runs = pd.DataFrame | Run | Sequence[Run]
_GROUPS = {"job": [], "rank": ["rank"], "node": ["node"]}


def _by(by: str) -> list[str]:
    if by not in _GROUPS:
        raise ValueError(f"by must be one of {', '.join(_GROUPS)}, got {by!r}")
    return _GROUPS[by]


def timed_stages(runs: Runs) -> pd.DataFrame:
    """Non-warm-up stage records."""
    df = as_records(runs)
    return df[df["stage"].notna() & ~df["warmup"]]


def rank_iterations(runs: Runs, *, warmup: bool = False) -> pd.DataFrame:
    """One row per (run_id, rank, iteration) that has an iteration record; warm-up ones only if asked."""
    df = as_records(runs)
    df = df[df["iter_ms"].notna() & (warmup | ~df["warmup"])]
    cols = ["run_id", "world_size", "rank", "node", "iteration", "warmup",
            "iter_start_ns", "iter_end_ns", "iter_ms", "samples", "loss"]
    return df.drop_duplicates(["run_id", "rank", "iteration"])[cols].reset_index(drop=True)


def job_iterations(runs: Runs, *, warmup: bool = False) -> pd.DataFrame:
    """The job's iterations: iter_ms = slowest rank (ranks step together through collectives),
    samples = sum over ranks; `complete` says every rank of world_size recorded it.

    Columns: run_id, iteration, warmup, iter_ms, samples, ranks, complete.
    """
    its = rank_iterations(runs, warmup=warmup)
    out = its.groupby(["run_id", "iteration"], as_index=False).agg(
        warmup=("warmup", "first"), iter_ms=("iter_ms", "max"),
        samples=("samples", lambda s: s.sum(min_count=1)), ranks=("rank", "nunique"),
        world_size=("world_size", "first"))
    # Ranks that wrote no records at all are reported by completeness(); counting them here would
    # leave no complete iteration. world_size unknown (an nsys trace): the ranks seen are the world.
    seen = out["run_id"].map(its.groupby("run_id")["rank"].nunique())
    world = pd.concat([pd.to_numeric(out["world_size"], errors="coerce").fillna(seen), seen], axis=1).min(axis=1)
    out["complete"] = out["ranks"] >= world
    return out.drop(columns="world_size")


def _quantiles(g, col: str) -> pd.DataFrame:
    return g[col].agg(mean_ms="mean", p50_ms=lambda s: s.quantile(0.5), p90_ms=lambda s: s.quantile(0.9),
                      p99_ms=lambda s: s.quantile(0.99), count="count")


def stage_stats(runs: Runs, by: str = "job") -> pd.DataFrame:
    """Per stage duration mean/p50/p90/p99 (ms), record count and share of iteration time.

    by: "job" (all ranks together), "rank" or "node". share = the stage's mean duration over
    the group's mean iter_ms (each rank's own iteration time, over the same non-warm-up
    iterations). Shares summing below 1 show untimed gaps; above 1, overlap (pipelining).
    Stages come in STAGES order; absent stages have no row.
    """
    keys = ["run_id", *_by(by)]
    st = timed_stages(runs)
    if st.empty:
        return pd.DataFrame(columns=[*keys, "stage", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "count", "share"])
    out = _quantiles(st.groupby([*keys, "stage"]), "duration_ms").reset_index()
    it_ms = rank_iterations(runs).groupby(keys)["iter_ms"].mean().rename("_it")
    out = out.join(it_ms, on=keys)
    out["share"] = out["mean_ms"] / out["_it"]
    out["_o"] = out["stage"].map({s: i for i, s in enumerate(STAGES)})
    return out.sort_values([*keys, "_o"]).drop(columns=["_it", "_o"]).reset_index(drop=True)


def bytes_moved_table(stages: pd.DataFrame) -> pd.DataFrame:
    """Per stage, from one run's stage records (Run.stages, non-warm-up): the MB a rank sent to and
    received from other ranks an iteration (mean over ranks and iterations), and the rate that
    achieves over the stage's own time, GB/s (sent + received over the summed durations). A stage
    whose exchange overlaps other work (a pipelined input_dist, the dense all-reduce under the
    backward) shares its time, so its rate is a floor of the link's. Empty for records without
    byte counts (runs before they were recorded, the torchrec engine)."""
    cols = ["stage", "sent_mb", "recv_mb", "achieved_gbps", "records"]
    if "sent_bytes" not in stages.columns:
        return pd.DataFrame(columns=cols)
    st = stages[~stages["warmup"].astype(bool) & (stages["sent_bytes"] >= 0)]
    if st.empty:
        return pd.DataFrame(columns=cols)
    g = st.groupby("stage")
    seconds = g["duration_ms"].sum() / 1e3
    out = pd.DataFrame({
        "sent_mb": g["sent_bytes"].mean() / 1e6, "recv_mb": g["recv_bytes"].mean() / 1e6,
        "achieved_gbps": ((g["sent_bytes"].sum() + g["recv_bytes"].sum()) / seconds.where(seconds > 0)) / 1e9,
        "records": g.size(),
    }).reset_index()
    out["_o"] = out["stage"].map({s: i for i, s in enumerate(STAGES)})
    return out.sort_values("_o").drop(columns="_o")[cols].reset_index(drop=True)


def stage_pivot(stats: pd.DataFrame, by: str, value: str = "mean_ms") -> pd.DataFrame:
    """stage_stats of one run as a wide table: a row per rank/node, a column per stage."""
    wide = stats.pivot_table(index=_by(by), columns="stage", values=value, aggfunc="first")
    return wide[[s for s in STAGES if s in wide.columns]]


def iteration_table(runs: Runs, by: str = "job") -> pd.DataFrame:
    """Iteration time (ms) mean/p50/p90/p99 and samples/s per run, rank or node.

    job: a job iteration takes as long as its slowest rank; only iterations every rank
    recorded count (`partial` says how many were left out). node: likewise over the node's
    ranks. rank: the rank's own times. samples_per_s = samples / summed iteration time, not a
    mean of rates (that would over-weight fast iterations); NaN when samples are unknown.
    """
    keys = _by(by)
    if by == "job":
        its = job_iterations(runs)
        partial = its[~its["complete"]].groupby("run_id").size()
        its = its[its["complete"]]
    else:
        ri = rank_iterations(runs)
        if by == "rank":
            its = ri
        else:
            its = ri.groupby(["run_id", "node", "iteration"], as_index=False).agg(
                iter_ms=("iter_ms", "max"), samples=("samples", lambda s: s.sum(min_count=1)),
                ranks=("rank", "nunique"))
            full = ri.groupby(["run_id", "node"])["rank"].nunique().rename("_n")
            its = its.join(full, on=["run_id", "node"])
            its = its[its["ranks"] >= its["_n"]]
        partial = None
    g = its.groupby(["run_id", *keys])
    out = g["iter_ms"].agg(iterations="count", iter_ms_mean="mean", iter_ms_p50=lambda s: s.quantile(0.5),
                           iter_ms_p90=lambda s: s.quantile(0.9), iter_ms_p99=lambda s: s.quantile(0.99))
    total_s = g["iter_ms"].sum() / 1e3
    out["samples_per_s"] = g["samples"].sum(min_count=1) / total_s
    out = out.reset_index()
    if partial is not None:
        out["partial"] = out["run_id"].map(partial).fillna(0).astype("int64")
    return out


def straggler_table(runs: Runs) -> pd.DataFrame:
    """Per stage: the rank with the largest mean duration and its gap to the median rank.

    median_rank_ms is the median over ranks of the per-rank means; gap_pct is the gap over it.
    Ranks wait for each other inside collectives, so a slow rank also shows up as long
    collective stages on the others: read the slowest compute stage first.
    """
    st = timed_stages(runs)
    cols = ["run_id", "stage", "slowest_rank", "slowest_node", "slowest_ms", "median_rank_ms", "gap_ms",
            "gap_pct", "ranks"]
    if st.empty:
        return pd.DataFrame(columns=cols)
    per_rank = st.groupby(["run_id", "stage", "rank"]).agg(mean_ms=("duration_ms", "mean"),
                                                            node=("node", "first")).reset_index()
    rows = []
    for (run_id, stage), g in per_rank.groupby(["run_id", "stage"], sort=False):
        top = g.loc[g["mean_ms"].idxmax()]
        med = float(g["mean_ms"].median())
        rows.append({"run_id": run_id, "stage": stage, "slowest_rank": int(top["rank"]),
                     "slowest_node": int(top["node"]), "slowest_ms": float(top["mean_ms"]),
                     "median_rank_ms": med, "gap_ms": float(top["mean_ms"]) - med,
                     "gap_pct": 100 * (float(top["mean_ms"]) - med) / med if med > 0 else np.nan,
                     "ranks": len(g)})
    out = pd.DataFrame(rows, columns=cols)
    out["_o"] = out["stage"].map({s: i for i, s in enumerate(STAGES)})
    return out.sort_values(["run_id", "_o"]).drop(columns="_o").reset_index(drop=True)


def _covered(us: np.ndarray, ue: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Length of the union of disjoint sorted intervals [us, ue) that lies below each x."""
    cum = np.concatenate([np.zeros(1, dtype=us.dtype), np.cumsum(ue - us)])
    k = np.searchsorted(us, x, side="right")  # intervals starting at or before x
    prev = np.maximum(k - 1, 0)
    inside = np.clip(x - us[prev], 0, ue[prev] - us[prev]) if len(us) else np.zeros_like(x)
    return np.where(k > 0, cum[prev] + inside, 0)


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    if not len(s):
        return s, e
    prev_max = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(e)[:-1]])
    first = np.flatnonzero(s > prev_max)
    return s[first], np.maximum.reduceat(e, first)


def _input_dist_ns(df: pd.DataFrame) -> pd.DataFrame:
    """For each non-warm-up input_dist row of the flat frame `df` (same index): hidden_ns, the part
    that ran while the same rank ran another stage (any iteration's, from start_ns/end_ns), and
    critical_ns, the part on the critical path: inside one of the rank's iteration records, under
    no other stage, and not already counted for an earlier input_dist span (a threaded input dist
    has several batches' spans open at once; their common time is waited for once). All ns."""
    df = df[df["stage"].notna()]
    out = []
    for _, g in df.groupby(["run_id", "rank"], sort=True):
        every = g[g["stage"] == "input_dist"].sort_values("start_ns", kind="stable")
        idist = every[~every["warmup"]]
        if idist.empty:
            continue
        # Warm-up spans of other stages count: the first timed input_dist may hide under the
        # last warm-up iteration's compute.
        other = g[g["stage"] != "input_dist"]
        us, ue = _union(other["start_ns"].to_numpy("int64"), other["end_ns"].to_numpy("int64"))
        a, b = idist["start_ns"].to_numpy("int64"), idist["end_ns"].to_numpy("int64")
        # Each span's own part: from where the spans before it (by start, warm-up ones too) have ended.
        ends = every["end_ns"].to_numpy("int64")
        before = pd.Series(np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(ends)[:-1]]),
                           index=every.index).loc[idist.index].to_numpy("int64")
        oa = np.minimum(np.maximum(a, before), b)
        its = g[["iter_start_ns", "iter_end_ns"]].dropna().drop_duplicates()
        if its.empty:  # no iteration records bound the span (an nsys trace without them): all of it counts
            in_iter = b - oa
        else:
            vs, ve = _union(its["iter_start_ns"].to_numpy("int64"), its["iter_end_ns"].to_numpy("int64"))
            in_iter = _covered(vs, ve, b) - _covered(vs, ve, oa)
        own_hidden = _covered(us, ue, b) - _covered(us, ue, oa)
        out.append(pd.DataFrame({"hidden_ns": _covered(us, ue, b) - _covered(us, ue, a),
                                 "critical_ns": np.clip(in_iter - own_hidden, 0, None)},
                                index=idist.index, dtype="int64"))
    return pd.concat(out) if out else pd.DataFrame({"hidden_ns": [], "critical_ns": []}, dtype="int64")


def input_dist_spans(runs: Runs) -> pd.DataFrame:
    """Each non-warm-up input_dist record with hidden_ms: how much of it ran while the same rank
    ran another stage (any iteration's, from start_ns/end_ns). 0 when stages run one after another.

    Columns: run_id, rank, node, iteration, duration_ms, hidden_ms, exposed_ms.
    """
    df = as_records(runs)
    hidden = _input_dist_ns(df)["hidden_ns"]
    cols = ["run_id", "rank", "node", "iteration", "duration_ms", "hidden_ms", "exposed_ms"]
    if hidden.empty:
        return pd.DataFrame(columns=cols)
    rows = df.loc[hidden.index]
    span_ns = rows["end_ns"].astype("int64") - rows["start_ns"].astype("int64")
    out = rows[["run_id", "rank", "node", "iteration"]].assign(
        duration_ms=span_ns / 1e6, hidden_ms=hidden / 1e6, exposed_ms=(span_ns - hidden) / 1e6)
    return out.sort_values(["run_id", "rank"], kind="stable").reset_index(drop=True)[cols]


def critical_stages(runs: Runs) -> pd.DataFrame:
    """Non-warm-up stage records with `critical_ms`: the part of the stage on the iteration's
    critical path. That is the duration, except for input_dist, where it is the exposed part
    inside an iteration record of the rank (pipelined, its span runs from its launch under the
    previous iteration's compute to its wait, so adding the whole span on top of the stages it
    overlaps would count time twice; what falls between two iterations is in neither's time)."""
    df = as_records(runs)
    st = df[df["stage"].notna() & ~df["warmup"]].copy()
    st["critical_ms"] = st["duration_ms"]
    parts = _input_dist_ns(df)
    if not parts.empty:
        st.loc[parts.index, "critical_ms"] = parts["critical_ns"] / 1e6
    return st


def critical_stage_means(runs: Runs, by: str = "rank") -> pd.DataFrame:
    """One run's mean critical_ms per stage, wide: a row per rank or node, a column per stage
    (STAGES order), then iter_ms, the row's measured mean iteration time over the same
    non-warm-up iterations (a node's: its slowest rank's). A row's stages sum to about its
    iter_ms; what is left is untimed work."""
    if by not in ("rank", "node"):
        raise ValueError(f"by must be rank or node, got {by!r}")
    wide = critical_stages(runs).groupby([by, "stage"])["critical_ms"].mean().unstack("stage")
    wide = wide[[s for s in STAGES if s in wide.columns]]
    it = iteration_table(runs, by).set_index(by)["iter_ms_mean"]
    return wide.join(it.rename("iter_ms"))


def input_dist_overlap(runs: Runs) -> pd.DataFrame:
    """How much of input_dist the pipeline hid, per rank and over all ranks (rank "all").

    Columns: run_id, rank, spans, input_dist_ms (mean a span), hidden_ms, exposed_ms (means),
    hidden_frac (summed hidden over summed input_dist time).
    """
    spans = input_dist_spans(runs)
    cols = ["run_id", "rank", "spans", "input_dist_ms", "hidden_ms", "exposed_ms", "hidden_frac"]
    if spans.empty:
        return pd.DataFrame(columns=cols)

    def agg(g: pd.DataFrame) -> dict:
        total = g["duration_ms"].sum()
        return {"spans": len(g), "input_dist_ms": g["duration_ms"].mean(), "hidden_ms": g["hidden_ms"].mean(),
                "exposed_ms": g["exposed_ms"].mean(), "hidden_frac": g["hidden_ms"].sum() / total if total > 0 else 0.0}

    rows = []
    for run_id, g in spans.groupby("run_id", sort=True):
        rows += [{"run_id": run_id, "rank": str(r), **agg(gr)} for r, gr in g.groupby("rank")]
        rows.append({"run_id": run_id, "rank": "all", **agg(g)})
    return pd.DataFrame(rows, columns=cols)


def completeness(runs: Runs) -> list[str]:
    """One line per gap in the records: ranks missing vs world_size, stages missing overall or
    on some ranks. Empty when every rank recorded every stage. (Status and iterations not
    recorded by every rank are reported by the iteration summary.)"""
    df = as_records(runs)
    # A manifest's timed_stages names what its engine records (the torchrec engine times fewer
    # stages, by design); only those count as missing. A bare frame carries no manifest.
    held = [runs] if isinstance(runs, Run) else [] if isinstance(runs, pd.DataFrame) else list(runs)
    expected = {r.run_id: r.manifest.timed_stages if r.manifest else STAGES for r in held}
    notes = []
    for run_id, g in df.groupby("run_id", sort=True):
        stages = expected.get(str(run_id), STAGES)
        pre = f"run {run_id}: " if df["run_id"].nunique() > 1 else ""
        ws = g["world_size"].iloc[0]
        seen = set(g["rank"].astype(int))
        if isinstance(ws, (int, np.integer)) and ws > 0:
            missing = sorted(set(range(int(ws))) - seen)
            if missing:
                notes.append(f"{pre}rank(s) {_ints(missing)} of world size {ws} have no records")
        st = g[g["stage"].notna()]
        if st.empty:
            continue  # no stage timing at all: the summary says so
        absent = [s for s in stages if s not in set(st["stage"])]
        if absent:
            notes.append(f"{pre}no records of stage(s) {', '.join(absent)} on any rank")
        have = st.groupby("rank")["stage"].agg(set)
        for rank, have_r in have.items():
            lack = [s for s in stages if s not in have_r and s not in absent]
            if lack:
                notes.append(f"{pre}rank {rank} has no records of stage(s) {', '.join(lack)}")
        for rank in sorted(seen - set(have.index)):
            notes.append(f"{pre}rank {rank} has iteration records but no stage records")
    return notes


def _ints(xs: list[int]) -> str:
    return ", ".join(map(str, xs))


def rank_table(run: Run) -> pd.DataFrame:
    """Per rank: host, threads, measured GEMM rate and copy bandwidth, peak RSS and GPU memory, and
    the dense stage's achieved rate (empty when the manifest has no rank notes).

    dense_gflops = dense FLOPs of the rank's local batch (manifest: dense_flops_per_sample)
    over its median non-warm-up dense_fwd_bwd time; dense_vs_gemm is that over the plain
    torch.mm rate the same rank measured at start. The stage also holds the gradient
    all-reduce, so the fraction is a lower bound on the GEMMs' own efficiency.
    """
    ranks = rank_notes(run)
    if ranks.empty or "rank" not in ranks:
        return pd.DataFrame()
    cols = [c for c in ("rank", "node", "host", "threads", "gemm_gflops", "copy_gbps", "peak_rss_gib",
                        "peak_gpu_mem_gib") if c in ranks]
    ranks = ranks[cols].sort_values("rank").reset_index(drop=True)
    flops = run.manifest.dense_flops_per_sample if run.manifest else None
    dense = run.stages[(run.stages["stage"] == "dense_fwd_bwd") & ~run.stages["warmup"]]
    if flops and not dense.empty and "gemm_gflops" in ranks:
        p50 = dense.groupby("rank")["duration_ms"].median()
        samples = run.iterations[~run.iterations["warmup"]].groupby("rank")["samples"].median()
        ranks["dense_gflops"] = ranks["rank"].map(flops * samples / (p50 / 1e3) / 1e9)
        ranks["dense_vs_gemm"] = ranks["dense_gflops"] / ranks["gemm_gflops"]
    return ranks


def subspan_table(run: Run) -> pd.DataFrame:
    """Per (stage, sub-span name), over every rank's non-warm-up iterations: mean and p50 ms a
    record, records, and the share of its stage's mean duration. Empty when no sub-span ran."""
    sub = run.subspans
    if sub.empty:
        return pd.DataFrame(columns=["stage", "name", "mean_ms", "p50_ms", "count", "share_of_stage"])
    sub = sub[~sub["warmup"]]
    out = sub.groupby(["stage", "name"])["duration_ms"].agg(mean_ms="mean", p50_ms="median", count="count").reset_index()
    st = run.stages[~run.stages["warmup"].astype(bool)] if not run.stages.empty else run.stages
    stage_ms = st.groupby("stage")["duration_ms"].mean() if not st.empty else pd.Series(dtype=float)
    out["share_of_stage"] = [m / stage_ms[s] if s in stage_ms and stage_ms[s] > 0 else np.nan
                             for s, m in zip(out["stage"], out["mean_ms"])]
    out["_o"] = out["stage"].map({s: i for i, s in enumerate(STAGES)})
    return out.sort_values(["_o", "name"]).drop(columns="_o").reset_index(drop=True)


def splits_exchanged(run: Run) -> pd.DataFrame:
    """Per rank, the splits all-to-alls its non-warm-up iterations ran (skip_splits_a2a makes it 0; a
    batch off the fixed hotness falls back to the exchange): columns rank, iterations,
    splits_exchanged (total), iterations_with_exchange. Empty when the run did not record it."""
    its = run.iterations
    if "splits_exchanged" not in its or its.empty:
        return pd.DataFrame()
    its = its[~its["warmup"] & (its["splits_exchanged"] >= 0)]  # -1: not recorded
    if its.empty:
        return pd.DataFrame()
    return its.groupby("rank").agg(iterations=("iteration", "count"), splits_exchanged=("splits_exchanged", "sum"),
                                   iterations_with_exchange=("splits_exchanged", lambda s: int((s > 0).sum()))
                                   ).reset_index()


def evaluation(run: Run) -> tuple[pd.DataFrame, dict[str, object]]:
    """Rank 0's evaluations (every rank records the same AUROC) and what they add up to:

    - time_to_target_s: from the start of iteration 0 to the end of the first evaluation that
      reached --target-auc (both on rank 0's clock; what MLPerf times from run_start to run_stop);
    - samples_to_target: training samples seen by then;
    - train_samples_per_s: training samples over the job's summed iteration times (evaluations,
      which run between iterations, left out);
    - eval_s: the evaluations' summed time.
    Empty without evaluation records."""
    ev = run.evals
    if ev.empty:
        return ev, {}
    ev = ev[ev["rank"] == ev["rank"].min()].sort_values("index").reset_index(drop=True)
    table = ev[["index", "after_iteration", "trained_samples", "auc", "eval_samples", "eval_ms", "reached_target"]]
    it = run.iterations
    first = it[(it["rank"] == ev["rank"].iloc[0]) & (it["iteration"] == 0)]["start_ns"]
    job = job_iterations(run, warmup=True)
    trained = job[job["iteration"] <= ev["after_iteration"].iloc[-1]]
    summary: dict[str, object] = {
        "evaluations": len(ev),
        "best_auc": float(ev["auc"].max()),
        "eval_s": float(ev["eval_ms"].sum() / 1e3),
        "train_samples_per_s": float(int(ev["trained_samples"].iloc[-1]) / (trained["iter_ms"].sum() / 1e3)),
    }
    hit = ev[ev["reached_target"]]
    if len(hit) and len(first):
        summary["time_to_target_s"] = float((int(hit["end_ns"].iloc[0]) - int(first.iloc[0])) / 1e9)
        summary["samples_to_target"] = int(hit["trained_samples"].iloc[0])
    return table, summary


def evaluation_lines(summary: dict[str, object], target: float | None) -> list[str]:
    """The evaluation summary in words: the report's bullets and the printed summary's line."""
    lines = [f"{summary['evaluations']} evaluation(s), best AUROC {summary['best_auc']:.4f}"
             + (f" (target {target:g})" if target is not None else "")]
    if "time_to_target_s" in summary:
        lines.append(f"time to target {summary['time_to_target_s']:.2f} s (iteration 0's start to the end of the "
                     f"evaluation that reached it), samples to target {summary['samples_to_target']:,}")
    else:
        lines.append("no target set" if target is None else "target not reached")
    lines.append(f"training {summary['train_samples_per_s']:,.0f} samples/s (iterations only); evaluations "
                 f"{summary['eval_s']:.2f} s in all, outside every iteration")
    return lines
