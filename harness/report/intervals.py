"""Unions of time intervals and how much of a window they cover, vectorised: a trace holds 1e5
kernels, a run's records 1e4 stage spans. Keeps the times' dtype: the records' int64 epoch ns
are past float64's exact integers."""

from __future__ import annotations

import numpy as np


def union(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Disjoint (start, end) rows, sorted, covering the same time as the given intervals."""
    s, e = np.asarray(starts), np.asarray(ends)
    if len(s) == 0:
        return np.empty((0, 2), dtype=np.result_type(s, e))
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > np.maximum.accumulate(e)[:-1]
    heads = np.flatnonzero(new)
    return np.column_stack([s[heads], np.maximum.reduceat(e, heads)])


def covered_before(union: np.ndarray, t: np.ndarray) -> np.ndarray:
    """How much of the disjoint sorted intervals `union` lies before each time in t."""
    t = np.asarray(t)
    if len(union) == 0:
        return np.zeros_like(t)
    lengths = union[:, 1] - union[:, 0]
    before = np.concatenate([np.zeros(1, lengths.dtype), np.cumsum(lengths)])
    j = np.searchsorted(union[:, 0], t, side="right")  # intervals starting at or before t
    k = np.maximum(j - 1, 0)
    return np.where(j > 0, before[k] + np.clip(t - union[k, 0], 0, lengths[k]), 0)


def covered(union: np.ndarray, lo: np.ndarray | float, hi: np.ndarray | float) -> np.ndarray:
    """How much of each [lo, hi] the disjoint sorted intervals `union` cover (0 where hi <= lo)."""
    lo = np.asarray(lo)
    hi = np.maximum(np.asarray(hi), lo)
    return covered_before(union, hi) - covered_before(union, lo)
