"""How hosts wait for collectives: poll gives the same results as block, ends when the work ends
(or blocks after its spin limit), and is recorded as blocking on CUDA, where NCCL waits never block."""

from __future__ import annotations

import torch
import torch.distributed as dist

import model.collective_wait as cw
from model.collective_ops import all_gather_single
from harness.cli import main
from harness.config import OptimizationsConfig
from harness.run.optimizations import describe, resolve
from harness.records.writer import read_manifest
from tests.distributed import spawn_ranks


class FakeWork:
    """Completes after `turns` calls of is_completed(); never, with turns=None."""

    def __init__(self, turns: int | None) -> None:
        self.turns, self.asked, self.waited_after = turns, 0, None

    def is_completed(self) -> bool:
        self.asked += 1
        return self.turns is not None and self.asked > self.turns

    def wait(self) -> bool:
        self.waited_after = self.asked
        return True


def test_poll_asks_until_done_then_waits_once(monkeypatch):
    # Each turn yields the core: on a loaded host 50 of them can outlast the real spin limit.
    monkeypatch.setattr(cw, "SPIN_LIMIT_S", 60.0)
    work = FakeWork(turns=50)
    cw.poll(work)
    assert work.asked == 51 and work.waited_after == 51  # wait() only after completion was seen


def test_poll_blocks_after_its_spin_limit(monkeypatch):
    monkeypatch.setattr(cw, "SPIN_LIMIT_S", 0.01)
    work = FakeWork(turns=None)  # a work that never reports completion (gloo's reduce_scatter)
    cw.poll(work)
    assert work.waited_after is not None and work.asked > 1


def test_poll_is_inactive_on_cuda_and_in_torchrec_with_a_reason():
    on_cpu = resolve(OptimizationsConfig(), cuda=False, plan_kinds=["table_wise"])
    assert (on_cpu.collective_wait.requested, on_cpu.collective_wait.effective) == ("poll", "poll")
    on_gpu = resolve(OptimizationsConfig(), cuda=True, plan_kinds=["table_wise"])
    assert on_gpu.collective_wait.effective == "block" and "NCCL" in on_gpu.collective_wait.reason
    assert "collective wait: block (requested poll: NCCL" in describe(on_gpu)
    torchrec = resolve(OptimizationsConfig(), cuda=False, plan_kinds=["table_wise"], engine="torchrec")
    assert torchrec.collective_wait.effective == "block" and "torchrec engine" in torchrec.collective_wait.reason
    asked_block = resolve(OptimizationsConfig(collective_wait="block"), cuda=False, plan_kinds=["table_wise"])
    assert asked_block.collective_wait.effective == "block" and not asked_block.collective_wait.reason


def _exchange(rank: int, world: int, device: torch.device, name: str) -> list[torch.Tensor]:
    """Each collective the shardings and the dense gradients use, waited for with `name`."""
    wait = cw.WAITS[name]
    x = torch.arange(8, dtype=torch.float32) * (rank + 1)
    a2a, ag, ar = torch.empty(8), torch.empty(16), x.clone()
    wait(dist.all_to_all_single(a2a, x, async_op=True))
    wait(all_gather_single(ag, x, async_op=True))
    wait(dist.all_reduce(ar, async_op=True))
    return [a2a, ag, ar]


def test_poll_and_block_wait_for_the_same_results(tmp_path):
    (tmp_path / "poll").mkdir()
    (tmp_path / "block").mkdir()
    polled = spawn_ranks(_exchange, 2, tmp_path / "poll", "poll")
    blocked = spawn_ranks(_exchange, 2, tmp_path / "block", "block")
    base = torch.arange(8, dtype=torch.float32)
    expected_r0 = [torch.cat([base[:4], 2 * base[:4]]), torch.cat([base, 2 * base]), 3 * base]  # by hand
    for got, ref in zip(polled[0], expected_r0):
        assert torch.equal(got, ref)
    for p, b in zip(polled, blocked):
        assert all(torch.equal(x, y) for x, y in zip(p, b))


def test_the_manifest_records_the_wait(tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["bench", "--preset", "tiny", "--iters", "2", "--warmup", "0", "--device", "cpu",
                 "--collective-wait", "block", "--runs-root", str(runs)]) == 0
    (run_dir,) = runs.iterdir()
    entry = read_manifest(run_dir).optimizations.collective_wait
    assert (entry.requested, entry.effective) == ("block", "block")
    assert "collective wait: block" in capsys.readouterr().out
