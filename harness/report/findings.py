"""The "findings" block that opens every report: a few sentences computed from the data, so the
reader gets the answer before the tables. Each function returns plain lines (no formatting)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.report.ablation import N_BOOT, bootstrap_mean_ci
from harness.report.compare import Comparison
from harness.report.load import Run, inactive_flags, numerics_note, run_error, run_status
from harness.report.peaks import above_copy_note, above_gemm_note, is_above
from harness.report.tables import (
    NOT_BROKEN_DOWN, between_parts, job_iterations, period_iterations, stage_stats, straggler_table,
)
from harness.names import BETWEEN_ITERATIONS, STAGES

# A rank this much slower than the median rank in a stage is called out as a straggler.
STRAGGLER_PCT = 10.0
# A stage under this fraction of both roofs is bound by neither: by latency (launches, syncs).
LATENCY_FRAC = 0.05


def _ms(v: float) -> str:
    return f"{v:.4g} ms"


def iteration_finding(run: Run) -> str:
    """The mean job iteration period and samples/s, each with its bootstrap 95% CI over iterations,
    then the timed window inside the period."""
    its = job_iterations(run)
    its = its[its["complete"]]
    if its.empty:
        return "no complete non-warm-up iteration: nothing measured"
    window = f"timed window (iter_ms) {_ms(float(its['iter_ms'].mean()))}"
    timed = its[its["period_ms"].notna()]
    if timed.empty:
        return (f"no iteration period: no timed iteration is followed by another (the last of a run has no period); "
                f"{window} over {len(its)} iteration(s)")
    t = timed["period_ms"].to_numpy(float)
    mean, lo, hi, boot = bootstrap_mean_ci([t], n_boot=N_BOOT, rng=np.random.default_rng(0))
    line = f"iteration period {_ms(mean)} (95% CI {lo:.4g}-{hi:.4g}) over {len(t)} iterations"
    samples = timed["samples"].astype(float)
    if samples.notna().all():
        # samples/s = samples an iteration / mean period (samples over the timed wall time); its CI
        # maps the mean's bootstrap.
        per_iter = float(samples.mean())
        rate = 1e3 * per_iter / boot
        rlo, rhi = np.percentile(rate, [2.5, 97.5])
        line += f"; {1e3 * per_iter / mean:,.0f} samples/s (95% CI {rlo:,.0f}-{rhi:,.0f})"
    return line + f"; {window} of it"


def between_finding(run: Run) -> str | None:
    """How much of the period lies between iterations (over every rank's timed iterations that
    have a period), and what runs there."""
    per = period_iterations(run)
    if per.empty or not per["period_ms"].sum() > 0:
        return None
    line = (f"between iterations: {_ms(float(per['between_ms'].mean()))} of every period "
            f"({100 * per['between_ms'].sum() / per['period_ms'].sum():.0f}%) lies between one iteration's end and "
            "the next one's start, outside every timed stage")
    parts = between_parts(run)
    if (parts["part"] == NOT_BROKEN_DOWN).all():
        return line + "; not broken down: this run was recorded before what runs there was"
    means = parts.groupby("part", sort=False)["ms"].mean()
    return line + ": " + ", ".join(f"{part} {_ms(float(ms))}" for part, ms in means.items())


def between_line(run: Run) -> str | None:
    """What the stage table's between_iterations row holds, in words; None when it has no row."""
    parts = between_parts(run)
    if parts.empty:
        return None
    if (parts["part"] == NOT_BROKEN_DOWN).all():
        return ("between_iterations: the gap from one iteration's end to the next one's start, outside every timed "
                "stage; not broken down: this run was recorded before what runs there was")
    return ("between_iterations: the gap from one iteration's end to the next one's start; its parts (rows "
            "between_iterations/...) are what the run recorded running there, `other` what they leave")


def _peak_words(r: pd.Series, stage: str) -> str:
    """The bounding roof, and the fraction of it reached or the probe-defect sentence."""
    if r["bound"] == "n/a":
        return ""
    compute = r["bound"] == "compute"
    frac = r["flops_frac"] if compute else r["bytes_frac"]
    achieved, peak = ((r["achieved_gflops"], r["gemm_gflops"]) if compute else (r["achieved_gbps"], r["copy_gbps"]))
    if is_above(float(achieved), float(peak)):
        note = (above_gemm_note(stage, float(achieved), float(peak)) if compute
                else above_copy_note(stage, float(achieved), float(peak)))
        return f"; {r['bound']}-bound by its intensity, but {note}"
    if pd.isna(frac):
        return ""
    roof = "GEMM FLOP/s" if compute else "memory copy bandwidth"
    line = f"; {r['bound']}-bound, at {100 * frac:.1f}% of the measured {roof}"
    if max(r["flops_frac"], r["bytes_frac"]) < LATENCY_FRAC:
        line += " (far below both roofs: latency-bound, e.g. kernel launches and syncs)"
    return line


def dominant_stage_finding(run: Run, roofline: pd.DataFrame | None) -> str | None:
    """The stage with the largest mean critical-path time, its share of the iteration period and,
    when the roofline has it, the fraction of the bounding peak it reached (a figure above its peak
    is a probe defect, said as such)."""
    stats = stage_stats(run, "job")
    stats = stats[stats["stage"].isin(STAGES)]
    if stats.empty:
        return None
    r = stats.loc[stats["mean_ms"].idxmax()]
    stage = str(r["stage"])
    share = f" ({100 * r['share']:.0f}% of the iteration period)" if pd.notna(r["share"]) else ""
    line = f"dominant stage: {stage}, {_ms(float(r['mean_ms']))} a rank{share}"
    if roofline is not None and stage in set(roofline["stage"]):
        line += _peak_words(roofline.set_index("stage").loc[stage], stage)
    return line


def straggler_finding(run: Run) -> str | None:
    """The stage whose slowest rank is furthest above the median rank (one rank: none)."""
    strag = straggler_table(run)
    strag = strag[strag["ranks"] > 1].dropna(subset=["gap_pct"])
    if strag.empty:
        return None
    w = strag.loc[strag["gap_pct"].idxmax()]
    verdict = "straggler" if w["gap_pct"] >= STRAGGLER_PCT else f"no straggler (all under {STRAGGLER_PCT:.0f}%)"
    return (f"{verdict}: worst is rank {int(w['slowest_rank'])} (node {int(w['slowest_node'])}) in {w['stage']}, "
            f"{_ms(float(w['slowest_ms']))} vs the median rank's {_ms(float(w['median_rank_ms']))} "
            f"(+{w['gap_pct']:.0f}%)")


def caveat_findings(run: Run, notes: list[str]) -> list[str]:
    """Inactive flags, a run that did not complete, partial records (notes from completeness)."""
    out = []
    if run_status(run) != "completed":
        out.append(f"run {run_status(run)}: {run_error(run) or 'no error recorded'}; numbers cover only the records written")
    out += [f"{flag} requested but inactive: {why}" for flag, why in inactive_flags(run).items()]
    its = job_iterations(run)
    partial = int((~its["complete"]).sum())
    if partial:
        out.append(f"{partial} iteration(s) not recorded by every rank left out")
    return out + list(notes)


def run_findings(run: Run, roofline: pd.DataFrame | None) -> list[str]:
    """Iteration period and rate, what lies between iterations, the dominant stage, the worst
    straggler, inactive flags. (A failed or partial run is flagged by the report's warnings right
    under these.)"""
    lines = [iteration_finding(run), between_finding(run), dominant_stage_finding(run, roofline),
             straggler_finding(run)]
    inactive = [f"{flag} requested but inactive: {why}" for flag, why in inactive_flags(run).items()]
    return [line for line in lines if line] + inactive + [n for n in [numerics_note(run)] if n]


def numerics_findings(groups: dict[str, list[Run]]) -> list[str]:
    """Per label, what changes its numbers by design (a comparison across precisions is no
    same-math comparison, and the reader must see that first)."""
    notes = {label: sorted({n for r in runs if (n := numerics_note(r))}) for label, runs in groups.items()}
    return [f"{label}: {n}" for label, ns in notes.items() for n in ns]


def ablation_findings(table: pd.DataFrame, contrib: pd.DataFrame, final_loss: pd.DataFrame) -> list[str]:
    """Baseline and best config (by the iteration period), the biggest flag effect alone with its CI,
    inactive configs, and whether every config's final loss equals the baseline's (a flag must not
    change the math)."""
    out = []
    base = table[table["kind"] == "baseline"]
    if not base.empty and pd.notna(base["period_ms"].iloc[0]):
        b = base.iloc[0]
        out.append(f"baseline iteration period {_ms(b['period_ms'])} (95% CI {b['ci_low']:.4g}-{b['ci_high']:.4g}; "
                   f"timed window {_ms(b['iter_ms'])})")
    timed = table.dropna(subset=["speedup"])
    if not timed.empty:
        best = timed.loc[timed["speedup"].idxmax()]
        out.append(f"fastest config: {best['config']}, {best['speedup']:.3f}x the baseline "
                   f"(95% CI {best['speedup_low']:.3f}-{best['speedup_high']:.3f})")
    eff = contrib.dropna(subset=["alone_ms"])
    if not eff.empty:
        top = eff.loc[eff["alone_ms"].abs().idxmax()]
        word = "saves" if top["alone_ms"] >= 0 else "costs"
        sure = ("" if top["alone_low"] > 0 or top["alone_high"] < 0 else "; the CI includes 0: not distinguishable "
                "from noise")
        out.append(f"biggest flag effect: {top['flag']} alone {word} {_ms(abs(top['alone_ms']))} an iteration "
                   f"(95% CI {top['alone_low']:.3g} to {top['alone_high']:.3g} ms saved){sure}")
    inactive = contrib[contrib["note_alone"].str.startswith("n/a")]
    out += [f"{r['flag']}: {r['note_alone'][5:]}" for _, r in inactive.iterrows()]
    if not final_loss.empty:
        differ = final_loss[final_loss["equals_baseline"] == False]  # noqa: E712  (NA stays out)
        out.append("final loss equals the baseline's in every config: no flag changed the math" if differ.empty
                   else f"final loss differs from the baseline's in: {', '.join(differ['config'])}")
    out += [f"{c}: {n}" for c, n in zip(table["config"], table["note"]) if "failed" in n or "unreadable" in n]
    return out


def compare_findings(c: Comparison, absent: list[str]) -> list[str]:
    """The iteration period's ratio with its CI first; then where the period changed (the timed
    window, the gap between iterations); then the stage that moved most of those both sides time;
    stages only one side recorded."""
    (base, cand), per, win = c.labels, c.period_ms.set_index("label"), c.iter_ms.set_index("label")
    lo, hi = c.ratio_ci
    verdict = ("faster" if hi < 1 else "slower" if lo > 1 else "not distinguishable from the baseline (CI includes 1)")
    out = [f"{cand} vs {base}: iteration period {_ms(per.loc[cand, 'mean'])} vs {_ms(per.loc[base, 'mean'])}, ratio "
           f"{c.ratio:.3f} (95% CI {lo:.3f}-{hi:.3f}): {cand} is {verdict}"]
    st = c.stages.set_index("stage")
    change = [f"timed window (iter_ms) {_ms(win.loc[base, 'mean'])} -> {_ms(win.loc[cand, 'mean'])} "
              f"({win.loc[cand, 'mean'] - win.loc[base, 'mean']:+.4g} ms)"]
    if BETWEEN_ITERATIONS in st.index:
        b = st.loc[BETWEEN_ITERATIONS]
        change.append(f"between iterations {_ms(b['baseline_ms'])} -> {_ms(b['candidate_ms'])} ({b['delta_ms']:+.4g} ms)")
    out.append(f"where the period changed: {'; '.join(change)}")
    stages = c.stages[c.stages["stage"].isin(STAGES)]
    if not stages.empty:
        s = stages.loc[stages["delta_ms"].abs().idxmax()]
        scope = "" if len(stages) == len(STAGES) else f" of the stages both sides time ({', '.join(stages['stage'])})"
        out.append(f"largest stage change{scope}: {s['stage']} {s['delta_ms']:+.4g} ms (ratio {s['ratio']:.3f}, "
                   f"95% CI {s['ratio_low']:.3f}-{s['ratio_high']:.3f})")
    return out + list(absent)


def final_losses(runs_by_config: dict[str, list[Run]], baseline: str | None) -> pd.DataFrame:
    """Per config: the last complete iteration's loss (rank 0, the first run) and whether it equals
    the baseline's exactly (same seed and data: an optimization must not change the math).
    NA where a run recorded no loss."""
    rows = []
    for config, runs in runs_by_config.items():
        loss = np.nan
        if runs:
            its = runs[0].iterations
            its = its[its["rank"] == its["rank"].min()].sort_values("iteration")
            if not its.empty and pd.notna(its["loss"].iloc[-1]):
                loss = float(its["loss"].iloc[-1])
        rows.append({"config": config, "final_loss": loss})
    out = pd.DataFrame(rows, columns=["config", "final_loss"])
    ref = out.set_index("config")["final_loss"].get(baseline, np.nan) if baseline else np.nan
    out["equals_baseline"] = [pd.NA if pd.isna(v) or pd.isna(ref) else bool(v == ref) for v in out["final_loss"]]
    return out

