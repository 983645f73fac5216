"""torchrun per host, for real (issue 14): each test host runs `make bench` with MASTER_ADDR and
NODE_RANK, as a user runs it on every node of a cluster; then a host cut off mid-run and a host
killed mid-run. Everything is checked through the shared run folder."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.records.writer import read_manifest
from harness.report.api import load_run
from tests.cluster.conftest import bench_argv, start_on_hosts, tails, wait_all
from tests.cluster.testhosts import TestHosts

pytestmark = pytest.mark.cluster

TIMEOUT_S = 20
"""The fault runs' collective timeout (--collective-timeout): how long a rank waits on a lost peer."""


def check_hosts_and_nodes(run_dir: Path, names: list[str]) -> None:
    m = read_manifest(run_dir)
    assert m.launcher == "torchrun" and list(m.hosts) == sorted(names)
    assert sorted((r.rank, r.node, r.host) for r in m.ranks) == [(r, r // 2, names[r // 2]) for r in range(2 * len(names))]


@pytest.mark.parametrize("n", [2, 4])
def test_torchrun_on_each_host_completes(tmp_path, n):
    names = [f"host{k}" for k in range(n)]
    runs, run_id = tmp_path / "runs", f"hosts{n}"
    with TestHosts(names) as hosts:
        procs = start_on_hosts(hosts, names, bench_argv(nodes=n, run_id=run_id, runs=runs), tmp_path / "logs")
        codes = wait_all(procs, timeout_s=300)
    assert codes == [0] * n, tails(tmp_path / "logs")
    run_dir = runs / run_id
    assert read_manifest(run_dir).status.state == "completed"
    check_hosts_and_nodes(run_dir, names)
    run = load_run(run_dir)
    iters = read_manifest(run_dir).config.run.iters + read_manifest(run_dir).config.run.warmup_iters
    assert run.iterations.groupby("rank")["iteration"].nunique().to_dict() == {r: iters for r in range(2 * n)}
    # The report's per-node view names each node's host.
    from harness.cli import main

    assert main(["report", "--run", run_id, "--runs-root", str(runs), "--reports-root", str(tmp_path / "reports")]) == 0
    md = (tmp_path / "reports" / run_id / "report.md").read_text()
    per_node = md.split("Per node")[1].split("Per rank")[0]
    for k, name in enumerate(names):
        assert f"| {k} | {name} |" in per_node


def _start_long_run(hosts, names, tmp_path, run_id):
    runs = tmp_path / "runs"
    argv = bench_argv(nodes=len(names), run_id=run_id, runs=runs, iters=5000,
                      opts=f"--flush-every 5 --collective-timeout {TIMEOUT_S}")
    procs = start_on_hosts(hosts, names, argv, tmp_path / "logs")
    run_dir = runs / run_id
    deadline = time.monotonic() + 180
    while not all(list(run_dir.glob(f"rank{r:05d}/iterations-*.parquet")) for r in range(2 * len(names))):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:
                p.kill()
            raise AssertionError("the run did not reach its first flush on every rank\n" + tails(tmp_path / "logs"))
        time.sleep(0.3)
    return procs, run_dir


def check_failed_run(run_dir: Path, names: list[str], *, lost: str, ranks: tuple[int, ...]) -> str:
    """Failed, the lost host and its ranks in the error, and every rank's flushed records readable."""
    m = read_manifest(run_dir)
    assert m.status.state == "failed", m.status
    error = m.status.error or ""
    assert lost in error and all(f"rank {r}" in error or f"ranks {', '.join(map(str, ranks))}" in error for r in ranks), error
    check_hosts_and_nodes(run_dir, names)
    run = load_run(run_dir)
    counted = run.iterations.groupby("rank")["iteration"].nunique()
    assert sorted(counted.index) == list(range(2 * len(names))) and (counted >= 5).all(), counted
    return error


def test_a_host_cut_off_mid_run_ends_the_job_within_the_collective_timeout(tmp_path):
    names = ["host0", "host1"]
    with TestHosts(names) as hosts:
        procs, run_dir = _start_long_run(hosts, names, tmp_path, "cut")
        cut = time.monotonic()
        hosts["host1"].cut_link()
        codes = wait_all(procs, timeout_s=TIMEOUT_S + 120)
        took = time.monotonic() - cut
    assert all(c != 0 for c in codes), tails(tmp_path / "logs")
    # A rank notices within the collective timeout; its launcher then waits for the other host's
    # ranks to write their errors (records.SETTLE_S) before closing the run.
    assert took < TIMEOUT_S + 20 + 30, took
    error = check_failed_run(run_dir, names, lost="host1", ranks=(2, 3))
    assert "rank 2 (host1, node 1)" in error and "rank 0 (host0, node 0)" in error


def test_a_host_killed_mid_run_is_named_with_its_ranks(tmp_path):
    names = ["host0", "host1"]
    with TestHosts(names) as hosts:
        procs, run_dir = _start_long_run(hosts, names, tmp_path, "killed")
        killed = time.monotonic()
        assert hosts["host1"].kill_all()  # make, bench, torchrun and both ranks: the host is gone
        codes = wait_all(procs, timeout_s=TIMEOUT_S + 120)
        took = time.monotonic() - killed
    assert codes[0] != 0, tails(tmp_path / "logs")
    assert took < TIMEOUT_S + 20 + 30, took
    error = check_failed_run(run_dir, names, lost="host1", ranks=(2, 3))
    # The lost host comes first: host0's ranks' errors are what losing it did to them.
    assert error.startswith("ranks 2, 3 (host1): started, then neither finished nor wrote an error"), error
