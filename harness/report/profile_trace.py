"""Host against device, per stage, read from a --profile Chrome trace (rankNNNNN/trace.json[.gz]).

The stage records time each stage on the host (or between CUDA events); they cannot say whether
the GPU was kept busy. The torch.profiler trace can: every kernel (and memcpy/memset) carries the
correlation id of the runtime/driver call that launched it, so a kernel is charged to the stage
whose host range (an annotation on the loop's thread) holds its launch, on whatever thread the
launch ran (autograd's device thread launches emb_bwd's kernels during dense_fwd_bwd's backward,
so they are dense_fwd_bwd's here). Per stage this gives the host's time against the kernels' and
the GPU's idle time inside the stage's window; over the window, how much of the period the GPU
idles and how much of that lies between iterations, waiting for the host. Times are ms. Reads
JSON only: no torch (docs/layout.md)."""

from __future__ import annotations

import gzip
import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from harness.names import BETWEEN_ITERATIONS, STAGES
from harness.report.html import Doc
from harness.report.intervals import covered, union as merged
from harness.report.load import ReportError

KERNEL_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
"""Trace categories of device work: what keeps the GPU busy."""
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
"""Host API calls; those whose correlation id a kernel carries are its launch."""
ANNOTATION_CAT = "user_annotation"
"""Host ranges opened by record_function: the stages, among others (nccl:*, Optimizer.step#...)."""
OUTSIDE = "(outside stages)"
"""The row of kernels launched outside every stage range (an input dist launched by no annotated stage)."""

KERNEL_BOUND_BUSY = 0.8
"""Kernel-bound: the GPU is busy (any kernel running) at least this share of the window (for a
stage: its first kernel's start to its last kernel's end; for the whole window: the period): the
kernels set the pace, and launching faster would not help."""
LAUNCH_WAIT_SHARE = 0.5
"""Launch-bound: below KERNEL_BOUND_BUSY, and at least this share of the GPU's idle time inside the
window passed before the next kernel's launch call had even begun (launch_wait_ms): nothing was
queued, the GPU waited for the host. Kernels arrive slower than they run, so the host's launching
sets the pace. Below KERNEL_BOUND_BUSY with less of the idle waiting for a launch: mixed (the GPU
waited on something else: another stream, an event, the launch latency of work already launched)."""
NO_KERNELS = "no kernels"
"""The verdict of a row without device work (a CPU run's trace, a stage that launches nothing)."""
NO_VERDICT = "n/a"
"""OUTSIDE's verdict: its kernels are scattered over the iteration, so it has no window to judge."""

STAGE_COLUMNS = ("stage", "iterations", "host_ms", "kernels", "launch_ms", "kernel_ms", "gpu_busy_ms",
                 "gpu_window_ms", "gpu_idle_ms", "idle_frac", "launch_wait_ms", "verdict")
SUMMARY_COLUMNS = ("iterations", "period_ms", "gpu_busy_ms", "gpu_idle_ms", "idle_frac", "launch_wait_ms",
                   "between_idle_ms", "verdict")
TRACE_NAMES = ("trace.json", "trace.json.gz")


@dataclass(frozen=True)
class Trace:
    """The parts of a trace the analysis reads, times in ms from the trace's first event."""

    spans: pd.DataFrame
    """Stage ranges: stage, iteration, start, end (sorted by start)."""
    kernels: pd.DataFrame
    """Device work: start, end, name, launch (its call's start, NaN unmatched), launch_ms (its duration),
    stage (OUTSIDE when no range holds the launch), iteration (-1: before the first)."""
    busy: np.ndarray
    """The union of every kernel's interval, as disjoint (start, end) rows: when the GPU ran anything."""


@dataclass(frozen=True)
class Profile:
    """One trace analysed: the per-stage table, the whole-window summary and its finding."""

    stages: pd.DataFrame
    summary: dict
    finding: str


# --- reading ----------------------------------------------------------------------

def read_events(path: Path) -> list[dict]:
    """The trace's events. gzip is recognised by its magic bytes, not the name, so a renamed file
    still reads; a torn file (a run killed while exporting) is a one-line ReportError, not a crash."""
    try:
        raw = Path(path).read_bytes()
        data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, EOFError, zlib.error, ValueError) as exc:
        raise ReportError(f"cannot read trace {path}: {(str(exc).splitlines() or [type(exc).__name__])[0]}") from exc
    # torch.profiler writes {"traceEvents": [...]}; a bare list is the other form Chrome accepts.
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ReportError(f"{path} holds no traceEvents list: not a Chrome trace")
    return [e for e in events if isinstance(e, dict)]


def _complete_events(events: list[dict]) -> pd.DataFrame:
    """Complete ("X") events of the categories read, with start/end in ms from the first of them."""
    cats = {ANNOTATION_CAT, *KERNEL_CATS, *LAUNCH_CATS}
    rows = []
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in cats and isinstance(e.get("ts"), (int, float)):
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            rows.append((e["cat"], str(e.get("name", "")), float(e["ts"]), float(e.get("dur") or 0.0),
                         args.get("correlation"), e.get("tid")))
    df = pd.DataFrame(rows, columns=["cat", "name", "ts", "dur", "correlation", "tid"])
    t0 = df["ts"].min() if not df.empty else 0.0
    # Microseconds since the epoch are ~1e12: subtract the origin before converting, to keep ns digits.
    df["start"] = (df["ts"] - t0) / 1e3
    df["end"] = df["start"] + df["dur"] / 1e3
    return df


def stage_spans(annotations: pd.DataFrame) -> pd.DataFrame:
    """The stage ranges, numbered by iteration: a new iteration starts at each occurrence of the
    first stage of STAGES the trace holds as a whole range (input_dist has parts only, so emb_fwd).
    A part, `<stage>:<name>` (the input dist's pieces, sub-spans), counts for its stage on its own
    thread (`part`, `tid`) and opens no iteration; `outer`: no other range of its stage on its
    thread holds it (host time sums those). `between_iterations:<name>` is named
    `between_iterations/<name>`, as in the stage tables. Ranges before the first opener: dropped."""
    prefix = BETWEEN_ITERATIONS + ":"
    name = annotations["name"]
    stage_of_part = name.str.split(":", n=1).str[0].where(name.str.contains(":", regex=False))
    is_part = stage_of_part.isin(STAGES)
    keep = annotations[name.isin(STAGES) | name.str.startswith(prefix) | is_part].assign(part=is_part)
    keep = keep.sort_values("start", kind="stable")
    names = keep["name"].str.replace(prefix, BETWEEN_ITERATIONS + "/", regex=False)
    names = names.where(~keep["part"], names.str.split(":", n=1).str[0])
    whole = names[~keep["part"]]
    first = next((s for s in STAGES if (whole == s).any()), None)
    if first is None:
        return pd.DataFrame(columns=["stage", "iteration", "start", "end", "part", "tid", "outer"])
    opener = ((names == first) & ~keep["part"]).to_numpy()
    out = pd.DataFrame({"stage": names.to_numpy(), "iteration": opener.cumsum() - 1,
                        "start": keep["start"].to_numpy(), "end": keep["end"].to_numpy(),
                        "part": keep["part"].to_numpy(bool), "tid": keep["tid"].to_numpy(object)})
    out["outer"] = [not ((out["stage"] == r.stage) & (out["tid"] == r.tid) & (out.index != i)
                         & (out["start"] <= r.start) & (out["end"] >= r.end)).any()
                    for i, r in zip(out.index, out.itertuples())]
    return out[out["iteration"] >= 0].reset_index(drop=True)


def launch_waits(k: pd.DataFrame, union: np.ndarray) -> pd.Series:
    """For each gap between consecutive kernels of k (by start): the GPU's idle time in it that passed
    before the next kernel's launch call began: nothing queued, the GPU waiting for the host. Idle,
    not merely a gap: other kernels (of `union`) running in it are subtracted. Indexed by the kernel
    before the gap; a kernel without a matched launch waits on nothing."""
    d = k.sort_values("start", kind="stable")
    if len(d) < 2:
        return pd.Series(dtype=float)
    ran_until = np.maximum.accumulate(d["end"].to_numpy(float))[:-1]
    nxt_start, nxt_launch = d["start"].to_numpy(float)[1:], d["launch"].to_numpy(float)[1:]
    # The wait ends at the next launch call, but never before the GPU ran dry nor after the kernel began.
    until = np.clip(np.where(np.isnan(nxt_launch), ran_until, nxt_launch), ran_until,
                    np.maximum(ran_until, nxt_start))
    return pd.Series((until - ran_until) - covered(union, ran_until, until), index=d.index[:-1])


def _attribute(kernels: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """Each kernel's stage (the innermost range holding its launch) and iteration. A part holds only
    its own thread's launches; a whole stage any thread's (autograd's thread launches in
    dense_fwd_bwd). A kernel no range holds is OUTSIDE, in the iteration whose host interval holds
    its launch (or its start, unmatched). `part`: the kernel's range is a part."""
    when = kernels["launch"].fillna(kernels["start"]).to_numpy(float)
    s, e = spans["start"].to_numpy(float), spans["end"].to_numpy(float)
    inside = (s[None, :] <= when[:, None]) & (when[:, None] < e[None, :])
    same_thread = kernels["launch_tid"].to_numpy(object)[:, None] == spans["tid"].to_numpy(object)[None, :]
    inside &= ~spans["part"].to_numpy(bool)[None, :] | same_thread
    # Spans are sorted by start: the last one holding a launch is the innermost.
    last = len(s) - 1 - np.argmax(inside[:, ::-1], axis=1) if len(s) else np.zeros(len(when), int)
    hit = inside.any(axis=1) if len(s) else np.zeros(len(when), bool)
    opens = spans.groupby("iteration")["start"].min().sort_index().to_numpy(float)
    by_time = np.searchsorted(opens, when, side="right") - 1
    out = kernels.copy()
    out["stage"] = np.where(hit, spans["stage"].to_numpy(object)[last] if len(s) else OUTSIDE, OUTSIDE)
    out["iteration"] = np.where(hit, spans["iteration"].to_numpy(int)[last] if len(s) else -1, by_time)
    out["part"] = hit & (spans["part"].to_numpy(bool)[last] if len(s) else False)
    return out


def parse(events: list[dict]) -> Trace:
    """Stage ranges, kernels with their launch and stage, and the GPU's busy union, from the events."""
    df = _complete_events(events)
    spans = stage_spans(df[df["cat"] == ANNOTATION_CAT])
    launches = df[df["cat"].isin(LAUNCH_CATS) & df["correlation"].notna()].drop_duplicates("correlation")
    launches = launches.set_index("correlation")
    k = df[df["cat"].isin(KERNEL_CATS)][["start", "end", "correlation", "name"]].reset_index(drop=True)
    k["launch"] = k["correlation"].map(launches["start"])
    k["launch_ms"] = k["correlation"].map(launches["dur"] / 1e3).fillna(0.0)
    k["launch_tid"] = k["correlation"].map(launches["tid"])
    kernels = _attribute(k.drop(columns="correlation"), spans)
    return Trace(spans=spans, kernels=kernels, busy=merged(kernels["start"].to_numpy(), kernels["end"].to_numpy()))


# --- the per-stage table ---------------------------------------------------------

def verdict(busy_share: float, wait_share: float) -> str:
    """kernel-bound / launch-bound / mixed from the GPU's busy share of a window and the share of its
    idle time spent waiting for a launch (thresholds above); NaN busy share: nothing ran."""
    if not busy_share > 0:
        return NO_KERNELS
    if busy_share >= KERNEL_BOUND_BUSY:
        return "kernel-bound"
    return "launch-bound" if wait_share >= LAUNCH_WAIT_SHARE else "mixed"


def _device_row(trace: Trace, g: pd.DataFrame) -> dict:
    """The device figures of one stage's kernels in one iteration: launches, the launch calls' time,
    kernel time, busy union, window, the GPU's idle time inside it (no kernel of any stage running,
    so overlapping work of another stage is not called idle) and the part of that idle spent waiting
    for the next launch."""
    lo, hi = float(g["start"].min()), float(g["end"].max())
    union = merged(g["start"].to_numpy(), g["end"].to_numpy())
    return dict(kernels=len(g), launch_ms=float(g["launch_ms"].sum()), kernel_ms=float((g["end"] - g["start"]).sum()),
                gpu_busy_ms=float((union[:, 1] - union[:, 0]).sum()), gpu_window_ms=hi - lo,
                gpu_idle_ms=hi - lo - float(covered(trace.busy, lo, hi)),
                launch_wait_ms=float(launch_waits(g, trace.busy).sum()))


def _per_iteration(trace: Trace) -> pd.DataFrame:
    """One row per (stage, iteration) the stage ran or launched in: its host range and device figures."""
    parts = trace.spans[trace.spans["part"]].groupby(["stage", "iteration"]).size()
    cut = parts[parts < parts.groupby(level="stage").transform("max")].index  # by the window's edge: left out
    outer = trace.spans[trace.spans["outer"]]
    host = outer.assign(host_ms=outer["end"] - outer["start"]).groupby(["stage", "iteration"])["host_ms"].sum()
    rows = [dict(stage=stage, iteration=it, **_device_row(trace, g))
            for (stage, it), g in trace.kernels[trace.kernels["iteration"] >= 0].groupby(["stage", "iteration"])]
    dev = pd.DataFrame(rows, columns=["stage", "iteration", "kernels", "launch_ms", "kernel_ms", "gpu_busy_ms",
                                      "gpu_window_ms", "gpu_idle_ms", "launch_wait_ms"])
    both = dev.set_index(["stage", "iteration"]).join(host, how="outer").drop(index=cut, errors="ignore")
    counts = ["kernels", "launch_ms", "kernel_ms", "gpu_busy_ms"]
    both[counts] = both[counts].fillna(0.0)  # a stage that ran and launched nothing: zero device work
    # OUTSIDE's kernels are scattered over the iteration: a window from the first to the last is no stage's.
    outside = both.index.get_level_values("stage") == OUTSIDE
    both.loc[outside, ["gpu_window_ms", "gpu_idle_ms", "launch_wait_ms"]] = np.nan
    return both.reset_index()


def _stage_order(stage: str) -> tuple[int, str]:
    """STAGES in order, then what runs between iterations, then OUTSIDE."""
    if stage in STAGES:
        return (STAGES.index(stage), stage)
    return (len(STAGES) + (stage == OUTSIDE), stage)


def stage_table(trace: Trace) -> pd.DataFrame:
    """Per stage, means per iteration over the iterations it was seen in (window, idle and launch
    wait: over those it launched in), and its verdict (STAGE_COLUMNS; docs/reports.md)."""
    per = _per_iteration(trace)
    if per.empty:
        return pd.DataFrame(columns=list(STAGE_COLUMNS))
    g = per.groupby("stage")
    table = g[["host_ms", "kernels", "launch_ms", "kernel_ms", "gpu_busy_ms", "gpu_window_ms", "gpu_idle_ms",
               "launch_wait_ms"]].mean()
    table.insert(0, "iterations", g.size())
    table["idle_frac"] = table["gpu_idle_ms"] / table["gpu_window_ms"]
    table["verdict"] = [NO_VERDICT if stage == OUTSIDE else
                        verdict(1.0 - r.idle_frac, r.launch_wait_ms / r.gpu_idle_ms if r.gpu_idle_ms > 0 else 0.0)
                        for stage, r in zip(table.index, table.itertuples())]
    table = table.reset_index()
    table = table.iloc[sorted(range(len(table)), key=lambda i: _stage_order(table["stage"].iloc[i]))]
    return table[list(STAGE_COLUMNS)].reset_index(drop=True)


# --- the whole window --------------------------------------------------------------

def _between_idle(trace: Trace, n: int) -> float:
    """Mean GPU idle from the last stage kernel's end of iteration i to the first stage kernel's start
    of i+1: the device waiting for the host between iterations. Work outside the stages, or of a
    stage's parts (the input dist launched between iterations), running there is busy, not idle."""
    k = trace.kernels[(trace.kernels["stage"] != OUTSIDE) & ~trace.kernels["part"] & (trace.kernels["iteration"] >= 0)]
    last, first = k.groupby("iteration")["end"].max(), k.groupby("iteration")["start"].min()
    gaps = [max(0.0, first[i + 1] - last[i] - float(covered(trace.busy, last[i], first[i + 1])))
            for i in range(n - 1) if i in last.index and i + 1 in first.index]
    return float(np.mean(gaps)) if gaps else float("nan")


def _period(trace: Trace, opens: pd.Series) -> tuple[float, list[int]]:
    """The mean period and the iterations it covers: start to start of the iterations' opening stage
    over every iteration followed by another; with one iteration, from its start to the window's end."""
    if len(opens) >= 2:
        return float(np.diff(opens.to_numpy()).mean()), list(opens.index[:-1])
    end = max(trace.spans["end"].max(), trace.kernels["end"].max() if len(trace.kernels) else -np.inf)
    return float(end - opens.iloc[0]), list(opens.index)


def summary(trace: Trace) -> dict:
    """Iterations, period, GPU busy and idle an iteration (idle_frac: of the period), the idle spent
    waiting for a launch, idle between iterations, verdict. Busy and launch wait are over the
    iterations the period covers, so busy + idle = period. A gap's launch wait belongs to the
    iteration of the kernel before it (the gap before the first kernel of the window is no
    iteration's, so launch wait is a little under what an iteration's opening gap would add)."""
    opens = trace.spans.groupby("iteration")["start"].min().sort_index()
    if opens.empty:
        return dict.fromkeys(SUMMARY_COLUMNS, float("nan")) | {"iterations": 0, "verdict": NO_KERNELS}
    period, counted = _period(trace, opens)
    k = trace.kernels[trace.kernels["iteration"] >= 0]
    waits = launch_waits(k, trace.busy)
    busy, wait = [], []
    for i in counted:
        mine = k[k["iteration"] == i]
        union = merged(mine["start"].to_numpy(), mine["end"].to_numpy())
        busy.append(float((union[:, 1] - union[:, 0]).sum()))
        wait.append(float(waits[waits.index.isin(mine.index)].sum()))
    gpu_busy, launch_wait = float(np.mean(busy)), float(np.mean(wait))
    idle = period - gpu_busy
    return dict(iterations=len(opens), period_ms=period, gpu_busy_ms=gpu_busy, gpu_idle_ms=idle,
                idle_frac=idle / period, launch_wait_ms=launch_wait,
                between_idle_ms=_between_idle(trace, len(opens)),
                verdict=verdict(gpu_busy / period, launch_wait / idle if idle > 0 else 0.0))


def finding(stages: pd.DataFrame, head: dict) -> str:
    """One line: the window's verdict, the GPU's busy time against the period, and the stage where
    the host holds longest against its GPU work (its host range minus its GPU busy time)."""
    if head["verdict"] == NO_KERNELS:
        return "no kernels in the trace (a CPU run, or no CUDA activity recorded): host ranges only"
    line = (f"{head['verdict']}: the GPU is busy {head['gpu_busy_ms']:.1f} of {head['period_ms']:.1f} ms an "
            f"iteration ({head['idle_frac']:.0%} idle, {head['launch_wait_ms']:.1f} ms of it waiting for a launch")
    if pd.notna(head["between_idle_ms"]):
        line += f", {head['between_idle_ms']:.1f} ms between iterations"
    line += ")"
    named = stages[stages["stage"].isin(STAGES) & (stages["kernels"] > 0)]
    if not named.empty:
        s = named.loc[(named["host_ms"] - named["gpu_busy_ms"]).idxmax()]
        line += (f"; {s['stage']}'s host range takes {s['host_ms']:.1f} ms for {s['kernel_ms']:.1f} ms of kernels "
                 f"({s['kernels']:.0f} launches, {s['launch_ms']:.1f} ms in launch calls; {s['verdict']}, GPU busy "
                 f"{1 - s['idle_frac']:.0%} of its window)")
    return line


def analyze(path: Path) -> Profile:
    """Read and analyse one trace; a trace without stage ranges (a --no-timeline run) is a ReportError."""
    trace = parse(read_events(path))
    if trace.spans.empty:
        raise ReportError(f"{path}: no stage ranges (annotations named {', '.join(STAGES)}): a run with "
                          "--no-timeline, or a trace of another program")
    stages, head = stage_table(trace), summary(trace)
    return Profile(stages=stages, summary=head, finding=finding(stages, head))


# --- a run folder's traces -----------------------------------------------------------

def rank_traces(run_dir: Path | None) -> dict[int, Path]:
    """Rank -> its trace (rankNNNNN/trace.json or trace.json.gz; the plain one when both)."""
    found: dict[int, Path] = {}
    if run_dir is None or not Path(run_dir).is_dir():
        return found
    for name in reversed(TRACE_NAMES):  # the plain name last, so it wins
        for p in sorted(Path(run_dir).glob(f"rank*/{name}")):
            m = re.fullmatch(r"rank(\d+)", p.parent.name)
            if m and p.is_file():
                found[int(m.group(1))] = p
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class RunProfiles:
    """Every rank trace of a run folder analysed, and the ones that could not be (rank -> why)."""

    profiles: dict[int, Profile]
    problems: dict[int, str]

    def findings(self) -> list[str]:
        """The lowest rank's finding, for the report's opening Findings."""
        if not self.profiles:
            return []
        rank = min(self.profiles)
        return [f"profiled iterations, rank {rank}: {self.profiles[rank].finding}"]


def read_run(run_dir: Path | None) -> RunProfiles:
    """Analyse each rank's trace; an unreadable one is named in problems, never fatal to a report."""
    profiles, problems = {}, {}
    for rank, path in rank_traces(run_dir).items():
        try:
            profiles[rank] = analyze(path)
        except ReportError as exc:
            problems[rank] = str(exc)
    return RunProfiles(profiles=profiles, problems=problems)


def add_section(doc: Doc, csvs: dict[str, pd.DataFrame], run: RunProfiles) -> None:
    """The report section "Host against device (profiled iterations)": the lowest
    rank's stage table and finding, every rank's summary, CSVs of all ranks. Nothing without traces."""
    if not run.profiles and not run.problems:
        return
    doc.h2("Host against device (profiled iterations)")
    for rank, why in run.problems.items():
        doc.warn(f"rank {rank}: trace not analysed: {why}")
    if not run.profiles:
        return
    rank = min(run.profiles)
    shown = run.profiles[rank]
    doc.p("From the --profile window's Chrome trace: each kernel (memcpy, memset) is charged to the stage whose "
          "host range holds its launch call, on any thread. Per stage, means per iteration: host_ms its host "
          "range; kernels and launch_ms the launches and the time of those launch calls; kernel_ms the kernels' "
          "summed time, gpu_busy_ms their union, gpu_window_ms first kernel start to last kernel end, gpu_idle_ms "
          "the window's time no kernel ran (idle_frac its share), launch_wait_ms the part of it before the next "
          f"kernel's launch call began. Verdict: kernel-bound when the GPU is busy >= {KERNEL_BOUND_BUSY:.0%} of "
          f"the window; else launch-bound when >= {LAUNCH_WAIT_SHARE:.0%} of its idle waited for a launch; "
          f"else mixed. {OUTSIDE}: kernels launched outside every stage range (an input dist opened as a span "
          "is not annotated). The profiler slows the host: read shares, not absolute times.")
    if len(run.profiles) > 1:
        doc.p(f"{len(run.profiles)} ranks wrote traces: rank {rank}'s table below, every rank's in "
              "host_device_stages.csv.")
    doc.table(shown.stages)
    heads = pd.DataFrame([{"rank": r, **p.summary} for r, p in run.profiles.items()])
    doc.p("The window, per iteration: period = start to start of the iterations' opening stage; GPU busy = the "
          "union of the kernels launched in an iteration, idle = the rest of the period (idle_frac: its share); "
          "between_idle_ms = GPU idle from an iteration's last stage kernel to the next one's first.")
    doc.table(heads)
    doc.bullets([f"rank {r}: {p.finding}" for r, p in run.profiles.items()])
    csvs["host_device_stages"] = pd.concat([p.stages.assign(rank=r) for r, p in run.profiles.items()],
                                           ignore_index=True)
    csvs["host_device_summary"] = heads
