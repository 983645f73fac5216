"""GPU battery (`make gpu-check`): what a first run on a GPU cluster would hit, checked on real devices.

Each test's one-line docstring names its check. Two-rank checks need 2 GPUs (one NCCL rank each)
and skip with that reason on a 1-GPU host. None of these can run on the development machine (no
GPU): they were written against torch 2.13's and fbgemm's documented behaviour and have not yet
run; the first GPU run of `make gpu-check` is their first run.
"""

from __future__ import annotations

import copy
import json
import time

import pandas as pd
import pytest
import torch

from harness.cli import main
from harness.config import OPTIMIZATION_FLAGS, OptimizationsConfig, ShardingConfig
from tests.distributed import spawn_ranks

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (2 NCCL ranks)")


def test_installed_variant():
    """the installed torch/fbgemm pair is the CUDA variant (check_install): the pinned pair, or on a
    host's own interpreter with another (the lent H100 hosts': torch 2.11, fbgemm-gpu 1.6.0) what
    `make ... PY=python3` asks there: torch built for CUDA, an fbgemm-gpu that loads and is built
    for that torch (the other pair itself only a warning)"""
    from harness.tools import check_install as ci

    versions = ci.installed_versions()
    if versions.get("torch", "").split("+")[0] == ci.TORCH_VERSION:
        assert ci.problems("requirements-cuda") == []
    else:
        found, _ = ci.host_problems(versions=versions, torch_cuda=ci.torch_cuda_build(), cuda=True,
                                    fbgemm_loads=ci._fbgemm_load_error())
        assert found == []


def test_more_ranks_than_gpus_refused(tmp_path, capsys):
    """more ranks than GPUs on this host refused in one line before launch"""
    runs = tmp_path / "runs"
    ranks = torch.cuda.device_count() + 1
    code = main(["bench", "--device", "cuda", "--preset", "tiny", "--gpus-per-node", str(ranks),
                 "--global-batch", str(8 * ranks), "--iters", "2", "--runs-root", str(runs)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "need a GPU each" in err[0]
    assert not runs.exists()


def _calibrated_sleep_cycles(target_ms: float) -> int:
    """torch.cuda._sleep spins a given number of clock cycles: how many make about target_ms here."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 1_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return int(cycles * target_ms / start.elapsed_time(end))


def test_timeline_accuracy_against_known_sleeps():
    """the CUDA timeline times known device sleeps within 5%"""
    from harness.run.timeline import Timeline

    torch.cuda.synchronize()
    cycles = _calibrated_sleep_cycles(20.0)
    ref_start, ref_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ref_start.record()
    torch.cuda._sleep(cycles)
    ref_end.record()
    ref_end.synchronize()
    expected_ms = ref_start.elapsed_time(ref_end)
    tl = Timeline(cuda=True, stages=True, device=torch.device("cuda", torch.cuda.current_device()))
    for it in range(3):
        tl.begin_iteration(it)
        with tl.stage("emb_fwd"):
            torch.cuda._sleep(cycles)
        tl.end_iteration()
        stages, iters = tl.drain()  # a drain each iteration: the anchor is retaken every time
        (stage,), (span,) = stages, iters
        assert stage.end_ns - stage.start_ns == pytest.approx(expected_ms * 1e6, rel=0.05)
        slack = 2_000  # events resolve to about half a microsecond each
        assert span.start_ns - slack <= stage.start_ns <= stage.end_ns <= span.end_ns + slack


def _train_rank(rank: int, world: int, device: torch.device, cfg, plan) -> dict:
    from harness.run.train import train

    result = train(cfg, rank=rank, device=device, recorder=None, plan=plan)
    others = [i for i in range(torch.cuda.device_count()) if i != device.index]
    return {"losses": result.losses, "contexts_elsewhere": [i for i in others if torch._C._cuda_hasPrimaryContext(i)]}


@needs_two_gpus
def test_every_rank_stays_on_its_own_gpu(tmp_path):
    """every rank's work and timeline events on its own GPU: no context on another GPU, threaded input dist on"""
    from harness.launch.planning import make_plan
    from harness.presets import tiny

    cfg = tiny(nodes=1, gpus_per_node=2, iters=6, warmup_iters=1, device="cuda")
    cfg = cfg.replace(optimizations=OptimizationsConfig(threaded_input_dist=True, pinned_d2h=True))
    plan, _ = make_plan(cfg, ranks_per_host=2)
    ranks = spawn_ranks(_train_rank, 2, tmp_path, cfg, list(plan), device="cuda")
    assert [r["contexts_elsewhere"] for r in ranks] == [[], []]
    # And a timeline made while another GPU is current is refused, not silently timing that GPU.
    from harness.run.timeline import Timeline

    with torch.cuda.device(0), pytest.raises(RuntimeError, match="recorded on another GPU"):
        Timeline(cuda=True, stages=True, device=torch.device("cuda", 1))


def _graphed_and_eager(rank: int, world: int, device: torch.device) -> dict:
    import torch.distributed as dist

    from harness.run.dense_gradients import FlatGradients
    from harness.run.dense_step import DenseStep
    from tests.dense_fixtures import B, ND, PW, adagrad, make_inputs, make_model

    eager_model = make_model("cuda")
    graphed_model = copy.deepcopy(eager_model)
    steps, opts, grads = {}, {}, {}
    for name, model, graphed in (("eager", eager_model, False), ("graphed", graphed_model, True)):
        grads[name] = FlatGradients(model, world_size=world, group=dist.group.WORLD)
        steps[name] = DenseStep(dense=model, grads=grads[name], world_size=world, local_batch=B, num_dense=ND,
                                pooled_width=PW, device=device, graphed=graphed, precision="fp32")
        opts[name] = adagrad([grads[name].flat_parameter()], lr=0.1, device="cuda")
    losses = {"eager": [], "graphed": []}
    for it in range(4):
        dense_x, pooled, labels = make_inputs(100 * rank + it, device="cuda")  # each rank its own samples
        for name in ("eager", "graphed"):
            loss, _ = steps[name].run(dense_x, pooled.clone().requires_grad_(True), labels)
            steps[name].finish_gradients()
            losses[name].append(float(loss))
            opts[name].step()
            grads[name].zero()
    return {"losses": losses,
            "weights": {n: [p.detach().cpu() for p in m.parameters()] for n, m in (("eager", eager_model),
                                                                                  ("graphed", graphed_model))}}


@needs_two_gpus
def test_graphed_dense_step_matches_eager_over_nccl(tmp_path):
    """the CUDA-graphed dense step and its all-reduce match eager over NCCL, 2 ranks, different inputs"""
    ranks = spawn_ranks(_graphed_and_eager, 2, tmp_path, device="cuda")
    for r in ranks:
        assert r["losses"]["graphed"] == pytest.approx(r["losses"]["eager"], rel=1e-5)
        for g, e in zip(r["weights"]["graphed"], r["weights"]["eager"]):
            torch.testing.assert_close(g, e)
    for a, b in zip(ranks[0]["weights"]["graphed"], ranks[1]["weights"]["graphed"]):
        assert torch.equal(a, b)  # replicas agree: the captured all-reduce ran


FLAG_SETS = {"none": {}, **{f"{f} alone": {f: True} for f in OPTIMIZATION_FLAGS},
             "all": {f: True for f in OPTIMIZATION_FLAGS}}


@needs_two_gpus
@pytest.mark.parametrize("flags", sorted(FLAG_SETS))
def test_flags_on_a_mixed_plan_match_the_cpu_reference(flags, tmp_path):
    """each optimization flag alone and all together, on a plan of every sharding kind, against the unsharded CPU reference"""
    from tests.test_sharded_training import MIXED, check_against_reference

    check_against_reference(2, ShardingConfig(kind="auto", per_table=MIXED), tmp_path, "cuda",
                            optimizations=OptimizationsConfig(**FLAG_SETS[flags]))


def test_graphed_losses_are_each_iterations_own(tmp_path):
    """one GPU, --cuda-graphs: each iteration's recorded loss is its own (the graph's static loss is copied before the next replay), against the unsharded CPU reference"""
    from tests.test_sharded_training import check_against_reference

    check_against_reference(1, ShardingConfig(kind="table_wise"), tmp_path, "cuda",
                            optimizations=OptimizationsConfig(cuda_graphs=True))


def _steady_state_syncs(rank: int, world: int, device: torch.device) -> list[str]:
    """Iterations of the harness engine's step (the train loop's) with cuda graphs, pinned copies
    and skipped splits on a table-wise plan; the 4th runs under set_sync_debug_mode('error'): a
    host sync there raises."""
    from harness.data.source import open_batches
    from harness.presets import tiny
    from harness.run.rank import RankEnv, build_rank
    from model.sharding import table_wise

    cfg = tiny(nodes=1, gpus_per_node=1, device="cuda")
    cfg = cfg.replace(optimizations=OptimizationsConfig(cuda_graphs=True, pinned_d2h=True, skip_splits_a2a=True))
    plan = [table_wise(r, cfg.model.embedding_dim, 0) for r in cfg.model.table_rows]
    parts = build_rank(RankEnv(cfg=cfg, rank=0, device=device, recorder=None, plan=plan), open_batches(cfg))
    step, timeline = parts.step, parts.timeline
    caught = []
    step.begin_segment(0, 6)
    for it in range(6):
        step.prepare(it)  # what the loop runs before an iteration's window opens
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error" if it == 3 else "default")
        try:
            timeline.begin_iteration(it)
            step.run(it)
            timeline.end_iteration()
        except RuntimeError as exc:
            caught.append(f"iteration {it}: {exc}")
        finally:
            torch.cuda.set_sync_debug_mode("default")
        timeline.drain()
    step.end_segment()
    parts.close(True)
    return caught


def test_no_host_sync_in_a_steady_state_iteration(tmp_path):
    """no host sync in a steady-state iteration (cuda graphs, pinned copies, splits skipped; under set_sync_debug_mode)"""
    # The flags are what removes the one sync the loop otherwise has by design: the splits read
    # (skip_splits_a2a on a table-wise plan with fixed hotness exchanges none).
    (caught,) = spawn_ranks(_steady_state_syncs, 1, tmp_path, device="cuda")
    assert caught == []


@needs_two_gpus
def test_stalled_rank_before_a_graph_replay_fails_within_the_timeout(tmp_path):
    """a rank stalled before a CUDA-graph replay fails the run within the collective timeout, records kept"""
    runs = tmp_path / "runs"
    start = time.monotonic()
    code = main(["bench", "--device", "cuda", "--preset", "tiny", "--gpus-per-node", "2", "--cuda-graphs",
                 "--iters", "10", "--warmup", "0", "--flush-every", "1", "--stall-at", "1:3",
                 "--collective-timeout", "20", "--runs-root", str(runs)])
    elapsed = time.monotonic() - start
    assert code == 1 and elapsed < 20 + 120  # the timeout, plus start-up and tear-down
    (run_dir,) = runs.iterdir()
    status = json.loads((run_dir / "manifest.json").read_text())["status"]
    assert status["state"] == "failed" and "injected stall on rank 1 at iteration 3" in status["error"]
    its = pd.concat(pd.read_parquet(p) for p in run_dir.glob("rank*/iterations-*.parquet"))
    assert set(its.loc[its["rank"] == 1, "iteration"]) >= {0, 1, 2}
