"""The config, the run folder and the report hardened (issue 47, rows 4, 5 and 8, and the rank
failure output): every number meant finite is refused in one line before start when it is not; a
runs root too full for the space reserve leaves no folder; a compare report that cannot be made
leaves no folder; a rank failure prints the harness's summary, its traceback kept in error.txt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.presets import tiny
from tests.test_hardening import TINY, one_error_line

ROOT = Path(__file__).resolve().parent.parent


# Row 4: numbers that must be finite.

@pytest.mark.parametrize("args, message", [
    (["--collective-timeout", "inf"], "run.collective_timeout_s must be a finite number, got inf"),
    (["--learning-rate", "inf"], "optimizer.learning_rate must be a finite number, got inf"),
    (["--dynamic-memory-gib", "inf", "--shard", "2=dynamic"], "dynamic.memory_gib must be a finite number, got inf"),
    (["--ps-spill-gib", "inf", "--shard", "2=dynamic"], "dynamic.ps_spill_gib must be a finite number, got inf"),
    (["--id-exponent", "inf"], "data.id_exponent must be a finite number, got inf"),
    (["--id-exponent", "nan"], "data.id_exponent must be a finite number, got nan"),
    (["--memory-gib", "inf"], "sharding.memory_gib must be a finite number, got inf"),
])
def test_a_number_that_must_be_finite_is_refused_before_start(args, message, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main([*TINY, *args, "--runs-root", str(runs)]) == 2
    assert message in one_error_line(capsys)
    assert not runs.exists()


def test_every_preset_is_finite_and_its_manifest_config_is_strict_json():
    from harness.records.typed_json import dumps

    text = dumps(tiny())
    json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in a config's JSON"))


# Row 5: a runs root with no room for the space reserve.

def test_a_runs_root_without_room_for_the_reserve_leaves_no_folder(tmp_path, capsys):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        assert main([*TINY, "--run-id", "small", "--runs-root", str(disk)]) == 2
        line = one_error_line(capsys)
        assert "cannot make the run folder" in line and "No space left on device" in line
        assert list(disk.iterdir()) == []
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


# Row 8: a compare report that cannot be made.

def test_a_compare_report_refused_leaves_no_folder(tmp_path, capsys):
    runs, reports = tmp_path / "runs", tmp_path / "reports"
    one = ["--gpus-per-node", "1", "--in-process"]  # the report's refusal needs no more ranks
    assert main([*TINY[:-4], *one, "--iters", "4", "--warmup", "1", "--run-id", "ok", "--runs-root", str(runs)]) == 0
    assert main([*TINY, *one, "--fail-at", "0:0", "--run-id", "bad", "--runs-root", str(runs)]) == 1
    capsys.readouterr()
    assert main(["report", "--run", "ok,bad", "--runs-root", str(runs), "--reports-root", str(reports)]) == 2
    assert "no run has complete non-warm-up iterations" in one_error_line(capsys)
    assert not reports.exists() or list(reports.iterdir()) == []


# Also seen: a rank failure's output.

def test_a_rank_failure_prints_the_summary_and_keeps_the_traceback_in_the_error_file(tmp_path):
    out = subprocess.run([sys.executable, "-m", "harness", *TINY[:-4], "--iters", "3", "--warmup", "0", "--fail-at", "1:1",
                          "--run-id", "f", "--runs-root", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1
    err = out.stderr.strip().splitlines()
    assert "Traceback" not in out.stderr and len(err) == 2, err
    assert err[0].startswith("harness bench: run f failed: rank 1: harness.run.faults.InjectedFault: injected fault")
    assert err[1] == f"harness bench: records written before the failure are kept in {tmp_path / 'f'}"
    traceback = (tmp_path / "f" / "rank00001" / "error.txt").read_text()
    assert traceback.startswith("Traceback") and "maybe_inject_fault" in traceback
