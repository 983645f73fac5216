"""Reading run folders (runs/<run_id>/) into pandas: the one place the report side reads them.

`load_run` gives one run's manifest and raw records; `records` flattens a loaded run into the
long frame every table of the report is computed from, and `load_runs` does that for many
run folders at once (the notebook entry point).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from harness.records.manifest import RankInfo, RunManifest
from harness.report.startup import start_s
# The stage and flag names, in order (design.md); torch-free, as is the manifest.
from harness.names import BETWEEN_ITERATIONS, COMPACTED
from harness.names import OPTIMIZATION_FLAGS as FLAGS
from harness.names import STAGES

STAGE_COLUMNS = ("run_id", "rank", "node", "iteration", "stage",
                 "start_ns", "end_ns", "duration_ms", "warmup")
ITERATION_COLUMNS = ("run_id", "rank", "node", "iteration", "start_ns", "end_ns",
                     "iter_ms", "loss", "samples", "warmup")
EVAL_COLUMNS = ("run_id", "rank", "index", "after_iteration", "trained_samples", "auc", "eval_samples", "eval_ms",
                "start_ns", "end_ns", "reached_target")
SUBSPAN_COLUMNS = ("run_id", "rank", "node", "iteration", "stage", "name", "start_ns", "end_ns", "duration_ms", "warmup")
# Columns of the flat frame besides the flags, in order.
RUN_COLUMNS = ("run_id", "preset", "world_size", "nodes", "device", "status", "pipeline", "collective_wait",
               "cross_net", "dense_weights", "dense_grads")
RECORD_COLUMNS = ("rank", "node", "iteration", "warmup", "stage", "start_ns", "end_ns", "duration_ms",
                  "iter_start_ns", "iter_end_ns", "iter_ms", "period_ms", "between_ms", "samples", "loss")


class ReportError(Exception):
    """A problem the user can fix; the message is one line meant to be printed as is."""


@dataclass(kw_only=True)
class Run:
    """Everything read from one run folder (or rebuilt from an nsys trace)."""

    run_id: str
    """The run's id (its folder name), or the trace's name."""
    manifest: RunManifest | None
    """The run's manifest; None for records rebuilt from an nsys trace, which has none."""
    stages: pd.DataFrame
    """All stage records of all ranks and parts, warm-up rows included."""
    iterations: pd.DataFrame
    """All per-iteration records of all ranks and parts, warm-up rows included."""
    source: str | None = None
    """Where the records came from when not from a run folder (e.g. `nsys export <file>`)."""
    pids: dict[int, int] = field(default_factory=dict)
    """Rank -> process id, for records rebuilt from a trace (a run folder's are in manifest.ranks)."""
    unreadable: tuple[str, ...] = ()
    """'<part>: <why>' for each records part that could not be read and was left out."""
    evals: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Every rank's evaluation records (runs with --eval-every; empty otherwise)."""
    subspans: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Named pieces of stages (dynamic tables' transform, write-back, fetch); empty when none ran."""
    _derived: dict[str, tuple[tuple, pd.DataFrame]] = field(default_factory=dict, init=False, repr=False,
                                                            compare=False)
    """Frames computed from this run (`derived`), each with what it was made from."""

    @property
    def status(self) -> str:
        """running, completed or failed; a trace holds whatever was recorded, so it counts as completed."""
        return self.manifest.status.state if self.manifest else "completed"

    @property
    def world_size(self) -> int | None:
        """Ranks of the run; a trace's are the ranks it saw."""
        return self.manifest.world_size if self.manifest else (len(self.pids) or None)


# --- finding and reading runs -------------------------------------------------

def read_json(path: Path, what: str = "") -> dict:
    """A JSON object from `path`, or a one-line ReportError saying what is wrong."""
    if not path.is_file():
        raise ReportError(f"{path} is missing{what}")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"cannot read {path}: {str(exc).splitlines()[0]}") from exc
    if not isinstance(data, dict):
        raise ReportError(f"{path} does not hold a JSON object")
    return data


def _read_manifest(run_dir: Path) -> RunManifest:
    path = run_dir / "manifest.json"
    if not path.is_file():
        raise ReportError(f"{path} is missing: {run_dir} is not a run folder "
                          "(or its run died before writing the manifest)")
    try:
        return RunManifest.from_json(path.read_text())
    except (OSError, ValueError, TypeError) as exc:
        raise ReportError(f"cannot read {path}: {str(exc).splitlines()[0]}") from exc


def start_key(start_time: str | None) -> datetime:
    # Parse rather than compare strings: runs started on hosts with different UTC
    # offsets must still order by real time. Naive times are taken as UTC.
    try:
        t = datetime.fromisoformat(str(start_time))
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
            keyed.append((start_key(_read_manifest(d).start_time), d.name))
        except ReportError:
            continue  # half-created or foreign folder (ablations/): it cannot be ranked by start time
    return [name for _, name in sorted(keyed)]


def is_plain_name(name: str) -> bool:
    """Only a plain folder name is an id; "..", "a/b" must not reach outside the root."""
    return Path(name).name == name and name not in ("", ".", "..")


def resolve_run(runs_root: Path, run: str) -> Path:
    """The folder of run id `run`, or of the most recently started run for "latest"."""
    runs_root = Path(runs_root)
    known = _runs_by_start(runs_root)
    if run == "latest":
        if not known:
            raise ReportError(f"no runs under {runs_root}/ yet; make one with `make bench`")
        return runs_root / known[-1]
    if is_plain_name(run) and (runs_root / run).is_dir():
        return runs_root / run
    there = ", ".join(known) if known else "none (make one with `make bench`)"
    raise ReportError(f"no run '{run}' under {runs_root}/; runs there: {there}")


def _read_parts(run_dir: Path, pattern: str, columns: tuple[str, ...], unreadable: list[str]) -> pd.DataFrame:
    """All ranks' parts; a part that cannot be read (torn by a full disk, damaged) is left out and
    named in `unreadable`, so the rest of the run is still reported."""
    frames = []
    paths = sorted(run_dir.glob(f"rank*/{pattern}"))
    compacted = {p.parent for p in paths if p.name.endswith(f"-{COMPACTED}.parquet")}
    # A rank whose parts were compacted is read from that file alone (parts left by a crash
    # during compaction are the same rows).
    paths = [p for p in paths if p.parent not in compacted or p.name.endswith(f"-{COMPACTED}.parquet")]
    for path in paths:
        try:
            df = pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises several types for a torn/corrupt file
            unreadable.append(f"{path.relative_to(run_dir)}: {(str(exc).splitlines() or [type(exc).__name__])[0]}")
            continue
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise ReportError(f"{path} lacks column(s) {', '.join(missing)}")
        frames.append(df)
    if not frames:
        # A run that has not flushed a part yet: an empty frame lets the summaries
        # give the "no records" error instead of a KeyError.
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    df = pd.concat(frames, ignore_index=True)
    if "warmup" in df:
        df["warmup"] = df["warmup"].astype(bool)
    return df


def check_stage_names(run_id: str, stages: pd.DataFrame, allowed: tuple[str, ...] = STAGES) -> None:
    unknown = sorted(set(stages["stage"].dropna()) - set(allowed))
    if unknown:
        # Stage names are a contract with the writer; a report that silently dropped
        # records would mislead, so say which names are wrong.
        raise ReportError(f"run {run_id}: unknown stage name(s) {', '.join(map(str, unknown))}; "
                          f"expected {', '.join(allowed)}")


def load_run(run_dir: Path) -> Run:
    """Read the manifest and all parquet parts of all ranks; incomplete runs load too.

    A run still going (or killed) has no `ranks` in its manifest yet; the ranks' own
    rank.json notes are read instead, so the roofline still has its peaks.
    """
    run_dir = Path(run_dir)
    manifest = _read_manifest(run_dir)
    if not manifest.ranks:
        notes = []
        for p in sorted(run_dir.glob("rank*/rank.json")):
            try:
                notes.append(RankInfo.from_json(p.read_text()))
            except (OSError, ValueError, TypeError):
                continue  # torn note of a dying rank: peaks become n/a, nothing else depends on it
        manifest = dataclasses.replace(manifest, ranks=tuple(notes))
    unreadable: list[str] = []
    stages = _read_parts(run_dir, "stages-*.parquet", STAGE_COLUMNS, unreadable)
    check_stage_names(manifest.run_id, stages)
    iterations = _read_parts(run_dir, "iterations-*.parquet", ITERATION_COLUMNS, unreadable)
    evals = _read_parts(run_dir, "evals-*.parquet", EVAL_COLUMNS, unreadable)
    subspans = _read_parts(run_dir, "subspans-*.parquet", SUBSPAN_COLUMNS, unreadable)
    # Sub-spans also name what runs between iterations (names.BETWEEN_ITERATIONS), which is no stage.
    check_stage_names(manifest.run_id, subspans, (*STAGES, BETWEEN_ITERATIONS))
    for note in unreadable:
        print(f"report: warning: run {manifest.run_id}: left out unreadable part {note}", file=sys.stderr)
    return Run(run_id=manifest.run_id, manifest=manifest, stages=stages, iterations=iterations,
               unreadable=tuple(unreadable), evals=evals, subspans=subspans)


# --- the flat frame -----------------------------------------------------------

def iteration_periods(iterations: pd.DataFrame, evals: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (rank, iteration): period_ms = start of iteration i+1 - start of i, and between_ms =
    start of i+1 - end of i (the gap after i's timed window), from one rank's own clock. NaN where
    the rank has no record of i+1 (a run's last iteration, a rank that stopped) and where an
    evaluation ran after i (evals' after_iteration on any rank): an evaluation's time is no
    iteration's. Columns: rank, iteration, period_ms, between_ms."""
    cols = ["rank", "iteration", "period_ms", "between_ms"]
    if iterations.empty:
        return pd.DataFrame({c: pd.Series(dtype="int64" if c in ("rank", "iteration") else float) for c in cols})
    its = (iterations[["rank", "iteration", "start_ns", "end_ns"]].astype("int64")
           .drop_duplicates(["rank", "iteration"]).sort_values(["rank", "iteration"]))
    nxt = its.assign(iteration=its["iteration"] - 1)[["rank", "iteration", "start_ns"]].rename(
        columns={"start_ns": "next_ns"})
    its = its.merge(nxt, on=["rank", "iteration"], how="left")
    its["period_ms"] = (its["next_ns"] - its["start_ns"]) / 1e6
    its["between_ms"] = (its["next_ns"] - its["end_ns"]) / 1e6
    if evals is not None and not evals.empty and "after_iteration" in evals:
        evaluated = its["iteration"].isin(set(evals["after_iteration"].dropna().astype("int64")))
        its.loc[evaluated, ["period_ms", "between_ms"]] = float("nan")
    return its[cols].reset_index(drop=True)


def effective_flags(run: Run) -> dict[str, object]:
    """Flag -> effective bool; pd.NA for every flag when the run has no manifest (an nsys trace)."""
    if run.manifest is None:
        return {f: pd.NA for f in FLAGS}
    return dict(run.manifest.optimizations.effective)


def run_info(run: Run) -> dict[str, object]:
    """The per-run columns of the flat frame."""
    m = run.manifest
    return {
        "run_id": run.run_id,
        "preset": m.config.run.preset if m else None,
        "world_size": run.world_size,
        "nodes": m.nodes if m else None,
        "device": m.device if m else "nsys trace",
        "status": run.status,
        "pipeline": m.optimizations.pipeline if m else pd.NA,
        "collective_wait": m.optimizations.collective_wait.effective if m else None,
        "cross_net": m.optimizations.cross_net.impl if m else None,
        "dense_weights": m.optimizations.dense_weights.impl if m else None,
        "dense_grads": m.optimizations.dense_grads.impl if m else None,
        **effective_flags(run),
    }


def records(run: Run) -> pd.DataFrame:
    """One run as the flat frame: a row per stage record, its iteration's figures beside it.

    Columns: run_id, preset, world_size, nodes, device, status, pipeline, collective_wait (poll or
    block; None for a trace), cross_net (fused or autograd; None for a trace), dense_weights (fp32,
    bf16 copy or autocast casts; None for a trace), dense_grads (views, gather or ddp; None for a
    trace), one boolean column per
    optimization flag (effective value; NA for records without a manifest), then rank, node,
    iteration, warmup, stage, start_ns, end_ns, duration_ms, and from the iteration record
    iter_start_ns, iter_end_ns, iter_ms, samples, loss, with period_ms and between_ms from the
    next iteration's start (`iteration_periods`). An iteration without stage records
    (a run made with --no-timeline) is one row with stage NA; a stage record without an
    iteration record has NA iteration figures. Nothing is dropped here.

    Built once a run (`derived`).
    """
    return derived(run, "records", _flat_frame)


def derived(run: Run, name: str, build: Callable[[Run], pd.DataFrame]) -> pd.DataFrame:
    """build(run), computed once a run and kept in it under `name` (again where one of the run's
    frames or its manifest was replaced since). A report asks for the flat frame about thirty times
    and for input_dist's critical parts eight: building them each time was a third of a report's
    time at 2 ranks and half of it at 128 (2026-12-07). Each caller gets a frame of its own
    (pandas' copy-on-write keeps the kept one as it was built)."""
    made_of = (run.run_id, run.manifest, run.stages, run.iterations, run.evals, run.subspans, run.pids)
    kept = run._derived.get(name)
    if kept is None or any(a is not b for a, b in zip(kept[0], made_of)):
        kept = run._derived[name] = (made_of, build(run))
    return kept[1].copy(deep=False)


def _flat_frame(run: Run) -> pd.DataFrame:
    keys = ["rank", "iteration"]
    st = run.stages[[c for c in STAGE_COLUMNS if c != "run_id"]].copy()
    it = run.iterations[["rank", "node", "iteration", "start_ns", "end_ns", "iter_ms", "samples",
                         "loss", "warmup"]].rename(
        columns={"start_ns": "iter_start_ns", "end_ns": "iter_end_ns", "node": "iter_node",
                 "warmup": "iter_warmup"})
    # Nullable ints: the outer merge would otherwise turn times with a missing side into floats.
    if not it.empty:
        it = it.merge(iteration_periods(run.iterations, run.evals), on=keys, how="left")
    else:
        it = it.assign(period_ms=pd.Series(dtype=float), between_ms=pd.Series(dtype=float))
    for df, cols in ((st, ("start_ns", "end_ns")), (it, ("iter_start_ns", "iter_end_ns"))):
        for k in keys:
            df[k] = df[k].astype("int64")
        for c in cols:
            df[c] = df[c].astype("Int64")
    df = st.merge(it, on=keys, how="outer")
    # Fill what only one side had: iteration-only rows take the iteration's node and warm-up mark.
    df["node"] = df["node"].fillna(df["iter_node"])
    df["warmup"] = df["warmup"].fillna(df["iter_warmup"]).astype(bool)
    df = df.drop(columns=["iter_node", "iter_warmup"])
    df["stage"] = df["stage"].astype(object)  # stays text even when every row lacks a stage
    df["node"] = df["node"].astype("int64")
    info = run_info(run)
    flags = set(effective_flags(run))
    for name, value in reversed(info.items()):
        col = pd.Series([value] * len(df), index=df.index)
        if name == "pipeline" or name in flags:
            col = col.astype("boolean")
        df.insert(0, name, col)
    df = df[[*info, *RECORD_COLUMNS]]
    order = df["stage"].map({s: i for i, s in enumerate(STAGES)})
    return (df.assign(_o=order).sort_values(["rank", "iteration", "_o"], na_position="first")
              .drop(columns="_o").reset_index(drop=True))


def load_runs(paths: Iterable[str | Path] | str | Path) -> pd.DataFrame:
    """Stage records of many run folders in one frame (see `records` for the columns)."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    frames = [records(load_run(Path(p))) for p in paths]
    if not frames:
        raise ReportError("no run folders given to load_runs")
    return pd.concat(frames, ignore_index=True)


def as_records(runs: pd.DataFrame | Run | Sequence[Run]) -> pd.DataFrame:
    """The flat frame from what a caller holds: the frame itself, one Run or several."""
    if isinstance(runs, pd.DataFrame):
        return runs
    if isinstance(runs, Run):
        return records(runs)
    frames = [records(r) for r in runs]
    if not frames:
        raise ReportError("no runs given")
    return pd.concat(frames, ignore_index=True)


# --- manifest accessors -------------------------------------------------------
# Tables and findings read manifest values through these, so a change in the manifest's shape
# is an edit here, not in every table.

def run_status(run: Run) -> str:
    """"completed", "failed", "running" (a trace counts as completed)."""
    return run.status


def run_error(run: Run) -> str:
    """The last line of the recorded error (it may be a traceback); "" when none."""
    error = run.manifest.status.error if run.manifest else None
    lines = str(error or "").strip().splitlines()
    return lines[-1] if lines else ""


def run_pipelined(run: Run) -> bool | None:
    """Whether input_dist was pipelined; None when not recorded (a trace)."""
    return run.manifest.optimizations.pipeline if run.manifest else None


def inactive_flags(run: Run) -> dict[str, str]:
    """Flag -> reason, for flags requested but not in effect."""
    return dict(run.manifest.optimizations.inactive_reasons) if run.manifest else {}


def numerics_note(run: Run) -> str | None:
    """What changes the run's numbers by design (a dense, table or wire precision other than fp32); None if nothing."""
    prec = run.manifest.optimizations.precision if run.manifest else None
    if not (prec and prec.numerics_changed):
        return None
    label = (f"dense precision {prec.dense}" if (prec.tables, prec.comm, prec.comm_bwd) == ("fp32", "fp32", "fp32")
             else f"precision dense {prec.dense}, tables {prec.tables}, comm {prec.comm}/{prec.comm_bwd}")
    return f"{label}: {prec.note}"


def rank_notes(run: Run) -> pd.DataFrame:
    """The ranks' own notes (host, threads, gemm_gflops, copy_gbps, peak_rss_gib, peak_gpu_mem_gib ...),
    and start_s: the seconds before the rank's first iteration (report/startup.py)."""
    if not run.manifest:
        return pd.DataFrame()
    notes = pd.DataFrame([dataclasses.asdict(r) for r in run.manifest.ranks])
    notes["start_s"] = [start_s(r.startup_s) for r in run.manifest.ranks]
    return notes
