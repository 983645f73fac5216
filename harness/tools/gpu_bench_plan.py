"""What `make gpu-bench` runs (Plan) and what it found (Outcome), written as it goes
(harness/tools/gpu_bench.py runs the steps)."""

from __future__ import annotations

import json
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.names import OPTIMIZATION_FLAGS


@dataclass
class Plan:
    """What one gpu-bench runs (the command line's choices, resolved)."""

    device: str
    gpus: int
    small: str = "small"
    """The preset of the compare, flag and --opts all steps."""
    batch_per_gpu: int = 8192
    iters: int = 30
    warmup: int = 5
    repeats: int = 2
    battery: bool = True
    flags: tuple[str, ...] = OPTIMIZATION_FLAGS
    precision: str = "bf16"
    """The dense precision of every run (both engines): issue 45's targets are stated at bf16."""
    in_process: bool = False
    """Each run's one rank in this process (bench --in-process; one GPU only), not a process of its
    own: on the first H100 host a spawned run spent 10 s and more outside its iterations. After a
    run that fails in-process, the rest spawn (run_bench); one defaults run spawns whatever
    (run_spawned_check), so the table shows what each way costs and that they measure alike."""

    spawn_why: str | None = None
    """Why every run spawns on one GPU though --spawn-each-run was not given (in_process_choice)."""
    gpu_name: str | None = None
    """What CUDA calls the device (torch.cuda.get_device_name); None on a CPU rehearsal."""

    draw_on_host: str | None = None
    """Why every run draws its batches on the host (--draw-on host): the device draw's check against
    numpy failed (gpu_bench_draw.py); None: each run draws where its defaults say (the GPU on CUDA)."""

    budget_s: float | None = None
    """Seconds the whole bench may take (a device lease's): the flag rounds after the first stop
    where another would not leave the steps after them time (gpu_bench.round_over_budget)."""

    def common(self, preset: str, batch_per_gpu: int | None) -> list[str]:
        """bench/compare options every run of a preset shares."""
        out = ["--preset", preset, "--device", self.device, "--nodes", "1", "--gpus-per-node", str(self.gpus),
               "--iters", str(self.iters), "--warmup", str(self.warmup), "--dense-precision", self.precision]
        batch = ["--global-batch", str(batch_per_gpu * self.gpus)] if batch_per_gpu else []
        host = ["--draw-on", "host"] if self.draw_on_host else []
        return out + batch + host + (["--in-process"] if self.in_process else [])


AGAINST = {"graphs_autograd_cross": "+cuda_graphs", "opts_all_host_draw": "opts_all"}
"""Flag-round rows whose ratio is over another row's runs of the same rounds, not the defaults':
what one change buys where the others are already on (the row absent, over the defaults)."""


CLUSTER = ("--preset", "mlperf", "--nodes", "16", "--gpus-per-node", "8", "--hardware", "h100")
"""The job the published figures are of (TorchRec 7.6 and 3.4 ms, the ~2.3 ms record): make project's
default, which gpu-bench projects (gpu_bench_projection.py)."""


def mlperf_data_parallel_tables() -> list[int]:
    """The tables this harness's planner makes data-parallel in the 16 x 8 mlperf job gpu-bench
    projects (CLUSTER, as make project reads it; small's 26 tables are mlperf's, rows capped)."""
    from harness.launch.options import config_from_args
    from harness.launch.planning import make_plan
    from harness.tools.project import build_parser

    cfg = config_from_args(build_parser().parse_args(list(CLUSTER)))
    plan, _ = make_plan(cfg, ranks_per_host=cfg.run.gpus_per_node)
    return [t for t, tp in enumerate(plan) if str(tp.kind) == "data_parallel"]


def runs_sharding_layouts(plan: Plan) -> bool:
    """Whether the bench runs small's tables in other sharding layouts (mlperf_groups,
    all_data_parallel; flag_configs): on CUDA, where the projection of the 16 x 8 job rests on them."""
    return plan.device == "cuda" and plan.small == "small"


def flag_configs(plan: Plan, skipped: dict[str, str]) -> dict[str, list[str]]:
    """Row name -> the options its runs add, in the order each round runs them ("defaults" first).
    Besides the flags that can take effect: --opts all; the harness's own dense kernels taken away
    (autograd_cross, the fused cross layers, eager and graphed; views_grads, the gathered
    gradients; autocast_casts, the bf16 weight copy, bf16 only); bf16_pure, every activation in
    bf16 (another precision: its numbers differ by design), alone and with every flag (the fastest
    the harness has: issue 45's period target); on CUDA, where the batches are drawn on the GPU,
    the host's batch threads instead (--draw-on host), alone and with --opts all; on CUDA, small's
    tables in the two sharding groups the 16 x 8 mlperf plan puts them in (mlperf_groups: its
    data-parallel tables, the rest table-wise on one GPU), the code path the projection of that
    job rests on (issue 46), and every table data-parallel (all_data_parallel: tiny's code path at
    small's size, what a host cost a code path would be calibrated on; docs/projection.md)."""
    configs = {"defaults": [], **{f"+{f}": [f"--{f.replace('_', '-')}"] for f in plan.flags if f not in skipped},
               "opts_all": ["--opts", "all"], "autograd_cross": ["--no-fused-cross"],
               "views_grads": ["--no-gather-grads"]}
    if "+cuda_graphs" in configs:
        configs["graphs_autograd_cross"] = ["--cuda-graphs", "--no-fused-cross"]
    if plan.device == "cuda" and not plan.draw_on_host:
        configs["host_draw"] = ["--draw-on", "host"]
        configs["opts_all_host_draw"] = ["--opts", "all", "--draw-on", "host"]
    if runs_sharding_layouts(plan):
        configs["mlperf_groups"] = ["--sharding", "table_wise", "--shard", ",".join(
            f"{t}=data_parallel" for t in mlperf_data_parallel_tables())]
        configs["all_data_parallel"] = ["--sharding", "data_parallel"]
    if plan.precision == "bf16":
        configs["autocast_casts"] = ["--no-bf16-weight-copy"]
        configs["bf16_pure"] = ["--dense-precision", "bf16-pure"]
        configs["bf16_pure_all"] = ["--dense-precision", "bf16-pure", "--opts", "all"]
    return configs


def in_process_choice(gpus: int, spawn_each_run: bool) -> tuple[bool, str | None]:
    """Plan.in_process and Plan.spawn_why: in-process on one GPU unless asked not to, or unless this
    host cannot give a run its own memory peak (bench --in-process would refuse every run)."""
    if gpus != 1 or spawn_each_run:
        return False, None
    from harness.run.peaks import own_peak_unavailable
    why = own_peak_unavailable()
    return why is None, why and f"bench --in-process cannot run here ({why})"


def device_line(plan: dict) -> str:
    """The table's device row: what ran, and the planner's profile for it (each run's --hardware
    auto: harness/launch/planning.gpu_hardware)."""
    if not plan.get("gpu_name"):
        return f"{plan.get('gpus', '?')} {plan.get('device', 'cpu')} rank(s), no GPU"
    from harness.launch.planning import gpu_hardware
    profile, why = gpu_hardware(plan["gpu_name"])
    return f"{plan.get('gpus', '?')} x {plan['gpu_name']}, runs planned with the {profile} profile ({why})"


@dataclass
class Outcome:
    """What gpu-bench found; written to gpu-bench.json as it goes."""

    folder: str
    plan: dict
    checks: list[dict] = field(default_factory=list)
    battery_verdict: str | None = None
    compares: dict[str, dict] = field(default_factory=dict)
    """Step name -> compare.json's ratio, CI, runs and the harness side's period and stages."""
    flags: dict[str, dict] = field(default_factory=dict)
    """Flag -> its runs and its period ratio over the defaults' with the CI."""
    defaults_runs: list[str] = field(default_factory=list)
    """The flag rounds' runs of the defaults (each flag's ratio is over these)."""
    failures: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    profiled: str | None = None
    """The profiled run's host-against-device finding (harness/report/profile_trace.py)."""
    profiled_run: str | None = None
    """The profiled run's id (run_bench names a run it ran again spawned otherwise)."""
    quarter_run: str | None = None
    """The defaults at a quarter of the batch (a calibration run of the projection check)."""
    projection: dict[str, dict] = field(default_factory=dict)
    """Run label -> its measured and projected period and the error (the projection check)."""
    cluster_projection: dict | None = None
    """The 16 x 8 H100 mlperf job projected from this bench's runs: baseline, all flags, their ratio."""
    profiled_more: dict[str, dict] = field(default_factory=dict)
    """"quarter", "tiny", "bf16_pure" and "all_data_parallel" -> their profiled run's id and host-against-device
    finding."""
    draw_check: dict | None = None
    """--draw-on device against numpy's batches, before the flag rounds (gpu_bench_draw.py)."""
    archive: str | None = None
    """A .tar.gz of the folder, rewritten after every step (a device lease brings back few files)."""
    launch_notes: list[str] = field(default_factory=list)
    """What became of the in-process runs: a failure that made the rest spawn (Plan.in_process)."""
    flag_rounds: dict | None = None
    """Where the flag rounds stopped short of the repeats asked for (Plan.budget_s): ran, asked, why."""
    spawned_check: dict | None = None
    """A spawned run of the defaults against the in-process ones: period ratio and CI (run_spawned_check)."""

    def save(self) -> None:
        Path(self.folder, "gpu-bench.json").write_text(json.dumps(asdict(self), indent=1, default=str) + "\n")
        if self.archive:
            write_archive(Path(self.folder), Path(self.archive))


def write_archive(folder: Path, archive: Path) -> None:
    """folder as archive (gzip tar, written aside then renamed: a lease ending mid-write leaves the last one whole)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    part = archive.with_name(archive.name + ".part")
    with tarfile.open(part, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    part.replace(archive)
