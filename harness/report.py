"""Turn one run folder (runs/<run_id>/) into a stage and iteration summary.

This is the read side of the run records: it only reads manifest.json and the
per-rank parquet parts, so a report can be made later, elsewhere, from copied
run folders. Warm-up records are read but never summarised.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

# The five stages of one iteration, in execution order (design.md, "The five stages").
from harness.stages import STAGES

STAGE_COLUMNS = ("run_id", "rank", "node", "iteration", "stage",
                 "start_ns", "end_ns", "duration_ms", "warmup")
ITERATION_COLUMNS = ("run_id", "rank", "node", "iteration", "start_ns", "end_ns",
                     "iter_ms", "loss", "samples", "warmup")
SUMMARY_COLUMNS = ("stage", "mean_ms", "p50_ms", "p90_ms", "count")


class ReportError(Exception):
    """A problem the user can fix; the message is one line meant to be printed as is."""


@dataclass(kw_only=True)
class Run:
    """Everything read from one run folder."""

    manifest: dict
    """manifest.json as written by the run; `run_id` is filled from the folder name if absent."""
    stages: pd.DataFrame
    """All stage records of all ranks and parts, warm-up rows included."""
    iterations: pd.DataFrame
    """All per-iteration records of all ranks and parts, warm-up rows included."""

    @property
    def run_id(self) -> str:
        return str(self.manifest["run_id"])


# --- finding and reading runs -------------------------------------------------

def _read_manifest(run_dir: Path) -> dict:
    path = run_dir / "manifest.json"
    if not path.is_file():
        raise ReportError(f"{path} is missing: {run_dir} is not a run folder "
                          "(or its run died before writing the manifest)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"cannot read {path}: {exc}") from exc
    if not isinstance(manifest, dict):
        raise ReportError(f"{path} does not hold a JSON object")
    return manifest


def _start_key(manifest: dict) -> datetime:
    # Parse rather than compare strings: runs started on hosts with different UTC
    # offsets must still order by real time. Naive times are taken as UTC.
    try:
        t = datetime.fromisoformat(str(manifest.get("start_time")))
    except ValueError:
        return datetime.min.replace(tzinfo=timezone.utc)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _runs_by_start(runs_root: Path) -> list[str]:
    """Run ids under runs_root, oldest first; folders without a readable manifest are skipped."""
    if not runs_root.is_dir():
        return []
    keyed = []
    for d in runs_root.iterdir():
        if not d.is_dir():
            continue
        try:
            keyed.append((_start_key(_read_manifest(d)), d.name))
        except ReportError:
            continue  # half-created or foreign folder: it cannot be ranked by start time
    return [name for _, name in sorted(keyed)]


def resolve_run(runs_root: Path, run: str) -> Path:
    """The folder of run id `run`, or of the most recently started run for "latest"."""
    runs_root = Path(runs_root)
    known = _runs_by_start(runs_root)
    if run == "latest":
        if not known:
            raise ReportError(f"no runs under {runs_root}/ yet; make one with `make bench`")
        return runs_root / known[-1]
    # Only a plain folder name is a run id; "..", "a/b" must not reach outside runs/.
    if Path(run).name == run and run not in (".", "..") and (runs_root / run).is_dir():
        return runs_root / run
    there = ", ".join(known) if known else "none (make one with `make bench`)"
    raise ReportError(f"no run '{run}' under {runs_root}/; runs there: {there}")


def _read_parts(run_dir: Path, pattern: str, columns: tuple[str, ...]) -> pd.DataFrame:
    frames = []
    for path in sorted(run_dir.glob(f"rank*/{pattern}")):
        try:
            df = pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises several types for a torn/corrupt file
            raise ReportError(f"cannot read {path}: {exc}") from exc
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise ReportError(f"{path} lacks column(s) {', '.join(missing)}")
        frames.append(df)
    if not frames:
        # A run that has not flushed a part yet: an empty frame lets the summaries
        # give the "no records" error instead of a KeyError.
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    df = pd.concat(frames, ignore_index=True)
    df["warmup"] = df["warmup"].astype(bool)
    return df


def load_run(run_dir: Path) -> Run:
    """Read the manifest and all parquet parts of all ranks; incomplete runs load too."""
    run_dir = Path(run_dir)
    manifest = _read_manifest(run_dir)
    manifest.setdefault("run_id", run_dir.name)
    stages = _read_parts(run_dir, "stages-*.parquet", STAGE_COLUMNS)
    unknown = sorted(set(stages["stage"]) - set(STAGES))
    if unknown:
        # Stage names are a contract with the writer; a report that silently dropped
        # records would mislead, so say which names are wrong.
        raise ReportError(f"run {manifest['run_id']}: unknown stage name(s) {', '.join(map(str, unknown))}; "
                          f"expected {', '.join(STAGES)}")
    iterations = _read_parts(run_dir, "iterations-*.parquet", ITERATION_COLUMNS)
    return Run(manifest=manifest, stages=stages, iterations=iterations)


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
    ws = run.manifest.get("world_size")
    return ws if isinstance(ws, int) and ws > 0 else int(run.iterations["rank"].nunique())


def iteration_summary(run: Run) -> dict:
    """Job-level iteration stats over non-warm-up iterations.

    Keys: iterations, warmup_iterations, partial_iterations, iter_ms_mean,
    iter_ms_p50, iter_ms_p90, samples_per_s.
    """
    its = run.iterations
    timed = its[~its["warmup"]]
    warmup_iterations = int(its.loc[its["warmup"], "iteration"].nunique()) if not its.empty else 0
    if timed.empty:
        raise ReportError(f"run {run.run_id} has no non-warm-up iterations recorded "
                          f"({warmup_iterations} warm-up iteration(s) excluded); run more "
                          "iterations than the warm-up count")
    # Ranks step together (collectives), so the job's iteration i takes as long as
    # its slowest rank: iter_ms of the job = max over ranks; samples = sum over ranks.
    per_iter = timed.groupby("iteration").agg(
        iter_ms=("iter_ms", "max"), samples=("samples", "sum"), ranks=("rank", "nunique"))
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
    samples_per_s = float(whole["samples"].sum() / (whole["iter_ms"].sum() / 1000.0))
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
    status = m.get("status")
    if status != "completed":
        # Incomplete runs are still reported (records before the stop are valid), but
        # the numbers must not be mistaken for a finished run's.
        word = "FAILED" if status == "failed" else f"INCOMPLETE (status {status})"
        # The error may be a whole traceback; its last line names the exception.
        error = (str(m.get("error") or "").strip().splitlines() or ["no error recorded"])[-1]
        lines.append(f"!! run {word}: {error}; numbers cover only the records written")
    return lines


def _iteration_line(its: dict) -> str:
    return (f"iteration: iter_ms mean {its['iter_ms_mean']:.3f}  p50 {its['iter_ms_p50']:.3f}  "
            f"p90 {its['iter_ms_p90']:.3f}  samples_per_s {its['samples_per_s']:.1f}")


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
    cols = [c for c in ("rank", "node", "host", "threads", "gemm_gflops", "peak_rss_gib") if c in ranks]
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
    parts = [*_header_lines(run, its), "", stage_text, "", _iteration_line(its)]
    ranks = rank_table(run)
    if not ranks.empty:
        parts += ["", _text_table(list(ranks.columns), _rank_cells(ranks))]
    return "\n".join(parts)


def write_report(run: Run, reports_root: Path) -> Path:
    """Write reports/<run_id>/summary.csv and summary.md; return that folder."""
    its = iteration_summary(run)
    table = pd.DataFrame(columns=list(SUMMARY_COLUMNS)) if _stages_off(run) else stage_summary(run)
    # The CSV is for machines and run comparisons: full precision, the job iteration
    # as one more row (its count is iterations, not records), throughput beside it.
    iteration_row = {"stage": "iteration", "mean_ms": its["iter_ms_mean"],
                     "p50_ms": its["iter_ms_p50"], "p90_ms": its["iter_ms_p90"],
                     "count": its["iterations"], "samples_per_s": its["samples_per_s"]}
    csv = pd.concat([table.assign(samples_per_s=float("nan")), pd.DataFrame([iteration_row])],
                    ignore_index=True)
    out = Path(reports_root) / run.run_id
    out.mkdir(parents=True, exist_ok=True)
    csv.to_csv(out / "summary.csv", index=False)

    it_header = ["iter_ms mean", "iter_ms p50", "iter_ms p90", "samples_per_s", "iterations"]
    it_row = [f"{its['iter_ms_mean']:.3f}", f"{its['iter_ms_p50']:.3f}",
              f"{its['iter_ms_p90']:.3f}", f"{its['samples_per_s']:.1f}", str(its["iterations"])]
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


def report_main(run: str, runs_root: Path, reports_root: Path) -> int:
    """Report one run: print the summary, write the files; 2 with one stderr line on a user error."""
    try:
        loaded = load_run(resolve_run(Path(runs_root), run))
        text = format_summary(loaded)
        print(text)
        out = write_report(loaded, Path(reports_root))
    except ReportError as exc:
        print(f"report: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out / 'summary.csv'}")
    print(f"wrote {out / 'summary.md'}")
    return 0
