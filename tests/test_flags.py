"""Optimization flags: what takes effect where, that none changes the math, the threaded
hand-off, the splits fallback, and the ablation's bookkeeping."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from harness.launch.ablation import ablation_configs, run_ablation
from harness.cli import main
from harness.config import OPTIMIZATION_FLAGS, OptimizationsConfig, ShardingConfig
from harness.data.synthetic import SyntheticCriteo
from harness.run.input_pipeline import InputFeeder
from harness.run.optimizations import describe, resolve
from harness.launch.planning import make_plan
from harness.presets import tiny
from harness.run.timeline import Timeline
from tests.distributed import run_ranks, spawn_ranks
from tests.test_sharded_training import MIXED


def test_cuda_only_flags_are_inactive_on_cpu_with_reasons():
    res = resolve(OptimizationsConfig(**{f: True for f in OPTIMIZATION_FLAGS}), cuda=False,
                  plan_kinds=["table_wise", "row_wise"])
    assert res.effective == {"cuda_graphs": False, "threaded_input_dist": True, "pinned_d2h": False,
                             "avoid_record_streams": False, "skip_splits_a2a": True}
    assert "CUDA only" in res.inactive_reasons["cuda_graphs"]
    assert "NCCL only" in res.inactive_reasons["avoid_record_streams"]
    assert "row-wise" in res.notes["skip_splits_a2a"]
    text = describe(res)
    assert text.count("INACTIVE") == 3 and "threaded_input_dist: on" in text
    only_rw = resolve(OptimizationsConfig(skip_splits_a2a=True), cuda=False, plan_kinds=["row_wise"])
    assert not only_rw.effective["skip_splits_a2a"] and "skip_splits_a2a" in only_rw.inactive_reasons
    on_gpu = resolve(OptimizationsConfig(**{f: True for f in OPTIMIZATION_FLAGS}), cuda=True, plan_kinds=["table_wise"],
                     torch_version="2.7.1+cu126")
    assert all(on_gpu.effective.values())
    # Who launches the input dist's collectives is said per backend (harness/run/input_pipeline.py).
    assert "main thread launches every collective" in on_gpu.notes["threaded_input_dist"]
    assert "thread also launches" in res.notes["threaded_input_dist"]
    one_gpu = resolve(OptimizationsConfig(threaded_input_dist=True), cuda=True, plan_kinds=["table_wise"],
                      world_size=1)
    assert not one_gpu.effective["threaded_input_dist"]
    assert "one rank: the input dist exchanges nothing" in one_gpu.inactive_reasons["threaded_input_dist"]
    one_cpu = resolve(OptimizationsConfig(threaded_input_dist=True), cuda=False, plan_kinds=["table_wise"],
                      world_size=1)  # a CPU rank alone as well: tiny measured 1.16x the defaults' period
    assert one_cpu.inactive_reasons == one_gpu.inactive_reasons
    assert resolve(OptimizationsConfig(threaded_input_dist=True), cuda=False, plan_kinds=["table_wise"],
                   world_size=2).effective["threaded_input_dist"]


def test_avoid_record_streams_is_inactive_where_torch_already_avoids_them():
    """torch >= 2.8 stashes collective tensors unconditionally and deprecates the variable."""
    def resolved(version):
        return resolve(OptimizationsConfig(avoid_record_streams=True), cuda=True, plan_kinds=["table_wise"],
                       torch_version=version)
    for version in ("2.8.0", "2.13.0+cu128", "3.0.0"):
        res = resolved(version)
        assert not res.effective["avoid_record_streams"]
        assert f"torch {version} already avoids recordStream" in res.inactive_reasons["avoid_record_streams"]
    for version in ("2.5.1", "2.7.1+cu126"):
        assert resolved(version).effective["avoid_record_streams"]


def test_dependent_flags_are_checked_when_built():
    with pytest.raises(ValueError, match="threaded_input_dist .* needs the pipelined loop"):
        OptimizationsConfig(threaded_input_dist=True, pipeline=False)
    cfg = tiny()
    with pytest.raises(ValueError, match="skip_splits_a2a needs fixed hotness"):
        cfg.replace(optimizations=OptimizationsConfig(skip_splits_a2a=True),
                    data=type(cfg.data)(global_batch_size=96, ragged_every=1))


def _config(pipeline, threaded, skip):
    cfg = tiny(nodes=1, gpus_per_node=2, iters=10, warmup_iters=0)
    return cfg.replace(
        sharding=ShardingConfig(kind="auto", per_table=MIXED),
        data=type(cfg.data)(global_batch_size=96, ragged_every=4),  # iterations 3 and 7 fall back
        optimizations=OptimizationsConfig(pipeline=pipeline, threaded_input_dist=threaded, skip_splits_a2a=skip),
    )


COLLECTIVES = ("all_to_all_single", "all_reduce", "reduce_scatter_single", "reduce_scatter_tensor", "all_gather_single",
               "all_gather_into_tensor")
"""torch.distributed's collectives the harness calls, under torch 2.13's names and the older ones
(model/collective_ops.py picks whichever this torch has; the GPU hosts' torch 2.11 has the older)."""


def _train_main_thread_launching(rank: int, world: int, device: torch.device, cfg, plan) -> dict:
    """train() with the input thread of the NCCL design (it prepares, the main thread launches),
    every collective call logged with the thread that made it."""
    import harness.run.rank
    import harness.run.train

    harness.run.rank.input_thread_launches = lambda cuda: False  # what a CUDA rank gets
    calls = []
    for name in (n for n in COLLECTIVES if hasattr(dist, n)):
        def logged(*args, _name=name, _real=getattr(dist, name), **kwargs):
            calls.append((_name, threading.current_thread().name))
            return _real(*args, **kwargs)
        setattr(dist, name, logged)
    out = harness.run.train.train(cfg, rank=rank, device=device, recorder=None, plan=plan, keep_weights=True).__dict__
    return {**out, "calls": calls}


def test_no_flag_changes_the_math(tmp_path):
    """Every subset of the flags that take effect on CPU, pipeline on and off: the same losses
    and final weights, bitwise (the same operations in the same order; only their timing moves)."""
    base_cfg = _config(False, False, False)
    plan, _ = make_plan(base_cfg, ranks_per_host=2)
    results = {}
    for pipeline, threaded, skip in itertools.product([False, True], [False, True], [False, True]):
        if threaded and not pipeline:
            continue
        out = tmp_path / f"p{pipeline:d}t{threaded:d}s{skip:d}"
        out.mkdir()
        results[(pipeline, threaded, skip)] = run_ranks(_config(pipeline, threaded, skip), plan, out)
    # The way hosts wait for collectives (poll by default here) is not a flag but must not change
    # the math either: the plain loop once more, blocking.
    blocking = _config(False, False, False)
    blocking = blocking.replace(optimizations=OptimizationsConfig(pipeline=False, collective_wait="block"))
    (tmp_path / "block").mkdir()
    results["block"] = run_ranks(blocking, plan, tmp_path / "block")
    # The threaded input dist as a CUDA rank runs it, here on gloo: the same math, and the thread
    # never issues a collective, so every rank issues the same ones in the same order.
    (tmp_path / "main_launches").mkdir()
    main_launches = spawn_ranks(_train_main_thread_launching, 2, tmp_path / "main_launches",
                                _config(True, True, False), list(plan))
    calls = [r.pop("calls") for r in main_launches]
    assert {thread for rank_calls in calls for _, thread in rank_calls} == {"MainThread"}
    assert calls[0] == calls[1] and ("all_to_all_single", "MainThread") in calls[0]
    results["threaded, main launches"] = main_launches
    base = results.pop((False, False, False))
    assert len(base[0]["losses"]) == 10
    for key, ranks in results.items():
        for r, b in zip(ranks, base):
            assert r["losses"] == b["losses"], key
            for k in b["dense_state"]:
                assert torch.equal(r["dense_state"][k], b["dense_state"][k]), (key, k)
            for (t, s, w), (t0, s0, w0) in zip(r["shards"], b["shards"]):
                assert (t, s) == (t0, s0) and torch.equal(w, w0), (key, t)


def test_skip_splits_counts_the_fallback(tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["bench", "--device", "cpu", "--preset", "tiny", "--iters", "6", "--warmup", "0", "--sharding", "table_wise",
                 "--skip-splits-a2a", "--ragged-every", "3", "--runs-root", str(runs)]) == 0
    (run_dir,) = runs.iterdir()
    its = pd.concat(pd.read_parquet(p) for p in run_dir.glob("rank*/iterations-*.parquet"))
    exchanged = its.groupby("iteration")["splits_exchanged"].max().tolist()
    assert exchanged == [0, 0, 1, 0, 0, 1]  # iterations 2 and 5 are ragged: full exchange
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["optimizations"]["effective"]["skip_splits_a2a"] is True
    assert "skip_splits_a2a: on" in capsys.readouterr().out


class _FailingEmbeddings:
    def prepare_input_dist(self, features, *, splits_known):
        raise ValueError("boom in input dist")


def test_threaded_input_dist_failure_fails_the_run_and_leaves_no_thread():
    cfg = tiny()
    feeder = InputFeeder(embeddings=_FailingEmbeddings(), data=SyntheticCriteo(cfg.model, cfg.data), rank=0,
                         world_size=2, device=torch.device("cpu"), total=5, pipeline=True, threaded=True,
                         skip_splits=False, timeline=Timeline(cuda=False, stages=True))
    with pytest.raises(RuntimeError, match="input-dist thread failed at iteration 0") as err:
        feeder.prepare(0)  # the pipelined schedule starts batch 0 before iteration 0
    assert "boom in input dist" in repr(err.value.__cause__)
    feeder.close()
    assert not any(t.name == "input-dist" for t in threading.enumerate())


def test_ablation_runs_each_distinct_config_and_shares_the_runs_of_the_rest(tmp_path, capsys):
    """On a CPU with a table-wise plan the CUDA-only flags cannot take effect, so of the 12 configs 4
    differ (by hand: no flag, the thread alone, the skip alone, both); each of the other 8 is given
    the runs of the first config that resolves as it does, and runs nothing itself. The 4 run
    interleaved, a round at a time."""
    names = [c["name"] for c in ablation_configs()]
    assert names[0] == "baseline" and names[6] == "all" and len(names) == 12
    assert "+skip_splits_a2a" in names and "all-cuda_graphs" in names
    calls = []

    def fake_bench(cfg, run_id):
        calls.append((run_id, cfg.optimizations.requested()))
        return 0

    def fake_check(cfg):
        return resolve(cfg.optimizations, cuda=False, plan_kinds=["table_wise"])

    assert run_ablation(tiny(), repeats=3, runs_root=tmp_path, bench=fake_bench, check=fake_check) == 0
    (folder,) = (tmp_path / "ablations").iterdir()
    manifest = json.loads((folder / "ablation.json").read_text())
    by_name = {c["name"]: c for c in manifest["configs"]}
    assert manifest["status"] == "completed" and len(by_name) == 12
    ran = {"baseline", "+threaded_input_dist", "+skip_splits_a2a", "all"}
    for name in ran:
        assert "same_as" not in by_name[name] and len(by_name[name]["runs"]) == 3
    shared = {"+cuda_graphs": "baseline", "+pinned_d2h": "baseline", "+avoid_record_streams": "baseline",
              "all-cuda_graphs": "all", "all-pinned_d2h": "all", "all-avoid_record_streams": "all",
              "all-threaded_input_dist": "+skip_splits_a2a", "all-skip_splits_a2a": "+threaded_input_dist"}
    assert set(shared) | ran == set(by_name)
    for name, same in shared.items():
        assert by_name[name]["same_as"] == same and by_name[name]["runs"] == by_name[same]["runs"], name
    for name in ("+cuda_graphs", "+pinned_d2h", "+avoid_record_streams"):  # CUDA/NCCL only
        assert by_name[name]["all_inactive"] and by_name[name]["inactive_reasons"]
    assert len(calls) == 4 * 3 and len({run_id for run_id, _ in calls}) == 12
    assert calls[0][1] == {f: False for f in OPTIMIZATION_FLAGS}
    # Interleaved: round by round, each distinct config once a round, in the configs' order.
    assert [run_id[-6:] for run_id, _ in calls[:5]] == ["c00-r0", "c02-r0", "c05-r0", "c06-r0", "c00-r1"]
    assert [run_id[-2:] for run_id, _ in calls] == ["r0"] * 4 + ["r1"] * 4 + ["r2"] * 4
    assert "12 configs, 4 of them distinct here" in capsys.readouterr().out


def test_cross_layers_are_recorded_fused_or_as_written():
    """Not a flag: the harness engine runs fused cross layers unless told --no-fused-cross; the
    torchrec engine runs its own and says so; manifests written before the choice read as written."""
    from harness.records.manifest import RunManifest
    from harness.run.optimizations import describe, resolve

    on = resolve(OptimizationsConfig(), cuda=False, plan_kinds=["table_wise"])
    off = resolve(OptimizationsConfig(fused_cross=False), cuda=False, plan_kinds=["table_wise"])
    stock = resolve(OptimizationsConfig(), cuda=True, plan_kinds=["table_wise"], engine="torchrec")
    assert (on.cross_net.impl, off.cross_net.impl, stock.cross_net.impl) == ("fused", "autograd", "autograd")
    assert "torchrec engine" in stock.cross_net.reason and not off.cross_net.reason
    assert "cross layers: fused" in describe(on) and "cross layers: autograd" in describe(off)
    old = Path(__file__).parent / "data" / "h100-runs" / "g-tiny" / "manifest.json"
    assert '"fused_cross"' not in old.read_text()
    m = RunManifest.from_json(old.read_text())
    assert m.config.optimizations.fused_cross is False and m.optimizations.cross_net.impl == "autograd"


def test_dense_weights_are_recorded_as_a_bf16_copy_autocast_casts_or_fp32():
    """Not a flag: in bf16 the harness engine computes on a bf16 copy of its weights unless told
    --no-bf16-weight-copy; fp32 runs and the torchrec engine say why they have none; manifests
    written before the choice read as what they ran (autocast casts in bf16, fp32 else)."""
    from harness.config import PrecisionConfig
    from harness.records.manifest import RunManifest
    from harness.run.optimizations import describe, resolve

    bf16 = PrecisionConfig(dense="bf16")
    kinds = ["table_wise"]
    copy = resolve(OptimizationsConfig(), cuda=False, plan_kinds=kinds, precision=bf16)
    casts = resolve(OptimizationsConfig(bf16_weight_copy=False), cuda=False, plan_kinds=kinds, precision=bf16)
    fp32 = resolve(OptimizationsConfig(), cuda=False, plan_kinds=kinds)
    stock = resolve(OptimizationsConfig(), cuda=True, plan_kinds=kinds, precision=bf16, engine="torchrec")
    assert [r.dense_weights.impl for r in (copy, casts, fp32, stock)] == ["bf16 copy", "autocast casts", "fp32",
                                                                          "autocast casts"]
    assert "torchrec engine" in stock.dense_weights.reason and not casts.dense_weights.reason
    assert "dense weights: bf16 copy" in describe(copy) and "dense weights: autocast casts" in describe(casts)
    data = Path(__file__).parent / "data"
    for folder, impl in (("h100-runs-2/s-bf16-r0", "autocast casts"), ("h100-runs/g-tiny", "fp32")):
        text = (data / folder / "manifest.json").read_text()
        assert '"bf16_weight_copy"' not in text and '"dense_weights"' not in text
        m = RunManifest.from_json(text)
        assert m.config.optimizations.bf16_weight_copy is False and m.optimizations.dense_weights.impl == impl


def test_the_bf16_weight_copy_trains_a_run_bit_for_bit_as_autocast_casts(tmp_path):
    """Whole bf16 runs on 2 ranks (a mixed plan, 10 iterations): the weight copy against autocast
    casting fp32 weights gives the same losses and final weights, bitwise, and the final dense
    weights it hands back are the fp32 ones, not the bf16 copy."""
    from harness.config import PrecisionConfig

    cfg = _config(True, False, False).replace(precision=PrecisionConfig(dense="bf16"))
    plan, _ = make_plan(cfg, ranks_per_host=2)
    runs = {}
    for copy in (True, False):
        (tmp_path / str(copy)).mkdir()
        c = cfg.replace(optimizations=OptimizationsConfig(bf16_weight_copy=copy))
        runs[copy] = run_ranks(c, plan, tmp_path / str(copy))
    for r, b in zip(runs[True], runs[False]):
        assert len(b["losses"]) == 10 and r["losses"] == b["losses"]
        for k, v in b["dense_state"].items():
            assert r["dense_state"][k].dtype == v.dtype == torch.float32 and torch.equal(r["dense_state"][k], v), k
        for (t, s, w), (t0, s0, w0) in zip(r["shards"], b["shards"]):
            assert (t, s) == (t0, s0) and torch.equal(w, w0), t
