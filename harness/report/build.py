"""Assemble and write a whole report folder: reports/<name>/ with report.md, report.html, CSVs, PNGs.

Everything is computed before the folder is made, so a report that cannot be made leaves
nothing behind.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.report import ablation as abl
from harness.report import plots
from harness.report import findings
from harness.report import profile_trace
from harness.report import tables
from harness.report.compare import Comparison, breakdowns
from harness.report.html import Doc
from harness.report.load import FLAGS, ReportError, Run, records, run_pipelined
from harness.report.ranks_shown import RANK_ROWS, left_out, only_shown, rank_grid, shown_line, shown_ranks
from harness.report.roofline import roofline_table
from harness.names import BETWEEN_ITERATIONS, STAGES

MAX_TIMELINE_ITERS = 3


def _drop_run_id(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=[c for c in ("run_id",) if c in df.columns])


def optimizations_table(run: Run) -> pd.DataFrame | None:
    """requested / effective / inactive reason / note per flag, from the manifest; None without one (a trace)."""
    if run.manifest is None:
        return None
    opts = run.manifest.optimizations
    return pd.DataFrame([{"flag": f, "requested": opts.requested[f], "effective": opts.effective[f],
                          "inactive_reason": opts.inactive_reasons.get(f, ""), "note": opts.notes.get(f, "")}
                         for f in FLAGS])


def _node_hosts(run: Run) -> dict[int, str]:
    """Node -> the host its ranks noted (rank.json); two names would mean ranks of one node ran on
    two hosts, which is then shown, not hidden. Empty without a manifest (an nsys trace)."""
    if run.manifest is None:
        return {}
    seen: dict[int, set[str]] = {}
    for r in run.manifest.ranks:
        seen.setdefault(r.node, set()).add(r.host)
    return {node: ",".join(sorted(names)) for node, names in seen.items()}


def _with_hosts(table: pd.DataFrame, hosts: dict[int, str]) -> pd.DataFrame:
    """A per-node table with a host column after node."""
    out = table.copy()
    out.insert(out.columns.get_loc("node") + 1, "host", [hosts.get(n, "") for n in out["node"]])
    return out


def run_report(run: Run, out: Path, *, header: list[str], run_dir: Path | None = None,
               rank_rows: int | None = RANK_ROWS) -> list[Path]:
    """Write the full report of one run (or nsys trace) into `out`; return the files written.

    header: the summary's header lines (status, world size, iteration counts, failure); run_dir:
    the run folder, for its --profile traces (None: an nsys export, or a caller with no folder);
    rank_rows: past this many ranks the per-rank tables and plots show the ranks that bound the run
    (ranks_shown.py; None: every rank), the CSVs every rank.
    """
    df = records(run)
    shown = shown_ranks(run, rank_rows)
    doc = Doc(f"Run {run.run_id}")
    csvs: dict[str, pd.DataFrame] = {}
    pngs: list = []
    traced = profile_trace.read_run(run_dir)
    doc.findings(findings.run_findings(run, _roofline_or_none(run)) + traced.findings())
    # "!! " lines (failed or incomplete run, ranks or stages without records) become warnings.
    for line in header:
        if line.startswith("!! "):
            doc.warn(line[3:])
    doc.h2("Setup")
    doc.bullets([line for line in header if not line.startswith("!! ")])
    if left_out(shown):
        doc.h2("Ranks listed")
        doc.p(f"{shown.attrs['ranks']} ranks: the per-rank tables and plots list {len(shown)}, the first rank and "
              "the ranks at the run's extremes, for the reasons below; the CSVs hold every rank (`harness report "
              "--all-ranks` lists them all).")
        doc.table(shown)
    hosts = _node_hosts(run) if df["node"].nunique() > 1 else None
    _iterations(df, hosts, doc, csvs, shown)
    if tables.timed_stages(df).empty:
        doc.h2("Stages")
        doc.p("No stage records (a run made with --no-timeline, or none flushed): iteration times only.")
    else:
        _stage_tables(run, hosts, doc, csvs, shown)
        _exchanges(run, df, doc, csvs, shown)
        _roofline(run, doc, csvs)
        _stage_plots(run, df, csvs, pngs, shown)
    profile_trace.add_section(doc, csvs, traced)
    _run_details(run, doc, csvs, shown)
    pngs.append((plots.plot_iteration_time, (df,), dict(title=f"Iteration period, run {run.run_id}"),
                 "iteration_time.png", "Iteration period over the run, with the timed window beneath it (warm-up "
                 "shaded)"))
    _evaluation(run, doc, csvs, pngs)
    return _write(out, doc, csvs, pngs)


def _listed(doc: Doc, table: pd.DataFrame, shown: pd.DataFrame, where: str, *, lead: str = "",
            index: bool = False) -> None:
    """A per-rank table, its rows the shown ranks', under a line saying so where some are left out."""
    line = shown_line(shown, where)
    if lead or line:
        doc.p(" ".join(x for x in (lead, line) if x))
    doc.table(only_shown(table, shown), index=index)


def _iterations(df: pd.DataFrame, hosts: dict[int, str] | None, doc: Doc, csvs: dict, shown: pd.DataFrame) -> None:
    """Job, node (hosts: a multi-node run's, else None) and rank iteration tables."""
    doc.h2("Iterations")
    doc.p("An iteration's time is its period: from its start to the next iteration's start (the last iteration of "
          "a run, and one followed by an evaluation, have none); iter_ms is the timed window inside it, and "
          "between_ms the gap from the window's end to the next start. Job iteration = slowest rank (ranks step "
          "together); only iterations every rank recorded count. samples_per_s = the samples of the iterations "
          "with a period over their summed periods (the timed wall time).")
    it_job, it_rank = tables.iteration_table(df, "job"), tables.iteration_table(df, "rank")
    doc.table(_drop_run_id(it_job))
    scopes = [it_job.assign(scope="job"), it_rank.assign(scope="rank")]
    if hosts is not None:
        it_node = _with_hosts(tables.iteration_table(df, "node"), hosts)
        doc.p("Per node (node iteration = its slowest rank), with the host each node's ranks ran on:")
        doc.table(_drop_run_id(it_node))
        scopes.append(it_node.assign(scope="node"))
    _listed(doc, _drop_run_id(it_rank), shown, "iteration_stats.csv", lead="Per rank:")
    csvs["iteration_stats"] = pd.concat(scopes, ignore_index=True)
    csvs["iterations"] = tables.job_iterations(df, warmup=True)


def _stage_tables(run: Run, hosts: dict[int, str] | None, doc: Doc, csvs: dict, shown: pd.DataFrame) -> None:
    """Stage stats over all ranks, per rank and (hosts: a multi-node run's, else None) per node."""
    st_job, st_rank = tables.stage_stats(run, "job"), tables.stage_stats(run, "rank")
    csvs["stages"], csvs["stages_by_rank"] = st_job, st_rank
    doc.h2("Stages, all ranks")
    doc.p("ms a rank of non-warm-up records, on the critical path: a stage's duration, but input_dist's exposed "
          "part inside the iteration (span_ms: its whole span, launch to wait). between_iterations: the gap from "
          "an iteration's end to the next one's start; rows between_iterations/<part> split it by what ran there "
          "(other: what they leave) and are not added to it again. share = time over the iteration period, both "
          "summed over the iterations that have a period, so the stages and between_iterations sum to at most "
          "about 100%; the rest ran inside the iteration outside every timed stage.")
    doc.table(_drop_run_id(st_job))
    line = findings.between_line(run)
    if line:
        doc.p(line)
    doc.h2("Stages per rank (mean ms)")
    _listed(doc, tables.stage_pivot(st_rank, "rank"), shown, "stages_by_rank.csv", index=True)
    if hosts is not None:
        st_node = tables.stage_stats(run, "node")
        csvs["stages_by_node"] = st_node
        doc.h2("Stages per node (mean ms)")
        pivot = tables.stage_pivot(st_node, "node")
        pivot.insert(0, "host", [hosts.get(n, "") for n in pivot.index])
        doc.table(pivot, index=True)


def _exchanges(run: Run, df: pd.DataFrame, doc: Doc, csvs: dict, shown: pd.DataFrame) -> None:
    """What the ranks sent each other, who straggled, and how much input_dist the pipeline hid."""
    one_rank = df["rank"].nunique() < 2 and (run.world_size or 1) < 2
    moved = tables.bytes_moved_table(run.stages)
    if one_rank:
        doc.h2("Bytes moved")
        doc.p("One rank: nothing crossed a link (no collective had another rank to send to).")
    elif not moved.empty:
        csvs["bytes_moved"] = moved
        doc.h2("Bytes moved")
        doc.p("What each rank's collectives sent to and received from other ranks an iteration, by the stage "
              "each exchange belongs to (counted at launch; collectives the library runs its own way counted as "
              "a ring moves them), and the rate over the stage's time: for a stage that overlaps other work "
              "that rate is a floor of the link's.")
        doc.table(moved)
    doc.h2("Stragglers")
    if one_rank:
        doc.p("One rank: there is no other rank to straggle against.")
    else:
        strag = tables.straggler_table(df)
        csvs["stragglers"] = strag
        doc.p("Per stage, the rank with the largest mean time and its gap to the median rank's mean. "
              "Ranks wait for each other inside collectives, so look at compute-heavy stages first.")
        doc.table(_drop_run_id(strag))
    overlap = tables.input_dist_overlap(df)
    if overlap.empty:
        return
    csvs["input_dist_overlap"] = overlap
    doc.h2("Input distribution hidden by the pipeline")
    pipe = run_pipelined(run)
    doc.p(f"pipeline: {'on' if pipe else 'off' if pipe is False else 'not recorded'}. input_dist_ms = a span from "
          "its launch to its wait; hidden = its time while the same rank ran other stages (from start/end times); "
          "exposed = the rest, of which critical_ms lay inside the iteration (the stage tables' input_dist) and "
          "the remainder between iterations (counted in between_iterations) or in a wait an earlier span "
          "already counted.")
    _listed(doc, _drop_run_id(overlap), shown, "input_dist_overlap.csv")


def _stage_plots(run: Run, df: pd.DataFrame, csvs: dict, pngs: list, shown: pd.DataFrame) -> None:
    """The critical-path stage bars per rank and the timeline of a few iterations, of the shown ranks;
    past RANK_ROWS ranks, every rank against the median one in a grid."""
    critical = critical_all = tables.critical_stage_means(run, "rank")
    csvs["critical_path_by_rank"] = critical.reset_index()
    partial = run.manifest is not None and tuple(run.manifest.timed_stages) != STAGES
    between = run.subspans[run.subspans["stage"] == BETWEEN_ITERATIONS] if not run.subspans.empty else None
    of, listed = "", ""
    if left_out(shown):
        keep = set(shown["rank"])
        critical, df = critical[critical.index.isin(keep)], df[df["rank"].isin(keep)]
        between = between[between["rank"].isin(keep)] if between is not None else None
        of, listed = f", {len(keep)} of {shown.attrs['ranks']} ranks", "; the ranks in Ranks listed"
    pngs.append((plots.plot_stage_bars, (critical,),
                 dict(title=f"Iteration period per rank, run {run.run_id}{of}", row_label="rank",
                      not_broken_down=list(critical.index) if partial else []),
                 "stage_bars.png", "Mean iteration period per rank, broken down: the stages on the critical path "
                 "(input_dist: its exposed part), then what runs between iterations; the bar ends at the measured "
                 f"mean period{listed}"))
    if shown.attrs["ranks"] > RANK_ROWS:
        node_of = records(run).groupby("rank")["node"].first()
        grids, ranks = rank_grid(critical_all, node_of)
        if grids:
            pngs.append((plots.plot_rank_grid, (grids, ranks), dict(title=f"Each rank against the median rank, run "
                         f"{run.run_id}"), "rank_grid.png", "Every rank's mean time in each stage over the median "
                         "rank's, a cell a rank (node by local rank; red slower); each stage's slowest rank boxed"))
    pngs.append((plots.plot_timeline, (df,), dict(iterations=MAX_TIMELINE_ITERS, between=between, of=of),
                 "timeline.png", "Per-rank timeline of a few non-warm-up iterations (grey: between "
                 f"iterations){listed}"))


def _run_details(run: Run, doc: Doc, csvs: dict, shown: pd.DataFrame) -> None:
    """Flags, splits exchanges, the named pieces inside stages and the ranks, where recorded."""
    opt = optimizations_table(run)
    if opt is not None:
        doc.h2("Optimizations")
        doc.table(opt)
    splits = tables.splits_exchanged(run)
    if not splits.empty:
        csvs["splits_exchanged"] = splits
        doc.h2("Splits all-to-alls")
        _listed(doc, splits, shown, "splits_exchanged.csv", lead="Splits exchanges each rank ran in its non-warm-up "
                "iterations: 0 with skip_splits_a2a; a batch off the fixed hotness falls back to the exchange and "
                "counts here.")
    subs = tables.subspan_table(run)
    subs = subs[subs["stage"].isin(STAGES)]  # what runs between iterations is in the stage tables
    if not subs.empty:
        csvs["subspans"] = subs
        doc.h2("Inside the stages")
        doc.p("Named pieces of a stage (a dynamic table's id transform, the rows it writes to the parameter "
              "store, the rows it fetches back), over every rank's non-warm-up iterations.")
        doc.table(subs)
    ranks = tables.rank_table(run)
    if not ranks.empty:
        csvs["ranks"] = ranks
        doc.h2("Ranks")
        _listed(doc, ranks, shown, "ranks.csv")


def _evaluation(run: Run, doc: Doc, csvs: dict, pngs: list) -> None:
    """Time to target, samples to target, throughput and AUROC over training (evaluating runs)."""
    table, summary = tables.evaluation(run)
    if table.empty:
        return
    target = run.manifest.config.evaluation.target_auc if run.manifest is not None else None
    doc.h2("Evaluation")
    lines = tables.evaluation_lines(summary, target)
    doc.bullets(lines)
    doc.table(table)
    csvs["evaluations"] = table
    csvs["evaluation_summary"] = pd.DataFrame([summary])
    pngs.append((plots.plot_auc, (table,), dict(title=f"AUROC over training, run {run.run_id}", target=target),
                 "auc.png", "Held-out AUROC at each evaluation against the training samples seen"))


def _roofline_or_none(run: Run) -> pd.DataFrame | None:
    try:
        return roofline_table(run)
    except ReportError:
        return None  # the manifest lacks what the formulas need; the roofline section says why


def _roofline(run: Run, doc: Doc, csvs: dict) -> None:
    doc.h2("Roofline")
    try:
        roof, by_rank = roofline_table(run), roofline_table(run, per_rank=True)
    except ReportError as exc:
        doc.p(str(exc))
        return
    csvs["roofline"], csvs["roofline_by_rank"] = roof, by_rank
    doc.p("Analytic work of one iteration on one rank (mean over ranks) against measured peaks "
          "(gemm_gflops: torch.mm; copy_gbps: device memory copy, read + write); n/a: peak not measured, or the "
          "achieved figure stands above it: then the probe measured the peak wrong (its precision, TF32 setting "
          "or shapes are not the stage's; a busy machine), or the analytic count is above what moved, and "
          "no efficiency is stated (the notes below say which). Formulas: harness/report/roofline.py.")
    notes = [n for n in roof.pop("peak_note") if n]
    doc.table(roof)
    doc.bullets(notes)


def _write(out: Path, doc: Doc, csvs: dict[str, pd.DataFrame], pngs: list) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, df in csvs.items():
        df.to_csv(out / f"{name}.csv", index=False)
        written.append(out / f"{name}.csv")
    doc.h2("Plots")
    for fn, args, kwargs, name, caption in pngs:
        written.append(fn(*args, out / name, **kwargs))
        doc.image(out / name, caption)
    return written + doc.write(out)


def ablation_report(ab: abl.Ablation, out: Path) -> tuple[list[Path], pd.DataFrame]:
    """Write the report of an ablation into `out`; return the files written and the config table."""
    table = abl.ablation_table(ab)
    if table["iterations"].sum() == 0:
        raise ReportError(f"ablation {ab.ablation_id}: no run of any config has complete non-warm-up "
                          "iterations; nothing to report")
    contrib = abl.flag_contributions(ab, table)
    m = ab.manifest
    base = abl._by_kind(ab, "baseline")
    losses = findings.final_losses({c["name"]: [ab.runs[r] for r in c.get("runs") or [] if r in ab.runs]
                                    for c in ab.configs}, base)
    doc = Doc(f"Ablation {ab.ablation_id}")
    doc.findings(findings.ablation_findings(table, contrib, losses))
    doc.h2("Setup")
    doc.bullets([f"status {m.get('status', '?')}  preset {m.get('preset', '?')}  "
                 f"{m.get('nodes', '?')} node(s) x {m.get('gpus_per_node', '?')} per node  "
                 f"repeats {m.get('repeats', '?')}  pipeline {m.get('pipeline', '?')}",
                 f"started {m.get('start_time', '?')}  ended {m.get('end_time') or '-'}",
                 f"flags: {', '.join(m.get('flags') or [])}"])
    if m.get("status") != "completed":
        doc.warn(f"ablation {str(m.get('status', '?')).upper()}: configs below cover only the runs written")
    for run_id, why in ab.missing.items():
        doc.warn(f"run {run_id} not read: {why}")
    doc.h2("Configs")
    doc.p("period_ms: mean job iteration period (start to the next start), each repeat weighing the same; 95% CI "
          "by bootstrap over repeats, then iterations within them (seeded). speedup = baseline / config, by "
          "period. iter_ms: the timed window inside the period, for reference (a flag that moves work out of "
          "it is not faster for that). n/a: the config's requested flags were all inactive (reason in note).")
    doc.table(table)
    doc.h2("Marginal contribution of each flag (ms of iteration period saved)")
    doc.p("alone = baseline - (+flag); removal = (all - flag) - all. Positive = the flag makes it faster.")
    doc.table(contrib)
    doc.h2("Did a flag change the math?")
    doc.p("Final loss of each config (last iteration, rank 0, first repeat): the same seed and data must give "
          "exactly the baseline's loss with any set of optimizations.")
    doc.table(losses)
    stage_means = abl.config_stage_means(ab)
    csvs = {"ablation": table, "contributions": contrib, "final_loss": losses,
            "stages_by_config": stage_means.reset_index(names="config")}
    pngs = []
    if not stage_means.empty:
        doc.h2("Mean iteration period per config, broken down (ms a rank)")
        doc.p("The stages on the critical path (input_dist: its exposed part), what runs between iterations, "
              "the timed window (iter_ms) and the period (period_ms), means of a rank.")
        doc.table(stage_means, index=True)
        pngs.append((plots.plot_stage_bars, (stage_means,), dict(title=f"Iteration period per config, ablation "
                     f"{ab.ablation_id}", row_label="config"), "stage_bars.png",
                     "Mean iteration period per config, broken down: stages on the critical path, then what runs "
                     "between iterations; the bar ends at the mean period of a rank"))
    ms = table.set_index("config")["period_ms"]
    full = abl._by_kind(ab, "all")
    if base is not None and not pd.isna(ms.get(base)):
        pngs.append((plots.plot_waterfall, (contrib, float(ms[base]), float(ms.get(full, float("nan")))),
                     dict(title=f"Ablation {ab.ablation_id}: baseline to all flags (green: faster)"),
                     "waterfall.png", "Waterfall: each flag alone, then the interaction, to all flags on"))
    doc.h2("Runs")
    doc.bullets([f"{c['name']}: {', '.join(c.get('runs') or []) or '(none)'}" for c in ab.configs])
    return _write(out, doc, csvs, pngs), table


def compare_report(groups: dict[str, list[Run]], c: Comparison, out: Path, *, absent: list[str]) -> list[Path]:
    """Write the report of a Comparison (compare.compare_runs) of two labelled groups of runs into `out`."""
    base, cand = c.labels
    doc = Doc(f"Compare {cand} vs {base}")
    doc.findings(findings.compare_findings(c, absent) + findings.numerics_findings(groups))
    notes = [f"{label}: {len(runs)} run(s): {', '.join(r.run_id for r in runs)}" for label, runs in groups.items()]
    doc.h2("Setup")
    doc.bullets(notes)
    for label, runs in groups.items():
        for run in runs:
            for line in findings.caveat_findings(run, tables.completeness(run)):
                doc.warn(f"{label} run {run.run_id}: {line}")
    doc.h2("Iteration period (ms, job = slowest rank)")
    doc.p("The period: from an iteration's start to the next one's start. Mean with each run weighing the same; 95% "
          "CI by bootstrap over runs, then iterations within them. "
          f"ratio = {cand} / {base}: {c.ratio:.4f} (95% CI {c.ratio_ci[0]:.4f}-{c.ratio_ci[1]:.4f}).")
    doc.table(c.period_ms)
    doc.p("The timed window inside it (iter_ms), over the same iterations:")
    doc.table(c.iter_ms)
    doc.h2("Stages (ms a rank, critical path; input_dist: its exposed part)")
    doc.p("Only stages both sides recorded, then between_iterations (from the iteration records, so both sides "
          "have it); delta = candidate - baseline; ratio = candidate / baseline.")
    doc.table(c.stages)
    wide, partial = breakdowns(groups)
    csvs = {"compare_iterations": pd.concat([c.period_ms.assign(figure="period_ms"),
                                             c.iter_ms.assign(figure="iter_ms")], ignore_index=True),
            "compare_stages": c.stages}
    pngs = []
    if not wide.empty:
        csvs["compare_breakdown"] = wide.reset_index()
        doc.h2("Each side's own breakdown of its period (ms a rank)")
        doc.p("Every stage each side times (n/a: a stage it does not time), what runs between iterations, the timed "
              "window and the period. " + "".join(
                  f"{label}: not broken down: its engine times only some stages, so the rest of its timed window "
                  "is one segment it does not break down, not time spent idle. " for label in partial))
        doc.table(wide, index=True)
        pngs.append((plots.plot_stage_bars, (wide,), dict(title=f"{cand} vs {base}: iteration period",
                     row_label="label", not_broken_down=partial), "stage_bars.png",
                     "Each side's mean iteration period, broken down by what it times (stacked, ms a rank); the "
                     "bar ends at the side's mean period"))
    return _write(out, doc, csvs, pngs)
