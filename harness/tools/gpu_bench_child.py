"""gpu-bench's work in a process of its own: the battery, whose tests' CUDA state and settings
must stay out of the bench's process (its in-process runs would start on them), and any check
that may leave a device unusable (gpu_bench.run_draw_check)."""

from __future__ import annotations

import contextlib
import io
import multiprocessing
from dataclasses import asdict
from pathlib import Path

from harness.tools.gpu_bench_plan import Outcome


def in_child(fn, *args):
    """fn(*args) in a spawned process of its own (not a daemon: the battery's checks start rank
    processes of their own), its value sent back; a RuntimeError if it died without one."""
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_answer, args=(there, fn, args), name="gpu-bench-child")
    child.start()
    there.close()
    try:
        return here.recv()
    except EOFError:
        pass
    finally:
        child.join()
    raise RuntimeError(f"its process died without an answer (exit code {child.exitcode})")


def _answer(conn, fn, args) -> None:
    conn.send(fn(*args))
    conn.close()


def battery_in_child() -> tuple[list, int, str]:
    """The battery (every test marked cuda) in a process of its own: (results, pytest's exit code,
    its output). Its tests' CUDA state and settings stay out of this process, whose in-process runs
    would otherwise start on them."""
    return in_child(_battery)


def _battery() -> tuple[list, int, str]:
    from harness.tools.gpu_check import run_battery as battery

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        results, code = battery([])
    return results, code, out.getvalue()


def run_battery(outcome: Outcome, battery=battery_in_child) -> None:
    """battery: what runs it (tests give a stand-in)."""
    from harness.tools.gpu_check import result_line, verdict

    results, code, output = battery()
    lines = [result_line(r) for r in results]
    outcome.battery_verdict, status = verdict(results)
    if status or code not in (0, 1, 5):  # pytest: 1 tests failed, 5 none collected; else it could not run them
        outcome.failures.append(f"battery: {outcome.battery_verdict} (pytest exited {code})")
    outcome.checks = [asdict(r) for r in results]
    Path(outcome.folder, "battery.txt").write_text("\n".join([*lines, outcome.battery_verdict, "", output]))
    print("\n".join(lines + [outcome.battery_verdict]), flush=True)
