"""Roofline columns: analytic FLOPs and bytes of each stage, against the machine's measured peaks.

The work of a stage is counted from the run's config alone (manifest `config`, `plan`,
`dense_flops_per_sample`), per rank and per iteration. Notation:

    W  world size     B  local batch (global batch / W)     G = B * W     D  embedding_dim
    F  sparse features; table t has H_t ids a sample (multi-hot) and R_t rows
    P  dense parameters = bottom and top MLP weights + biases, plus per cross layer
       V (width x cross_rank) + W (cross_rank x width) + b (width), width = (F + 1) * D
    A  dense activations a sample = num_dense + sum(bottom) + width
       + cross_layers * (cross_rank + 2 * width) + sum(top)
    k  fused optimizer FLOPs an updated element: 6 exact_adagrad, 4 rowwise, 2 sgd
    u  distinct rows a shard's ids touch in one iteration (`unique_rows`): fbgemm's fused backward
       sorts the ids, sums each row's gradients, and updates each distinct row once
    S(u rows, e elements)  optimizer state read + written: 8*e exact_adagrad, 8*u rowwise, 0 sgd
    ring(x) = 2 * (W - 1) / W * x   bytes a rank sends + receives in a ring collective of x bytes
    ids and lengths are int64 (8 bytes), everything else float32 (4 bytes).

Dense stages (every rank):

| stage | FLOPs | bytes |
|---|---|---|
| dense_fwd_bwd | dense_flops_per_sample * B | 4 * (2P weights read forward and backward + P gradients written + 2P all-reduce read/write) + 4 * 3*B*A activations written, read back, their gradients written |
| dense_update | 6P (Adagrad: g*g, +=, sqrt, +eps, /, lr*) | 4 * 6P: param, grad, state read; param, state written; grads zeroed |

Embedding stages: the sum over the shards of the plan (the manifest's plan). A shard on
rank q holds c columns and a fraction f of the rows (f = 1 but row-wise, where ids are assumed
spread evenly over row blocks: f = shard rows / R_t). n = G*H_t*f ids it looks up.

| kind | stage | on rank q (the shard's) | on every rank |
|---|---|---|---|
| table/column/row-wise | input_dist | bytes 8*G*(H_t*f + 1) ids and lengths received | bytes 8*B*(H_t*f + 1) sent |
| table/column-wise | emb_fwd | FLOPs n*c (sum pooling); bytes 4*n*c rows + 8*n ids read + 4*G*c pooled written + 4*G*c sent by the output all-to-all | bytes 4*B*c received |
| row-wise | emb_fwd | FLOPs n*D; bytes 4*n*D + 8*n + 4*G*D partial sums + ring(4*G*D) reduce-scatter | |
| table/column-wise | emb_bwd | FLOPs n*c gradients summed + k*u*c optimizer; bytes 4*G*c gradients received + 4*n*c gradient rows read (one per id) + 8*u*c rows read and written + S(u, u*c) + 8*n ids | bytes 4*B*c sent |
| row-wise | emb_bwd | FLOPs n*D + k*u*D; bytes ring(4*G*D) all-gather + 4*n*D + 8*u*D + S(u, u*D) + 8*n | |
| data-parallel | input_dist | 0 (ids stay local) | |
| data-parallel | emb_fwd | FLOPs B*H_t*D; bytes 4*B*H_t*D + 8*B*H_t + 4*B*D | |
| data-parallel | emb_bwd | FLOPs B*H_t*D + 6*R_t*D; bytes 4*B*D + 4*R_t*D gradient written + ring(4*R_t*D) all-reduce + 20*R_t*D dense Adagrad | |

emb_fwd counts a row read per id (repeated ids may hit a cache: an upper bound). emb_bwd counts the
gradient read per id (likewise an upper bound: repeated reads of a sample's gradient row may hit a
cache) but the weights and optimizer state of each distinct row once, as fbgemm's fused backward
moves them. The distinct count comes from the id law of the synthetic data (`unique_rows`, its
expected value); for ids read from files the law is unknown and u = min(n, rows), an upper bound.
Achieved rates use each rank's mean non-warm-up duration; fractions are over that rank's
gemm_gflops (a plain torch.mm) and copy_gbps (a device memory copy, read + write). The
collectives in input_dist, emb_fwd, emb_bwd and dense_fwd_bwd move bytes over links slower
than memory, so low bandwidth fractions there often mean "waiting on the network or on peers".
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from harness.config import ModelConfig
from harness.report.load import ReportError, Run
from harness.report.peaks import above_copy_note, above_gemm_note, is_above, within_peak
from harness.report.tables import timed_stages
from harness.names import STAGES
from model.names import NODE_BLOCKED_KINDS, ShardingType

if TYPE_CHECKING:  # type only: of model/ the report side imports just its names (the plan comes in the manifest)
    from model.sharding import TablePlan

# FLOPs per embedding element updated by the fused optimizer (see the module docstring).
EMB_OPT_FLOPS = {"exact_adagrad": 6, "exact_rowwise_adagrad": 4, "exact_sgd": 2}
# State bytes read+written per element updated (rowwise: one float a row, counted per row).
EMB_STATE_BYTES = {"exact_adagrad": ("element", 8), "exact_rowwise_adagrad": ("row", 8), "exact_sgd": ("row", 0)}


def dense_shape(model: ModelConfig) -> tuple[int, int, int]:
    """(P parameters, A activations a sample, dense FLOPs a sample forward + backward)."""
    F, D = model.num_sparse, model.embedding_dim
    width = (F + 1) * D
    params = macs = 0
    w_in = model.num_dense
    for w in model.bottom_mlp:
        params += w_in * w + w
        macs += w_in * w
        w_in = w
    L, R = model.cross_layers, model.cross_rank
    params += L * (width * R + R * width + width)
    macs += L * 2 * width * R
    w_in = width
    for w in model.top_mlp:
        params += w_in * w + w
        macs += w_in * w
        w_in = w
    acts = model.num_dense + sum(model.bottom_mlp) + width + L * (R + 2 * width) + sum(model.top_mlp)
    return params, acts, 3 * 2 * macs


ROW_KINDS = (ShardingType.ROW_WISE, *NODE_BLOCKED_KINDS)
"""Kinds whose shards hold a block of rows (and so a fraction of the ids): at full width, but for a
grid table's column blocks (c columns)."""


def _shards(plan: tuple[TablePlan, ...], rows: list[int]) -> list[tuple[str, list[tuple]]]:
    """Per table: (kind, [(rank, row fraction, columns, (first row, end row)), ...])."""
    return [(tp.kind, [(sh.rank, sh.rows / R if tp.kind in ROW_KINDS else 1.0, sh.cols,
                        (sh.row_start, sh.row_end) if tp.kind in ROW_KINDS else (0, R)) for sh in tp.shards])
            for tp, R in zip(plan, rows)]


EXACT_ROWS = 1 << 16
"""unique_rows sums this many rows one by one; past them, p(row) varies slowly and is taken in bins."""


def _id_cdf(x: np.ndarray, rows: int, exponent: float) -> np.ndarray:
    """P(id < x) of the synthetic ids of a table of `rows` rows (harness/data/synthetic.py
    power_law_ids: the inverse CDF of a continuous law p(k) ~ (k+1)^-exponent, floored)."""
    if exponent == 0:
        return x / rows
    if exponent == 1:
        return np.log1p(x) / np.log1p(rows)
    e = 1.0 - exponent
    return (np.power(x + 1.0, e) - 1.0) / (np.power(rows + 1.0, e) - 1.0)


def unique_rows(draws: float, rows: int, block: tuple[int, int], exponent: float | None) -> float:
    """Distinct rows of block [first, end) of a table touched by `draws` ids of one iteration.

    exponent: the synthetic data's id law (DataConfig.id_exponent): the expected count, the sum over
    the block's rows k of 1 - (1 - p_k)^draws with p_k = F(k+1) - F(k) (`_id_cdf`), exact for the
    first EXACT_ROWS rows and over geometric bins of rows (p taken even inside a bin) past them.
    None (ids read from files, their law unknown): min(draws, block rows), an upper bound.
    """
    lo, hi = block
    if exponent is None:
        return float(min(draws, hi - lo))
    cut = min(hi, lo + EXACT_ROWS)
    edges = np.arange(lo, cut + 1, dtype=float)
    if hi > cut:
        edges = np.concatenate([edges, np.unique(np.geomspace(cut, hi, 4096).round())[1:]])
    p = np.diff(_id_cdf(edges, rows, exponent)) / np.diff(edges)
    hit = -np.expm1(draws * np.log1p(-np.clip(p, 0.0, 1.0 - 1e-16)))
    return float(min(draws, (hit * np.diff(edges)).sum()))


def stage_work(run: Run) -> pd.DataFrame:
    """FLOPs and bytes of each stage on each rank in one iteration (formulas: module docstring).

    Raises ReportError for records without a manifest (an nsys trace): the formulas need its config.
    """
    m = run.manifest
    if m is None:
        raise ReportError(f"run {run.run_id}: roofline n/a: no manifest (records from {run.source or 'elsewhere'})")
    model = m.config.model
    W, G = m.world_size, m.config.data.global_batch_size
    L = m.config.run.gpus_per_node
    B = G // W
    D = model.embedding_dim
    hot, rows = list(model.multi_hot), list(model.table_rows)
    P, A, _ = dense_shape(model)
    flops_sample = m.dense_flops_per_sample
    opt = m.config.optimizer.embedding_optimizer
    k_opt = EMB_OPT_FLOPS[opt]
    state_per, state_bytes = EMB_STATE_BYTES[opt]
    law = None if m.config.data.path is not None else m.config.data.id_exponent
    ring = lambda x: 2 * (W - 1) / W * x
    work = {r: {s: [0.0, 0.0] for s in STAGES} for r in range(W)}  # rank -> stage -> [flops, bytes]

    def add(rank: int, stage: str, flops: float, nbytes: float) -> None:
        work[rank][stage][0] += flops
        work[rank][stage][1] += nbytes

    def everyone(stage: str, nbytes: float) -> None:
        for r in range(W):
            add(r, stage, 0.0, nbytes)

    for (kind, shards), H, R in zip(_shards(m.plan, rows), hot, rows):
        for q, f, c, block in shards:
            n = G * H * f
            u = min(n, unique_rows(G * H, R, block, law))
            if kind == ShardingType.DATA_PARALLEL:
                add(q, "emb_fwd", B * H * D, 4 * B * H * D + 8 * B * H + 4 * B * D)
                add(q, "emb_bwd", B * H * D + 6 * R * D, 4 * B * D + 4 * R * D + ring(4 * R * D) + 20 * R * D)
                continue
            add(q, "input_dist", 0.0, 8 * G * (H * f + 1))
            everyone("input_dist", 8 * B * (H * f + 1))
            state = state_bytes * (u * c if state_per == "element" else u)
            if kind in NODE_BLOCKED_KINDS:
                # Partial sums reduce-scattered in the node (a ring of L), then each owner's summed
                # rows sent across: a shard sends G/L rows, every owner takes B/L of its rows from it
                # (c = D but for a grid table's column blocks).
                ring_node = 2 * (L - 1) / L * 4 * G * c
                add(q, "emb_fwd", n * c, 4 * n * c + 8 * n + 4 * G * c + ring_node + 4 * G / L * c)
                everyone("emb_fwd", 4 * B * c / L)
                add(q, "emb_bwd", n * c + k_opt * u * c, 4 * G / L * c + ring_node + 4 * n * c + 8 * u * c + state + 8 * n)
                everyone("emb_bwd", 4 * B * c / L)
            elif kind == ShardingType.ROW_WISE:
                add(q, "emb_fwd", n * D, 4 * n * D + 8 * n + 4 * G * D + ring(4 * G * D))
                add(q, "emb_bwd", n * D + k_opt * u * D, ring(4 * G * D) + 4 * n * D + 8 * u * D + state + 8 * n)
            else:
                add(q, "emb_fwd", n * c, 4 * n * c + 8 * n + 4 * G * c + 4 * G * c)
                everyone("emb_fwd", 4 * B * c)
                add(q, "emb_bwd", n * c + k_opt * u * c, 4 * G * c + 4 * n * c + 8 * u * c + state + 8 * n)
                everyone("emb_bwd", 4 * B * c)
    for r in range(W):
        add(r, "dense_fwd_bwd", flops_sample * B, 4 * 5 * P + 4 * 3 * B * A)
        add(r, "dense_update", 6 * P, 4 * 6 * P)
    return pd.DataFrame([{"rank": r, "stage": s, "flops": float(fb[0]), "bytes": float(fb[1])}
                         for r in range(W) for s, fb in work[r].items()])


def _peaks(run: Run) -> pd.DataFrame:
    ranks = pd.DataFrame([dataclasses.asdict(r) for r in run.manifest.ranks] if run.manifest else [])
    out = pd.DataFrame({"rank": ranks["rank"].astype("int64") if "rank" in ranks else pd.Series(dtype="int64")})
    for c in ("gemm_gflops", "copy_gbps"):
        out[c] = pd.to_numeric(ranks[c], errors="coerce") if c in ranks else np.nan
    return out


def _peak_note(r: pd.Series) -> str:
    """The probe-defect sentences of a roofline row ("" when its figures stand within their peaks)."""
    notes = []
    if is_above(float(r["achieved_gflops"]), float(r["gemm_gflops"])):
        notes.append(above_gemm_note(str(r["stage"]), float(r["achieved_gflops"]), float(r["gemm_gflops"])))
    if is_above(float(r["achieved_gbps"]), float(r["copy_gbps"])):
        notes.append(above_copy_note(str(r["stage"]), float(r["achieved_gbps"]), float(r["copy_gbps"])))
    return "; ".join(notes)


def roofline_table(run: Run, *, per_rank: bool = False) -> pd.DataFrame:
    """Per stage: analytic GFLOP and MB an iteration, mean ms, achieved GFLOP/s and GB/s, the
    measured peaks and the achieved fractions (n/a = NaN where a peak was not measured, and where
    the achieved figure stands above the peak: peak_note then says the probe measured it wrong).

    per_rank=False averages over ranks: work and peaks are rank means, time is the mean over
    all ranks' records, so achieved = mean work / mean time.
    """
    work = stage_work(run)
    st = timed_stages(run)
    t = st.groupby(["rank", "stage"])["duration_ms"].agg(mean_ms="mean", count="count").reset_index()
    df = work.merge(t, on=["rank", "stage"], how="inner").merge(_peaks(run), on="rank", how="left")
    if not per_rank and not df.empty:
        df = df.groupby("stage", sort=False).apply(
            lambda g: pd.Series({"flops": g["flops"].mean(), "bytes": g["bytes"].mean(),
                                 "mean_ms": np.average(g["mean_ms"], weights=g["count"]),
                                 "gemm_gflops": g["gemm_gflops"].mean(), "copy_gbps": g["copy_gbps"].mean(),
                                 "ranks": len(g)}), include_groups=False).reset_index()
    keys = ["rank", "stage"] if per_rank else ["stage"]
    secs = df["mean_ms"] / 1e3
    out = pd.DataFrame({k: df[k] for k in keys})
    out["gflop"] = df["flops"] / 1e9
    out["mb"] = df["bytes"] / 1e6
    out["flop_per_byte"] = df["flops"] / df["bytes"]
    out["mean_ms"] = df["mean_ms"]
    out["achieved_gflops"] = df["flops"] / secs / 1e9
    out["achieved_gbps"] = df["bytes"] / secs / 1e9
    out["gemm_gflops"] = df["gemm_gflops"]
    out["copy_gbps"] = df["copy_gbps"]
    # A figure above its probe's peak is a probe defect: no fraction, a sentence (peaks.py).
    out["flops_frac"] = within_peak(out["achieved_gflops"], out["gemm_gflops"])
    out["bytes_frac"] = within_peak(out["achieved_gbps"], out["copy_gbps"])
    # Which roof bounds the stage: its intensity against the machine's ridge point.
    ridge = out["gemm_gflops"] / out["copy_gbps"]
    out["bound"] = np.where(ridge.isna(), "n/a", np.where(out["flop_per_byte"] >= ridge, "compute", "memory"))
    out["peak_note"] = [_peak_note(r) for _, r in out.iterrows()]
    order = {s: i for i, s in enumerate(STAGES)}
    return out.sort_values([*keys[:-1], "stage"], key=lambda c: c.map(order) if c.name == "stage" else c
                           ).reset_index(drop=True)
