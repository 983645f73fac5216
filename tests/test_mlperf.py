"""MLPerf mode end to end: generated days, tiny on 2 ranks to a reachable target, the result log
through mlperf-logging's compliance checker (training ruleset 6.0.0)."""

from __future__ import annotations

import json
import subprocess
import sys

from harness.run.mlperf_log import LOG_NAME

# What synthetic data cannot meet, and only that: the closed DLRM-DCNv2 rules want the real held-
# out set (eval_samples == 89,137,319) and an AUROC of at least 0.80275 on it; a small generated
# day has other sizes, and tiny on it stops at the target the test sets.
DATA_RULES = ("eval_samples", "eval_accuracy")


def checker_failures(log) -> list[str]:
    """The first line of each message the checker reports (it joins them with a dashed line into
    one warning); none when the log passes."""
    out = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                          "--ruleset", "6.0.0", "--log_output", str(log.parent / "checker.log"), str(log)],
                         capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    if "WARNING - " not in text:
        assert out.returncode == 0 and "SUCCESS" in text, text
        return []
    report = text.split("WARNING - ", 1)[1].split("ERROR - FAILED", 1)[0]
    assert out.returncode == 1, text
    return [chunk.strip().splitlines()[0] for chunk in report.split("\n" + "-" * 30 + "\n")]


def test_an_mlperf_run_logs_what_the_compliance_checker_accepts(tmp_path, capfd):
    from harness.tools.make_dataset import main as make_dataset
    from harness.tools.mlperf import main

    data = tmp_path / "data"
    assert make_dataset(["--out", str(data), "--rows", "12000", "--days", "2"]) == 0
    runs = tmp_path / "runs"
    assert main(["--preset", "tiny", "--device", "cpu", "--data", str(data), "--target-auc", "0.75",
                 "--runs-root", str(runs)]) == 0
    out = capfd.readouterr().out
    assert "--iters 125" in out and "--eval-every 600" in out  # one epoch of 12000 samples, 20 evaluations
    (run,) = runs.iterdir()
    log = run / LOG_NAME
    lines = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines() if ":::MLLOG" in line]
    keys = [e["key"] for e in lines]
    assert keys[:3] == ["cache_clear", "init_start", "submission_org"] and keys[-1] == "run_stop"
    assert lines[-1]["metadata"]["status"] == "success"
    accuracy = [e["value"] for e in lines if e["key"] == "eval_accuracy"]
    assert accuracy[-1] >= 0.75 and all(a < 0.75 for a in accuracy[:-1])
    failed = checker_failures(log)
    assert failed, "a generated day cannot pass the real-data rules"
    assert all(any(rule in line for rule in DATA_RULES) for line in failed), failed


def test_mlperf_without_data_is_one_line(capsys):
    from harness.tools.mlperf import main

    assert main(["--preset", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "make mlperf needs DATA=" in err
