"""The run's configuration: one kw_only dataclass per concern, checked when built.

Every field says what it means, its default and what it requires. User mistakes raise
ValueError naming the field, before any process starts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from harness.config_fields import (finite_numbers, non_negative_int as _non_negative_int, one_of as _one_of, option,
                                   positive_int as _positive_int, positive_numbers)
from harness.store_url import check_store_url, mask_secrets
from harness.names import (
    COLLECTIVE_WAITS, COMM_PRECISIONS, DENSE_PRECISIONS, DYNAMIC_KINDS, DYNAMIC_POLICIES, TABLE_PRECISIONS, DEVICES, EMBEDDING_OPTIMIZERS, ENGINES, HARDWARE_CHOICES, OPTIMIZATION_FLAGS, SHARDING_KINDS, SHARDING_TYPES,
    ShardingType, DRAW_PLACES,
)

@dataclass(kw_only=True, frozen=True)
class ModelConfig:
    """DLRM-DCNv2 shape. Defaults are MLPerf's (design.md) except the table rows, which presets set."""

    table_rows: tuple[int, ...]
    """Rows of each of the sparse features' tables; one entry per feature."""
    multi_hot: tuple[int, ...]
    """Ids a sample has in each feature (fixed hotness); same length as table_rows."""
    num_dense: int = 13
    """Dense input features a sample has."""
    embedding_dim: int = 128
    """Width of every embedding row; must equal the bottom MLP's last width (they are concatenated)."""
    bottom_mlp: tuple[int, ...] = (512, 256, 128)
    """Widths of the bottom MLP's layers, ReLU after each."""
    cross_layers: int = 3
    """Number of DCNv2 low-rank cross layers."""
    cross_rank: int = 512
    """Low rank of each cross layer (V_l: width -> rank, W_l: rank -> width)."""
    top_mlp: tuple[int, ...] = (1024, 1024, 512, 256, 1)
    """Widths of the top MLP's layers, ReLU between them; the last must be 1 (one logit)."""

    def __post_init__(self) -> None:
        if len(self.table_rows) != len(self.multi_hot):
            raise ValueError(f"model: {len(self.table_rows)} table_rows but {len(self.multi_hot)} multi_hot sizes")
        for name in ("num_dense", "embedding_dim", "cross_layers", "cross_rank"):
            _positive_int(f"model.{name}", getattr(self, name))
        for name in ("table_rows", "multi_hot", "bottom_mlp", "top_mlp"):
            for v in getattr(self, name):
                _positive_int(f"model.{name} entries", v)
        if self.bottom_mlp[-1] != self.embedding_dim:
            raise ValueError(
                f"model.bottom_mlp must end at embedding_dim={self.embedding_dim}, got {self.bottom_mlp[-1]}"
            )
        if self.top_mlp[-1] != 1:
            raise ValueError(f"model.top_mlp must end with width 1 (one logit), got {self.top_mlp[-1]}")

    @property
    def num_sparse(self) -> int:
        return len(self.table_rows)

    def dense_arch_kwargs(self) -> dict[str, Any]:
        """Constructor arguments of model.dense.DenseArch (and dense_flops_per_sample)."""
        return dict(
            num_dense=self.num_dense, num_sparse=self.num_sparse, embedding_dim=self.embedding_dim,
            bottom_mlp=self.bottom_mlp, cross_layers=self.cross_layers, cross_rank=self.cross_rank,
            top_mlp=self.top_mlp,
        )


@dataclass(kw_only=True, frozen=True)
class OptimizerConfig:
    """Adagrad everywhere, as MLPerf's reference."""

    learning_rate: float = 0.005
    """Learning rate of both the dense Adagrad and the fused embedding optimizer."""
    eps: float = 1e-8
    """Adagrad epsilon (dense and embeddings)."""
    embedding_optimizer: str = option("exact_adagrad", choices=EMBEDDING_OPTIMIZERS)
    """fbgemm's fused optimizer: exact_adagrad (per element), exact_rowwise_adagrad or exact_sgd."""

    def __post_init__(self) -> None:
        if self.embedding_optimizer not in EMBEDDING_OPTIMIZERS:
            raise ValueError(
                f"optimizer.embedding_optimizer {self.embedding_optimizer!r} is not one of {sorted(EMBEDDING_OPTIMIZERS)}"
            )
        if not self.learning_rate > 0 or not self.eps > 0:
            raise ValueError("optimizer.learning_rate and optimizer.eps must be > 0")


@dataclass(kw_only=True, frozen=True)
class DataConfig:
    """Where batches come from: the synthetic Criteo-shaped stream (harness/data/synthetic.py) or MLPerf
    files (harness/data/criteo_files.py)."""

    global_batch_size: int = option(option="global-batch")
    """Samples per iteration over all ranks; must divide evenly by the world size."""
    seed: int = 0
    """Seeds the data stream and the weights; the same seed gives the same losses at any world size."""
    id_exponent: float = 1.05
    """Power-law exponent of the ids (p(id k) ~ (k+1)^-a); 0 draws ids uniformly."""
    ragged_every: int = 0
    """Every k-th global batch (iterations k-1, 2k-1, ...) has variable hotness (odd samples keep
    half their ids), to exercise skip_splits_a2a's fallback; 0: every batch has fixed hotness."""
    ahead: int | None = option(None, metavar="N")
    """Batches drawn ahead of the loop on a thread of their own (harness/data/ahead.py), pinned on
    CUDA so their copies to the device are asynchronous; 0: drawn in the loop, between iterations.
    Left out: 2 on CUDA; 0 on CPU ranks, where that thread would take a core from them."""
    draw_on: str | None = option(None, choices=DRAW_PLACES)
    """Where the synthetic stream's batches are drawn: host (numpy; on CUDA by threads ahead of the
    loop, --ahead) or device (one Triton kernel on the rank's GPU, harness/data/device_draw.py: the
    same numbers up to the GPU's float64 ulps; ragged batches stay on the host). device takes
    effect on CUDA with Triton installed; elsewhere the manifest says why not. Left out: device
    on CUDA unless --ahead or --data is given (the host's threads kept small's H100 period above
    6 ms; docs/gpu-session-4-notes.md), host elsewhere."""
    path: str | None = option(None, option="data", metavar="DIR")
    """A folder of MLPerf multi-hot Criteo files (harness/data/criteo_files.py; `make dataset` writes
    some) to train on instead of the synthetic stream; the synthetic knobs then do not apply."""

    def __post_init__(self) -> None:
        _positive_int("data.global_batch_size", self.global_batch_size)
        _non_negative_int("data.ragged_every", self.ragged_every)
        if self.ahead is not None:
            _non_negative_int("data.ahead", self.ahead)
        if self.id_exponent < 0:
            raise ValueError(f"data.id_exponent must be >= 0, got {self.id_exponent}")
        if self.draw_on is not None:
            _one_of("data.draw_on", self.draw_on, DRAW_PLACES)
        if self.path is not None and self.draw_on == "device":
            raise ValueError("data.draw_on device draws the synthetic stream; the files at --data are read on the host")
        if self.path is not None and self.ragged_every:
            raise ValueError("data.ragged_every makes synthetic batches ragged; the files at --data have fixed hotness")


@dataclass(kw_only=True, frozen=True)
class ShardingConfig:
    """How embedding tables are spread over ranks (model/sharding.py, model/planner.py)."""

    kind: str = option("auto", option="sharding", choices=SHARDING_KINDS)
    """auto (the planner picks per table), or one kind forced on every table (docs/sharding.md
    says what each kind does)."""
    per_table: tuple[tuple[int, str], ...] = option((), option="shard", metavar="T=KIND[,T=KIND...]")
    """(table, kind) pairs forced on single tables; they win over --sharding."""
    column_shards: int = 4
    """The most column blocks the planner tries for a column_wise table: it searches 2..column_shards
    blocks (one a rank) that split the dim into widths divisible by 4 (model/planner.py); 1: no
    table is split column-wise."""
    hardware: str = option("auto", choices=HARDWARE_CHOICES)
    """The memory and bandwidth profile the planner assumes (harness/launch/planning.py PROFILES);
    auto: the run's device's (the GPU's by its name)."""
    memory_gib: float | None = None
    """Per-rank memory budget for shards and optimizer state; left out: the profile's."""
    memory_gbps: float | None = None
    """Memory bandwidth a rank gets (GB/s); left out: the profile's."""
    intra_node_gbps: float | None = None
    """Per-rank bandwidth inside a node (GB/s); left out: the profile's."""
    inter_node_gbps: float | None = None
    """Per-rank bandwidth between nodes (GB/s); left out: the profile's."""

    def __post_init__(self) -> None:
        _one_of("sharding.kind", self.kind, SHARDING_KINDS)
        named: set[int] = set()
        for t, k in self.per_table:
            if k not in SHARDING_TYPES:
                raise ValueError(f"sharding.per_table: table {t} kind {k!r} is not one of {list(SHARDING_TYPES)}")
            if t in named:  # which one was meant cannot be guessed
                raise ValueError(f"sharding.per_table names table {t} twice; give each table one kind")
            named.add(t)
        _positive_int("sharding.column_shards", self.column_shards)
        _one_of("sharding.hardware", self.hardware, HARDWARE_CHOICES)
        positive_numbers("sharding", self, ("memory_gib", "memory_gbps", "intra_node_gbps", "inter_node_gbps"))


@dataclass(kw_only=True, frozen=True)
class OptimizationsConfig:
    """The loop's shape and the optimization flags. Requested here; harness/run/optimizations.py
    decides which can take effect on the run's device and records why the others cannot."""

    pipeline: bool = True
    """Launch batch i+1's input distribution before batch i's compute and wait for it after
    (TorchRec's TrainPipelineSparseDist); False: the plain loop, one stage after another."""
    cuda_graphs: bool = False
    """Capture dense forward/backward and the gradient all-reduce in a CUDA graph; CUDA only."""
    threaded_input_dist: bool = False
    """A dedicated thread launches the next batch's input distribution; needs pipeline."""
    pinned_d2h: bool = False
    """Device-to-host copies (splits, loss) through reused pinned buffers, non-blocking; CUDA only."""
    avoid_record_streams: bool = False
    """TORCH_NCCL_AVOID_RECORD_STREAMS=1 before the process group starts; NCCL only."""
    skip_splits_a2a: bool = False
    """Fixed batch and hotness: splits computed locally, the splits all-to-all and its host sync
    skipped (table/column-wise tables; row-wise splits depend on the ids and are still exchanged)."""
    fused_cross: bool = True
    """Each DCNv2 cross layer as one autograd function (model/cross_layer.py), the formula's math in
    fewer passes over the activations. Not one of the five flags: the harness engine's own kernels
    (the torchrec engine records it as taking no effect). --no-fused-cross measures it."""
    bf16_weight_copy: bool = True
    """bf16 dense: the layers compute on a bf16 copy of the fp32 weights refreshed once a step, not
    on autocast's casts of each (harness/run/dense_gradients.py); same bits. Not a flag either
    (inactive on fp32 and the torchrec engine). --no-bf16-weight-copy measures it."""
    gather_grads: bool = True
    """An eager dense step gathers its gradients into the flat buffer, one cat a bucket, where views
    of it take an add a parameter (harness/run/dense_gradients.py); same bits. Not a flag either: a
    CUDA graph keeps the views. --no-gather-grads measures it."""
    collective_wait: str = option("poll", choices=COLLECTIVE_WAITS)
    """How the host waits for its collectives: poll (is_completed() in a loop yielding the core, so
    no wake-up latency, as MPI libraries do) or block (torch's wait()). Not one of the five flags,
    same results either way. gloo only: NCCL waits never block the host, so CUDA runs block."""

    def __post_init__(self) -> None:
        _one_of("collective_wait", self.collective_wait, COLLECTIVE_WAITS)
        if self.threaded_input_dist and not self.pipeline:
            raise ValueError("threaded_input_dist launches the next batch's input dist ahead: it needs the "
                             "pipelined loop (drop --no-pipeline or --threaded-input-dist)")

    def requested(self) -> dict[str, bool]:
        return {f: getattr(self, f) for f in OPTIMIZATION_FLAGS}


@dataclass(kw_only=True, frozen=True)
class PrecisionConfig:
    """Numeric precision. Not an optimization flag: anything but fp32 changes the numbers by
    design, and the manifest says so (harness/optimizations.resolve)."""

    dense: str = option("fp32", option="dense-precision", choices=DENSE_PRECISIONS)
    """fp32; bf16: the forward under torch.autocast(bfloat16) (bf16 matmuls, fp32 elementwise work);
    bf16-pure: every activation and gradient in bf16. Both keep fp32 weights, optimizer state, loss."""
    tables: str = option("fp32", option="table-precision", choices=TABLE_PRECISIONS)
    """fp32, or fp16: the fused (fbgemm) tables' weights in half precision, which halves their
    memory; fbgemm keeps the fused optimizer's state in fp32 and pools in fp32. Data-parallel tables
    stay fp32 (the run record says so)."""
    tf32: bool = False
    """fp32 matmuls on TF32 tensor cores (10-bit significands, fp32 range and accumulation), as
    torch.backends.cuda.matmul.allow_tf32 sets them: CUDA only (recorded as taking no effect on a
    CPU); changes the numbers by design. The GEMM probe measures with it too."""
    comm: str = option("fp32", option="comm-precision", choices=COMM_PRECISIONS)
    """Precision of the pooled embeddings on the wire in the forward exchanges (all-to-all,
    reduce-scatter): encoded before, decoded to fp32 after, as TorchRec's quantized comms. fp16 and
    bf16 are casts; fp8 is e4m3 with a per-row fp32 scale (model/wire_codec.py). fp32: none."""
    comm_bwd: str = option("auto", option="comm-precision-bwd", choices=("auto", *COMM_PRECISIONS))
    """Precision of their gradients on the wire in the backward exchanges (fp8: e5m2, per-row
    scaled); auto: bf16 when comm is not fp32 (TorchRec's default), else fp32."""

    @property
    def wire_bwd(self) -> str:
        """comm_bwd resolved: what the backward exchanges use."""
        if self.comm_bwd != "auto":
            return self.comm_bwd
        return "fp32" if self.comm == "fp32" else "bf16"

    def __post_init__(self) -> None:
        _one_of("precision.dense", self.dense, DENSE_PRECISIONS)
        _one_of("precision.tables", self.tables, TABLE_PRECISIONS)
        _one_of("precision.comm", self.comm, COMM_PRECISIONS)
        _one_of("precision.comm_bwd", self.comm_bwd, ("auto", *COMM_PRECISIONS))


@dataclass(kw_only=True, frozen=True)
class RunConfig:
    """What to run and where, and how to measure it."""

    preset: str = option(option=None)
    """Name of the preset the config came from (recorded; the fields are what counts)."""
    engine: str = option("harness", choices=ENGINES)
    """Who trains: harness (this project's sharded embeddings and loop) or torchrec (stock TorchRec:
    DistributedModelParallel, TrainPipelineSparseDist, DLRM_DCN; needs torchrec installed, and
    refuses the harness's own optimization flags and sharding types it cannot run here)."""
    iters: int = 20
    """Timed iterations, after the warm-up ones."""
    warmup_iters: int = option(3, option="warmup")
    """Iterations run first, recorded with warmup=True and left out of summaries."""
    nodes: int = 1
    """Nodes of the job; here on one machine they are simulated, ranks grouped by node in the records."""
    gpus_per_node: int = 2
    """Ranks per node (one per GPU on CUDA; processes on a CPU machine)."""
    device: str = option("auto", choices=DEVICES)
    """auto (CUDA if present, else CPU), cpu or cuda."""
    timeline: bool = True
    """Per-stage NVTX ranges and timers; off keeps only per-iteration times (to measure their cost)."""
    flush_every: int = 100
    """Iterations between writes of the records to the run folder, between iterations: a write costs
    ~13 ms here whatever it holds (10 or 100 iterations), so every 10 cost tiny 1.3 ms a cycle."""
    collective_timeout_s: float = option(300.0, option="collective-timeout")
    """How long a collective may wait, in seconds, before the job is declared failed."""
    fail_at: tuple[int, int] | None = option(None, metavar="RANK:ITER")
    """Fault injection for tests: (rank, iteration) at which that rank raises. Left out: no fault."""
    profile: tuple[int, int] | None = option(None, metavar="FIRST:LAST")
    """Iterations FIRST..LAST under torch.profiler, a Chrome trace a rank (rankNNNNN/trace.json:
    Perfetto, HTA), each stage an annotated range over its ops and kernels (harness/run/profile_window.py).
    Those iterations pay the profiler's cost: put them in the warm-up. Left out: no profiler."""
    stall_at: tuple[int, int] | None = option(None, metavar="RANK:ITER")
    """Fault injection: (rank, iteration) at which that rank hangs; the others' collective timeout ends the job."""

    def __post_init__(self) -> None:
        for name in ("iters", "nodes", "gpus_per_node", "flush_every"):
            _positive_int(f"run.{name}", getattr(self, name))
        _non_negative_int("run.warmup_iters", self.warmup_iters)
        _one_of("run.engine", self.engine, ENGINES)
        _one_of("run.device", self.device, DEVICES)
        if not self.collective_timeout_s > 0:
            raise ValueError("run.collective_timeout_s must be > 0")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


DEFAULT_DYNAMIC_SLOTS = 65536
"""Slots of each dynamic table when neither --dynamic-slots nor --dynamic-memory-gib is given."""


@dataclass(kw_only=True, frozen=True)
class DynamicConfig:
    """Dynamic tables (`--shard T=dynamic`): slots, eviction and the parameter store
    (model/dynamic_table.py, harness/run/param_store.py)."""

    slots: int | None = option(None, option="dynamic-slots", metavar="N")
    """Rows each dynamic table keeps resident on its rank (at most its rows; dynamic_row_wise: on
    each rank, of its row block's ids); the planner counts these, not the table's rows. Left out:
    65536, or what --dynamic-memory-gib gives."""
    memory_gib: float | None = option(None, option="dynamic-memory-gib", metavar="GIB")
    """Instead of --dynamic-slots: what all dynamic tables' slots may hold together, over all ranks
    (rows and optimizer state, as the planner counts them). Each table's share follows its ids a
    sample, up to its rows (model/dynamic_budget.py), a dynamic_row_wise table's share split evenly over
    the ranks; the plan records the slots it gives."""
    policy: str = option("hybrid", option="dynamic-policy", choices=DYNAMIC_POLICIES)
    """Which id a full table evicts: lru (least recent), lfu (fewest accesses), hybrid (accesses
    with decaying counters, as Redis's LFU; least recent among equals)."""
    half_life: int = option(1 << 20, option="dynamic-half-life", metavar="IDS")
    """Id occurrences after which a hybrid counter halves."""
    ps: str | None = option(None, metavar="redis://HOST:PORT[/DB]")
    """Where evicted rows and their optimizer state go: a Redis server, or (left out) the embedded
    store: this process's memory up to --ps-memory-gib, then a file under the run folder."""
    ps_memory_gib: float = 1.0
    """Host memory the embedded store may take for rows (each rank's), before spilling to its file."""
    ps_spill_gib: float = 16.0
    """What the embedded store's file under the run folder may grow to (each rank's); past both, the run fails."""

    def __post_init__(self) -> None:
        if self.slots is not None and self.memory_gib is not None:
            raise ValueError("dynamic: give --dynamic-slots or --dynamic-memory-gib, not both")
        if self.slots is not None:
            _positive_int("dynamic.slots", self.slots)
        positive_numbers("dynamic", self, ("memory_gib",))
        _positive_int("dynamic.half_life", self.half_life)
        _one_of("dynamic.policy", self.policy, DYNAMIC_POLICIES)
        if self.ps is not None:
            check_store_url(self.ps)
        positive_numbers("dynamic", self, ("ps_memory_gib", "ps_spill_gib"), zero=True)


EVAL_STAGES = ("val", "test")


@dataclass(kw_only=True, frozen=True)
class EvalConfig:
    """Evaluation on the held-out day of the files at --data (harness/run/evaluate.py)."""

    every_samples: int = option(0, option="eval-every", metavar="SAMPLES")
    """Score AUROC after the first iteration that reaches each multiple of this many training
    samples, and after the last iteration; 0: no evaluation. Needs --data."""
    target_auc: float | None = None
    """Stop training at the first evaluation whose AUROC reaches this (time to target); left out: train
    every iteration asked for. Needs --eval-every."""
    stage: str = option("val", option="eval-stage", choices=EVAL_STAGES)
    """The half of the held-out day that scores: val (its first half) or test (its second)."""
    submission_org: str = "dlrm-dcnv2-harness"
    """The organization the MLPerf result log names (harness/run/mlperf_log.py; evaluating runs write it)."""

    def __post_init__(self) -> None:
        _non_negative_int("evaluation.every_samples", self.every_samples)
        _one_of("evaluation.stage", self.stage, EVAL_STAGES)
        if self.target_auc is not None:
            if not 0.5 < self.target_auc < 1.0:
                raise ValueError(f"evaluation.target_auc must be between 0.5 and 1, got {self.target_auc}")
            if not self.every_samples:
                raise ValueError("evaluation.target_auc is checked at evaluations: give --eval-every too")


@dataclass(kw_only=True, frozen=True)
class BenchConfig:
    """A whole benchmark run; dependent settings across concerns are checked here."""

    model: ModelConfig
    """Model shape."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Dense and embedding optimizers."""
    data: DataConfig
    """Synthetic data."""
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    """Embedding sharding."""
    optimizations: OptimizationsConfig = field(default_factory=OptimizationsConfig)
    """Loop shape and optimization flags."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """Numeric precision of the dense arch."""
    run: RunConfig
    """Launch and measurement."""
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    """AUROC on the held-out day (files only)."""
    dynamic: DynamicConfig = field(default_factory=DynamicConfig)
    """Dynamic tables' slots, eviction policy and parameter store."""

    def __post_init__(self) -> None:
        finite_numbers(self)
        for t, _ in self.sharding.per_table:
            if not 0 <= t < self.model.num_sparse:
                raise ValueError(f"sharding.per_table names table {t}; tables are 0..{self.model.num_sparse - 1}")
        dp = ShardingType.DATA_PARALLEL
        uses_dp = self.sharding.kind == dp or any(k == dp for _, k in self.sharding.per_table)
        if uses_dp and self.optimizer.embedding_optimizer != "exact_adagrad":
            raise ValueError(
                "data_parallel tables train with dense Adagrad (= exact_adagrad); with "
                f"optimizer.embedding_optimizer={self.optimizer.embedding_optimizer!r} shard them another way"
            )
        uses_dynamic = self.sharding.kind in DYNAMIC_KINDS or any(k in DYNAMIC_KINDS for _, k in self.sharding.per_table)
        if self.dynamic.ps is not None and not uses_dynamic:
            raise ValueError(f"--ps {mask_secrets(self.dynamic.ps)} has nothing to store: no table is dynamic (--shard T=dynamic)")
        if self.dynamic.memory_gib is not None and not uses_dynamic:
            raise ValueError(f"--dynamic-memory-gib {self.dynamic.memory_gib:g} has nothing to size: no table is dynamic "
                             "(--shard T=dynamic)")
        if uses_dynamic and self.run.engine != "harness":
            raise ValueError(f"dynamic tables run on the harness engine only, not {self.run.engine!r}")
        if self.optimizations.skip_splits_a2a and self.data.ragged_every == 1:
            raise ValueError("skip_splits_a2a needs fixed hotness, but data.ragged_every=1 makes every batch "
                             "variable-length: there is no batch whose splits are known in advance")
        total = self.run.warmup_iters + self.run.iters
        for name in ("fail_at", "stall_at"):
            at = getattr(self.run, name)
            if at is not None and not (0 <= at[0] < self.run.world_size and 0 <= at[1] < total):
                # A fault that can never fire would make the test that asked for it pass vacuously.
                raise ValueError(f"run.{name} {at[0]}:{at[1]} never happens: ranks are 0..{self.run.world_size - 1} "
                                 f"and iterations 0..{total - 1}")
        profile = self.run.profile
        if profile is not None and not 0 <= profile[0] <= profile[1] < total:
            raise ValueError(f"run.profile {profile[0]}:{profile[1]} is not a window of the run's iterations 0..{total - 1}")
        if self.evaluation.every_samples and self.data.path is None:
            raise ValueError("evaluation needs --data: the synthetic stream has no held-out day")
        if self.data.global_batch_size % self.run.world_size:
            raise ValueError(
                f"global batch {self.data.global_batch_size} does not divide by the world size "
                f"{self.run.world_size} (nodes {self.run.nodes} x gpus_per_node {self.run.gpus_per_node}); "
                f"pick a batch that is a multiple of {self.run.world_size}"
            )

    @property
    def local_batch_size(self) -> int:
        return self.data.global_batch_size // self.run.world_size

    def replace(self, **changes: Any) -> "BenchConfig":
        """A copy with whole concerns replaced, checked again (for ablations and tests)."""
        return dataclasses.replace(self, **changes)
