"""The post-install check: this environment's pair passes as the CPU variant, and every way the
two variants get mixed (the facts stood in for) is named."""

from __future__ import annotations

from harness.tools.check_install import main, problems

CPU_PAIR = {"torch": "2.13.0+cpu", "fbgemm-gpu-cpu": "1.8.0"}
CUDA_PAIR = {"torch": "2.13.0+cu126", "fbgemm-gpu": "1.8.0+cu126"}


def test_this_environment_passes_and_the_other_variant_is_flagged():
    # Tests run on the CPU pair here (fbgemm-gpu-cpu, torch 2.13.0+cpu).
    assert problems("requirements-cpu") == []
    flagged = problems("requirements-cuda")
    assert "expected only fbgemm-gpu, found fbgemm packages: ['fbgemm-gpu-cpu==1.8.0']" in flagged
    assert any("is a CPU build; the CUDA variant needs torch built for CUDA" in line for line in flagged)


def test_each_variant_checked_from_its_facts():
    assert problems("requirements-cuda", versions=CUDA_PAIR, torch_cuda="12.6") == []
    assert problems("requirements-cpu", versions=CPU_PAIR, torch_cuda=None) == []
    # A venv made on a CPU host, then CUDA fbgemm installed over it on a GPU host: CPU torch stays.
    (line,) = problems("requirements-cuda", versions={"torch": "2.13.0+cpu", "fbgemm-gpu": "1.8.0"}, torch_cuda=None)
    assert "torch 2.13.0+cpu is a CPU build" in line
    (line,) = problems("requirements-cpu", versions={"torch": "2.13.0+cu126", "fbgemm-gpu-cpu": "1.8.0"},
                       torch_cuda="12.6")
    assert "built for CUDA 12.6" in line
    both = problems("requirements-cuda", versions={**CUDA_PAIR, "fbgemm-gpu-cpu": "1.8.0"}, torch_cuda="12.6")
    assert both == ["expected only fbgemm-gpu, found fbgemm packages: ['fbgemm-gpu==1.8.0+cu126', 'fbgemm-gpu-cpu==1.8.0']"]
    assert problems("requirements-cuda", versions={"torch": "2.14.1", "fbgemm-gpu": "1.8.0"},
                    torch_cuda="13.0") == ["expected torch 2.13.0, found 2.14.1"]


def test_bad_usage_is_exit_2():
    assert main([]) == 2 and main(["requirements-rocm"]) == 2


def test_a_host_interpreter_needs_cuda_torch_and_a_matching_fbgemm_and_warns_off_the_pinned_pair():
    """make ... PY=python3 on a GPU host: torch must have CUDA there and fbgemm-gpu load and be built
    for this torch (fbgemm 1.x with torch 2.(x+5)); another pair than the pinned one warns only."""
    from harness.tools.check_install import host_problems, torch_for_fbgemm

    assert torch_for_fbgemm("1.6.0") == "2.11" and torch_for_fbgemm("1.8.0+cu126") == "2.13"
    bundle = {"torch": "2.11.0+cu130", "fbgemm-gpu": "1.6.0"}  # the first H100 host (../shared/gpu)
    problems, warnings = host_problems(versions=bundle, torch_cuda="13.0", cuda=True, fbgemm_loads=None)
    assert problems == [] and len(warnings) == 1 and "not the pinned pair torch 2.13.0 with fbgemm-gpu 1.8.0" in warnings[0]
    assert host_problems(versions=CUDA_PAIR, torch_cuda="12.6", cuda=True, fbgemm_loads=None) == ([], [])
    problems, _ = host_problems(versions={"torch": "2.11.0", "fbgemm-gpu": "1.6.0"}, torch_cuda=None, cuda=True,
                                fbgemm_loads=None)
    assert problems == ["torch 2.11.0 is a CPU build on a machine with a GPU: give PY an interpreter whose torch "
                        "is built for CUDA"]
    problems, _ = host_problems(versions={"torch": "2.13.0+cu126", "fbgemm-gpu": "1.6.0"}, torch_cuda="12.6",
                                cuda=True, fbgemm_loads="OSError: undefined symbol: _ZN3c10")
    assert problems == ["fbgemm-gpu 1.6.0 does not load: OSError: undefined symbol: _ZN3c10",
                        "fbgemm-gpu 1.6.0 is built for torch 2.11, this is torch 2.13.0+cu126"]
    assert host_problems(versions={"torch": "2.13.0"}, torch_cuda="12.6", cuda=True,
                         fbgemm_loads=None)[0][-1].startswith("no fbgemm-gpu in this interpreter")
    assert main(["--host"]) == 0  # this interpreter: the pinned CPU pair, no GPU asked for
