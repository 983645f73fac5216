"""The bench options are generated from the config dataclasses: every field has one, with its
docstring as help; a value the user gave reaches the config (and its checks) unchanged; one
left out is the preset's. The ablation derives its configs from the user's with cfg.replace."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from harness.launch.ablation import run_ablation
from harness.cli import build_parser, main
from harness.config import (
    BenchConfig, DataConfig, DynamicConfig, EvalConfig, ModelConfig, OptimizationsConfig, OptimizerConfig, PrecisionConfig, RunConfig, ShardingConfig, option,
)
from harness.names import DENSE_PRECISIONS, OPTIMIZATION_FLAGS
from harness.run.optimizations import resolve
from harness.launch.options import add_config_options, config_from_args
from harness.launch.planning import topology
from harness.presets import mlperf, small, tiny

CONCERNS = {"model": ModelConfig, "optimizer": OptimizerConfig, "data": DataConfig, "sharding": ShardingConfig,
            "optimizations": OptimizationsConfig, "precision": PrecisionConfig, "run": RunConfig,
            "evaluation": EvalConfig, "dynamic": DynamicConfig}


def bench_parser():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices["bench"]


def parse(*argv: str) -> BenchConfig:
    return config_from_args(build_parser().parse_args(["bench", *argv]))


def test_every_config_field_is_an_option_with_its_docstring_as_help():
    assert {f.name for f in dataclasses.fields(BenchConfig)} == set(CONCERNS)
    actions = {a.dest: a for a in bench_parser()._actions}
    for concern, cls in CONCERNS.items():
        for f in dataclasses.fields(cls):
            if f.name == "preset":  # --preset is hand-written: it picks the config, it is not a field of it
                continue
            a = actions.get(f"{concern}.{f.name}")
            assert a is not None, f"{concern}.{f.name} has no option"
            assert a.default is None, f"{concern}.{f.name}: an option's default is the preset's"
            assert a.help and len(a.help) > len(" [small: not set]") + 10, (concern, f.name)
            assert a.help.endswith("]") and "[small: " in a.help, (concern, f.name)  # the preset's value
    # A few helps checked against the docstrings written in config.py.
    assert actions["sharding.memory_gbps"].help.startswith("Memory bandwidth a rank gets (GB/s); left out: the profile's.")
    assert actions["run.warmup_iters"].option_strings == ["--warmup"]
    assert actions["data.global_batch_size"].option_strings == ["--global-batch"]
    assert actions["dynamic.slots"].option_strings == ["--dynamic-slots"]
    assert actions["dynamic.ps"].option_strings == ["--ps"]


def test_todays_option_names_still_parse():
    cfg = parse("--preset", "tiny", "--iters", "5", "--warmup", "1", "--global-batch", "48", "--seed", "3",
                "--id-exponent", "0", "--device", "cpu", "--no-timeline", "--flush-every", "2",
                "--collective-timeout", "9", "--fail-at", "1:2", "--stall-at", "0:3", "--ragged-every", "4",
                "--sharding", "row_wise", "--shard", "0=table_wise,5=data_parallel", "--column-shards", "4",
                "--hardware", "h100", "--memory-gib", "2", "--no-pipeline", "--opts", "all",
                "--no-threaded-input-dist", "--no-cuda-graphs")
    assert cfg.run == RunConfig(preset="tiny", iters=5, warmup_iters=1, device="cpu", timeline=False, flush_every=2,
                                collective_timeout_s=9.0, fail_at=(1, 2), stall_at=(0, 3))
    assert cfg.data == DataConfig(global_batch_size=48, seed=3, id_exponent=0.0, ragged_every=4)
    assert cfg.sharding == ShardingConfig(kind="row_wise", per_table=((0, "table_wise"), (5, "data_parallel")),
                                          column_shards=4, hardware="h100", memory_gib=2.0)
    assert cfg.optimizations == OptimizationsConfig(pipeline=False, pinned_d2h=True, avoid_record_streams=True,
                                                    skip_splits_a2a=True)


def test_options_left_out_are_the_presets():
    assert parse("--preset", "mlperf") == mlperf()  # h100 profile, batch 65536: not argparse's
    assert parse() == small()
    assert parse("--preset", "tiny", "--nodes", "2") == tiny(nodes=2)


def test_user_given_zero_reaches_the_config_check(capsys):
    assert main(["bench", "--preset", "tiny", "--column-shards", "0", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sharding.column_shards must be a positive integer, got 0" in err
    assert main(["bench", "--preset", "tiny", "--memory-gib", "0", "--dry-run"]) == 2
    assert "sharding.memory_gib must be > 0, got 0.0" in capsys.readouterr().err
    assert parse("--preset", "tiny", "--id-exponent", "0").data.id_exponent == 0.0


def test_bandwidth_options_reach_the_config_and_the_planner():
    cfg = parse("--preset", "tiny", "--memory-gbps", "7", "--intra-node-gbps", "3", "--inter-node-gbps", "0.5")
    assert (cfg.sharding.memory_gbps, cfg.sharding.intra_node_gbps, cfg.sharding.inter_node_gbps) == (7.0, 3.0, 0.5)
    topo = topology(cfg, ranks_per_host=2)
    assert (topo.memory_bw, topo.intra_node_bw, topo.inter_node_bw) == (7e9, 3e9, 0.5e9)


@pytest.mark.parametrize("argv, message", [
    (["--fail-at", "1"], "expected RANK:ITER, got '1'"),
    (["--shard", "0:row_wise"], "expected T=KIND"),
    (["--iters", "x"], "invalid int value: 'x'"),
    (["--sharding", "diagonal"], "invalid choice: 'diagonal'"),
])
def test_malformed_values_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(["bench", *argv])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_ablation_derives_every_config_from_the_users_with_replace(tmp_path):
    user = parse("--preset", "tiny", "--iters", "3", "--ragged-every", "3", "--sharding", "table_wise", "--seed", "5")
    seen = []

    def fake_bench(cfg, run_id):
        seen.append(cfg)
        return 0

    # Resolved as on 8 GPUs under a torch that still needs avoid_record_streams: every flag takes
    # effect, so every config runs (on a CPU, those alike share runs: tests/test_flags.py).
    run_ablation(user, repeats=1, runs_root=tmp_path, bench=fake_bench,
                 check=lambda c: resolve(c.optimizations, cuda=True, plan_kinds=["table_wise"], torch_version="2.7.0",
                                         world_size=8))
    assert len(seen) == 12
    for cfg in seen:  # only the optimization flags differ from what the user asked for
        assert cfg == user.replace(optimizations=OptimizationsConfig(**cfg.optimizations.requested()))
    assert seen[0].optimizations.requested() == {f: False for f in OPTIMIZATION_FLAGS}
    assert seen[6].optimizations.requested() == {f: True for f in OPTIMIZATION_FLAGS}


def test_ablation_refuses_a_config_that_fails_its_checks(tmp_path, capsys):
    # ragged_every=1 with skip_splits_a2a (in "all") has no fixed-hotness batch: stop before any run.
    assert main(["ablation", "--preset", "tiny", "--ragged-every", "1", "--runs-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "ablation config +skip_splits_a2a: skip_splits_a2a needs fixed hotness" in err and err.count("\n") == 1
    assert not (tmp_path / "ablations").exists()


@dataclasses.dataclass(kw_only=True, frozen=True)
class _Precision:
    """A concern another change adds: it must become options with no edit to the generator."""

    dense: str = option("fp32", option="dense-precision", choices=DENSE_PRECISIONS)
    """Arithmetic of the dense arch: fp32, or bf16 mixed precision."""
    loss_scale: float | None = None
    """Static loss scale; None: none."""


@dataclasses.dataclass(kw_only=True, frozen=True)
class _Root:
    """A config with one more concern than BenchConfig."""

    run: RunConfig
    """Launch and measurement."""
    precision: _Precision = dataclasses.field(default_factory=_Precision)
    """Numerics."""


def test_a_new_documented_field_becomes_an_option_with_no_edit():
    parser = argparse.ArgumentParser()
    add_config_options(parser, root=_Root)
    actions = {a.dest: a for a in parser._actions}
    assert actions["precision.dense"].option_strings == ["--dense-precision"]
    assert actions["precision.dense"].choices == DENSE_PRECISIONS
    assert actions["precision.loss_scale"].help.startswith("Static loss scale; None: none.")
    ns = parser.parse_args(["--dense-precision", "bf16", "--loss-scale", "128", "--iters", "2"])
    assert (getattr(ns, "precision.dense"), getattr(ns, "precision.loss_scale"), getattr(ns, "run.iters")) == ("bf16", 128.0, 2)
    assert getattr(ns, "run.nodes") is None  # not given: the preset's
