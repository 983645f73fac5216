"""The input-dist schedule: which batch's splits, ids launch and wait happen where in the loop,
and the two-phase ids exchange's hand-off of the splits to the host."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
import torch.distributed as dist

from harness.data.synthetic import SyntheticCriteo
from harness.run.input_pipeline import InputFeeder
from harness.presets import tiny
from harness.run.timeline import Timeline
from model.features import SparseFeatures
from model.ids_all_to_all import HostTransfer, IdsAllToAll, PendingIds


class _LoggedPending:
    def __init__(self, log: list[str], batch: int, where) -> None:
        self.log, self.batch, self.started, self.launched, self.where = log, batch, False, False, where
        self.splits_exchanged = 1

    def start_splits(self) -> None:
        if not self.started:
            self.log.append(f"start {self.batch}{self.where()}")
            self.started = True

    def launch(self) -> None:
        self.start_splits()
        if not self.launched:
            self.log.append(f"launch {self.batch}{self.where()}")
            self.launched = True

    def wait(self) -> list:
        self.launch()
        self.log.append(f"wait {self.batch}{self.where()}")
        return []


class _LoggedEmbeddings:
    """Stands in for the sharded collection: records the order of input-dist phases by batch
    (`where()`: what to add to each entry, e.g. the thread and stream it was issued from)."""

    def __init__(self, where=lambda: "") -> None:
        self.log: list[str] = []
        self.batches = 0
        self.where = where

    def prepare_input_dist(self, features, *, splits_known):
        b = self.batches
        self.batches += 1
        self.log.append(f"prepare {b}{self.where()}")
        return _LoggedPending(self.log, b, self.where)


def _drive(*, pipeline: bool, iters: int = 3) -> list[str]:
    """The train loop's calls into the feeder, with the forward marked in the log."""
    cfg = tiny()
    emb = _LoggedEmbeddings()
    feeder = InputFeeder(embeddings=emb, data=SyntheticCriteo(cfg.model, cfg.data), rank=0, world_size=2,
                         device=torch.device("cpu"), total=iters, pipeline=pipeline, threaded=False,
                         skip_splits=False, timeline=Timeline(cuda=False, stages=True))
    for it in range(iters):
        feeder.prepare(it)
        feeder.next(it)
        emb.log.append(f"forward {it}")
        feeder.after_forward()
    feeder.close()
    return [e for e in emb.log if not e.startswith("prepare")]


def test_pipelined_loop_overlaps_like_train_pipeline_sparse_dist():
    # Batch i+1's splits go out right after batch i's ids arrive, are read (and its ids exchange
    # launched) only after batch i's forward, and its ids are waited for at the start of i+1.
    assert _drive(pipeline=True) == [
        "start 0", "launch 0", "wait 0", "start 1", "forward 0", "launch 1",
        "wait 1", "start 2", "forward 1", "launch 2",
        "wait 2", "forward 2",
    ]


def test_plain_loop_runs_each_input_dist_whole_before_its_forward():
    assert _drive(pipeline=False) == [
        "start 0", "launch 0", "wait 0", "forward 0",
        "start 1", "launch 1", "wait 1", "forward 1",
        "start 2", "launch 2", "wait 2", "forward 2",
    ]


class _RecordingStreams:
    """Stands in for input dist's CUDA streams: entries made inside `input()` or `load()` are
    marked with that stream, per thread as a current stream is; each hand-over to the compute
    stream, each copy's mark and each wait for one are logged."""

    def __init__(self, log: list[str]) -> None:
        self.log, self._local, self._marks, self._lock = log, threading.local(), 0, threading.Lock()

    @contextlib.contextmanager
    def _on(self, stream: str):
        outer = getattr(self._local, "stream", None)
        self._local.stream = stream
        try:
            yield
        finally:
            self._local.stream = outer

    def input(self):
        return self._on("input stream")

    def load(self):
        return self._on("copy stream")

    def where(self) -> str:
        return f" ({threading.current_thread().name}, {getattr(self._local, 'stream', None) or 'compute stream'})"

    def hand_over(self, tensors) -> None:
        self.log.append(f"hand over {len(list(tensors))} tensors")

    def loaded(self) -> int:
        with self._lock:
            self._marks += 1
            self.log.append(f"copied {self._marks}{self.where()}")
            return self._marks

    def wait_loaded(self, mark, tensors) -> None:
        self.log.append(f"waits for copy {mark}{self.where()}")


class _LoggedSource(SyntheticCriteo):
    """The synthetic stream, each batch drawn logged with the stream it was drawn and copied on."""

    def __init__(self, cfg, log: list[str], where) -> None:
        super().__init__(cfg.model, cfg.data)
        self.log, self.where = log, where

    def local_batch(self, it, rank, world, **kw):
        self.log.append(f"load {it}{self.where()}")
        return super().local_batch(it, rank, world, **kw)


def _feed_recorded(cfg, iters: int, threaded: bool, *, logged_source: bool = False) -> list[str]:
    """The pipelined feeder on recording streams for `iters` iterations: what it logged, each
    iteration's forward marked (and each batch drawn, with logged_source)."""
    log: list[str] = []
    streams = _RecordingStreams(log)
    emb = _LoggedEmbeddings(where=streams.where)
    emb.log = log
    data = _LoggedSource(cfg, log, streams.where) if logged_source else SyntheticCriteo(cfg.model, cfg.data)
    feeder = InputFeeder(embeddings=emb, data=data, rank=0, world_size=2, device=torch.device("cpu"), total=iters,
                         pipeline=True, threaded=threaded, thread_launches=False, skip_splits=False,
                         timeline=Timeline(cuda=False, stages=True), streams=streams)
    for it in range(iters):
        feeder.prepare(it)
        feeder.next(it)
        log.append(f"forward {it}")
        feeder.after_forward()
    feeder.close()
    return log


def test_input_dist_runs_on_its_stream_and_the_thread_issues_no_collective():
    """The NCCL design of the threaded input dist against the pipelined loop: the same collective
    steps in the same places, all from the main thread; the input thread only prepares; every
    step is issued on the input stream; the compute stream takes each batch over (the batch's
    dense features and labels, no ids from this fake) between its wait and its forward."""
    cfg, iters = tiny(), 3
    logs = {}
    for threaded in (False, True):
        logs[threaded] = _feed_recorded(cfg, iters, threaded)
    main, thread = "(MainThread, input stream)", "(input-dist, input stream)"
    assert [e for e in logs[True] if e.startswith("prepare")] == [f"prepare {b} {thread}" for b in range(iters)]
    assert [e for e in logs[False] if e.startswith("prepare")] == [f"prepare {b} {main}" for b in range(iters)]
    steps = [[e for e in log if not e.startswith(("prepare", "copied", "waits for copy"))] for log in logs.values()]
    assert steps[0] == steps[1] == [
        f"start 0 {main}", f"launch 0 {main}", f"wait 0 {main}", "hand over 2 tensors", f"start 1 {main}",
        "forward 0", f"launch 1 {main}",
        f"wait 1 {main}", "hand over 2 tensors", f"start 2 {main}", "forward 1", f"launch 2 {main}",
        f"wait 2 {main}", "hand over 2 tensors", "forward 2",
    ]


@pytest.mark.parametrize("threaded", [False, True])
def test_batches_are_copied_on_their_own_stream_and_waited_for_before_input_dist(threaded):
    """A batch's copy to the device goes to the copy stream, never to input dist's stream, whose
    every op the compute stream waits for at the hand-over: the next batch's copy, queued before
    this iteration's hand-over, would hold this batch's lookup there. Input dist's stream waits for
    each batch's own copy before it prepares that batch."""
    cfg, iters = tiny(), 4
    log = _feed_recorded(cfg, iters, threaded, logged_source=True)
    def at(prefix: str) -> int:
        return next(i for i, e in enumerate(log) if e.startswith(prefix))

    loads = [e for e in log if e.startswith(("load", "copied"))]
    assert len(loads) == 2 * iters and all(e.endswith("copy stream)") for e in loads), loads
    for b in range(iters):  # batches are loaded in order: batch b's copy is mark b + 1
        assert at(f"load {b} ") < at(f"copied {b + 1} ") < at(f"waits for copy {b + 1} ") < at(f"prepare {b} ")
        assert log[at(f"waits for copy {b + 1} ")].endswith("input stream)")


def test_a_thread_that_launches_collectives_is_refused_on_cuda():
    cfg = tiny()
    with pytest.raises(ValueError, match="for gloo"):
        InputFeeder(embeddings=_LoggedEmbeddings(), data=SyntheticCriteo(cfg.model, cfg.data), rank=0, world_size=2,
                    device=torch.device("cuda", 0), total=2, pipeline=True, threaded=True, thread_launches=True,
                    skip_splits=False, timeline=Timeline(cuda=False, stages=True))


class _RecordedCopy:
    def __init__(self, t: torch.Tensor, log: list) -> None:
        self.value = t.clone()
        log.append("copy started")

    def tolist(self) -> list:
        return self.value.tolist()


def test_non_blocking_transfer_starts_the_splits_copy_when_the_exchange_is_launched(tmp_path):
    """With a non-blocking transfer (pinned on CUDA) the copy is queued at launch, and reading the
    splits later takes that copy; a blocking one copies only when the splits are read."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        ids = SparseFeatures(lengths=torch.tensor([[2, 1, 0], [1, 1, 1]]), values=torch.arange(6))
        for non_blocking in (True, False):
            log: list[str] = []
            a2a = IdsAllToAll(send_slots=[2], recv_slots=2, world_size=1, group=None, device=torch.device("cpu"),
                              transfer=HostTransfer(start=lambda t: _RecordedCopy(t, log), non_blocking=non_blocking))
            flight = a2a.start_splits(a2a.counts(ids))
            assert log == (["copy started"] if non_blocking else [])
            sent, received = a2a.finish_splits(flight)
            assert log == ["copy started"]
            # Hand-computed: 2 slots x 3 samples of lengths, 2 + 1 + 0 + 1 + 1 + 1 = 6 values.
            assert sent == [[6, 6]] and received == [[6, 6]]
            pending = PendingIds(a2a, ids)
            out = pending.wait()
            assert pending.splits_exchanged == 1
            assert out.lengths.tolist() == ids.lengths.tolist() and out.values.tolist() == list(range(6))
        known = PendingIds(a2a, ids, known=([[6, 6]], [[6, 6]]))
        assert known.splits_exchanged == 0 and known.wait().values.tolist() == list(range(6))
    finally:
        dist.destroy_process_group()


def test_the_input_thread_sets_the_ranks_device_before_anything_else(monkeypatch):
    """The current CUDA device is per thread: the input thread must switch to the rank's own GPU.
    A fake set_device records the call; the first load then fails here (no GPU), and that
    failure reaches the main thread as the run's error."""
    import threading

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append((d, threading.current_thread().name)))
    cfg = tiny()
    feeder = InputFeeder(embeddings=_LoggedEmbeddings(), data=SyntheticCriteo(cfg.model, cfg.data), rank=1,
                         world_size=2, device=torch.device("cuda", 1), total=2, pipeline=True, threaded=True,
                         skip_splits=False, timeline=Timeline(cuda=False, stages=True))
    try:
        feeder.prepare(0)  # takes batch 0 from the thread
    except RuntimeError:
        pass  # no CUDA here: the load after set_device fails, as it should
    finally:
        feeder.close()
    assert calls == [(torch.device("cuda", 1), "input-dist")]


def test_every_permute_of_an_iteration_is_sized_on_the_host(tmp_path, monkeypatch):
    """fbgemm's permute reads its output size from the device when not given one (a host sync on a
    GPU): a whole input dist over a plan of every kind, ragged batch included, gives every call
    its size, and each size is the true one."""
    from harness.config import ShardingConfig
    from harness.launch.planning import make_plan
    from model.sharded_embeddings import ShardedEmbeddingCollection
    from model.shardings import ShardingContext
    from tests.test_sharded_training import MIXED

    cfg = tiny(nodes=1, gpus_per_node=1, iters=2, warmup_iters=0)
    cfg = cfg.replace(sharding=ShardingConfig(kind="auto", per_table=MIXED),
                      data=type(cfg.data)(global_batch_size=cfg.data.global_batch_size, ragged_every=2))
    plan, _ = make_plan(cfg, ranks_per_host=1)
    assert {tp.kind for tp in plan} == {"row_wise", "column_wise", "table_wise", "data_parallel"}
    sizes: list[tuple[int | None, int]] = []
    real = torch.ops.fbgemm.permute_2D_sparse_data

    def spy(order, lengths, values, weights, total_values):
        out = real(order, lengths, values, weights, total_values)
        sizes.append((total_values, out[1].numel()))
        return out

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        emb = ShardedEmbeddingCollection(ShardingContext(
            table_rows=cfg.model.table_rows, dim=cfg.model.embedding_dim, rank=0, world_size=1,
            pg=None, ids_pg=None, device=torch.device("cpu"), optimizer="exact_adagrad", learning_rate=0.1, eps=1e-8,
            init_seed=0, multi_hot=cfg.model.multi_hot), plan)
        data = SyntheticCriteo(cfg.model, cfg.data)
        monkeypatch.setattr(torch.ops.fbgemm, "permute_2D_sparse_data", spy)
        for it in range(2):  # iteration 1 is ragged
            batch = data.local_batch(it, 0, 1)
            pending = emb.prepare_input_dist(batch.sparse)
            pending.start_splits()
            pending.wait()
    finally:
        dist.destroy_process_group()
    # Each sharding's select of its features; at one rank the send and receive orders leave every
    # feature where it is, and such a permute is no kernel.
    assert len(sizes) >= 2 * 3
    assert all(given == actual for given, actual in sizes), sizes


def test_a_cpu_rank_issues_input_dist_on_the_current_stream():
    from harness.run.input_streams import SameStream, input_streams

    streams = input_streams(torch.device("cpu"))
    assert isinstance(streams, SameStream)
    with streams.input(), streams.input():  # reusable and reentrant: one shared do-nothing context
        pass
    streams.hand_over([torch.zeros(1)])
