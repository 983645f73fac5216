"""The per-stage tables of one or many runs, computed from the flat frame of load.py.

Every function takes loaded runs: the frame `load_runs` returns, one `Run`, or a list of
them, and returns a DataFrame keyed by run_id (so one call serves a comparison of runs).
Warm-up records are never summarised. Durations are in ms; quantiles are pandas' linear
interpolation (numpy.percentile's default).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.report.completeness import completeness  # noqa: F401  (re-exported: a table's caveats)
from harness.report.intervals import covered, union
from harness.report.iterations import (  # noqa: F401  (re-exported: the iteration tables live there)
    NOT_BROKEN_DOWN, OTHER, Runs, between_parts, group_keys, held_runs, iteration_table, job_iterations, part_label,
    period_iterations, rank_iterations,
)
from harness.report.load import Run, as_records, derived, rank_notes, records
from harness.report.peaks import above_gemm_note, is_above, within_peak
from harness.names import BETWEEN_ITERATIONS, STAGES

_by = group_keys


def timed_stages(runs: Runs) -> pd.DataFrame:
    """Non-warm-up stage records."""
    df = as_records(runs)
    return df[df["stage"].notna() & ~df["warmup"]]


def _quantiles(g, col: str) -> pd.DataFrame:
    # groupby's own quantile, not Series.quantile a group: a tenth of a 128-rank report's time.
    s = g[col]
    return pd.DataFrame({"mean_ms": s.mean(), "p50_ms": s.quantile(0.5), "p90_ms": s.quantile(0.9),
                         "p99_ms": s.quantile(0.99), "count": s.count()})


STAGE_STAT_COLUMNS = ("stage", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "count", "share", "span_ms")


def _row_order(stage: str) -> int:
    if stage in STAGES:
        return STAGES.index(stage)
    return len(STAGES) + (0 if stage == BETWEEN_ITERATIONS else 2 if stage == part_label(OTHER) else 1)


def stage_stats(runs: Runs, by: str = "job") -> pd.DataFrame:
    """Per stage, then what runs between iterations: ms a rank (mean/p50/p90/p99 over the non-warm-up
    records), count and share of the iteration period.

    by: "job" (all ranks together), "rank" or "node". A stage's time is its part on the critical path
    (critical_stages): its duration, but input_dist's exposed part inside the iteration; span_ms is
    input_dist's whole span (launch to wait, part of it hidden or between iterations), NaN for the
    others. Row `between_iterations`: the gap from an iteration's end to the next one's start
    (iterations with a period); rows `between_iterations/<part>` split it by what ran there
    (between_parts, counts: the gaps it ran in), and are not to be added to it again; a run that
    recorded nothing of the gap (or a bare frame) has no part rows. share = the row's time over the
    iteration period, both summed over the group's iterations that have a period, so the stages and
    the between_iterations row of a run sum to at most about 100%; what is left ran inside the
    iteration, outside every timed stage. Absent stages have no row.
    """
    keys = ["run_id", *_by(by)]
    st = critical_stages(runs)
    if st.empty:
        return pd.DataFrame(columns=[*keys, *STAGE_STAT_COLUMNS])
    per = period_iterations(runs)
    wall = per.groupby(keys)["period_ms"].sum()
    rows = _quantiles(st.groupby([*keys, "stage"]), "critical_ms").reset_index()
    inside = st.merge(per[["run_id", "rank", "iteration"]], on=["run_id", "rank", "iteration"])
    rows = rows.join(inside.groupby([*keys, "stage"])["critical_ms"].sum().rename("_sum"), on=[*keys, "stage"])
    rows = rows.join(st[st["stage"] == "input_dist"].groupby([*keys, "stage"])["duration_ms"].mean()
                     .rename("span_ms"), on=[*keys, "stage"])
    frames = [rows]
    if not per.empty:
        gap = _quantiles(per.groupby(keys), "between_ms").reset_index()
        gap = gap.join(per.groupby(keys)["between_ms"].sum().rename("_sum"), on=keys)
        frames.append(gap.assign(stage=BETWEEN_ITERATIONS))
        parts = between_parts(runs)
        parts = parts[parts["part"] != NOT_BROKEN_DOWN]
        if not parts.empty:
            g = parts.groupby([*keys, "part"])
            named = _quantiles(g, "ms").join(g["ms"].sum().rename("_sum"))
            named["count"] = g["ms"].agg(lambda x: int((x > 0).sum()))
            named = named.reset_index()
            frames.append(named.assign(stage=named.pop("part").map(part_label)))
    out = pd.concat(frames, ignore_index=True)
    out["share"] = out["_sum"] / out.join(wall.rename("_wall"), on=keys)["_wall"]
    out["_o"] = out["stage"].map(_row_order)
    out = out.sort_values([*keys, "_o", "stage"]).reset_index(drop=True)
    return out[[*keys, *STAGE_STAT_COLUMNS]].astype({"count": "int64"})


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
    """stage_stats of one run as a wide table: a row per rank/node, a column per stage, then
    between_iterations (its parts are left to stage_stats)."""
    wide = stats.pivot_table(index=_by(by), columns="stage", values=value, aggfunc="first")
    return wide[[s for s in (*STAGES, BETWEEN_ITERATIONS) if s in wide.columns]]


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
        busy = union(other["start_ns"].to_numpy("int64"), other["end_ns"].to_numpy("int64"))
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
            in_iter = covered(union(its["iter_start_ns"].to_numpy("int64"), its["iter_end_ns"].to_numpy("int64")), oa, b)
        own_hidden = covered(busy, oa, b)
        out.append(pd.DataFrame({"hidden_ns": covered(busy, a, b),
                                 "critical_ns": np.clip(in_iter - own_hidden, 0, None)},
                                index=idist.index, dtype="int64"))
    return pd.concat(out) if out else pd.DataFrame({"hidden_ns": [], "critical_ns": []}, dtype="int64")


def _with_input_dist_ns(runs: Runs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """as_records(runs) and _input_dist_ns of it (same index), the parts computed once a run."""
    if isinstance(runs, pd.DataFrame):
        return runs, _input_dist_ns(runs)
    held = held_runs(runs)
    frames = [records(r) for r in held]
    parts, offset = [], 0
    for run, frame in zip(held, frames):
        p = derived(run, "input_dist_ns", lambda r: _input_dist_ns(records(r)))
        parts.append(p.set_axis(p.index + offset))
        offset += len(frame)
    if len(frames) == 1:
        return frames[0], parts[0]
    return as_records(runs), pd.concat(parts)


def input_dist_spans(runs: Runs) -> pd.DataFrame:
    """Each non-warm-up input_dist record: its span (duration_ms), hidden_ms, how much of it ran while
    the same rank ran another stage (any iteration's, from start_ns/end_ns; 0 when stages run one
    after another), exposed_ms, the rest, and critical_ms, the part of that on the iteration's
    critical path (critical_stages: inside an iteration record, not already waited for in an
    earlier span), which is what the stage tables count as input_dist. exposed - critical lay
    between iterations (the between_iterations row counts it) or was waited for in an earlier span.

    Columns: run_id, rank, node, iteration, duration_ms, hidden_ms, exposed_ms, critical_ms.
    """
    df, parts = _with_input_dist_ns(runs)
    cols = ["run_id", "rank", "node", "iteration", "duration_ms", "hidden_ms", "exposed_ms", "critical_ms"]
    if parts.empty:
        return pd.DataFrame(columns=cols)
    rows = df.loc[parts.index]
    span_ns = rows["end_ns"].astype("int64") - rows["start_ns"].astype("int64")
    hidden = parts["hidden_ns"]
    out = rows[["run_id", "rank", "node", "iteration"]].assign(
        duration_ms=span_ns / 1e6, hidden_ms=hidden / 1e6, exposed_ms=(span_ns - hidden) / 1e6,
        critical_ms=parts["critical_ns"] / 1e6)
    return out.sort_values(["run_id", "rank"], kind="stable").reset_index(drop=True)[cols]


def critical_stages(runs: Runs) -> pd.DataFrame:
    """Non-warm-up stage records with `critical_ms`: the part of the stage on the iteration's
    critical path. That is the duration, except for input_dist, where it is the exposed part
    inside an iteration record of the rank (pipelined, its span runs from its launch under the
    previous iteration's compute to its wait, so adding the whole span on top of the stages it
    overlaps would count time twice; what falls between two iterations is in neither's time)."""
    df, parts = _with_input_dist_ns(runs)
    st = df[df["stage"].notna() & ~df["warmup"]].copy()
    st["critical_ms"] = st["duration_ms"]
    if not parts.empty:
        st.loc[parts.index, "critical_ms"] = parts["critical_ns"] / 1e6
    return st


def critical_stage_means(runs: Runs, by: str = "rank") -> pd.DataFrame:
    """One run's iteration period broken down, wide: a row per rank or node; a column per stage
    (STAGES order, mean critical_ms: input_dist's exposed part), then between_iterations (the mean
    gap) and, where the run recorded what runs there, a column per part of it
    (`between_iterations/<part>`, summing to the gap), then iter_ms and period_ms (the mean timed
    window and period). All over the same iterations, those with a period (all timed ones when none
    has), means over the row's ranks: a row's stages and gap sum to about its period; what is left
    ran inside the iteration outside every timed stage."""
    if by not in ("rank", "node"):
        raise ValueError(f"by must be rank or node, got {by!r}")
    st, per = critical_stages(runs), period_iterations(runs)
    if not per.empty:
        st = st.merge(per[["run_id", "rank", "iteration"]], on=["run_id", "rank", "iteration"])
    wide = st.groupby([by, "stage"])["critical_ms"].mean().unstack("stage")
    wide = wide[[s for s in STAGES if s in wide.columns]]
    wide[BETWEEN_ITERATIONS] = per.groupby(by)["between_ms"].mean()
    parts = between_parts(runs)
    parts = parts[parts["part"] != NOT_BROKEN_DOWN]
    if not parts.empty:
        named = parts.groupby([by, "part"])["ms"].mean().unstack("part")
        order = sorted(named.columns, key=lambda p: (p == OTHER, p))
        wide = wide.join(named[order].rename(columns=part_label))
    its = per if not per.empty else rank_iterations(runs)
    return wide.join(its.groupby(by)[["iter_ms", "period_ms"]].mean())


def input_dist_overlap(runs: Runs) -> pd.DataFrame:
    """How much of input_dist the pipeline hid, per rank and over all ranks (rank "all").

    Columns: run_id, rank, spans, input_dist_ms (mean a span), hidden_ms, exposed_ms, critical_ms
    (means; input_dist_spans), hidden_frac (summed hidden over summed input_dist time).
    """
    spans = input_dist_spans(runs)
    cols = ["run_id", "rank", "spans", "input_dist_ms", "hidden_ms", "exposed_ms", "critical_ms", "hidden_frac"]
    if spans.empty:
        return pd.DataFrame(columns=cols)

    def agg(g: pd.DataFrame) -> dict:
        total = g["duration_ms"].sum()
        return {"spans": len(g), "input_dist_ms": g["duration_ms"].mean(), "hidden_ms": g["hidden_ms"].mean(),
                "exposed_ms": g["exposed_ms"].mean(), "critical_ms": g["critical_ms"].mean(),
                "hidden_frac": g["hidden_ms"].sum() / total if total > 0 else 0.0}

    rows = []
    for run_id, g in spans.groupby("run_id", sort=True):
        rows += [{"run_id": run_id, "rank": str(r), **agg(gr)} for r, gr in g.groupby("rank")]
        rows.append({"run_id": run_id, "rank": "all", **agg(g)})
    return pd.DataFrame(rows, columns=cols)


def rank_table(run: Run) -> pd.DataFrame:
    """Per rank: host, threads, measured GEMM rate and copy bandwidth, peak RSS and GPU memory, the
    seconds before its first iteration (start_s, NaN in older records) and the dense stage's
    achieved rate (empty when the manifest has no rank notes).

    dense_gflops = dense FLOPs of the rank's local batch (manifest: dense_flops_per_sample)
    over its median non-warm-up dense_fwd_bwd time; dense_vs_gemm is that over the plain
    torch.mm rate the same rank measured at start. The stage also holds the gradient
    all-reduce, so the fraction is a lower bound on the GEMMs' own efficiency. Where the dense step
    ran faster than the probe, the probe measured the peak wrong: dense_vs_gemm is n/a and
    peak_note says so (peaks.above_gemm_note), never a fraction above 1.
    """
    ranks = rank_notes(run)
    if ranks.empty or "rank" not in ranks:
        return pd.DataFrame()
    cols = [c for c in ("rank", "node", "host", "threads", "gemm_gflops", "copy_gbps", "peak_rss_gib",
                        "peak_gpu_mem_gib", "start_s") if c in ranks]
    ranks = ranks[cols].sort_values("rank").reset_index(drop=True)
    flops = run.manifest.dense_flops_per_sample if run.manifest else None
    dense = run.stages[(run.stages["stage"] == "dense_fwd_bwd") & ~run.stages["warmup"]]
    if flops and not dense.empty and "gemm_gflops" in ranks:
        p50 = dense.groupby("rank")["duration_ms"].median()
        samples = run.iterations[~run.iterations["warmup"]].groupby("rank")["samples"].median()
        ranks["dense_gflops"] = ranks["rank"].map(flops * samples / (p50 / 1e3) / 1e9)
        ranks["dense_vs_gemm"] = within_peak(ranks["dense_gflops"], ranks["gemm_gflops"])
        notes = [above_gemm_note("the dense step", d, g) if is_above(d, g) else ""
                 for d, g in zip(ranks["dense_gflops"].astype(float), ranks["gemm_gflops"].astype(float))]
        if any(notes):
            ranks["peak_note"] = notes
    return ranks


def subspan_table(run: Run) -> pd.DataFrame:
    """Per (stage, sub-span name), over every rank's non-warm-up iterations: mean and p50 ms a
    record, records, and the share of its stage's mean duration. Empty when no sub-span ran. Stage
    between_iterations names what ran between iterations: its share is of the mean gap (over the
    iterations that have one; stage_stats gives those parts a gap, zeros included)."""
    sub = run.subspans
    if sub.empty:
        return pd.DataFrame(columns=["stage", "name", "mean_ms", "p50_ms", "count", "share_of_stage"])
    sub = sub[~sub["warmup"]]
    out = sub.groupby(["stage", "name"])["duration_ms"].agg(mean_ms="mean", p50_ms="median", count="count").reset_index()
    st = run.stages[~run.stages["warmup"].astype(bool)] if not run.stages.empty else run.stages
    stage_ms = st.groupby("stage")["duration_ms"].mean() if not st.empty else pd.Series(dtype=float)
    stage_ms[BETWEEN_ITERATIONS] = period_iterations(run)["between_ms"].mean()
    out["share_of_stage"] = [m / stage_ms[s] if s in stage_ms and stage_ms[s] > 0 else np.nan
                             for s, m in zip(out["stage"], out["mean_ms"])]
    out["_o"] = out["stage"].map(_row_order)
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
    - train_samples_per_s: training samples over the job's summed iteration periods (an iteration
      followed by an evaluation, which has no period, counts its timed window: evaluations, which
      run between iterations, are left out);
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
        "train_samples_per_s": float(int(ev["trained_samples"].iloc[-1])
                                     / (trained["period_ms"].fillna(trained["iter_ms"]).sum() / 1e3)),
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
