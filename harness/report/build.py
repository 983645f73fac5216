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
from harness.report import tables
from harness.report.compare import Comparison
from harness.report.html import Doc
from harness.report.load import FLAGS, ReportError, Run, records, run_pipelined
from harness.report.roofline import roofline_table

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


def run_report(run: Run, out: Path, *, header: list[str]) -> list[Path]:
    """Write the full report of one run (or nsys trace) into `out`; return the files written.

    header: the summary's header lines (status, world size, iteration counts, failure).
    """
    df = records(run)
    doc = Doc(f"Run {run.run_id}")
    csvs: dict[str, pd.DataFrame] = {}
    roof = _roofline_or_none(run)
    doc.findings(findings.run_findings(run, roof))
    # "!! " lines (failed or incomplete run, ranks or stages without records) become warnings.
    for line in header:
        if line.startswith("!! "):
            doc.warn(line[3:])
    doc.h2("Setup")
    doc.bullets([line for line in header if not line.startswith("!! ")])
    multi_node = df["node"].nunique() > 1

    doc.h2("Iterations")
    doc.p("Job iteration = slowest rank (ranks step together); only iterations every rank recorded count. "
          "samples_per_s = samples / summed iteration time.")
    it_job, it_rank = tables.iteration_table(df, "job"), tables.iteration_table(df, "rank")
    doc.table(_drop_run_id(it_job))
    scopes = [it_job.assign(scope="job"), it_rank.assign(scope="rank")]
    hosts = _node_hosts(run)
    if multi_node:
        it_node = _with_hosts(tables.iteration_table(df, "node"), hosts)
        doc.p("Per node (node iteration = its slowest rank), with the host each node's ranks ran on:")
        doc.table(_drop_run_id(it_node))
        scopes.append(it_node.assign(scope="node"))
    doc.p("Per rank:")
    doc.table(_drop_run_id(it_rank))
    csvs["iteration_stats"] = pd.concat(scopes, ignore_index=True)
    csvs["iterations"] = tables.job_iterations(df, warmup=True)

    staged = not tables.timed_stages(df).empty
    pngs = []
    if staged:
        st_job, st_rank = tables.stage_stats(df, "job"), tables.stage_stats(df, "rank")
        csvs["stages"], csvs["stages_by_rank"] = st_job, st_rank
        doc.h2("Stages, all ranks")
        doc.p("Duration stats of non-warm-up records (ms); share = mean stage time / mean iteration time "
              "(a sum above 100% means overlap, below it untimed gaps).")
        doc.table(_drop_run_id(st_job))
        doc.h2("Stages per rank (mean ms)")
        doc.table(tables.stage_pivot(st_rank, "rank"), index=True)
        if multi_node:
            st_node = tables.stage_stats(df, "node")
            csvs["stages_by_node"] = st_node
            doc.h2("Stages per node (mean ms)")
            pivot = tables.stage_pivot(st_node, "node")
            pivot.insert(0, "host", [hosts.get(n, "") for n in pivot.index])
            doc.table(pivot, index=True)
        moved = tables.bytes_moved_table(run.stages)
        if not moved.empty:
            csvs["bytes_moved"] = moved
            doc.h2("Bytes moved")
            doc.p("What each rank's collectives sent to and received from other ranks an iteration, by the stage "
                  "each exchange belongs to (counted at launch; collectives the library runs its own way counted as "
                  "a ring moves them), and the rate over the stage's time: for a stage that overlaps other work "
                  "that rate is a floor of the link's.")
            doc.table(moved)
        strag = tables.straggler_table(df)
        csvs["stragglers"] = strag
        doc.h2("Stragglers")
        doc.p("Per stage, the rank with the largest mean time and its gap to the median rank's mean. "
              "Ranks wait for each other inside collectives, so look at compute-heavy stages first.")
        doc.table(_drop_run_id(strag))
        overlap = tables.input_dist_overlap(df)
        csvs["input_dist_overlap"] = overlap
        doc.h2("Input distribution hidden by the pipeline")
        pipe = run_pipelined(run)
        doc.p(f"pipeline: {'on' if pipe else 'off' if pipe is False else 'not recorded'}. hidden = time of each "
              "input_dist span that overlaps the same rank's other stages (from start/end times).")
        doc.table(_drop_run_id(overlap))
        _roofline(run, doc, csvs)
        critical = tables.critical_stage_means(df, "rank")
        csvs["critical_path_by_rank"] = critical.reset_index()
        pngs.append((plots.plot_stage_bars, (critical,),
                     dict(title=f"Stage time per rank, run {run.run_id}", row_label="rank"),
                     "stage_bars.png", "Mean stage time on the critical path per rank (stacked, ms; input_dist: "
                     "its exposed part); the bar ends at the measured mean iteration time"))
        pngs.append((plots.plot_timeline, (df,), dict(iterations=MAX_TIMELINE_ITERS), "timeline.png",
                     "Per-rank timeline of a few non-warm-up iterations"))
    else:
        doc.h2("Stages")
        doc.p("No stage records (a run made with --no-timeline, or none flushed): iteration times only.")
    opt = optimizations_table(run)
    if opt is not None:
        doc.h2("Optimizations")
        doc.table(opt)
    splits = tables.splits_exchanged(run)
    if not splits.empty:
        csvs["splits_exchanged"] = splits
        doc.h2("Splits all-to-alls")
        doc.p("Splits exchanges each rank ran in its non-warm-up iterations: 0 with skip_splits_a2a; a batch "
              "off the fixed hotness falls back to the exchange and counts here.")
        doc.table(splits)
    subs = tables.subspan_table(run)
    if not subs.empty:
        csvs["subspans"] = subs
        doc.h2("Inside the stages")
        doc.p("Named pieces of a stage (a dynamic table's id transform, the rows it writes to the parameter "
              "store, the rows it fetches back), over every rank's non-warm-up iterations.")
        doc.table(subs)
    ranks = tables.rank_table(run)
    if not ranks.empty:
        doc.h2("Ranks")
        doc.table(ranks)
    pngs.append((plots.plot_iteration_time, (df,), dict(title=f"Iteration time, run {run.run_id}"),
                 "iteration_time.png", "Iteration time over the run (warm-up shaded)"))
    _evaluation(run, doc, csvs, pngs)
    return _write(out, doc, csvs, pngs)


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
          "(gemm_gflops: torch.mm; copy_gbps: device memory copy, read + write); n/a: peak not measured; "
          "a fraction above 100% means the peak was measured low (e.g. on a busy machine). "
          "Formulas: harness/report/roofline.py.")
    doc.table(roof)


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
    doc.p("iter_ms: mean job iteration time, each repeat weighing the same; 95% CI by bootstrap over "
          "repeats, then iterations within them (seeded). speedup = baseline / config. n/a: the "
          "config's requested flags were all inactive (reason in note).")
    doc.table(table)
    doc.h2("Marginal contribution of each flag (ms saved per iteration)")
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
        doc.h2("Mean stage time per config (ms, critical path: input_dist's exposed part)")
        doc.table(stage_means, index=True)
        pngs.append((plots.plot_stage_bars, (stage_means,), dict(title=f"Stage time per config, ablation {ab.ablation_id}",
                     row_label="config"), "stage_bars.png",
                     "Mean stage time on the critical path per config (stacked, ms); the bar ends at the mean "
                     "iteration time of a rank"))
    ms = table.set_index("config")["iter_ms"]
    full = abl._by_kind(ab, "all")
    if base is not None and not pd.isna(ms.get(base)):
        pngs.append((plots.plot_waterfall, (contrib, float(ms[base]), float(ms.get(full, float("nan")))),
                     dict(title=f"Ablation {ab.ablation_id}: baseline to all flags (green: faster)"),
                     "waterfall.png", "Waterfall: each flag alone, then the interaction, to all flags on"))
    doc.h2("Runs")
    doc.bullets([f"{c['name']}: {', '.join(c.get('runs') or []) or '(none)'}" for c in ab.configs])
    return _write(out, doc, csvs, pngs), table


def compare_report(groups: dict[str, list[Run]], c: Comparison, out: Path, *, absent: list[str]) -> list[Path]:
    """Write the report of a Comparison (report_compare) of two labelled groups of runs into `out`."""
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
    doc.h2("Iteration time (ms, job = slowest rank)")
    doc.p("mean with each run weighing the same; 95% CI by bootstrap over runs, then iterations within them. "
          f"ratio = {cand} / {base}: {c.ratio:.4f} (95% CI {c.ratio_ci[0]:.4f}-{c.ratio_ci[1]:.4f}).")
    doc.table(c.iter_ms)
    doc.h2("Stages (ms a rank, critical path; input_dist: its exposed part)")
    doc.p("Only stages both sides recorded; delta = candidate - baseline; ratio = candidate / baseline.")
    doc.table(c.stages)
    csvs = {"compare_iterations": c.iter_ms, "compare_stages": c.stages}
    pngs = []
    if not c.stages.empty:
        wide = c.stages.set_index("stage")[["baseline_ms", "candidate_ms"]].T
        wide.index = [base, cand]
        wide["iter_ms"] = c.iter_ms.set_index("label")["mean"].reindex([base, cand]).to_numpy()
        pngs.append((plots.plot_stage_bars, (wide,), dict(title=f"{cand} vs {base}", row_label="label"),
                     "stage_bars.png", "Mean critical-path stage time (stacked, ms); the bar ends at the mean "
                     "job iteration time"))
    return _write(out, doc, csvs, pngs)
