"""Train one rank: build its parts for the run's engine (harness/run/rank.py, or stock TorchRec's in
harness/run/engine_torchrec.py), then drive them with the one loop (harness/run/loop.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from harness.config import BenchConfig
from harness.data.ahead import Ahead, maybe_ahead
from harness.data.device_draw import DeviceSynthetic
from harness.data.source import open_batches
from harness.records.manifest import ResolvedFlags
from harness.records.writer import RankRecorder
from harness.run.device import set_tf32
from harness.run.loop import Loop, TrainResult, open_result_log
from harness.run.rank import RankEnv, build_rank, resolved_flags
from model.sharding import TablePlan


def train(
    cfg: BenchConfig,
    *,
    rank: int,
    device: torch.device,
    recorder: RankRecorder | None,
    plan: list[TablePlan],
    flags: ResolvedFlags | None = None,
    group: dist.ProcessGroup | None = None,
    keep_weights: bool = False,
    built: Callable[[], None] = lambda: None,
) -> TrainResult:
    """Train this rank. `flags`: what takes effect (the manifest's resolution); None resolves the
    config here, for callers that launched nothing (tests).
    keep_weights: return the final weights (tests compare them with a reference).
    built: called once the rank's parts are built, before the first iteration (StartupClock)."""
    env = RankEnv(cfg=cfg, rank=rank, device=device, recorder=recorder, plan=list(plan), group=group)
    flags = flags or resolved_flags(env)
    set_tf32(flags.precision.tf32)
    data = open_batches(cfg)
    if flags.batches_ahead.on_device:
        data = DeviceSynthetic(data, device)
    data = maybe_ahead(data, flags.batches_ahead.depth, rank=rank, world=cfg.run.world_size,
                       total=cfg.run.warmup_iters + cfg.run.iters, device=device, workers=flags.batches_ahead.workers)
    try:
        result_log = open_result_log(cfg, rank=rank, device=device, recorder=recorder, data=data)
        if cfg.run.engine == "torchrec":  # imported here: torchrec is needed only by runs that ask for it
            from harness.run.engine_torchrec import build_torchrec_rank

            parts = build_torchrec_rank(env, data)
        else:
            parts = build_rank(env, data, flags)
        built()
        return Loop(cfg, parts, rank=rank, recorder=recorder, result_log=result_log).run(keep_weights=keep_weights)
    finally:
        if isinstance(data, Ahead):
            data.close()
