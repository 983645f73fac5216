"""The report's PNG plots (matplotlib, Agg, no pyplot state): each function draws one figure
from report tables or the flat frame and writes it to `path`."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from harness.report.tables import job_iterations, rank_iterations  # noqa: E402
from harness.names import BETWEEN_ITERATIONS, STAGES  # noqa: E402

COLORS = dict(zip(STAGES, ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3")))
DPI = 110


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return Path(path)


BETWEEN_COLOR = "#8c8c8c"
PART_COLORS = ("#a6a6a6", "#bfbfbf", "#737373", "#595959", "#d0d0d0")
REST_COLORS = {"untimed": "#e6e6e6", "unbroken": "#f2e6c9"}
REST_LABELS = {"untimed": "in the iteration, outside the timed stages",
               "unbroken": "not broken down (the engine does not time these stages)"}


def _segments(wide: pd.DataFrame) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """(column, legend label, colour) of the stacked segments: the stages; then what runs between
    iterations (its parts where the rows have them, else the whole gap)."""
    stages = [(s, s, COLORS[s]) for s in STAGES if s in wide.columns]
    parts = [c for c in wide.columns if str(c).startswith(f"{BETWEEN_ITERATIONS}/")]
    if parts:
        between = [(c, f"between iterations: {c.split('/', 1)[1]}", PART_COLORS[i % len(PART_COLORS)])
                   for i, c in enumerate(parts)]
    else:
        between = [(BETWEEN_ITERATIONS, "between iterations", BETWEEN_COLOR)] if BETWEEN_ITERATIONS in wide.columns else []
    return stages, between


def plot_stage_bars(wide: pd.DataFrame, path: Path, *, title: str, row_label: str,
                    not_broken_down: tuple[str, ...] | list[str] = ()) -> Path:
    """Horizontal stacked bars: a bar per row of `wide` (rank, config, label) in the order of an
    iteration: a segment per stage (ms, critical-path times, so segments never count overlapped time
    twice), then what the stages leave of the iteration, then what runs between iterations (its parts
    where recorded). The bar ends at the row's measured period (`period_ms`; `iter_ms` where there is
    none). What the stages leave is drawn as work inside the iteration outside the timed stages, or,
    for rows in `not_broken_down` (an engine that times only some stages), as not broken down.
    Segments adding up past the period get a warning mark."""
    labels = [str(i) for i in wide.index]
    unbroken = np.array([str(i) in set(map(str, not_broken_down)) for i in wide.index])
    stages, between = _segments(wide)
    fig = Figure(figsize=(9, 1.8 + 0.45 * len(labels)), layout="constrained")
    ax = fig.add_subplot()
    left = np.zeros(len(labels))
    y = np.arange(len(labels))
    end = pd.Series(np.nan, index=wide.index)
    for col in ("iter_ms", "period_ms"):  # the period where there is one
        if col in wide.columns:
            end = wide[col].where(wide[col].notna(), end)
    gap = sum((wide[c].fillna(0).to_numpy(float) for c, _, _ in between), np.zeros(len(labels)))
    for col, label, color in stages:
        vals = wide[col].fillna(0).to_numpy(float)
        ax.barh(y, vals, left=left, color=color, label=label, height=0.7)
        left += vals
    measured = np.where(end.isna(), left + gap, end.to_numpy(float))
    rest = np.clip(np.nan_to_num(measured - left - gap), 0, None)
    for kind, rows in (("untimed", ~unbroken), ("unbroken", unbroken)):
        if (rest * rows).any():
            ax.barh(y, rest * rows, left=left, color=REST_COLORS[kind], label=REST_LABELS[kind], height=0.7,
                    hatch="//" if kind == "unbroken" else None, edgecolor="#b8a06a" if kind == "unbroken" else None)
    left += rest
    for col, label, color in between:
        vals = wide[col].fillna(0).to_numpy(float)
        ax.barh(y, vals, left=left, color=color, label=label, height=0.7)
        left += vals
    for yi, total, meas in zip(y, left, measured):
        over = " (segments exceed it)" if total > 1.05 * meas else ""
        ax.text(max(total, meas), yi, f" {meas:.3g} ms{over}", va="center", fontsize=8)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()  # first row on top, as in the tables
    top = float(np.nanmax(np.maximum(left, measured))) if len(left) else 0.0
    ax.set_xlim(0, top * 1.25 if top > 0 else 1)
    ax.set_xlabel("mean time per iteration period (ms, non-warm-up; input_dist: exposed part)")
    ax.set_ylabel(row_label)
    ax.set_title(title)
    fig.legend(loc="outside lower center", ncols=4, fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def _bars(ax, a: np.ndarray, b: np.ndarray, y: np.ndarray, h: float, **style) -> None:
    """Rectangles [a, b] x [y, y + h], all in one collection: one artist a bar made a 128-rank
    run's Gantt take 20 s to draw (2026-12-07)."""
    if len(a):
        x0, x1, y0 = (np.asarray(v, dtype=float) for v in (a, b, y))
        verts = np.stack([np.column_stack(p) for p in ((x0, y0), (x0, y0 + h), (x1, y0 + h), (x1, y0))], axis=1)
        ax.add_collection(PolyCollection(verts, **style))


def _clipped(spans: pd.DataFrame, t0: int, t1: int) -> tuple[np.ndarray, np.ndarray]:
    """Spans' start and end (start_ns, end_ns) clipped to [t0, t1], in ms from t0."""
    a = (np.maximum(spans["start_ns"].to_numpy("int64"), t0) - t0) / 1e6
    return a, (np.minimum(spans["end_ns"].to_numpy("int64"), t1) - t0) / 1e6


def _gaps(df: pd.DataFrame, shown: list, t0: int) -> pd.DataFrame:
    """The between-iterations gap after each shown iteration, per rank: rank, iteration, a, b (ms from t0)."""
    its = df[df["iteration"].isin(shown) & df["between_ms"].notna()].drop_duplicates(["rank", "iteration"])
    a = (its["iter_end_ns"].astype("int64") - t0) / 1e6
    return pd.DataFrame({"rank": its["rank"], "iteration": its["iteration"], "a": a, "b": a + its["between_ms"]})


def plot_timeline(df: pd.DataFrame, path: Path, *, iterations: int = 3, title: str = "",
                  between: pd.DataFrame | None = None, of: str = "") -> Path:
    """Per-rank Gantt of a few non-warm-up iterations: a lane per rank for the compute stages and a
    thin lane above it for input_dist, so a pipelined input_dist shows under the compute it hides
    behind, and a straggler shows as a rank whose bars end late. The gap from an iteration's end to
    the next one's start is drawn in grey (between iterations), with what ran there where `between`
    (the run's between-iterations sub-spans) names it. Times from the earliest shown start. A lane
    a rank in `df`, in rank order (a report may give some ranks only; `of` says which, in the title)."""
    st = df[df["stage"].notna()]
    timed = st[~st["warmup"] & (st["stage"] != "input_dist")]
    its = sorted(timed["iteration"].unique())
    # Skip the first timed iteration when there are enough: it often still carries warm-up effects.
    shown = its[1:1 + iterations] if len(its) > iterations else its[:iterations]
    win = timed[timed["iteration"].isin(shown)]
    # Iteration starts from the iteration records where there are (a stage may start later).
    starts = df[df["iteration"].isin(shown)].groupby(["rank", "iteration"])["iter_start_ns"].first().dropna()
    t0, t1 = int(min([win["start_ns"].min(), *starts.astype("int64")])), int(win["end_ns"].max())
    gaps = _gaps(df, shown, t0)
    t1 = max(t1, t0 + int(1e6 * gaps["b"].max())) if len(gaps) else t1
    spans = st[(st["end_ns"] > t0) & (st["start_ns"] < t1)]
    ranks = sorted(st["rank"].unique())
    lane = {r: i for i, r in enumerate(ranks)}
    fig = Figure(figsize=(11, 1.8 + 0.55 * len(ranks)), layout="constrained")
    ax = fig.add_subplot()
    _bars(ax, gaps["a"], gaps["b"], gaps["rank"].map(lane) - 0.1, 0.45, facecolors=BETWEEN_COLOR, alpha=0.35)
    parts = (between[(between["end_ns"] > t0) & (between["start_ns"] < t1) & between["rank"].isin(lane)]
             if between is not None else [])
    names = sorted(set(parts["name"])) if len(parts) else []
    for i, name in enumerate(names):
        sub = parts[parts["name"] == name]
        _bars(ax, *_clipped(sub, t0, t1), sub["rank"].map(lane).to_numpy("int64") - 0.1, 0.45, edgecolor="white",
              linewidth=0.3, facecolors=PART_COLORS[i % len(PART_COLORS)])
    for stage in STAGES:
        sub = spans[spans["stage"] == stage]
        y, h = (-0.36, 0.2) if stage == "input_dist" else (-0.1, 0.45)
        _bars(ax, *_clipped(sub, t0, t1), sub["rank"].map(lane).to_numpy("int64") + y, h, facecolors=COLORS[stage],
              edgecolor="white", linewidth=0.3)
    # Iteration starts on the lowest rank, labelled at the top.
    first = timed[(timed["rank"] == ranks[0]) & timed["iteration"].isin(shown)].groupby("iteration")["start_ns"].min()
    if len(starts) and ranks[0] in starts.index.get_level_values("rank"):
        first = starts.loc[ranks[0]]
    for it, t in first.items():
        x = (int(t) - t0) / 1e6
        ax.axvline(x, color="grey", linestyle=":", linewidth=0.8)
        ax.text(x, -0.55, f" iter {it}", fontsize=8, color="dimgrey", va="bottom")
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set_ylim(len(ranks) - 0.4, -0.7)
    ax.set_xlim(0, (t1 - t0) / 1e6)
    ax.set_xlabel("time since the first shown stage started (ms)")
    ax.set_title(title or f"Stage timeline, iterations {shown[0]}-{shown[-1]}{of} (thin bars: input_dist)")
    present = [s for s in STAGES if s in set(spans["stage"])]
    handles = [Patch(color=COLORS[s], label=s) for s in present]
    if len(gaps):
        handles.append(Patch(color=BETWEEN_COLOR, alpha=0.35, label="between iterations"))
    handles += [Patch(color=PART_COLORS[i % len(PART_COLORS)], label=f"between: {n}") for i, n in enumerate(names)]
    fig.legend(handles=handles, ncols=min(len(handles), 6), fontsize=8, loc="outside lower center", frameon=False)
    return _save(fig, path)


def plot_rank_grid(grids: dict[str, pd.DataFrame], ranks: pd.DataFrame, path: Path, *, title: str) -> Path:
    """A panel a stage (ranks_shown.rank_grid): a cell a rank, node by local rank, coloured by its
    mean over the median rank's on one scale for all panels (red slower, blue faster); each panel's
    slowest rank boxed and named (`ranks`: the rank in each cell), so a straggler among 128 ranks
    shows at a glance."""
    values = np.concatenate([g.to_numpy(float).ravel() for g in grids.values()])
    values = values[np.isfinite(values)]
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(values.min(), 0.99), vmax=max(values.max(), 1.01))
    nodes, width = max(len(g.index) for g in grids.values()), max(len(g.columns) for g in grids.values())
    fig = Figure(figsize=(1.2 + 0.22 * width * len(grids) + 0.5 * len(grids), 2.2 + 0.2 * nodes), layout="constrained")
    axes = fig.subplots(1, len(grids), squeeze=False)[0]
    for ax, (name, grid) in zip(axes, grids.items()):
        image = ax.imshow(grid.to_numpy(float), cmap="RdBu_r", norm=norm, aspect="equal", interpolation="nearest")
        row, col = np.unravel_index(np.nanargmax(grid.to_numpy(float)), grid.shape)
        ax.add_patch(Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.5))
        slowest = int(ranks.loc[grid.index[row], grid.columns[col]])
        ax.set_title(f"{name}\nslowest: rank {slowest}, x{grid.iat[row, col]:.2f}", fontsize=8)
        ax.set_xticks(range(len(grid.columns)), [str(c) for c in grid.columns], fontsize=6)
        ax.set_yticks(range(len(grid.index)), [str(n) for n in grid.index], fontsize=6)
        ax.set_xlabel("local rank", fontsize=7)
    axes[0].set_ylabel("node", fontsize=7)
    fig.colorbar(image, ax=list(axes), shrink=0.8, label="rank's mean / median rank's")
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def plot_iteration_time(df: pd.DataFrame, path: Path, *, title: str = "") -> Path:
    """The iteration period over the run (start to the next start): each rank, and the job (slowest
    rank), with the job's timed window (iter_ms) beneath it; warm-up shaded. Runs without a period
    (a single iteration) plot iter_ms. Warm-up iterations far above the rest are clipped so the
    timed iterations' jitter stays visible."""
    ri = rank_iterations(df, warmup=True)
    job = job_iterations(df, warmup=True).sort_values("iteration")
    col = "period_ms" if ri["period_ms"].notna().any() else "iter_ms"
    fig = Figure(figsize=(10, 4.2), layout="constrained")
    ax = fig.add_subplot()
    ranks = sorted(ri["rank"].unique())
    for r in ranks:
        g = ri[ri["rank"] == r].sort_values("iteration")
        ax.plot(g["iteration"], g[col], linewidth=0.7, alpha=0.6, marker=".", markersize=3,
                label=f"rank {r}" if len(ranks) <= 8 else ("ranks" if r == ranks[0] else None))
    what = "period" if col == "period_ms" else "iter_ms"
    ax.plot(job["iteration"], job[col], color="black", linewidth=1.4, label=f"job {what} (slowest rank)")
    if col == "period_ms":
        ax.plot(job["iteration"], job["iter_ms"], color="tab:blue", linewidth=1.0, linestyle="--",
                label="job timed window (iter_ms)")
    warm = job.loc[job["warmup"], "iteration"]
    timed = job.loc[~job["warmup"], col].dropna()
    if len(warm):
        ax.axvspan(warm.min() - 0.5, warm.max() + 0.5, color="orange", alpha=0.15, label="warm-up (excluded)")
    if len(timed):
        ax.axhline(timed.median(), color="grey", linestyle=":", linewidth=0.8,
                   label=f"median {what} {timed.median():.4g} ms")
        # Zoom on the timed iterations (jitter is the point); warm-up peaks far above are clipped.
        shown = pd.concat([ri.loc[~ri["warmup"], c] for c in {col, "iter_ms"}]).dropna()
        lo, hi = shown.min(), shown.max()
        pad = max(hi - lo, 0.05 * hi)
        top = hi + pad
        peak = ri[col].max()
        if peak > top:
            ax.text(0.01, 0.97, f"y clipped: warm-up peaks up to {peak:.4g} ms",
                    transform=ax.transAxes, fontsize=8, va="top", color="dimgrey")
        ax.set_ylim(max(0.0, lo - pad), top)
    ax.set_xlabel("iteration")
    ax.set_ylabel("iteration period (ms)" if col == "period_ms" else "iteration time (ms)")
    ax.set_title(title or "Iteration period over the run")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_auc(evals: pd.DataFrame, path: Path, *, title: str = "", target: float | None = None) -> Path:
    """AUROC at each evaluation against the training samples seen (the target as a line)."""
    fig = Figure(figsize=(8, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(evals["trained_samples"], evals["auc"], marker="o", markersize=4, color="tab:blue", label="AUROC")
    if target is not None:
        ax.axhline(target, color="tab:red", linestyle="--", linewidth=0.9, label=f"target {target:g}")
    ax.set_xlabel("training samples seen")
    ax.set_ylabel("AUROC (held-out)")
    ax.set_title(title or "AUROC over training")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_waterfall(contrib: pd.DataFrame, base_ms: float, all_ms: float, path: Path, *, title: str = "") -> Path:
    """From the baseline's iteration time, each flag's time saved alone (inactive: n/a), the
    interaction left over, to everything on."""
    steps = [("baseline", base_ms, "total")]
    level = base_ms
    for _, r in contrib.iterrows():
        saved = r["alone_ms"]
        steps.append((f"+{r['flag']}", np.nan if pd.isna(saved) else -saved, "step"))
        level -= 0 if pd.isna(saved) else saved
    if not pd.isna(all_ms):
        steps.append(("interaction", all_ms - level, "step"))
        steps.append(("all flags", all_ms, "total"))
    fig = Figure(figsize=(max(7, 1.1 * len(steps)), 4.6), layout="constrained")
    ax = fig.add_subplot()
    cur, tops = 0.0, []
    for x, (label, val, kind) in enumerate(steps):
        if kind == "total":
            ax.bar(x, val, color="#4C72B0")
            tops.append(val)
            ax.text(x, val, f"{val:.3g}", ha="center", va="bottom", fontsize=8, clip_on=True)
            cur = val
        elif pd.isna(val):
            ax.plot([x - 0.4, x + 0.4], [cur, cur], color="grey", linestyle=":")
            tops.append(cur)
            ax.text(x, cur, "n/a\n(inactive)", ha="center", va="bottom", fontsize=7, color="grey", clip_on=True)
        else:
            ax.bar(x, val, bottom=cur, color="#55A868" if val <= 0 else "#C44E52")
            tops.append(max(cur, cur + val))
            ax.text(x, max(cur, cur + val), f"{val:+.3g}", ha="center", va="bottom", fontsize=8, clip_on=True)
            cur += val
    ax.set_xticks(range(len(steps)), [s[0] for s in steps], rotation=30, ha="right")
    ax.set_ylabel("mean iteration time (ms)")
    ax.set_title(title or "Ablation waterfall: baseline to all flags (green: faster)")
    ax.grid(axis="y", alpha=0.3)
    # Every bar (a step may climb above both totals) and its label above it stay inside the axes.
    ax.set_ylim(0, max(tops) * 1.18 if tops and max(tops) > 0 else 1)
    return _save(fig, path)


LANES = ("host", "compute", "comm")
"""The lanes of a projected rank (harness/projection/timeline.py): host thread, compute stream, comm stream."""


def plot_lanes(spans: pd.DataFrame, path: Path, *, title: str, period_ms: float) -> Path:
    """Gantt of one iteration as the projection's timeline runs it: a group of three thin lanes
    (host, compute, comm) per rank in `spans` (columns rank, lane, stage, start_ms, end_ms), bars
    coloured by stage, and a dotted line where the next iteration starts (`period_ms`)."""
    ranks = sorted(spans["rank"].unique())
    row = {r: i for i, r in enumerate(ranks)}
    fig = Figure(figsize=(11, 1.6 + 0.7 * len(ranks)), layout="constrained")
    ax = fig.add_subplot()
    step = len(LANES) + 1  # a blank lane between ranks keeps the groups apart
    for _, s in spans.iterrows():
        y = row[s["rank"]] * step + LANES.index(s["lane"])
        color = COLORS.get(s["stage"], BETWEEN_COLOR)
        ax.broken_barh([(s["start_ms"], s["end_ms"] - s["start_ms"])], (y - 0.4, 0.8), facecolors=color,
                       edgecolor="white", linewidth=0.3)
    ticks = [row[r] * step + i for r in ranks for i in range(len(LANES))]
    labels = [f"rank {r}  {lane}" if i == 0 else lane for r in ranks for i, lane in enumerate(LANES)]
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.set_ylim(len(ranks) * step - 1, -1)  # rank 0's host lane on top
    ax.axvline(period_ms, color="black", linestyle=":", linewidth=1.0)
    start = min(0.0, float(spans["start_ms"].min()) if len(spans) else 0.0)
    if start < 0:  # a host running ahead launches before the iteration starts: mark where it does
        ax.axvline(0, color="grey", linestyle="-", linewidth=0.8)
    end = max(period_ms, float(spans["end_ms"].max()) if len(spans) else 0.0)
    ax.set_xlim(start, end + 0.03 * (end - start) if end > start else start + 1)
    ax.set_xlabel("time since the iteration started (ms; grey line: its start, where the host launched before it)"
                  if start < 0 else "time since the iteration started (ms)")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    present = set(spans["stage"])
    handles = [Patch(color=COLORS[s], label=s) for s in STAGES if s in present]
    if BETWEEN_ITERATIONS in present:
        handles.append(Patch(color=BETWEEN_COLOR, label="between iterations"))
    handles.append(Line2D([], [], color="black", linestyle=":", label=f"next iteration starts ({period_ms:.3g} ms)"))
    fig.legend(handles=handles, ncols=min(len(handles), 4), fontsize=8, loc="outside lower center", frameon=False)
    return _save(fig, path)
