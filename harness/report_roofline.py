"""Roofline columns: analytic FLOPs and bytes of each stage, against the machine's measured peaks.

The work of a stage is counted from the run's config alone (manifest `config`, `sharding_plan`,
`dense_flops_per_sample`), per rank and per iteration. Notation:

    W  world size            B  local batch (global batch / W)     G = B * W
    F  sparse features       D  embedding_dim                      H_t multi-hot size of table t
    T_r  tables rank r owns (manifest sharding_plan.table_owner; absent: 1/W of every table)
    ids_out = B * sum_t H_t            ids this rank sends (its samples, every feature)
    ids_in  = G * sum_{t in T_r} H_t   ids this rank receives and looks up (global batch, its tables)
    P  dense parameters = bottom MLP and top MLP weights + biases, plus per cross layer
       V (width x cross_rank) + W (cross_rank x width) + b (width), width = (F + 1) * D
    A  dense activations a sample = num_dense + sum(bottom) + width
       + cross_layers * (cross_rank + 2 * width) + sum(top)
    ids and lengths are int64 (8 bytes), everything else float32 (4 bytes).

| stage | FLOPs | bytes |
|---|---|---|
| input_dist | 0 | 8 * (ids_out + B*F + ids_in + G*len(T_r)): ids and lengths sent and received |
| emb_fwd | D * ids_in (sum pooling) | 4*D*ids_in rows read + 8*ids_in ids read + 4*D*G*len(T_r) pooled written + 4*D*(G*len(T_r) + B*F) output all-to-all sent and received |
| dense_fwd_bwd | dense_flops_per_sample * B | 4 * (2P weights read forward and backward + P gradients written + 2P all-reduce read/write) + 4 * 3*B*A activations written, read back, their gradients written |
| emb_bwd | k * D * ids_in (k = 6 exact_adagrad, 4 rowwise, 2 sgd) | 4*D*(B*F + G*len(T_r)) gradient all-to-all + 4*D*ids_in pooled gradient read per id + 8*D*ids_in rows read and written + optimizer state read and written (8*D*ids_in exact_adagrad, 8*ids_in rowwise, 0 sgd) + 8*ids_in ids |
| dense_update | 6P (Adagrad: g*g, +=, sqrt, +eps, /, lr*) | 4 * 6P: param, grad, state read; param, state written; grads zeroed |

Embedding rows are counted once per id: fbgemm merges repeated ids of a batch, so emb_bwd (and,
with caches, emb_fwd) bytes are upper bounds and their achieved fractions may read high.
Achieved rates use each rank's mean non-warm-up duration; fractions are over that rank's
gemm_gflops (a plain torch.mm) and copy_gbps (a device memory copy, read + write). The
collectives in input_dist, emb_fwd, emb_bwd and dense_fwd_bwd move bytes over links slower
than memory, so low bandwidth fractions there often mean "waiting on the network or on peers".
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.report_load import ReportError, Run
from harness.report_tables import timed_stages
from harness.stages import STAGES

# FLOPs per embedding element updated by the fused optimizer (see the module docstring).
EMB_OPT_FLOPS = {"exact_adagrad": 6, "exact_rowwise_adagrad": 4, "exact_sgd": 2}
# State bytes read+written per element updated (rowwise: one float a row, counted per row).
EMB_STATE_BYTES = {"exact_adagrad": ("element", 8), "exact_rowwise_adagrad": ("row", 8), "exact_sgd": ("row", 0)}


def dense_shape(model: dict) -> tuple[int, int, int]:
    """(P parameters, A activations a sample, dense FLOPs a sample forward + backward)."""
    F, D = len(model["table_rows"]), int(model["embedding_dim"])
    width = (F + 1) * D
    params = macs = 0
    w_in = int(model["num_dense"])
    for w in model["bottom_mlp"]:
        params += w_in * w + w
        macs += w_in * w
        w_in = w
    L, R = int(model["cross_layers"]), int(model["cross_rank"])
    params += L * (width * R + R * width + width)
    macs += L * 2 * width * R
    w_in = width
    for w in model["top_mlp"]:
        params += w_in * w + w
        macs += w_in * w
        w_in = w
    acts = int(model["num_dense"]) + sum(model["bottom_mlp"]) + width + L * (R + 2 * width) + sum(model["top_mlp"])
    return params, acts, 3 * 2 * macs


def stage_work(run: Run) -> pd.DataFrame:
    """FLOPs and bytes of each stage on each rank in one iteration (formulas: module docstring).

    Raises ReportError when the manifest lacks what the formulas need.
    """
    m = run.manifest
    cfg = m.get("config") or {}
    model = cfg.get("model") or {}
    need = ("table_rows", "multi_hot", "num_dense", "embedding_dim", "bottom_mlp", "cross_layers",
            "cross_rank", "top_mlp")
    lack = [k for k in need if k not in model]
    world = m.get("world_size")
    gbatch = m.get("global_batch_size") or (cfg.get("data") or {}).get("global_batch_size")
    if lack or not world or not gbatch:
        what = f"config.model lacks {', '.join(lack)}" if lack else "world_size or global_batch_size missing"
        raise ReportError(f"run {run.run_id}: roofline n/a: manifest {what}")
    W, G = int(world), int(gbatch)
    B = G // W
    D, hot = int(model["embedding_dim"]), [int(h) for h in model["multi_hot"]]
    F = len(hot)
    P, A, flops_sample = dense_shape(model)
    flops_sample = m.get("dense_flops_per_sample") or flops_sample
    opt = (cfg.get("optimizer") or {}).get("embedding_optimizer", "exact_adagrad")
    k_opt = EMB_OPT_FLOPS.get(opt, EMB_OPT_FLOPS["exact_adagrad"])
    state_per, state_bytes = EMB_STATE_BYTES.get(opt, EMB_STATE_BYTES["exact_adagrad"])
    owners = (m.get("sharding_plan") or {}).get("table_owner")
    if not (isinstance(owners, list) and len(owners) == F):
        owners = None  # unknown plan: every rank gets 1/W of every table's work
    ids_out = B * sum(hot)
    rows = []
    for r in range(W):
        if owners is None:
            ids_in, n_tables = G * sum(hot) / W, F / W
        else:
            ids_in = G * sum(h for h, o in zip(hot, owners) if o == r)
            n_tables = sum(1 for o in owners if o == r)
        pooled_local = G * n_tables * D  # elements this rank pools for the whole batch
        state = state_bytes * (D * ids_in if state_per == "element" else ids_in)
        work = {
            "input_dist": (0.0, 8 * (ids_out + B * F + ids_in + G * n_tables)),
            "emb_fwd": (D * ids_in, 4 * D * ids_in + 8 * ids_in + 4 * pooled_local + 4 * (pooled_local + B * F * D)),
            "dense_fwd_bwd": (flops_sample * B, 4 * 5 * P + 4 * 3 * B * A),
            "emb_bwd": (k_opt * D * ids_in, 4 * (B * F * D + pooled_local) + 4 * D * ids_in + 8 * D * ids_in
                        + state + 8 * ids_in),
            "dense_update": (6 * P, 4 * 6 * P),
        }
        rows += [{"rank": r, "stage": s, "flops": float(f), "bytes": float(b)} for s, (f, b) in work.items()]
    return pd.DataFrame(rows)


def _peaks(run: Run) -> pd.DataFrame:
    ranks = pd.DataFrame(run.manifest.get("ranks") or [])
    out = pd.DataFrame({"rank": ranks["rank"].astype("int64") if "rank" in ranks else pd.Series(dtype="int64")})
    for c in ("gemm_gflops", "copy_gbps"):
        out[c] = pd.to_numeric(ranks[c], errors="coerce") if c in ranks else np.nan
    return out


def roofline_table(run: Run, *, per_rank: bool = False) -> pd.DataFrame:
    """Per stage: analytic GFLOP and MB an iteration, mean ms, achieved GFLOP/s and GB/s, the
    measured peaks and the achieved fractions (n/a = NaN where a peak was not measured).

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
    out["flops_frac"] = out["achieved_gflops"] / out["gemm_gflops"]
    out["bytes_frac"] = out["achieved_gbps"] / out["copy_gbps"]
    # Which roof bounds the stage: its intensity against the machine's ridge point.
    ridge = out["gemm_gflops"] / out["copy_gbps"]
    out["bound"] = np.where(ridge.isna(), "n/a", np.where(out["flop_per_byte"] >= ridge, "compute", "memory"))
    order = {s: i for i, s in enumerate(STAGES)}
    return out.sort_values([*keys[:-1], "stage"], key=lambda c: c.map(order) if c.name == "stage" else c
                           ).reset_index(drop=True)
