"""The "findings" block that opens every report: a few sentences computed from the data, so the
reader gets the answer before the tables. Each function returns plain lines (no formatting)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.report.ablation import N_BOOT, bootstrap_mean_ci
from harness.report.compare import Comparison
from harness.report.load import Run, inactive_flags, numerics_note, run_error, run_status
from harness.report.tables import critical_stages, job_iterations, straggler_table

# A rank this much slower than the median rank in a stage is called out as a straggler.
STRAGGLER_PCT = 10.0


def _ms(v: float) -> str:
    return f"{v:.4g} ms"


def iteration_finding(run: Run) -> str:
    """Mean job iteration time and samples/s, each with its bootstrap 95% CI over iterations."""
    its = job_iterations(run)
    its = its[its["complete"]]
    if its.empty:
        return "no complete non-warm-up iteration: nothing measured"
    t = its["iter_ms"].to_numpy(float)
    mean, lo, hi, boot = bootstrap_mean_ci([t], n_boot=N_BOOT, rng=np.random.default_rng(0))
    line = f"iteration {_ms(mean)} (95% CI {lo:.4g}-{hi:.4g}) over {len(t)} iterations"
    samples = its["samples"].astype(float)
    if samples.notna().all():
        # samples/s = samples an iteration / mean iteration time; its CI maps the mean's bootstrap.
        per_iter = float(samples.mean())
        rate = 1e3 * per_iter / boot
        rlo, rhi = np.percentile(rate, [2.5, 97.5])
        line += f"; {1e3 * per_iter / mean:,.0f} samples/s (95% CI {rlo:,.0f}-{rhi:,.0f})"
    return line


def dominant_stage_finding(run: Run, roofline: pd.DataFrame | None) -> str | None:
    """The stage with the largest mean critical-path time, its share of the iteration and, when the
    roofline has it, the fraction of the bounding peak it reached."""
    st = critical_stages(run)
    if st.empty:
        return None
    means = st.groupby("stage")["critical_ms"].mean()
    stage = str(means.idxmax())
    its = job_iterations(run)
    it_ms = float(its.loc[its["complete"], "iter_ms"].mean())
    line = f"dominant stage: {stage}, {_ms(float(means[stage]))} a rank ({100 * means[stage] / it_ms:.0f}% of the iteration)"
    if roofline is not None and stage in set(roofline["stage"]):
        r = roofline.set_index("stage").loc[stage]
        frac = r["flops_frac"] if r["bound"] == "compute" else r["bytes_frac"]
        if r["bound"] != "n/a" and pd.notna(frac):
            peak = "GEMM FLOP/s" if r["bound"] == "compute" else "memory copy bandwidth"
            line += f"; {r['bound']}-bound, at {100 * frac:.1f}% of the measured {peak}"
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
    """Iteration time and rate, the dominant stage, the worst straggler, inactive flags. (A failed
    or partial run is flagged by the report's warnings right under these.)"""
    lines = [iteration_finding(run), dominant_stage_finding(run, roofline), straggler_finding(run)]
    inactive = [f"{flag} requested but inactive: {why}" for flag, why in inactive_flags(run).items()]
    return [line for line in lines if line] + inactive + [n for n in [numerics_note(run)] if n]


def numerics_findings(groups: dict[str, list[Run]]) -> list[str]:
    """Per label, what changes its numbers by design (a comparison across precisions is no
    same-math comparison, and the reader must see that first)."""
    notes = {label: sorted({n for r in runs if (n := numerics_note(r))}) for label, runs in groups.items()}
    return [f"{label}: {n}" for label, ns in notes.items() for n in ns]


def ablation_findings(table: pd.DataFrame, contrib: pd.DataFrame, final_loss: pd.DataFrame) -> list[str]:
    """Baseline and best config, the biggest flag effect alone with its CI, inactive configs, and
    whether every config's final loss equals the baseline's (a flag must not change the math)."""
    out = []
    base = table[table["kind"] == "baseline"]
    if not base.empty and pd.notna(base["iter_ms"].iloc[0]):
        b = base.iloc[0]
        out.append(f"baseline {_ms(b['iter_ms'])} (95% CI {b['ci_low']:.4g}-{b['ci_high']:.4g})")
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
    """The ratio with its CI, the stage that moved most, stages only one side recorded."""
    (base, cand), it = c.labels, c.iter_ms.set_index("label")
    lo, hi = c.ratio_ci
    verdict = ("faster" if hi < 1 else "slower" if lo > 1 else "not distinguishable from the baseline (CI includes 1)")
    out = [f"{cand} vs {base}: iteration {_ms(it.loc[cand, 'mean'])} vs {_ms(it.loc[base, 'mean'])}, ratio "
           f"{c.ratio:.3f} (95% CI {lo:.3f}-{hi:.3f}): {cand} is {verdict}"]
    if not c.stages.empty:
        s = c.stages.loc[c.stages["delta_ms"].abs().idxmax()]
        out.append(f"largest stage change: {s['stage']} {s['delta_ms']:+.4g} ms (ratio {s['ratio']:.3f}, "
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

