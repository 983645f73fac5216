"""The data path hardened (issue 47, rows 3 and 6, and the mlperf messages): non-finite dense values
are refused naming the file and rows; a non-finite loss fails the run at its iteration; `make
dataset` on a full or read-only filesystem says so in one line and leaves no partial day behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.cli import main
from harness.data.criteo_files import CriteoFiles, DataError
from harness.presets import tiny
from harness.run.flush import NonFiniteLoss, RecordFlusher
from harness.run.pinned_d2h import HostCopies
from harness.run.timeline import Timeline
from harness.tools.make_dataset import main as make_dataset
from harness.tools.mlperf import main as mlperf

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data") / "days"
    assert make_dataset(["--out", str(out), "--rows", "2000", "--days", "3"]) == 0
    return out


def with_nan(dataset: Path, tmp_path: Path, row: int) -> Path:
    """A copy of the files with one NaN dense value in day 0's row `row`."""
    bad = tmp_path / "bad"
    bad.mkdir()
    for p in dataset.iterdir():
        (bad / p.name).symlink_to(p)
    (bad / "day_0_dense.npy").unlink()
    dense = np.load(dataset / "day_0_dense.npy")
    dense[row, 3] = np.nan
    np.save(bad / "day_0_dense.npy", dense)
    return bad


# Row 3: NaN in the data, NaN in the loss.

def test_a_non_finite_dense_value_is_refused_with_its_file_and_rows(dataset, tmp_path):
    bad = with_nan(dataset, tmp_path, row=200)
    files = CriteoFiles(bad, tiny().model, 96)
    files.samples(0, 192)  # rows 0..191: clean
    with pytest.raises(DataError, match=f"{bad / 'day_0_dense.npy'}: a non-finite dense value \\(NaN or inf\\) in rows "
                                        "192..287"):
        files.samples(192, 96)


def test_a_run_on_a_day_with_nan_fails_naming_the_file(dataset, tmp_path):
    bad = with_nan(dataset, tmp_path, row=100)
    runs = tmp_path / "runs"
    assert main(["bench", "--device", "cpu", "--preset", "tiny", "--iters", "4", "--warmup", "0", "--data", str(bad),
                 "--run-id", "nan", "--runs-root", str(runs)]) == 1
    st = json.loads((runs / "nan" / "manifest.json").read_text())["status"]
    assert st["state"] == "failed" and "day_0_dense.npy: a non-finite dense value (NaN or inf) in rows" in st["error"]


def test_an_mlperf_run_on_a_day_with_nan_fails_instead_of_logging_an_auroc(dataset, tmp_path):
    bad = with_nan(dataset, tmp_path, row=100)
    runs = tmp_path / "runs"
    assert mlperf(["--data", str(bad), "--device", "cpu", "--preset", "tiny", "--iters", "3", "--run-id", "m",
                   "--runs-root", str(runs)]) == 1
    st = json.loads((runs / "m" / "manifest.json").read_text())["status"]
    assert st["state"] == "failed" and "a non-finite dense value" in st["error"]


def test_the_flush_names_the_iteration_of_the_first_non_finite_loss():
    flusher = RecordFlusher(timeline=Timeline(cuda=False, stages=True), host=HostCopies(torch.device("cpu"), False),
                            recorder=None)
    flusher.pending = {0: torch.tensor(0.7), 1: torch.tensor(0.6), 2: torch.tensor(float("nan")),
                       3: torch.tensor(float("inf"))}
    with pytest.raises(NonFiniteLoss, match="the loss is nan at iteration 2 \\(first non-finite loss"):
        flusher.flush()
    assert flusher.losses[:2] == pytest.approx([0.7, 0.6])
    flusher.flush()  # the flush after a failure writes nothing twice and raises nothing new


def test_a_diverging_run_fails_at_the_iteration_of_its_first_nan_loss(tmp_path):
    runs = tmp_path / "runs"
    assert main(["bench", "--device", "cpu", "--preset", "tiny", "--iters", "6", "--warmup", "0", "--flush-every", "2",
                 "--learning-rate", "1e30", "--run-id", "nan", "--runs-root", str(runs)]) == 1
    st = json.loads((runs / "nan" / "manifest.json").read_text())["status"]
    assert st["state"] == "failed" and "NonFiniteLoss: the loss is nan at iteration " in st["error"]


# Row 6: make dataset on a filesystem that refuses it.

def _mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode == 0


@pytest.mark.parametrize("options, cause", [("size=1m", "No space left on device"), ("ro,size=1m", "Read-only file system")])
def test_make_dataset_on_a_full_or_read_only_disk_is_one_line_and_leaves_nothing(options, cause, tmp_path):
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, options):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        out = subprocess.run([sys.executable, "-m", "harness.tools.make_dataset", "--out", str(disk / "days"), "--rows",
                              "20000", "--days", "3"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert out.returncode == 1
        err = out.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("make dataset: cannot write ") and cause in err[0], err
        assert not (disk / "days").exists() or list((disk / "days").iterdir()) == []
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


# The mlperf messages.

def test_mlperf_eval_every_0_says_what_is_wrong(dataset, capsys):
    assert mlperf(["--data", str(dataset), "--device", "cpu", "--preset", "tiny", "--eval-every", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["harness mlperf: error: --eval-every 0 turns evaluation off, and an MLPerf run stops at the evaluation "
                   "that reaches its target: give a positive --eval-every, or leave it out for 20 an epoch"]


def test_mlperf_bad_target_auc_is_prefixed_harness_mlperf(dataset, capsys):
    with pytest.raises(SystemExit):
        mlperf(["--data", str(dataset), "--target-auc", "abc"])
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("harness mlperf: error: argument --target-auc: invalid float value: 'abc'")
    assert not any("harness bench" in line for line in err)
