"""The cluster tests (make test-cluster): real hosts as network namespaces, real torchrun per host,
a real Slurm. Left out of `make test` (pytest.ini deselects the `cluster` mark)."""

from __future__ import annotations

import functools
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster.testhosts import unavailable_reason

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _hosts_reason() -> str | None:
    return unavailable_reason()


@pytest.fixture(autouse=True)
def _needs_test_hosts():
    reason = _hosts_reason()
    if reason:
        pytest.skip(reason)


def bench_argv(*, nodes: int, run_id: str, runs: Path, iters: int | None = None, opts: str = "") -> list[str]:
    """`make bench` for tiny at NODES x 2, its run folder under `runs` (shared by every test host)."""
    return ["make", "--no-print-directory", "bench", "PRESET=tiny", f"NODES={nodes}", "GPUS_PER_NODE=2",
            f"RUN_ID={run_id}", *([f"ITERS={iters}"] if iters else []), f"OPTS=--runs-root {runs} {opts}".strip()]


def start_on_hosts(hosts, names: list[str], argv: list[str], logs: Path) -> list[subprocess.Popen]:
    """`argv` on each host, as the README says a multi-host run starts: MASTER_ADDR the first host,
    NODE_RANK the host's place; output to logs/<host>.log."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for k, name in enumerate(names):
        env = {**os.environ, "MASTER_ADDR": names[0], "NODE_RANK": str(k)}
        procs.append(hosts[name].popen(argv, env=env, cwd=ROOT, stdout=open(logs / f"{name}.log", "w"),
                                       stderr=subprocess.STDOUT))
    return procs


def wait_all(procs: list[subprocess.Popen], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"not done after {timeout_s:.0f} s") from None
    return codes


def tails(logs: Path) -> str:
    return "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-2500:] for p in sorted(logs.glob("*.log")))
