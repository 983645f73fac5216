"""Slurm, for real (issue 14): munged, slurmctld and one slurmd a test host, then `make bench`
submitted with sbatch and run under salloc. The harness's Slurm path does the rest: srun, one
torchrun a node, c10d rendezvous on the allocation's first node. Checked through the run folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.records.writer import read_manifest
from harness.report.api import load_run
from tests.cluster.conftest import ROOT, bench_argv
from tests.cluster.slurm_cluster import SlurmCluster, missing_programs
from tests.cluster.testhosts import TestHosts

pytestmark = pytest.mark.cluster

COMPUTE = ["node0", "node1"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if missing_programs():
        pytest.skip(f"Slurm is not installed here (missing {', '.join(missing_programs())}); make test-cluster installs it")
    with TestHosts(["ctl", *COMPUTE]) as hosts, \
            SlurmCluster(hosts, controller="ctl", folder=tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def check_slurm_run(run_dir: Path) -> None:
    m = read_manifest(run_dir)
    assert m.status.state == "completed", m.status
    assert m.launcher == "slurm" and list(m.hosts) == COMPUTE
    # c10d rendezvous lets nodes join in any order: each node's two ranks share a host, and the two
    # nodes are the two hosts of the allocation.
    by_node = {n: {r.host for r in m.ranks if r.node == n} for n in (0, 1)}
    assert sorted(r.rank for r in m.ranks) == [0, 1, 2, 3] and sorted(h for hs in by_node.values() for h in hs) == COMPUTE
    # Each node's task holds all the node's CPUs (this machine's, as each slurmd reports them).
    assert all(f"srun --nodes=2 --ntasks-per-node=1 --cpus-per-task={os.cpu_count()}" in c for c in m.node_commands)
    run = load_run(run_dir)
    iters = m.config.run.iters + m.config.run.warmup_iters
    assert run.iterations.groupby("rank")["iteration"].nunique().to_dict() == {r: iters for r in range(4)}


def test_sbatch_runs_make_bench_through_srun(slurm, tmp_path):
    runs = tmp_path / "runs"
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n" + " ".join(f"'{a}'" for a in bench_argv(nodes=2, run_id="sbatch", runs=runs)) + "\n")
    script.chmod(0o755)
    out = tmp_path / "job.out"
    state = slurm.sbatch("node0", ["--nodes=2", f"--chdir={ROOT}", f"--output={out}", str(script)])
    assert state == ("COMPLETED", "0:0"), out.read_text()[-3000:] if out.exists() else state
    check_slurm_run(runs / "sbatch")


def test_salloc_runs_make_bench_through_srun(slurm, tmp_path):
    runs = tmp_path / "runs"
    done = slurm.run("node0", ["salloc", "--nodes=2", *bench_argv(nodes=2, run_id="salloc", runs=runs)],
                     cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    check_slurm_run(runs / "salloc")


def test_bench_asking_for_more_nodes_than_the_allocation_is_refused_in_one_line(slurm, tmp_path):
    runs = tmp_path / "runs"
    done = slurm.run("node0", ["salloc", "--nodes=2", *bench_argv(nodes=3, run_id="three", runs=runs)],
                     cwd=ROOT, capture_output=True, text=True, timeout=120)
    said = [ln for ln in done.stderr.splitlines() if ln.startswith("harness bench:")]
    assert done.returncode != 0 and said == ["harness bench: error: NODES=3 but this Slurm allocation has 2 node(s); "
                                             "ask salloc/sbatch for 3"], done.stderr
    assert not runs.exists()


def test_bench_started_as_an_srun_task_is_refused_in_one_line(slurm, tmp_path):
    """`srun make bench` would start one job step a task; the harness starts srun itself."""
    runs = tmp_path / "runs"
    done = slurm.run("node0", ["srun", "--nodes=2", "--ntasks-per-node=1", *bench_argv(nodes=2, run_id="nested", runs=runs)],
                     cwd=ROOT, capture_output=True, text=True, timeout=120)
    said = {ln for ln in done.stderr.splitlines() if ln.startswith("harness bench:")}
    assert done.returncode != 0 and len(said) == 1 and "itself an srun task" in said.pop(), done.stderr
    assert not runs.exists()
