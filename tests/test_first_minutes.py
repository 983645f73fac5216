"""Issue 48, the first ten minutes: one-line refusals, --help with the preset's values, a dry run
that fits a screen, 100 columns everywhere, the preset table. Widths are measured on real outputs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.launch.planning import host_memory_share_gib

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 100
DRY_16X8 = ["bench", "--preset", "mlperf", "--nodes", "16", "--gpus-per-node", "8", "--dry-run"]


def _outside_make(environ) -> dict:
    """The environment as a user's shell has it: under `make test` the inner make would otherwise
    inherit MAKELEVEL and MAKEFLAGS and print its "Entering directory" lines."""
    return {k: v for k, v in environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")}


def run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**_outside_make(os.environ), "COLUMNS": "250", **(env or {})})


def harness(*argv: str) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "harness", *argv)


def too_wide(text: str) -> list[str]:
    return [line for line in text.splitlines() if len(line) > WIDTH]


# 1. Refusals: one line and nothing else.

@pytest.mark.parametrize("knobs, line", [
    (["PRESET=huge"], "make: PRESET=huge is not valid; valid values: mlperf small tiny mlperf-ids"),
    (["NODES=0"], "make: NODES=0 is not valid; valid values: a positive integer (1, 2, 3, ...)"),
    (["PRESET=tiny", "DRY_RUN=yes"], "make: DRY_RUN=yes is not valid; valid values: 0 1"),
])
def test_a_make_refusal_is_its_one_line_without_makes_trailer(knobs, line):
    out = run("make", "bench", *knobs)
    assert out.returncode != 0
    assert (out.stdout + out.stderr).splitlines() == [line]  # no "make: *** [Makefile:..] Error 2"


def test_make_dataset_without_out_is_one_line():
    out = run("make", "dataset")
    assert out.returncode != 0 and (out.stdout + out.stderr).splitlines() == ["make dataset: give OUT=<folder to write>"]


def test_mlperf_on_this_host_is_refused_with_one_fix_and_no_contradiction(tmp_path, capsys):
    if host_memory_share_gib(8) >= 20:
        pytest.skip("this host holds a 40M-row table on a rank: mlperf would start")
    code = main(["bench", "--preset", "mlperf", "--gpus-per-node", "8", "--runs-root", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "runs").exists()
    assert " GiB a rank, " in err and err.rstrip().endswith(" GiB here: use --dry-run, or preset small")
    assert "allow row_wise" not in err and "add ranks" not in err and len(err.rstrip()) <= 100


# 2. --help: the preset's values, units, every choice; prefixes refused with the nearest names.

def test_help_shows_each_options_value_under_the_chosen_preset_in_100_columns():
    small, mlperf = harness("bench", "--help"), harness("bench", "--preset", "mlperf", "--help")
    assert small.returncode == 0 and mlperf.returncode == 0
    assert too_wide(small.stdout) == [] and too_wide(mlperf.stdout) == []
    assert "[default: the preset's]" not in small.stdout
    assert re.search(r"--global-batch N\s+Samples per iteration.*\[small: 4096\]", small.stdout, re.S)
    assert "[mlperf: 65536]" in mlperf.stdout and "[mlperf: h100]" in mlperf.stdout
    for leak in ("DEFAULT_DYNAMIC_SLOTS", "None:"):
        assert leak not in small.stdout


def test_help_lists_every_choice_and_the_unit_of_every_time_and_size():
    from harness.cli import build_parser

    bench = next(a for a in build_parser()._actions if a.dest == "command").choices["bench"]
    for a in bench._actions:
        if a.choices and a.dest != "help":
            assert all(str(c) in a.help for c in a.choices), (a.dest, a.help)
    metavars = {a.option_strings[0]: a.metavar for a in bench._actions if a.option_strings}
    assert metavars["--collective-timeout"] == "SECONDS"
    for size in ("--memory-gib", "--ps-memory-gib", "--ps-spill-gib", "--dynamic-memory-gib"):
        assert metavars[size] == "GIB", size
    for rate in ("--memory-gbps", "--intra-node-gbps", "--inter-node-gbps"):
        assert metavars[rate] == "GB/S", rate


@pytest.mark.parametrize("given, nearest", [
    ("--cuda-graph", "--cuda-graphs"), ("--pinned", "--pinned-d2h"), ("--cuda-graphz", "--cuda-graphs"),
])
def test_an_abbreviated_or_misspelt_option_is_refused_with_the_nearest_names(given, nearest, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["bench", "--preset", "tiny", given, "--dry-run"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert f"unknown option {given}; nearest: {nearest}" in err


# 3. The dry run: a screen at any size.

def test_the_16x8_dry_run_fits_a_screen_names_its_launcher_and_no_path_that_will_not_exist(tmp_path):
    out = harness(*DRY_16X8, "--runs-root", str(tmp_path / "runs"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) <= 40 and too_wide(out.stdout) == []
    assert "launcher on the target: inside a Slurm allocation of 16 nodes" in out.stdout
    assert str(tmp_path) not in out.stdout and "runs/" not in out.stdout and not (tmp_path / "runs").exists()
    assert re.search(r"^\s+0-3\s+8\s+[\d.]+\s+[\d.]+\s.*GRID", out.stdout, re.M)  # a row a node (nodes alike share)


def test_the_per_rank_table_comes_only_on_request(tmp_path):
    detail = tmp_path / "plan.txt"
    out = harness(*DRY_16X8, "--plan-detail", str(detail))
    assert out.returncode == 0 and len(out.stdout.splitlines()) <= 40
    assert f"per-rank table (128 ranks): written to {detail}" in out.stdout
    rows = [ln for ln in detail.read_text().splitlines() if re.match(r"\s+\d+\s+\d+\s+[\d.]+", ln)]
    assert len(rows) == 128 and too_wide(detail.read_text()) == []
    printed = harness(*DRY_16X8, "--plan-detail")
    assert printed.returncode == 0 and too_wide(printed.stdout) == []
    assert sum(bool(re.match(r"\s+\d+\s+\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+", ln)) for ln in printed.stdout.splitlines()) >= 128


# 4. 100 columns: plan-compare and perf-dynamic, measured.

@pytest.mark.filterwarnings("ignore")
def test_plan_compare_fits_100_columns(capsys):
    from harness.tools.plan_compare import main as plan_compare

    assert plan_compare(["--layouts", "2x8"]) == 0
    out = capsys.readouterr().out
    assert "harness plan" in out and too_wide(out) == []


def test_perf_dynamics_measurements_are_small_tables_in_100_columns(capsys):
    from harness.tools.perf_dynamic import hit_rates, throughput

    rows = throughput(4096, 1024, 4, seed=0, repeats=2)
    hit_rates([1 << 13, 1 << 15, 1 << 17, 1 << 19, 1 << 21], batch=256, batches=8, universe=100_000, alpha=1.05, seed=1)
    out = capsys.readouterr().out
    assert len(rows) == 12 and too_wide(out) == []
    assert sum(bool(re.match(r"\s+[12]\s+\d+%\s+(consecutive|random)\s", ln)) for ln in out.splitlines()) == 24


def test_make_help_fits_100_columns_and_names_clean_venv():
    out = run("make", "-s", "help")
    assert out.returncode == 0 and too_wide(out.stdout) == []
    assert "make clean-venv" in out.stdout


# 5. The preset table, in make help and in the docs.

def test_the_preset_table_is_in_make_help_and_the_docs():
    from harness.launch.options import preset_table

    table = preset_table()
    assert table.splitlines()[0].split()[:5] == ["PRESET", "batch", "ranks", "iters", "warm-up"]
    assert [ln.split()[0] for ln in table.splitlines()[1:]] == ["mlperf", "small", "tiny", "mlperf-ids"]
    assert table in run("make", "-s", "help").stdout
    assert table in (ROOT / "docs" / "targets-and-knobs.md").read_text()
