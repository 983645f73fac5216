"""What one iteration asks of each rank: FLOPs, bytes through memory, bytes on each link level.

Dense parts from harness/report/roofline.py's formulas (`dense_shape`: parameters P, activations a
sample A, FLOPs a sample); the embedding parts from the plan's analytic footprint
(model/plan_traffic.py via model/planner.plan_footprint): the lookup's bytes through memory (a
third forward, two thirds backward: read forward; read and write backward with the fused
optimizer) and each exchange's bytes sent and received on each link level, both ends.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from harness.report.roofline import dense_shape
from harness.run.dense_gradients import DEFAULT_BUCKET_MIB, bucket_ranges
from model.names import STATE_PER_ELEMENT, STATE_PER_ROW, WEIGHT_BYTES
from model.plan_traffic import BACKWARD, FORWARD, IDS, LEVELS, LOOKUP, Geometry, row
from model.planner import GROUP_OF_KIND, TableSpec, plan_footprint

EXCHANGES = {"ids": IDS, "forward": FORWARD, "backward": BACKWARD}


@dataclass(frozen=True)
class Work:
    world_size: int
    ranks_per_node: int
    local_batch: int
    dense_flops: float
    """dense_fwd_bwd FLOPs a rank."""
    dense_bytes: float
    """dense_fwd_bwd bytes through memory a rank (roofline.py: weights, gradients, activations; the
    activations 2 bytes an element in bf16-pure, 4 otherwise: an H100 trace's kernels besides the
    GEMMs took 1.37 ms in bf16-pure against 2.61 under autocast, docs/projection.md)."""
    update_bytes: float
    """dense_update bytes (Adagrad: 6 x 4 P); the gathered gradients' cat where it runs: gathered()."""
    params: int
    lookup_fwd: np.ndarray
    """emb_fwd bytes through memory, per rank."""
    lookup_bwd: np.ndarray
    exchange: dict[str, np.ndarray]
    """exchange -> (levels, 2 directions out/in, ranks) bytes."""
    groups: tuple[str, ...]
    """Sharding groups in use (each runs its own exchanges)."""
    kinds: tuple[str, ...]
    """The plan's sharding kinds (what decides which flags can take effect: run/optimizations.resolve)."""
    group_exchange: dict[str, dict[str, np.ndarray]]
    """group -> exchange -> (levels, 2, ranks) bytes: `exchange` split by the sharding that moves them."""
    spans_nodes: bool
    late_grads: float = 1.0
    """Of the dense gradients, the share in buckets holding a bottom-MLP parameter: complete only at
    the backward's end, so all-reduced after the pooled gradient's exchange (dense_schedule)."""
    bottom_flops: float = 0.0
    """The bottom MLP's share of the dense FLOPs: the backward's part after the pooled gradient."""
    bottom_layers: float = 0.0
    """The bottom MLP's share of the dense Linears: that part's share of the backward's launches."""

    def exchange_seconds(self, name: str, intra_bw: float, inter_bw: float, group: str | None = None) -> np.ndarray:
        """Per rank: each level's busier direction over its bandwidth, the levels one after the other
        (of one sharding group's collectives where `group` is given)."""
        x = self.exchange[name] if group is None else self.group_exchange[group][name]
        return x[0].max(axis=0) / intra_bw + x[1].max(axis=0) / inter_bw

    def allreduce_bytes(self) -> tuple[float, float]:
        """Dense gradients (4P bytes) all-reduced as NCCL does on several nodes: (in the node, across)."""
        L, W = self.ranks_per_node, self.world_size
        N = W // L
        grad = 4.0 * self.params
        intra = 2 * (L - 1) / L * grad if L > 1 else 0.0
        inter = 2 * (N - 1) / N * grad / L if N > 1 else 0.0
        return intra, inter


GATHER_BYTES = 8
"""Bytes a dense parameter the gathered gradients' cat moves (harness/run/dense_gradients.py: it
reads each fp32 gradient autograd left and writes the flat buffer)."""


def gathered(work: Work, gather: bool) -> Work:
    """The work with the gathered gradients' cat (gather: the eager step's gradient path,
    kernels.dense_impl) in the stage that runs it: one cat a bucket in the backward's hooks
    (dense_fwd_bwd) beyond one rank, one a step in finish_gradients (dense_update) on one rank.
    A CPU rank moves those bytes on its core: 8 P is a third of the update's 24 P (small-1's
    dense_update, 16.5 ms, against small-2's 11.4 on a core a rank; docs/projection.md)."""
    if not gather:
        return work
    cat = GATHER_BYTES * work.params
    if work.world_size == 1:
        return dataclasses.replace(work, update_bytes=work.update_bytes + cat)
    return dataclasses.replace(work, dense_bytes=work.dense_bytes + cat)


def dense_schedule(m) -> tuple[float, float, float]:
    """(late_grads, bottom_flops, bottom_layers) of a ModelConfig (Work's fields): its parameters
    in model/dense.py's order (the bottom MLP's weight and bias a layer, the cross layers' Vs then
    Ws with their biases, the top MLP's) bucketed as the harness's gradients are."""
    width, L, R = (m.num_sparse + 1) * m.embedding_dim, m.cross_layers, m.cross_rank
    bottom, w_in, bottom_macs = [], m.num_dense, 0
    for w in m.bottom_mlp:
        bottom += [w_in * w, w]
        bottom_macs += w_in * w
        w_in = w
    sizes = bottom + [width * R] * L + [R * width, width] * L
    w_in = width
    for w in m.top_mlp:
        sizes += [w_in * w, w]
        w_in = w
    cap = int(DEFAULT_BUCKET_MIB * 2**20) // 4
    bottom_end = sum(bottom)
    late = sum(end - start for start, end in bucket_ranges(sizes, cap) if start < bottom_end)
    _, _, flops = dense_shape(m)
    layers = len(m.bottom_mlp) / (len(m.bottom_mlp) + 2 * L + len(m.top_mlp))
    return late / sum(sizes), 6 * bottom_macs / flops, layers


def _exchanges(fp: np.ndarray) -> dict[str, np.ndarray]:
    return {name: np.array([[fp[row(phase, lvl, False)], fp[row(phase, lvl, True)]] for lvl in range(len(LEVELS))])
            for name, phase in EXCHANGES.items()}


def work_of(cfg, plan, *, world_size: int, ranks_per_node: int) -> Work:
    m = cfg.model
    G = cfg.data.global_batch_size
    B = G // world_size
    P, A, flops_sample = dense_shape(m)
    act = 2.0 if cfg.precision.dense == "bf16-pure" else 4.0  # bytes an activation element
    opt = cfg.optimizer.embedding_optimizer
    geo = Geometry(world_size=world_size, ranks_per_node=ranks_per_node, global_batch=G,
                   state_per_element=STATE_PER_ELEMENT[opt], state_per_row=STATE_PER_ROW[opt],
                   weight_bytes=WEIGHT_BYTES[cfg.precision.tables])
    tables = [TableSpec(rows=r, dim=m.embedding_dim, pooling=h) for r, h in zip(m.table_rows, m.multi_hot)]
    fp = plan_footprint(plan, tables, geo)
    exchange = _exchanges(fp)
    by_group: dict[str, dict[str, np.ndarray]] = {}
    for g in sorted({GROUP_OF_KIND[tp.kind] for tp in plan}):
        mine = [(tp, t) for tp, t in zip(plan, tables) if GROUP_OF_KIND[tp.kind] == g]
        by_group[g] = _exchanges(plan_footprint([tp for tp, _ in mine], [t for _, t in mine], geo))
    return Work(
        world_size=world_size, ranks_per_node=ranks_per_node, local_batch=B,
        dense_flops=float(flops_sample) * B, dense_bytes=4.0 * 5 * P + act * 3 * B * A,
        update_bytes=4.0 * 6 * P, params=int(P),
        lookup_fwd=fp[LOOKUP] / 3.0, lookup_bwd=fp[LOOKUP] * 2.0 / 3.0,
        exchange=exchange, groups=tuple(by_group), group_exchange=by_group,
        kinds=tuple(sorted({str(tp.kind) for tp in plan})),
        spans_nodes=world_size > ranks_per_node,
        **dict(zip(("late_grads", "bottom_flops", "bottom_layers"), dense_schedule(m))),
    )
