"""The post-install check sees this environment's torch/fbgemm pair as pinned, and only that one."""

from __future__ import annotations

from harness.check_install import EXPECTED_FBGEMM, main, problems


def test_this_environment_passes_and_the_other_fbgemm_is_flagged():
    # Tests run on the CPU pair here (fbgemm-gpu-cpu, torch 2.13.0).
    assert problems(EXPECTED_FBGEMM["requirements-cpu"]) == []
    (line,) = problems(EXPECTED_FBGEMM["requirements-cuda"])
    assert "expected only fbgemm-gpu, found fbgemm packages: ['fbgemm-gpu-cpu==1.8.0']" == line


def test_bad_usage_is_exit_2():
    assert main([]) == 2 and main(["requirements-rocm"]) == 2
