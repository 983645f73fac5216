"""`harness compare`: real runs of both engines, interleaved and linked; the report step injected."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import datetime

import pytest

pytest.importorskip("torchrec")

import harness.launch.bench  # noqa: E402
from harness.cli import build_parser, main  # noqa: E402
from harness.records.manifest import RunManifest  # noqa: E402
from harness.launch.options import config_from_args  # noqa: E402


@dataclass
class Result:
    ratio: float
    ratio_ci: tuple[float, float]


def test_runs_interleave_link_and_report(tmp_path, capsys):
    calls = []

    def report(*, groups, out_dir):
        calls.append((groups, out_dir))
        return Result(ratio=0.8125, ratio_ci=(0.75, 0.875))

    runs, reports = tmp_path / "runs", tmp_path / "reports"
    args = build_parser().parse_args([
        "compare", "--device", "cpu", "--preset", "tiny", "--iters", "2", "--warmup", "1", "--sharding", "table_wise",
        "--repeats", "2", "--gpus-per-node", "1", "--runs-root", str(runs), "--reports-root", str(reports),
        "--in-process"])
    code = harness.launch.bench.compare(config_from_args(args), harness.launch.bench.Invocation.from_args(args),
                               repeats=args.repeats, reports_root=args.reports_root, report=report)
    assert code == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "harness/torchrec iteration period: 0.812 (95% CI 0.750-0.875)"
    assert sum(line.startswith("[") for line in out) == 4  # a progress line a run

    (folder,) = (runs / "compares").iterdir()
    link = json.loads((folder / "compare.json").read_text())
    assert link["status"] == "completed" and link["ratio"] == 0.8125 and link["ratio_ci"] == [0.75, 0.875]
    manifests = [RunManifest.from_json((runs / r / "manifest.json").read_text()) for r in link["order"]]
    # A B A B, by what each run recorded, in the order the runs really started.
    assert [m.engine for m in manifests] == ["torchrec", "harness", "torchrec", "harness"]
    starts = [datetime.fromisoformat(m.start_time) for m in manifests]
    assert starts == sorted(starts)
    assert all(m.status.state == "completed" for m in manifests)
    assert manifests[0].timed_stages == ("dense_update",)
    assert manifests[1].timed_stages == ("input_dist", "emb_fwd", "dense_fwd_bwd", "emb_bwd", "dense_update")
    # The engines' configs differ in the engine alone, and in how hosts wait (stock TorchRec blocks).
    assert [m.config.optimizations.collective_wait for m in manifests] == ["block", "poll"] * 2
    for m in manifests:
        assert dataclasses.replace(m.config.run, engine="harness") == manifests[1].config.run
        assert m.config.replace(run=manifests[1].config.run,
                                optimizations=manifests[1].config.optimizations) == manifests[1].config

    ((groups, out_dir),) = calls
    assert out_dir == reports / f"compare-{folder.name}"
    for engine in ("torchrec", "harness"):
        assert groups[engine] == [runs / r for r in link["runs"][engine]]
        assert [RunManifest.from_json((d / "manifest.json").read_text()).engine for d in groups[engine]] == [engine] * 2


@pytest.mark.parametrize("command, args, message", [
    ("compare", ["--global-batch", "97"], "does not divide by the world size"),
    ("compare", ["--gpus-per-node", "2", "--in-process"], "--in-process runs one rank in this process"),
    ("ablation", ["--gpus-per-node", "2", "--in-process"], "--in-process runs one rank in this process"),
])
def test_a_config_that_cannot_run_stops_before_any_run(tmp_path, monkeypatch, capsys, command, args, message):
    def refuse(*a, **k):
        raise AssertionError("a run was started")

    monkeypatch.setattr(harness.launch.bench, "launch_run", refuse)
    code = main([command, "--preset", "tiny", *args, "--runs-root", str(tmp_path / "runs")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "runs").exists()


def test_torchrec_runs_stock_while_the_harness_keeps_its_flags():
    """TorchRec runs stock (no harness flags, fp32 tables and wire) at the same dense precision as
    the harness (issue 45: the comparison stays same-math)."""
    from harness.launch.compare import engine_configs
    from harness.config import OptimizationsConfig, PrecisionConfig
    from harness.presets import tiny

    cfg = tiny().replace(optimizations=OptimizationsConfig(skip_splits_a2a=True, threaded_input_dist=True),
                         precision=PrecisionConfig(dense="bf16", tf32=True, comm="bf16", tables="fp16"))
    cfgs = engine_configs(cfg)
    assert cfgs["harness"].precision == cfg.precision
    assert cfgs["torchrec"].precision == PrecisionConfig(dense="bf16", tf32=True)
    assert cfgs["harness"].optimizations == cfg.optimizations and cfgs["harness"].run.engine == "harness"
    stock = cfgs["torchrec"].optimizations
    assert stock.pipeline and not any(stock.requested().values())
    assert cfgs["torchrec"].replace(run=cfg.run, optimizations=cfg.optimizations, precision=cfg.precision) == cfg
