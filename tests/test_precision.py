"""--dense-precision: the config field, the command line, the manifest's entry, and how far bf16
training moves the losses from fp32 (it may: it is no optimization flag)."""

from __future__ import annotations

import pytest
import torch

from harness.cli import build_parser, main, plan_and_flags
from harness.options import config_from_args
from harness.config import BenchConfig, PrecisionConfig
from harness.typed_json import dumps, loads
from harness.optimizations import describe
from harness.planning import make_plan
from harness.presets import tiny
from tests.distributed import run_ranks

ITERS = 20
# bf16 keeps 8 significand bits: each matmul input is rounded by up to 2^-9 (2e-3) relative.
# tiny's dense arch has 9 linear layers in a row and its logits z stay below 0.1 in size, so
# the first iteration's logits, and the loss with them (d loss / dz = sigmoid(z) - label, at
# most 1 in size), move by about 9 * 2e-3 * 0.1 = 2e-3 at most; over 20 Adagrad steps the
# weights drift apart too. Measured: at most 8e-4 over the 20 iterations of both ranks (seed 0).
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
    assert "dense precision: bf16: NUMERICS CHANGED" in describe(flags)
    assert not any(flags.requested.values())  # not an optimization flag
    default = plan_and_flags(config_from_args(parser.parse_args(["bench", "--preset", "tiny"])), ranks_per_host=2)[2]
    assert default.precision.numerics_changed is False
    assert "dense precision: fp32" in describe(default) and "NUMERICS" not in describe(default)
    with pytest.raises(SystemExit):
        main(["bench", "--preset", "tiny", "--dense-precision", "fp16"])
    assert "invalid choice: 'fp16'" in capsys.readouterr().err


def test_bf16_losses_stay_within_tolerance_of_fp32(tmp_path):
    cfg = tiny(nodes=1, gpus_per_node=2, iters=ITERS, warmup_iters=0)
    plan, _ = make_plan(cfg, ranks_per_host=2)
    losses = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / precision
        out.mkdir()
        ranks = run_ranks(cfg.replace(precision=PrecisionConfig(dense=precision)), plan, out)
        losses[precision] = torch.tensor([r["losses"] for r in ranks], dtype=torch.float64)
    assert losses["fp32"].shape == (2, ITERS)
    diff = (losses["bf16"] - losses["fp32"]).abs()
    assert diff.max() < LOSS_TOLERANCE, diff
    assert diff.max() > 0, "bf16 gave the fp32 losses bitwise: autocast did not reach the train loop"
