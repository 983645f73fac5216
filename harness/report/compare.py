"""Two groups of runs side by side (baseline, candidate): the iteration period (start to the next
start, what a user waits for an iteration), the timed window inside it, each stage and what runs
between iterations, with bootstrap 95% CIs from the ablation's bootstrap (resample runs, then
iterations within them). The headline ratio is the period's.

`make report RUN=a,b` and `make compare` both come here. This module only computes; the report
is written by build.compare_report (through api.write_compare_report), so findings and build both
import it and it imports neither. Stage times are on the critical path (tables.critical_stages:
input_dist counts its exposed part only). A stage a run did not record (a TorchRec-engine run times
only what it can time honestly) has no row: it is absent, never zero. The between-iterations gap
comes from the iteration records, so both sides always have it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.report.ablation import N_BOOT, bootstrap_mean_ci, breakdown_columns, mean_breakdown
from harness.report.load import ReportError, Run
from harness.report.tables import critical_stages, job_iterations, period_iterations
from harness.names import BETWEEN_ITERATIONS, STAGES

ITER_COLUMNS = ("label", "mean", "p50", "ci_low", "ci_high", "runs", "iterations")
STAGE_COLUMNS = ("stage", "baseline_ms", "baseline_low", "baseline_high", "candidate_ms", "candidate_low",
                 "candidate_high", "delta_ms", "ratio", "ratio_low", "ratio_high")


@dataclass(frozen=True)
class Comparison:
    """Baseline vs candidate; ms are means with each run weighing the same."""

    labels: tuple[str, str]
    """(baseline, candidate): the first label of the groups given is the baseline."""
    period_ms: pd.DataFrame
    """One row per label: mean, p50, ci_low, ci_high (bootstrap 95%), runs, iterations of the job
    iteration period (slowest rank per iteration; only iterations every rank recorded that have a
    period)."""
    iter_ms: pd.DataFrame
    """The same of the timed window (iter_ms) of those iterations: what the period holds besides
    the gap between iterations."""
    ratio: float
    """candidate / baseline of the mean job iteration period (below 1: the candidate is faster)."""
    ratio_ci: tuple[float, float]
    """Bootstrap 95% CI of that ratio (resample runs, then iterations)."""
    stages: pd.DataFrame
    """Stages present in both, STAGES order, then between_iterations (both sides have it): baseline
    and candidate ms a rank (critical path) with CIs, delta_ms (candidate - baseline), ratio
    (candidate / baseline) and its CI."""


def _iteration_groups(runs: list[Run], col: str = "period_ms") -> list[np.ndarray]:
    """Per run: `col` of its complete non-warm-up job iterations that have a period (ms)."""
    out = []
    for run in runs:
        its = job_iterations(run)
        out.append(its.loc[its["complete"] & its["period_ms"].notna(), col].to_numpy(float))
    return out


def _stage_groups(runs: list[Run]) -> dict[str, list[np.ndarray]]:
    """Stage -> per run: the mean over ranks of its critical ms, one value an iteration. Runs
    that did not record the stage contribute nothing to it."""
    out: dict[str, list[np.ndarray]] = {}
    for run in runs:
        st = critical_stages(run)
        per_iter = st.groupby(["stage", "iteration"])["critical_ms"].mean()
        for stage in per_iter.index.get_level_values("stage").unique():
            out.setdefault(stage, []).append(per_iter.loc[stage].to_numpy(float))
        gaps = period_iterations(run).groupby("iteration")["between_ms"].mean()
        if len(gaps):
            out.setdefault(BETWEEN_ITERATIONS, []).append(gaps.to_numpy(float))
    return out


def _ci(boot: np.ndarray) -> tuple[float, float]:
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(lo), float(hi)


def compare_runs(groups: dict[str, list[Run]], *, n_boot: int = N_BOOT, seed: int = 0) -> Comparison:
    """Compare exactly two labelled groups of runs; the first label is the baseline.

    Raises ReportError (one line) when there are not two labels, a label has no run, or a label
    has no complete non-warm-up iteration.
    """
    if len(groups) != 2:
        raise ReportError(f"a comparison needs exactly two labels (baseline, candidate), got {len(groups)}: "
                          f"{', '.join(map(str, groups)) or 'none'}")
    labels = tuple(str(k) for k in groups)
    for label, runs in groups.items():
        if not runs:
            raise ReportError(f"comparison label '{label}' has no runs")
    rows, boots = {"period_ms": [], "iter_ms": []}, []
    for i, (label, runs) in enumerate(groups.items()):
        for col in rows:
            times = _iteration_groups(runs, col)
            if not any(len(t) for t in times):
                raise ReportError(f"comparison label '{label}': no run has complete non-warm-up iterations followed "
                                  "by another (the last iteration of a run has no period)")
            # Seeded by position: the same folders give the same report.
            point, lo, hi, boot = bootstrap_mean_ci(times, n_boot=n_boot, rng=np.random.default_rng([seed, i]))
            if col == "period_ms":
                boots.append(boot)
            rows[col].append({"label": label, "mean": point, "p50": float(np.median(np.concatenate(times))),
                              "ci_low": lo, "ci_high": hi, "runs": sum(1 for t in times if len(t)),
                              "iterations": int(sum(len(t) for t in times))})
    period_ms, iter_ms = (pd.DataFrame(rows[c], columns=list(ITER_COLUMNS)) for c in ("period_ms", "iter_ms"))
    ratio = float(period_ms["mean"].iloc[1] / period_ms["mean"].iloc[0])
    ratio_ci = _ci(boots[1] / boots[0])

    base_st, cand_st = (_stage_groups(runs) for runs in groups.values())
    stage_rows = []
    for j, stage in enumerate(s for s in (*STAGES, BETWEEN_ITERATIONS) if s in base_st and s in cand_st):
        b = bootstrap_mean_ci(base_st[stage], n_boot=n_boot, rng=np.random.default_rng([seed, 2, j]))
        c = bootstrap_mean_ci(cand_st[stage], n_boot=n_boot, rng=np.random.default_rng([seed, 3, j]))
        with np.errstate(divide="ignore", invalid="ignore"):
            r_lo, r_hi = _ci(c[3] / b[3]) if b[0] > 0 else (np.nan, np.nan)
        stage_rows.append({"stage": stage, "baseline_ms": b[0], "baseline_low": b[1], "baseline_high": b[2],
                           "candidate_ms": c[0], "candidate_low": c[1], "candidate_high": c[2],
                           "delta_ms": c[0] - b[0], "ratio": c[0] / b[0] if b[0] > 0 else np.nan,
                           "ratio_low": r_lo, "ratio_high": r_hi})
    stages = pd.DataFrame(stage_rows, columns=list(STAGE_COLUMNS))
    return Comparison(labels=labels, period_ms=period_ms, iter_ms=iter_ms, ratio=ratio, ratio_ci=ratio_ci,
                      stages=stages)


def stages_absent(groups: dict[str, list[Run]]) -> list[str]:
    """One line per stage that one label recorded and the other did not (so it has no row)."""
    seen = {label: {s for run in runs for s in critical_stages(run)["stage"].unique()}
            for label, runs in groups.items()}
    (a, sa), (b, sb) = seen.items()
    return [f"stage {s} recorded only by {a if s in sa else b}: not compared"
            for s in STAGES if (s in sa) != (s in sb)]



def breakdowns(groups: dict[str, list[Run]]) -> tuple[pd.DataFrame, list[str]]:
    """Each label's own breakdown of its period (ablation.mean_breakdown): a row per label, a column
    per stage it timed (NaN where it timed none), the between-iterations gap and its parts,
    iter_ms, period_ms. And the labels whose engine does not time every stage (a TorchRec-engine
    run): the rest of their timed window is not broken down, which is no untimed wait."""
    rows, partial = {}, []
    for label, runs in groups.items():
        means = mean_breakdown(runs)
        if means is not None:
            rows[label] = means
        if any(r.manifest is not None and tuple(r.manifest.timed_stages) != STAGES for r in runs):
            partial.append(label)
    if not rows:
        return pd.DataFrame(), partial
    return breakdown_columns(pd.DataFrame(rows).T.rename_axis("label")), partial
