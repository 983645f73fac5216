"""Bad input and a hostile filesystem get one line each, before anything starts (issue 12, rows 4,
5, 6 and 8; the launcher-side rows are in tests/test_failures_named.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import harness.records.writer
from harness.cli import main

ROOT = Path(__file__).resolve().parent.parent
TINY = ["bench", "--device", "cpu", "--preset", "tiny", "--iters", "2", "--warmup", "0"]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("run_id", ["../../tmp/evil", "/tmp/x", "a/b", "x" * 300, "latest", "ablations", "compares",
                                    "README.md", "..", ".hidden", "sp ace", ""])
def test_a_run_id_must_be_a_plain_name(run_id, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main([*TINY, "--run-id", run_id, "--runs-root", str(runs)]) == 2
    assert "is not a plain name" in one_error_line(capsys)
    assert not runs.exists() and not (tmp_path / "tmp").exists()


def test_an_unwritable_runs_root_is_one_line(tmp_path, capsys):
    # Running as root, permission bits stop nothing: a runs root that is a file makes mkdir fail.
    runs = tmp_path / "runs"
    runs.write_text("not a folder")
    assert main([*TINY, "--runs-root", str(runs)]) == 2
    assert "cannot make the run folder" in one_error_line(capsys)


def test_the_loser_of_a_run_id_race_gets_one_line_and_the_winner_is_untouched(tmp_path, capsys, monkeypatch):
    """Two starts with one id at once: the folder check passes for both; the loser's mkdir fails."""
    runs = tmp_path / "runs"
    winner = runs / "same"
    winner.mkdir(parents=True)
    (winner / "manifest.json").write_text("{\"the\": \"winner's\"}")

    def lose_the_race(root, manifest):
        raise FileExistsError(17, "File exists", str(winner))

    monkeypatch.setattr(Path, "exists", lambda self: False if self == winner else os.path.exists(self))
    monkeypatch.setattr(harness.records.writer, "create_run", lose_the_race)
    assert main([*TINY, "--run-id", "same", "--runs-root", str(runs)]) == 2
    assert "was just made by another run with the same id" in one_error_line(capsys)
    assert json.loads((winner / "manifest.json").read_text()) == {"the": "winner's"}


def test_two_real_starts_with_one_id(tmp_path):
    """The same RUN_ID started twice at once, for real: one runs, the other says why it did not."""
    args = [sys.executable, "-m", "harness", *TINY, "--run-id", "twice", "--runs-root", str(tmp_path)]
    procs = [subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = sorted((p.wait(timeout=300), p.stderr.read()) for p in procs)
    (ok, _), (lost, err) = results
    assert (ok, lost) == (0, 2)
    assert len(err.strip().splitlines()) == 1 and "twice" in err and ("never reused" in err)
    assert json.loads((tmp_path / "twice" / "manifest.json").read_text())["status"]["state"] == "completed"


@pytest.mark.parametrize("args, message", [
    (["--fail-at", "99:1"], "run.fail_at 99:1 never happens: ranks are 0..1 and iterations 0..1"),
    (["--fail-at", "1:999"], "run.fail_at 1:999 never happens"),
    (["--stall-at", "0:2"], "run.stall_at 0:2 never happens"),
    (["--shard", "0=row_wise,0=table_wise"], "sharding.per_table names table 0 twice"),
    (["--column-shards", "0"], "sharding.column_shards must be a positive integer"),
    (["--memory-gib", "0"], "sharding.memory_gib must be > 0"),
])
def test_values_that_would_be_silently_meaningless_are_refused(args, message, tmp_path, capsys):
    assert main([*TINY, *args, "--runs-root", str(tmp_path / "runs")]) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "runs").exists()


def test_make_refuses_two_presets_at_once():
    out = subprocess.run(["make", "-s", "--no-print-directory", "check-bench-knobs", "PRESET=small tiny"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0
    assert out.stderr.splitlines()[0] == "make: PRESET=small tiny is not valid; valid values: mlperf small tiny mlperf-ids"


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_a_full_disk_fails_the_run_with_its_records_and_a_final_status(tmp_path):
    """A 6 MB tmpfs as the runs root, a part a iteration: the disk fills, the run ends failed (the
    folder's space reserve leaves room for the final manifest), no half-written part remains, and
    the report reads what was written."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "6m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        out = subprocess.run([sys.executable, "-m", "harness", *TINY[:-4], "--iters", "5000", "--warmup", "0",
                              "--flush-every", "1", "--runs-root", str(disk)], cwd=ROOT, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 1
        assert "No space left on device" in out.stderr.splitlines()[-2]
        (run_dir,) = disk.iterdir()
        status = json.loads((run_dir / "manifest.json").read_text())["status"]
        assert status["state"] == "failed" and "No space left on device" in status["error"]
        assert not list(run_dir.rglob("*.tmp")) and not (run_dir / ".space-reserve").exists()
        from harness.report.api import load_run

        run = load_run(run_dir)
        assert len(run.iterations) > 0 and run.unreadable == ()
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def test_an_unreadable_part_is_left_out_with_a_warning_and_the_rest_reported(tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main([*TINY[:-4], "--iters", "4", "--warmup", "0", "--flush-every", "2", "--runs-root", str(runs)]) == 0
    (run_dir,) = runs.iterdir()
    import pandas as pd

    # Back to two parts, as a run that did not complete keeps them; then tear the second.
    compacted = run_dir / "rank00001" / "iterations-all.parquet"
    its = pd.read_parquet(compacted)
    its.iloc[:2].to_parquet(run_dir / "rank00001" / "iterations-00000.parquet", index=False)
    its.iloc[2:].to_parquet(run_dir / "rank00001" / "iterations-00001.parquet", index=False)
    compacted.unlink()
    torn = run_dir / "rank00001" / "iterations-00001.parquet"
    torn.write_bytes(torn.read_bytes()[:40])  # what a crash mid-write used to leave
    capsys.readouterr()
    from harness.report.api import format_summary, load_run

    run = load_run(run_dir)
    assert len(run.unreadable) == 1 and run.unreadable[0].startswith(f"rank00001/{torn.name}: ")
    assert f"left out unreadable part rank00001/{torn.name}" in capsys.readouterr().err
    assert sorted(run.iterations.groupby("rank")["iteration"].nunique()) == [2, 4]
    assert "!! left out an unreadable records part: rank00001/" in format_summary(run)


def test_a_copied_run_folder_gets_its_own_report_folder(tmp_path, capsys):
    """A copy keeps the run id in its manifest: its report goes beside the original's, not over it."""
    import shutil

    from harness.report.api import report_main

    runs, copies, reports = tmp_path / "runs", tmp_path / "copies", tmp_path / "reports"
    assert main([*TINY, "--run-id", "orig", "--runs-root", str(runs)]) == 0
    shutil.copytree(runs / "orig", copies / "orig")
    assert report_main("orig", runs, reports) == 0
    first = (reports / "orig" / "report.md").read_text()
    capsys.readouterr()
    assert report_main("orig", copies, reports) == 0
    assert "holds the report of something else; writing" in capsys.readouterr().err
    assert (reports / "orig" / "report.md").read_text() == first
    assert (reports / "orig-2" / "report.md").exists()
    assert report_main("orig", runs, reports) == 0  # the original again: its own folder, rewritten
    assert sorted(p.name for p in reports.iterdir()) == ["orig", "orig-2"]


def test_a_completed_run_leaves_one_records_file_a_rank_and_no_temp_folder(tmp_path, monkeypatch):
    """Parts compacted when a run completes (a failed run keeps its parts); the launcher's temp
    folders are gone; the compacted records read back whole."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where mkdtemp would leave folders
    (tmp_path / "tmp").mkdir()
    runs = tmp_path / "runs"
    assert main([*TINY[:-4], "--iters", "6", "--warmup", "0", "--flush-every", "2", "--runs-root", str(runs)]) == 0
    (run_dir,) = runs.iterdir()
    for rank in ("rank00000", "rank00001"):
        # Sub-spans: what ran between iterations (the next batch, the records' flush).
        assert sorted(p.name for p in (run_dir / rank).glob("*.parquet")) == ["iterations-all.parquet",
                                                                              "stages-all.parquet",
                                                                              "subspans-all.parquet"]
    assert list((tmp_path / "tmp").iterdir()) == []
    from harness.report.api import load_run

    assert sorted(load_run(run_dir).iterations.groupby("rank")["iteration"].nunique()) == [6, 6]
    assert main([*TINY[:-4], "--iters", "6", "--warmup", "0", "--flush-every", "2", "--fail-at", "1:4",
                 "--collective-timeout", "30", "--runs-root", str(runs)]) == 1
    failed = next(d for d in runs.iterdir() if d != run_dir)
    assert len(list((failed / "rank00000").glob("iterations-0*.parquet"))) >= 2  # kept as written


def test_a_crash_during_compaction_neither_loses_nor_doubles_rows(tmp_path):
    from harness.report.api import load_run

    runs = tmp_path / "runs"
    assert main([*TINY[:-4], "--iters", "4", "--warmup", "0", "--flush-every", "2", "--runs-root", str(runs)]) == 0
    (run_dir,) = runs.iterdir()
    import pandas as pd

    # Put back the parts beside the compacted file, as a crash between rename and deletes leaves them.
    its = pd.read_parquet(run_dir / "rank00000" / "iterations-all.parquet")
    its.iloc[:2].to_parquet(run_dir / "rank00000" / "iterations-00000.parquet", index=False)
    assert len(load_run(run_dir).iterations.query("rank == 0")) == 4


def test_an_immutable_runs_root_is_one_line(tmp_path, capsys):
    """chattr +i runs: even root cannot make a folder in it."""
    runs = tmp_path / "runs"
    runs.mkdir()
    if subprocess.run(["chattr", "+i", str(runs)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available on this filesystem")
    try:
        assert main([*TINY, "--runs-root", str(runs)]) == 2
        assert "cannot make the run folder" in one_error_line(capsys)
    finally:
        subprocess.run(["chattr", "-i", str(runs)], capture_output=True)
