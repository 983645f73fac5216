"""Which ranks a report names row by row when a run has more than a screen of them.

At 16 nodes x 8 GPUs a table or a plot with a row a rank is 128 rows: the summary `make bench`
prints scrolls its stage table away, and the Gantt is thousands of pixels tall. Past `RANK_ROWS`
ranks the report lists the ranks that bound the run instead, each with why it is there, draws
every rank against the median one in a grid (`rank_grid`), and the CSVs keep every rank.
"""

from __future__ import annotations

import pandas as pd

from harness.report.iterations import iteration_table
from harness.report.load import Run, derived, records
from harness.report.tables import rank_table, straggler_table
from harness.names import BETWEEN_ITERATIONS, STAGES

RANK_ROWS = 16
"""A run of at most this many ranks lists them all (one node of 8 GPUs, or two)."""

# Per-rank probe columns whose one extreme marks a suspect rank: (column, take the highest, why).
_PROBE_EXTREMES = (("gemm_gflops", False, "lowest GEMM probe"), ("copy_gbps", False, "lowest copy probe"),
                   ("peak_gpu_mem_gib", True, "most GPU memory"), ("peak_rss_gib", True, "most host memory"),
                   ("start_s", True, "latest start"))


def rank_grid(critical: pd.DataFrame, node_of: pd.Series) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """Every rank at once: per stage and between_iterations (columns of `critical`, a row a rank:
    tables.critical_stage_means), a frame node x local rank (the rank's place among its node's, by
    number; `node_of`: rank -> node) of the rank's mean over the median rank's; and the frame of
    the rank in each cell. A column with no positive median (a stage that took no time) has no
    frame."""
    local = node_of.groupby(node_of).rank(method="first").astype(int) - 1
    place = pd.DataFrame({"node": node_of, "local": local, "rank": node_of.index})
    grids = {}
    for col in [c for c in (*STAGES, BETWEEN_ITERATIONS) if c in critical.columns]:
        median = critical[col].median()
        if not median > 0:
            continue
        cells = place.assign(ratio=critical[col] / median).dropna()
        grids[col] = cells.pivot(index="node", columns="local", values="ratio").sort_index()
    return grids, place.pivot(index="node", columns="local", values="rank").sort_index()


def shown_ranks(run: Run, limit: int | None = RANK_ROWS) -> pd.DataFrame:
    """Columns rank, why. Every rank (why empty) when the run has at most `limit` (None: no limit);
    else the first rank and the ranks at the run's extremes: the slowest in each stage (the stragglers
    table's), the longest, median and shortest timed window (iter_ms), and the per-rank probes'
    worst (lowest GEMM and copy rates, most memory, latest start). A rank at several extremes is
    one row, its reasons joined. Kept in the run (load.derived): the printed summary and the
    report both ask."""
    return derived(run, f"shown_ranks/{limit}", lambda r: _shown_ranks(r, limit))


def _shown_ranks(run: Run, limit: int | None) -> pd.DataFrame:
    df = records(run)
    ranks = sorted(int(r) for r in df["rank"].dropna().unique())
    if limit is None or len(ranks) <= limit:
        return _frame({r: [] for r in ranks}, len(ranks))
    why: dict[int, list[str]] = {ranks[0]: ["first rank"]}

    def add(rank, reason: str) -> None:
        why.setdefault(int(rank), []).append(reason)

    for row in straggler_table(df).itertuples():
        add(row.slowest_rank, f"slowest {row.stage}")
    window = iteration_table(df, "rank").set_index("rank")["iter_ms_mean"].dropna()
    if len(window):
        add(window.idxmax(), "longest iter_ms")
        add((window - window.median()).abs().idxmin(), "median iter_ms")
        add(window.idxmin(), "shortest iter_ms")
    probes = rank_table(run)
    for col, highest, reason in _PROBE_EXTREMES:
        values = pd.to_numeric(probes[col], errors="coerce") if col in probes else pd.Series(dtype=float)
        if values.notna().any() and values.nunique() > 1:
            add(probes.loc[values.idxmax() if highest else values.idxmin(), "rank"], reason)
    return _frame(why, len(ranks))


def _frame(why: dict[int, list[str]], ranks: int) -> pd.DataFrame:
    order = sorted(why)
    out = pd.DataFrame({"rank": order, "why": ["; ".join(why[r]) for r in order]})
    out.attrs["ranks"] = ranks  # the run's, for the sentence that says how many are listed
    return out


def only_shown(table: pd.DataFrame, shown: pd.DataFrame) -> pd.DataFrame:
    """The rows of a per-rank table (a rank column, or ranks as its index) of the shown ranks; a
    rank "all" (a row over every rank) stays."""
    if not left_out(shown):
        return table
    keys = (table["rank"] if "rank" in table.columns else pd.Series(table.index, index=table.index)).astype(str)
    return table[(keys.isin(set(shown["rank"].astype(str))) | (keys == "all")).to_numpy()]


def left_out(shown: pd.DataFrame) -> bool:
    """Whether the run has ranks that `shown` does not list."""
    return len(shown) < shown.attrs["ranks"]


def shown_line(shown: pd.DataFrame, where: str) -> str | None:
    """The sentence beside a table that lists only some ranks; None when it lists all."""
    if not left_out(shown):
        return None
    return (f"{len(shown)} of {shown.attrs['ranks']} ranks, those that bound the run (why: Ranks listed); "
            f"every rank in {where}.")
