"""The TorchRec engine: stock TorchRec (DLRM_DCN, DistributedModelParallel, TrainPipelineSparseDist)
trained on the harness's config, plan, batches and initial weights, writing the same records.

What it times: every iteration (around one `TrainPipelineSparseDist.progress`) and, of the five
stages, only `dense_update` (the dense optimizer's step, which the pipeline calls as one method).
The other stages run inside `progress` interleaved with the next batch's input dist, with no seam
this engine could time without changing what TorchRec runs, so they are not recorded.
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from collections import deque
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from harness.config import BenchConfig, ModelConfig
from harness.data.source import BatchSource
from harness.names import ENGINE_TIMED_STAGES
from harness.run.optimizations import dense_adagrad
from harness.run.timeline import Timeline
from harness.run.rank import RankEnv, RankParts, build_dense, records_flusher
from harness.run.step import StepOutput
from model.embeddings import EMBEDDING_OPTIMIZERS, init_shard_
from model.names import ShardingType
from model.sharding import Shard, TablePlan

TIMED_STAGES = ENGINE_TIMED_STAGES["torchrec"]
"""The stages this engine records (the manifest says so; the others are absent, never guessed)."""

# Kinds TorchRec runs here; a plan with another kind is refused before any process starts.
SUPPORTED_KINDS = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL)
FLAGS_NOT_IN_TORCHREC = ("cuda_graphs", "threaded_input_dist", "pinned_d2h", "skip_splits_a2a")


def check_config(cfg: BenchConfig, plan_kinds: Sequence[str]) -> None:
    """One-line ValueError for what the torchrec engine cannot run (called before any process starts)."""
    for kind in dict.fromkeys(plan_kinds):
        if kind not in SUPPORTED_KINDS:
            raise ValueError(f"--engine torchrec cannot shard a table {kind}; pick --sharding "
                             f"{'/'.join(SUPPORTED_KINDS)}")
    if cfg.precision.dense == "bf16-pure":
        raise ValueError("--engine torchrec runs bf16 as autocast around stock TorchRec's arch: drop "
                         "--dense-precision bf16-pure (bf16 compares the engines at the same math)")
    if cfg.precision.tables != "fp32":
        raise ValueError(f"--engine torchrec here runs its tables in fp32: drop --table-precision {cfg.precision.tables}")
    if cfg.precision.comm != "fp32" or cfg.precision.wire_bwd != "fp32":
        raise ValueError("--engine torchrec here sends its pooled embeddings in fp32: drop --comm-precision / "
                         "--comm-precision-bwd")
    if not cfg.optimizations.pipeline:
        raise ValueError("--engine torchrec always trains through TrainPipelineSparseDist: drop --no-pipeline")
    if cfg.evaluation.every_samples:
        raise ValueError("--engine torchrec does not evaluate: --eval-every runs with --engine harness")
    asked = [f for f in FLAGS_NOT_IN_TORCHREC if getattr(cfg.optimizations, f)]
    if asked:
        raise ValueError(f"--engine torchrec runs stock TorchRec: the harness's flag(s) {', '.join(asked)} "
                         "do not exist there; drop them")
    if importlib.util.find_spec("torchrec") is None:
        raise ValueError("--engine torchrec needs torchrec in this Python: run it through make (which installs "
                         "requirements-torchrec.txt) or use --engine harness")


def _quiet_library_notices() -> None:
    """TorchRec 1.8 on torch 2.13 prints a deprecation notice per DDP wrap and an fx-tracing notice
    per rank, dozens of lines a run that bury the harness's own progress; they say nothing about
    the run, so they are filtered (errors still show)."""
    warnings.filterwarnings("ignore", message=r"`broadcast_buffers` is deprecated", category=FutureWarning)
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)


def table_name(t: int) -> str:
    return f"t{t}"


def feature_name(t: int) -> str:
    return f"f{t}"


def dense_name_map(model: ModelConfig) -> dict[str, str]:
    """model.dense.DenseArch's parameter names -> DLRM_DCN's (inside DLRMTrain).

    The architectures match layer for layer (checked by tests/test_engine_torchrec.py through equal
    losses): TorchRec's DenseArch is an MLP with ReLU after every layer (as the harness's bottom);
    its LowRankCrossNet computes x0 * (W (V x) + b) + x with V_kernels (rank, width) and W_kernels
    (width, rank), i.e. nn.Linear weights; its OverArch is an MLP with ReLU then one plain Linear.
    """
    names: dict[str, str] = {}
    for i in range(len(model.bottom_mlp)):  # harness: Linear, ReLU, Linear, ReLU ...
        for p in ("weight", "bias"):
            names[f"bottom.{2 * i}.{p}"] = f"model.dense_arch.model._mlp.{i}._linear.{p}"
    for layer in range(model.cross_layers):
        names[f"cross.V.{layer}.weight"] = f"model.inter_arch.crossnet.V_kernels.{layer}"
        names[f"cross.W.{layer}.weight"] = f"model.inter_arch.crossnet.W_kernels.{layer}"
        names[f"cross.W.{layer}.bias"] = f"model.inter_arch.crossnet.bias.{layer}"
    last = len(model.top_mlp) - 1
    for i in range(last):
        for p in ("weight", "bias"):
            names[f"top.{2 * i}.{p}"] = f"model.over_arch.model.0._mlp.{i}._linear.{p}"
    for p in ("weight", "bias"):
        names[f"top.{2 * last}.{p}"] = f"model.over_arch.model.1.{p}"
    return names


class TimedOptimizer:
    """The dense optimizer as TrainPipelineSparseDist calls it (zero_grad, step), its step timed as
    dense_update: the one stage that is a single call inside `progress`."""

    def __init__(self, opt: torch.optim.Optimizer, timeline: Timeline) -> None:
        self.opt, self.timeline = opt, timeline
        self.param_groups = opt.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.opt.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None) -> None:
        with self.timeline.stage("dense_update"):
            self.opt.step()


_DRAWN_BATCH = None


def drawn_on_device(batch):
    """A TorchRec Batch already on the GPU, drawn on the current stream: the pipeline's copy to the
    device runs on its own stream, which must wait for the draw first (an event, not a host sync),
    and marks the tensors as its own (the caching allocator then keeps them for it)."""
    global _DRAWN_BATCH
    if _DRAWN_BATCH is None:
        from torchrec.datasets.utils import Batch

        class DrawnBatch(Batch):
            drawn: torch.cuda.Event | None = None

            def to(self, device, non_blocking=False):
                stream = torch.cuda.current_stream(device)
                stream.wait_event(self.drawn)
                self.record_stream(stream)
                return super().to(device, non_blocking=non_blocking)

        _DRAWN_BATCH = DrawnBatch
    out = _DRAWN_BATCH(dense_features=batch.dense_features, sparse_features=batch.sparse_features,
                       labels=batch.labels)
    out.drawn = torch.cuda.Event()
    out.drawn.record()
    return out


class Lookahead:
    """The batches the pipeline pulls, made before the timed region as the harness's feeder does:
    `prepare(it)` makes those `progress(it)` may pull (it fetches up to two batches ahead)."""

    def __init__(self, data: BatchSource, *, rank: int, world_size: int, total: int) -> None:
        self.data, self.rank, self.world, self.total = data, rank, world_size, total
        self.made = 0
        self.ready: deque = deque()

    def _make(self) -> None:
        from torchrec.datasets.utils import Batch
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        b = self.data.local_batch(self.made, self.rank, self.world)
        kjt = KeyedJaggedTensor(keys=[feature_name(t) for t in range(b.sparse.num_features)],
                                values=b.sparse.values, lengths=b.sparse.lengths.reshape(-1))
        batch = Batch(dense_features=b.dense, sparse_features=kjt, labels=b.labels)
        if b.dense.is_cuda:  # drawn on the GPU (--draw-on device), on this thread's stream
            batch = drawn_on_device(batch)
        self.ready.append(batch)
        self.made += 1

    def prepare(self, it: int) -> None:
        while self.made < min(self.total, it + 3):
            self._make()

    def __iter__(self) -> Iterator:
        return self

    def __next__(self):
        if not self.ready:
            if self.made >= self.total:
                raise StopIteration
            self._make()
        return self.ready.popleft()


def _local_shards(dmp: nn.Module, num_tables: int) -> list[tuple[int, int, int, torch.Tensor]]:
    """(table, row offset, column offset, local weight view) of every table shard on this rank."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    out = []
    prefix = "model.sparse_arch.embedding_bag_collection.embedding_bags."
    for name, value in dmp.state_dict().items():
        if not (name.startswith(prefix) and name.endswith(".weight")):
            continue
        t = int(name[len(prefix):-len(".weight")][1:])
        if not 0 <= t < num_tables:
            raise RuntimeError(f"unexpected table {name}")
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                row, col = shard.metadata.shard_offsets
                out.append((t, row, col, shard.tensor))
        else:  # a data-parallel table: the whole table, replicated
            out.append((t, 0, 0, value))
    return out


def embedding_bags(model: ModelConfig) -> nn.Module:
    """TorchRec's EmbeddingBagCollection of the config's tables, on the meta device (the real
    weights are the harness's, copied into the shards once they are placed)."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    return EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=table_name(t), embedding_dim=model.embedding_dim, num_embeddings=rows,
                                   feature_names=[feature_name(t)]) for t, rows in enumerate(model.table_rows)],
        device=torch.device("meta"),
    )


def module_plan(cfg: BenchConfig, plan: list[TablePlan], ebc: nn.Module, device_type: str):
    """TorchRec's sharding plan of `ebc` with the harness plan's placement exactly (ranks of table-
    and column-wise shards; row-wise blocks are ceil(rows / world) in both) and the fused kernel
    (the optimizer runs inside backward). A shard on rank r sits on its node's GPU r % gpus_per_node:
    `local_size` is the ranks of a node, not of the world."""
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.sharding_plan import (
        column_wise, construct_module_sharding_plan, data_parallel, row_wise, table_wise,
    )

    fused = EmbeddingComputeKernel.FUSED.value
    generators = {
        ShardingType.TABLE_WISE: lambda tp: table_wise(rank=tp.shards[0].rank, compute_kernel=fused),
        ShardingType.COLUMN_WISE: lambda tp: column_wise(ranks=[s.rank for s in tp.shards], compute_kernel=fused),
        ShardingType.ROW_WISE: lambda tp: row_wise(compute_kernel=fused),
        ShardingType.DATA_PARALLEL: lambda tp: data_parallel(),  # dense kernel: replicas, gradients through DDP
    }
    return construct_module_sharding_plan(
        ebc, {table_name(t): generators[tp.kind](tp) for t, tp in enumerate(plan)},
        world_size=cfg.run.world_size, local_size=cfg.run.gpus_per_node, device_type=device_type,
    )


def _autocast_forward(arch: nn.Module, device_type: str, dtype: torch.dtype, *, float_out: bool = False) -> None:
    """Run `arch` under autocast, as the harness's dense step runs its DenseArch (harness/run/dense_step.py):
    the forward method swapped on the instance, so parameter names (and DDP's buckets) stay as they
    are. float_out: hand back fp32 (the logits: the loss is taken in fp32 on both engines)."""
    forward = arch.forward

    def autocast_forward(*args, **kwargs):
        with torch.autocast(device_type, dtype=dtype, cache_enabled=False):
            out = forward(*args, **kwargs)
        return out.float() if float_out else out

    arch.forward = autocast_forward


def _dlrm_train(cfg: BenchConfig, ebc: nn.Module, device: torch.device) -> tuple[nn.Module, dict[str, str]]:
    """(DLRMTrain over DLRM_DCN with the harness's initial dense weights, harness -> TorchRec names)."""
    from torchrec.distributed.comm_ops import set_gradient_division
    from torchrec.models.dlrm import DLRM_DCN, DLRMTrain

    m = cfg.model
    dlrm = DLRM_DCN(
        embedding_bag_collection=ebc, dense_in_features=m.num_dense, dense_arch_layer_sizes=list(m.bottom_mlp),
        over_arch_layer_sizes=list(m.top_mlp), dcn_num_layers=m.cross_layers, dcn_low_rank_dim=m.cross_rank,
        dense_device=device,
    )
    # Same gradients as the harness, which divides each rank's mean loss by the world size and
    # sums dense gradients (every gradient is that of the global-batch mean): stock TorchRec gets
    # there from each rank's plain mean loss, because DDP averages the dense gradients and
    # TorchRec's embedding all-to-all / reduce-scatter backward divides by the world size
    # (comm_ops.GRADIENT_DIVISION, on by default, set here so the engine does not depend on a
    # global someone else may flip). Adagrad with eps is not scale-invariant: a gradient off by
    # the world size changes the updates, not only their scale (tests/test_engine_torchrec.py).
    set_gradient_division(True)
    if cfg.precision.dense == "bf16":  # the same mixed precision as the harness: the comparison stays same-math
        for arch in (dlrm.dense_arch, dlrm.inter_arch):
            _autocast_forward(arch, device.type, torch.bfloat16)
        _autocast_forward(dlrm.over_arch, device.type, torch.bfloat16, float_out=True)
    net = DLRMTrain(dlrm)
    names = dense_name_map(m)
    own = dict(net.named_parameters())
    with torch.no_grad():
        for h, v in build_dense(cfg, device).state_dict().items():
            own[names[h]].copy_(v)
    return net, names


def build(cfg: BenchConfig, *, device: torch.device, plan: list[TablePlan], timeline: Timeline):
    """(DMP model, timed dense optimizer, TorchRec -> harness dense parameter names), built on the
    harness's plan and initial weights, with the embedding optimizer fused into backward."""
    _quiet_library_notices()
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    m = cfg.model
    ebc = embedding_bags(m)
    net, names = _dlrm_train(cfg, ebc, device)
    own = dict(net.named_parameters())
    dense_params = [own[n] for n in names.values()]
    sharder = EmbeddingBagCollectionSharder(fused_params={
        "optimizer": EMBEDDING_OPTIMIZERS[cfg.optimizer.embedding_optimizer],
        "learning_rate": cfg.optimizer.learning_rate, "eps": cfg.optimizer.eps,
    })
    dmp = DistributedModelParallel(
        net, env=ShardingEnv.from_process_group(dist.group.WORLD), device=device,
        plan=ShardingPlan({"model.sparse_arch.embedding_bag_collection": module_plan(cfg, plan, ebc, device.type)}),
        sharders=[sharder],
    )
    with torch.no_grad():
        for t, row, col, w in _local_shards(dmp, m.num_sparse):
            init_shard_(w, table=t, table_rows=m.table_rows[t], table_dim=m.embedding_dim,
                        row_start=row, col_start=col, seed=cfg.data.seed)
    # Data-parallel tables have no fused optimizer: like the harness, they train with the dense
    # Adagrad on their (DDP-averaged) dense gradient.
    sharded = dict(dmp.named_parameters())
    replicated = [sharded[n] for t, tp in enumerate(plan) if tp.kind == ShardingType.DATA_PARALLEL
                  for n in sharded if n.endswith(f"embedding_bags.{table_name(t)}.weight")]
    if len(replicated) != sum(tp.kind == ShardingType.DATA_PARALLEL for tp in plan):
        raise RuntimeError(f"found {len(replicated)} data-parallel table parameters in TorchRec's model")
    # The manifest's choice (run/optimizations.dense_adagrad: foreach on CUDA, and why), else torch's default.
    foreach = dense_adagrad(device.type, engine="torchrec").impl == "foreach"
    opt = torch.optim.Adagrad(dense_params + replicated, lr=cfg.optimizer.learning_rate, eps=cfg.optimizer.eps,
                              foreach=foreach or None)
    return dmp, TimedOptimizer(opt, timeline), {v: k for k, v in names.items()}


class TorchRecStep:
    """Stock TorchRec's iteration: one `TrainPipelineSparseDist.progress` (input dist of the next
    batches, forward, backward, the fused embedding update and the timed dense optimizer step)."""

    def __init__(self, cfg: BenchConfig, *, rank: int, device: torch.device, plan: list[TablePlan], data: BatchSource,
                 timeline: Timeline) -> None:
        from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

        check_config(cfg, [tp.kind for tp in plan])
        self.cfg, self.rank, self.data = cfg, rank, data
        self.dmp, optimizer, self.harness_names = build(cfg, device=device, plan=plan, timeline=timeline)
        self.pipeline = TrainPipelineSparseDist(self.dmp, optimizer, device, execute_all_batches=True)  # type: ignore[arg-type]
        self.batches: Lookahead | None = None

    def begin_segment(self, first: int, end: int) -> None:
        if first:  # the pipeline pulls batches itself from the start; evaluations (segments) are refused
            raise ValueError("the torchrec engine runs one segment from iteration 0")
        self.batches = Lookahead(self.data, rank=self.rank, world_size=self.cfg.run.world_size, total=end)

    def prepare(self, it: int) -> None:
        self.batches.prepare(it)

    def run(self, it: int) -> StepOutput:
        return StepOutput(loss=self.pipeline.progress(self.batches)[0])  # DLRMTrain's output: (loss, logits, labels)

    def bytes_moved(self) -> None:
        return None  # TorchRec's collectives are not counted

    def end_segment(self) -> None:
        self.batches = None

    def dynamic_counts(self) -> dict:
        return {}

    def final_weights(self) -> tuple[dict[str, torch.Tensor], list[tuple[int, Shard, torch.Tensor]]]:
        own = dict(self.dmp.module.named_parameters())
        shards = [
            (t, Shard(self.rank, row, row + w.shape[0], col, col + w.shape[1]), w.detach().cpu().clone())
            for t, row, col, w in _local_shards(self.dmp, self.cfg.model.num_sparse) if w.numel()
        ]
        return {h: own[n].detach().cpu().clone() for n, h in self.harness_names.items()}, shards


def build_torchrec_rank(env: RankEnv, data: BatchSource) -> RankParts:
    """The TorchRec engine's parts: the same records as the harness engine's, fewer stages timed."""
    timeline = Timeline(cuda=env.device.type == "cuda", stages=env.cfg.run.timeline, device=env.device)
    step = TorchRecStep(env.cfg, rank=env.rank, device=env.device, plan=env.plan, data=data, timeline=timeline)
    return RankParts(step=step, timeline=timeline, records=records_flusher(env, timeline), data=data)
