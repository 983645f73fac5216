"""make gpu-check's runner: its lines and verdict from stand-in results, the no-GPU line here,
and the plugin naming checks by their docstrings on a real (CPU) pytest run."""

from __future__ import annotations

import pytest

from harness.tools.gpu_check import CheckResult, _Collector, main, result_line, verdict


def test_lines_and_verdicts():
    ok, bad = CheckResult("graphed step matches eager", "passed"), CheckResult("a", "failed", "AssertionError: 3 != 4")
    skip = CheckResult("threaded input dist 500 iterations", "skipped", "needs 2 GPUs (2 NCCL ranks)")
    assert result_line(ok) == "PASS graphed step matches eager"
    assert result_line(bad) == "FAIL a: AssertionError: 3 != 4"
    assert result_line(skip) == "SKIP threaded input dist 500 iterations: needs 2 GPUs (2 NCCL ranks)"
    assert verdict([ok]) == ("gpu-check: READY (1 passed, 0 failed, 0 skipped)", 0)
    assert verdict([ok, bad, skip])[1] == 1 and verdict([ok, bad, skip])[0].startswith("gpu-check: NOT READY")
    assert verdict([ok, skip])[0].startswith("gpu-check: READY where checked") and verdict([ok, skip])[1] == 0
    assert verdict([skip]) == ("gpu-check: NOTHING CHECKED (0 passed, 0 failed, 1 skipped): see the skip reasons", 1)


def test_without_cuda_it_says_so_in_one_line(capsys):
    assert main(cuda_available=False) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("gpu-check: no CUDA device on this machine (torch ")


def test_the_plugin_names_each_check_by_its_docstring(tmp_path):
    (tmp_path / "test_fake_battery.py").write_text(
        "import pytest\n"
        "@pytest.mark.cuda\n"
        "def test_one():\n    '''first check\n\n    more words'''\n\n"
        "@pytest.mark.cuda\n"
        "def test_two():\n    '''second check'''\n    assert 1 == 2, 'broken on purpose'\n\n"
        "@pytest.mark.cuda\n"
        "def test_three():\n    pytest.skip('needs 2 GPUs')\n\n"
        "def test_not_in_battery():\n    pass\n")
    collector = _Collector()
    pytest.main(["-q", "-p", "no:cacheprovider", "-m", "cuda", "-W", "ignore::pytest.PytestUnknownMarkWarning",
                 str(tmp_path)], plugins=[collector])
    got = {r.name: (r.outcome, r.reason) for r in collector.results}
    assert got["first check"] == ("passed", "")
    assert got["second check"][0] == "failed" and "broken on purpose" in got["second check"][1]
    assert got["test_fake_battery.py::test_three"] == ("skipped", "needs 2 GPUs")
    assert len(got) == 3
