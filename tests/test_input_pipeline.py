"""The input-dist schedule: which batch's splits, ids launch and wait happen where in the loop,
and the two-phase ids exchange's hand-off of the splits to the host."""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.data import SyntheticCriteo
from harness.input_pipeline import InputFeeder
from harness.presets import tiny
from harness.timeline import Timeline
from model.features import SparseFeatures
from model.ids_all_to_all import HostTransfer, IdsAllToAll, PendingIds


class _LoggedPending:
    def __init__(self, log: list[str], batch: int) -> None:
        self.log, self.batch, self.launched = log, batch, False
        self.splits_exchanged = 1

    def launch(self) -> None:
        if not self.launched:
            self.log.append(f"launch {self.batch}")
            self.launched = True

    def wait(self) -> list:
        self.launch()
        self.log.append(f"wait {self.batch}")
        return []


class _LoggedEmbeddings:
    """Stands in for the sharded collection: records the order of input-dist phases by batch."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.batches = 0

    def start_input_dist(self, features, *, splits_known):
        b = self.batches
        self.batches += 1
        self.log.append(f"start {b}")
        return _LoggedPending(self.log, b)


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
    return emb.log


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
            flight = a2a.start_splits(ids)
            assert log == (["copy started"] if non_blocking else [])
            sent, received = a2a.finish_splits(flight)
            assert log == ["copy started"]
            # Hand-computed: 2 slots x 3 samples of lengths, 2 + 1 + 0 + 1 + 1 + 1 = 6 values.
            assert sent == [[6, 6]] and received == [[6, 6]]
            pending = PendingIds(a2a, ids, splits=a2a.start_splits(ids))
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
    feeder.prepare(0)
    try:
        feeder.next(0)
    except RuntimeError:
        pass  # no CUDA here: the load after set_device fails, as it should
    finally:
        feeder.close()
    assert calls == [(torch.device("cuda", 1), "input-dist")]
