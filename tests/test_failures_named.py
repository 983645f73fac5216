"""Failures named by their cause (issue 12, rows 1, 3, 7 and 9): a CPU run that cannot fit this
host's RAM, a rank killed from outside, a launcher that cannot bind its port, a plan with ranks
that hold nothing."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.launch.planning import host_memory_share_gib
from harness.records.writer import rank_errors

ROOT = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    """Running or sleeping; a zombie (dead, not yet reaped by whoever adopted it) is not alive."""
    try:
        return "\tZ" not in Path(f"/proc/{pid}/status").read_text().split("State:")[1].splitlines()[0]
    except (FileNotFoundError, IndexError):
        return False


def test_a_cpu_run_that_cannot_fit_this_hosts_ram_is_refused_before_start(tmp_path, capsys):
    """mlperf's tables (tens of GiB each) planned against the h100 profile's 64 GiB a rank would start
    here and eat the machine; on CPU the budget is this host's RAM over its ranks."""
    runs = tmp_path / "runs"
    code = main(["bench", "--device", "cpu", "--preset", "mlperf", "--gpus-per-node", "4", "--iters", "2",
                 "--warmup", "0", "--runs-root", str(runs)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not runs.exists()
    assert len(err.splitlines()) == 1
    assert f" GiB a rank, {host_memory_share_gib(4):.1f} GiB here" in err  # this host's RAM over its 4 ranks
    # A dry run still plans the cluster the profile describes.
    assert main(["bench", "--device", "cpu", "--preset", "mlperf", "--gpus-per-node", "4", "--dry-run",
                 "--runs-root", str(runs)]) == 0


def test_the_rank_that_died_first_is_named_before_the_others_errors(tmp_path):
    """Rank files as a SIGKILL leaves them: the killed rank wrote nothing, a survivor wrote the
    connection error losing it caused, another survivor was torn down by the launcher."""
    for rank, text in ((0, "RuntimeError: Connection reset by peer"), (2, "RuntimeError: later")):
        (tmp_path / f"rank{rank:05d}").mkdir()
        (tmp_path / f"rank{rank:05d}" / "error.txt").write_text("Traceback ...\n" + text + "\n")
        time.sleep(0.01)  # the mtimes order the written errors
    exits = {0: 1, 1: -signal.SIGKILL, 2: 1, 3: -signal.SIGTERM}
    assert rank_errors(tmp_path, exits) == [
        "rank 1: died without an error of its own (killed by SIGKILL)",
        "rank 3: died without an error of its own (killed by SIGTERM)",
        "rank 0: RuntimeError: Connection reset by peer",
        "rank 2: RuntimeError: later",
    ]


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_a_rank_killed_mid_run_is_named_in_the_manifest(tmp_path, start_method):
    """kill -9 of rank 1 while it trains: the run fails naming rank 1 first, and the records flushed
    before stay. Spawned, its signal too: torch's agent reports the first rank to exit, and rank 0,
    whose collective fails at once, exits well after rank 1 died (interpreter teardown). A rank
    forked from the fork server exits in a few ms (no teardown): often both exits are seen at one
    of the agent's polls (every 0.1 s), it reports the lower rank's, and rank 1's signal is lost."""
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "bench", "--device", "cpu", "--preset", "tiny",
                             "--iters", "5000", "--warmup", "0", "--flush-every", "5", "--runs-root", str(runs),
                             "--start-method", start_method],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            infos = list(runs.glob("*/rank00001/rank.json"))
            if infos and list(runs.glob("*/rank00001/iterations-*.parquet")):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("rank 1 never started recording")
        os.kill(json.loads(infos[0].read_text())["pid"], signal.SIGKILL)
        _, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 1
    (manifest_path,) = runs.glob("*/manifest.json")
    status = json.loads(manifest_path.read_text())["status"]
    assert status["state"] == "failed"
    killed = "rank 1: died without an error of its own (killed by SIGKILL)"
    if start_method == "spawn":
        assert status["error"].startswith(killed)
        assert "killed by SIGKILL" in err
    else:
        lost = "rank 1: started, then neither finished nor wrote an error (killed, or its host lost)"
        assert status["error"].startswith((killed, lost)), status["error"]
    assert list(manifest_path.parent.glob("rank00001/iterations-*.parquet"))


def test_a_launcher_that_cannot_bind_its_port_says_so(tmp_path):
    """Two torchrun-per-host runs on one port: the second's manifest and screen name the cause."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(busy.getsockname()[1]), "NODE_RANK": "0"}
        out = subprocess.run([sys.executable, "-m", "harness", "bench", "--device", "cpu", "--preset", "tiny",
                              "--nodes", "1", "--gpus-per-node", "2", "--iters", "2", "--run-id", "second",
                              "--runs-root", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=300)
    assert out.returncode == 1
    status = json.loads((tmp_path / "second" / "manifest.json").read_text())["status"]
    assert status["state"] == "failed" and "address already in use" in status["error"]
    assert status["error"].startswith("torchrun exited with code 1: ")
    assert "failed: torchrun exited with code 1: " in out.stderr and "EADDRINUSE" in out.stderr


def test_a_plan_with_empty_ranks_says_so_instead_of_a_spread(capsys):
    """26 tables, each whole on one of 32 ranks: 6 ranks hold nothing, and no ratio over their zero
    cost is printed. (mlperf on 2 x 8 used to leave rank 15 empty; the planner now fills it.)"""
    assert main(["bench", "--dry-run", "--preset", "tiny", "--gpus-per-node", "32", "--sharding", "table_wise"]) == 0
    out = capsys.readouterr().out
    cost = out[out.index("estimated cost a rank"):out.index("per-rank table")]  # wrapped to 100 columns
    assert "spread" not in cost and "6 of 32 ranks hold no shard (ranks " in cost
    from harness.launch.planning import _ranges

    assert _ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8" and _ranges([4]) == "4"


def test_a_killed_launcher_leaves_a_running_run_that_the_report_calls_unfinished(tmp_path):
    """kill -9 of the launcher: its ranks stop too (torch's spawn gives them SIGINT when their parent
    dies), the manifest stays `running`, the flushed records load, and the report says the run did
    not finish."""
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "bench", "--device", "cpu", "--preset", "tiny",
                             "--iters", "5000", "--warmup", "0", "--flush-every", "5", "--runs-root", str(runs)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while not (len(list(runs.glob("*/rank*/rank.json"))) == 2 and list(runs.glob("*/rank00000/iterations-*.parquet"))
               and list(runs.glob("*/rank00001/iterations-*.parquet"))):
        assert time.monotonic() < deadline, "the ranks never started recording"
        time.sleep(0.2)
    pids = [json.loads(p.read_text())["pid"] for p in runs.glob("*/rank*/rank.json")]
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, "ranks outlived their launcher"
        time.sleep(0.2)
    (run_dir,) = runs.iterdir()
    assert json.loads((run_dir / "manifest.json").read_text())["status"]["state"] == "running"
    from harness.report.api import format_summary, load_run

    run = load_run(run_dir)
    assert set(run.iterations["rank"]) == {0, 1}  # what was flushed before the kill loads
    assert "DID NOT FINISH (status running" in format_summary(run)


def _rank_json(run_dir: Path, rank: int, host: str, node: int, finished: bool) -> None:
    from harness.records.manifest import RankInfo

    info = RankInfo(run_id="x", rank=rank, node=node, host=host, pid=100 + rank, device="cpu", backend="gloo",
                    threads=1, gemm_gflops=1.0, copy_gbps=1.0, peak_rss_gib=0.5 if finished else None)
    (run_dir / f"rank{rank:05d}").mkdir(exist_ok=True)
    (run_dir / f"rank{rank:05d}" / "rank.json").write_text(info.to_json())


def test_a_host_whose_ranks_vanished_is_named_first_with_its_ranks(tmp_path):
    """What node 0's launcher finds when host1 was killed: its own ranks wrote the connection
    errors, host1's ranks started and then said nothing (this launcher cannot see their exits).
    host1 and its ranks come first; every rank is named with its host and node."""
    for rank, host in enumerate(("host0", "host0", "host1", "host1", "host2", "host2")):
        _rank_json(tmp_path, rank, host, rank // 2, finished=host == "host2" and rank == 5)
    (tmp_path / "rank00004" / "error.txt").write_text("Traceback ...\nRuntimeError: Timed out\n")
    for rank in (0, 1):
        (tmp_path / f"rank{rank:05d}" / "error.txt").write_text("Traceback ...\nRuntimeError: Connection closed by peer\n")
        time.sleep(0.01)
    assert rank_errors(tmp_path) == [
        "ranks 2, 3 (host1): started, then neither finished nor wrote an error (killed, or its host lost)",
        "rank 4 (host2, node 2): RuntimeError: Timed out",
        "rank 0 (host0, node 0): RuntimeError: Connection closed by peer",
        "rank 1 (host0, node 0): RuntimeError: Connection closed by peer",
    ]


def test_the_launcher_waits_for_the_other_hosts_ranks_to_settle(tmp_path):
    """A rank of another host whose error lands a moment after ours is read, not named as lost."""
    import threading

    from harness.records.writer import wait_for_ranks_to_settle

    _rank_json(tmp_path, 0, "host0", 0, finished=False)
    (tmp_path / "rank00000" / "error.txt").write_text("RuntimeError: Timed out\n")
    _rank_json(tmp_path, 1, "host1", 1, finished=False)
    late = threading.Timer(0.5, lambda: (tmp_path / "rank00001" / "error.txt").write_text("RuntimeError: Timed out too\n"))
    late.start()
    wait_for_ranks_to_settle(tmp_path, timeout_s=10)
    late.join()
    assert rank_errors(tmp_path)[-1] == "rank 1 (host1, node 1): RuntimeError: Timed out too"
    start = time.monotonic()
    _rank_json(tmp_path, 2, "host1", 1, finished=False)  # never speaks: the wait ends at its timeout
    wait_for_ranks_to_settle(tmp_path, timeout_s=1)
    assert time.monotonic() - start < 5
    assert rank_errors(tmp_path)[0] == "rank 2 (host1, node 1): started, then neither finished nor wrote an error (killed, or its host lost)"


def test_a_rank_ended_by_sigterm_leaves_its_stacks_and_is_named_after_the_errors(tmp_path):
    """A launcher tears its surviving ranks down with SIGTERM when one fails. A survivor caught
    sleeping in C (as one blocked in a collective is) still leaves its threads' stacks, dies by
    the signal as before, and is named after the error that caused the teardown, not as lost."""
    from harness.records.writer import unsettled_ranks

    _rank_json(tmp_path, 0, "host0", 0, finished=False)
    _rank_json(tmp_path, 1, "host0", 0, finished=False)
    (tmp_path / "rank00000" / "error.txt").write_text("Traceback ...\nRuntimeError: Connection closed by peer\n")
    script = ("import sys, time; from harness.records.writer import RankRecorder; "
              "r = RankRecorder(sys.argv[1], run_id='x', rank=1, node=0, warmup_iters=0, local_batch=1); "
              "r.note_sigterm(); print('ready', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    assert unsettled_ranks(tmp_path) == [1]  # the empty file does not count as a word
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    stacks = (tmp_path / "rank00001" / "sigterm.txt").read_text()
    assert "most recent call first" in stacks and "<string>" in stacks
    assert unsettled_ranks(tmp_path) == []
    assert rank_errors(tmp_path) == [
        "rank 0: RuntimeError: Connection closed by peer",
        "rank 1: ended by SIGTERM (its launcher tearing the job down, or the job cancelled; "
        "its threads' stacks are in rank00001/sigterm.txt)",
    ]
    # The launcher's exit code for it (-SIGTERM) does not make it a silent death either.
    assert rank_errors(tmp_path, {0: 1, 1: -signal.SIGTERM})[1].startswith("rank 1: ended by SIGTERM")
    # A rank that ends as it should leaves no sigterm.txt, and its SIGTERM handler is gone
    # (faulthandler.unregister says whether one was still registered).
    ended = ("import faulthandler, signal, sys; from harness.records.writer import RankRecorder; "
             "r = RankRecorder(sys.argv[1], run_id='x', rank=2, node=0, warmup_iters=0, local_batch=1); "
             "r.note_sigterm(); r.end_sigterm_note(); print(faulthandler.unregister(signal.SIGTERM))")
    out = subprocess.run([sys.executable, "-c", ended, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out
    assert (tmp_path / "rank00002").is_dir() and not (tmp_path / "rank00002" / "sigterm.txt").exists()
