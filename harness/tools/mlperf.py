"""`make mlperf DATA=dir`: the MLPerf DLRM-DCNv2 run on the files at DATA, as `make bench` runs.

One epoch of the training days at most (the iterations they hold), an evaluation every 0.05 of
it (20 an epoch, as the MLPerf reference does) and at the end, stopping at the first to reach the
target AUROC (MLPerf's 0.80275 unless --target-auc says otherwise), with the MLPerf result log in
the run folder. Every other bench option (preset, layout, optimization flags) passes through;
--iters or --eval-every given explicitly win over the epoch's.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys

from harness.cli import build_parser
from harness.cli import main as cli_main
from harness.data.criteo_files import CriteoFiles
from harness.launch.options import config_from_args

MLPERF_TARGET_AUC = 0.80275
EVALS_AN_EPOCH = 20


def given(argv: list[str], option: str) -> bool:
    """Whether the command line gives `option` (as `--opt V` or `--opt=V`)."""
    return any(a == option or a.startswith(option + "=") for a in argv)


def parse_bench(argv: list[str]) -> argparse.Namespace:
    """The bench parser's reading of `argv`; its errors say `harness mlperf`, the command the user ran."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(["bench", *argv])
    except SystemExit as exc:
        sys.stderr.write(err.getvalue().replace("harness bench: error:", "harness mlperf: error:"))
        raise exc


def mlperf_argv(argv: list[str]) -> list[str]:
    """The bench command line of an MLPerf run (raises ValueError, or SystemExit from argparse)."""
    if not any(a == "--data" or a.startswith("--data=") for a in argv):
        raise ValueError("make mlperf needs DATA=<folder of MLPerf-layout files> (--data)")
    # Provisional --eval-every: the config refuses a target without one, and the real value
    # depends on the files this config opens.
    probe = [*argv, *([] if given(argv, "--eval-every") else ["--eval-every", "1"])]
    cfg = config_from_args(parse_bench(probe))
    if given(argv, "--eval-every") and not cfg.evaluation.every_samples:
        raise ValueError("--eval-every 0 turns evaluation off, and an MLPerf run stops at the evaluation that reaches "
                         "its target: give a positive --eval-every, or leave it out for 20 an epoch")
    files = CriteoFiles(cfg.data.path, cfg.model, cfg.data.global_batch_size)
    extra = ["--warmup", "0"] if not given(argv, "--warmup") else []
    if not given(argv, "--iters"):
        extra += ["--iters", str(files.train_batches)]
    if not given(argv, "--eval-every"):
        extra += ["--eval-every", str(max(1, files.train_rows // EVALS_AN_EPOCH))]
    if not given(argv, "--target-auc"):
        extra += ["--target-auc", str(MLPERF_TARGET_AUC)]
    return ["bench", *argv, *extra]


def main(argv: list[str] | None = None) -> int:
    try:
        bench = mlperf_argv(list(sys.argv[1:] if argv is None else argv))
    except ValueError as exc:  # a config the harness refuses, or files it cannot read (DataError)
        sys.stderr.write(f"harness mlperf: error: {exc}\n")
        return 2
    print("harness " + " ".join(bench), flush=True)
    return cli_main(bench)


if __name__ == "__main__":
    sys.exit(main())
