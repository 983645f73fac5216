"""Nsight Systems traces as run records: NVTX ranges of an `nsys export --type sqlite` file.

GPU users profile with nsys; the harness's stage ranges (harness/run/timeline.py pushes one NVTX
range per stage, named exactly as STAGES) come back here as stage records, so the same report
is made from a trace as from a run folder.

- Ranges: NVTX_EVENTS rows of eventType 59 (push/pop) and 60 (start/end) with an end time; the
  name is `text`, or StringIds.value of `textId` when text is NULL. Ranges named otherwise
  (torch's own, user ranges) are ignored.
- Rank: an NVTX event named "rank N" (a range, a mark, or a domain created so) in a process gives it
  rank N, when every process has one and they differ; otherwise processes ((globalTid >> 24)
  & 0xFFFFFF, nsys's serialized pid) are ranks 0..n-1 in order of their first stage range.
- Iteration: per rank, the k-th range of each stage is iteration k, counted from the first
  range of the first stage (records before it belong to an iteration the capture cut).
- Iteration records: iter_ms = last end - first start of the iteration's stages (a stage
  overlapping the previous iteration, a pipelined input_dist, stretches it); samples unknown.
- Warm-up: a trace does not say; no record is marked warm-up.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd

from harness.report.load import STAGE_COLUMNS, ReportError, Run
from harness.names import STAGES

RANGE_TYPES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange
_RANK_NAME = re.compile(r"^\s*rank[\s_:=-]*(\d+)\s*$", re.IGNORECASE)


def _query(db: sqlite3.Connection, path: Path) -> pd.DataFrame:
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    if "NVTX_EVENTS" not in tables:
        raise ReportError(f"{path} has no NVTX_EVENTS table: not an nsys sqlite export, or the trace "
                          "had no NVTX ranges (profile with `nsys profile --trace=nvtx,...`)")
    cols = {r[1] for r in db.execute("PRAGMA table_info(NVTX_EVENTS)")}
    name = "e.text"
    join = ""
    if "textId" in cols and "StringIds" in tables:
        name, join = "COALESCE(e.text, s.value)", "LEFT JOIN StringIds s ON e.textId = s.id"
    sql = (f"SELECT e.start AS start_ns, e.end AS end_ns, {name} AS name, e.globalTid AS tid, e.eventType AS type "
           f"FROM NVTX_EVENTS e {join}")
    return pd.read_sql_query(sql, db)


def _ranks(ev: pd.DataFrame, stages: pd.DataFrame) -> dict[int, int]:
    """pid -> rank: from "rank N" names when they name every process once, else first-appearance order."""
    named = {}
    # Any NVTX event of the process counts: a range, a mark, or a domain's creation (type 75,
    # whose text is the domain's name).
    m = ev["name"].astype(object).fillna("").astype(str).str.extract(_RANK_NAME)[0]
    for pid, n in zip(ev.loc[m.notna(), "pid"], m.dropna()):
        named.setdefault(int(pid), int(n))
    pids = list(dict.fromkeys(stages.sort_values("start_ns")["pid"].astype(int)))
    if all(p in named for p in pids) and len({named[p] for p in pids}) == len(pids):
        return {p: named[p] for p in pids}
    return {p: i for i, p in enumerate(pids)}


def read_nsys(path: Path) -> Run:
    """The stage ranges of an nsys sqlite export as a Run (run_id = file stem)."""
    path = Path(path)
    if not path.is_file():
        raise ReportError(f"no nsys export at {path}; make one with `nsys export --type sqlite <report>.nsys-rep`")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            ev = _query(db, path)
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise ReportError(f"cannot read {path} as an nsys sqlite export: {exc}") from exc
    ev["pid"] = (pd.to_numeric(ev["tid"]).fillna(0).to_numpy("int64") >> 24) & 0xFFFFFF
    stages = ev[ev["type"].isin(RANGE_TYPES) & ev["end_ns"].notna() & ev["name"].isin(STAGES)].copy()
    if stages.empty:
        raise ReportError(f"{path}: no NVTX ranges named {', '.join(STAGES)} (found {len(ev)} NVTX events); "
                          "profile a bench run with its timeline on")
    run_id = path.stem
    rank_of = _ranks(ev, stages)
    stages["rank"] = stages["pid"].map(rank_of).astype("int64")
    stages = stages.sort_values(["rank", "start_ns"], kind="stable")
    first = stages[stages["name"] == next(s for s in STAGES if s in set(stages["name"]))]
    start = first.groupby("rank")["start_ns"].min()
    stages = stages[stages["start_ns"] >= stages["rank"].map(start)].copy()
    stages["iteration"] = stages.groupby(["rank", "name"]).cumcount()
    st = pd.DataFrame({
        "run_id": run_id, "rank": stages["rank"], "node": 0, "iteration": stages["iteration"].astype("int64"),
        "stage": stages["name"].astype(str), "start_ns": stages["start_ns"].astype("int64"),
        "end_ns": stages["end_ns"].astype("int64"),
        "duration_ms": (stages["end_ns"] - stages["start_ns"]).astype("int64") / 1e6, "warmup": False,
    })[list(STAGE_COLUMNS)].reset_index(drop=True)
    its = st.groupby(["rank", "iteration"], as_index=False).agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    its = its.assign(run_id=run_id, node=0, iter_ms=(its["end_ns"] - its["start_ns"]) / 1e6, loss=np.nan,
                     samples=np.nan, warmup=False)
    return Run(run_id=run_id, manifest=None, stages=st, iterations=its, source=f"nsys export {path}",
               pids={int(r): int(p) for p, r in rank_of.items()})
