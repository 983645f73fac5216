"""Ablation report: one row per config of runs/ablations/<id>/ablation.json, with bootstrap CIs.

The statistic of a config is the mean job iteration period (ms, start to the next start, the
slowest rank's; non-warm-up iterations every rank recorded that have a period) with each repeat
weighing the same: the mean over its runs of each run's mean. The timed window (iter_ms) is shown
beside it; the period is what a flag is judged by, since work moved out of the timed window (the
next batch built before it opens) is still waited for.
Its 95% CI is a two-level bootstrap: resample the runs with replacement, then the iterations
within each drawn run, and take the 2.5 and 97.5 percentiles of the statistic. The generator
is seeded from (seed, config position), so the same folders give the same report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness.report.load import ReportError, Run, is_plain_name, load_run, read_json, start_key
from harness.report.tables import critical_stage_means, critical_stages, job_iterations
from harness.names import BETWEEN_ITERATIONS, STAGES

N_BOOT = 2000


@dataclass(kw_only=True)
class Ablation:
    """An ablation manifest and the runs it names that could be read."""

    manifest: dict
    """ablation.json as written."""
    runs: dict[str, Run] = field(default_factory=dict)
    """Loaded runs by run id."""
    missing: dict[str, str] = field(default_factory=dict)
    """Run id -> why it could not be read (folder gone, unreadable)."""

    @property
    def ablation_id(self) -> str:
        return str(self.manifest.get("ablation_id"))

    @property
    def configs(self) -> list[dict]:
        return list(self.manifest.get("configs") or [])


def resolve_ablation(runs_root: Path, ablation: str) -> Path:
    """runs_root/ablations/<id>/ablation.json; "latest" is the most recently started one."""
    root = Path(runs_root) / "ablations"
    found = []
    if root.is_dir():
        for d in root.iterdir():
            try:
                found.append((start_key(read_json(d / "ablation.json").get("start_time")), d.name))
            except ReportError:
                continue
    known = [name for _, name in sorted(found)]
    if ablation == "latest" and known:
        return root / known[-1] / "ablation.json"
    if ablation != "latest" and is_plain_name(ablation) and (root / ablation / "ablation.json").is_file():
        return root / ablation / "ablation.json"
    there = ", ".join(known) if known else "none (make one with `make ablation`)"
    what = "no ablations" if ablation == "latest" else f"no ablation '{ablation}'"
    raise ReportError(f"{what} under {root}/; ablations there: {there}")


def load_ablation(path: Path, runs_root: Path) -> Ablation:
    """Read ablation.json and every run it names from runs_root/<run_id>/."""
    manifest = read_json(Path(path))
    ab = Ablation(manifest=manifest)
    if not ab.configs:
        raise ReportError(f"ablation {ab.ablation_id} ({path}) lists no configs: nothing to report")
    for cfg in ab.configs:
        for run_id in cfg.get("runs") or []:
            if run_id in ab.runs or run_id in ab.missing:
                continue
            if not is_plain_name(str(run_id)) or not (Path(runs_root) / str(run_id)).is_dir():
                ab.missing[run_id] = f"no folder {Path(runs_root) / str(run_id)}"
                continue
            try:
                ab.runs[run_id] = load_run(Path(runs_root) / str(run_id))
            except ReportError as exc:
                ab.missing[run_id] = str(exc)
    if not ab.runs:
        raise ReportError(f"ablation {ab.ablation_id}: none of its configs has a readable run yet; "
                          "nothing to report")
    return ab


def bootstrap_mean_ci(groups: list[np.ndarray], *, n_boot: int = N_BOOT, level: float = 0.95,
                      rng: np.random.Generator | None = None) -> tuple[float, float, float, np.ndarray]:
    """(point, low, high, bootstrap samples) of the mean of group means.

    Each bootstrap draw picks len(groups) groups with replacement, resamples each drawn
    group's values with replacement, and averages the resampled group means.
    """
    groups = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not groups:
        return np.nan, np.nan, np.nan, np.array([])
    rng = rng or np.random.default_rng(0)
    point = float(np.mean([g.mean() for g in groups]))
    pick = rng.integers(len(groups), size=(n_boot, len(groups)))
    means = np.empty(pick.shape)
    for j, g in enumerate(groups):
        where = pick == j
        k = int(where.sum())
        if k:
            means[where] = g[rng.integers(len(g), size=(k, len(g)))].mean(axis=1)
    boot = means.mean(axis=1)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(boot, [tail, 100 - tail])
    return point, float(low), float(high), boot


def _config_times(ab: Ablation, cfg: dict, col: str = "period_ms") -> tuple[list[np.ndarray], list[str]]:
    """Per readable run of the config: `col` of its complete non-warm-up job iterations that have a
    period; and notes."""
    groups, notes = [], []
    for run_id in cfg.get("runs") or []:
        if run_id in ab.missing:
            notes.append(f"run {run_id} unreadable: {ab.missing[run_id]}")
            continue
        run = ab.runs[run_id]
        if run.status != "completed":
            notes.append(f"run {run_id} {run.status}")
        its = job_iterations(run)
        times = its.loc[its["complete"] & its["period_ms"].notna(), col].to_numpy(float)
        if len(times):
            groups.append(times)
        else:
            notes.append(f"run {run_id} has no complete non-warm-up iteration followed by another")
    return groups, notes


def _inactive_note(cfg: dict) -> str:
    reasons = cfg.get("inactive_reasons") or {}
    return "; ".join(f"{f} inactive: {why}" for f, why in reasons.items())


def ablation_table(ab: Ablation, *, n_boot: int = N_BOOT, seed: int = 0) -> pd.DataFrame:
    """One row per config, manifest order: the iteration period with its 95% CI, speedup vs baseline.

    Columns: config, kind, flag, runs, iterations (with a period), period_ms, ci_low, ci_high,
    speedup, speedup_low, speedup_high, iter_ms (the timed window's mean, the same iterations),
    note. speedup = baseline period_ms / config period_ms, its CI from
    the ratio of the two configs' bootstrap samples; n/a (NaN) for a config whose requested
    flags were all inactive (the note gives the manifest's reason) and for the baseline.
    The bootstrap samples are kept in .attrs["boot"] (config -> array) for the contributions.
    """
    rows, boots = [], {}
    for i, cfg in enumerate(ab.configs):
        groups, notes = _config_times(ab, cfg)
        point, lo, hi, boot = bootstrap_mean_ci(groups, n_boot=n_boot, rng=np.random.default_rng([seed, i]))
        window = _config_times(ab, cfg, "iter_ms")[0]
        window_ms = float(np.mean([g.mean() for g in window])) if window else np.nan
        boots[cfg["name"]] = boot
        if cfg.get("failed_runs"):
            notes.append(f"failed run(s) left out: {', '.join(map(str, cfg['failed_runs']))}")
        if len(groups) == 1:
            notes.append("1 repeat: the CI covers iteration noise only")
        if cfg.get("same_as"):
            notes.insert(0, f"the runs of {cfg['same_as']}: it resolves to the same effective flags here")
        if cfg.get("all_inactive"):
            notes.insert(0, _inactive_note(cfg) or "all requested flags inactive")
        elif cfg.get("inactive_reasons"):
            notes.insert(0, _inactive_note(cfg))
        rows.append({"config": cfg["name"], "kind": cfg.get("kind"), "flag": cfg.get("flag") or "",
                     "runs": len(groups), "iterations": int(sum(len(g) for g in groups)),
                     "period_ms": point, "ci_low": lo, "ci_high": hi, "iter_ms": window_ms, "note": "; ".join(notes)})
    out = pd.DataFrame(rows)
    base = _by_kind(ab, "baseline")
    for c in ("speedup", "speedup_low", "speedup_high"):
        out[c] = np.nan
    if base is not None and len(boots.get(base, [])):
        for i, cfg in enumerate(ab.configs):
            b = boots[cfg["name"]]
            if cfg["name"] == base or cfg.get("all_inactive") or not len(b):
                continue
            ratio = boots[base] / b
            out.loc[i, "speedup"] = out.loc[out["config"] == base, "period_ms"].iloc[0] / out.loc[i, "period_ms"]
            out.loc[i, ["speedup_low", "speedup_high"]] = np.percentile(ratio, [2.5, 97.5])
    out = out[["config", "kind", "flag", "runs", "iterations", "period_ms", "ci_low", "ci_high",
               "speedup", "speedup_low", "speedup_high", "iter_ms", "note"]]
    out.attrs["boot"] = boots
    return out


def _by_kind(ab: Ablation, kind: str, flag: str | None = None) -> str | None:
    for cfg in ab.configs:
        if cfg.get("kind") == kind and (flag is None or cfg.get("flag") == flag):
            return cfg["name"]
    return None


def _inactive(cfg: dict, flag: str) -> str | None:
    """Why `flag` did not take effect in config `cfg`, or None. (all_inactive of an all_but
    config speaks of the flags left on, not of the one removed.)"""
    why = (cfg.get("inactive_reasons") or {}).get(flag)
    if why:
        return str(why)
    if cfg.get("kind") == "alone" and cfg.get("flag") == flag and cfg.get("all_inactive"):
        return "inactive (no reason recorded)"
    return None


def flag_contributions(ab: Ablation, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each flag's marginal contribution in ms of iteration period saved (positive = faster).

    alone_ms = baseline - (+flag); removal_ms = (all - flag) - all, i.e. what removing the flag
    from everything-on costs. CIs from the bootstrap samples of the two configs. n/a (NaN) where
    a config is missing, or where the flag was inactive in it (reason in note_alone/note_removal).
    """
    table = ablation_table(ab) if table is None else table
    boots, ms = table.attrs["boot"], table.set_index("config")["period_ms"]
    cfgs = {c["name"]: c for c in ab.configs}
    base, full = _by_kind(ab, "baseline"), _by_kind(ab, "all")

    def diff(slow: str | None, fast: str | None, flag: str) -> tuple[float, float, float, str]:
        if slow is None or fast is None:
            return np.nan, np.nan, np.nan, "config not in the ablation"
        for name in (slow, fast):
            why = _inactive(cfgs[name], flag)
            if why:
                return np.nan, np.nan, np.nan, f"n/a: {why}"
        if not len(boots[slow]) or not len(boots[fast]):
            return np.nan, np.nan, np.nan, "no timed iterations"
        d = boots[slow] - boots[fast]
        lo, hi = np.percentile(d, [2.5, 97.5])
        return float(ms[slow] - ms[fast]), float(lo), float(hi), ""

    rows = []
    flags = ab.manifest.get("flags") or sorted({c.get("flag") for c in ab.configs if c.get("flag")})
    for flag in flags:
        a = diff(base, _by_kind(ab, "alone", flag), flag)
        r = diff(_by_kind(ab, "all_but", flag), full, flag)
        rows.append({"flag": flag, "alone_ms": a[0], "alone_low": a[1], "alone_high": a[2],
                     "alone_pct": 100 * a[0] / ms[base] if base is not None else np.nan,
                     "removal_ms": r[0], "removal_low": r[1], "removal_high": r[2], "note_alone": a[3],
                     "note_removal": r[3]})
    return pd.DataFrame(rows)


def mean_breakdown(runs: list[Run]) -> pd.Series | None:
    """The runs' breakdown of their period: critical_stage_means over ranks, averaged over the runs
    (each weighing the same); None when none has stage records."""
    means = [critical_stage_means(run, "rank").mean() for run in runs if not critical_stages(run).empty]
    return pd.concat(means, axis=1).mean(axis=1) if means else None


def breakdown_columns(wide: pd.DataFrame) -> pd.DataFrame:
    """Stages in STAGES order, between_iterations, its parts (other last), iter_ms, period_ms."""
    first = [c for c in (*STAGES, BETWEEN_ITERATIONS) if c in wide.columns]
    last = [c for c in ("iter_ms", "period_ms") if c in wide.columns]
    parts = sorted((c for c in wide.columns if c not in first + last), key=lambda c: (c.endswith("/other"), c))
    return wide[first + parts + last]


def config_stage_means(ab: Ablation) -> pd.DataFrame:
    """Each config's own breakdown of its period: a row per config in manifest order, a column per
    stage (mean critical-path ms a rank; input_dist: its exposed part), between_iterations and its
    parts where recorded, then iter_ms and period_ms (a rank's means): mean_breakdown of the
    config's runs. Configs without stage records have no row."""
    rows = {}
    for cfg in ab.configs:
        means = mean_breakdown([ab.runs[r] for r in cfg.get("runs") or [] if r in ab.runs])
        if means is not None:
            rows[cfg["name"]] = means
    if not rows:
        return pd.DataFrame(columns=[*STAGES, BETWEEN_ITERATIONS, "iter_ms", "period_ms"])
    return breakdown_columns(pd.DataFrame(rows).T.rename_axis("config"))
