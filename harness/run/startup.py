"""Where a rank's seconds go outside its timed iterations (RankInfo.startup_s).

On the first H100 host each run took 20-25 s beside its iterations: with one GPU session's
minutes that decides how many runs it can make, and nothing said where they went. The phases,
in the order a rank passes them:

- imports: from the process's start (Linux /proc) to the rank's entry: the interpreter, torch,
  fbgemm-gpu (and CUDA's libraries), the harness, the manifest read; 0 for a rank run in the
  launcher's own process (the in-process launch), which paid them before, and a few hundredths of
  a second for one forked from the launcher's fork server (a CPU local simulation:
  harness/launch/fork_server.py), which imported them once for every run of the launcher;
- process_group: the process group's start (on CUDA it binds the rank's GPU: the CUDA context);
- probes: the GEMM and copy rates measured at start (harness/run/peaks.py);
- build: the batch source, the sharded tables and the dense arch, their optimizers;
- loop: every iteration, warm-up included, and the last records' write.
"""

from __future__ import annotations

import os
import time

from harness.names import STARTUP_PHASES


def process_age_s() -> float | None:
    """Seconds since this process started, from /proc (to a clock tick); None where there is none."""
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rpartition(")")[2].split()  # the name may hold spaces and parentheses
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        start_ticks = int(after_name[19])  # field 22, starttime: ticks after boot; after_name starts at field 3
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class StartupClock:
    """Made at the rank's entry; `lap(phase)` ends a phase, timed from the previous lap."""

    def __init__(self, *, in_process: bool = False) -> None:
        age = 0.0 if in_process else process_age_s()
        self.phases: dict[str, float] = {} if age is None else {"imports": age}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        if phase not in STARTUP_PHASES:
            raise ValueError(f"unknown start-up phase {phase!r}: one of {', '.join(STARTUP_PHASES)}")
        now = time.perf_counter()
        self.phases[phase] = now - self._last
        self._last = now
