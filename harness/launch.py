"""Starting the rank processes. Here: local simulation of nodes x ranks on this machine.

The ranks run `harness.worker.run_rank` under torch.distributed's elastic agent (what torchrun
uses), started in-process, so a real multi-node launch (torchrun per node) runs the very same
entry point.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from harness.records import rank_errors
from harness.worker import run_rank


class LaunchFailed(RuntimeError):
    """One or more ranks failed; the message names them and their errors."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_local(run_dir: Path, *, run_id: str, world_size: int) -> None:
    """All ranks as processes of this machine over loopback; returns when all finished, raises if any failed."""
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=world_size,
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    try:
        elastic_launch(config, run_rank)(str(run_dir))
    except ChildFailedError as exc:
        # The ranks' own error files say what happened; the agent's text only says which exited.
        errors = rank_errors(run_dir)
        failures = "; ".join(f"rank {r}: exit code {f.exitcode}" for r, f in sorted(exc.failures.items()))
        raise LaunchFailed("; ".join(errors) if errors else failures) from None
