"""make data-perf: the loader's samples/s set against a bench run's training samples/s."""

from __future__ import annotations

import re

import pytest

from tests.report_builders import iter_run


def test_loader_is_set_against_a_runs_training_rate(tmp_path, capsys):
    from harness.tools.data_perf import main

    # 2 ranks of 4 samples, 100 ms an iteration: 8 samples / 0.1 s = 80 samples/s, by hand.
    iter_run(tmp_path, "r1", {0: [100.0, 100.0], 1: [100.0, 100.0]})
    assert main(["--preset", "tiny", "--batches", "2", "--against-run", "r1", "--runs-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    files = float(re.search(r"files ([\d,]+) samples/s", out).group(1).replace(",", ""))
    line = next(l for l in out.splitlines() if l.startswith("training, run r1 (tiny, 2 ranks, global batch 8)"))
    assert ": 80 samples/s;" in line
    # The printed files rate is rounded to whole samples/s and the ratio to 0.1, so the ratio is checked
    # within both roundings rather than by re-deriving its printed digits (x2,403.6 vs x2,403.7 once).
    ratio = float(re.search(r"the loader is x([\d,.]+) that", line).group(1).replace(",", ""))
    assert abs(ratio - files / 80) <= 0.5 / 80 + 0.05 + 1e-9
    assert "(goal >= x5: met)" in line


def test_an_unknown_run_is_one_line_before_any_timing(tmp_path, capsys):
    from harness.tools.data_perf import main

    with pytest.raises(SystemExit) as exc:
        main(["--preset", "tiny", "--against-run", "nope", "--runs-root", str(tmp_path)])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert "generating" not in captured.out and "no runs under" not in captured.out
    assert captured.err.strip().splitlines()[-1].endswith(f"no run 'nope' under {tmp_path}/; runs there: "
                                                          "none (make one with `make bench`)")
