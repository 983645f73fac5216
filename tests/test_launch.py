"""Launcher choice, dry runs, a real two-host torchrun launch on loopback, and hung ranks."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.cli import main
from harness.launch.launcher import choose_launch, free_port, node_commands
from harness.records.manifest import RunManifest
from harness.presets import tiny

ROOT = Path(__file__).resolve().parent.parent


def fake_slurm_bin(folder: Path, *, scontrol: str | None = "echo nodeA; echo nodeB", srun: bool = True) -> str:
    """A PATH holding stand-ins for Slurm's commands: scontrol runs `scontrol` as a shell body."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in (("scontrol", scontrol), ("srun", "exit 0" if srun else None)):
        if body is not None:
            (folder / name).write_text(f"#!/bin/sh\n{body}\n")
            (folder / name).chmod(0o755)
    return str(folder)


def slurm_env(path: str, **extra: str) -> dict[str, str]:
    return {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[A-B]", "PATH": path, **extra}


def test_launcher_is_chosen_from_the_environment(tmp_path):
    cfg = tiny(nodes=2, gpus_per_node=1)
    assert choose_launch(cfg, environ={}, rdzv_endpoint=None, node_rank=None).mode == "local-simulation"
    slurm = choose_launch(cfg, environ=slurm_env(fake_slurm_bin(tmp_path)), rdzv_endpoint=None, node_rank=None)
    assert slurm.mode == "slurm" and slurm.endpoint == "nodeA:29500"  # scontrol's first host
    assert slurm.cpus_per_node is None  # Slurm did not say: srun's own default
    lines = node_commands(slurm, Path("runs/x"), "x")
    assert len(lines) == 2 and all("srun --nodes=2" in ln and "--nnodes=2" in ln for ln in lines)
    host = choose_launch(cfg, environ={"MASTER_ADDR": "h0", "NODE_RANK": "1"}, rdzv_endpoint=None, node_rank=None)
    assert (host.mode, host.endpoint, host.node_rank) == ("torchrun", "h0:29500", 1)
    assert "--node-rank=1" in node_commands(host, Path("runs/x"), "x")[1]


@pytest.mark.parametrize("cpus, expected", [("72(x2)", 72), ("36,72(x3)", 36), ("16", 16), ("", None), ("lots", None)])
def test_each_nodes_srun_task_gets_all_the_cpus_the_job_holds_there(tmp_path, cpus, expected):
    launch = choose_launch(tiny(nodes=2, gpus_per_node=1), environ=slurm_env(fake_slurm_bin(tmp_path),
                           SLURM_JOB_CPUS_PER_NODE=cpus), rdzv_endpoint=None, node_rank=None)
    assert launch.cpus_per_node == expected
    line = node_commands(launch, Path("runs/x"), "x")[0]
    if expected is None:
        assert "--cpus-per-task" not in line
    else:
        assert f"--cpus-per-task={expected} " in line


@pytest.mark.parametrize("scontrol, srun, extra, message", [
    # the bug a first real run would hit: scontrol failing gave torchrun the unexpanded "$(scontrol ...)"
    ("echo 'slurm_load_ctl_conf error: Unable to contact slurm controller' >&2; exit 1", True, {},
     "scontrol show hostnames node.A-B.` failed: slurm_load_ctl_conf error: Unable to contact slurm controller$"),
    (None, True, {}, "scontrol is not on PATH"),
    ("exit 0", True, {}, "failed: exit code 0, no host names"),
    ("echo nodeA", False, {}, "srun is not on PATH"),
    ("echo nodeA", True, {"SLURM_JOB_NODELIST": ""}, "SLURM_JOB_NODELIST is not set"),
    ("echo nodeA", True, {"SLURM_STEP_ID": "0"}, "itself an srun task"),
])
def test_a_slurm_environment_the_harness_cannot_use_is_named(tmp_path, scontrol, srun, extra, message):
    environ = slurm_env(fake_slurm_bin(tmp_path, scontrol=scontrol, srun=srun), **extra)
    with pytest.raises(ValueError, match=message) as caught:
        choose_launch(tiny(nodes=2, gpus_per_node=1), environ=environ, rdzv_endpoint=None, node_rank=None)
    assert "\n" not in str(caught.value) and "$(" not in str(caught.value)


def test_bench_in_an_unusable_slurm_job_fails_before_making_a_run_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[A-B]")
    monkeypatch.setenv("PATH", fake_slurm_bin(tmp_path / "bin", scontrol="echo 'Invalid node name' >&2; exit 1")
                       + ":/usr/bin:/bin")
    code = main(["bench", "--preset", "tiny", "--nodes", "2", "--gpus-per-node", "1", "--runs-root", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Invalid node name" in err[0], err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("environ, message", [
    ({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1"}, "allocation has 1 node"),
    ({"MASTER_ADDR": "h0"}, "no node rank"),
    ({"MASTER_ADDR": "h0", "NODE_RANK": "2"}, "node rank 2 is outside 0..1"),
])
def test_inconsistent_environment_is_refused(environ, message):
    with pytest.raises(ValueError, match=message):
        choose_launch(tiny(nodes=2, gpus_per_node=1), environ=environ, rdzv_endpoint=None, node_rank=None)


def test_dry_run_mlperf_16x8_prints_the_launcher_and_a_plan_a_node(tmp_path, capsys):
    code = main(["bench", "--preset", "mlperf", "--nodes", "16", "--gpus-per-node", "8", "--dry-run",
                 "--runs-root", str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert code == 0
    assert "simulating 16 nodes" in out and "launcher on the target: inside a Slurm allocation of 16 nodes" in out
    assert "NODE_RANK=k" in out and "k = 0..15" in out
    node_rows = [ln for ln in out.splitlines() if re.match(r"\s+\d+(-\d+)?\s+8\s+\d", ln)]
    assert sum(len(range(int(a), int(b or a) + 1)) for a, b in
               (re.match(r"\s+(\d+)(?:-(\d+))?", ln).groups() for ln in node_rows)) == 16  # every node, once
    assert "h100 profile" in out and len(out.splitlines()) <= 40
    assert not (tmp_path / "runs").exists()


def test_dry_run_under_a_rendezvous_prints_this_hosts_torchrun(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "h0")
    monkeypatch.setenv("NODE_RANK", "3")
    assert main(["bench", "--preset", "tiny", "--nodes", "4", "--gpus-per-node", "1", "--dry-run", "--run-id", "r1",
                 "--runs-root", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "launcher: torchrun for this host, node 3 of 0..3" in out
    assert "--node-rank=3 --master-addr=h0" in " ".join(out.split(" \\\n      "))


def test_two_hosts_by_rendezvous_on_loopback(tmp_path):
    """The multi-host path for real: one `bench` per node, torchrun each, static rendezvous."""
    port, runs = free_port(), tmp_path / "runs"
    procs = [
        subprocess.Popen([sys.executable, "-m", "harness", "bench", "--preset", "tiny", "--nodes", "2",
                          "--gpus-per-node", "1", "--iters", "3", "--warmup", "1", "--rdzv-endpoint",
                          f"127.0.0.1:{port}", "--node-rank", str(k), "--run-id", "twohosts", "--runs-root", str(runs)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for k in (0, 1)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    manifest = RunManifest.from_json((runs / "twohosts" / "manifest.json").read_text())
    assert manifest.status.state == "completed" and manifest.launcher == "torchrun"
    its = pd.concat(pd.read_parquet(p) for p in (runs / "twohosts").glob("rank*/iterations-*.parquet"))
    assert sorted(set(zip(its["rank"], its["node"]))) == [(0, 0), (1, 1)]


def test_hung_rank_fails_the_job_within_the_timeout(tmp_path, capsys):
    start = time.monotonic()
    code = main(["bench", "--device", "cpu", "--preset", "tiny", "--iters", "6", "--warmup", "0", "--flush-every", "1",
                 "--stall-at", "1:2", "--collective-timeout", "5", "--runs-root", str(tmp_path / "runs")])
    elapsed = time.monotonic() - start
    assert code == 1
    (run_dir,) = (tmp_path / "runs").iterdir()
    manifest = RunManifest.from_json((run_dir / "manifest.json").read_text())
    assert manifest.status.state == "failed"
    assert manifest.status.error.startswith("rank 1: injected stall on rank 1 at iteration 2")
    assert elapsed < 120, f"took {elapsed:.0f} s to notice a 5 s timeout"
    its = pd.concat(pd.read_parquet(p) for p in run_dir.glob("rank*/iterations-*.parquet"))
    assert set(its.loc[its["rank"] == 0, "iteration"]) >= {0, 1}


def test_four_simulated_nodes(tmp_path, capsys):
    assert main(["bench", "--device", "cpu", "--preset", "tiny", "--nodes", "4", "--gpus-per-node", "1", "--iters", "2",
                 "--warmup", "1", "--runs-root", str(tmp_path / "runs")]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    st = pd.concat(pd.read_parquet(p) for p in run_dir.glob("rank*/stages-*.parquet"))
    assert sorted(set(zip(st["rank"], st["node"]))) == [(0, 0), (1, 1), (2, 2), (3, 3)]
