"""Batches drawn ahead on a thread (harness/data/ahead.py): the very batches the source makes,
in order or not, for the synthetic stream and the MLPerf files; a failure in the thread fails
the reader; nothing is left running; and training with batches ahead is bitwise training without."""

from __future__ import annotations

import threading

import pytest
import torch

from harness.config import DataConfig
from harness.data.ahead import Ahead, maybe_ahead
from harness.data.criteo_files import CriteoFiles
from harness.data.synthetic import SyntheticCriteo
from harness.presets import tiny
from tests.test_criteo_files import write_days


def same(a, b) -> bool:
    return (torch.equal(a.dense, b.dense) and torch.equal(a.labels, b.labels)
            and torch.equal(a.sparse.lengths, b.sparse.lengths) and torch.equal(a.sparse.values, b.sparse.values)
            and a.sparse.feature_values == b.sparse.feature_values)


def ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("batches-ahead")]


@pytest.mark.parametrize("ragged_every,workers", [(0, 1), (3, 1), (3, 3)])
def test_the_synthetic_stream_ahead_is_the_stream(ragged_every, workers):
    cfg = tiny()
    source = SyntheticCriteo(cfg.model, DataConfig(global_batch_size=96, ragged_every=ragged_every))
    ahead = Ahead(source, rank=1, world=2, total=12, depth=2, device=torch.device("cpu"), workers=workers)
    order = [0, 1, 2, 3, 4, 7, 8, 9, 2, 3, 11]  # in order, a skip, a step back, the last
    for it in order:
        assert same(ahead.local_batch(it, 1, 2), source.local_batch(it, 1, 2)), it
    assert same(ahead.local_batch(5, 0, 2), source.local_batch(5, 0, 2))  # another rank's: made in place
    assert ahead.is_regular(2) == source.is_regular(2)  # the rest is the source's
    ahead.close()
    assert ahead_threads() == []


def test_the_files_ahead_are_the_files(tmp_path):
    model = tiny().model
    files = CriteoFiles(write_days(tmp_path / "d"), model, global_batch_size=4)
    ahead = maybe_ahead(files, 2, rank=0, world=2, total=2, device=torch.device("cpu"), workers=2)
    assert isinstance(ahead, Ahead) and ahead.train_rows == files.train_rows
    for it in (0, 1):
        assert same(ahead.local_batch(it, 0, 2), files.local_batch(it, 0, 2))
    ahead.close()
    assert maybe_ahead(files, 0, rank=0, world=2, total=2, device=torch.device("cpu")) is files


def test_a_failing_source_fails_the_reader_and_leaves_no_thread():
    class Failing:
        def local_batch(self, it, rank, world, pin=False):
            if it == 2:
                raise OSError("disk gone")
            return it

    ahead = Ahead(Failing(), rank=0, world=1, total=5, depth=2, device=torch.device("cpu"))
    assert [ahead.local_batch(i, 0, 1) for i in (0, 1)] == [0, 1]
    with pytest.raises(RuntimeError, match=r"batch thread failed at iteration 2: OSError\('disk gone'\)"):
        ahead.local_batch(2, 0, 1)
    ahead.close()
    assert ahead_threads() == []


def test_batch_threads_leave_each_rank_two_cores():
    from harness.run.optimizations import ahead_workers, batches_ahead

    assert ahead_workers(2, local_ranks=1, cores=16) == 8  # capped
    assert ahead_workers(2, local_ranks=8, cores=112) == 8 and ahead_workers(2, local_ranks=8, cores=64) == 6
    assert ahead_workers(2, local_ranks=2, cores=2) == 1 and ahead_workers(0, local_ranks=1, cores=16) == 0
    entry = batches_ahead(None, cuda=True, local_ranks=4, cores=24, draw_on="host")
    assert (entry.depth, entry.workers) == (2, 4) and "4 thread(s) of 24 cores shared by 4 rank(s)" in entry.reason
    assert batches_ahead(None, cuda=False).depth == 0


def test_training_with_batches_ahead_is_training_without(tmp_path):
    """Same losses and weights, bitwise, 2 ranks pipelined: only when a batch is made moves."""
    from harness.launch.planning import make_plan
    from tests.distributed import run_ranks

    base = tiny(nodes=1, gpus_per_node=2, iters=6, warmup_iters=0)
    plan, _ = make_plan(base, ranks_per_host=2)
    out = {}
    for depth in (0, 2):
        cfg = base.replace(data=DataConfig(global_batch_size=96, ahead=depth))
        (tmp_path / str(depth)).mkdir()
        out[depth] = run_ranks(cfg, plan, tmp_path / str(depth))
    for r0, r2 in zip(out[0], out[2]):
        assert r0["losses"] == r2["losses"]
        for k in r0["dense_state"]:
            assert torch.equal(r0["dense_state"][k], r2["dense_state"][k])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batches_ahead_on_a_gpu_are_pinned_and_the_same():
    """On CUDA the thread puts each batch in page-locked memory (its copy to the device can then be
    asynchronous), on the rank's own GPU, with the source's values."""
    cfg = tiny()
    source = SyntheticCriteo(cfg.model, DataConfig(global_batch_size=96))
    device = torch.device("cuda", torch.cuda.device_count() - 1)
    ahead = Ahead(source, rank=0, world=2, total=4, depth=2, device=device, workers=2)
    for it in range(4):
        got = ahead.local_batch(it, 0, 2)
        assert got.dense.is_pinned() and got.sparse.values.is_pinned() and got.labels.is_pinned()
        assert same(got, source.local_batch(it, 0, 2))
    ahead.close()
