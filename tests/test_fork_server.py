"""A local simulation's CPU ranks fork from a server that did their imports (harness/launch/fork_server.py):
what a rank sees of the launcher must still be what a spawned one would, the launcher's environment
and standard streams as they are when the run starts, not as they were when the server started."""

from __future__ import annotations

import json
import multiprocessing
import os

from harness.cli import main
from harness.launch import fork_server


def _report(name: str) -> None:
    # fd 2 itself, not sys.stderr: what a rank's C++ libraries and faulthandler write to
    os.write(2, f"rank sees {name}={os.environ.get(name)!r}\n".encode())


def _fork_one(name: str) -> None:
    fork_server.ready_server()
    p = multiprocessing.get_context("forkserver").Process(target=_report, args=(name,))
    p.start()
    p.join()
    assert p.exitcode == 0


def test_a_forked_rank_sees_the_launchers_environment_and_stderr_of_now(monkeypatch, capfd):
    name = "HARNESS_TEST_RANK_START"
    monkeypatch.delenv(name, raising=False)
    _fork_one(name)  # the server now runs, started without the variable
    assert "rank sees HARNESS_TEST_RANK_START=None" in capfd.readouterr().err
    monkeypatch.setenv(name, "set after the server started")
    _fork_one(name)
    assert "rank sees HARNESS_TEST_RANK_START='set after the server started'" in capfd.readouterr().err
    # stderr moved elsewhere: the rank's line goes there, not to where the server's stderr went
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        _fork_one(name)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    assert "rank sees" not in capfd.readouterr().err


def test_a_cpu_run_records_forked_ranks_and_a_second_run_reuses_the_server(tmp_path):
    runs = tmp_path / "runs"
    server = multiprocessing.forkserver._forkserver
    if server._forkserver_pid is not None:
        server._stop()  # an earlier test's: the server after the first run is then the launcher's
    servers = []
    for _ in range(2):
        assert main(["bench", "--preset", "tiny", "--device", "cpu", "--iters", "3", "--warmup", "1",
                     "--runs-root", str(runs)]) == 0
        servers.append(server._forkserver_pid)
    assert servers[0] is not None and servers[0] == servers[1]  # the second run's ranks forked from the first's server
    for run_dir in (p for p in runs.iterdir() if p.is_dir()):
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert (manifest["launcher"], manifest["start_method"]) == ("local-simulation", "forkserver")
        assert manifest["status"]["state"] == "completed"


def test_a_start_method_is_refused_where_no_local_simulation_starts_ranks(tmp_path, capsys):
    assert main(["bench", "--preset", "tiny", "--gpus-per-node", "1", "--in-process", "--start-method", "spawn",
                 "--runs-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["harness bench: error: --start-method is how a local simulation starts its ranks; "
                   "this run is in-process: drop --start-method"]
    assert not list(tmp_path.iterdir())
