"""The one place that writes run folders (design.md, "Run records").

runs/<run_id>/manifest.json       written first, then updated as the status moves
runs/<run_id>/rankNNNNN/stages-PPPPP.parquet, iterations-PPPPP.parquet   parts written as the run goes
                        (a completed run's compacted into stages-all.parquet, iterations-all.parquet)
runs/<run_id>/rankNNNNN/evals-PPPPP.parquet   one part an evaluation (--eval-every), compacted likewise
runs/<run_id>/rankNNNNN/subspans-PPPPP.parquet   named pieces of a stage (a dynamic table's transform,
                        write-back, fetch), with the flush that has any, compacted likewise
runs/<run_id>/rankNNNNN/dynamic.json  what each dynamic table moved between its slots and the store, and its ID transformer's host memory
runs/<run_id>/rankNNNNN/rank.json  host, device, threads, peak RSS, measured GEMM rate
runs/<run_id>/rankNNNNN/error.txt  the exception, when that rank failed
runs/<run_id>/rankNNNNN/sigterm.txt  every thread's stack, when a SIGTERM ended the rank
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import faulthandler
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from harness.records.manifest import GitState, RankInfo, RunManifest, RunStatus, Versions
from harness.names import COMPACTED, STAGE_OF_PHASE
from harness.run.timeline import StageSpan, SubSpan
from harness.store_url import mask_secrets

REPO_ROOT = Path(__file__).resolve().parents[2]


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


RESERVED_RUN_IDS = ("latest", "ablations", "compares", "README.md")
"""Names the runs folder or `harness report` already give a meaning."""
PLAIN_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_run_id(run_id: str) -> None:
    """One-line refusal of a run id that is not a plain folder name (a path, '..', a reserved word)."""
    if not PLAIN_RUN_ID.fullmatch(run_id) or run_id in RESERVED_RUN_IDS:
        raise ValueError(f"run id {run_id[:60]!r}{'...' if len(run_id) > 60 else ''} is not a plain name: letters, digits "
                         f"and . _ - (not first), at most 128 characters, none of {', '.join(RESERVED_RUN_IDS)}")


def new_run_id(preset: str, nodes: int, gpus_per_node: int) -> str:
    """Sortable by start time, readable, and unique even for runs started in the same second."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{preset}-{nodes}x{gpus_per_node}-{secrets.token_hex(2)}"


FBGEMM_DISTRIBUTIONS = ("fbgemm-gpu", "fbgemm-gpu-cpu", "fbgemm-gpu-nightly", "fbgemm-gpu-nightly-cpu")
"""The names fbgemm_gpu is installed under (CUDA, CPU, nightlies)."""


def fbgemm_version() -> str:
    """fbgemm-gpu's version from its installed metadata: importing it for that costs the launcher,
    which never calls it, a second on 2 cores. Imported where no metadata names it."""
    from importlib import metadata

    for name in FBGEMM_DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    import fbgemm_gpu

    return getattr(fbgemm_gpu, "__version__", "unknown")


def versions() -> Versions:
    import numpy
    import pandas

    cuda = torch.cuda.is_available()
    return Versions(
        python=platform.python_version(), torch=torch.__version__, fbgemm_gpu=fbgemm_version(), numpy=numpy.__version__,
        pandas=pandas.__version__, cuda=torch.version.cuda,
        nccl=".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        gpu=torch.cuda.get_device_name(0) if cuda else None,
    )


def git_state() -> GitState:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return GitState(commit=commit, dirty=None if status is None else bool(status))


def launcher_facts() -> dict[str, Any]:
    """The RunManifest fields the launching process knows about itself (start time, host, versions, git)."""
    return dict(start_time=now_iso(), launcher_host=socket.gethostname(), argv=tuple(sys.argv),
                versions=versions(), git=git_state())


def _write_parquet(table: pa.Table, final: Path) -> None:
    """Written aside and renamed: a rank killed mid-write leaves no torn part for readers, and a full
    disk's half-written file is no record, so its space goes back."""
    tmp = final.parent / f".{final.name}.tmp"
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_text(path: Path, text: str) -> None:
    """Atomic (write then rename) so a reader never sees half a file."""
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


SPACE_RESERVE = ".space-reserve"
"""A file made with the run folder and deleted just before its manifest is closed: a disk that the
records fill up still has room for the final status."""
SPACE_RESERVE_BYTES = 4 << 20


def disk_full(run_dir: Path) -> bool:
    """Whether the run folder's filesystem has (next to) no space left: when it does, the ranks may
    not even have been able to write their errors, so the launcher says it."""
    return shutil.disk_usage(run_dir).free < (1 << 20)


def create_run(runs_root: Path, manifest: RunManifest) -> Path:
    """Make the run's folder (never reused) and write its manifest, which must still be running."""
    if manifest.status.state != "running":
        raise ValueError(f"a new run's status is running, not {manifest.status.state!r}")
    run_dir = Path(runs_root) / manifest.run_id
    run_dir.mkdir(parents=True, exist_ok=False)
    try:
        _write_text(run_dir / "manifest.json", mask_secrets(manifest.to_json()))
        with open(run_dir / SPACE_RESERVE, "wb") as f:
            f.write(bytes(SPACE_RESERVE_BYTES))  # real blocks: a sparse file would reserve nothing
    except BaseException:
        # A folder without its reserve (a disk too full) would stay "running" forever: no run, no folder.
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return run_dir


def read_manifest(run_dir: Path) -> RunManifest:
    return RunManifest.from_json((Path(run_dir) / "manifest.json").read_text())


def compact_parts(run_dir: Path) -> None:
    """A completed run's parts, one file per rank and kind: 3000 iterations flushed every 10 are
    600 files a rank otherwise. Written aside and renamed before the parts go; a reader that finds
    `<kind>-all.parquet` reads only it, so a crash between the two steps loses and doubles nothing."""
    import pandas as pd  # the launcher's; a rank's records are built in pyarrow (RankRecorder)

    for rank_dir in sorted(Path(run_dir).glob("rank*")):
        for kind in ("stages", "iterations", "evals", "subspans"):
            parts = sorted(rank_dir.glob(f"{kind}-[0-9]*.parquet"))
            if len(parts) < 2:
                continue
            # pandas' concat, which takes parts whose columns differ in type (a column all null in one).
            frame = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
            _write_parquet(pa.Table.from_pandas(frame, preserve_index=False), rank_dir / f"{kind}-{COMPACTED}.parquet")
            for part in parts:
                part.unlink()


def finish_run(run_dir: Path, *, error: str | None) -> RunManifest:
    """Status moves to completed or failed; the ranks' own notes (rank.json) are gathered in (a
    note torn by a dying rank or a full disk is left out)."""
    (Path(run_dir) / SPACE_RESERVE).unlink(missing_ok=True)
    ranks = tuple(_rank_infos(run_dir).values())
    done = dataclasses.replace(
        read_manifest(run_dir),
        status=RunStatus(state="failed" if error else "completed", error=error),
        end_time=now_iso(), ranks=ranks, hosts=tuple(sorted({r.host for r in ranks})),
    )
    _write_text(Path(run_dir) / "manifest.json", mask_secrets(done.to_json()))
    if error is None:  # a failed run keeps its parts as they were written
        try:
            compact_parts(run_dir)
        except Exception as exc:  # the parts are still there and still read: only say so
            print(f"harness: could not compact the records of {run_dir} ({exc!r}); the parts are kept",
                  file=sys.stderr)
    return done


def exit_description(exitcode: int) -> str:
    """'killed by SIGKILL' for a negative (signal) exit code, else 'exit code N'."""
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def _rank_infos(run_dir: Path) -> dict[int, RankInfo]:
    """Each rank's rank.json that can be read (one torn by a dying rank is left out)."""
    infos = {}
    for p in sorted(Path(run_dir).glob("rank*/rank.json")):
        try:
            info = RankInfo.from_json(p.read_text())
        except (OSError, ValueError, TypeError):
            continue
        infos[info.rank] = info
    return infos


def _spoke(rank_dir: Path) -> bool:
    """The rank wrote an error or a fault, or a SIGTERM ended it (its stacks in sigterm.txt)."""
    return (any((rank_dir / f).exists() for f in ("error.txt", "fault.txt"))
            or _size(rank_dir / "sigterm.txt") > 0)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def unsettled_ranks(run_dir: Path) -> list[int]:
    """Ranks that started (rank.json) but have neither finished (peak memory noted) nor written an
    error or a fault nor been ended by a SIGTERM: still running, or gone without a word."""
    run_dir = Path(run_dir)
    return [r for r, info in sorted(_rank_infos(run_dir).items())
            if info.peak_rss_gib is None and not _spoke(run_dir / f"rank{r:05d}")]


SETTLE_S = 20.0
"""How long a failed multi-host launch waits for the other hosts' ranks to write their errors:
a rank that times out on a lost peer writes its error about when ours did, but on its own clock."""


def wait_for_ranks_to_settle(run_dir: Path, *, timeout_s: float = SETTLE_S) -> None:
    """Until every started rank has finished or written its error, or `timeout_s`: on a multi-host
    run this node's launcher knows only its own ranks' exits; the others speak through the shared
    run folder, and a rank that never does is named as lost (rank_errors)."""
    deadline = time.monotonic() + timeout_s
    while unsettled_ranks(run_dir) and time.monotonic() < deadline:
        time.sleep(0.5)


def rank_errors(run_dir: Path, exit_codes: Mapping[int, int] | None = None) -> list[str]:
    """'rank k: <what it said>' for each rank that noted a fault or wrote an error, the cause first.

    Injected faults come first: a stalled rank raises nothing itself, the others time out
    waiting for it, so the note is what names the cause. Next, ranks that ended without a word
    (`exit_codes`, by rank, as the launcher saw them: a SIGKILL, an OOM kill, os._exit): every
    rank that fails by an exception writes error.txt on its way out, so a silent one died of
    something outside, before the others, whose errors are what losing it did to them. A launcher
    of one host of several sees no other host's exit codes: a rank there that started and never
    finished nor wrote an error is named as lost, by host. Then the written errors, earliest first.
    Last, ranks a SIGTERM ended (sigterm.txt): what a launcher sends its survivors when it tears
    the job down, so they are never the cause unless every rank got it (a cancelled job).
    On a run over several hosts each rank is named with its host and node.
    """
    run_dir = Path(run_dir)
    infos = _rank_infos(run_dir)
    multi_host = len({i.host for i in infos.values()}) > 1

    def name(r: int) -> str:
        info = infos.get(r)
        return f"rank {r} ({info.host}, node {info.node})" if multi_host and info else f"rank {r}"

    def rank_of(path: Path) -> int:
        return int(path.parent.name[4:])

    def last_line(path: Path) -> str:
        lines = path.read_text().strip().splitlines()
        return lines[-1] if lines else "its error could not be written (a full disk?)"

    faults = sorted(run_dir.glob("rank*/fault.txt"))
    errors = sorted(run_dir.glob("rank*/error.txt"), key=lambda p: (p.stat().st_mtime_ns, rank_of(p)))
    written = {rank_of(p) for p in (*faults, *errors)}
    terminated = [rank_of(p) for p in sorted(run_dir.glob("rank*/sigterm.txt"))
                  if _size(p) > 0 and rank_of(p) not in written]
    spoke = written | set(terminated)
    exit_codes = exit_codes or {}
    # SIGTERM last: it is what a launcher sends the survivors when it tears the job down.
    silent = [f"{name(r)}: died without an error of its own ({exit_description(code)})"
              for r, code in sorted(exit_codes.items(), key=lambda rc: (rc[1] == -signal.SIGTERM, rc[0]))
              if code != 0 and r not in spoke]
    lost_by_host: dict[str, list[int]] = {}
    for r in unsettled_ranks(run_dir):
        if r not in exit_codes:
            lost_by_host.setdefault(infos[r].host, []).append(r)
    lost = [f"{name(ranks[0]) if len(ranks) == 1 else 'ranks ' + ', '.join(map(str, ranks)) + f' ({host})'}: "
            "started, then neither finished nor wrote an error (killed, or its host lost)"
            for host, ranks in sorted(lost_by_host.items(), key=lambda hr: hr[1][0])]
    ended = [f"{name(r)}: ended by SIGTERM (its launcher tearing the job down, or the job cancelled; "
             f"its threads' stacks are in rank{r:05d}/sigterm.txt)" for r in terminated]
    return ([f"{name(rank_of(p))}: {last_line(p)}" for p in faults] + silent + lost
            + [f"{name(rank_of(p))}: {last_line(p)}" for p in errors] + ended)


def _bytes_by_stage(phases: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """Exchange phase counts (model/collective_bytes.py) summed by the stage each belongs to."""
    out: dict[str, tuple[int, int]] = {}
    for phase, (sent, received) in phases.items():
        stage = STAGE_OF_PHASE[phase]
        s, r = out.get(stage, (0, 0))
        out[stage] = (s + sent, r + received)
    return out


def wait_for_manifest(run_dir: Path, *, timeout_s: float) -> bool:
    """For nodes other than 0 of a multi-host run: node 0 writes the manifest."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (Path(run_dir) / "manifest.json").exists():
            return True
        time.sleep(0.5)
    return False


class RankRecorder:
    """One rank's records, appended as parquet parts so a crash loses at most the unflushed part."""

    def __init__(self, run_dir: Path, *, run_id: str, rank: int, node: int, warmup_iters: int, local_batch: int) -> None:
        self.dir = Path(run_dir) / f"rank{rank:05d}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keys = {"run_id": run_id, "rank": rank, "node": node}
        self.warmup_iters, self.local_batch = warmup_iters, local_batch
        self.part = 0
        self.eval_part = 0
        self.sub_part = 0
        # pyarrow's first array imports pandas (its check for pandas input): about 0.25 s, paid
        # here at the rank's start rather than in the first flush, inside the timed iterations.
        pa.array([], pa.int64())

    def write(self, stages: list[StageSpan], iterations: list[StageSpan], losses: dict[int, float],
              *, splits_exchanged: dict[int, int] | None = None,
              moved: dict[int, dict[str, tuple[int, int]]] | None = None) -> None:
        if not iterations and not stages:
            return
        # Bytes the iteration's collectives moved to and from other ranks, in all and by the stage
        # each exchange belongs to (counted at launch: the next batch's ids exchange, launched in
        # this iteration, counts in this one). -1: not counted (an engine that does not).
        by_stage = {i: _bytes_by_stage(phases) for i, phases in (moved or {}).items()}

        def stage_bytes(k: int) -> list[int]:
            return [by_stage[s.iteration].get(s.stage, (0, 0))[k] if s.iteration in by_stage else -1 for s in stages]

        def iteration_bytes(k: int) -> list[int]:
            return [sum(v[k] for v in by_stage[s.iteration].values()) if s.iteration in by_stage else -1
                    for s in iterations]

        st = self._table(stages, stage=[s.stage for s in stages], end=dict(
            sent_bytes=stage_bytes(0), recv_bytes=stage_bytes(1)), duration="duration_ms")
        it = self._table(iterations, end=dict(
            loss=[losses.get(s.iteration, float("nan")) for s in iterations],
            samples=[self.local_batch] * len(iterations),
            # How many splits all-to-alls the iteration's input dist ran (skip_splits_a2a makes it 0;
            # a batch off the fixed hotness falls back to the exchange and counts here).
            splits_exchanged=[int((splits_exchanged or {}).get(s.iteration, -1)) for s in iterations],
            sent_bytes=iteration_bytes(0), recv_bytes=iteration_bytes(1)), duration="iter_ms")
        for kind, table in (("stages", st), ("iterations", it)):
            _write_parquet(table, self.dir / f"{kind}-{self.part:05d}.parquet")
        self.part += 1

    def _table(self, spans: list, *, stage: list[str] | None = None, name: list[str] | None = None,
               end: dict[str, list] | None = None, duration: str = "duration_ms") -> pa.Table:
        """The rank's keys, then the spans' iteration, stage and name (where given), start and end,
        the `end` columns, the duration in ms and whether it is a warm-up iteration. Built in
        pyarrow, typed as pandas wrote them before: a write of 100 iterations takes about a tenth of
        pandas' 9 ms, host time of the flushing iteration (docs/run-records.md, 2026-11-27)."""
        n, iters = len(spans), [s.iteration for s in spans]
        starts, ends = [s.start_ns for s in spans], [s.end_ns for s in spans]
        cols: dict[str, pa.Array] = {
            "run_id": pa.array([self.keys["run_id"]] * n, pa.large_string()),
            "rank": pa.array([self.keys["rank"]] * n, pa.int64()),
            "node": pa.array([self.keys["node"]] * n, pa.int64()),
            "iteration": pa.array(iters, pa.int64()),
        }
        for key, values in (("stage", stage), ("name", name)):
            if values is not None:
                cols[key] = pa.array(values, pa.large_string())
        cols["start_ns"], cols["end_ns"] = pa.array(starts, pa.int64()), pa.array(ends, pa.int64())
        for key, values in (end or {}).items():
            cols[key] = pa.array(values, pa.float64() if key == "loss" else pa.int64())
        cols[duration] = pa.array([(e - s) / 1e6 for s, e in zip(starts, ends)], pa.float64())
        cols["warmup"] = pa.array([i < self.warmup_iters for i in iters], pa.bool_())
        return pa.table(cols)

    def write_subspans(self, subs: list[SubSpan]) -> None:
        """Sub-spans (harness.run.timeline.SubSpan), a part each flush that has any."""
        if not subs:
            return
        table = self._table(subs, stage=[s.stage for s in subs], name=[s.name for s in subs])
        _write_parquet(table, self.dir / f"subspans-{self.sub_part:05d}.parquet")
        self.sub_part += 1

    def write_evals(self, evals: list) -> None:
        """Evaluations (harness.run.evaluate.EvalRecord), a part each call, apart from the iterations."""
        table = pa.Table.from_pylist([{**self.keys, **dataclasses.asdict(e)} for e in evals])
        _write_parquet(table, self.dir / f"evals-{self.eval_part:05d}.parquet")
        self.eval_part += 1

    def write_info(self, info: RankInfo) -> None:
        _write_text(self.dir / "rank.json", info.to_json())

    def write_fault(self, note: str) -> None:
        (self.dir / "fault.txt").write_text(note + "\n")

    def write_error(self, exc: BaseException) -> None:
        (self.dir / "error.txt").write_text(mask_secrets("".join(traceback.format_exception(exc))))

    def note_sigterm(self) -> None:
        """A SIGTERM from now on writes every thread's stack to sigterm.txt, then ends the rank as
        it would have (the handler chains to the default). A launcher sends it to the survivors
        when one rank fails; without a word from them, a survivor it caught in a collective would
        read as lost. faulthandler writes from the signal handler itself, so a rank blocked in a
        collective library's C++ (where a Python handler would not run) still leaves it."""
        self._sigterm_file = open(self.dir / "sigterm.txt", "w")  # kept open: the handler writes to its fd
        faulthandler.register(signal.SIGTERM, file=self._sigterm_file, all_threads=True, chain=True)

    def end_sigterm_note(self) -> None:
        """SIGTERM back to its default as the rank ends; sigterm.txt goes unless one came."""
        faulthandler.unregister(signal.SIGTERM)
        self._sigterm_file.close()
        if _size(self.dir / "sigterm.txt") == 0:
            (self.dir / "sigterm.txt").unlink(missing_ok=True)
