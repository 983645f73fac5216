"""Figures stated against a measured peak (the GEMM probe's FLOP/s, the copy probe's bytes/s).

A figure is at most 100% of its peak (design.md). A measured figure above the peak its rank
measured means the probe measured the peak wrong (another precision, TF32 setting or shape than
the work it is held against; a busy machine), or, for analytic bytes, that the count is an upper
bound: the report says so in words, and states no efficiency. No fraction above 1 leaves here.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def within_peak(achieved: pd.Series | float, peak: pd.Series | float) -> pd.Series | float:
    """achieved / peak, NaN where the peak is unknown or where achieved stands above it (a probe
    defect, said by `above_peak_note`, never a fraction above 1)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = achieved / peak
    if isinstance(frac, pd.Series):
        return frac.where(frac <= 1.0)
    return frac if frac <= 1.0 else float("nan")


def is_above(achieved: float, peak: float) -> bool:
    """Whether a figure stands above its measured peak (both known)."""
    return not (math.isnan(achieved) or math.isnan(peak)) and peak > 0 and achieved > peak


def _rate(gflops: float) -> str:
    return f"{gflops / 1e3:.1f} TFLOP/s" if gflops >= 1e3 else f"{gflops:.3g} GFLOP/s"


def above_gemm_note(what: str, gflops: float, gemm_gflops: float) -> str:
    """The sentence for FLOP/s above the GEMM probe."""
    return (f"{what} ran at {_rate(gflops)}, above the GEMM probe's {_rate(gemm_gflops)}: the probe under-measures "
            "this device's peak (its precision, TF32 setting or shapes are not the dense step's); no efficiency "
            "stated")


def above_copy_note(what: str, gbps: float, copy_gbps: float) -> str:
    """The sentence for bytes/s above the copy probe."""
    return (f"{what} moved {gbps:,.0f} GB/s by the analytic count, above the copy probe's {copy_gbps:,.0f} GB/s: "
            "the probe under-measures this device's bandwidth, or the count is above what the kernels move; "
            "no efficiency stated")
