"""bench --in-process: the one rank of a one-rank run in the launcher's own process (gpu-bench's
runs on one GPU). Checked against a spawned run of the same config (the launcher the other tests
use), against what the process held before, and against the environment a run leaves behind."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch

from harness.cli import main
from harness.records.writer import read_manifest
from harness.report.api import load_run

TINY = ["bench", "--preset", "tiny", "--gpus-per-node", "1", "--iters", "6", "--warmup", "2"]


def _losses(run_dir):
    it = load_run(run_dir).iterations.sort_values("iteration")
    return it["loss"].to_numpy()


def test_an_in_process_run_trains_as_a_spawned_one_and_leaves_the_process_as_it_was(tmp_path):
    """Same seed, same losses bit for bit, whichever way the rank started (no flag changes the
    math); the run's settings (threads, environment, TF32) are put back and no thread of it (the
    threads drawing batches ahead, asked for: a CPU rank draws none by default) is left running."""
    threads, environ = torch.get_num_threads(), dict(os.environ)
    torch.set_num_threads(1)
    try:
        alive = threading.active_count()
        assert main([*TINY, "--in-process", "--ahead", "2", "--runs-root", str(tmp_path),
                     "--run-id", "here"]) == 0
        assert torch.get_num_threads() == 1 and dict(os.environ) == environ
        assert not torch.backends.cuda.matmul.allow_tf32
        assert threading.active_count() == alive
    finally:
        torch.set_num_threads(threads)
    for how in ("spawn", "forkserver"):
        assert main([*TINY, "--runs-root", str(tmp_path), "--run-id", how, "--start-method", how]) == 0
    here, spawned, forked = (read_manifest(tmp_path / r) for r in ("here", "spawn", "forkserver"))
    assert here.launcher == "in-process" and spawned.launcher == forked.launcher == "local-simulation"
    assert (here.start_method, spawned.start_method, forked.start_method) == (None, "spawn", "forkserver")
    assert here.ranks[0].pid == os.getpid() != spawned.ranks[0].pid
    np.testing.assert_array_equal(_losses(tmp_path / "here"), _losses(tmp_path / "spawn"))
    np.testing.assert_array_equal(_losses(tmp_path / "forkserver"), _losses(tmp_path / "spawn"))
    assert len(_losses(tmp_path / "here")) == 8
    # Its start-up: no imports of its own; the other phases as a spawned rank records them.
    assert here.ranks[0].startup_s["imports"] == 0.0 and spawned.ranks[0].startup_s["imports"] > 0.1
    assert set(here.ranks[0].startup_s) == set(spawned.ranks[0].startup_s)


def test_an_in_process_runs_memory_peak_is_its_own(tmp_path):
    """The process peaks 1 GiB above what it holds before the run and frees it: the run's record
    must not carry that peak, as the process's lifetime peak (ru_maxrss) would."""
    import resource

    block = np.ones(2**30, dtype=np.uint8)
    del block
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    assert main([*TINY, "--in-process", "--runs-root", str(tmp_path), "--run-id", "here"]) == 0
    peak = read_manifest(tmp_path / "here").ranks[0].peak_rss_gib
    assert 0 < peak < before - 0.5, (peak, before)


def test_a_failed_in_process_rank_is_named_and_the_next_run_starts_clean(tmp_path, capsys):
    assert main([*TINY, "--in-process", "--fail-at", "0:3", "--runs-root", str(tmp_path), "--run-id", "bad"]) == 1
    err = capsys.readouterr().err
    assert "run bad failed: rank 0" in err and "injected fault on rank 0 at iteration 3" in err
    assert read_manifest(tmp_path / "bad").status.state == "failed"
    assert len(_losses(tmp_path / "bad")) == 3  # what it recorded before the fault is kept
    assert not torch.distributed.is_initialized()
    assert main([*TINY, "--in-process", "--runs-root", str(tmp_path), "--run-id", "good"]) == 0
    assert read_manifest(tmp_path / "good").status.state == "completed"


@pytest.mark.parametrize("argv, why", [
    (["--gpus-per-node", "2"], "--in-process runs one rank in this process; this run has 2"),
    (["--nodes", "2"], "--in-process runs one rank in this process; this run has 2"),
    (["--node-rank", "0", "--rdzv-endpoint", "h:1"], "--in-process starts no launcher, but --rdzv-endpoint, "
                                                     "--node-rank asks for one"),
])
def test_in_process_with_more_than_one_rank_or_a_launcher_is_refused_in_one_line(tmp_path, capsys, argv, why):
    assert main([*TINY, "--in-process", *argv, "--runs-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and why in err[0], err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("broken", ["clear_refs", "status"])
def test_a_host_that_cannot_give_a_run_its_own_peak_refuses_in_process_in_one_line(tmp_path, capsys, monkeypatch,
                                                                                   broken):
    """A sandboxed kernel may lack either file or refuse the write (the device tool's H200s were seen
    under gVisor): tried before the run, not found out after its iterations."""
    from harness.run import peaks
    if broken == "clear_refs":
        monkeypatch.setattr(peaks, "CLEAR_REFS", str(tmp_path))  # a folder: the write fails
    else:
        status = tmp_path / "status"
        status.write_text("Name:\tpython\nVmRSS:\t1000 kB\n")
        monkeypatch.setattr(peaks, "STATUS", str(status))
    assert main([*TINY, "--in-process", "--runs-root", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--in-process needs a memory peak of the run's own" in err[0], err
    assert ("IsADirectoryError" if broken == "clear_refs" else "has no VmHWM line") in err[0]
    assert not (tmp_path / "runs").exists()


def test_an_in_process_run_binds_no_port(tmp_path, monkeypatch):
    """The launcher's rendezvous port taken before the rank starts (as an H100 gpu-bench's was,
    EADDRINUSE, between two in-process runs): the one rank's store is in memory, the run trains."""
    import socket

    from harness.launch import launcher

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(launcher, "free_port", lambda: taken.getsockname()[1])
        assert main([*TINY, "--in-process", "--runs-root", str(tmp_path), "--run-id", "taken"]) == 0
    assert len(_losses(tmp_path / "taken")) == 8  # 2 warm-up and 6 timed
