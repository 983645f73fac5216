"""Iterations as a benchmark times them: the wall-clock period from one iteration's start to the
next one's start (design.md), the timed window inside it (iter_ms), and the gap between the two,
what runs between one iteration's end and the next one's start.

The period and the gap come from the iteration records alone (load.iteration_periods), so run
folders written before anything recorded what runs in the gap report them too. What runs there is
named by sub-span records of stage names.BETWEEN_ITERATIONS; what they do not cover is "other",
and a run with none shows the whole gap as one segment, not broken down.

Every function takes loaded runs: the frame `load_runs` returns, one `Run`, or a list of them.
Warm-up iterations are never summarised; the last iteration of a run, and one followed by an
evaluation, have no period and count in no period statistic.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from harness.names import BETWEEN_ITERATIONS
from harness.report.load import Run, as_records

Runs = pd.DataFrame | Run | Sequence[Run]
GROUPS = {"job": [], "rank": ["rank"], "node": ["node"]}

OTHER = "other"
"""The part of a gap no between-iterations sub-span covers."""
NOT_BROKEN_DOWN = "not broken down"
"""The one part of a gap in runs that recorded nothing of what runs there (runs written before
it was recorded, or records given as a bare frame)."""


def group_keys(by: str) -> list[str]:
    if by not in GROUPS:
        raise ValueError(f"by must be one of {', '.join(GROUPS)}, got {by!r}")
    return GROUPS[by]


def held_runs(runs: Runs) -> list[Run]:
    """The Run objects a caller passed (none for a bare frame)."""
    if isinstance(runs, Run):
        return [runs]
    return [] if isinstance(runs, pd.DataFrame) else list(runs)


def rank_iterations(runs: Runs, *, warmup: bool = False) -> pd.DataFrame:
    """One row per (run_id, rank, iteration) that has an iteration record; warm-up ones only if asked.

    period_ms and between_ms: to the next iteration's start, from its start and from its end (NaN
    for a run's last iteration and before an evaluation)."""
    df = as_records(runs)
    df = df[df["iter_ms"].notna() & (warmup | ~df["warmup"])]
    cols = ["run_id", "world_size", "rank", "node", "iteration", "warmup",
            "iter_start_ns", "iter_end_ns", "iter_ms", "period_ms", "between_ms", "samples", "loss"]
    return df.drop_duplicates(["run_id", "rank", "iteration"])[cols].reset_index(drop=True)


def _slowest(its: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per group of keys: iter_ms, period_ms and between_ms of the slowest rank (a period only
    where every rank of the group has one), samples summed, ranks counted."""
    g = its.groupby(keys, as_index=False)
    out = g.agg(iter_ms=("iter_ms", "max"), period_ms=("period_ms", "max"), between_ms=("between_ms", "max"),
                samples=("samples", lambda s: s.sum(min_count=1)), ranks=("rank", "nunique"),
                _periods=("period_ms", "count"))
    out.loc[out["_periods"] < out["ranks"], ["period_ms", "between_ms"]] = np.nan
    return out.drop(columns="_periods")


def job_iterations(runs: Runs, *, warmup: bool = False) -> pd.DataFrame:
    """The job's iterations: iter_ms, period_ms and between_ms of the slowest rank (ranks step
    together through collectives), samples = sum over ranks; `complete` says every rank of
    world_size recorded it.

    Columns: run_id, iteration, warmup, iter_ms, period_ms, between_ms, samples, ranks, complete.
    """
    its = rank_iterations(runs, warmup=warmup)
    out = _slowest(its, ["run_id", "iteration"])
    first = its.groupby(["run_id", "iteration"])[["warmup", "world_size"]].first().reset_index()
    out = first.merge(out, on=["run_id", "iteration"])
    # Ranks that wrote no records at all are reported by completeness(); counting them here would
    # leave no complete iteration. world_size unknown (an nsys trace): the ranks seen are the world.
    seen = out["run_id"].map(its.groupby("run_id")["rank"].nunique())
    world = pd.concat([pd.to_numeric(out["world_size"], errors="coerce").fillna(seen), seen], axis=1).min(axis=1)
    out["complete"] = out["ranks"] >= world
    return out[["run_id", "iteration", "warmup", "iter_ms", "period_ms", "between_ms", "samples", "ranks",
                "complete"]]


def iteration_table(runs: Runs, by: str = "job") -> pd.DataFrame:
    """Per run, rank or node: the iteration period (ms, mean/p50/p90/p99), the mean gap between
    iterations, the timed window (iter_ms mean/p50/p90/p99) and samples/s.

    job: a job iteration takes as long as its slowest rank; only iterations every rank recorded
    count (`partial` says how many were left out). node: likewise over the node's ranks. rank: the
    rank's own times. iterations counts the timed iterations, periods those with a period (all
    but a run's last and those before an evaluation). samples_per_s = the samples of the
    iterations that have a period over their summed periods (the timed wall time), not a mean of
    rates; NaN when samples are unknown or no iteration has a period.
    """
    keys = group_keys(by)
    partial = None
    if by == "job":
        its = job_iterations(runs)
        partial = its[~its["complete"]].groupby("run_id").size()
        its = its[its["complete"]]
    elif by == "rank":
        its = rank_iterations(runs)
    else:
        ri = rank_iterations(runs)
        its = _slowest(ri, ["run_id", "node", "iteration"])
        full = ri.groupby(["run_id", "node"])["rank"].nunique().rename("_n")
        its = its.join(full, on=["run_id", "node"])
        its = its[its["ranks"] >= its["_n"]]
    g = its.groupby(["run_id", *keys])
    out = pd.DataFrame({"iterations": g["iter_ms"].count(), "periods": g["period_ms"].count()})
    for col in ("period_ms", "iter_ms"):
        out[f"{col}_mean"] = g[col].mean()
        for q in (50, 90, 99):
            out[f"{col}_p{q}"] = g[col].quantile(q / 100)
        if col == "period_ms":
            out["between_ms_mean"] = g["between_ms"].mean()
    timed = its[its["period_ms"].notna()].groupby(["run_id", *keys])
    wall_s = timed["period_ms"].sum() / 1e3
    out["samples_per_s"] = (timed["samples"].sum(min_count=1) / wall_s.where(wall_s > 0)).reindex(out.index)
    out = out.reset_index()
    if partial is not None:
        out["partial"] = out["run_id"].map(partial).fillna(0).astype("int64")
    return out


def period_iterations(runs: Runs) -> pd.DataFrame:
    """The non-warm-up rank iterations that have a period (the ones every period figure is over)."""
    ri = rank_iterations(runs)
    return ri[ri["period_ms"].notna()].reset_index(drop=True)


def between_parts(runs: Runs) -> pd.DataFrame:
    """What runs in each gap between iterations, one row per (gap, part): run_id, rank, node,
    iteration (the one whose end the gap follows), part, ms. Over the non-warm-up gaps (those of
    iterations with a period). The parts are the names of the run's between-iterations sub-spans,
    summed a gap, and OTHER for what they leave uncovered; every gap has every part (0 where it did
    not run), so a part's mean over the gaps adds up to the mean gap. A run without such sub-spans
    (older runs; a bare frame, which carries none) has the one part NOT_BROKEN_DOWN."""
    gaps = period_iterations(runs)[["run_id", "rank", "node", "iteration", "between_ms"]]
    subs = {r.run_id: r.subspans for r in held_runs(runs)}
    frames = []
    for run_id, g in gaps.groupby("run_id", sort=True):
        sub = subs.get(str(run_id), pd.DataFrame())
        sub = sub[sub["stage"] == BETWEEN_ITERATIONS] if not sub.empty else sub
        if sub.empty:
            frames.append(g.assign(part=NOT_BROKEN_DOWN, ms=g["between_ms"]))
            continue
        sub = sub.astype({"rank": "int64", "iteration": "int64", "duration_ms": float})
        named = sub.groupby(["rank", "iteration", "name"])["duration_ms"].sum().unstack("name", fill_value=0.0)
        wide = g.join(named, on=["rank", "iteration"]).fillna({n: 0.0 for n in named.columns})
        wide[OTHER] = (wide["between_ms"] - wide[list(named.columns)].sum(axis=1)).clip(lower=0.0)
        parts = [*sorted(named.columns), OTHER]
        frames.append(wide.melt(id_vars=["run_id", "rank", "node", "iteration", "between_ms"], value_vars=parts,
                                var_name="part", value_name="ms"))
    cols = ["run_id", "rank", "node", "iteration", "part", "ms"]
    if not frames:
        return pd.DataFrame(columns=cols)
    return pd.concat(frames, ignore_index=True)[cols]


def part_label(part: str) -> str:
    """The row/segment name of a between-iterations part: "between_iterations/<part>"."""
    return f"{BETWEEN_ITERATIONS}/{part}"
