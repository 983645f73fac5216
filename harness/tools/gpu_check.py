"""`make gpu-check`: the GPU battery, one line a check and a verdict.

The battery is every test marked `cuda` under tests/ (tests/gpu/ holds the ones written for it;
other files carry CUDA variants of CPU tests). Each check is named by its test's one-line
docstring. On a machine without CUDA it says so in one line and exits 0: there is nothing to
check, and that is not a failure of the project (CI runs here). On a GPU host the exit status is
1 when a check failed, else 0.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class CheckResult:
    name: str
    """The test's one-line docstring (file::test when it has none)."""
    outcome: str
    """passed, failed or skipped."""
    reason: str = ""
    """For a failure or a skip: its last line."""


def result_line(r: CheckResult) -> str:
    word = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}[r.outcome]
    return f"{word} {r.name}" + (f": {r.reason}" if r.reason and r.outcome != "passed" else "")


def verdict(results: Sequence[CheckResult]) -> tuple[str, int]:
    """(the last line, the exit status)."""
    n = {k: sum(r.outcome == k for r in results) for k in ("passed", "failed", "skipped")}
    counts = f"{n['passed']} passed, {n['failed']} failed, {n['skipped']} skipped"
    if n["failed"]:
        return f"gpu-check: NOT READY ({counts}): send this output and the failing tests' logs", 1
    if not n["passed"]:
        return f"gpu-check: NOTHING CHECKED ({counts}): see the skip reasons", 1
    if n["skipped"]:
        return f"gpu-check: READY where checked ({counts}): the skipped checks need what their reasons say", 0
    return f"gpu-check: READY ({counts})", 0


class _Collector:
    """A pytest plugin: one CheckResult a test, named by its docstring."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.results: list[CheckResult] = []

    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            doc = (getattr(item, "function", None).__doc__ or "").strip() if hasattr(item, "function") else ""
            self.names[item.nodeid] = doc.splitlines()[0] if doc else f"{item.path.name}::{item.name}"

    def pytest_runtest_logreport(self, report) -> None:
        name = self.names.get(report.nodeid, report.nodeid)
        if report.when == "call" or (report.when == "setup" and not report.passed):
            if report.skipped:
                reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
                self.results.append(CheckResult(name, "skipped", reason.removeprefix("Skipped: ")))
            elif report.failed:
                crash = getattr(report.longrepr, "reprcrash", None)  # the exception's own message
                lines = (crash.message if crash else str(report.longrepr)).strip().splitlines()
                self.results.append(CheckResult(name, "failed", lines[0] if lines else "failed"))
            else:
                self.results.append(CheckResult(name, "passed"))


def environment_line() -> str:
    """torch, its CUDA build, fbgemm, and the GPUs this process sees."""
    from importlib import metadata

    import torch

    fbgemm = next((f"{p} {metadata.version(p)}" for p in ("fbgemm-gpu", "fbgemm-gpu-cpu")
                   if _installed(metadata, p)), "no fbgemm")
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    names = ", ".join(sorted(set(gpus))) or "none"
    return f"torch {torch.__version__} (CUDA build {torch.version.cuda}), {fbgemm}, {len(gpus)} GPU(s): {names}"


def _installed(metadata, package: str) -> bool:
    try:
        metadata.version(package)
        return True
    except metadata.PackageNotFoundError:
        return False


def main(argv: list[str] | None = None, *, cuda_available: bool | None = None) -> int:
    """argv: extra pytest arguments; cuda_available: stands in for torch's answer (tests)."""
    import torch

    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        print(f"gpu-check: no CUDA device on this machine ({environment_line()}): nothing to check; "
              "run make gpu-check on a GPU host")
        return 0
    print(environment_line(), flush=True)
    results, code = run_battery(argv)
    for r in results:
        print(result_line(r))
    line, status = verdict(results)
    print(line)
    if code not in (0, 1, 5):  # interrupted, internal or usage error: not a verdict on the GPU
        print(f"gpu-check: pytest stopped with exit code {code}", file=sys.stderr)
        return 2
    return status


def run_battery(argv: list[str] | None = None) -> tuple[list[CheckResult], int]:
    """(a result a check, pytest's exit code): every test marked cuda (make gpu-bench runs it too)."""
    import pytest

    collector = _Collector()
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-m", "cuda", "--no-header", "-rN",
                        str(ROOT / "tests"), *(argv or [])], plugins=[collector])
    return collector.results, code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
