"""From a config and a calibrated profile to a projected iteration: the ops of each stage on the
code path the flags select, simulated on every rank (timeline.py).

What each flag is credited with (the mechanism, nothing else):

- pipeline (default on): batch i+1's splits all-to-all is launched at iteration i's start and read
  after its embedding forward, where batch i+1's ids all-to-all is launched, waited in iteration
  i+1's emb_fwd, so both overlap the compute between;
- skip_splits_a2a: no splits all-to-all, no D2H of the splits and no host sync in input_dist;
- pinned_d2h: the splits' copy is waited by its event: the host waits for the splits exchange
  only, not for the compute stream to drain (a pageable copy's sync);
- threaded_input_dist: input dist's wait moves to its own thread; the main thread pays a hand-off
  and still runs the launches (the GIL);
- cuda_graphs (GPU): dense_fwd_bwd's launches become one graph replay on the host; the device still
  runs every kernel, a small gap apart;
- avoid_record_streams: no time credited (it changes the NCCL allocator's bookkeeping; inactive on
  torch >= 2.8).

On a CPU every rank computes on its share of the host's cores and its single-threaded host work
takes turns when the ranks outnumber the cores (cpu_share); gloo's exchanges cost what the probe
measured (probe.py), the pipelined ids exchange running on gloo's thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from harness.names import OPTIMIZATION_FLAGS, STAGES
from harness.projection.hardware import Profile, dense_precision, peak_flops, rank_cores
from harness.projection.kernels import DRAW_OPS, StageKernels, dense_impl, stage_kernels
from harness.projection.timeline import Collective, Host, Launch, Result, Sync, simulate
from harness.projection.work import Work, gathered
from harness.run.optimizations import draw_asked, resolve

FORWARD_SHARE = 1 / 3
"""The dense step's forward: a third of its FLOPs (the backward computes two gradients a GEMM)."""


@dataclass
class Calibration:
    """What calibration runs measured beyond the profile's figures: per-stage host time the launch
    count does not explain, and the time between iterations, each a fixed part and a part a sample
    of the local batch (identified when two runs of different batch sizes are given; else all
    fixed), each with its source. CPU figures are of a rank that has a core to itself."""

    host_fixed_s: dict[str, float] = field(default_factory=dict)
    host_per_sample_s: dict[str, float] = field(default_factory=dict)
    between_s: float = 0.0
    between_per_sample_s: float = 0.0
    flush_s: float = 0.0
    """One write of the records (between iterations, every --flush-every iterations)."""
    between_drains: bool = False
    """The host waited for the device to drain before its between-iterations work (a sync at the
    iteration's end: the first H100 run's code), identified from the calibration run (calibrate.py)."""
    rest_offsets_launches: bool = False
    """The per-stage rest may be below zero, down to the stage's launches: on a CPU one launch cost
    (from the dense step's ops, autograd's) prices every stage's ops, and a stage whose ops cost
    less (fbgemm's CPU kernels, called directly) gets the difference back (calibrate.py)."""
    sources: dict[str, str] = field(default_factory=dict)
    models: dict = field(default_factory=dict)
    """ModelConfig -> the calibration from that model's own runs, for each model calibrated beside
    the first run's (which is this one): a stage's host time grows with the model's tables and
    dims as well as with the batch, so a line through two models' runs misses both at small
    batches (tiny's input dist: nothing at 48 samples, 0.24 ms measured; docs/projection.md)."""

    drawn_on_device: bool = False
    """The calibration runs' batches were drawn on their GPU (manifest batches_ahead.on_device): the
    time between iterations holds the draw's launches and no wait for host threads (between)."""
    draw_s: float = 0.0
    """Of between_s, the calibration runs' draw launches an iteration (draw_launches_s), where
    they drew on the GPU."""

    batches: tuple[int, ...] = ()
    """The local batches of the two runs that split each figure into a fixed part and a part a
    sample (empty: one run, all fixed). A part a sample below zero (a time that shrinks as the batch
    grows) is held at these ends beyond them, not extrapolated."""

    def of(self, model) -> Calibration:
        """The calibration for a config of `model`: its own runs', else this one."""
        return self.models.get(model, self)

    def _per_sample(self, per: float, batch: int) -> float:
        if per < 0 and self.batches:
            batch = min(max(batch, min(self.batches)), max(self.batches))
        return per * batch

    def host(self, stage: str, batch: int, launches_s: float) -> float:
        """A stage's host time: its launches (`launches_s`) plus the calibrated rest."""
        rest = self.host_fixed_s.get(stage, 0.0) + self._per_sample(self.host_per_sample_s.get(stage, 0.0), batch)
        return max(0.0, (rest if self.rest_offsets_launches else max(0.0, rest)) + launches_s)

    def between(self, batch: int, flush_every: int, on_device: bool = False, draw_s: float = 0.0) -> float:
        """The host time between iterations of a run drawing its batches on the device or not (its
        draw launches `draw_s` an iteration, none on the host): the calibration's fixed part less
        its own draw launches, plus the run's, plus its part a sample where the run draws where
        the calibration runs did (their wait for host threads, or nothing much on a device);
        drawn elsewhere, no wait: a device draw waits for no threads, and a host-drawn run
        calibrated on device-drawn runs has its threads assumed to keep up."""
        wait = self._per_sample(self.between_per_sample_s, batch) if on_device == self.drawn_on_device else 0.0
        return max(0.0, self.between_s - self.draw_s + wait + draw_s) + self.flush_s / flush_every

def draw_launches_s(profile: Profile, on_device: bool, draw_block: int) -> float:
    """Host time an iteration launching the batch draw on the GPU (kernels.DRAW_OPS a draw of
    draw_block batches, at the profile's draw_op_us); none drawn on the host."""
    if not on_device:
        return 0.0
    return DRAW_OPS / max(1, draw_block) * profile.value("draw_op_us") * 1e-6


def resolved_flags(cfg, profile: Profile, work: Work):
    """The flags that take effect on this device, plan and world size, and why the others do not:
    the harness's own decision (harness/run/optimizations.resolve), so a flag a run would record as
    inactive is credited nothing. The projected GPU host is taken to have Triton (CUDA torch's
    wheels bring it), whatever this one has."""
    return resolve(cfg.optimizations, cuda=profile.async_device, plan_kinds=work.kinds, precision=cfg.precision,
                   world_size=work.world_size, local_ranks=work.ranks_per_node, draw_on=draw_asked(cfg.data),
                   triton_missing=lambda: None)


def effective_flags(cfg, profile: Profile, work: Work) -> dict[str, bool]:
    return dict(resolved_flags(cfg, profile, work).effective)


def dense_roof_s(work: Work, profile: Profile, precision: str) -> float:
    """The dense step at the spec peaks: FLOPs at the precision's peak plus bytes at HBM speed."""
    return work.dense_flops / peak_flops(profile, precision) + work.dense_bytes / (profile.value("hbm_gbps") * 1e9)


def dense_device_s(work: Work, profile: Profile, precision: str) -> float:
    """The dense step's device time: where a trace split its kernels (dense_mem_eff), its FLOPs at
    the precision's peak times the GEMMs' efficiency plus its bytes at HBM times the other kernels';
    else the roofline over one efficiency."""
    if "dense_mem_eff" not in profile.figures:
        return dense_roof_s(work, profile, precision) / dense_eff(profile, precision)
    return (work.dense_flops / peak_flops(profile, precision) / dense_eff(profile, precision)
            + work.dense_bytes / (profile.value("hbm_gbps") * 1e9 * profile.value("dense_mem_eff")))


def dense_eff(profile: Profile, precision: str) -> float:
    key = f"dense_eff_{precision}"
    return profile.value(key) if key in profile.figures else profile.value("dense_eff")


def cpu_share(profile: Profile, work: Work) -> tuple[float, float]:
    """(speed, turns) of a rank against the profile's probed rank: its multi-threaded work (GEMMs,
    memory) runs `speed` times as fast (its cores over the probed rank's, times one_thread_gain for
    a rank of one thread when the probed one had more), its single-threaded host work (ops,
    Python) `turns` times as long (ranks outnumbering the cores run in turns). (1, 1) on a GPU."""
    if profile.async_device:
        return 1.0, 1.0
    cores, probed = cpu_rank_cores(profile, work), profile.value("rank_cores")
    speed = cores / probed * (profile.value("one_thread_gain") if cores <= 1 < probed else 1.0)
    return speed, max(1.0, work.ranks_per_node / profile.value("cores"))


def pair_ratio(profile: Profile, work: Work) -> float | None:
    """Two collectives at once (timeline.Lanes.pair_ratio) on CPU ranks without a spare core (the
    ranks fill the host's cores; every layout beyond one rank on this project's 2-core VM): gloo's
    two worker threads run them at once (not one after the other) on cores the ranks already fill,
    so together no faster than one after the other (the profile's gloo_pair_ratio, 2). None, one
    after the other, on a GPU (NCCL runs a group's collectives in stream order) and on CPU ranks
    with cores to spare, where gloo's threads may run them faster together: unmeasured, so left as
    before (docs/projection.md, 2026-11-28)."""
    return None if spare_core(profile, work) else profile.value("gloo_pair_ratio")


def spare_core(profile: Profile, work: Work) -> bool:
    """Whether gloo's threads have a core the rank's host work does not fill: a GPU's ranks (NCCL
    on the device), one rank (no collective), or CPU ranks of two cores or more."""
    return profile.async_device or work.world_size == 1 or cpu_rank_cores(profile, work) >= 2


def cpu_rank_cores(profile: Profile, work: Work) -> float:
    """The cores a CPU rank of this layout computes on (hardware.rank_cores)."""
    return rank_cores(profile.value("cores"), work.ranks_per_node)


def collectives(group: str, exchange: str) -> tuple[str, int]:
    """(kind, count) of the collectives a sharding group runs for an exchange (model/planner.py
    COLLECTIVES_OF_GROUP): data-parallel tables one gradient all-reduce in the backward; every
    other sharding an all-to-all each for the splits, the ids (lengths and values packed), the
    forward and the backward; table-row-wise one more in the node in the forward and the backward."""
    if group == "data_parallel":
        return "all_reduce", int(exchange == "backward")
    extra = int(group == "table_row_wise" and exchange in ("forward", "backward"))
    return "all_to_all", 1 + extra


def _exchange_parts(work: Work, profile: Profile, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(moving, latency): an exchange's seconds on each rank moving bytes (each sharding group's on
    each link level at that level's bandwidth) and waiting (a latency a collective). One rank: local
    copies, no latency. On a CPU (gloo) the node's link is the probe's figures of the collective's kind."""
    moving, latency = np.zeros(work.world_size), np.zeros(work.world_size)
    if work.world_size == 1:
        return moving, latency
    inter_bw = profile.value("inter_node_gbps") * 1e9
    for group in work.groups:
        kind, count = collectives(group, name)
        if count == 0:
            continue
        key = "intra_node_gbps" if profile.async_device else f"{kind}_gbps"
        moving = moving + work.exchange_seconds(name, profile.value(key) * 1e9, inter_bw, group=group)
        latency = latency + count * _latency(work, profile, kind)
    return moving, latency


def _latency(work: Work, profile: Profile, kind: str) -> float:
    """One collective's latency: the spec link's on a GPU (NCCL); on a CPU the gloo probe's of its
    kind, at least the spec inter-node figure across nodes. One rank: local copies, none."""
    if work.world_size == 1:
        return 0.0
    if profile.async_device:
        return profile.value("inter_node_latency_us" if work.spans_nodes else "intra_node_latency_us") * 1e-6
    lat = profile.value(f"{kind}_latency_us") * 1e-6
    return max(lat, profile.value("inter_node_latency_us") * 1e-6) if work.spans_nodes else lat


def _exchange(work: Work, profile: Profile, name: str) -> np.ndarray:
    return sum(_exchange_parts(work, profile, name))


def _allreduce_split(work: Work, profile: Profile, buckets: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """(moving, latency) of the dense gradients' all-reduce launched under the backward, and of the
    part launched at its end (the buckets holding a bottom-MLP gradient: Work.late_grads): NCCL's
    ring bytes on each level (Work.allreduce_bytes) on a GPU; on a CPU the gloo probe's all-reduce
    of the gradients; a latency a bucket. Nothing on one rank."""
    if work.world_size == 1:
        return (0.0, 0.0), (0.0, 0.0)
    lat = _latency(work, profile, "all_reduce")
    if profile.async_device:
        intra, inter = work.allreduce_bytes()
        moving = intra / (profile.value("intra_node_gbps") * 1e9) + inter / (profile.value("inter_node_gbps") * 1e9)
    else:
        moving = 4.0 * work.params / (profile.value("all_reduce_gbps") * 1e9)
    buckets = max(buckets, 1)
    late = min(buckets, max(1, round(buckets * work.late_grads)))
    share = work.late_grads
    return ((1 - share) * moving, (buckets - late) * lat), (share * moving, late * lat)


def _launch_async(ops: list, name: str, moving, latency, own_core: bool) -> None:
    """A collective launched async in dense_fwd_bwd. On a CPU rank without a core to spare, gloo's
    thread moves its bytes on the rank's own core, between the host's ops: host time there, and the
    collective ends its latency later."""
    if own_core:
        ops.append(Collective(name, "dense_fwd_bwd", moving + latency, blocks_host=False))
    else:
        ops.append(Host("dense_fwd_bwd", moving))
        ops.append(Collective(name, "dense_fwd_bwd", latency, blocks_host=False))


def _input_dist_ops(work: Work, profile: Profile, k: StageKernels, flags: dict, cal: Calibration, turns: float,
                    pipelined: bool) -> tuple[list, list]:
    """input_dist's ops at the iteration's start and after the embedding forward. As
    harness/run/input_pipeline.py runs them: pipelined on the main thread, the next batch's splits
    exchange is launched at the start and read after the forward (a sync), where the next batch's
    ids exchange is launched, so the iteration's first blocking collective is the forward's, and a
    rank waits for a slower one there; not pipelined, all at the start; threaded, the wait is the
    input thread's (a hand-off on the main thread)."""
    launch = profile.value("launch_us") * 1e-6
    start = [Launch("input_dist", turns * cal.host("input_dist", work.local_batch, k.input_dist * launch), 0.0)]
    # Table/column-wise splits are known with skip_splits_a2a; the other shardings' depend on the
    # ids; data-parallel tables exchange none (run/optimizations.resolve says the same).
    exchanging = [g for g in work.groups if g != "data_parallel" and not (g == "pooled" and flags["skip_splits_a2a"])]
    threaded = flags["threaded_input_dist"]
    after = pipelined and not threaded
    splits, read = [], []
    if exchanging:
        splits.append(Collective("splits", "input_dist", len(exchanging) * _latency(work, profile, "all_to_all"),
                                 blocks_host=not after))
        if threaded:
            read.append(Host("input_dist", profile.value("thread_handoff_us") * 1e-6))
        else:  # the splits' read: a pinned copy waited by its event, or a pageable copy's drain
            read.append(Sync("input_dist", profile.value("sync_us") * 1e-6, drain=not flags["pinned_d2h"],
                             on="splits"))
    # Pipelined, the ids exchange is async (gloo's thread on a CPU): emb_fwd of the next iteration waits.
    ids = [Collective("ids", "input_dist", _exchange(work, profile, "ids"), blocks_host=not pipelined)]
    if after:
        return start + splits, read + ids
    return start + splits + read + ids, []


def iteration_ops(cfg, work: Work, profile: Profile, cal: Calibration, flags: dict, *, on_device: bool = False,
                  draw_block: int = 1, **dense_choices: bool) -> tuple[list, StageKernels]:
    """One iteration's ops on every rank (module docstring for what each flag changes).
    on_device, draw_block: the batches drawn on the GPU, so many a draw (resolved as a run would:
    optimizations.batches_ahead).
    dense_choices: the dense step's kernel choices (kernels.dense_impl)."""
    k = stage_kernels(cfg, groups=work.groups, params=work.params, world_size=work.world_size, flags=flags,
                      **dense_choices)
    launch, hbm = profile.value("launch_us") * 1e-6, profile.value("hbm_gbps") * 1e9
    speed, turns = cpu_share(profile, work)
    B = work.local_batch
    prec = dense_precision(cfg)
    ops, after_forward = _input_dist_ops(work, profile, k, flags, cal, turns, cfg.optimizations.pipeline)
    ids = "ids@prev" if cfg.optimizations.pipeline else "ids"
    ops.append(Launch("emb_fwd", turns * cal.host("emb_fwd", B, k.emb_fwd * launch),
                      work.lookup_fwd / (hbm * profile.value("lookup_eff") * speed), waits=(ids,)))
    ops.append(Collective("forward", "emb_fwd", _exchange(work, profile, "forward")))
    ops.extend(after_forward)
    dense_dev = dense_device_s(work, profile, prec) / speed
    if flags["cuda_graphs"]:
        host = profile.value("graph_launch_us") * 1e-6
        dense_dev += k.dense_fwd_bwd * profile.value("graph_kernel_gap_us") * 1e-6
    else:
        host = turns * cal.host("dense_fwd_bwd", B, k.dense_fwd_bwd * launch)
    # The backward's order (harness/run/step.py, dense_gradients.py): the buckets of top-MLP and
    # cross-layer gradients are all-reduced while it runs (from its start: an optimistic bound),
    # the pooled gradient's exchange when it reaches the interaction, before the bottom MLP's
    # backward, and the buckets holding a bottom-MLP gradient at its end. emb_bwd waits for the
    # exchange, dense_update (finish_gradients) for the all-reduce. Collectives on one group run
    # one after the other.
    ops.append(Launch("dense_fwd_bwd", host * FORWARD_SHARE, dense_dev * FORWARD_SHARE, waits=("forward",)))
    bwd_host, bwd_dev = host * (1 - FORWARD_SHARE), dense_dev * (1 - FORWARD_SHARE)
    own_core = spare_core(profile, work)
    early, late = _allreduce_split(work, profile, k.dense_buckets)
    _launch_async(ops, "allreduce_early", *early, own_core)
    ops.append(Launch("dense_fwd_bwd", bwd_host * (1 - work.bottom_layers), bwd_dev * (1 - work.bottom_flops)))
    _launch_async(ops, "backward", *_exchange_parts(work, profile, "backward"), own_core)
    ops.append(Launch("dense_fwd_bwd", bwd_host * work.bottom_layers, bwd_dev * work.bottom_flops))
    _launch_async(ops, "allreduce", *late, own_core)
    ops.append(Launch("emb_bwd", turns * cal.host("emb_bwd", B, k.emb_bwd * launch),
                      work.lookup_bwd / (hbm * profile.value("lookup_eff") * speed), waits=("backward",)))
    ops.append(Launch("dense_update", turns * cal.host("dense_update", B, k.dense_update * launch),
                      work.update_bytes / (hbm * profile.value("update_eff") * speed),
                      waits=("allreduce_early", "allreduce")))
    if cal.between_drains and profile.async_device:
        ops.append(Sync("between_iterations", 0.0, drain=True))
    draw_s = draw_launches_s(profile, on_device, draw_block)
    ops.append(Host("between_iterations", turns * cal.between(B, cfg.run.flush_every, on_device, draw_s)))
    return ops, k


@dataclass(frozen=True)
class Projection:
    label: str
    flags: dict[str, bool]
    result: Result
    kernels: StageKernels
    world_size: int
    inactive: dict[str, str] = field(default_factory=dict)
    """Flag -> why it cannot take effect in this configuration (resolved_flags)."""

    def stage_ms(self, how: str = "max") -> dict[str, float]:
        f = np.max if how == "max" else np.mean
        return {s: float(f(self.result.stage_s[s])) * 1e3 for s in (*STAGES, "between_iterations")}

    @property
    def period_ms(self) -> float:
        return self.result.period_s * 1e3

    @property
    def window_ms(self) -> float:
        return float(np.max(self.result.window_s)) * 1e3


def project(cfg, work: Work, profile: Profile, cal: Calibration, *, label: str = "",
            dense: dict[str, bool] | None = None, drawn: tuple[bool, int] | None = None) -> Projection:
    """dense and drawn: the dense step's kernel choices (kernels.dense_impl) and whether the
    batches were drawn on the GPU and so many a draw, as a measured run recorded them; left out,
    what today's code would do for `cfg`."""
    res = resolved_flags(cfg, profile, work)
    flags = dict(res.effective)
    cal = cal.of(cfg.model)
    on_device, block = (res.batches_ahead.on_device, res.batches_ahead.draw_block) if drawn is None else drawn
    choices = dense_impl(res) if dense is None else dense
    work = gathered(work, choices["gather"])
    ops, k = iteration_ops(cfg, work, profile, cal, flags, on_device=on_device, draw_block=block, **choices)
    result = simulate(ops, ranks=work.world_size, async_device=profile.async_device, pair_ratio=pair_ratio(profile, work))
    return Projection(label=label, flags=flags, result=result, kernels=k, world_size=work.world_size,
                      inactive=dict(res.inactive_reasons))
