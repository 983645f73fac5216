"""The CUDA path's choices, checked on a CPU (issue 43): each place the code picks something by
device, tested as the choice itself, against what the first H100 run and a reading of torch,
TorchRec and fbgemm found. What needs a GPU to run is in tests/gpu/ (make gpu-check)."""

from __future__ import annotations

import inspect
import json
import types
import warnings
from pathlib import Path

import pytest
import torch

from harness.config import ShardingConfig
from harness.presets import tiny

DATA = Path(__file__).resolve().parent / "data"


# ---- (1) the dense optimizer ----------------------------------------------------------------

def test_dense_adagrad_is_foreach_where_torch_has_no_fused_kernel():
    """torch 2.11's fused Adagrad is CPU-only: on CUDA the harness must not ask for it."""
    from harness.run.optimizations import dense_adagrad, fused_adagrad_registered

    assert dense_adagrad("cuda", has_kernel=lambda device: False).impl == "foreach"
    assert dense_adagrad("cuda", has_kernel=lambda device: True).impl == "fused"
    # This torch (a CPU build) has the CPU kernel and no CUDA one: its dispatcher says so.
    assert fused_adagrad_registered("cpu") and not fused_adagrad_registered("cuda")
    assert dense_adagrad("cpu").impl == "fused" and dense_adagrad("cuda").impl == "foreach"
    assert dense_adagrad("cuda", engine="torchrec").impl == "foreach"  # asked for: TorchRec's table slices
    assert dense_adagrad("cpu", engine="torchrec").impl == "default"


def test_a_cuda_kernel_that_torch_adagrad_refuses_is_not_fused(monkeypatch):
    """What the second H100 session met: torch 2.11 registers a CUDA `_fused_adagrad_` kernel, yet its
    Adagrad passes `cuda_unsupported=True` to its device check and raises at the first step."""
    import inspect

    import torch

    from harness.run import optimizations

    monkeypatch.setattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", lambda op, key: True)
    real = inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda obj: "_device_dtype_check_for_fused(p, cuda_unsupported=True)"
                        if obj is inspect.getmodule(torch.optim.Adagrad) else real(obj))
    assert not optimizations.fused_adagrad_registered("cuda") and optimizations.fused_adagrad_registered("cpu")
    monkeypatch.setattr(inspect, "getsource", lambda obj: "_device_dtype_check_for_fused(p)")
    assert optimizations.fused_adagrad_registered("cuda")


def test_the_manifest_records_the_dense_optimizer():
    from harness.records.manifest import ResolvedFlags
    from harness.records.typed_json import dumps, loads
    from harness.run.optimizations import describe, resolve

    cfg = tiny()
    flags = resolve(cfg.optimizations, cuda=True, plan_kinds=["table_wise"], torch_version="2.11.0")
    assert flags.dense_optimizer.impl == "foreach" and "no fused Adagrad kernel for cuda" in flags.dense_optimizer.reason
    assert loads(ResolvedFlags, dumps(flags)).dense_optimizer == flags.dense_optimizer
    assert "dense optimizer: Adagrad foreach" in describe(flags)
    old = {k: v for k, v in json.loads(dumps(flags)).items() if k != "dense_optimizer"}  # a manifest from before
    assert loads(ResolvedFlags, json.dumps(old)).dense_optimizer.impl == "not recorded"


def test_the_gradients_are_gathered_eager_and_views_under_a_cuda_graph():
    """A captured step needs the gradients as static views of the buffer; eager they are gathered
    (harness/run/dense_gradients.py). Recorded; a manifest from before read as the views it ran."""
    from harness.config import OptimizationsConfig
    from harness.records.manifest import ResolvedFlags
    from harness.records.typed_json import dumps, loads
    from harness.run.optimizations import describe, resolve

    graphs = OptimizationsConfig(cuda_graphs=True)
    assert resolve(graphs, cuda=True, plan_kinds=["table_wise"]).dense_grads.impl == "views"
    assert resolve(graphs, cuda=False, plan_kinds=["table_wise"]).dense_grads.impl == "gather"  # inactive on CPU
    eager = resolve(OptimizationsConfig(), cuda=True, plan_kinds=["table_wise"])
    assert eager.dense_grads.impl == "gather" and "dense gradients: gather" in describe(eager)
    assert resolve(OptimizationsConfig(), cuda=True, plan_kinds=["table_wise"], engine="torchrec").dense_grads.impl == "ddp"
    asked = resolve(OptimizationsConfig(gather_grads=False), cuda=False, plan_kinds=["table_wise"]).dense_grads
    assert asked.impl == "views" and not asked.reason  # --no-gather-grads, as asked
    old = {k: v for k, v in json.loads(dumps(eager)).items() if k != "dense_grads"}
    assert loads(ResolvedFlags, json.dumps(old)).dense_grads.impl == "views"
    # A manifest from before the gather: its config reads as the views it ran, so a projection of
    # that config makes the same choice (RunManifest.from_json).
    from harness.records.manifest import RunManifest

    manifest = json.loads((DATA / "h100-runs-2" / "s-bf16-r0" / "manifest.json").read_text())
    assert "gather_grads" not in manifest["config"]["optimizations"]
    assert RunManifest.from_json(json.dumps(manifest)).config.optimizations.gather_grads is False


def test_the_foreach_dense_optimizer_never_asks_for_fused_and_matches_it():
    """The optimizer built for a device without the fused kernel passes fused=False, and both ways
    give Adagrad's updates, against Adagrad written out in float64 (sum += g^2; p -= lr g / (sqrt(sum) + eps))."""
    from harness.run.dense_gradients import FlatGradients
    from harness.run.rank import build_dense, dense_optimizer

    cfg = tiny()
    lr, eps = cfg.optimizer.learning_rate, cfg.optimizer.eps
    params = {}
    reference = None
    for impl in ("fused", "foreach"):
        dense = build_dense(cfg, torch.device("cpu"))
        grads = FlatGradients(dense, world_size=1, group=None)
        opt = dense_optimizer(grads, cfg, impl)
        assert opt.fused is (impl == "fused") and opt.foreach is (impl == "foreach")
        flat = opt.param
        p64, sums = flat.detach().double().clone(), torch.zeros(flat.shape, dtype=torch.float64)
        gen = torch.Generator().manual_seed(0)
        for _ in range(5):
            g = torch.randn(grads.buffer.shape, generator=gen)
            grads.buffer.copy_(g)
            opt.step()
            sums += g.double() ** 2
            p64 -= lr * g.double() / (sums.sqrt() + eps)
        params[impl] = flat.detach().clone()
        reference = p64
    for impl in ("fused", "foreach"):
        torch.testing.assert_close(params[impl].double(), reference, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="fused or foreach"):
        dense_optimizer(grads, cfg, "not recorded")


# ---- (2) CUDA ranks in tests -----------------------------------------------------------------

def test_cuda_ranks_start_as_fresh_interpreters(tmp_path, monkeypatch):
    """A rank forked after CUDA was initialised cannot use it: CUDA ranks are spawned, never forked
    (from the test process or from a server), and no fork server is started for them."""
    import tests.distributed as d

    assert d.start_method("cuda") == "spawn" and d.start_method("cpu") == "forkserver"
    started = []

    class Stop(Exception):
        pass

    def fake_start(fn, *, args, nprocs, join, start_method):
        started.append(start_method)
        raise Stop

    monkeypatch.setattr(d.mp, "start_processes", fake_start)
    monkeypatch.setattr(d.fork_server, "ready_server", lambda **kw: pytest.fail("fork server started for CUDA ranks"))
    with pytest.raises(Stop):
        d.spawn_ranks(lambda *a: None, 2, tmp_path, device="cuda")
    assert started == ["spawn"]


# ---- (8) what several GPUs would hit -----------------------------------------------------------

def test_torchrec_places_each_shard_on_its_nodes_gpu():
    """2 nodes x 8 GPUs: rank r's shards go to cuda:(r % 8), not cuda:r (which DMP would refuse)."""
    from harness.launch.planning import make_plan
    from harness.run.engine_torchrec import embedding_bags, module_plan

    for kind in ("table_wise", "row_wise", "column_wise"):
        cfg = tiny(nodes=2, gpus_per_node=8, device="cpu").replace(sharding=ShardingConfig(kind=kind))
        plan, _ = make_plan(cfg, ranks_per_host=8)
        placed = [(s.placement.rank(), s.placement.device())
                  for ps in module_plan(cfg, plan, embedding_bags(cfg.model), "cuda").values()
                  for s in ps.sharding_spec.shards]
        assert placed and {r for r, _ in placed} - set(range(8)), kind  # some shards on the second node
        assert all(dev == torch.device("cuda", r % 8) for r, dev in placed), (kind, placed[:4])


def test_gather_and_reduce_scatter_fall_back_to_the_older_names():
    """torch 2.13 names them *_single; an older torch has all_gather_into_tensor and reduce_scatter_tensor."""
    from model.collective_ops import pick

    old = types.SimpleNamespace(all_gather_into_tensor="old-ag", reduce_scatter_tensor="old-rs")
    new = types.SimpleNamespace(all_gather_single="new-ag", all_gather_into_tensor="old-ag")
    assert pick(old, "all_gather_single", "all_gather_into_tensor") == "old-ag"
    assert pick(old, "reduce_scatter_single", "reduce_scatter_tensor") == "old-rs"
    assert pick(new, "all_gather_single", "all_gather_into_tensor") == "new-ag"
    with pytest.raises(ImportError, match="neither"):
        pick(types.SimpleNamespace(), "all_gather_single", "all_gather_into_tensor")


def test_a_replayed_dense_step_counts_its_gradient_bytes():
    """A CUDA graph's replay runs the captured all-reduces without the Python that counts them: each
    replayed step counts them itself, and warm-up and capture count nowhere (they are no step)."""
    from harness.run.dense_gradients import FlatGradients
    from harness.run.dense_step import DenseStep
    from harness.run.rank import build_dense
    from model.collective_bytes import CollectiveBytes

    cfg = tiny()
    dense = build_dense(cfg, torch.device("cpu"))
    moved = CollectiveBytes()
    grads = FlatGradients(dense, world_size=2, group=None, bytes_moved=moved)  # counting needs no process group
    nbytes = grads.buffer.numel() * grads.buffer.element_size()
    with grads.uncounted():
        grads.count_step()
    assert moved.take()["dense_grads"] == (0, 0)
    m, b = cfg.model, cfg.local_batch_size
    step = DenseStep(dense=dense, grads=grads, world_size=2, local_batch=b, num_dense=m.num_dense,
                     pooled_width=m.num_sparse * m.embedding_dim, device=torch.device("cpu"), graphed=False,
                     precision="fp32")
    step.graphed = True  # the replay path, with the replay itself stood in (it needs a GPU)
    step._replay = lambda x, p, y: (torch.zeros(()), torch.zeros(b, m.num_sparse * m.embedding_dim))
    for _ in range(3):
        step.run(torch.zeros(b, m.num_dense), torch.zeros(b, m.num_sparse * m.embedding_dim), torch.zeros(b))
        # An all-reduce over 2 ranks sends and receives 2 (w - 1) / w = 1 times the buffer, per step.
        assert moved.take()["dense_grads"] == (nbytes, nbytes)


def test_cuda_ranks_bind_their_gpu_when_the_process_group_starts():
    """NCCL communicators made at init_process_group (device_id), not lazily inside iteration 0."""
    from harness.run.device import process_group_options

    dev = torch.device("cuda", 3)
    assert process_group_options(dev) == {"device_id": dev}
    assert process_group_options(torch.device("cpu")) == {}
    import harness.run.worker as worker

    assert "**process_group_options(device)" in inspect.getsource(worker.run_rank)


def _slot_work_log(rank: int, world: int, device: torch.device) -> list[str]:
    """Four iterations of a rank with three dynamic tables, its input streams a fake that logs."""
    import harness.run.rank as rank_mod
    from harness.data.source import open_batches
    from harness.run.input_streams import SameStream
    from harness.run.rank import RankEnv, build_rank
    from model.dynamic_table import DynamicTable
    from model.sharding import dynamic, table_wise

    log: list[str] = []

    class LoggingStreams(SameStream):
        def hand_over(self, tensors):
            log.append("hand_over")

        def wait_for_compute(self):
            log.append("wait_for_compute")

    real = DynamicTable.transform
    DynamicTable.transform = lambda self, ids: (log.append("slots"), real(self, ids))[1]
    rank_mod.input_streams = lambda device: LoggingStreams()
    cfg = tiny(nodes=1, gpus_per_node=1)
    plan = [dynamic(r, cfg.model.embedding_dim, 0, slots=256) if t < 3 else table_wise(r, cfg.model.embedding_dim, 0)
            for t, r in enumerate(cfg.model.table_rows)]
    parts = build_rank(RankEnv(cfg=cfg, rank=0, device=device, recorder=None, plan=plan), open_batches(cfg))
    parts.step.begin_segment(0, 4)
    for it in range(4):
        parts.step.prepare(it)
        parts.step.run(it)
    parts.step.end_segment()
    parts.close(True)
    return log


def test_dynamic_slots_wait_for_the_compute_stream(tmp_path):
    """A dynamic table's ids turn into slots on the input stream, which reads and writes slot rows the
    queued iterations still update: before each batch's slot work, the input stream waits for the
    compute stream (through the streams protocol, here a fake that logs)."""
    from tests.distributed import spawn_ranks

    (log,) = spawn_ranks(_slot_work_log, 1, tmp_path)
    assert log.count("slots") == 4 * 3 and log.count("hand_over") == 4
    for i, event in enumerate(log):
        if event == "slots" and log[i - 1] != "slots":
            assert log[i - 1] == "wait_for_compute", log[max(0, i - 3): i + 1]


# ---- (1) the rest of the audit: every other place the code picks by device ---------------------

def test_each_device_choice_of_the_cuda_path():
    """fbgemm's tables in GPU memory with CUDA kernels; the input thread launching no collective on
    NCCL (one issuing thread keeps one order on every rank); host copies pinned only on CUDA; the
    dense step's autocast on the rank's own device type."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import ComputeDevice

    from harness.run.dense_step import DenseStep
    from harness.run.optimizations import input_thread_launches
    from harness.run.pinned_d2h import HostCopies
    from model.embeddings import tbe_placement

    assert tbe_placement(torch.device("cuda", 1)) == (EmbeddingLocation.DEVICE, ComputeDevice.CUDA)
    assert tbe_placement(torch.device("cpu")) == (EmbeddingLocation.HOST, ComputeDevice.CPU)
    assert input_thread_launches(cuda=True) is False and input_thread_launches(cuda=False) is True
    assert HostCopies(torch.device("cpu"), pinned=True).active is False
    step = object.__new__(DenseStep)  # no buffers needed to ask which autocast it would enter
    step.device, step._autocast_dtype = torch.device("cuda", 0), torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a CPU build of torch warns that it cannot autocast CUDA
        ctx = step._maybe_autocast()
    assert ctx.device == "cuda" and ctx.fast_dtype == torch.bfloat16
