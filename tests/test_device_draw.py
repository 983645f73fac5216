"""Synthetic batches drawn on the device (harness/data/device_draw.py): the kernel, run on CPU
tensors in Triton's interpreter, gives the host stream's numbers to the bit (numpy's Philox,
log1p and power law: harness/data/synthetic.py, the independent reference); `--draw-on device`
resolves as the run can take it, and says why not where it cannot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.config import DataConfig
from harness.data.device_draw import DeviceSynthetic
from harness.data.synthetic import SyntheticCriteo
from harness.presets import small, tiny
from harness.run.optimizations import batches_ahead
from tests.test_ahead import same

CASES = [("tiny", 96, 1.05, 0, 0), ("tiny", 96, 0.0, 3, 0), ("tiny", 96, 1.0, 3, 0), ("tiny", 96, 2.0, (1 << 64) + 5, 0),
         ("small", 128, 1.05, 0, 0), ("tiny", 96, 1.05, 0, 3)]
"""(preset, global batch, id exponent, seed, ragged_every): the seeds are the default, another, and
one over 2^64, whose high word is Philox's second key word; every third batch ragged (drawn on the
host) cuts the blocks the device draws short."""


def differing(cases) -> dict[str, list]:
    """For each case, the (iteration, rank) whose batch drawn by the kernel on CPU tensors differs
    from numpy's (run under TRITON_INTERPRET=1)."""
    out = {}
    for preset, batch, exponent, seed, ragged in cases:
        cfg = {"tiny": tiny, "small": small}[preset]()
        host = SyntheticCriteo(cfg.model, DataConfig(global_batch_size=batch, id_exponent=exponent, seed=seed,
                                                     ragged_every=ragged))
        drawn = DeviceSynthetic(host, torch.device("cpu"))
        # Iterations 0, 1 and 3 in turn on two ranks: drawn in one block (DRAW_BLOCK), the later
        # ones kept from it; 9 after a gap, a block of its own. (Each block drawn costs seconds in
        # the interpreter: 4, a block after the last kept batch, is 9's case without the gap.)
        out[repr((preset, batch, exponent, seed, ragged))] = [
            [it, rank] for it in (0, 1, 3, 9) for rank in (0, 1)
            if not same(drawn.local_batch(it, rank, 2), host.local_batch(it, rank, 2))]
    return out


INTERPRETED_BLOCK = 2048
"""The kernel's program size in Triton's interpreter: its cost is a program's ops, each a Python
dispatch whatever the block (256 counters: 88 s of make test in two processes; 2048: 32 s in
one, 12 s alone). tiny's blocks still span six programs, the last one partial, so program
boundaries and the mask are crossed."""


@pytest.fixture(scope="module")
def interpreted():
    """differing(CASES) in a process of its own with TRITON_INTERPRET=1: Triton reads it when its
    language module is first imported, which another test of the session or a library may have
    done already."""
    code = ("import json; from harness.data import device_draw; from tests.test_device_draw import differing, "
            f"CASES; device_draw.BLOCK = {INTERPRETED_BLOCK}; print(json.dumps(differing(CASES)))")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out) == {repr(c) for c in CASES}
    return out


@pytest.mark.parametrize("case", CASES)
def test_the_kernel_draws_the_host_stream(interpreted, case):
    """Every rank's share of several global batches, drawn by the kernel in Triton's interpreter
    (several batches a launch): the same bits as numpy's stream."""
    assert interpreted[repr(case)] == []


def test_a_ragged_batch_is_drawn_on_the_host(monkeypatch):
    cfg = tiny()
    host = SyntheticCriteo(cfg.model, DataConfig(global_batch_size=96, ragged_every=2))
    drawn = DeviceSynthetic(host, torch.device("cpu"))
    monkeypatch.setattr(drawn, "samples", lambda *a: pytest.fail("a ragged batch went to the kernel"))
    assert not host.is_regular(1)
    assert same(drawn.local_batch(1, 0, 1), host.local_batch(1, 0, 1))
    assert drawn.is_regular(1) is False  # the rest is the host source's


def test_draw_on_device_resolves_where_it_can_take_effect():
    on_gpu = batches_ahead(None, cuda=True, cores=16, draw_on="device", triton_missing=lambda: None)
    assert on_gpu.on_device and on_gpu.depth == 0 and "Triton kernel" in on_gpu.reason
    no_triton = batches_ahead(None, cuda=True, cores=16, draw_on="device", triton_missing=lambda: "no module")
    assert not no_triton.on_device and no_triton.depth == 2
    assert no_triton.reason.startswith("--draw-on device, but no module; drawn on the host")
    on_cpu = batches_ahead(None, cuda=False, draw_on="device")
    assert not on_cpu.on_device and on_cpu.reason.startswith("--draw-on device needs a CUDA device")
    # Left out: the GPU on CUDA (where it can: why not, where not), the host on a CPU (nothing said).
    by_default = batches_ahead(None, cuda=True, cores=16, triton_missing=lambda: None)
    assert by_default.on_device and by_default.reason.startswith("drawn on the GPU (the default on CUDA: ")
    fallback = batches_ahead(None, cuda=True, cores=16, triton_missing=lambda: "no module")
    assert not fallback.on_device and fallback.depth == 2 and fallback.reason.startswith("the default on CUDA, but no module; drawn on the host")
    assert not batches_ahead(None, cuda=False).on_device and "GPU" not in batches_ahead(None, cuda=False).reason
    assert not batches_ahead(None, cuda=True, cores=16, draw_on="host", triton_missing=lambda: None).on_device


def test_files_or_threads_asked_for_leave_the_batches_on_the_host():
    """--data (files are read, not drawn) and --ahead (host threads asked for) resolve a left-out
    draw_on to host; an explicit one stands."""
    from harness.run.optimizations import draw_asked

    assert draw_asked(DataConfig(global_batch_size=8)) is None
    assert draw_asked(DataConfig(global_batch_size=8, path="/data")) == "host"
    assert draw_asked(DataConfig(global_batch_size=8, ahead=3)) == "host"
    assert draw_asked(DataConfig(global_batch_size=8, ahead=3, draw_on="device")) == "device"


def test_the_files_cannot_be_drawn_on_the_device():
    with pytest.raises(ValueError, match="files at --data are read on the host"):
        DataConfig(global_batch_size=8, path="/data", draw_on="device")


def test_a_cpu_run_asked_to_draw_on_the_device_records_why_not(tmp_path):
    from harness.cli import main

    assert main(["bench", "--preset", "tiny", "--nodes", "1", "--gpus-per-node", "1", "--iters", "3", "--warmup", "1",
                 "--draw-on", "device", "--in-process", "--runs-root", str(tmp_path)]) == 0
    (run,) = tmp_path.iterdir()
    entry = json.loads((run / "manifest.json").read_text())["optimizations"]["batches_ahead"]
    assert entry["on_device"] is False and "needs a CUDA device" in entry["reason"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batches_drawn_on_the_gpu_are_the_host_streams():
    """small's 8192-sample batches drawn on the GPU against numpy's: every id, length, dense value and
    label the same (the GPU's float64 log1p, exp and pow may differ from the host's by an ulp: what
    differs is counted; the check gpu-bench runs, harness/tools/gpu_bench_draw.py)."""
    from harness.tools.gpu_bench_draw import draw_check

    check = draw_check("small", 8192)
    assert check["error"] is None and not any(check["differ"].values()), check


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("engine", ["harness", "torchrec"])
def test_both_engines_train_on_batches_drawn_on_the_gpu(tmp_path, engine):
    """One GPU, --draw-on device: the run records the batches drawn on the device and trains (the
    TorchRec engine's pipeline copies on its own stream, which waits for the draw's event)."""
    import pandas as pd

    from harness.cli import main

    assert main(["bench", "--device", "cuda", "--preset", "tiny", "--nodes", "1", "--gpus-per-node", "1",
                 "--iters", "20", "--warmup", "2", "--engine", engine, "--draw-on", "device", "--in-process",
                 "--runs-root", str(tmp_path)]) == 0
    (run,) = tmp_path.iterdir()
    entry = json.loads((run / "manifest.json").read_text())["optimizations"]["batches_ahead"]
    assert entry["on_device"] is True and entry["depth"] == 0, entry
    its = pd.concat(pd.read_parquet(p) for p in run.glob("rank*/iterations-*.parquet"))
    assert len(its) == 22 and its["loss"].notna().all()


def test_a_rank_draws_its_next_batches_at_once_and_keeps_them_until_asked(monkeypatch):
    """Asked in order, a rank draws DRAW_BLOCK batches a draw (kernel and ops once for them); a
    ragged batch ends a block; another rank's draws leave this one's kept batches alone."""
    from harness.data import device_draw

    host = SyntheticCriteo(tiny().model, DataConfig(global_batch_size=96, ragged_every=7))
    drawn = DeviceSynthetic(host, torch.device("cpu"))
    blocks = []
    real = DeviceSynthetic.block
    monkeypatch.setattr(DeviceSynthetic, "block", lambda self, start, count, n, stride: (
        blocks.append((start, count, n, stride)) or real(self, start, count, n, stride)))
    monkeypatch.setattr(device_draw, "_kernel", _no_kernel)
    for it in range(8):
        drawn.local_batch(it, 0, 2)
        if it == 1:
            drawn.local_batch(it, 1, 2)
    # Iteration 6 is ragged (every 7th: 6, 13, ...): the block from 4 holds 4 and 5 only.
    assert blocks == [(0, 48, 4, 96), (96 + 48, 48, 4, 96), (4 * 96, 48, 2, 96), (7 * 96, 48, 4, 96)]


def _no_kernel():
    """The kernel's stand-in: writes nothing (the test counts draws, not numbers)."""
    class Launch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None
    return Launch()
