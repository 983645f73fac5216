"""Per-stage tables, iteration tables, stragglers, input_dist overlap and completeness on hand-built runs."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from harness.report.api import format_summary, load_run
from harness.report.intervals import covered, union
from harness.report.load import FLAGS, load_runs, records
from harness.report.tables import (
    critical_stage_means, critical_stages, completeness, input_dist_overlap, input_dist_spans, iteration_table, job_iterations,
    stage_pivot, stage_stats, straggler_table,
)
from harness.names import STAGES
from tests.report_builders import flags_for, rewrite_manifest, sequential, span, write_run

BASE = [1.0, 2.0, 8.0, 3.0, 1.0]  # ms per stage, STAGES order
NODE = {0: 0, 1: 0, 2: 1, 3: 1}
TIMED = (1, 2, 3)  # iteration 0 is warm-up


def dur(rank, i, s):
    if i == 0:
        return 500.0  # warm-up: counting it would wreck every number
    straggle = 10.0 if (rank == 3 and STAGES[s] == "dense_fwd_bwd") else 0.0
    return BASE[s] + 0.5 * rank + 0.25 * i + straggle


def four_ranks(root, run_id="two-nodes", drop=None):
    spans, iters = [], {}
    for r in range(4):
        sp, it = sequential(r, range(4), dur, node=NODE[r], warmup_iters=1)
        spans += sp
        iters.update(it)
    if drop:  # (rank, iteration) whose records the rank never wrote
        spans = [s for s in spans if (s["rank"], s["iteration"]) != drop]
        iters.pop(drop)
    return write_run(root, run_id, spans, iters, world_size=4, nodes=2, warmup_iters=1)


@pytest.fixture
def df(tmp_path):
    return records(load_run(four_ranks(tmp_path)))


def raw(ranks, s):
    return [dur(r, i, s) for r in ranks for i in TIMED]


def iter_ms(r, i):
    return sum(dur(r, i, s) for s in range(5))


PERIODS = (1, 2)  # iteration 3 is the last: it has no period


def test_stage_stats_job_matches_numpy(df):
    t = stage_stats(df, "job")
    assert list(t["stage"]) == [*STAGES, "between_iterations"]
    # Back to back: an iteration's period is its own duration; shares are over the periods.
    wall = sum(iter_ms(r, i) for r in range(4) for i in PERIODS)
    for s, name in enumerate(STAGES):
        row = t.set_index("stage").loc[name]
        x = raw(range(4), s)
        assert row["count"] == 12
        assert row["mean_ms"] == pytest.approx(np.mean(x))
        for q in (50, 90, 99):
            assert row[f"p{q}_ms"] == pytest.approx(np.percentile(x, q))
        assert row["share"] == pytest.approx(sum(dur(r, i, s) for r in range(4) for i in PERIODS) / wall)
    gap = t.set_index("stage").loc["between_iterations"]
    assert gap["mean_ms"] == 0 and gap["count"] == 8 and gap["share"] == 0
    # Stages run back to back with no gaps here, so the shares sum to 1.
    assert t["share"].sum() == pytest.approx(1.0)


def test_stage_stats_per_rank_and_node(df):
    by_rank = stage_stats(df, "rank")
    row = by_rank[(by_rank["rank"] == 3) & (by_rank["stage"] == "dense_fwd_bwd")].iloc[0]
    assert row["mean_ms"] == pytest.approx(20.0)  # 8 + 1.5 + 10 + mean(0.25, 0.5, 0.75)
    assert row["share"] == pytest.approx(sum(dur(3, i, 2) for i in PERIODS) / sum(iter_ms(3, i) for i in PERIODS))
    by_node = stage_stats(df, "node")
    for node, ranks in ((0, [0, 1]), (1, [2, 3])):
        for s, name in enumerate(STAGES):
            r = by_node[(by_node["node"] == node) & (by_node["stage"] == name)].iloc[0]
            assert r["mean_ms"] == pytest.approx(np.mean(raw(ranks, s)))
            assert r["p90_ms"] == pytest.approx(np.percentile(raw(ranks, s), 90))
    wide = stage_pivot(by_node, "node")
    assert list(wide.columns) == [*STAGES, "between_iterations"] and list(wide.index) == [0, 1]


def test_iteration_table_job_node_rank(df):
    job = iteration_table(df, "job").iloc[0]
    # Job iteration = slowest rank (rank 3): 32.5 + 1.25 i for i = 1, 2, 3; back to back, so the
    # periods of 1 and 2 are their times (3, the last, has none).
    assert job["iterations"] == 3 and job["periods"] == 2 and job["partial"] == 0
    assert job["iter_ms_mean"] == pytest.approx(35.0)
    assert job["iter_ms_p99"] == pytest.approx(np.percentile([33.75, 35.0, 36.25], 99))
    assert job["period_ms_mean"] == pytest.approx(34.375) and job["between_ms_mean"] == 0
    assert job["period_ms_p90"] == pytest.approx(np.percentile([33.75, 35.0], 90))
    # Samples of the iterations with a period over their summed periods.
    assert job["samples_per_s"] == pytest.approx(2 * 4 * 4 / 0.06875)
    node = iteration_table(df, "node").set_index("node")
    assert node.loc[0, "iter_ms_mean"] == pytest.approx(20.0)  # rank 1: 17.5 + 1.25 i
    assert node.loc[0, "samples_per_s"] == pytest.approx(2 * 2 * 4 / 0.03875)
    rank = iteration_table(df, "rank").set_index("rank")
    assert rank.loc[0, "iter_ms_mean"] == pytest.approx(17.5)
    assert rank.loc[0, "samples_per_s"] == pytest.approx(8 / 0.03375)


def test_partial_iteration_is_left_out_of_the_job(tmp_path):
    df = records(load_run(four_ranks(tmp_path, drop=(2, 3))))
    job = iteration_table(df, "job").iloc[0]
    assert job["iterations"] == 2 and job["partial"] == 1
    assert job["iter_ms_mean"] == pytest.approx(np.mean([33.75, 35.0]))
    # Rank 2 has no record of iteration 3: iteration 2 has no period on it, so none for the job.
    assert job["periods"] == 1 and job["period_ms_mean"] == pytest.approx(33.75)
    its = job_iterations(df)
    assert list(its["complete"]) == [True, True, False]


def test_straggler_table(df):
    t = straggler_table(df).set_index("stage")
    d = t.loc["dense_fwd_bwd"]
    assert d["slowest_rank"] == 3 and d["slowest_node"] == 1
    assert d["median_rank_ms"] == pytest.approx(9.25)  # median of 8.5, 9, 9.5, 20
    assert d["gap_ms"] == pytest.approx(10.75)
    assert d["gap_pct"] == pytest.approx(100 * 10.75 / 9.25)
    # Elsewhere rank 3 is slowest only by its 0.5 ms a rank offset.
    e = t.loc["emb_fwd"]
    assert e["slowest_rank"] == 3 and e["gap_ms"] == pytest.approx(2.0 + 1.5 + 0.5 - np.median([2.5, 3, 3.5, 4]))


def pipelined(root):
    """One rank; input_dist of iteration i+1 runs during iteration i's compute (times in ms)."""
    plan = {0: (0, 3), 1: (6, 9.5), 2: (15.5, 18), 3: (22.5, 23.5)}  # input_dist spans
    compute = {0: 3, 1: 10, 2: 17, 3: 24}  # emb_fwd start; stages 1, 3|2, 1, 1 ms long
    spans, iters = [], {}
    for i in range(4):
        spans.append(span(0, i, "input_dist", *plan[i], warmup=i == 0))
        t = compute[i]
        for name, d in zip(STAGES[1:], (1, 3 if i < 2 else 2, 1, 1)):
            spans.append(span(0, i, name, t, t + d, warmup=i == 0))
            t += d
        iters[(0, i)] = (plan[i][0] if i == 0 else compute[i], t)
    return write_run(root, "piped", spans, iters, world_size=1, warmup_iters=1,
                     manifest={"flags": flags_for(pipeline=True)})


def test_input_dist_overlap_by_hand(tmp_path):
    df = records(load_run(pipelined(tmp_path)))
    spans = input_dist_spans(df)
    # it1 [6, 9.5] under warm-up compute [6, 9]: 3 of 3.5; it2 [15.5, 18] under [15.5, 16] and
    # [17, 18]: 1.5 of 2.5; it3 [22.5, 23.5] runs alone: 0 of 1.
    assert list(spans["iteration"]) == [1, 2, 3]
    assert list(spans["hidden_ms"]) == pytest.approx([3.0, 1.5, 0.0])
    assert list(spans["exposed_ms"]) == pytest.approx([0.5, 1.0, 1.0])
    t = input_dist_overlap(df).set_index("rank")
    assert t.loc["all", "hidden_frac"] == pytest.approx(4.5 / 7.0)
    assert t.loc["0", "hidden_ms"] == pytest.approx(1.5)
    assert t.loc["all", "spans"] == 3


def test_a_runs_flat_frame_and_input_dist_parts_are_kept_and_follow_its_frames(tmp_path):
    """records and input_dist's parts are computed once a Run and kept in it (load.derived): a
    caller changing its frame changes no later caller's, a run whose stage frame was replaced is
    computed again, and runs given as a list come out as their concatenated frame does (computed
    there whole). The reference each time: a Run with nothing kept, or the frame path."""
    piped, seq = load_run(pipelined(tmp_path)), load_run(four_ranks(tmp_path))
    fresh = lambda run: records(dataclasses.replace(run))  # noqa: E731  (a copy has nothing kept)
    first = records(piped)
    first["duration_ms"] = -1.0
    pd.testing.assert_frame_equal(records(piped), fresh(piped))
    assert list(input_dist_spans(piped)["hidden_ms"]) == pytest.approx([3.0, 1.5, 0.0])
    both = load_runs([tmp_path / "piped", tmp_path / "two-nodes"])
    pd.testing.assert_frame_equal(input_dist_spans([piped, seq]), input_dist_spans(both))
    pd.testing.assert_frame_equal(critical_stages([piped, seq]).reset_index(drop=True),
                                  critical_stages(both).reset_index(drop=True))
    piped.stages = piped.stages[piped.stages["iteration"] != 2]
    pd.testing.assert_frame_equal(records(piped), fresh(piped))
    assert list(input_dist_spans(piped)["iteration"]) == [1, 3]


def test_input_dist_overlap_is_zero_when_sequential(df):
    t = input_dist_overlap(df)
    assert (t["hidden_ms"] == 0).all() and (t["hidden_frac"] == 0).all()
    assert set(t["rank"]) == {"0", "1", "2", "3", "all"}


def test_covered_matches_brute_force():
    rng = np.random.default_rng(1)
    for _ in range(20):
        s = rng.integers(0, 200, 15)
        e = s + rng.integers(1, 30, 15)
        busy = union(s, e)
        mask = np.zeros(300, bool)
        for a, b in zip(s, e):
            mask[a:b] = True
        a = rng.integers(0, 250, 10)
        b = a + rng.integers(0, 50, 10)
        assert list(covered(busy, a, b)) == [mask[x:y].sum() for x, y in zip(a, b)]
        assert list(covered(union(s / 8, e / 8), a / 8, b / 8)) == [mask[x:y].sum() / 8 for x, y in zip(a, b)]


def test_covered_keeps_epoch_nanoseconds_exact():
    """The records' start_ns are epoch ns (about 1.8e18), past float64's exact integers (2^53):
    1 ns of overlap must stay 1 ns."""
    t0 = np.int64(1_800_000_000_000_000_001)
    busy = union(np.array([t0, t0 + 10, t0 + 12]), np.array([t0 + 5, t0 + 11, t0 + 13]))
    assert busy.dtype == np.int64 and busy.tolist() == [[t0, t0 + 5], [t0 + 10, t0 + 11], [t0 + 12, t0 + 13]]
    assert covered(busy, np.array([t0 + 4, t0]), np.array([t0 + 12, t0 + 20])).tolist() == [2, 7]


def test_completeness_names_missing_ranks_and_stages(tmp_path):
    sp0, it0 = sequential(0, range(3), lambda r, i, s: 1.0)
    sp1, it1 = sequential(1, range(3), lambda r, i, s: 1.0)
    sp1 = [s for s in sp1 if s["stage"] != "emb_bwd"]
    run = load_run(write_run(tmp_path, "gaps", sp0 + sp1, {**it0, **it1}, world_size=3))
    notes = completeness(run)
    assert notes == ["rank(s) 2 of world size 3 have no records", "rank 1 has no records of stage(s) emb_bwd"]
    text = format_summary(run)
    assert "!! rank(s) 2 of world size 3" in text and "!! rank 1 has no records of stage(s) emb_bwd" in text
    sp = [s for s in sp0 if s["stage"] != "dense_update"]
    run = load_run(write_run(tmp_path, "nodu", sp, it0, world_size=1))
    assert completeness(run) == ["no records of stage(s) dense_update on any rank"]


def test_load_runs_concatenates_with_run_and_flag_columns(tmp_path):
    a = pipelined(tmp_path)
    flags = {f: f == "skip_splits_a2a" for f in FLAGS}
    b = four_ranks(tmp_path, "b")
    rewrite_manifest(b, optimizations=flags_for(flags))
    df = load_runs([a, str(b)])
    assert set(df["run_id"]) == {"piped", "b"}
    assert len(df) == 4 * 5 + 4 * 4 * 5
    for col in ("run_id", "preset", "world_size", "pipeline", *FLAGS, "rank", "stage", "duration_ms", "iter_ms"):
        assert col in df.columns
    b_rows = df[df["run_id"] == "b"]
    assert b_rows["skip_splits_a2a"].all() and not b_rows["cuda_graphs"].any()
    assert not df.loc[df["run_id"] == "piped", "cuda_graphs"].any()
    assert df.loc[df["run_id"] == "piped", "pipeline"].all()
    # A table over the concatenated frame has a row set per run.
    assert set(stage_stats(df)["run_id"]) == {"piped", "b"}


def test_iterations_without_stage_records_are_kept(tmp_path):
    _, its = sequential(0, range(3), lambda r, i, s: 2.0)
    df = records(load_run(write_run(tmp_path, "notl", [], its, world_size=1)))
    assert len(df) == 3 and df["stage"].isna().all()
    assert stage_stats(df).empty
    assert iteration_table(df).iloc[0]["iter_ms_mean"] == pytest.approx(10.0)
    assert list(df["iter_ms"]) == pytest.approx([10.0, 10.0, 10.0])


def overlapped(root, *, exposed=2.0, compute=(1.0, 3.0, 1.0, 1.0), iterations=6):
    """Two ranks, pipelined with a known overlap: iteration i starts by waiting `exposed` ms for
    its input_dist, then runs the compute stages; input_dist of i+1 is launched as that compute
    starts, so it spans all of it plus the next wait. Iteration 0 is warm-up."""
    spans, iters = [], {}
    step = exposed + sum(compute)
    for rank in (0, 1):
        for i in range(iterations):
            t0 = 100.0 + i * step
            launch = t0 - sum(compute) if i else t0  # under iteration i-1's compute
            spans.append(span(rank, i, "input_dist", launch, t0 + exposed, warmup=i == 0))
            t = t0 + exposed
            for name, d in zip(STAGES[1:], compute):
                spans.append(span(rank, i, name, t, t + d, warmup=i == 0))
                t += d
            iters[(rank, i)] = (t0, t)
    return write_run(root, "overlap", spans, iters, world_size=2, warmup_iters=1, manifest={"flags": flags_for(pipeline=True)})


def test_stage_bars_stack_the_critical_path_and_total_the_iteration(tmp_path):
    run = load_run(overlapped(tmp_path))
    wide = critical_stage_means(run, "rank")
    # By hand: input_dist spans 6 + 2 = 8 ms, 6 of them under the previous compute: 2 exposed.
    assert list(wide.columns) == [*STAGES, "between_iterations", "iter_ms", "period_ms"]
    assert wide["input_dist"].tolist() == pytest.approx([2.0, 2.0])
    assert wide["dense_fwd_bwd"].tolist() == pytest.approx([3.0, 3.0])
    assert wide["iter_ms"].tolist() == pytest.approx([8.0, 8.0])
    assert wide["period_ms"].tolist() == pytest.approx([8.0, 8.0]) and (wide["between_iterations"] == 0).all()
    totals = wide[[*STAGES, "between_iterations"]].sum(axis=1)
    assert ((totals - wide["period_ms"]).abs() <= 0.05 * wide["period_ms"]).all()
    # The stage table shows the exposed 2 ms as the stage and the whole span beside it; the spans
    # stacked (what the bars used to draw) would overshoot by the hidden 6 ms.
    stats = stage_stats(run, "rank")
    idist = stats[stats["stage"] == "input_dist"]
    assert idist["mean_ms"].tolist() == pytest.approx([2.0, 2.0]) and idist["span_ms"].tolist() == pytest.approx([8.0, 8.0])
    naive = stats[stats["stage"].isin(STAGES)].groupby("rank")["mean_ms"].sum() + idist.set_index("rank")["span_ms"] - 2.0
    assert naive.tolist() == pytest.approx([14.0, 14.0])


def test_input_dist_spans_open_at_once_count_their_common_wait_once(tmp_path):
    """Threaded input dist: batches i+1 and i+2 are both in flight when iteration i waits.
    By hand, one rank, iterations of 10 ms: 2 ms waiting for input dist, then 8 ms of the other
    stages. Each input_dist span starts 13 ms before its wait ends (two iterations ahead), so at
    every wait two spans are open; the wait is 2 ms of the iteration, not 4."""
    spans, iters = [], {}
    for i in range(6):
        t0 = 100.0 + 10 * i
        spans.append(span(0, i, "input_dist", t0 + 2 - 13, t0 + 2, warmup=i == 0))
        t = t0 + 2
        for name in STAGES[1:]:
            spans.append(span(0, i, name, t, t + 2, warmup=i == 0))
            t += 2
        iters[(0, i)] = (t0, t0 + 10)
    run = load_run(write_run(tmp_path, "threaded", spans, iters, world_size=1, warmup_iters=1,
                             manifest={"flags": flags_for(pipeline=True)}))
    wide = critical_stage_means(run, "rank")
    assert wide.loc[0, "input_dist"] == pytest.approx(2.0)
    assert wide.loc[0, list(STAGES)].sum() == pytest.approx(10.0) == wide.loc[0, "iter_ms"]


def test_critical_path_of_a_plain_loop_is_every_duration(tmp_path):
    sp, it = sequential(0, range(3), lambda r, i, s: BASE[s], gap=0.5)
    run = load_run(write_run(tmp_path, "plain", sp, it, world_size=1))
    st = critical_stages(run)
    assert st["critical_ms"].tolist() == pytest.approx(st["duration_ms"].tolist())
    wide = critical_stage_means(run, "rank")
    assert wide.loc[0, list(STAGES)].sum() == pytest.approx(sum(BASE)) == wide.loc[0, "iter_ms"]
    # The 0.5 ms between one iteration's end and the next one's start is the period's, not dropped.
    assert wide.loc[0, "between_iterations"] == pytest.approx(0.5)
    assert wide.loc[0, "period_ms"] == pytest.approx(sum(BASE) + 0.5)
