"""A report of a run with more ranks than a screen (the 16 x 8 job has 128): its per-rank tables,
plots and the printed summary list the ranks that bound the run, each with why, and the CSVs keep
every rank. The expected ranks come from how the run below is built, by hand."""

from __future__ import annotations

import re
import struct

import numpy as np
import pandas as pd
import pytest

from harness.names import STAGES
from harness.records.manifest import RankInfo
from harness.report.api import format_summary, load_run, report_main
from harness.report.load import records
from harness.report.ranks_shown import RANK_ROWS, rank_grid, shown_ranks
from harness.report.tables import completeness, critical_stage_means
from tests.report_builders import rewrite_manifest, sequential, write_run

WORLD, PER_NODE = 24, 8
BASE = [0.5, 1.0, 6.0, 3.0, 0.5]  # ms a stage, STAGES order
SLOW_BWD, SLOW_GEMM, BIG_MEMORY = 13, 6, 17


def dur(rank: int, i: int, s: int) -> float:
    """Every stage a hair longer a rank (rank 23 the slowest in each), but emb_bwd on rank 13,
    5 ms longer: the longest iteration window too."""
    return BASE[s] + 0.01 * rank + (5.0 if rank == SLOW_BWD and STAGES[s] == "emb_bwd" else 0.0)


def window(rank: int) -> float:
    return sum(dur(rank, 0, s) for s in range(len(STAGES)))


def many_ranks(root, *, ranks: int = WORLD, keep=lambda span: True):
    """The run of WORLD ranks; `ranks`: only the first so many wrote records; `keep`: which stage
    records were written."""
    spans, iters = [], {}
    for r in range(ranks):
        sp, it = sequential(r, range(5), dur, node=r // PER_NODE, warmup_iters=1)
        spans, iters = spans + [s for s in sp if keep(s)], {**iters, **it}
    run_dir = write_run(root, "many", spans, iters, world_size=WORLD, nodes=WORLD // PER_NODE, warmup_iters=1)
    notes = tuple(RankInfo(run_id="many", rank=r, node=r // PER_NODE, host=f"h{r // PER_NODE}", pid=100 + r,
                           device="cpu", backend="gloo", threads=1,
                           gemm_gflops=50.0 if r == SLOW_GEMM else 100.0, copy_gbps=20.0,
                           peak_rss_gib=3.0 if r == BIG_MEMORY else 1.0) for r in range(WORLD))
    rewrite_manifest(run_dir, ranks=notes)
    return run_dir


def expected() -> dict[int, set[str]]:
    """By hand from dur() and the notes: what each listed rank is listed for."""
    windows = pd.Series({r: window(r) for r in range(WORLD)})
    median = int((windows - np.median(windows)).abs().idxmin())
    want: dict[int, set[str]] = {}
    for rank, why in [(0, "first rank"), (SLOW_BWD, "slowest emb_bwd"), (SLOW_BWD, "longest iter_ms"),
                      (median, "median iter_ms"), (0, "shortest iter_ms"), (SLOW_GEMM, "lowest GEMM probe"),
                      (BIG_MEMORY, "most host memory"),
                      *[(WORLD - 1, f"slowest {s}") for s in STAGES if s != "emb_bwd"]]:
        want.setdefault(rank, set()).add(why)
    return want


def table_ranks(md: str, heading: str) -> list[int]:
    """The rank column of the first table under `heading` in report.md."""
    section = md.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return [int(m) for m in re.findall(r"^\| (\d+) \|", section, flags=re.M)]


def png_height(path) -> int:
    return struct.unpack(">I", path.read_bytes()[20:24])[0]


def test_a_run_past_a_screen_of_ranks_lists_the_ranks_that_bound_it(tmp_path):
    run_dir = many_ranks(tmp_path / "runs")
    run = load_run(run_dir)
    shown = shown_ranks(run)
    assert WORLD > RANK_ROWS and len(shown) <= RANK_ROWS
    assert {r: set(w.split("; ")) for r, w in zip(shown["rank"], shown["why"])} == expected()

    assert report_main("many", tmp_path / "runs", tmp_path / "reports") == 0
    assert report_main("many", tmp_path / "runs", tmp_path / "all", all_ranks=True) == 0
    out, every = tmp_path / "reports" / "many", tmp_path / "all" / "many"
    md, md_all = (out / "report.md").read_text(), (every / "report.md").read_text()
    listed = sorted(expected())
    assert table_ranks(md, "Ranks listed") == listed
    for heading in ("Stages per rank (mean ms)", "Ranks"):
        assert table_ranks(md, heading) == listed
        assert table_ranks(md_all, heading) == list(range(WORLD))
    assert f"{len(listed)} of {WORLD} ranks" in md and "## Ranks listed" not in md_all
    # The CSVs keep every rank either way.
    for name in ("stages_by_rank.csv", "ranks.csv", "critical_path_by_rank.csv"):
        assert sorted(pd.read_csv(out / name)["rank"].unique()) == list(range(WORLD))
    # A lane or a bar a listed rank: the plots are shorter than with every rank.
    for png in ("timeline.png", "stage_bars.png"):
        assert png_height(out / png) < png_height(every / png)
    # Every rank at once: a cell a rank, node by local rank, its mean over the median rank's.
    grids, cells = rank_grid(critical_stage_means(run, "rank"), records(run).groupby("rank")["node"].first())
    bwd = [dur(r, 0, STAGES.index("emb_bwd")) for r in range(WORLD)]
    node, local = divmod(SLOW_BWD, PER_NODE)
    assert cells.loc[node, local] == SLOW_BWD and grids["emb_bwd"].shape == (WORLD // PER_NODE, PER_NODE)
    assert grids["emb_bwd"].loc[node, local] == pytest.approx(bwd[SLOW_BWD] / np.median(bwd))
    assert (out / "rank_grid.png").exists() and "rank_grid.png" in md

    text = format_summary(run)
    rows = [ln for ln in text.splitlines() if re.match(r"^\d+\s+\d+\s+h\d", ln)]
    assert [int(ln.split()[0]) for ln in rows] == listed
    assert f"{len(listed)} of {WORLD} ranks listed" in text
    assert f"rank {SLOW_BWD}: slowest emb_bwd; longest iter_ms" in text
    assert len([ln for ln in format_summary(run, None).splitlines() if re.match(r"^\d+\s+\d+\s+h\d", ln)]) == WORLD


def test_the_limit_is_inclusive_and_a_run_within_it_lists_every_rank(tmp_path, capsys):
    run = load_run(many_ranks(tmp_path))
    assert list(shown_ranks(run, WORLD)["rank"]) == list(range(WORLD))
    assert not shown_ranks(run, WORLD)["why"].astype(bool).any()
    assert len(shown_ranks(run, WORLD - 1)) < WORLD
    # A report with no per-rank table refuses the option in one line and writes nothing.
    assert report_main("many,many", tmp_path, tmp_path / "reports", all_ranks=True) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not (tmp_path / "reports").exists()


def test_ranks_that_lack_the_same_records_share_a_line(tmp_path):
    """Ranks 20-23 wrote nothing, ranks 3-9 and 12 no emb_bwd, rank 15 no dense_update: three lines,
    not a line a rank."""
    lack = {**{r: "emb_bwd" for r in (*range(3, 10), 12)}, 15: "dense_update"}
    run = load_run(many_ranks(tmp_path, ranks=20, keep=lambda s: lack.get(s["rank"]) != s["stage"]))
    assert completeness(run) == ["rank(s) 20-23 of world size 24 have no records",
                                 "ranks 3-9, 12 have no records of stage(s) emb_bwd",
                                 "rank 15 has no records of stage(s) dense_update"]
