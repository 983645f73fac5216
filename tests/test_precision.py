"""--dense-precision: the config field, the command line, the manifest's entry, and how far bf16
training moves the losses from fp32 (it may: it is no optimization flag)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.cli import build_parser, main
from harness.launch.bench import plan_and_flags
from harness.launch.options import config_from_args
from harness.config import BenchConfig, PrecisionConfig
from harness.records.typed_json import dumps, loads
from harness.run.optimizations import describe
from harness.launch.planning import make_plan
from harness.presets import tiny
from tests.distributed import run_ranks

ITERS = 20
# bf16 keeps 8 significand bits: each matmul input is rounded by up to 2^-9 (2e-3) relative.
# tiny's dense arch has 9 linear layers in a row and its logits z stay below 0.1 in size, so
# the first iteration's logits, and the loss with them (d loss / dz = sigmoid(z) - label, at
# most 1 in size), move by about 9 * 2e-3 * 0.1 = 2e-3 at most; over 20 Adagrad steps the
# weights drift apart too. Measured: at most 8e-4 over the 20 iterations of both ranks (seed 0);
# 1.9e-3 at stop 53 (fused cross layers), and 5.1e-3 for bf16-pure, whose elementwise work and
# cross layers' residual stream round to bf16 too.
# 1e-2 leaves room for other seeds and CPUs (bf16 GEMM kernels differ by ISA), yet a bf16 step
# that lost half of the dense gradients exceeds it (measured 2.9e-2).
LOSS_TOLERANCE = 1e-2


def test_precision_config_is_checked_and_round_trips():
    with pytest.raises(ValueError, match="precision.dense 'fp16' is not one of"):
        PrecisionConfig(dense="fp16")
    cfg = tiny().replace(precision=PrecisionConfig(dense="bf16"))
    assert loads(BenchConfig, dumps(cfg)) == cfg


def test_command_line_and_manifest_entry(capsys):
    parser = build_parser()
    args = parser.parse_args(["bench", "--preset", "tiny", "--dense-precision", "bf16"])
    cfg = config_from_args(args)
    assert cfg.precision.dense == "bf16"
    flags = plan_and_flags(cfg, ranks_per_host=2)[2]  # what the manifest stores as its flags
    assert flags.precision.dense == "bf16" and flags.precision.numerics_changed is True
    assert "precision: dense bf16, tables fp32, comm fp32/fp32: NUMERICS CHANGED" in describe(flags)
    assert not any(flags.requested.values())  # not an optimization flag
    default = plan_and_flags(config_from_args(parser.parse_args(["bench", "--preset", "tiny"])), ranks_per_host=2)[2]
    assert default.precision.numerics_changed is False
    assert "precision: dense fp32, tables fp32, comm fp32/fp32" in describe(default) and "NUMERICS" not in describe(default)
    with pytest.raises(SystemExit):
        main(["bench", "--preset", "tiny", "--dense-precision", "fp16"])
    assert "invalid choice: 'fp16'" in capsys.readouterr().err


def test_bf16_pure_is_recorded_on_its_weight_copy_and_refused_by_the_torchrec_engine():
    parser = build_parser()
    cfg = config_from_args(parser.parse_args(["bench", "--preset", "tiny", "--dense-precision", "bf16-pure"]))
    flags = plan_and_flags(cfg, ranks_per_host=2)[2]
    assert flags.precision.dense == "bf16-pure" and flags.precision.numerics_changed
    assert "activations and gradients all in bf16" in describe(flags)
    assert flags.dense_weights.impl == "bf16 copy" and not flags.dense_weights.reason
    asked_off = config_from_args(parser.parse_args(["bench", "--preset", "tiny", "--dense-precision", "bf16-pure",
                                                    "--no-bf16-weight-copy"]))
    off = plan_and_flags(asked_off, ranks_per_host=2)[2].dense_weights
    assert off.impl == "bf16 copy" and "takes no effect" in off.reason
    with pytest.raises(ValueError, match="drop --dense-precision bf16-pure"):
        from harness.run.engine_torchrec import check_config

        check_config(cfg, ["data_parallel"])


def test_bf16_losses_stay_within_tolerance_of_fp32(tmp_path):
    """bf16 (autocast) and bf16-pure (every activation in bf16) both stay within the bound of fp32's
    losses, and each differs from fp32 and from the other (each reached the train loop)."""
    cfg = tiny(nodes=1, gpus_per_node=2, iters=ITERS, warmup_iters=0)
    plan, _ = make_plan(cfg, ranks_per_host=2)
    losses = {}
    for precision in ("fp32", "bf16", "bf16-pure"):
        out = tmp_path / precision
        out.mkdir()
        ranks = run_ranks(cfg.replace(precision=PrecisionConfig(dense=precision)), plan, out)
        losses[precision] = torch.tensor([r["losses"] for r in ranks], dtype=torch.float64)
    assert losses["fp32"].shape == (2, ITERS)
    for precision in ("bf16", "bf16-pure"):
        diff = (losses[precision] - losses["fp32"]).abs()
        assert diff.max() < LOSS_TOLERANCE, (precision, diff)
        assert diff.max() > 0, f"{precision} gave the fp32 losses bitwise: it did not reach the train loop"
    assert (losses["bf16-pure"] - losses["bf16"]).abs().max() > 0


def test_tf32_is_recorded_and_said_to_take_no_effect_on_a_cpu():
    """--tf32 (issue 45): fp32 matmuls on TF32 tensor cores where there are some; a CPU run records
    that it took no effect and keeps the fp32 numbers."""
    from harness.run.optimizations import resolve

    cfg = config_from_args(build_parser().parse_args(["bench", "--preset", "tiny", "--tf32"]))
    assert cfg.precision.tf32 is True
    on_cpu = resolve(cfg.optimizations, cuda=False, plan_kinds=["table_wise"], precision=cfg.precision)
    assert not on_cpu.precision.tf32 and not on_cpu.precision.numerics_changed
    assert "tf32 takes no effect: TF32 is a CUDA tensor-core format" in describe(on_cpu)
    on_gpu = resolve(cfg.optimizations, cuda=True, plan_kinds=["table_wise"], precision=cfg.precision)
    assert on_gpu.precision.tf32 and on_gpu.precision.numerics_changed
    assert "precision: dense fp32 (TF32 matmuls)" in describe(on_gpu)
    both = cfg.replace(precision=PrecisionConfig(dense="bf16", tf32=True))
    mixed = resolve(both.optimizations, cuda=False, plan_kinds=["table_wise"], precision=both.precision)
    assert mixed.precision.numerics_changed and "tf32 takes no effect" in mixed.precision.note


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tf32_losses_stay_within_tolerance_of_fp32_on_a_gpu(tmp_path):
    """TF32 keeps 10 significand bits (2^-11 relative a matmul input), tighter than bf16's 8: the
    bf16 bound holds for it, and it moves the losses (TF32 reached the train loop)."""
    cfg = tiny(nodes=1, gpus_per_node=1, iters=ITERS, warmup_iters=0, device="cuda")
    plan, _ = make_plan(cfg, ranks_per_host=1)
    losses = {}
    for tf32 in (False, True):
        out = tmp_path / str(tf32)
        out.mkdir()
        ranks = run_ranks(cfg.replace(precision=PrecisionConfig(tf32=tf32)), plan, out, device="cuda")
        losses[tf32] = torch.tensor([r["losses"] for r in ranks], dtype=torch.float64)
    diff = (losses[True] - losses[False]).abs()
    assert 0 < diff.max() < LOSS_TOLERANCE, diff


# --table-precision fp16 -------------------------------------------------------------------------

# A plan with every fused kind (the rest table-wise): fp16 weights reach each sharding's TBE.
FUSED_KINDS = ((0, "row_wise"), (9, "column_wise"), (1, "table_wise"), (20, "table_row_wise"))


def _fused_cfg(precision: str, nodes: int = 2, per_node: int = 1):
    from harness.config import ShardingConfig

    cfg = tiny(nodes=nodes, gpus_per_node=per_node, iters=ITERS, warmup_iters=0)
    return cfg.replace(precision=PrecisionConfig(tables=precision),
                       sharding=ShardingConfig(kind="table_wise", per_table=FUSED_KINDS))


def test_table_precision_is_checked_recorded_and_said_when_it_cannot_take_effect(capsys):
    with pytest.raises(ValueError, match="precision.tables 'fp8' is not one of"):
        PrecisionConfig(tables="fp8")
    parser = build_parser()
    fused = config_from_args(parser.parse_args(["bench", "--preset", "tiny", "--table-precision", "fp16",
                                                "--sharding", "table_wise", "--shard", "5=data_parallel"]))
    flags = plan_and_flags(fused, ranks_per_host=2)[2]
    assert flags.precision.tables == "fp16" and flags.precision.numerics_changed
    assert "fused tables' weights in fp16" in flags.precision.note and "data-parallel tables stay fp32" in flags.precision.note
    # tiny's own plan is all data-parallel: fp16 tables would change nothing, and the record says so.
    idle = plan_and_flags(config_from_args(parser.parse_args(["bench", "--preset", "tiny", "--table-precision", "fp16"])),
                          ranks_per_host=2)[2]
    assert idle.precision.tables == "fp16" and not idle.precision.numerics_changed
    assert "tables fp16 take no effect: every table of this plan is data-parallel" in describe(idle)
    with pytest.raises(SystemExit):
        main(["bench", "--preset", "tiny", "--table-precision", "bf16"])
    assert "invalid choice: 'bf16'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="drop --table-precision fp16"):
        from harness.run.engine_torchrec import check_config

        check_config(fused, ["table_wise"])


def test_the_planner_counts_fp16_weights_at_two_bytes():
    """The same plan at both precisions: each rank's planned memory differs by exactly two bytes a
    weight element of its fused shards (counted here from the shards), so nothing else the count
    holds changes (optimizer state, buffers, data-parallel tables stay fp32)."""
    from harness.launch.planning import geometry, table_specs, topology
    from model.planner import plan_footprint
    from model.plan_traffic import PlanTraffic

    cfg32 = _fused_cfg("fp32", nodes=2, per_node=2)
    plan, _ = make_plan(cfg32, ranks_per_host=2)
    topo = topology(cfg32, ranks_per_host=2)
    memory = {p: PlanTraffic.of(plan_footprint(plan, table_specs(cfg32), geometry(
        cfg32.replace(precision=PrecisionConfig(tables=p)), topo))).memory for p in ("fp32", "fp16")}
    elements = [0] * 4
    for tp in plan:
        if tp.kind != "data_parallel":
            for sh in tp.shards:
                elements[sh.rank] += sh.rows * sh.cols
    assert all(e > 0 for e in elements)
    assert list(memory["fp32"] - memory["fp16"]) == [2.0 * e for e in elements]


# fp16 keeps 11 significand bits: each weight is rounded by up to 2^-11 (4.9e-4) relative when
# stored, and again after each fused update. tiny's tables start at U(+-1/sqrt(rows)) and its
# logits stay below 0.1 in size, so the loss (d loss / d logit at most 1) moves by about 5e-5 at
# most in the first steps, and the rounding compounds over 20. eps is raised to 1e-2 (as in
# tests/test_sharded_training.py): with 1e-8, Adagrad's first step is lr * sign(g) however small
# g is, so one gradient near zero whose sign the rounding flips moves its weight by a whole lr the
# other way; one init draw in three tried did that (3.1e-3 after 20 iterations, against 4e-6 to
# 8e-6 for the others). Measured with eps 1e-2 (seed 0, both ranks, 20 iterations): 2.9e-5. The
# control, fp32 with the fused tables' learning rate 1e-30 (updates lost, as a broken fp16 update
# path would lose them): 9.1e-3. 1e-3 leaves 34x room over the drift, and sits 9x below it.
TABLE_LOSS_TOLERANCE = 1e-3


def test_fp16_table_losses_stay_within_tolerance_of_fp32(tmp_path):
    losses, shards = {}, {}
    for precision in ("fp32", "fp16"):
        cfg = _fused_cfg(precision)
        cfg = cfg.replace(optimizer=dataclasses.replace(cfg.optimizer, eps=1e-2))  # see TABLE_LOSS_TOLERANCE
        plan, _ = make_plan(cfg, ranks_per_host=2)
        out = tmp_path / precision
        out.mkdir()
        ranks = run_ranks(cfg, plan, out)
        losses[precision] = torch.tensor([r["losses"] for r in ranks], dtype=torch.float64)
        shards[precision] = [w for r in ranks for *_, w in r["shards"]]
    assert {w.dtype for w in shards["fp16"]} == {torch.float16} and {w.dtype for w in shards["fp32"]} == {torch.float32}
    assert sum(w.numel() * w.element_size() for w in shards["fp16"]) * 2 == sum(
        w.numel() * w.element_size() for w in shards["fp32"])
    diff = (losses["fp16"] - losses["fp32"]).abs()
    assert diff.max() < TABLE_LOSS_TOLERANCE, diff
    assert diff.max() > 0, "fp16 tables gave the fp32 losses bitwise: the precision did not reach the TBEs"


# --comm-precision ---------------------------------------------------------------------------------

# On the wire bf16 keeps 8 significand bits (each pooled value rounded by up to 2^-9, 2e-3,
# relative), fp16 11 bits (4.9e-4); the backward sends the gradients in bf16 either way (auto).
# fp8 rows are scaled to their largest value: e4m3 stores 3 significand bits (each value rounded
# by up to 2^-4, 6e-2, relative; a row's tiny values to 2^-10 of its scale), e5m2 gradients 2 bits
# (1.3e-1). tiny's pooled values feed logits below 0.1 in size, so the loss moves by about 2e-4 a
# step at most at 16 bits and ~3e-3 at fp8, with errors of either sign that mostly cancel over a
# row's 16 to 208 values, compounding over 20 steps. Measured (seed 0, both ranks, 20 iterations,
# a plan with every fused kind): fp16 forward 1.2e-4, bf16 forward 1.0e-3, fp8 forward (bf16 back)
# 8.5e-4, fp8 both ways 1.0e-3. The control, fp32 with the fused tables' updates lost: 4.2e-2
# (above). 1e-2 leaves 10x room over the largest drift and sits 4x below the control.
COMM_LOSS_TOLERANCE = 1e-2


def test_comm_precision_is_checked_resolved_and_recorded():
    with pytest.raises(ValueError, match="precision.comm 'int8' is not one of"):
        PrecisionConfig(comm="int8")
    assert PrecisionConfig(comm="fp8").wire_bwd == "bf16"
    assert PrecisionConfig(comm="fp16").wire_bwd == "bf16" and PrecisionConfig().wire_bwd == "fp32"
    assert PrecisionConfig(comm="fp16", comm_bwd="fp16").wire_bwd == "fp16"
    cfg = config_from_args(build_parser().parse_args(["bench", "--preset", "tiny", "--comm-precision", "bf16",
                                                      "--sharding", "table_wise"]))
    flags = plan_and_flags(cfg, ranks_per_host=2)[2]
    assert (flags.precision.comm, flags.precision.comm_bwd, flags.precision.numerics_changed) == ("bf16", "bf16", True)
    assert "pooled embeddings sent in bf16 and their gradients in bf16" in describe(flags)
    idle = plan_and_flags(config_from_args(build_parser().parse_args(["bench", "--preset", "tiny", "--comm-precision",
                                                                      "fp16"])), ranks_per_host=2)[2]
    assert not idle.precision.numerics_changed and "comm fp16/bf16 take no effect" in describe(idle)


@pytest.mark.parametrize("comm, comm_bwd", [("fp16", "auto"), ("bf16", "auto"), ("fp8", "auto"), ("fp8", "fp8")])
def test_comm_precision_losses_stay_within_tolerance_of_fp32(tmp_path, comm, comm_bwd):
    losses = {}
    for c, bwd in (("fp32", "auto"), (comm, comm_bwd)):
        cfg = _fused_cfg("fp32").replace(precision=PrecisionConfig(comm=c, comm_bwd=bwd))
        plan, _ = make_plan(cfg, ranks_per_host=2)
        out = tmp_path / c
        out.mkdir()
        losses[c] = torch.tensor([r["losses"] for r in run_ranks(cfg, plan, out)], dtype=torch.float64)
    diff = (losses[comm] - losses["fp32"]).abs()
    assert diff.max() < COMM_LOSS_TOLERANCE, diff
    assert diff.max() > 0, f"{comm} on the wire gave the fp32 losses bitwise: the casts did not reach the exchanges"
