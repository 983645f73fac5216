"""nsys sqlite exports as stage records, on small files built here with the NVTX_EVENTS schema."""

import sqlite3

import pytest

from harness.report.api import ReportError, report_main
from harness.report.nsys import read_nsys
from harness.names import STAGES

MS = 1_000_000  # ns
HW = 1 << 48  # nsys puts a hardware/VM id above the pid: it must be masked off


def gtid(pid, tid):
    return HW | (pid << 24) | tid


def make_db(path, events, strings=()):
    """events: (start, end, text, textId, globalTid, eventType)."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, "
               "rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, "
               "endGlobalTid INTEGER, textId INTEGER REFERENCES StringIds(id), domainId INTEGER)")
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", list(strings))
    db.executemany("INSERT INTO NVTX_EVENTS (start, end, text, textId, globalTid, eventType) VALUES (?,?,?,?,?,?)",
                   events)
    db.commit()
    db.close()
    return path


STRING_IDS = [(i + 1, s) for i, s in enumerate(STAGES)] + [(99, "forward")]


def stage_events(pid, t0, scale, *, by_id):
    """Three iterations, stage s lasting (s + 1) * scale ms, back to back; 100 ms apart."""
    ev = []
    for it in range(3):
        t = t0 + it * 100 * MS
        for s, name in enumerate(STAGES):
            d = (s + 1) * scale * MS
            ev.append((t, t + d, None if by_id else name, s + 1 if by_id else None, gtid(pid, pid), 59))
            t += d
    return ev


def trace(tmp_path, *, rank_names=False, domains=False, name="trace"):
    ev = [
        # Rank 0 (pid 4242, first to appear): a dense_update cut by the capture start is dropped.
        (1 * MS, 2 * MS, "dense_update", None, gtid(4242, 4242), 59),
        *stage_events(4242, 10 * MS, 1, by_id=True),
        *stage_events(1717, 12 * MS, 2, by_id=False),
        (11 * MS, 12 * MS, None, 99, gtid(4242, 4243), 59),         # another range name: ignored
        (15 * MS, None, "emb_fwd", None, gtid(1717, 1717), 59),     # never ended: ignored
        (20 * MS, 21 * MS, "input_dist", None, gtid(1717, 1717), 34),  # a mark, not a range
        (300 * MS, 301 * MS, "emb_bwd", None, gtid(1717, 1800), 60),  # start/end range: counted
    ]
    if rank_names:
        ev += [(0, 1, "rank 1", None, gtid(4242, 4242), 59), (0, 1, "Rank 0", None, gtid(1717, 1717), 59)]
    if domains:  # NvtxDomainCreate events: the text is the domain's name
        ev += [(0, None, "rank_3", None, gtid(4242, 4242), 75), (0, None, "rank_2", None, gtid(1717, 1717), 75)]
    return make_db(tmp_path / f"{name}.sqlite", ev, STRING_IDS)


def test_ranges_become_stage_records(tmp_path):
    run = read_nsys(trace(tmp_path))
    st = run.stages
    assert run.run_id == "trace" and run.world_size == 2 and run.manifest is None
    assert run.pids == {0: 4242, 1: 1717}
    assert set(st["stage"]) == set(STAGES)
    r0 = st[st["rank"] == 0].sort_values("start_ns")
    assert len(r0) == 15 and list(r0["iteration"]) == [i for i in range(3) for _ in STAGES]
    assert list(r0["duration_ms"][:5]) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert r0["start_ns"].iloc[0] == 10 * MS
    r1 = st[st["rank"] == 1]
    assert len(r1) == 16  # 15 pushed ranges + the start/end range
    extra = r1[r1["start_ns"] == 300 * MS].iloc[0]
    assert extra["stage"] == "emb_bwd" and extra["iteration"] == 3  # its 4th emb_bwd
    assert list(r1[r1["iteration"] == 0].sort_values("start_ns")["duration_ms"]) == [2.0, 4.0, 6.0, 8.0, 10.0]
    assert not st["warmup"].any()
    its = run.iterations.set_index(["rank", "iteration"])
    assert its.loc[(0, 1), "iter_ms"] == pytest.approx(15.0)
    assert its.loc[(1, 0), "iter_ms"] == pytest.approx(30.0)


def test_rank_names_win_over_first_appearance(tmp_path):
    run = read_nsys(trace(tmp_path, rank_names=True))
    assert run.pids == {1: 4242, 0: 1717}
    r1 = run.stages[run.stages["rank"] == 1]
    assert r1["duration_ms"].min() == 1.0  # pid 4242's 1 ms input_dist is now rank 1's
    assert read_nsys(trace(tmp_path, domains=True, name="dom")).pids == {3: 4242, 2: 1717}


def test_report_main_nsys(tmp_path, capsys):
    path = trace(tmp_path, name="gpu-run")
    assert report_main(nsys=str(path), reports_root=tmp_path / "rep") == 0
    out = tmp_path / "rep" / "nsys-gpu-run"
    for name in ("report.md", "report.html", "iteration_stats.csv", "stages.csv", "timeline.png", "iteration_time.png"):
        assert (out / name).is_file(), name
    md = (out / "report.md").read_text()
    assert "source: nsys export" in md and "# Run gpu-run" in md
    printed = capsys.readouterr().out
    assert "samples_per_s n/a" in printed


def test_nsys_errors_are_one_line(tmp_path, capsys):
    none = make_db(tmp_path / "none.sqlite", [(0, 5, "forward", None, gtid(1, 1), 59)])
    nodb = tmp_path / "text.sqlite"
    nodb.write_text("not a database at all, just text " * 50)
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).execute("CREATE TABLE other (x INTEGER)").connection.close()
    for p, msg in ((tmp_path / "missing.sqlite", "no nsys export"), (none, "no NVTX ranges named"),
                   (nodb, "cannot read"), (empty, "no NVTX_EVENTS table")):
        with pytest.raises(ReportError, match=msg):
            read_nsys(p)
        assert report_main(nsys=p, reports_root=tmp_path / "rep") == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all(line.startswith("report: error: ") for line in err)
    assert not (tmp_path / "rep").exists()
