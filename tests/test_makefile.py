"""The Makefile rejects an invalid knob with one line listing the valid values, before installing anything."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CASES = {
    "PRESET=huge": "valid values: mlperf small tiny",
    "NODES=0": "NODES=0 is not valid; valid values: a positive integer",
    "NODES=-3": "NODES=-3 is not valid",
    "NODES=1.5": "NODES=1.5 is not valid",
    "GPUS_PER_NODE=0": "GPUS_PER_NODE=0 is not valid",
    "GPUS_PER_NODE=two": "GPUS_PER_NODE=two is not valid",
    "ITERS=0": "ITERS=0 is not valid",
    "WARMUP=-1": "WARMUP=-1 is not valid; valid values: an integer >= 0",
    "ENGINE=tensorflow": "ENGINE=tensorflow is not valid; valid values: harness torchrec",
    "ROWS=abc": "ROWS=abc is not valid; valid values: a positive integer",
    "DAYS=0": "DAYS=0 is not valid",
    "SEED=-2": "SEED=-2 is not valid; valid values: an integer >= 0",
}


@pytest.mark.parametrize("knob", sorted(CASES))
def test_invalid_knob_is_rejected(knob):
    out = subprocess.run(["make", "-s", "--no-print-directory", "check-bench-knobs", knob],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0
    assert CASES[knob] in out.stderr


def test_valid_knobs_pass():
    out = subprocess.run(["make", "-s", "check-bench-knobs", "PRESET=tiny", "NODES=16", "GPUS_PER_NODE=1",
                          "ENGINE=torchrec"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("workers", ["two", "-1", ""])
def test_make_test_refuses_a_worker_count_that_is_not_one(workers):
    """Refused in one line before the suite (or any install) starts: make answers at once."""
    out = subprocess.run(["make", "-s", "--no-print-directory", "test", f"TEST_WORKERS={workers}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and out.stdout == ""
    assert out.stderr.splitlines() == [f"make: TEST_WORKERS={workers} is not valid; valid values: an integer >= 0"]


def test_dataset_needs_an_out_folder():
    out = subprocess.run(["make", "-s", "--no-print-directory", "dataset"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0 and "make dataset: give OUT=<folder to write>" in out.stderr


def test_mlperf_needs_a_data_folder():
    out = subprocess.run(["make", "-s", "--no-print-directory", "mlperf"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0 and "make mlperf: give DATA=" in out.stderr


def test_valid_values_come_from_the_names_module():
    from harness.names import PRESET_NAMES, SHARDING_KINDS

    out = subprocess.run(["make", "-s", "--no-print-directory", "check-bench-knobs", "SHARDING=diagonal"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0 and f"valid values: {' '.join(SHARDING_KINDS)}" in out.stderr
    assert f"PRESET={'|'.join(PRESET_NAMES)}" in subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True,
                                                               text=True).stdout


def test_make_help_lists_every_target_the_docs_list_and_the_hardware_knob_takes_the_profiles():
    """make help and docs/targets-and-knobs.md's list, read independently, name the same targets
    (make project, issue 46's command, was in neither list once); HARDWARE's valid values are the
    planner's profiles."""
    import re

    from harness.names import HARDWARE_PROFILES

    help_out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True).stdout
    doc = (ROOT / "docs" / "targets-and-knobs.md").read_text().split("## The targets", 1)[1].split("```")[1]
    in_help = set(re.findall(r"^make ([a-z-]+)", help_out, re.M))
    in_doc = set(re.findall(r"^make ([a-z-]+)", doc, re.M))
    assert in_doc - {"help"} == in_help and "project" in in_help
    out = subprocess.run(["make", "-s", "--no-print-directory", "project", "HARDWARE=a100"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode != 0 and f"valid values: {' '.join(HARDWARE_PROFILES)}" in out.stderr


def test_only_the_knobs_set_are_passed():
    out = subprocess.run(["make", "-n", "--no-print-directory", "bench", "PRESET=tiny", "ITERS=4"],
                         cwd=ROOT, capture_output=True, text=True)
    (line,) = [x for x in out.stdout.splitlines() if "-m harness bench" in x]
    assert "--preset tiny" in line and "--iters 4" in line
    for unset in ("--nodes", "--gpus-per-node", "--warmup", "--sharding"):
        assert unset not in line  # left to the preset, not repeated in the Makefile


def test_the_targets_that_plan_with_torchrec_fix_the_hash_seed():
    """TorchRec's planner breaks ties by set order: make project and make plan-compare run with
    PYTHONHASHSEED=0, so TorchRec's plan beside this planner's is the same from one run to the next
    (on mlperf at 16 x 8 it was grid_shard or table_row_wise by the process)."""
    for target, runs in (("project", "-m harness.tools.project"), ("plan-compare", "-m harness.tools.plan_compare")):
        out = subprocess.run(["make", "-n", "--no-print-directory", target], cwd=ROOT, capture_output=True, text=True)
        (line,) = [x for x in out.stdout.splitlines() if runs in x]
        assert line.startswith("PYTHONHASHSEED=0 "), line


def test_a_venv_of_the_other_variant_is_refused_before_any_install(tmp_path):
    """pip would keep a CUDA venv's torch under the CPU pair (and the other way round): make says so
    in one line instead of installing over it. Here (no driver) the machine wants the CPU pair."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed-requirements-cuda").touch()
    out = subprocess.run(["make", "-s", "--no-print-directory", "venv", f"VENV={venv}", "HAS_CUDA="],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[0] == (f"make: {venv} holds the cuda variant, this machine needs the cpu "
                                                  "variant: run make clean-venv first")
    assert not (venv / ".installed-requirements-cpu").exists() and list((venv / "bin").iterdir()) == []


def test_make_test_cluster_says_in_one_line_why_it_cannot_run_without_root():
    """Where test hosts cannot be made (not root), make test-cluster prints one line and succeeds;
    the reason comes from making a namespace, so it names what is missing."""
    import os
    import shutil

    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser, to run make as an unprivileged user")
    out = subprocess.run(["runuser", "-u", "nobody", "--", "make", "-s", "--no-print-directory", "test-cluster"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert out.returncode == 0 and lines == ["make test-cluster: skipped, test hosts need root (network namespaces "
                                             "and links); this is uid 65534"], lines


def test_unavailable_reason_names_a_failed_namespace(monkeypatch):
    """As root without the right to make namespaces (a container without CAP_SYS_ADMIN), the reason
    is the `ip` error itself."""
    import tests.cluster.testhosts as th

    monkeypatch.setattr(th.os, "geteuid", lambda: 0)
    monkeypatch.setattr(th.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(th, "_ip", lambda *a, check=True: subprocess.CompletedProcess(
        ["ip", *a], 1, "", "mount --make-shared /run/netns failed: Operation not permitted"))
    assert th.unavailable_reason() == ("cannot create a network namespace: mount --make-shared /run/netns failed: "
                                       "Operation not permitted")


def test_a_host_interpreter_installs_nothing_and_checks_its_packages(tmp_path):
    """make ... PY=<interpreter> (a GPU node's container python, no package index): no .venv is
    made or required; the interpreter's own torch and fbgemm are checked first, then the target
    runs with it (dry run: make -n)."""
    for target, runs in (("gpu-check", "-m harness.tools.gpu_check"), ("gpu-bench", "-m harness.tools.gpu_bench"),
                         ("bench", "-m harness bench")):
        out = subprocess.run(["make", "-n", "--no-print-directory", target, "PY=/opt/host/python3"],
                             cwd=ROOT, capture_output=True, text=True)
        lines = out.stdout.splitlines()
        assert out.returncode == 0, out.stderr
        check = [i for i, line in enumerate(lines) if line.startswith("/opt/host/python3 -m harness.tools.check_install --host")]
        run = [i for i, line in enumerate(lines) if line.startswith(f"/opt/host/python3 {runs}")]
        assert check and run and check[0] < run[0], lines
        assert not any(".venv" in line or "pip install" in line for line in lines), lines
