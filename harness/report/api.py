"""Reports from run folders (runs/<run_id>/), ablations and nsys traces: the read side of the
run records. It reads only manifest.json and the per-rank parquet parts (or an nsys sqlite
export), so a report can be made later, elsewhere, from copied folders. Warm-up records are
read but never summarised.

Notebook API (all pandas, every table takes the frame of `load_runs`, a `Run` or a list of them):

    df = load_runs(["runs/<id1>", "runs/<id2>"])       # flat stage records + run/flag columns
    stage_stats(df, "job" | "rank" | "node")            # mean/p50/p90/p99 ms, share of the period
    iteration_table(df, "job" | "rank" | "node")        # period and iter_ms stats, samples_per_s
    straggler_table(df); input_dist_overlap(df); completeness(df)
    roofline_table(load_run(path))                      # analytic FLOPs/bytes vs measured peaks
    shown_ranks(load_run(path))                         # past 16 ranks, those that bound the run (why)
    ab = load_ablation(resolve_ablation(runs_root, id), runs_root)
    ablation_table(ab); flag_contributions(ab)
    read_nsys(path)                                     # an nsys sqlite export as a Run

    compare_runs({"base": [run_a], "cand": [run_b]})        # two runs side by side, ratios with CIs

`report_main` writes reports/<name>/ (report.md, report.html, CSVs, PNGs), findings first.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pandas as pd

from harness.report.ablation import (  # noqa: F401  (re-exported API)
    Ablation, ablation_table, bootstrap_mean_ci, flag_contributions, load_ablation, resolve_ablation,
)
from harness.report.load import (  # noqa: F401  (re-exported API)
    FLAGS, ITERATION_COLUMNS, STAGE_COLUMNS, ReportError, Run, load_run, load_runs, records, resolve_run,
    run_error, run_status,
)
from harness.report.compare import Comparison, compare_runs, stages_absent  # noqa: F401
from harness.report.findings import between_line
from harness.report.html import cells
from harness.report.ranks_shown import RANK_ROWS, left_out, only_shown, shown_ranks
from harness.report.roofline import roofline_table, stage_work  # noqa: F401
from harness.report.tables import (  # noqa: F401
    between_parts, completeness, critical_stage_means, critical_stages, input_dist_overlap,
    input_dist_spans, iteration_table, evaluation, evaluation_lines, job_iterations, rank_table, splits_exchanged,
    stage_stats, straggler_table, subspan_table,
)
# The five stages of one iteration, in execution order (design.md, "The five stages").
from harness.names import STAGES  # noqa: F401

# The stage table the terminal summary prints (stage_stats' columns, fewer of them).
SUMMARY_COLUMNS = ("stage", "mean_ms", "p50_ms", "p90_ms", "count", "share", "span_ms")


def iteration_summary(run: Run) -> dict:
    """Job-level iteration stats over non-warm-up iterations every rank recorded (job_iterations).

    Keys: iterations, warmup_iterations, partial_iterations; periods (iterations with a period),
    period_ms_mean, period_ms_p50, period_ms_p90, between_ms_mean (the iteration as a benchmark
    times it: start to the next start, and the gap after the timed window; NaN without a period);
    iter_ms_mean, iter_ms_p50, iter_ms_p90 (the timed window); samples_per_s (over the summed
    periods). Raises ReportError (one line) when there is no such iteration.
    """
    its = job_iterations(run, warmup=True)
    if its.empty:
        raise ReportError(f"run {run.run_id} (status {run.status}) has no non-warm-up "
                          "iterations recorded: no iteration records at all yet (still running, or stopped "
                          "before its first flush)")
    warmup_iterations = int(its["warmup"].sum())
    timed = its[~its["warmup"]]
    if timed.empty:
        raise ReportError(f"run {run.run_id} has no non-warm-up iterations recorded "
                          f"({warmup_iterations} warm-up iteration(s) excluded); run more "
                          "iterations than the warm-up count")
    if not timed["complete"].any():
        raise ReportError(f"run {run.run_id} has no non-warm-up iterations recorded by all ranks "
                          f"({warmup_iterations} warm-up iteration(s) excluded); run more iterations than the "
                          "warm-up count")
    row = iteration_table(run, "job").iloc[0]
    figures = ("period_ms_mean", "period_ms_p50", "period_ms_p90", "between_ms_mean", "iter_ms_mean", "iter_ms_p50",
               "iter_ms_p90", "samples_per_s")
    return {"iterations": int(row["iterations"]), "warmup_iterations": warmup_iterations,
            "partial_iterations": int(row["partial"]), "periods": int(row["periods"]),
            **{k: float(row[k]) for k in figures}}


# --- the terminal summary ---------------------------------------------------------

def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    # First column (a name) left-aligned, numbers right-aligned so digits line up.
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                              for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, rows)])


def _header_lines(run: Run, its: dict) -> list[str]:
    m = run.manifest
    lines = [
        f"run {run.run_id}  status {run.status}  preset {m.config.run.preset if m else '?'}  "
        f"device {m.device if m else 'nsys trace'}",
        f"world size {run.world_size or '?'} ({m.nodes if m else '?'} node(s) x "
        f"{m.config.run.gpus_per_node if m else '?'} per node)",
        f"iterations: {its['iterations']} counted, {its['warmup_iterations']} warm-up excluded"
        + (f", {its['partial_iterations']} not recorded by every rank excluded"
           if its["partial_iterations"] else ""),
    ]
    if run.source:
        lines.insert(1, f"source: {run.source}")
    if m and m.engine != "harness":
        timed = ", ".join(m.timed_stages) or "none"
        lines.insert(1, f"engine {m.engine} (stages it times: {timed}; the others are not recorded)")
    status = run_status(run)
    if status != "completed":
        # Incomplete runs are still reported (records before the stop are valid), but
        # the numbers must not be mistaken for a finished run's.
        word = ("FAILED" if status == "failed" else
                "DID NOT FINISH (status running: still going, or its launcher was killed before closing it)"
                if status == "running" else f"INCOMPLETE (status {status})")
        error = run_error(run) or "no error recorded"
        lines.append(f"!! run {word}: {error}; numbers cover only the records written")
    # Ranks or stages with no records: the tables would silently lack them, so say which.
    lines += [f"!! {note}" for note in completeness(run)]
    lines += [f"!! left out an unreadable records part: {note}" for note in run.unreadable]
    return lines


def _iteration_line(its: dict) -> str:
    """The period first (what a user waits for an iteration), then the timed window inside it."""
    window = (f"timed window iter_ms mean {its['iter_ms_mean']:.3f}  p50 {its['iter_ms_p50']:.3f}  "
              f"p90 {its['iter_ms_p90']:.3f}")
    if not its["periods"]:
        return (f"iteration: period n/a (no timed iteration is followed by another: the last of a run has no "
                f"period)  samples_per_s n/a  ({window})")
    return (f"iteration: period mean {its['period_ms_mean']:.3f}  p50 {its['period_ms_p50']:.3f}  "
            f"p90 {its['period_ms_p90']:.3f}  samples_per_s {_rate(its['samples_per_s'])}  ({window}; "
            f"between iterations, slowest rank, mean {its['between_ms_mean']:.3f})")


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
    return (f"pipelined: an input_dist span (launch, in the previous iteration, to wait) {r['input_dist_ms']:.3f} ms: "
            f"{r['hidden_ms']:.3f} hidden behind other stages, {r['critical_ms']:.3f} exposed in the iteration (its row "
            f"above), the other {r['exposed_ms'] - r['critical_ms']:.3f} between iterations or already waited for")


def untimed_line(run: Run, stats: pd.DataFrame, its: dict) -> str | None:
    """The part of the period the stage table leaves: inside the iteration, outside every timed
    stage (a whole engine's loop where it times only some stages). None when under 1%."""
    top = stats[~stats["stage"].str.contains("/", regex=False)]
    rest = 1.0 - float(top["share"].sum())
    if not its["periods"] or not rest >= 0.01:
        return None
    m = run.manifest
    what = (f"not broken down: engine {m.engine} times only {', '.join(m.timed_stages) or 'no stage'}"
            if m and tuple(m.timed_stages) != STAGES else "host work and waits between the timed stages")
    return (f"in the iteration, outside every timed stage: {rest * its['period_ms_mean']:.3f} ms a period "
            f"({100 * rest:.1f}%), {what}")


def _stages_off(run: Run) -> bool:
    """The run was made without per-stage timing on purpose (it measures the timeline's cost)."""
    return run.stages.empty and run.manifest is not None and not run.manifest.config.run.timeline


def format_summary(run: Run, rank_rows: int | None = RANK_ROWS) -> str:
    """What `make bench` prints at the end and `make report` prints: header, stage table, iteration
    line, per-rank resources (the full report is report.md / report.html): past `rank_rows` ranks,
    only those that bound the run (ranks_shown.py; None: every rank)."""
    its = iteration_summary(run)
    if _stages_off(run):
        stage_text = "stages not timed (run with --no-timeline): iteration times only"
    else:
        stats = stage_stats(run, "job")
        stage_text = _text_table(*cells(stats[list(SUMMARY_COLUMNS)]))
    parts = [*_header_lines(run, its), "", stage_text]
    if not _stages_off(run) and not run.stages.empty:
        parts += [line for line in [between_line(run), untimed_line(run, stats, its)] if line]
    if run.manifest and run.manifest.optimizations.pipeline and "input_dist" in set(run.stages["stage"]):
        parts.append(_pipeline_line(run))
    subs = subspan_table(run)
    subs = subs[subs["stage"].isin(STAGES)]  # what runs between iterations is in the stage table
    if not subs.empty:
        parts += ["", "inside the stages:", _text_table(*cells(subs))]
    parts += ["", _iteration_line(its)]
    _, ev = evaluation(run)
    if ev:
        target = run.manifest.config.evaluation.target_auc if run.manifest is not None else None
        parts.append("evaluation: " + "; ".join(evaluation_lines(ev, target)))
    ranks = rank_table(run)
    if not ranks.empty:
        shown = shown_ranks(run, rank_rows)
        ranks = only_shown(ranks, shown)
        # Sentences (why a rank is listed, a probe's defect) go under the table, not in a column of it.
        notes = ranks.pop("peak_note") if "peak_note" in ranks else pd.Series(dtype=str)
        parts += ["", _text_table(*cells(ranks))]
        if left_out(shown):
            parts.append(f"{len(shown)} of {shown.attrs['ranks']} ranks listed, those that bound the run; every rank "
                         "in the report's ranks.csv (make report):")
            parts += [f"rank {r}: {w}" for r, w in zip(shown["rank"], shown["why"])]
        parts += [f"rank {r}: {n}" for r, n in zip(ranks["rank"], notes) if n]
    return "\n".join(parts)


SOURCE_FILE = "source.txt"
"""In every report folder: what it was made from (a run folder, an ablation, a trace), so a report
of something else with the same name never overwrites it."""


def claim_report_folder(out: Path, source: Path | str) -> Path:
    """`out`, or when `out` holds the report of something else (a copied run folder keeps its run
    id), the first free `out-2`, `out-3`, ... (said on stderr). The claim is written at once."""
    source = str(Path(source).resolve()) if isinstance(source, Path) else source
    candidate, n = out, 1
    while (candidate / SOURCE_FILE).exists() and (candidate / SOURCE_FILE).read_text().strip() != source \
            or (candidate.exists() and not (candidate / SOURCE_FILE).exists() and any(candidate.iterdir())):
        n += 1
        candidate = out.with_name(f"{out.name}-{n}")
    if candidate != out:
        print(f"report: {out} holds the report of something else; writing {candidate}", file=sys.stderr)
    candidate.mkdir(parents=True, exist_ok=True)
    (candidate / SOURCE_FILE).write_text(source + "\n")
    return candidate


def _report_run(run: Run, reports_root: Path, name: str, source: Path | str, rank_rows: int | None) -> list[Path]:
    from harness.report.build import run_report  # matplotlib loads only when a report is made

    its = iteration_summary(run)  # raises first when there is nothing to report
    text = format_summary(run, rank_rows)
    out = claim_report_folder(Path(reports_root) / name, source)
    written = run_report(run, out, header=_header_lines(run, its),
                         run_dir=source if isinstance(source, Path) else None, rank_rows=rank_rows)
    print(text)
    return written


def write_compare_report(groups: dict[str, list[Path]], out_dir: Path) -> Comparison:
    """Load the run folders of each label, compare them, and write out_dir/report.md, report.html,
    compare_iterations.csv, compare_stages.csv and plots, findings first. Returns the comparison."""
    from harness.report.build import compare_report  # matplotlib loads only when a report is written

    loaded = {label: [load_run(Path(p)) for p in paths] for label, paths in groups.items()}
    comparison = compare_runs(loaded)
    compare_report(loaded, comparison, Path(out_dir), absent=stages_absent(loaded))
    return comparison


def _report_ablation(ablation: str, runs_root: Path, reports_root: Path) -> list[Path]:
    from harness.report.build import ablation_report

    ab = load_ablation(resolve_ablation(runs_root, ablation), runs_root)
    out = claim_report_folder(Path(reports_root) / f"ablation-{ab.ablation_id}", resolve_ablation(runs_root, ablation))
    written, table = ablation_report(ab, out)
    cols = ["config", "runs", "iterations", "period_ms", "ci_low", "ci_high", "speedup"]
    print(f"ablation {ab.ablation_id}  status {ab.manifest.get('status', '?')}")
    # Notes are long sentences: printed under the table, numbered, so the columns stay narrow.
    noted = table.assign(config=[f"{c} [{i}]" if n else c for i, (c, n) in enumerate(zip(table["config"], table["note"]), 1)])
    print(_text_table(*cells(noted[cols])))
    for i, note in enumerate(table["note"], 1):
        if note:
            print(f"[{i}] {note}")
    return written


def _report_compare(spec: str, runs_root: Path, reports_root: Path) -> list[Path]:
    """RUN=a,b: run a (the baseline) and run b side by side (either may be "latest")."""
    ids = [x.strip() for x in spec.split(",")]
    if len(ids) != 2 or not all(ids):
        raise ReportError(f"--run {spec!r}: give one run id, or two separated by a comma (baseline,candidate)")
    dirs = [resolve_run(runs_root, x) for x in ids]
    if dirs[0] == dirs[1]:
        raise ReportError(f"--run {spec!r} names the same run twice; give two different runs")
    from harness.report.build import compare_report

    # Loaded and compared first: a run that cannot be compared is refused before a folder is claimed.
    loaded = {d.name: [load_run(d)] for d in dirs}
    c = compare_runs(loaded)
    out = claim_report_folder(Path(reports_root) / f"compare-{dirs[0].name}-vs-{dirs[1].name}",
                              " vs ".join(str(d.resolve()) for d in dirs))
    compare_report(loaded, c, out, absent=stages_absent(loaded))
    it = c.period_ms.set_index("label")
    print(f"compare {c.labels[1]} vs {c.labels[0]}: iteration period {it['mean'].iloc[1]:.4g} vs "
          f"{it['mean'].iloc[0]:.4g} ms, ratio {c.ratio:.3f} (95% CI {c.ratio_ci[0]:.3f}-{c.ratio_ci[1]:.3f})")
    print(_text_table(*cells(c.stages[["stage", "baseline_ms", "candidate_ms", "delta_ms", "ratio", "ratio_low",
                                       "ratio_high"]])))
    return sorted(p for p in out.iterdir() if p.name != SOURCE_FILE)


def report_main(run: str | None = None, runs_root: Path = Path("runs"), reports_root: Path = Path("reports"), *,
                ablation: str | None = None, nsys: str | Path | None = None, all_ranks: bool = False) -> int:
    """Report one run (id or "latest"), two runs side by side ("a,b": a is the baseline), one
    ablation (id or "latest", under runs_root/ablations/) or one nsys sqlite export: print a
    summary, write reports/<run_id | compare-<a>-vs-<b> | ablation-<id> | nsys-<stem>>/.
    Exactly one of run, ablation, nsys. all_ranks: a run's per-rank tables and plots list every
    rank, however many (by default past RANK_ROWS the ranks that bound it). Returns 0, or 2 with
    one stderr line on a user error (then nothing is written)."""
    rank_rows = None if all_ranks else RANK_ROWS
    try:
        given = [k for k, v in (("run", run), ("ablation", ablation), ("nsys", nsys)) if v is not None]
        if len(given) != 1:
            raise ReportError(f"give exactly one of --run, --ablation, --nsys (got {' and '.join(given) or 'none'})")
        runs_root, reports_root = Path(runs_root), Path(reports_root)
        if all_ranks and (ablation is not None or "," in (run or "")):
            raise ReportError("--all-ranks lists every rank of a run's report; a comparison's or an ablation's "
                              "report has no per-rank table")
        if run is not None and "," in run:
            written = _report_compare(run, runs_root, reports_root)
        elif run is not None:
            run_dir = resolve_run(runs_root, run)
            loaded = load_run(run_dir)
            written = _report_run(loaded, reports_root, loaded.run_id, run_dir, rank_rows)
        elif nsys is not None:
            from harness.report.nsys import read_nsys

            written = _report_run(read_nsys(Path(nsys)), reports_root, f"nsys-{Path(nsys).stem}", Path(nsys),
                                  rank_rows)
        else:
            written = _report_ablation(str(ablation), runs_root, reports_root)
    except ReportError as exc:
        print(f"report: error: {exc}", file=sys.stderr)
        return 2
    main = [p for p in written if p.name in ("report.md", "report.html")]
    for path in main:
        print(f"wrote {path}")
    print(f"wrote {len(written) - len(main)} more file(s) (CSVs, PNGs) in {written[0].parent}")
    return 0
