"""The run manifest: the contract between the run's writer (records.py) and every reader.

One frozen, typed value with one JSON form (`to_json` / `from_json`). records.py is the only
writer, the worker and the report side read it back with `RunManifest.from_json`; nothing
assembles or picks at it as a dict. A status change is a new value (`dataclasses.replace`).
Importing this module imports neither torch nor fbgemm, so reports run without them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from harness.records import typed_json
from harness.config import BenchConfig
from harness.names import ENGINE_TIMED_STAGES, OPTIMIZATION_FLAGS, RUN_STATES, SHARDING_TYPES
from model.sharding import TablePlan


@dataclass(kw_only=True, frozen=True)
class PrecisionEntry:
    """The run's numeric precision, beside the flags because a reader comparing runs needs both;
    unlike a flag it may change the numbers, and says whether it does."""

    dense: str = "fp32"
    """The dense arch's precision (config precision.dense)."""
    tables: str = "fp32"
    """The fused tables' weights precision (config precision.tables); data-parallel tables stay fp32."""
    comm: str = "fp32"
    """The pooled embeddings' precision on the wire, forward (config precision.comm)."""
    comm_bwd: str = "fp32"
    """Their gradients' precision on the wire, backward (config precision.comm_bwd, resolved)."""
    tf32: bool = False
    """Whether fp32 matmuls ran on TF32 tensor cores (config precision.tf32, on a GPU)."""
    numerics_changed: bool = False
    """True when losses and weights differ from an fp32 run by design."""
    note: str = "fp32 throughout"
    """What the precision does, for reports."""


@dataclass(kw_only=True, frozen=True)
class WaitEntry:
    """How the ranks' hosts wait for collectives (config optimizations.collective_wait), beside the
    flags: not one of them, but a reader comparing runs needs it (it changes times, not numbers)."""

    requested: str = "block"
    """What the config asked for (poll or block)."""
    effective: str = "block"
    """What the ranks do."""
    reason: str = ""
    """Why the effective wait differs from the requested one (empty when they agree)."""


@dataclass(kw_only=True, frozen=True)
class DenseOptimizerEntry:
    """Which of torch's Adagrad implementations updates the dense parameters on the run's device:
    not a flag (every run has one, same math to the last bits), but device-dependent, so recorded."""

    impl: str = "not recorded"
    """fused (one kernel over the flat parameter), foreach (torch's multi-tensor kernels, where
    torch has no fused Adagrad for the device) or default (torch's own pick: the torchrec engine);
    manifests written before it was recorded read "not recorded"."""
    reason: str = ""
    """Why that one, for reports."""


@dataclass(kw_only=True, frozen=True)
class CrossNetEntry:
    """How the dense arch's DCNv2 cross layers ran (config optimizations.fused_cross, resolved): not a
    flag, the same math, but it moves the dense step's device time, so recorded."""

    impl: str = "autograd"
    """fused (one autograd function a layer, model/cross_layer.py) or autograd (the formula as
    written, as stock TorchRec runs it); manifests written before it was recorded read autograd,
    which is what those runs ran."""
    reason: str = ""
    """Why autograd where fused was asked, for reports."""


@dataclass(kw_only=True, frozen=True)
class DenseWeightsEntry:
    """What the dense forward reads its parameters as (config optimizations.bf16_weight_copy,
    resolved): not a flag, the same bits, but it moves the dense step's launches, so recorded."""

    impl: str = "fp32"
    """fp32 (the weights themselves), bf16 copy (a copy refreshed once a step, gradients cast once)
    or autocast casts (each parameter cast each forward, its gradient back). Manifests written
    before it was recorded read autocast casts for bf16 runs (RunManifest.from_json), fp32 else."""
    reason: str = ""
    """Why not the bf16 copy where it was asked (or why asking for none took no effect), for reports."""


@dataclass(kw_only=True, frozen=True)
class DenseGradsEntry:
    """How the dense gradients reach the flat buffer (harness/run/dense_gradients.py; config
    optimizations.gather_grads, resolved: a CUDA graph keeps the views): not a flag, the same bits,
    but it moves the dense step's launches, so recorded."""

    impl: str = "views"
    """views (.grad views of the buffer, added into, a kernel a parameter; a CUDA graph's), gather
    (one cat a bucket, eager) or ddp (the torchrec engine); manifests written before it was
    recorded read views, which is what those runs ran."""
    reason: str = ""
    """Why views where gathering was asked (a CUDA graph), for reports."""


@dataclass(kw_only=True, frozen=True)
class AheadEntry:
    """How many batches a thread draws ahead of the loop on the run's device (config data.ahead,
    resolved): not a flag, it changes no number, but where the batch time goes."""

    depth: int = 0
    """Batches made ahead; 0: drawn in the loop between iterations (manifests written before it
    was recorded read 0, which is what those runs did)."""
    workers: int = 1
    """Threads making them, each a whole batch in turn (numpy's Philox, logs and powers release
    the GIL, so they run in parallel); runs recorded before this field had one."""
    reason: str = ""
    """Why that many, for reports."""
    on_device: bool = False
    """The synthetic batches drawn on the rank's GPU (config data.draw_on device,
    harness/data/device_draw.py), none by host threads; manifests before it: False."""
    draw_block: int = 1
    """Batches drawn on the GPU a draw (device_draw.DRAW_BLOCK), its launches shared by them;
    manifests before it: 1, what those runs drew."""


@dataclass(kw_only=True, frozen=True)
class ResolvedFlags:
    """The optimization flags asked for and what takes effect on the run's device (harness/run/optimizations.py)."""

    pipeline: bool
    """Whether the loop is pipelined (batch i+1's input dist overlaps batch i's compute)."""
    requested: dict[str, bool]
    """Flag -> asked for, one entry per optimization flag."""
    effective: dict[str, bool]
    """Flag -> takes effect on this run; requested and not inactive."""
    inactive_reasons: dict[str, str]
    """Flag -> why it was requested but cannot take effect here (only such flags)."""
    notes: dict[str, str]
    """Flag -> a caveat on an effective flag (e.g. row-wise tables still exchange their splits)."""
    precision: PrecisionEntry = field(default_factory=PrecisionEntry)
    """The numeric precision, recorded with the flags (not itself a flag)."""
    collective_wait: WaitEntry = field(default_factory=WaitEntry)
    """How hosts wait for collectives (not a flag); manifests written before it existed read as block."""
    dense_optimizer: DenseOptimizerEntry = field(default_factory=DenseOptimizerEntry)
    """The dense Adagrad's implementation on the run's device (not a flag)."""
    batches_ahead: AheadEntry = field(default_factory=AheadEntry)
    """Batches a thread draws ahead of the loop (not a flag)."""
    cross_net: CrossNetEntry = field(default_factory=CrossNetEntry)
    """How the cross layers ran (not a flag)."""
    dense_weights: DenseWeightsEntry = field(default_factory=DenseWeightsEntry)
    """What the dense forward read its parameters as (not a flag)."""
    dense_grads: DenseGradsEntry = field(default_factory=DenseGradsEntry)
    """How the dense gradients reached the flat buffer (not a flag)."""

    def __post_init__(self) -> None:
        for name in ("requested", "effective"):
            if set(getattr(self, name)) != set(OPTIMIZATION_FLAGS):
                raise ValueError(f"flags.{name} must name exactly {list(OPTIMIZATION_FLAGS)}")


@dataclass(kw_only=True, frozen=True)
class Versions:
    """Software the run used (the launcher's view)."""

    python: str
    """Python version."""
    torch: str
    """torch.__version__."""
    fbgemm_gpu: str
    """fbgemm_gpu.__version__."""
    numpy: str
    """numpy.__version__."""
    pandas: str
    """pandas.__version__."""
    cuda: str | None = None
    """CUDA version torch was built with; None on a CPU build."""
    nccl: str | None = None
    """NCCL version; None without a usable GPU."""
    gpu: str | None = None
    """Name of GPU 0; None without one."""


@dataclass(kw_only=True, frozen=True)
class GitState:
    """The checkout the run came from."""

    commit: str | None
    """HEAD's hash; None outside a git checkout."""
    dirty: bool | None
    """Tracked files differ from HEAD; None when git could not say."""


@dataclass(kw_only=True, frozen=True)
class RunStatus:
    """Where the run is: running, then completed or failed."""

    state: str = "running"
    """One of running, completed, failed."""
    error: str | None = None
    """What failed (rank and cause) when state is failed; None otherwise."""

    def __post_init__(self) -> None:
        if self.state not in RUN_STATES:
            raise ValueError(f"status.state {self.state!r} is not one of {list(RUN_STATES)}")


@dataclass(kw_only=True, frozen=True)
class RankEstimate:
    """The planner's figures for one rank."""

    rank: int
    """Global rank."""
    node: int
    """Node of the rank (rank // gpus_per_node)."""
    memory_gib: float
    """Embedding weights, optimizer state and the exchange buffers held for them (model/planner.py)."""
    est_ms: float
    """Estimated embedding cost of one iteration on the rank (model/planner.py's cost model)."""
    shards: tuple[str, ...]
    """The shards it holds, as the planner describes them."""
    intra_in_mb: float = 0.0
    """MB an iteration it receives from ranks of its node (model/plan_traffic.py's count)."""
    intra_out_mb: float = 0.0
    """MB an iteration it sends to ranks of its node."""
    inter_in_mb: float = 0.0
    """MB an iteration it receives from other nodes."""
    inter_out_mb: float = 0.0
    """MB an iteration it sends to other nodes."""


@dataclass(kw_only=True, frozen=True)
class PlanEstimate:
    """What the planner assumed and estimated (harness/launch/planning.py); the plan itself is RunManifest.plan."""

    hardware: str
    """The hardware profile planned for."""
    hardware_source: str = ""
    """How the profile was chosen where --hardware did not name it (auto: the run's device)."""
    memory_gib: float
    """Per-rank memory budget used."""
    memory_gbps: float
    """Memory bandwidth used."""
    intra_node_gbps: float
    """Per-rank link bandwidth inside a node used."""
    inter_node_gbps: float
    """Per-rank link bandwidth between nodes used."""
    link: str
    """The link the all-to-alls cross: intra-node or inter-node."""
    ranks: tuple[RankEstimate, ...]
    """One entry per rank, in rank order."""
    intra_node_latency_us: float = 0.0
    """Latency of a collective inside a node used (the profile's)."""
    inter_node_latency_us: float = 0.0
    """Latency of a collective spanning nodes used (the profile's)."""
    est_step_ms: float = 0.0
    """What the planner minimised: the embedding lookups and exchanges of an iteration, each at its
    busiest rank, plus the collectives' latency (model/planner.py); 0 in runs recorded before it."""

    @property
    def est_ms_max(self) -> float:
        return max(r.est_ms for r in self.ranks)

    @property
    def est_ms_min(self) -> float:
        return min(r.est_ms for r in self.ranks)

    @property
    def memory_gib_max(self) -> float:
        return max(r.memory_gib for r in self.ranks)


@dataclass(kw_only=True, frozen=True)
class RankInfo:
    """What one rank notes about itself (rank.json, gathered into the manifest when the run ends)."""

    run_id: str
    """The run."""
    rank: int
    """Global rank."""
    node: int
    """Node of the rank."""
    host: str
    """Host name the rank ran on."""
    pid: int
    """Its process id."""
    device: str
    """torch device it trained on."""
    backend: str
    """Collective backend: gloo or nccl."""
    threads: int
    """torch intra-op threads it used."""
    gemm_gflops: float
    """A brief matmul rate measured at start: the dense step's widest GEMM at its precision
    (`gemm_probe`; before that was recorded, a 1024^3 fp32 matmul)."""
    copy_gbps: float
    """A brief memory-copy rate measured at start."""
    peak_rss_gib: float | None = None
    """Peak resident memory; None until the rank finished training."""
    peak_gpu_mem_gib: float | None = None
    """Peak CUDA memory allocated; None on CPU or until the rank finished."""
    gemm_probe: str = "float32 1024x1024x1024"
    """What gemm_gflops measured: dtype, m x k x n, fp32's matmul precision (rank.json files
    written before it was recorded: the 1024^3 fp32 matmul they measured)."""
    startup_s: dict[str, float] = field(default_factory=dict)
    """Seconds in each phase outside the timed iterations (harness/run/startup.py: imports,
    process_group, probes, build, loop); empty until the rank finished, and in records written
    before 2026-11-27."""

    def to_json(self) -> str:
        return typed_json.dumps(self)

    @classmethod
    def from_json(cls, text: str) -> RankInfo:
        return typed_json.loads(cls, text)


@dataclass(kw_only=True, frozen=True)
class RunManifest:
    """Everything about a run except its records: written first, rewritten when the status moves."""

    run_id: str
    """The run's folder name under runs/; never reused."""
    config: BenchConfig
    """The full resolved config the ranks train with."""
    status: RunStatus = RunStatus()
    """running -> completed | failed (with the error)."""
    start_time: str
    """ISO 8601 UTC time the launcher created the run."""
    end_time: str | None = None
    """ISO 8601 UTC time the status left running; None while running."""
    launcher: str
    """How ranks were started: local-simulation, torchrun, slurm or in-process."""
    start_method: str | None = None
    """Local simulation: how each rank's process began: spawn (a fresh interpreter) or forkserver
    (forked from a server that had imported torch and the harness: harness/launch/fork_server.py).
    None where torchrun or srun started them, in-process, and in runs recorded before it was."""
    launcher_host: str
    """Host the launcher ran on."""
    argv: tuple[str, ...]
    """The launcher's command line."""
    node_commands: tuple[str, ...]
    """The exact command each node ran."""
    device: str
    """What the ranks run on, as the launcher saw it: cpu or cuda (GPU name)."""
    optimizations: ResolvedFlags
    """Flags requested and effective, with reasons for the inactive ones."""
    plan: tuple[TablePlan, ...]
    """The sharding plan, one TablePlan per table; every rank trains with this one."""
    plan_estimate: PlanEstimate
    """The planner's assumptions and per-rank estimates for the plan."""
    dense_flops_per_sample: float
    """Analytic dense FLOPs (forward plus backward) of one sample."""
    versions: Versions
    """Software versions."""
    git: GitState
    """The checkout's commit and dirty state."""
    hosts: tuple[str, ...] = ()
    """Hosts the ranks ran on (filled when the run ends)."""
    ranks: tuple[RankInfo, ...] = ()
    """Each rank's own notes (filled when the run ends)."""

    @property
    def engine(self) -> str:
        """Who trained: harness or torchrec (the config's run.engine)."""
        return self.config.run.engine

    @property
    def timed_stages(self) -> tuple[str, ...]:
        """The stages the run recorded: its engine's, none with the timeline off."""
        return ENGINE_TIMED_STAGES[self.engine] if self.config.run.timeline else ()

    def __post_init__(self) -> None:
        if len(self.plan) != self.config.model.num_sparse:
            raise ValueError(f"manifest.plan has {len(self.plan)} tables, the model {self.config.model.num_sparse}")
        for t, tp in enumerate(self.plan):
            if tp.kind not in SHARDING_TYPES:
                raise ValueError(f"manifest.plan table {t}: unknown sharding type {tp.kind!r}")

    @property
    def world_size(self) -> int:
        return self.config.run.world_size

    @property
    def nodes(self) -> int:
        return self.config.run.nodes

    def plan_kinds(self) -> dict[str, int]:
        """Tables of each sharding type, every type named."""
        return {k: sum(tp.kind == k for tp in self.plan) for k in SHARDING_TYPES}

    def to_json(self) -> str:
        return typed_json.dumps(self)

    @classmethod
    def from_json(cls, text: str) -> RunManifest:
        """Raises ValueError naming the field when the text is not a manifest of this version."""
        data = json.loads(text)
        opts = data.get("config", {}).get("optimizations") if isinstance(data, dict) else None
        if isinstance(opts, dict) and "fused_cross" not in opts:
            # Written before the fused cross layers existed: those runs ran the formula (autograd),
            # not what the field's default would now say.
            opts["fused_cross"] = False
        if isinstance(opts, dict) and "bf16_weight_copy" not in opts:
            opts["bf16_weight_copy"] = False  # written before the copy existed: autocast cast each parameter
        if isinstance(opts, dict) and "gather_grads" not in opts:
            opts["gather_grads"] = False  # written before the gather existed: autograd added into views
        flags = data.get("optimizations") if isinstance(data, dict) else None
        if isinstance(flags, dict) and "dense_weights" not in flags:
            dense = (flags.get("precision") or {}).get("dense", "fp32")
            flags["dense_weights"] = {"impl": "fp32" if dense == "fp32" else "autocast casts"}
        return typed_json.from_jsonable(cls, data)
