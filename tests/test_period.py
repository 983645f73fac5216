"""The iteration is the wall-clock cycle (issue 43): a batch source slowed on purpose shows up in
the reported period and in the between-iterations segment, named by what ran there; the timed
window alone (iter_ms) would not see it. End to end: make bench's path, ranks in processes of
their own, the report read from the run folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main
from harness.report import api as report
from harness.report.iterations import job_iterations
from harness.report.tables import subspan_table

ROOT = Path(__file__).resolve().parent.parent
DELAY_S = 0.04
SLOW_BATCHES = f'''
import time
import harness.data.synthetic as synthetic
_local_batch = synthetic.SyntheticCriteo.local_batch


def _slow(self, *args, **kwargs):
    time.sleep({DELAY_S})
    return _local_batch(self, *args, **kwargs)


synthetic.SyntheticCriteo.local_batch = _slow
'''


def test_a_slow_batch_source_shows_in_the_period_and_between_iterations(tmp_path, monkeypatch):
    # Every interpreter the launcher starts runs sitecustomize first: the ranks' batches are slow,
    # this test process's are not (its interpreter started before the file existed).
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SLOW_BATCHES)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'site'}:{ROOT}")
    runs = tmp_path / "runs"
    assert main(["bench", "--preset", "tiny", "--iters", "8", "--warmup", "2", "--flush-every", "100",
                 "--runs-root", str(runs)]) == 0
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    run = report.load_run(run_dir)
    delay_ms = DELAY_S * 1e3
    # The pipelined loop loads batch i+1 before iteration i+1 begins: each cycle but the last
    # (nothing left to load) pays the delay between iterations, outside the timed window.
    its = job_iterations(run)
    cycles = its[its["period_ms"].notna()]
    assert len(cycles) == 7
    loaded = cycles[cycles["iteration"] < cycles["iteration"].max()]  # the last cycle loaded nothing
    assert (loaded["period_ms"] - loaded["iter_ms"] >= 0.9 * delay_ms).all()
    assert (loaded["between_ms"] >= 0.9 * delay_ms).all()
    parts = subspan_table(run).set_index(["stage", "name"])
    assert parts.loc[("between_iterations", "next_batch"), "p50_ms"] >= 0.9 * delay_ms
    summary = report.iteration_summary(run)
    assert summary["period_ms_mean"] == pytest.approx(cycles["period_ms"].mean())
    assert summary["samples_per_s"] == pytest.approx(96 * len(cycles) / (cycles["period_ms"].sum() / 1e3))
