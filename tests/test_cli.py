"""The command line end to end: bad input stops early; a run leaves a complete folder; a fault fails it cleanly."""

from __future__ import annotations


import pandas as pd
import pytest

import harness.launch.bench
from harness.cli import main
from harness.report.api import load_run
from harness.records.manifest import RunManifest, RunStatus
from harness.names import STAGES
from tests.report_builders import manifest_for


@pytest.fixture
def no_launch(monkeypatch):
    """Any attempt to start ranks fails the test: bad input must stop before that."""

    def refuse(*a, **k):
        raise AssertionError("a process was launched for bad input")

    monkeypatch.setattr(harness.launch.bench, "launch_run", refuse)


BAD_BENCH = {
    "unknown preset": (["--preset", "huge"], "invalid choice: 'huge'"),
    "zero nodes": (["--nodes", "0"], "run.nodes must be a positive integer"),
    "negative nodes": (["--nodes", "-2"], "run.nodes must be a positive integer"),
    "non-integer nodes": (["--nodes", "1.5"], "invalid int value: '1.5'"),
    "zero gpus": (["--gpus-per-node", "0"], "run.gpus_per_node must be a positive integer"),
    "negative gpus": (["--gpus-per-node", "-1"], "run.gpus_per_node must be a positive integer"),
    "non-integer gpus": (["--gpus-per-node", "two"], "invalid int value: 'two'"),
    "batch not divisible": (["--preset", "tiny", "--gpus-per-node", "5"], "does not divide by the world size 5"),
    "unknown flag": (["--warp-speed"], "unknown option --warp-speed; nearest: --seed, --warmup"),
    "cuda without cuda": (["--device", "cuda"], "no usable CUDA device"),
    "unknown sharding": (["--sharding", "diagonal"], "invalid choice: 'diagonal'"),
    "unknown engine": (["--engine", "tensorflow"], "invalid choice: 'tensorflow'"),
    "torchrec without pipeline": (["--preset", "tiny", "--engine", "torchrec", "--no-pipeline"],
                                  "always trains through TrainPipelineSparseDist"),
    "column-wise dim": (["--preset", "tiny", "--gpus-per-node", "3", "--sharding", "column_wise", "--embedding-dim", "6",
                         "--bottom-mlp", "32,6"], "column_wise needs 2..4 blocks"),
    "table fits nowhere": (["--preset", "mlperf", "--sharding", "table_wise", "--memory-gib", "1"], "fits on no rank"),
    "bad per-table": (["--shard", "99=row_wise"], "names table 99"),
    "rendezvous without node rank": (["--rdzv-endpoint", "127.0.0.1:1"], "no node rank"),
    "rendezvous without run id": (["--rdzv-endpoint", "127.0.0.1:1", "--node-rank", "0"], "same --run-id"),
    "store without a dynamic table": (["--ps", "redis://127.0.0.1:6379"], "no table is dynamic"),
    "store not redis": (["--shard", "2=dynamic", "--ps", "http://x:1"], "give redis://host:port[/db]"),
    "no dynamic slots": (["--shard", "2=dynamic", "--dynamic-slots", "0"], "dynamic.slots must be a positive integer"),
    "dynamic slots two ways": (["--shard", "2=dynamic", "--dynamic-slots", "9", "--dynamic-memory-gib", "1"],
                               "give --dynamic-slots or --dynamic-memory-gib, not both"),
    "dynamic budget, no dynamic table": (["--dynamic-memory-gib", "1"], "has nothing to size: no table is dynamic"),
    "dynamic budget too small": (["--preset", "tiny", "--shard", "0=dynamic,20=dynamic", "--dynamic-memory-gib", "1e-7"],
                                 "table 0: its share of the dynamic memory budget, 3 bytes, holds no slot of 128 bytes"),
    "dynamic row-wise, a rank with no row": (["--preset", "tiny", "--gpus-per-node", "4", "--shard", "5=dynamic_row_wise"],
                                             "table 5: dynamic_row_wise needs a row a rank; it has 3 rows for 4 ranks"),
    "unknown dynamic policy": (["--shard", "2=dynamic", "--dynamic-policy", "fifo"], "invalid choice: 'fifo'"),
    "dynamic on torchrec": (["--preset", "tiny", "--shard", "2=dynamic", "--engine", "torchrec"],
                            "dynamic tables run on the harness engine only"),
}


def exit_code(argv: list[str]) -> int:
    """main's return value, or the status argparse exits with."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize("case", sorted(BAD_BENCH))
def test_bad_bench_input_is_one_line_and_leaves_nothing(case, tmp_path, capsys, no_launch):
    if case == "cuda without cuda":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    args, message = BAD_BENCH[case]
    code = exit_code(["bench", "--device", "cpu", "--runs-root", str(tmp_path / "runs"), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "runs").exists()


def test_help_and_a_refused_line_load_neither_torch_nor_pandas():
    """--help, an unknown option and a config value refused answer before torch's, fbgemm's and
    pandas' seconds of imports (harness/cli.py imports the parser alone): a fresh interpreter,
    asked what it loaded."""
    import subprocess
    import sys

    code = ("import sys\nfrom harness.cli import main\n"
            "for argv in (['--help'], ['bench', '--itres', '3'], ['bench', '--preset', 'tiny', '--nodes', '0']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print([m for m in ('torch', 'fbgemm_gpu', 'pandas', 'numpy') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "run.nodes must be a positive integer" in out.stderr and "nearest: --iters" in out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_report_of_unknown_run_lists_existing(tmp_path, capsys):
    runs = tmp_path / "runs"
    (runs / "20260101-000000-tiny-1x2-aaaa").mkdir(parents=True)
    (runs / "20260101-000000-tiny-1x2-aaaa" / "manifest.json").write_text(
        manifest_for("20260101-000000-tiny-1x2-aaaa", world_size=2, start_time="2026-01-01T00:00:00+00:00").to_json()
    )
    code = exit_code(["report", "--run", "nope", "--runs-root", str(runs), "--reports-root", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "nope" in err and "20260101-000000-tiny-1x2-aaaa" in err
    assert not (tmp_path / "rep").exists()


def read_parts(run_dir, kind):
    return pd.concat(pd.read_parquet(p) for p in sorted(run_dir.glob(f"rank*/{kind}-*.parquet")))


def only_run(runs):
    (run_dir,) = list(runs.iterdir())
    return run_dir


def test_bench_tiny_two_simulated_nodes_end_to_end(tmp_path, capsys):
    runs = tmp_path / "runs"
    code = main(["bench", "--device", "cpu", "--preset", "tiny", "--nodes", "2", "--gpus-per-node", "1", "--iters", "4",
                 "--warmup", "2", "--flush-every", "3", "--runs-root", str(runs)])
    out = capsys.readouterr().out
    assert code == 0
    run_dir = only_run(runs)
    manifest = RunManifest.from_json((run_dir / "manifest.json").read_text())
    assert manifest.status == RunStatus(state="completed", error=None) and manifest.end_time
    assert manifest.world_size == 2 and manifest.nodes == 2
    assert manifest.config.data.global_batch_size == 96
    import fbgemm_gpu
    import torch

    assert manifest.versions.torch == torch.__version__ and manifest.versions.python
    assert manifest.versions.fbgemm_gpu == fbgemm_gpu.__version__  # read from its metadata by the launcher
    assert manifest.git.commit and manifest.hosts
    assert [r.rank for r in manifest.ranks] == [0, 1] and all(r.peak_rss_gib > 0 for r in manifest.ranks)
    assert len(manifest.plan) == 26 and manifest.optimizations.pipeline

    stages = read_parts(run_dir, "stages")
    iters = read_parts(run_dir, "iterations")
    # 6 iterations flushed every 3: two parts a rank, compacted into one as the run completed.
    assert [p.name for p in run_dir.glob("rank00000/stages-*.parquet")] == ["stages-all.parquet"]
    assert len(stages) == 2 * 6 * len(STAGES)
    assert set(stages["stage"]) == set(STAGES)
    assert dict(zip(stages["rank"], stages["node"])) == {0: 0, 1: 1}  # simulated node per rank
    assert (stages["end_ns"] >= stages["start_ns"]).all()
    assert stages.groupby("iteration")["warmup"].first().tolist() == [True, True, False, False, False, False]
    # Stages run in order and end inside their iteration. Pipelined (the default), batch i's
    # input_dist is launched during iteration i-1: its span starts before iteration i does.
    launched_early = 0
    for (rank, it), g in stages.groupby(["rank", "iteration"]):
        g = g.set_index("stage").loc[list(STAGES)]
        assert (g["start_ns"].values[1:] >= g["end_ns"].values[:-1]).all()
        bounds = iters[(iters["rank"] == rank) & (iters["iteration"] == it)].iloc[0]
        assert g["start_ns"].iloc[1:].min() >= bounds["start_ns"] and g["end_ns"].max() <= bounds["end_ns"]
        if it > 0:
            before = iters[(iters["rank"] == rank) & (iters["iteration"] == it - 1)].iloc[0]
            assert before["start_ns"] < g.loc["input_dist", "start_ns"] < before["end_ns"]
            launched_early += 1
    assert launched_early == 2 * 5
    assert len(iters) == 12 and iters["loss"].notna().all() and (iters["samples"] == 48).all()
    for stage in STAGES:
        assert stage in out
    assert "samples_per_s" in out

    # make report reproduces the table from the folder alone.
    code = main(["report", "--run", "latest", "--runs-root", str(runs), "--reports-root", str(tmp_path / "rep")])
    assert code == 0
    csv = pd.read_csv(tmp_path / "rep" / run_dir.name / "stages.csv")
    timed = stages[~stages["warmup"]]
    for stage in STAGES:
        row = csv[csv["stage"] == stage].iloc[0]
        # input_dist's row is its exposed part; the whole span (launch to wait) is its own column.
        recorded = row["span_ms"] if stage == "input_dist" else row["mean_ms"]
        assert recorded == pytest.approx(timed.loc[timed["stage"] == stage, "duration_ms"].mean())
    assert (tmp_path / "rep" / run_dir.name / "report.md").exists()


def test_plain_loop_keeps_every_stage_inside_its_iteration(tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["bench", "--device", "cpu", "--preset", "tiny", "--iters", "3", "--warmup", "1", "--no-pipeline",
                 "--gpus-per-node", "1", "--in-process", "--runs-root", str(runs)]) == 0
    run = load_run(only_run(runs))
    merged = run.stages.merge(run.iterations[["rank", "iteration", "start_ns", "end_ns"]],
                              on=["rank", "iteration"], suffixes=("", "_it"))
    assert len(merged) == 4 * len(STAGES)
    assert ((merged["start_ns"] >= merged["start_ns_it"]) & (merged["end_ns"] <= merged["end_ns_it"])).all()


def test_no_timeline_records_iterations_only(tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["bench", "--device", "cpu", "--preset", "tiny", "--iters", "3", "--warmup", "1", "--no-timeline",
                 "--gpus-per-node", "1", "--in-process", "--runs-root", str(runs)]) == 0
    run = load_run(only_run(runs))
    assert run.stages.empty and len(run.iterations) == 4
    assert "stages not timed" in capsys.readouterr().out


def test_injected_fault_fails_run_and_keeps_records(tmp_path, capsys):
    runs = tmp_path / "runs"
    code = main(["bench", "--device", "cpu", "--preset", "tiny", "--iters", "6", "--warmup", "0", "--flush-every", "1",
                 "--fail-at", "1:3", "--collective-timeout", "30", "--runs-root", str(runs)])
    err = capsys.readouterr().err
    assert code == 1
    run_dir = only_run(runs)
    manifest = RunManifest.from_json((run_dir / "manifest.json").read_text())
    assert manifest.status.state == "failed"
    assert "rank 1: harness.run.faults.InjectedFault: injected fault on rank 1 at iteration 3" in manifest.status.error
    assert "failed" in err and str(run_dir) in err
    iters = read_parts(run_dir, "iterations")
    for rank in (0, 1):  # iterations before the fault were flushed and stay readable
        assert set(iters.loc[iters["rank"] == rank, "iteration"]) >= {0, 1, 2}
    assert 3 not in set(iters.loc[iters["rank"] == 1, "iteration"])


def test_cuda_layout_refused_before_launch():
    """More ranks than GPUs, or a shard dim fbgemm's CUDA kernels reject: one line, nothing started."""
    from harness.run.device import check_gpus_per_host, check_shard_dims
    from model.sharding import Shard, TablePlan

    plan = [TablePlan("table_wise", (Shard(0, 0, 10, 0, 16),)),
            TablePlan("column_wise", (Shard(0, 0, 10, 0, 6), Shard(1, 0, 10, 6, 12)))]
    with pytest.raises(ValueError, match="2 ranks on this host need a GPU each and it has 1"):
        check_gpus_per_host(ranks_per_host=2, device_count=1)
    with pytest.raises(ValueError, match=r"multiples of 4; this plan has \[6\]"):
        check_shard_dims(plan)
    check_gpus_per_host(ranks_per_host=8, device_count=8)  # fits: no error
    check_shard_dims(plan[:1])


def test_more_ranks_than_gpus_is_refused_by_the_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(harness.launch.bench, "uses_cuda", lambda requested: True)  # a 1-GPU host, seen from a CPU one
    monkeypatch.setattr(harness.launch.bench, "cuda_device_count", lambda: 1)
    runs = tmp_path / "runs"
    assert main(["bench", "--preset", "tiny", "--iters", "1", "--runs-root", str(runs)]) == 2
    assert "2 ranks on this host need a GPU each and it has 1" in capsys.readouterr().err
    assert not runs.exists()
    # A dry run may plan a bigger job than this host could run: it is not refused.
    assert main(["bench", "--preset", "tiny", "--nodes", "2", "--dry-run", "--runs-root", str(runs)]) == 0
    # A compare or an ablation refuses it before its first run, in one line.
    for command in ("compare", "ablation"):
        assert main([command, "--preset", "tiny", "--iters", "1", "--repeats", "1", "--runs-root", str(runs)]) == 2
        err = capsys.readouterr().err
        assert "2 ranks on this host need a GPU each and it has 1" in err and len(err.strip().splitlines()) == 1
        assert not runs.exists()
