"""The planner's hardware profile when --hardware leaves it to auto (the default): the device the
run's ranks use, a GPU's by the name CUDA gives it (harness/launch/planning.hardware_profile), and
what the plan line and the manifest say of the choice."""

from __future__ import annotations

import pytest

from harness.config import ShardingConfig
from harness.launch import planning
from harness.presets import mlperf, small


def _on_gpu(monkeypatch, name: str) -> None:
    monkeypatch.setattr(planning, "uses_cuda", lambda requested: True)
    monkeypatch.setattr(planning, "gpu_name", lambda: name)


def test_cpu_ranks_plan_with_the_cpu_profile_and_say_it_was_auto():
    cfg = small()
    assert cfg.sharding.hardware == "auto"
    assert planning.hardware_profile(cfg) == ("cpu", "auto: CPU ranks")
    _, est = planning.make_plan(cfg, ranks_per_host=2)
    assert (est.hardware, est.hardware_source, est.intra_node_latency_us) == ("cpu", "auto: CPU ranks", 150.0)
    assert planning.format_plan(*planning.make_plan(cfg, ranks_per_host=2)).startswith(
        "sharding plan, cpu profile (auto: CPU ranks): ")


@pytest.mark.parametrize("name, profile, memory_gib", [("NVIDIA H200", "h200", 120.0),
                                                       ("NVIDIA H100 80GB HBM3", "h100", 64.0)])
def test_a_gpu_run_plans_with_its_gpus_profile(monkeypatch, name, profile, memory_gib):
    """The hand values of planning.PROFILES: the H200's 120 GiB for tables, the H100's 64 GiB, their
    10 us collectives, against the CPU profile's 150 us."""
    _on_gpu(monkeypatch, name)
    plan, est = planning.make_plan(small(), ranks_per_host=2)
    assert (est.hardware, est.hardware_source) == (profile, f"auto: {name}")
    assert (est.memory_gib, est.intra_node_latency_us) == (memory_gib, 10.0)


def test_a_gpu_no_profile_names_plans_as_an_h100_and_says_so(monkeypatch):
    _on_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB")
    _, est = planning.make_plan(small(), ranks_per_host=2)
    assert est.hardware == "h100" and est.hardware_source == "auto: no profile has NVIDIA A100-SXM4-80GB's name, " \
                                                              "so the H100's"


def test_a_named_profile_wins_whatever_the_device(monkeypatch):
    _on_gpu(monkeypatch, "NVIDIA H200")
    cfg = small().replace(sharding=ShardingConfig(hardware="cpu"))
    assert planning.hardware_profile(cfg) == ("cpu", "")
    assert planning.hardware_profile(mlperf()) == ("h100", "")  # the preset names it
    _, est = planning.make_plan(cfg, ranks_per_host=2)
    assert est.hardware_source == "" and "profile (" not in planning.format_plan(*planning.make_plan(cfg, ranks_per_host=2))
    with pytest.raises(ValueError, match="sharding.hardware 'a100' is not one of \\['auto', 'cpu', 'h100', 'h200'\\]"):
        ShardingConfig(hardware="a100")
