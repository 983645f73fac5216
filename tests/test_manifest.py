"""The typed run manifest: one JSON form that round-trips, damaged files are refused, and the
names and manifest modules load without torch (the report side and the Makefile rely on it)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config import OptimizationsConfig, ShardingConfig
from harness.records.manifest import GitState, RankInfo, RunManifest, RunStatus, Versions
from harness.run.optimizations import resolve
from harness.launch.planning import make_plan
from harness.presets import tiny
from tests.test_sharded_training import MIXED

ROOT = Path(__file__).resolve().parent.parent


def real_manifest() -> RunManifest:
    cfg = tiny(nodes=1, gpus_per_node=3, fail_at=(1, 4), iters=7).replace(
        sharding=ShardingConfig(kind="auto", per_table=MIXED, memory_gbps=7.5, column_shards=2),
        optimizations=OptimizationsConfig(threaded_input_dist=True, skip_splits_a2a=True, cuda_graphs=True),
    )
    plan, estimate = make_plan(cfg, ranks_per_host=3)
    assert {tp.kind for tp in plan} == {"table_wise", "column_wise", "row_wise", "data_parallel"}
    flags = resolve(cfg.optimizations, cuda=False, plan_kinds=[tp.kind for tp in plan])
    rank = RankInfo(run_id="r", rank=0, node=0, host="h", pid=7, device="cpu", backend="gloo", threads=2,
                    gemm_gflops=12.5, copy_gbps=3.0, peak_rss_gib=0.25)
    return RunManifest(
        run_id="r", config=cfg, start_time="2026-01-01T00:00:00.000+00:00", launcher="local-simulation",
        launcher_host="h", argv=("harness", "bench"), node_commands=("node 0: ...",), device="cpu",
        optimizations=flags, plan=plan, plan_estimate=estimate, dense_flops_per_sample=123456.0,
        versions=Versions(python="3.11", torch="2", fbgemm_gpu="1", numpy="2", pandas="2"),
        git=GitState(commit="abc", dirty=False), ranks=(rank,), hosts=("h",),
    )


def test_round_trip_of_a_real_plan_and_config():
    m = real_manifest()
    text = m.to_json()
    back = RunManifest.from_json(text)
    assert back == m
    # Tuples stay tuples (a list would compare unequal and be unhashable in the config).
    assert back.config.sharding.per_table == MIXED and back.config.run.fail_at == (1, 4)
    assert isinstance(back.plan, tuple) and isinstance(back.plan[0].shards, tuple)
    # The file is plain JSON a person (or jq) can read; keys are the field names.
    raw = json.loads(text)
    assert raw["optimizations"]["effective"]["cuda_graphs"] is False
    assert raw["config"]["sharding"]["memory_gbps"] == 7.5 and raw["status"] == {"state": "running", "error": None}


def test_status_change_is_a_new_value():
    m = real_manifest()
    done = dataclasses.replace(m, status=RunStatus(state="failed", error="rank 1: boom"))
    assert m.status.state == "running" and done.status.error == "rank 1: boom"
    assert RunManifest.from_json(done.to_json()) == done
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.run_id = "x"  # type: ignore[misc]
    with pytest.raises(ValueError, match="status.state 'paused'"):
        RunStatus(state="paused")


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(colour="blue"), "RunManifest has no field"),
    (lambda d: d["config"]["run"].update(iters="20"), r"\$.config.run.iters: expected int"),
    (lambda d: d["config"]["run"].update(iters=True), r"\$.config.run.iters: expected int"),
    (lambda d: d["config"]["data"].update(global_batch_size=95), "does not divide by the world size 3"),
    (lambda d: d["plan"].pop(), "manifest.plan has 25 tables"),
    (lambda d: d["optimizations"]["effective"].pop("pinned_d2h"), "flags.effective must name exactly"),
    (lambda d: d.pop("config"), "RunManifest lacks field.s. config"),
    (lambda d: d["plan"][0]["shards"][0].pop("rank"), r"\$.plan\[0\].shards\[0\]: Shard lacks field.s. rank"),
])
def test_damaged_manifest_is_refused_naming_the_place(change, message):
    d = json.loads(real_manifest().to_json())
    change(d)
    with pytest.raises(ValueError, match=message):
        RunManifest.from_json(json.dumps(d))


def test_names_manifest_and_report_load_without_torch():
    code = ("import sys; import harness.names, harness.records.manifest, harness.launch.options, harness.report.load; "
            "print(sorted(m for m in ('torch', 'fbgemm_gpu') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_names_agree_with_what_uses_them():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from harness import names
    from harness.presets import PRESETS
    from model.embeddings import EMBEDDING_OPTIMIZERS

    assert tuple(PRESETS) == names.PRESET_NAMES
    assert EMBEDDING_OPTIMIZERS == {"exact_adagrad": EmbOptimType.EXACT_ADAGRAD,
                                    "exact_rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                                    "exact_sgd": EmbOptimType.EXACT_SGD}
    assert set(names.OPTIMIZATION_FLAGS) == set(OptimizationsConfig().requested())
