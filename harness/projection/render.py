"""The projected report: stage table, a Gantt of one iteration (text for rank 0, a PNG of up to
eight ranks), findings, the flag waterfall with the mechanism the model credits each flag with,
the planner's alternatives projected the same way, and every assumption with its source; all
marked "projected". Markdown, plus PNGs drawn by harness/report/plots.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from harness.names import STAGES
from harness.projection import kernels
from harness.projection.hardware import Profile
from harness.projection.project import Calibration, Projection
from harness.projection.work import Work
from harness.report.plots import plot_lanes, plot_waterfall
from model.plan_traffic import LEVELS

MISS = 0.30
SHOWN_RANKS = 8
"""The Gantt PNG draws at most this many ranks (rank 0, the slowest, and others evenly spaced)."""

# What the model credits each flag with, one line each: harness/projection/project.py's module
# docstring (the ops each flag changes in iteration_ops), said here once more for the report.
MECHANISMS = {
    "skip_splits_a2a": "no splits all-to-all, no D2H of the splits and no host sync in input_dist",
    "pinned_d2h": "the splits' copy is waited by its event: the host waits for the splits exchange only, "
                  "not for the compute stream to drain (a pageable copy's sync)",
    "threaded_input_dist": "input dist's wait moves to its own thread; the main thread pays a hand-off and "
                           "still runs the launches (the GIL)",
    "cuda_graphs": "dense_fwd_bwd's launches become one graph replay on the host; the device still runs "
                   "every kernel, a small gap apart",
    "avoid_record_streams": "no time credited (it changes the NCCL allocator's bookkeeping; inactive on "
                            "torch >= 2.8)",
}
PLAN_STAGES = ("input_dist", "emb_fwd", "emb_bwd")
"""The stages a sharding plan changes: its exchanges, its groups' kernels, its lookups."""


def stage_table(p: Projection) -> pd.DataFrame:
    """Each stage's projected time over the ranks (max, mean, min) and its share of the period."""
    rows = []
    for s in (*STAGES, "between_iterations"):
        v = p.result.stage_s[s] * 1e3
        rows.append({"stage": s, "max_ms": float(np.max(v)), "mean_ms": float(np.mean(v)), "min_ms": float(np.min(v)),
                     "share": float(np.max(v)) / p.period_ms if p.period_ms else 0.0})
    return pd.DataFrame(rows)


def _measured(p: Projection) -> list:
    """The spans of the measured (steady-state) iteration."""
    return [s for s in p.result.spans if s[0] == p.result.iteration]


def gantt(p: Projection, rank: int = 0, width: int = 72) -> str:
    """One rank's measured iteration as text: a row per lane, a letter per stage."""
    spans = [(st, lane, float(a[rank]), float(b[rank])) for _, st, lane, a, b in _measured(p)]
    t0 = min(a for _, _, a, _ in spans)
    t1 = max(t0 + p.result.period_s, max(b for *_, b in spans))
    scale = width / max(t1 - t0, 1e-12)
    out = [f"rank {rank}, one iteration ({(t1 - t0) * 1e3:.2f} ms across; letters: i input_dist, f emb_fwd, "
           "d dense_fwd_bwd, b emb_bwd, u dense_update, . between)"]
    letter = {"input_dist": "i", "emb_fwd": "f", "dense_fwd_bwd": "d", "emb_bwd": "b", "dense_update": "u",
              "between_iterations": "."}
    for lane in ("host", "compute", "comm"):
        row = [" "] * width
        for st, ln, a, b in spans:
            if ln == lane and b > a:
                first = int((a - t0) * scale)
                for x in range(first, min(width, max(int((b - t0) * scale), first + 1))):
                    row[x] = letter[st]
        out.append(f"{lane:>8} |{''.join(row)}|")
    return "\n".join(out)


def iteration_end(p: Projection) -> np.ndarray:
    """Per rank, when its last op of the measured iteration ends (seconds)."""
    return np.max([b for *_, b in _measured(p)], axis=0)


def iteration_start(p: Projection) -> np.ndarray:
    """Per rank, when the measured iteration starts as timeline.simulate marks it: the later of its
    host's and its compute stream's ends in the iteration before (both lanes only move forward)."""
    before = [b for it, _, lane, _, b in p.result.spans if it == p.result.iteration - 1 and lane != "comm"]
    return np.max(before, axis=0)


def shown_ranks(p: Projection, limit: int = SHOWN_RANKS) -> tuple[list[int], str]:
    """The ranks the Gantt PNG draws and a phrase saying which: every rank up to `limit`; beyond,
    rank 0, the rank whose measured iteration ends last, and the rest evenly spaced."""
    world = p.world_size
    if world <= limit:
        return list(range(world)), f"ranks 0-{world - 1}" if world > 1 else "rank 0"
    end = iteration_end(p)
    slowest = int(np.argmax(end))
    must = sorted({0, slowest})
    others = [r for r in range(world) if r not in must]
    # Spread over the whole range, the last rank included, so a straggler at either end can show.
    picks = np.unique(np.linspace(0, len(others) - 1, limit - len(must)).round().astype(int))
    ranks = sorted({*must, *(others[i] for i in picks)})
    rest = ", ".join(str(r) for r in ranks if r not in must)
    # Collectives line the ranks up: often none ends later than another, and "slowest" would mislead.
    last = f"slowest {slowest}" if np.ptp(end) > 1e-9 else "all end together"
    return ranks, f"{len(ranks)} of {world} ranks: 0, {last}, evenly spaced {rest}"


def lane_spans(p: Projection, ranks: Sequence[int] | None = None) -> pd.DataFrame:
    """The measured iteration's ops on `ranks` (all by default), a row a rank, op and lane: rank,
    lane, stage, start_ms, end_ms, from the iteration's start on its earliest rank (so the next one
    starts at the period). A host running ahead launches before that start: negative times. Empty
    ops (a launch with no device work, a wait that did not wait) are left out: nothing to draw."""
    t0 = float(np.min(iteration_start(p)))
    ranks = range(p.world_size) if ranks is None else ranks
    rows = [dict(rank=r, lane=lane, stage=st, start_ms=(float(a[r]) - t0) * 1e3, end_ms=(float(b[r]) - t0) * 1e3)
            for _, st, lane, a, b in _measured(p) for r in ranks if b[r] > a[r]]
    return pd.DataFrame(rows, columns=["rank", "lane", "stage", "start_ms", "end_ms"])


def plot_gantt(p: Projection, path: Path) -> Path:
    """timeline.png: the measured iteration on the ranks shown_ranks picks, marked projected."""
    ranks, which = shown_ranks(p)
    return plot_lanes(lane_spans(p, ranks), path, period_ms=p.period_ms,
                      title=f"PROJECTED timeline ({p.label}), one iteration, {which}")


def waterfall(base: Projection, alone: dict[str, Projection], every: Projection) -> pd.DataFrame:
    """Baseline, each flag alone and all flags: their periods, against the baseline, and the
    mechanism the model credits each flag with (MECHANISMS)."""
    rows = [{"config": "baseline (no flag)", "period_ms": base.period_ms, "vs_baseline": 1.0,
             "mechanism": "every flag off (pipeline as configured)"}]
    for flag, p in alone.items():
        how = MECHANISMS[flag] if p.flags.get(flag) else f"inactive: {p.inactive.get(flag, 'not requested')}"
        rows.append({"config": f"+{flag} alone", "period_ms": p.period_ms, "vs_baseline": p.period_ms / base.period_ms,
                     "mechanism": how})
    rows.append({"config": "all flags", "period_ms": every.period_ms, "vs_baseline": every.period_ms / base.period_ms,
                 "mechanism": "every mechanism above at once (where they hide the same wait, they do not add)"})
    return pd.DataFrame(rows)


def waterfall_contrib(base: Projection, alone: dict[str, Projection]) -> pd.DataFrame:
    """plot_waterfall's frame: each flag's period saved alone (ms); NaN where the profile turns it off."""
    # + 0.0: a flag that changes nothing reads 0, not -0.
    return pd.DataFrame([{"flag": f, "alone_ms": base.period_ms - p.period_ms + 0.0 if p.flags.get(f) else np.nan}
                         for f, p in alone.items()], columns=["flag", "alone_ms"])


def _md(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(lines)


def assumptions_table(profile: Profile, cal: Calibration) -> pd.DataFrame:
    """Every figure the projection used, with its source: the profile's, then the calibration's."""
    rows = [dict(figure=k, value=v, source=s, note=n) for k, v, s, n in profile.assumptions()]
    rows.append(dict(figure="embedding kernels a group", value=kernels.GROUP_COUNTS,
                     source="trace: the fifth H100 session's one-GPU runs (kernels.py)",
                     note=kernels.GROUP_COUNTS_BEYOND_ONE))
    per = cal.host_per_sample_s
    rows += [dict(figure=f"host_fixed_{s}", value=f"{v * 1e3:.3f} ms + {per.get(s, 0.0) * 1e6:.3f} us a sample",
                  source=cal.sources.get(f"host_fixed_{s}", ""),
                  note="host time beyond launches, a fixed part and a part a sample of the local batch (their "
                       "sum at least 0; a part a sample below 0 held at the calibration's batches "
                       f"{'/'.join(map(str, cal.batches)) or '(one)'}); in turns where CPU ranks outnumber cores")
             for s, v in cal.host_fixed_s.items()]
    rows.append(dict(figure="between_iterations", value=f"{cal.between_s * 1e3:.3f} ms + "
                     f"{cal.between_per_sample_s * 1e6:.3f} us a sample",
                     source=cal.sources.get("between_s", ""),
                     note="host-side batch (and records, where no flush_records part says otherwise)"))
    if "flush_s" in cal.sources:
        rows.append(dict(figure="flush", value=f"{cal.flush_s * 1e3:.3f} ms a flush", source=cal.sources["flush_s"],
                         note="one write of the records, every --flush-every iterations of the projected run"))
    if "between_drains" in cal.sources:
        rows.append(dict(figure="between_drains", value=str(cal.between_drains), source=cal.sources["between_drains"],
                         note="the host waits for the device before its between-iterations work"))
    return pd.DataFrame(rows)


def findings(base: Projection, every: Projection, profile: Profile) -> list[str]:
    """The baseline's and all flags' periods, their dominant stages, what bounds each (bound), their
    ratio."""
    out = []
    for p in (base, every):
        st = stage_table(p)
        top = st.iloc[st["max_ms"].idxmax()]
        out.append(f"{p.label}: projected period {p.period_ms:.2f} ms (timed window {p.window_ms:.2f} ms), "
                   f"dominant stage {top['stage']} {top['max_ms']:.2f} ms ({top['share']:.0%}); {bound(p, profile)[0]}")
    out.append(f"projected ratio baseline/all flags: {base.period_ms / every.period_ms:.2f}x")
    return out


def against_published(base: Projection, every: Projection, profile: Profile) -> list[str]:
    """Beside the published figures; where the model misses by more than MISS, the stage it cannot
    explain (bound)."""
    pairs = ((base, 7.6, "TorchRec baseline 7.6 ms"), (every, 3.4, "TorchRec optimized 3.4 ms"),
             (every, 2.3, "MLPerf record ~2.3 ms"))
    out = []
    for p, ms, name in pairs:
        err = p.period_ms / ms - 1
        line = f"{p.label} {p.period_ms:.2f} ms vs {name}: {err:+.0%}"
        if abs(err) > MISS:
            what, stage = bound(p, profile)
            line += f" (> {MISS:.0%}: " + (f"the stage it cannot explain: {stage})" if stage else f"{what})")
        out.append(line)
    out.append(f"ratio {base.period_ms / every.period_ms:.2f}x vs published 7.6/3.4 = 2.24x")
    return out


def lane_work_ms(p: Projection, lane: str) -> dict[str, float]:
    """Stage -> the work the busiest rank's `lane` (host, device, comm) does in it, waits left out
    (timeline.Result.work_s; the busiest rank: the most work on that lane)."""
    stages = [s for s in (*STAGES, "between_iterations") if (s, lane) in p.result.work_s]
    if not stages:
        return {}
    per_rank = np.array([p.result.work_s[(s, lane)] * np.ones(p.world_size) for s in stages]) * 1e3
    r = int(np.argmax(per_rank.sum(axis=0)))
    return {s: float(per_rank[i, r]) for i, s in enumerate(stages)}


def bound(p: Projection, profile: Profile) -> tuple[str, str | None]:
    """(what bounds the projected period, the stage carrying most of it): the host's work, the
    device's (on a CPU: the host's ops and its compute, which it runs one after the other), each
    lane's waits left out, or neither (waits for the exchanges and other ranks; no stage then). The
    stage comes with its launches and the calibrated cost a launch where the host bounds it. A
    stage's time in the stage table holds its waits too, so the longest stage need not be where the
    time goes: with every flag at 16 x 8, the dense step's graph runs under the host's launches of
    the embedding stages."""
    words = ("host", "device") if profile.async_device else ("host ops", "compute")
    host, dev = lane_work_ms(p, "host"), lane_work_ms(p, "device")
    h, d = sum(host.values()), sum(dev.values())
    (lane, other), work, busy = (words, host, h) if h >= d else (words[::-1], dev, d)
    if busy < 0.5 * p.period_ms:
        comm = lane_work_ms(p, "comm")
        top = max(comm, key=comm.get) if comm else "none"
        return (f"neither lane busy half the period ({words[0]} {h:.2f} ms, {words[1]} {d:.2f}): waits for the "
                f"exchanges and the other ranks, the most exchanged in {top} ({comm.get(top, 0.0):.2f} ms)"), None
    ranked = [(s, v) for s, v in sorted(work.items(), key=lambda kv: -kv[1]) if v >= 0.005]
    what = (f"bound by the {lane}: {lane} {busy:.2f} of {p.period_ms:.2f} ms an iteration, {other} {min(h, d):.2f}; "
            f"most in " + ", ".join(f"{s} {v:.2f}" for s, v in ranked[:3]))
    stage, ms = ranked[0]
    detail = f"{stage}, {ms:.2f} ms on the {lane}"
    graphed = stage == "dense_fwd_bwd" and p.flags.get("cuda_graphs")
    if lane == "host" and stage in STAGES and not graphed:
        f = profile.figures["launch_us"]
        n = p.kernels.of(stage)
        launches = n * f.value / 1e3
        rest = f"; {ms - launches:.2f} ms its host time beyond them" if ms - launches >= 0.01 else ""
        detail += f" ({n} launches at {f.value:.1f} us, {f.source}: {launches:.2f} ms{rest})"
    return what, detail


@dataclass(frozen=True)
class PlanProjection:
    """One sharding plan of the configuration projected on the same profile and calibration: its
    baseline (no flag) and all flags."""

    name: str
    plan: tuple
    work: Work
    base: Projection
    every: Projection


def kinds_used(plan: Sequence) -> str:
    """How many tables each sharding kind holds, e.g. "column_wise:10 data_parallel:16"."""
    counts = Counter(str(tp.kind) for tp in plan)
    return " ".join(f"{k}:{n}" for k, n in sorted(counts.items()))


def exchange_mb(work: Work) -> dict[tuple[str, str], float]:
    """(exchange, link level) -> MB the busiest rank moves in its busier direction (what the
    exchange's time is priced on: Work.exchange_seconds)."""
    return {(name, level): float(x[i].max()) / 1e6
            for name, x in work.exchange.items() for i, level in enumerate(LEVELS)}


def _lane_ms(p: Projection, lane: str, stages: Sequence[str]) -> float:
    """Time on `lane` in `stages` of the measured iteration, busiest rank (ms)."""
    spans = [b - a for _, st, ln, a, b in _measured(p) if ln == lane and st in stages]
    return float(np.max(np.sum(spans, axis=0))) * 1e3 if spans else 0.0


def _plan_kernels(p: Projection) -> int:
    """Kernels launched in the stages a plan changes, a rank an iteration."""
    return sum(p.kernels.of(s) for s in PLAN_STAGES)


def plan_costs(pp: PlanProjection, profile: Profile) -> dict[str, float]:
    """What a plan changes in the baseline's iteration (ms, busiest rank): its embedding exchanges
    as the comm lane runs them (transfer and latency, no waiting), the launches of its stages'
    kernels (each sharding group its own), and its lookups at the calibrated share of HBM."""
    lookup = (pp.work.lookup_fwd + pp.work.lookup_bwd).max() / (profile.value("hbm_gbps") * 1e9
                                                                 * profile.value("lookup_eff"))
    return {"embedding exchanges on the comm lane": _lane_ms(pp.base, "comm", PLAN_STAGES),
            "kernel launches of input_dist, emb_fwd, emb_bwd": _plan_kernels(pp.base) * profile.value("launch_us")
            / 1e3,
            "lookups on the busiest rank": float(lookup) * 1e3}


def _bytes_by_level(work: Work) -> dict[str, float]:
    """Link level -> MB the busiest rank moves over the three exchanges (busier direction each)."""
    mb = exchange_mb(work)
    return {level: sum(v for (_, lv), v in mb.items() if lv == level) for level in LEVELS}


def plan_mechanism(ref: PlanProjection, pp: PlanProjection, profile: Profile) -> str:
    """One line: what in `pp` makes its baseline period differ from `ref`'s, as the model credits
    it: plan_costs' differences, largest first, each with the bytes or groups behind it (they
    overlap in the timeline, so they need not add up to the period's difference)."""
    a, b = plan_costs(ref, profile), plan_costs(pp, profile)
    ma, mb = _bytes_by_level(ref.work), _bytes_by_level(pp.work)
    la, lb = ((x.work.lookup_fwd + x.work.lookup_bwd).max() / 1e6 for x in (ref, pp))
    groups = (f"sharding groups {len(ref.work.groups)} -> {len(pp.work.groups)}, each its own kernels: "
              f"{_plan_kernels(ref.base)} -> {_plan_kernels(pp.base)} kernels")
    why = {"embedding exchanges on the comm lane": f"the busiest rank's exchange bytes across nodes "
           f"{ma['inter']:.2f} -> {mb['inter']:.2f} MB, in the node {ma['intra']:.2f} -> {mb['intra']:.2f} MB; "
           f"each sharding group's collectives pay the latency: {len(ref.work.groups)} -> {len(pp.work.groups)} groups",
           "kernel launches of input_dist, emb_fwd, emb_bwd": groups,
           "lookups on the busiest rank": f"lookup bytes {la:.2f} -> {lb:.2f} MB"}
    order = sorted(a, key=lambda k: -abs(b[k] - a[k]))
    parts = [f"{k} {a[k]:.3f} -> {b[k]:.3f} ms ({why[k]})" for k in order]
    return (f"{pp.name} against {ref.name}: baseline period {pp.base.period_ms - ref.base.period_ms:+.3f} ms; "
            f"modelled differences, largest first: {'; '.join(parts)}")


def plans_stage_table(plans: Sequence[PlanProjection]) -> pd.DataFrame:
    """The period and the stages whose projected time (busiest rank) differs between the plans, a
    column a plan and flag set; stages every plan gives the same time are left out."""
    cols = {f"{pp.name} {which}_ms": getattr(pp, key) for pp in plans
            for which, key in (("baseline", "base"), ("all_flags", "every"))}
    rows = [{"stage": "period", **{c: p.period_ms for c, p in cols.items()}}]
    for s in (*STAGES, "between_iterations"):
        vals = {c: p.stage_ms("max")[s] for c, p in cols.items()}
        by_plan = np.array(list(vals.values())).reshape(len(plans), 2)
        # Differs: between plans, by more than rounding (a microsecond or 0.5%).
        if np.any(np.abs(by_plan - by_plan[0]) > np.maximum(1e-3, 5e-3 * np.abs(by_plan[0]))):
            rows.append({"stage": s, **vals})
    return pd.DataFrame(rows)


def plans_exchange_table(plans: Sequence[PlanProjection]) -> pd.DataFrame:
    """Each exchange's MB on the busiest rank (busier direction) by link level, a column a plan and level."""
    mb = {pp.name: exchange_mb(pp.work) for pp in plans}
    rows = []
    for name in plans[0].work.exchange:
        rows.append({"exchange": name, **{f"{pp.name} {level}_MB": mb[pp.name][(name, level)]
                                          for pp in plans for level in LEVELS}})
    return pd.DataFrame(rows)


def plan_line(pp: PlanProjection) -> str:
    """A plan in one line: its kinds, groups and projected periods."""
    return (f"plan {pp.name}: {kinds_used(pp.plan)}; groups {', '.join(pp.work.groups)}; projected period "
            f"baseline {pp.base.period_ms:.2f} ms, all flags {pp.every.period_ms:.2f} ms")


def plans_section(plans: Sequence[PlanProjection], profile: Profile) -> list[str]:
    """The "Plans (projected)" section: each plan's kinds and periods, the stages that differ, the
    exchange bytes by link level, and the mechanism behind each difference from the first plan."""
    text = ["## Plans (projected)", "",
            "Each plan projected with the same profile and calibration; the first is the reference.", ""]
    text += [f"- {plan_line(pp)}" for pp in plans]
    text += [f"- mechanism: {plan_mechanism(plans[0], pp, profile)}" for pp in plans[1:]]
    if any(pp.name == "torchrec" for pp in plans):
        text.append("- TorchRec's plan can differ from one process to the next unless PYTHONHASHSEED is fixed "
                    "(make project and make plan-compare fix it at 0; seen on tiny at 2 x 2: column_wise or "
                    "table_wise; on mlperf at 16 x 8: grid_shard or table_row_wise, at the same projected periods)")
    text += ["", "Period and the stages that differ between plans (busiest rank, ms):", "",
             _md(plans_stage_table(plans)), "",
             "Exchange bytes on the busiest rank (busier direction, MB) by link level:", "",
             _md(plans_exchange_table(plans)), ""]
    return text


def write(out: Path, *, title: str, base: Projection, alone: dict, every: Projection, main: Projection,
          profile: Profile, cal: Calibration, extra: list[str], plans: Sequence[PlanProjection] = (),
          published: bool = True) -> Path:
    """projection.md, its CSVs and its PNGs (timeline.png, waterfall.png) under `out`; `published`:
    the findings set the published 16 x 8 H100 figures beside the projection (mlperf on h100)."""
    out.mkdir(parents=True, exist_ok=True)
    wf = waterfall(base, alone, every)
    plot_gantt(main, out / "timeline.png")
    plot_waterfall(waterfall_contrib(base, alone), base.period_ms, every.period_ms, out / "waterfall.png",
                   title="PROJECTED ablation waterfall: baseline period to all flags (ms; green: faster)")
    text = [f"# {title} (PROJECTED, not measured)", "", "## Findings (projected)", ""]
    lines = findings(base, every, profile) + (against_published(base, every, profile) if published else []) + extra
    text += [f"- {x}" for x in lines]
    text += ["", f"## Stage table (projected: {main.label})", "", _md(stage_table(main)), "",
             "## Timeline (projected)", "", f"![projected timeline, {main.label}](timeline.png)", "",
             "```", gantt(main), "```", "",
             "## Flag waterfall (projected)", "", "![projected flag waterfall](waterfall.png)", "", _md(wf), ""]
    if plans:
        text += plans_section(plans, profile)
    text += ["## Assumptions and sources", "", _md(assumptions_table(profile, cal)), ""]
    path = out / "projection.md"
    path.write_text("\n".join(text))
    stage_table(main).to_csv(out / "stages.csv", index=False)
    wf.to_csv(out / "waterfall.csv", index=False)
    return path
