"""What a run's records lack: ranks that wrote nothing, stages no rank or only some ranks timed.

Each gap is a line the summary and the report print as a warning ("!! ..."); ranks that lack the
same stages share a line, their numbers as runs (3-17, 20), so a 128-rank run cut short says so
in a few lines.
"""

from __future__ import annotations

import numpy as np

from harness.report.iterations import Runs, held_runs
from harness.report.load import as_records
from harness.names import STAGES


def completeness(runs: Runs) -> list[str]:
    """One line per gap in the records: ranks missing vs world_size, stages missing overall or
    on some ranks. Empty when every rank recorded every stage. (Status and iterations not
    recorded by every rank are reported by the iteration summary.)"""
    df = as_records(runs)
    # A manifest's timed_stages names what its engine records (the torchrec engine times fewer
    # stages, by design); only those count as missing. A bare frame carries no manifest.
    expected = {r.run_id: r.manifest.timed_stages if r.manifest else STAGES for r in held_runs(runs)}
    notes = []
    for run_id, g in df.groupby("run_id", sort=True):
        stages = expected.get(str(run_id), STAGES)
        pre = f"run {run_id}: " if df["run_id"].nunique() > 1 else ""
        ws = g["world_size"].iloc[0]
        seen = set(g["rank"].astype(int))
        if isinstance(ws, (int, np.integer)) and ws > 0:
            missing = sorted(set(range(int(ws))) - seen)
            if missing:
                notes.append(f"{pre}rank(s) {_ints(missing)} of world size {ws} have no records")
        st = g[g["stage"].notna()]
        if st.empty:
            continue  # no stage timing at all: the summary says so
        absent = [s for s in stages if s not in set(st["stage"])]
        if absent:
            notes.append(f"{pre}no records of stage(s) {', '.join(absent)} on any rank")
        have = st.groupby("rank")["stage"].agg(set)
        # Ranks lacking the same stages share a line: a 128-rank run cut short wrote a line a rank.
        lacking: dict[tuple[str, ...], list[int]] = {}
        for rank, have_r in have.items():
            lack = tuple(s for s in stages if s not in have_r and s not in absent)
            if lack:
                lacking.setdefault(lack, []).append(int(rank))
        notes += [f"{pre}{_ranks_have(ranks)} no records of stage(s) {', '.join(lack)}"
                  for lack, ranks in lacking.items()]
        bare = sorted(seen - set(have.index))
        if bare:
            notes.append(f"{pre}{_ranks_have(bare)} iteration records but no stage records")
    return notes


def _ranks_have(ranks: list[int]) -> str:
    return f"rank {ranks[0]} has" if len(ranks) == 1 else f"ranks {_ints(ranks)} have"


def _ints(xs: list[int]) -> str:
    """Sorted integers as runs: 0-3, 7, 9-12."""
    runs: list[list[int]] = []
    for x in xs:
        if runs and x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
