"""Reports from run folders (runs/<run_id>/), ablations and nsys traces: the read side of the
run records. It reads only manifest.json and the per-rank parquet parts (or an nsys sqlite
export), so a report can be made later, elsewhere, from copied folders. Warm-up records are
read but never summarised.

Notebook API (all pandas, every table takes the frame of `load_runs`, a `Run` or a list of them):

    df = load_runs(["runs/<id1>", "runs/<id2>"])       # flat stage records + run/flag columns
    stage_stats(df, "job" | "rank" | "node")            # mean/p50/p90/p99 ms, share of iteration
    iteration_table(df, "job" | "rank" | "node")        # iter_ms stats, samples_per_s
    straggler_table(df); input_dist_overlap(df); completeness(df)
    roofline_table(load_run(path))                      # analytic FLOPs/bytes vs measured peaks
    ab = load_ablation(resolve_ablation(runs_root, id), runs_root)
    ablation_table(ab); flag_contributions(ab)
    read_nsys(path)                                     # an nsys sqlite export as a Run

`report_main` writes reports/<name>/ (report.md, report.html, CSVs, PNGs, summary.csv/.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from harness.report_ablation import (  # noqa: F401  (re-exported API)
    Ablation, ablation_table, bootstrap_mean_ci, flag_contributions, load_ablation, resolve_ablation,
)
from harness.report_load import (  # noqa: F401  (re-exported API)
    FLAGS, ITERATION_COLUMNS, STAGE_COLUMNS, ReportError, Run, load_run, load_runs, records, resolve_run,
)
from harness.report_roofline import roofline_table, stage_work  # noqa: F401
from harness.report_tables import (  # noqa: F401
    completeness, input_dist_overlap, input_dist_spans, iteration_table, job_iterations, stage_stats,
    straggler_table,
)
# The five stages of one iteration, in execution order (design.md, "The five stages").
from harness.stages import STAGES

SUMMARY_COLUMNS = ("stage", "mean_ms", "p50_ms", "p90_ms", "count")


# --- summaries ----------------------------------------------------------------

def _stats(values: pd.Series) -> dict:
    # pandas' linear-interpolation quantiles, the same as numpy.percentile's default.
    return {"mean_ms": float(values.mean()), "p50_ms": float(values.quantile(0.5)),
            "p90_ms": float(values.quantile(0.9)), "count": int(values.size)}


def stage_summary(run: Run) -> pd.DataFrame:
    """Per-stage duration stats over the non-warm-up records of all ranks, in STAGES order."""
    timed = run.stages[~run.stages["warmup"]]
    if timed.empty:
        raise ReportError(f"run {run.run_id} has no non-warm-up stage records "
                          f"({len(run.stages)} warm-up records); run more iterations "
                          "than the warm-up count")
    rows = [{"stage": s, **_stats(timed.loc[timed["stage"] == s, "duration_ms"])}
            for s in STAGES if (timed["stage"] == s).any()]
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


def _world_size(run: Run) -> int:
    """Ranks an iteration needs to count: world_size, or fewer when some ranks wrote no records at
    all (the header names them); otherwise one silent rank would leave nothing to report."""
    ws = run.manifest.get("world_size")
    seen = int(run.iterations["rank"].nunique())
    if not (isinstance(ws, int) and ws > 0):
        return seen
    return min(ws, seen) if seen else ws


def iteration_summary(run: Run) -> dict:
    """Job-level iteration stats over non-warm-up iterations.

    Keys: iterations, warmup_iterations, partial_iterations, iter_ms_mean,
    iter_ms_p50, iter_ms_p90, samples_per_s.
    """
    its = run.iterations
    timed = its[~its["warmup"]]
    warmup_iterations = int(its.loc[its["warmup"], "iteration"].nunique()) if not its.empty else 0
    if its.empty:
        raise ReportError(f"run {run.run_id} (status {run.manifest.get('status', '?')}) has no non-warm-up "
                          "iterations recorded: no iteration records at all yet (still running, or stopped "
                          "before its first flush)")
    if timed.empty:
        raise ReportError(f"run {run.run_id} has no non-warm-up iterations recorded "
                          f"({warmup_iterations} warm-up iteration(s) excluded); run more "
                          "iterations than the warm-up count")
    # Ranks step together (collectives), so the job's iteration i takes as long as
    # its slowest rank: iter_ms of the job = max over ranks; samples = sum over ranks.
    per_iter = timed.groupby("iteration").agg(
        iter_ms=("iter_ms", "max"), samples=("samples", lambda x: x.sum(min_count=1)), ranks=("rank", "nunique"))
    # An iteration that not every rank recorded (the last one of a failed or still
    # running job) would understate the max, so it is left out and counted instead.
    whole = per_iter[per_iter["ranks"] >= _world_size(run)]
    if whole.empty:
        raise ReportError(f"run {run.run_id} has no non-warm-up iterations recorded by all "
                          f"{_world_size(run)} rank(s) ({warmup_iterations} warm-up iteration(s) "
                          "excluded); run more iterations than the warm-up count")
    stats = _stats(whole["iter_ms"])
    # Throughput as total samples over total job time, not a mean of per-iteration
    # rates: a mean of rates would over-weight the fast iterations.
    # NaN when samples are unknown (an nsys trace).
    samples_per_s = float(whole["samples"].sum(min_count=1) / (whole["iter_ms"].sum() / 1000.0))
    return {"iterations": int(len(whole)),
            "warmup_iterations": warmup_iterations,
            "partial_iterations": int(len(per_iter) - len(whole)),
            "iter_ms_mean": stats["mean_ms"], "iter_ms_p50": stats["p50_ms"],
            "iter_ms_p90": stats["p90_ms"], "samples_per_s": samples_per_s}


# --- formatting ---------------------------------------------------------------

def _cells(table: pd.DataFrame) -> list[list[str]]:
    return [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row]
            for row in table.itertuples(index=False)]


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    # First column (a name) left-aligned, numbers right-aligned so digits line up.
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                              for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, rows)])


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    line = lambda r: "| " + " | ".join(r) + " |"
    align = ["---"] + ["---:"] * (len(header) - 1)
    return "\n".join([line(header), line(align), *map(line, rows)])


def _header_lines(run: Run, its: dict) -> list[str]:
    m = run.manifest
    lines = [
        f"run {run.run_id}  status {m.get('status', '?')}  preset {m.get('preset', '?')}  "
        f"device {m.get('device', '?')}",
        f"world size {m.get('world_size', '?')} ({m.get('nodes', '?')} node(s) x "
        f"{m.get('gpus_per_node', '?')} per node)",
        f"iterations: {its['iterations']} counted, {its['warmup_iterations']} warm-up excluded"
        + (f", {its['partial_iterations']} not recorded by every rank excluded"
           if its["partial_iterations"] else ""),
    ]
    if m.get("source"):
        lines.insert(1, f"source: {m['source']}")
    if m.get("engine", "harness") != "harness":  # older manifests predate engines: all were harness runs
        timed = ", ".join(m.get("timed_stages") or []) or "none"
        lines.insert(1, f"engine {m['engine']} (stages it times: {timed}; the others are not recorded)")
    status = m.get("status")
    if status != "completed":
        # Incomplete runs are still reported (records before the stop are valid), but
        # the numbers must not be mistaken for a finished run's.
        word = "FAILED" if status == "failed" else f"INCOMPLETE (status {status})"
        # The error may be a whole traceback; its last line names the exception.
        error = (str(m.get("error") or "").strip().splitlines() or ["no error recorded"])[-1]
        lines.append(f"!! run {word}: {error}; numbers cover only the records written")
    # Ranks or stages with no records: the tables would silently lack them, so say which.
    lines += [f"!! {note}" for note in completeness(run)]
    return lines


def _iteration_line(its: dict) -> str:
    return (f"iteration: iter_ms mean {its['iter_ms_mean']:.3f}  p50 {its['iter_ms_p50']:.3f}  "
            f"p90 {its['iter_ms_p90']:.3f}  samples_per_s {_rate(its['samples_per_s'])}")


def _rate(samples_per_s: float) -> str:
    return "n/a" if pd.isna(samples_per_s) else f"{samples_per_s:.1f}"


def _pipeline_line(run: Run) -> str:
    """Pipelined, an input_dist span runs from its launch (in the previous iteration) to its wait,
    so its duration includes what the compute hid; say what stayed exposed."""
    overlap = input_dist_overlap([run])
    row = overlap[overlap["rank"] == "all"]
    if row.empty:
        return "pipelined: no input_dist spans to measure"
    r = row.iloc[0]
    return (f"pipelined: input_dist spans launch (previous iteration) to wait; exposed {r['exposed_ms']:.3f} ms "
            f"a span, {100 * r['hidden_frac']:.1f}% hidden behind other stages")


def _stages_off(run: Run) -> bool:
    """The run was made without per-stage timing on purpose (it measures the timeline's cost)."""
    return run.stages.empty and run.manifest.get("config", {}).get("run", {}).get("timeline") is False


def rank_table(run: Run) -> pd.DataFrame:
    """Per rank: host, threads, measured GEMM rate, peak RSS, and the dense stage's achieved rate.

    dense_gflops = dense FLOPs of the rank's local batch (manifest: dense_flops_per_sample)
    over its median non-warm-up dense_fwd_bwd time; dense_vs_gemm is that over the plain
    torch.mm rate the same rank measured at start. The stage also holds the gradient
    all-reduce, so the fraction is a lower bound on the GEMMs' own efficiency.
    """
    ranks = pd.DataFrame(run.manifest.get("ranks") or [])
    if ranks.empty:
        return ranks
    cols = [c for c in ("rank", "node", "host", "threads", "gemm_gflops", "copy_gbps", "peak_rss_gib") if c in ranks]
    ranks = ranks[cols].sort_values("rank").reset_index(drop=True)
    flops = run.manifest.get("dense_flops_per_sample")
    dense = run.stages[(run.stages["stage"] == "dense_fwd_bwd") & ~run.stages["warmup"]]
    if flops and not dense.empty and "gemm_gflops" in ranks:
        p50 = dense.groupby("rank")["duration_ms"].median()
        samples = run.iterations[~run.iterations["warmup"]].groupby("rank")["samples"].median()
        ranks["dense_gflops"] = ranks["rank"].map(flops * samples / (p50 / 1e3) / 1e9)
        ranks["dense_vs_gemm"] = ranks["dense_gflops"] / ranks["gemm_gflops"]
    return ranks


def _rank_cells(ranks: pd.DataFrame) -> list[list[str]]:
    return [[f"{v:.2f}" if isinstance(v, float) else str(v) for v in row] for row in ranks.itertuples(index=False)]


def format_summary(run: Run) -> str:
    """Human-readable summary: header, stage table, iteration line, per-rank resources."""
    its = iteration_summary(run)
    if _stages_off(run):
        stage_text = "stages not timed (run with --no-timeline): iteration times only"
    else:
        stage_text = _text_table(list(SUMMARY_COLUMNS), _cells(stage_summary(run)))
    parts = [*_header_lines(run, its), "", stage_text]
    if run.manifest.get("pipeline") and not run.stages.empty:
        parts.append(_pipeline_line(run))
    parts += ["", _iteration_line(its)]
    ranks = rank_table(run)
    if not ranks.empty:
        parts += ["", _text_table(list(ranks.columns), _rank_cells(ranks))]
    return "\n".join(parts)


def write_report(run: Run, reports_root: Path, *, name: str | None = None) -> Path:
    """Write reports/<name>/summary.csv and summary.md (name: the run id by default); return that folder."""
    its = iteration_summary(run)
    table = pd.DataFrame(columns=list(SUMMARY_COLUMNS)) if _stages_off(run) else stage_summary(run)
    # The CSV is for machines and run comparisons: full precision, the job iteration
    # as one more row (its count is iterations, not records), throughput beside it.
    iteration_row = {"stage": "iteration", "mean_ms": its["iter_ms_mean"],
                     "p50_ms": its["iter_ms_p50"], "p90_ms": its["iter_ms_p90"],
                     "count": its["iterations"], "samples_per_s": its["samples_per_s"]}
    csv = pd.concat([table.assign(samples_per_s=float("nan")), pd.DataFrame([iteration_row])],
                    ignore_index=True)
    out = Path(reports_root) / (name or run.run_id)
    out.mkdir(parents=True, exist_ok=True)
    csv.to_csv(out / "summary.csv", index=False)

    it_header = ["iter_ms mean", "iter_ms p50", "iter_ms p90", "samples_per_s", "iterations"]
    it_row = [f"{its['iter_ms_mean']:.3f}", f"{its['iter_ms_p50']:.3f}",
              f"{its['iter_ms_p90']:.3f}", _rate(its["samples_per_s"]), str(its["iterations"])]
    md = "\n".join([
        f"# Run {run.run_id}", "",
        *[f"- {line}" for line in _header_lines(run, its)], "",
        "## Stages (non-warm-up records, all ranks; count = records)", "",
        _md_table(list(SUMMARY_COLUMNS), _cells(table)), "",
        "## Iterations (job time = slowest rank per iteration)", "",
        _md_table(it_header, [it_row]), "",
    ])
    ranks = rank_table(run)
    if not ranks.empty:
        ranks.to_csv(out / "ranks.csv", index=False)
        md += "\n".join(["", "## Ranks (dense_gflops: dense_fwd_bwd p50 rate; dense_vs_gemm: over torch.mm)", "",
                         _md_table(list(ranks.columns), _rank_cells(ranks)), ""])
    (out / "summary.md").write_text(md)
    return out


def _report_run(run: Run, reports_root: Path, name: str) -> list[Path]:
    from harness.report_build import run_report  # matplotlib loads only when a report is made

    its = iteration_summary(run)  # raises first when there is nothing to report
    text = format_summary(run)
    out = Path(reports_root) / name
    written = run_report(run, out, header=_header_lines(run, its))
    write_report(run, reports_root, name=name)
    print(text)
    extra = [out / "ranks.csv"] if (out / "ranks.csv").is_file() else []
    return [out / "summary.csv", out / "summary.md", *written, *extra]


def _report_ablation(ablation: str, runs_root: Path, reports_root: Path) -> list[Path]:
    from harness.report_build import ablation_report
    from harness.report_html import cells

    ab = load_ablation(resolve_ablation(runs_root, ablation), runs_root)
    out = Path(reports_root) / f"ablation-{ab.ablation_id}"
    written, table = ablation_report(ab, out)
    cols = ["config", "runs", "iterations", "iter_ms", "ci_low", "ci_high", "speedup"]
    print(f"ablation {ab.ablation_id}  status {ab.manifest.get('status', '?')}")
    # Notes are long sentences: printed under the table, numbered, so the columns stay narrow.
    noted = table.assign(config=[f"{c} [{i}]" if n else c for i, (c, n) in enumerate(zip(table["config"], table["note"]), 1)])
    print(_text_table(*cells(noted[cols])))
    for i, note in enumerate(table["note"], 1):
        if note:
            print(f"[{i}] {note}")
    return written


def report_main(run: str | None = None, runs_root: Path = Path("runs"), reports_root: Path = Path("reports"), *,
                ablation: str | None = None, nsys: str | Path | None = None) -> int:
    """Report one run (id or "latest"), one ablation (id or "latest", under runs_root/ablations/) or
    one nsys sqlite export: print a summary, write reports/<run_id | ablation-<id> | nsys-<stem>>/.
    Exactly one of run, ablation, nsys. Returns 0, or 2 with one stderr line on a user error
    (then nothing is written)."""
    try:
        given = [k for k, v in (("run", run), ("ablation", ablation), ("nsys", nsys)) if v is not None]
        if len(given) != 1:
            raise ReportError(f"give exactly one of --run, --ablation, --nsys (got {' and '.join(given) or 'none'})")
        runs_root, reports_root = Path(runs_root), Path(reports_root)
        if run is not None:
            loaded = load_run(resolve_run(runs_root, run))
            written = _report_run(loaded, reports_root, loaded.run_id)
        elif nsys is not None:
            from harness.report_nsys import read_nsys

            written = _report_run(read_nsys(Path(nsys)), reports_root, f"nsys-{Path(nsys).stem}")
        else:
            written = _report_ablation(str(ablation), runs_root, reports_root)
    except ReportError as exc:
        print(f"report: error: {exc}", file=sys.stderr)
        return 2
    main = [p for p in written if p.name in ("summary.csv", "summary.md", "report.md", "report.html")]
    for path in main:
        print(f"wrote {path}")
    print(f"wrote {len(written) - len(main)} more file(s) (CSVs, PNGs) in {written[0].parent}")
    return 0
