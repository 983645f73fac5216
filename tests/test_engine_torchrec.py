"""The torchrec engine trains the same model as the harness engine (issue 9, part 1).

Both engines, 2 local gloo ranks, the tiny preset: same seed, same batches, TorchRec initialised
from the harness's weights, so equal losses test the arch mapping, the plan mapping, the
optimizers and the gradient scaling together.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("torchrec")

from harness.config import OptimizerConfig, ShardingConfig  # noqa: E402
from harness.run.engine_torchrec import check_config  # noqa: E402
from harness.launch.planning import make_plan  # noqa: E402
from harness.presets import tiny  # noqa: E402
from tests.distributed import run_ranks, spawn_ranks  # noqa: E402
from tests.test_sharded_training import assemble  # noqa: E402

STEPS = 6


def both_engines(kind: str, tmp_path):
    cfg = tiny(nodes=1, gpus_per_node=2, iters=STEPS, warmup_iters=0, device="cpu")
    # lr/eps as tests/test_sharded_training.py: large enough steps that 6 iterations move the
    # loss far past float32 noise, eps large enough that Adagrad does not amplify summation-order
    # noise where a gradient nearly cancels.
    cfg = cfg.replace(optimizer=OptimizerConfig(learning_rate=0.05, eps=1e-2), sharding=ShardingConfig(kind=kind))
    plan, _ = make_plan(cfg, ranks_per_host=2)
    (tmp_path / "h").mkdir()
    (tmp_path / "t").mkdir()
    harness = run_ranks(cfg, plan, tmp_path / "h")
    trec_cfg = cfg.replace(run=dataclasses.replace(cfg.run, engine="torchrec"))
    trec = run_ranks(trec_cfg, plan, tmp_path / "t")
    return cfg, harness, trec


@pytest.mark.parametrize("kind", ["table_wise", "column_wise", "row_wise", "data_parallel", "auto"])
def test_torchrec_engine_matches_harness(kind, tmp_path):
    cfg, harness, trec = both_engines(kind, tmp_path)
    h = torch.tensor([r["losses"] for r in harness], dtype=torch.float64)
    t = torch.tensor([r["losses"] for r in trec], dtype=torch.float64)
    assert h.shape == t.shape == (2, STEPS)
    # Within float32 rounding: 1e-5 relative. On 2 ranks the two engines happen to agree bit for
    # bit (DDP's average of two float32 gradients equals the harness's halved sum exactly), but a
    # different reduction order (DDP buckets, other world sizes) may move a loss of ~0.7 by a few
    # 1e-7 a step; 1e-5 leaves room for that over 6 steps and none for a wrong gradient scale:
    # without TorchRec's gradient division the losses move by ~1e-1 (measured).
    torch.testing.assert_close(t, h, rtol=1e-5, atol=0)
    assert (h[:, -1] != h[:, 0]).all(), "training did not move the loss"
    for k, v in harness[0]["dense_state"].items():
        torch.testing.assert_close(trec[0]["dense_state"][k], v, rtol=1e-4, atol=1e-5)
    for table, rows in enumerate(cfg.model.table_rows):
        dim = cfg.model.embedding_dim
        torch.testing.assert_close(assemble(trec, table, rows, dim), assemble(harness, table, rows, dim),
                                   rtol=1e-4, atol=1e-5)


def test_refuses_what_torchrec_cannot_run_here():
    cfg = tiny(nodes=1, gpus_per_node=2)
    with pytest.raises(ValueError, match="cannot shard a table diagonal"):
        check_config(cfg, ["table_wise", "diagonal"])
    flagged = cfg.replace(optimizations=dataclasses.replace(cfg.optimizations, skip_splits_a2a=True))
    with pytest.raises(ValueError, match="skip_splits_a2a"):
        check_config(flagged, ["table_wise"])


def test_both_engines_run_bf16_dense_the_same_way(tmp_path):
    """--dense-precision bf16: TorchRec's dense arch runs under the harness's autocast, so the two
    engines stay same-math (issue 45): their losses agree to bf16 rounding, and differ from fp32's
    (autocast reached TorchRec's arch)."""
    from harness.config import PrecisionConfig

    cfg = tiny(nodes=1, gpus_per_node=2, iters=STEPS, warmup_iters=0, device="cpu")
    cfg = cfg.replace(optimizer=OptimizerConfig(learning_rate=0.05, eps=1e-2),
                      sharding=ShardingConfig(kind="table_wise"), precision=PrecisionConfig(dense="bf16"))
    plan, _ = make_plan(cfg, ranks_per_host=2)
    losses = {}
    for engine, precision in (("harness", "bf16"), ("torchrec", "bf16"), ("torchrec", "fp32")):
        c = cfg.replace(run=dataclasses.replace(cfg.run, engine=engine), precision=PrecisionConfig(dense=precision))
        (tmp_path / f"{engine}-{precision}").mkdir()
        losses[engine, precision] = torch.tensor([r["losses"] for r in run_ranks(c, plan, tmp_path / f"{engine}-{precision}")],
                                                 dtype=torch.float64)
    # bf16 keeps 8 significand bits (tests/test_precision.py): the engines' bf16 losses agree far
    # inside the 1e-2 that separates bf16 from fp32 here.
    torch.testing.assert_close(losses["torchrec", "bf16"], losses["harness", "bf16"], rtol=2e-3, atol=0)
    assert (losses["torchrec", "bf16"] - losses["torchrec", "fp32"]).abs().max() > 0


def _dense_optimizer_params(rank: int, world: int, device: torch.device, cfg, plan) -> dict:
    """The types of the parameters TorchRec's engine hands its dense Adagrad, and one Adagrad step
    over copies of them, foreach and the per-parameter loop."""
    from harness.run.engine_torchrec import build
    from harness.run.timeline import Timeline

    _, opt, _ = build(cfg, device=device, plan=plan, timeline=Timeline(cuda=False, stages=False))
    params = [p for g in opt.param_groups for p in g["params"]]
    asked = opt.opt.defaults["foreach"]  # on a CPU: torch's default (None), as the manifest says
    torch.manual_seed(rank)
    grads = [torch.randn_like(p) for p in params]
    stepped = {}
    for foreach in (True, False):
        copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
        for c, g in zip(copies, grads):
            c.grad = g.clone()
        torch.optim.Adagrad(copies, lr=0.05, eps=1e-2, foreach=foreach).step()
        stepped[foreach] = [c.detach() for c in copies]
    return {"asked": asked, "types": sorted({type(p).__name__ for p in params}), "plain": all(type(p) in (torch.Tensor,
            torch.nn.Parameter) for p in params), "same": all(torch.equal(a, b) for a, b in zip(stepped[True], stepped[False]))}


def test_torchrec_dense_adagrad_asks_for_foreach_which_torch_would_not_pick(tmp_path):
    """tiny's data-parallel tables reach TorchRec's dense Adagrad as table slices, not plain
    parameters: torch picks foreach on CUDA only for plain ones (torch.optim.optimizer's default),
    so the engine asks for it there (2.85 ms of the loop a step on the H100); a foreach step is
    the loop's, bit for bit."""
    from harness.run.optimizations import dense_adagrad

    cfg = tiny(nodes=1, gpus_per_node=1, iters=2, warmup_iters=0, device="cpu")
    plan, _ = make_plan(cfg, ranks_per_host=1)
    (out,) = spawn_ranks(_dense_optimizer_params, 1, tmp_path, cfg, list(plan))
    assert not out["plain"] and "TableBatchedEmbeddingSlice" in out["types"], out["types"]
    assert out["same"] and out["asked"] is None and dense_adagrad("cpu", engine="torchrec").impl == "default"
    assert dense_adagrad("cuda", engine="torchrec").impl == "foreach"  # what the engine builds from on CUDA
