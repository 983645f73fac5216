"""GPU battery: the input dist's threads, streams and pinned copies on real CUDA devices.

Each test's one-line docstring names its check (`make gpu-check` prints it)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from harness.cli import main
from harness.run.input_streams import CudaInputStream
from harness.run import pinned_d2h
from harness.run.pinned_d2h import HostCopies

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# About 10-100 ms of spinning on any recent GPU: long enough that an unordered read would see the
# buffer before the kernel that fills it ran.
SLEEP_CYCLES = 50_000_000


def load_kernels(device: torch.device) -> None:
    """Launch the tests' kernels once before they time anything: under CUDA's lazy loading (the
    default) a kernel's first launch loads its module, which may synchronize the whole context
    (the CUDA programming guide, "Lazy Loading"), and would wait for a sleep on another stream."""
    torch.arange(1 << 20, device=device).sum().item()
    torch.full((1, 4), 0, dtype=torch.int64, device=device).cpu()
    torch.cuda._sleep(1)
    torch.cuda.synchronize(device)


def test_threaded_input_dist_row_wise_ragged_500_iterations(tmp_path):
    """threaded input dist with row-wise tables and ragged batches for 500 iterations without a hang"""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (2 NCCL ranks)")
    runs = tmp_path / "runs"
    # A hang in a collective fails the run after --collective-timeout instead of hanging the test.
    code = main(["bench", "--device", "cuda", "--preset", "tiny", "--nodes", "1", "--gpus-per-node", "2",
                 "--sharding", "row_wise", "--ragged-every", "3", "--threaded-input-dist", "--pinned-d2h",
                 "--iters", "500", "--warmup", "5", "--collective-timeout", "120", "--runs-root", str(runs)])
    assert code == 0
    (run_dir,) = runs.iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["optimizations"]["effective"]["threaded_input_dist"] is True
    its = pd.concat(pd.read_parquet(p) for p in run_dir.glob("rank*/iterations-*.parquet"))
    assert sorted(its["rank"].unique()) == [0, 1]
    assert its.groupby("rank")["iteration"].nunique().tolist() == [505, 505]


@pytest.mark.parametrize("max_ring", [None, 2])
def test_pinned_ring_reads_the_right_values_behind_a_delayed_stream(monkeypatch, max_ring):
    """pinned-ring race test with a delayed stream (ring grown, and held at 2: waited and moved out)"""
    if max_ring is not None:
        monkeypatch.setattr(pinned_d2h, "MAX_RING", max_ring)
    device = torch.device("cuda", torch.cuda.current_device())
    load_kernels(device)
    copies = HostCopies(device=device, pinned=True, depth=2)
    stream = torch.cuda.Stream(device=device)
    handles = []
    with torch.cuda.stream(stream):
        # Six copies through a ring of depth two, each source filled only after a long sleep: the
        # ring wraps onto copies still in flight. It grows in place of a wait (up to MAX_RING);
        # held at two buffers it must wait for them and move their values out first. The first
        # sleep is long enough that none has landed before the sixth is issued (the host's first
        # page-locked allocations take milliseconds; the first H100 battery saw 5 buffers, not 6).
        torch.cuda._sleep(10 * SLEEP_CYCLES)
        for k in range(6):
            torch.cuda._sleep(SLEEP_CYCLES)
            src = torch.full((2, 4), k, dtype=torch.int64, device=device)
            handles.append(copies.copy(src))
    rings = copies._rings
    if max_ring is None:
        assert len(copies.buffers(((2, 4), torch.int64))) == 6 and rings.waits == 0
    else:
        assert len(copies.buffers(((2, 4), torch.int64))) == 2 and rings.waits > 0
    assert [h.wait()[0, 0].item() for h in reversed(handles)] == list(reversed(range(6)))
    assert all(bool((h.wait() == k).all()) for k, h in enumerate(handles))


def test_a_later_batchs_copy_does_not_hold_the_hand_over():
    """batches copied on their own stream: the hand-over does not wait for a later batch's copy"""
    device = torch.device("cuda", torch.cuda.current_device())
    load_kernels(device)  # else the sum's first launch waits for the sleep (the first H100 battery)
    streams = CudaInputStream(device)
    with streams.input():
        ids = torch.arange(1 << 20, device=device)
    with streams.load():
        torch.cuda._sleep(4 * SLEEP_CYCLES)  # the next batch's copy, still running at the hand-over
        later = streams.loaded()
    streams.hand_over([ids])
    total = ids.sum()
    done = torch.cuda.Event()
    done.record()
    done.synchronize()
    assert not later.query(), "the compute stream waited for the copy stream"
    assert total.item() == (1 << 20) * ((1 << 20) - 1) // 2


def test_input_dist_waits_for_its_batchs_copy():
    """input dist's stream waits for its batch's copy on the copy stream before it reads it"""
    device = torch.device("cuda", torch.cuda.current_device())
    streams = CudaInputStream(device)
    with streams.load():
        torch.cuda._sleep(SLEEP_CYCLES)
        values = torch.arange(1 << 20, device=device)  # the batch, written on the copy stream behind the sleep
        mark = streams.loaded()
    with streams.input():
        streams.wait_loaded(mark, [values])
        doubled = values * 2
    streams.hand_over([doubled])
    assert doubled.sum().item() == (1 << 20) * ((1 << 20) - 1)


def test_the_compute_stream_waits_for_the_input_stream_at_the_hand_over():
    """input dist on its own stream: the compute stream waits for it at the hand-over"""
    device = torch.device("cuda", torch.cuda.current_device())
    streams = CudaInputStream(device)
    with streams.input():
        torch.cuda._sleep(SLEEP_CYCLES)
        ids = torch.arange(1 << 20, device=device)  # made on the input stream, behind the sleep
    streams.hand_over([ids])
    # On the compute stream: without the wait this would sum a buffer not yet written.
    total = ids.sum()
    assert total.item() == (1 << 20) * ((1 << 20) - 1) // 2
