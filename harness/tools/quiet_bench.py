"""A bench run inside another tool (precision-perf, perf-dynamic): its screen output swallowed,
its run loaded for the tool's own figures, a failure stopping the tool in one line."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path


def run_bench(argv: list[str], runs_root: Path, *, tool: str):
    """`harness bench argv` into runs_root; its run (harness.report.api.Run). Raises SystemExit naming
    `tool` when the run fails (its records stay in runs_root)."""
    from harness import cli
    from harness.report import api as report

    with contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(["bench", *argv, "--runs-root", str(runs_root)])
    if code != 0:
        raise SystemExit(f"{tool}: a bench run failed (exit {code}); its records are in {runs_root}")
    return report.load_run(report.resolve_run(runs_root, "latest"))
