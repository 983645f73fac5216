"""Starting the rank processes: which launcher, with what command, and running it.

Three ways, picked by what the environment says:

- inside a Slurm allocation (SLURM_JOB_ID): `srun` starts one torchrun per node (c10d
  rendezvous on the first node of the allocation);
- with a rendezvous endpoint (--rdzv-endpoint, or MASTER_ADDR) and a node rank (--node-rank,
  or NODE_RANK): torchrun for this node (static rendezvous); the same command runs on each host;
- otherwise a local simulation: nodes x ranks processes on this machine over loopback, under
  torch.distributed's elastic agent started in-process (what torchrun runs);
- asked for (--in-process) and with one rank: that rank in the launcher's own process, no process
  started (gpu-bench's runs on one GPU: each spawned rank paid the interpreter's, torch's and
  CUDA's start again, 10 s and more of a run on the first H100 host).

Every way ends in the same rank entry point, `python -m harness worker` / harness.run.worker.run_rank.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.config import BenchConfig
from harness.launch import fork_server
from harness.records.writer import exit_description, rank_errors, wait_for_ranks_to_settle

DEFAULT_PORT = 29500


class LaunchFailed(RuntimeError):
    """One or more ranks failed; the message names them and their errors."""


@dataclass(frozen=True)
class Launch:
    mode: str
    """local-simulation, slurm, torchrun or in-process."""
    nodes: int
    nproc_per_node: int
    endpoint: str
    """host:port of the rendezvous."""
    node_rank: int | None = None
    """This host's node (torchrun mode)."""
    env: dict[str, str] = field(default_factory=dict)
    """Set for every rank (e.g. NCCL settings)."""
    cpus_per_node: int | None = None
    """Slurm: the CPUs the job holds on each node (the fewest, when they differ), all given to that
    node's one srun task; None when Slurm does not say."""
    start_method: str | None = None
    """Local simulation: how each rank's process begins, spawn or forkserver (harness/launch/fork_server.py);
    None in the other modes (torchrun or srun start the ranks, or they run in this process)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_head_node(environ: Mapping[str, str]) -> str:
    """First host of the allocation, as `scontrol show hostnames` expands SLURM_JOB_NODELIST (run
    with `environ`, so its PATH and SLURM_CONF). A ValueError (one line) names what is missing: the
    rendezvous endpoint goes to torchrun as it is, with no shell to expand anything."""
    job = environ.get("SLURM_JOB_ID", "?")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise ValueError(f"inside Slurm job {job} but SLURM_JOB_NODELIST is not set, so the first node (the "
                         "rendezvous host) is unknown: run make bench in the sbatch script or the salloc shell")
    scontrol = shutil.which("scontrol", path=environ.get("PATH"))
    if scontrol is None:
        raise ValueError(f"inside Slurm job {job} but scontrol is not on PATH: it is needed to expand "
                         f"SLURM_JOB_NODELIST={nodelist} into the first node's name")
    try:
        out = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=30, env=dict(environ))
    except (OSError, subprocess.SubprocessError) as exc:
        raise ValueError(f"`scontrol show hostnames {nodelist}` could not run: {exc}") from None
    hosts = out.stdout.split()
    if out.returncode != 0 or not hosts:
        said = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}, no host names"])[-1]
        raise ValueError(f"`scontrol show hostnames {nodelist}` failed: {said}")
    return hosts[0]


def slurm_cpus_per_node(environ: Mapping[str, str]) -> int | None:
    """The fewest CPUs the job holds on any of its nodes, from SLURM_JOB_CPUS_PER_NODE ('72(x2)',
    '36,72(x3)'); None when unset or unreadable (srun then uses its own default)."""
    counts = []
    for part in environ.get("SLURM_JOB_CPUS_PER_NODE", "").split(","):
        m = re.fullmatch(r"\s*(\d+)(\(x\d+\))?\s*", part)
        if not m:
            return None
        counts.append(int(m.group(1)))
    return min(counts) if counts else None


def srun_argv(launch: Launch, run_dir: Path, run_id: str) -> list[str]:
    """One srun task a node, each running that node's torchrun. The task gets every CPU the job
    holds there: a step's task otherwise gets one CPU, and under task/affinity or task/cgroup the
    node's torchrun and all its ranks would share that one core."""
    cpus = [f"--cpus-per-task={launch.cpus_per_node}"] if launch.cpus_per_node else []
    return ["srun", f"--nodes={launch.nodes}", "--ntasks-per-node=1", *cpus, "--kill-on-bad-exit=1",
            *torchrun_argv(launch, run_dir, run_id, None)]


def check_slurm_step(environ: Mapping[str, str]) -> None:
    """The harness starts the job's srun itself, once: a bench started as an srun task (one a node)
    would start one job step per task. A ValueError (one line) when that is what happened, or when
    srun is missing."""
    if "SLURM_STEP_ID" in environ:  # set in an srun task's environment, not in a batch script's or salloc's
        raise ValueError(f"this bench is itself an srun task (SLURM_STEP_ID={environ['SLURM_STEP_ID']}); start "
                         "make bench once, in the sbatch script or the salloc shell: it runs srun itself")
    if shutil.which("srun", path=environ.get("PATH")) is None:
        raise ValueError(f"inside Slurm job {environ.get('SLURM_JOB_ID', '?')} but srun is not on PATH: "
                         "the harness starts one torchrun a node with it")


def choose_launch(
    cfg: BenchConfig, *, environ: Mapping[str, str], rdzv_endpoint: str | None, node_rank: int | None,
    in_process: bool = False, start_method: str | None = None,
) -> Launch:
    """Which launcher; a ValueError (one line) when the environment is inconsistent with the config
    (or start_method, which only a local simulation takes, is given to another)."""
    launch = _choose(cfg, environ=environ, rdzv_endpoint=rdzv_endpoint, node_rank=node_rank, in_process=in_process)
    if launch.mode != "local-simulation":
        if start_method is not None:
            raise ValueError(f"--start-method is how a local simulation starts its ranks; this run is "
                             f"{launch.mode}: drop --start-method")
        return launch
    from harness.run.device import uses_cuda  # torch: not for the launcher's other modes

    chosen = start_method or fork_server.start_method(uses_cuda(cfg.run.device))
    return dataclasses.replace(launch, start_method=chosen)


def _choose(cfg: BenchConfig, *, environ: Mapping[str, str], rdzv_endpoint: str | None, node_rank: int | None,
            in_process: bool) -> Launch:
    nodes, g = cfg.run.nodes, cfg.run.gpus_per_node
    # A rank whose NCCL collective fails or times out tears the job down instead of hanging
    # (gloo ignores it). TORCH_NCCL_AVOID_RECORD_STREAMS is the worker's, set when that flag is on.
    env = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    if in_process:
        check_in_process(cfg, environ=environ, rdzv_endpoint=rdzv_endpoint, node_rank=node_rank)
        return Launch("in-process", 1, 1, f"127.0.0.1:{free_port()}", None, env)
    if rdzv_endpoint or "MASTER_ADDR" in environ:
        endpoint = rdzv_endpoint or f"{environ['MASTER_ADDR']}:{environ.get('MASTER_PORT', DEFAULT_PORT)}"
        if node_rank is None and "NODE_RANK" not in environ:
            raise ValueError(f"a rendezvous endpoint ({endpoint}) is set but no node rank: pass --node-rank K "
                             f"or NODE_RANK=K (0..{nodes - 1}) on each host")
        k = node_rank if node_rank is not None else int(environ["NODE_RANK"])
        if not 0 <= k < nodes:
            raise ValueError(f"node rank {k} is outside 0..{nodes - 1} for NODES={nodes}")
        if ":" not in endpoint:
            endpoint = f"{endpoint}:{DEFAULT_PORT}"
        return Launch("torchrun", nodes, g, endpoint, k, env)
    if "SLURM_JOB_ID" in environ:
        have = int(environ.get("SLURM_JOB_NUM_NODES", environ.get("SLURM_NNODES", "1")))
        if have < nodes:
            raise ValueError(f"NODES={nodes} but this Slurm allocation has {have} node(s); ask salloc/sbatch for {nodes}")
        check_slurm_step(environ)
        return Launch("slurm", nodes, g, f"{slurm_head_node(environ)}:{DEFAULT_PORT}", None, env,
                      cpus_per_node=slurm_cpus_per_node(environ))
    return Launch("local-simulation", nodes, g, f"127.0.0.1:{free_port()}", None, env)


def torchrun_argv(launch: Launch, run_dir: Path, run_id: str, node_rank: int | str | None) -> list[str]:
    """torchrun for one node. Static rendezvous when the node rank is known (it fixes which
    ranks live on which node), c10d (nodes join in any order) under Slurm."""
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={launch.nodes}",
            f"--nproc-per-node={launch.nproc_per_node}", "--max-restarts=0"]
    host, port = launch.endpoint.rsplit(":", 1)
    if node_rank is None:
        argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={launch.endpoint}", f"--rdzv-id={run_id}"]
    else:
        argv += [f"--node-rank={node_rank}", f"--master-addr={host}", f"--master-port={port}"]
    return argv + ["-m", "harness", "worker", "--run-dir", str(run_dir)]


def node_commands(launch: Launch, run_dir: Path, run_id: str) -> list[str]:
    """What each node runs, as shell lines (the dry run prints these)."""
    env = " ".join(f"{k}={v}" for k, v in launch.env.items())
    prefix = f"{env} " if env else ""
    if launch.mode == "slurm":
        line = shlex.join(srun_argv(launch, run_dir, run_id))
        return [f"node {k} (one srun task): {prefix}{line}" for k in range(launch.nodes)]
    if launch.mode == "torchrun":
        return [f"node {k}: {prefix}{shlex.join(torchrun_argv(launch, run_dir, run_id, k))}" for k in range(launch.nodes)]
    if launch.mode == "in-process":
        return [f"node 0: rank 0 in the launcher's own process (--in-process), {prefix}RANK=0 WORLD_SIZE=1"]
    real = Launch("torchrun", launch.nodes, launch.nproc_per_node, f"NODE0_HOST:{DEFAULT_PORT}", None, launch.env)
    return [
        f"node {k} (simulated here by ranks {k * launch.nproc_per_node}..{(k + 1) * launch.nproc_per_node - 1}; "
        f"on a cluster, with NODE0_HOST the first node: MASTER_ADDR=NODE0_HOST NODE_RANK={k} RUN_ID=<id> make bench ...): "
        f"{prefix}{shlex.join(torchrun_argv(real, run_dir, run_id, k))}"
        for k in range(launch.nodes)
    ]


def check_in_process(cfg: BenchConfig, *, environ: Mapping[str, str], rdzv_endpoint: str | None,
                     node_rank: int | None) -> None:
    """--in-process: one rank, on this host, on Linux (the run's memory peak is the process's since
    the rank began: harness/run/peaks.own_peak_unavailable); a ValueError (one line) otherwise."""
    if cfg.run.world_size != 1:
        raise ValueError(f"--in-process runs one rank in this process; this run has {cfg.run.world_size} "
                         f"({cfg.run.nodes} node(s) x {cfg.run.gpus_per_node}): drop --in-process")
    launched = [what for what, there in (("--rdzv-endpoint", rdzv_endpoint), ("--node-rank", node_rank is not None),
                                         ("MASTER_ADDR", "MASTER_ADDR" in environ),
                                         ("SLURM_JOB_ID", "SLURM_JOB_ID" in environ)) if there]
    if launched:
        raise ValueError(f"--in-process starts no launcher, but {', '.join(launched)} asks for one: "
                         "drop one or the other")
    from harness.run.peaks import own_peak_unavailable
    why = own_peak_unavailable()
    if why:
        raise ValueError(f"--in-process needs a memory peak of the run's own (/proc/self/clear_refs, VmHWM); "
                         f"here: {why}: drop --in-process")


def run(launch: Launch, run_dir: Path, *, run_id: str) -> None:
    """Start the ranks and wait; raise LaunchFailed naming the failed ranks and their errors."""
    if launch.mode == "in-process":
        _run_in_process(launch, run_dir)
        return
    if launch.mode == "local-simulation":
        _run_local(launch, run_dir, run_id)
        return
    if launch.mode == "slurm":
        argv = srun_argv(launch, run_dir, run_id)
    else:
        argv = torchrun_argv(launch, run_dir, run_id, launch.node_rank)
    # torchrun makes a /tmp/torchelastic_* folder a launch and leaves it: point its temp files into
    # one of ours, removed when it ends.
    with tempfile.TemporaryDirectory(prefix="harness-launch-") as tmp:
        code, tail = run_teeing_stderr(argv, env={**os.environ, **launch.env, "TMPDIR": tmp})
    if code != 0:
        wait_for_ranks_to_settle(run_dir)
        errors = rank_errors(run_dir)
        cause = last_exception_line(tail)
        raise LaunchFailed("; ".join(errors) if errors else
                           f"{launch.mode} exited with code {code}" + (f": {cause}" if cause else ""))


def run_teeing_stderr(argv: list[str], *, env: Mapping[str, str], keep: int = 200) -> tuple[int, list[str]]:
    """Run `argv`; its stderr goes on to ours line by line as it comes, and its last `keep` lines
    come back, so a launcher that fails before any rank starts (a port in use, a rendezvous
    timeout) can be named by its own error."""
    tail: collections.deque[str] = collections.deque(maxlen=keep)
    with subprocess.Popen(argv, env=dict(env), stderr=subprocess.PIPE, text=True, errors="replace") as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write(line)
            tail.append(line.rstrip("\n"))
    return proc.returncode, list(tail)


EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*")


def last_exception_line(lines: list[str]) -> str | None:
    """The last line that reads as a Python exception ('torch.distributed.DistNetworkError: ...')."""
    for line in reversed(lines):
        if EXCEPTION_LINE.match(line.strip()):
            return line.strip()
    return None


def _run_local(launch: Launch, run_dir: Path, run_id: str) -> None:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    # A failed rank's traceback is in its error.txt and the run's status names it in one line: the
    # agent's own ERROR log of the same traceback (~30 lines a rank) and the SIGTERM notice of the
    # ranks it stops would only bury that line.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    logging.getLogger("torch.multiprocessing").setLevel(logging.ERROR)
    os.environ.update(launch.env)  # inherited by the ranks, spawned or forked (fork_server.ready_server)
    # The agent's log folder (error files of failed ranks) would otherwise be a /tmp/torchelastic_*
    # left behind by every run; the ranks' own errors are in the run folder.
    # One agent, no restarts: torchrun's static rendezvous. The c10d one records each of its steps
    # with two inspect.stack() calls, reading every frame's source: 2.4 s of a profiled 8.5 s launch here.
    with tempfile.TemporaryDirectory(prefix="harness-elastic-") as logs:
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=launch.nodes * launch.nproc_per_node, run_id=run_id,
            rdzv_backend="static", rdzv_configs={"rank": 0}, rdzv_endpoint=launch.endpoint, max_restarts=0,
            monitor_interval=0.1,
            start_method=launch.start_method, logs_specs=DefaultLogsSpecs(log_dir=logs),
        )
        if launch.start_method == "forkserver":
            # elastic_launch sets this in our environment before it starts the ranks; set here first,
            # the server starts with it, as a spawned rank would, and the next run need not replace it.
            os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = config.signals_to_handle
            fork_server.ready_server()
        _launch_elastic(config, run_dir)


def _run_in_process(launch: Launch, run_dir: Path) -> None:
    """The one rank, here (harness/run/worker.run_in_process puts back what it set process-wide)."""
    from harness.run.worker import run_in_process

    host, port = launch.endpoint.rsplit(":", 1)
    env = {**launch.env, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": host, "MASTER_PORT": port}
    try:
        run_in_process(str(run_dir), env)
    except Exception as exc:  # the rank wrote its error file; name it as a spawned rank's would be
        errors = rank_errors(run_dir)
        raise LaunchFailed("; ".join(errors) if errors else f"rank 0: {type(exc).__name__}: {exc}") from None


def _launch_elastic(config, run_dir: Path) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from harness.run.worker import run_rank

    try:
        elastic_launch(config, run_rank)(str(run_dir), os.getpid())
    except ChildFailedError as exc:
        # The ranks' own error files say what happened; the agent's exit codes name a rank that
        # died without writing one (killed), which is the cause the others' errors follow from.
        errors = rank_errors(run_dir, {r: f.exitcode for r, f in exc.failures.items()})
        failures = "; ".join(f"rank {r}: {exit_description(f.exitcode)}" for r, f in sorted(exc.failures.items()))
        raise LaunchFailed("; ".join(errors) if errors else failures) from None
