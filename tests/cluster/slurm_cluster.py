"""A real Slurm cluster on test hosts (tests/cluster/testhosts.py): munged, slurmctld on a host of
its own, one slurmd a compute host, configured here from scratch in a temporary folder.

    with TestHosts(["ctl", "host0", "host1"]) as hosts, SlurmCluster(hosts, controller="ctl", folder=tmp) as slurm:
        slurm.sbatch("host0", ["--nodes=2", "job.sh"])   # ("COMPLETED", "0:0")

The daemons are the distribution's slurm-wlm (22.05) and munge, run as root in the foreground
with everything (key, socket, state, spool, logs) under `folder`, so this machine's own
/etc/munge and /etc/slurm are neither read nor changed. Slurm's client commands find the cluster
through SLURM_CONF, which `env` carries; a job inherits it, as it inherits the submitter's
environment, so the harness inside a job runs exactly as on a real cluster.

No cgroups: process tracking by /proc (proctrack/linuxproc), no task binding (task/none),
whole nodes per job (select/linear).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.cluster.testhosts import TestHosts

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "salloc", "scontrol", "sinfo", "scancel")


class SlurmUnavailable(RuntimeError):
    """Slurm or munge is not installed, or the cluster did not come up; the message says which."""


def missing_programs() -> list[str]:
    return [p for p in DAEMONS if shutil.which(p) is None]


class SlurmCluster:
    __test__ = False

    def __init__(self, hosts: TestHosts, *, controller: str, folder: Path, cpus: int | None = None) -> None:
        self.hosts = hosts
        self.controller = controller
        self.compute = [n for n in hosts if n != controller]
        self.folder = Path(folder)
        self.cpus = cpus or os.cpu_count() or 1
        self.conf = self.folder / "slurm.conf"
        self.socket = self.folder / "munge" / "munge.socket"
        self._procs: list[tuple[str, subprocess.Popen]] = []

    @property
    def env(self) -> dict[str, str]:
        """This environment plus what Slurm's client commands need to find this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _config(self) -> str:
        f, ctl = self.folder, self.hosts[self.controller]
        nodes = "".join(f"NodeName={n} NodeAddr={self.hosts[n].addr} CPUs={self.cpus} State=UNKNOWN\n" for n in self.compute)
        return (
            "ClusterName=dlrmtest\n"
            f"SlurmctldHost={ctl.name}({ctl.addr})\n"
            "SlurmUser=root\nSlurmdUser=root\n"
            "AuthType=auth/munge\nCredType=cred/munge\n"
            f"AuthInfo=socket={self.socket}\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSwitchType=switch/none\nMpiDefault=none\n"
            "SelectType=select/linear\nSchedulerType=sched/builtin\n"
            "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
            "JobCompType=jobcomp/none\n"
            # A test host shares this machine's cores with the others: its hardware is what it is.
            "SlurmdParameters=config_overrides\nReturnToService=2\n"
            f"StateSaveLocation={f}/state\nSlurmdSpoolDir={f}/spool/%n\n"
            f"SlurmctldPidFile={f}/slurmctld.pid\nSlurmdPidFile={f}/slurmd-%n.pid\n"
            f"SlurmctldLogFile={f}/slurmctld.log\nSlurmdLogFile={f}/slurmd-%n.log\n"
            "SlurmctldDebug=info\nSlurmdDebug=info\n"
            "SlurmctldTimeout=30\nSlurmdTimeout=30\nInactiveLimit=0\nMinJobAge=30\nKillWait=5\n"
            f"{nodes}"
            "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        )

    def __enter__(self) -> "SlurmCluster":
        missing = missing_programs()
        if missing:
            raise SlurmUnavailable(f"not installed: {', '.join(missing)} (make test-cluster installs slurm-wlm and munge)")
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self) -> None:
        f = self.folder
        for d in ("munge", "state", *(f"spool/{n}" for n in self.compute)):
            (f / d).mkdir(parents=True, exist_ok=True)
        os.chmod(f / "munge", 0o711)  # clients need to reach the socket; munged checks this
        key = f / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        self.conf.write_text(self._config())
        munged = subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={self.socket}", f"--key-file={key}",
             f"--pid-file={f}/munge/munged.pid", f"--log-file={f}/munge/munged.log", f"--seed-file={f}/munge/seed"],
            stdout=subprocess.DEVNULL, stderr=open(f / "munged.err", "w"))
        self._procs.append(("munged", munged))
        self._wait(lambda: self.socket.exists(), "munged's socket", munged)
        ctl = self.hosts[self.controller].popen(["slurmctld", "-D", "-i", "-f", str(self.conf)], env=self.env,
                                                stdout=subprocess.DEVNULL, stderr=open(f / "slurmctld.err", "w"))
        self._procs.append(("slurmctld", ctl))
        for n in self.compute:
            d = self.hosts[n].popen(["slurmd", "-D", "-f", str(self.conf), "-N", n], env=self.env,
                                    stdout=subprocess.DEVNULL, stderr=open(f / f"slurmd-{n}.err", "w"))
            self._procs.append((f"slurmd {n}", d))
        self._wait(self._all_idle, f"nodes {', '.join(self.compute)} idle in sinfo", None, timeout_s=60)

    def _all_idle(self) -> bool:
        for name, proc in self._procs:
            if proc.poll() is not None:
                raise SlurmUnavailable(f"{name} exited with code {proc.returncode}; see {self.folder}")
        out = self.run(self.compute[0], ["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True)
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        return out.returncode == 0 and all(states.get(n) == "idle" for n in self.compute)

    def _wait(self, ready, what: str, proc: subprocess.Popen | None, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if proc is not None and proc.poll() is not None:
                raise SlurmUnavailable(f"{what}: the daemon exited with code {proc.returncode}; see {self.folder}")
            if time.monotonic() > deadline:
                raise SlurmUnavailable(f"{what}: not ready after {timeout_s:.0f} s; see the logs in {self.folder}")
            time.sleep(0.3)

    def run(self, host: str, cmd: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        """A Slurm client command (or anything) on `host`, with SLURM_CONF set."""
        return self.hosts[host].run(cmd, env={**self.env, **kwargs.pop("env", {})}, **kwargs)

    def popen(self, host: str, cmd: Sequence[str], **kwargs) -> subprocess.Popen:
        return self.hosts[host].popen(cmd, env={**self.env, **kwargs.pop("env", {})}, **kwargs)

    def sbatch(self, host: str, args: Sequence[str], *, timeout_s: float = 300) -> tuple[str, str]:
        """Submit from `host` and wait for the job to end: (JobState, ExitCode) as scontrol shows
        them, e.g. ("COMPLETED", "0:0"). Polled twice a second: `sbatch --wait` backs off to 32 s
        between polls, which would double a short job's time."""
        sub = self.run(host, ["sbatch", "--parsable", *args], capture_output=True, text=True, timeout=60)
        if sub.returncode != 0:
            raise RuntimeError(f"sbatch failed: {sub.stderr.strip()}")
        job = sub.stdout.strip().split(";")[0]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            show = self.run(host, ["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=30)
            fields = dict(f.split("=", 1) for f in show.stdout.split() if "=" in f)
            if fields.get("JobState") not in (None, "PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                return fields["JobState"], fields.get("ExitCode", "?")
            time.sleep(0.5)
        self.run(host, ["scancel", job])
        raise TimeoutError(f"job {job} not done after {timeout_s:.0f} s")

    def stop(self) -> None:
        for _, proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
        for _, proc in reversed(self._procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()

    def logs(self) -> Mapping[str, str]:
        """Every daemon log, by file name (for a failing test's message)."""
        return {p.name: p.read_text(errors="replace")[-3000:] for p in sorted(self.folder.glob("*.log"))
                + sorted(self.folder.glob("*.err")) + sorted((self.folder / "munge").glob("*.log"))}
