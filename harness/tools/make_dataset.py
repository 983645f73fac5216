"""`make dataset`: synthetic days in the MLPerf multi-hot Criteo layout (harness/data/criteo_files.py),
with labels a model can learn.

Features are drawn as the synthetic stream draws them (harness/data/synthetic.py: log-scaled exponential
dense counts, power-law ids below each of the preset's table sizes, its hotness). Labels come
from a fixed random teacher shaped like a DLRM: a linear term in the dense features plus, for
each sparse feature, the mean over the sample's ids of a weight every (feature, id) pair owns
(a hash of the seed, the feature and the id, so tables of 40M rows need no memory), through a
sigmoid, then a Bernoulli draw. `teacher.json` beside the files records the teacher's own AUROC
on the last day: no model scores above it, so a target AUC must sit below it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from harness.data.criteo_files import DENSE, LABELS, SPARSE
from harness.data.synthetic import power_law_ids
from harness.presets import PRESETS

CHUNK = 65536
"""Rows drawn at a time: bounds the float64 draws to tens of MB whatever the day's size."""
# The teacher's logit: DENSE_WEIGHT x (4 dense features - 4 others) + SPARSE_WEIGHT / sqrt(26) x each
# feature's mean id weight + BIAS. Picked so the teacher's own AUROC is about 0.9 and about 46% of
# labels are 1: tiny reaches 0.8 within a day of 20,000 samples (measured), well below the ceiling.
DENSE_WEIGHT = 0.5
SPARSE_WEIGHT = 3.6
BIAS = -0.8


def id_weights(seed: int, feature: int, ids: np.ndarray) -> np.ndarray:
    """The teacher's weight of each id of one feature: uniform with unit variance, from splitmix64
    of (seed, feature, id) (numpy's uint64 arithmetic wraps, as the hash needs)."""
    z = (ids.astype(np.uint64) + np.uint64(((seed * 1_000_003 + feature) * 0x9E3779B97F4A7C15) % 2**64))
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return (2.0 * u - 1.0) * np.sqrt(3.0)


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """The rank-sum AUROC (ties share their mean rank): the teacher's own score, for teacher.json."""
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    mean_rank = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(mean_rank, counts)
    pos = labels.astype(bool)
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def make_day(rng: np.random.Generator, *, rows: int, table_rows, multi_hot, num_dense: int, seed: int,
             id_exponent: float, progress) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], np.ndarray]:
    """(dense, labels, ids per feature, teacher logits) of one day."""
    dense = np.log1p(-np.log1p(-rng.random((rows, num_dense))) * 8.0).astype(np.float32)
    logit = DENSE_WEIGHT * (dense[:, :4].sum(1) - dense[:, 4:8].sum(1)) + BIAS
    sparse = []
    for f, (n, hot) in enumerate(zip(table_rows, multi_hot)):
        ids = np.empty((rows, hot), dtype=np.int32)
        for a in range(0, rows, CHUNK):
            b = min(rows, a + CHUNK)
            ids[a:b] = power_law_ids(rng.random((b - a, hot)), n, id_exponent)
            logit[a:b] += SPARSE_WEIGHT * id_weights(seed, f, ids[a:b]).mean(1) / np.sqrt(len(multi_hot))
        sparse.append(ids)
        progress(f + 1, len(multi_hot))
    labels = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int32)
    return dense, labels.reshape(-1, 1), sparse, logit


def written(out: Path) -> list[Path]:
    """The files this tool writes into `out` (and numpy's temporary names for them)."""
    return sorted(p for p in out.glob("*") if re.fullmatch(r"(day_\d+_.*|teacher\.json)(\.tmp.*)?", p.name))


def why(exc: OSError, out: Path) -> str:
    """The cause in words: numpy's short write ("N requested and M written") has no errno of its own."""
    if exc.strerror:
        return exc.strerror
    try:
        full = shutil.disk_usage(out if out.exists() else out.parent).free < (1 << 20)
    except OSError:
        full = False
    return f"No space left on device ({exc})" if full else str(exc)


def write_days(args: argparse.Namespace) -> dict:
    """Every day's files and teacher.json; the teacher's facts."""
    cfg = PRESETS[args.preset]()
    m = cfg.model
    start, last_print = time.perf_counter(), 0.0
    for d in range(args.days):
        def progress(done: int, of: int, d: int = d) -> None:
            nonlocal last_print
            now = time.perf_counter()
            if now - last_print >= 3.0 or (d == args.days - 1 and done == of):
                frac = (d + done / of) / args.days
                eta = (now - start) * (1 - frac) / frac
                print(f"day {d + 1}/{args.days}: feature {done}/{of}, {now - start:.0f} s, ETA {eta:.0f} s", flush=True)
                last_print = now

        rng = np.random.default_rng([args.seed, d])
        dense, labels, sparse, logit = make_day(rng, rows=args.rows, table_rows=m.table_rows, multi_hot=m.multi_hot,
                                                num_dense=m.num_dense, seed=args.seed,
                                                id_exponent=cfg.data.id_exponent, progress=progress)
        np.save(args.out / DENSE.format(d), dense, allow_pickle=False)
        np.save(args.out / LABELS.format(d), labels, allow_pickle=False)
        np.savez(args.out / SPARSE.format(d), **{str(f): ids for f, ids in enumerate(sparse)})
    teacher = {"preset": args.preset, "rows_per_day": args.rows, "days": args.days, "seed": args.seed,
               "positive_rate_last_day": float(labels.mean()),
               "teacher_auroc_last_day": auroc(logit, labels.reshape(-1))}
    (args.out / "teacher.json").write_text(json.dumps(teacher, indent=2) + "\n")
    return teacher


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="harness.tools.make_dataset", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder to write (must not exist or be empty)")
    p.add_argument("--rows", type=int, default=100_000, help="samples a day (default %(default)s)")
    p.add_argument("--days", type=int, default=3, help="days; the last is the held-out one (default %(default)s)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                   help="whose table sizes bound the ids and whose hotness the features have (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seeds the features and the teacher (default %(default)s)")
    args = p.parse_args(argv)
    if args.rows < 1 or args.days < 2:
        p.error(f"--rows must be >= 1 and --days >= 2 (the last day is held out); got {args.rows}, {args.days}")
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        p.error(f"--out {args.out} exists and is not an empty folder; nothing is overwritten")
    made = not args.out.exists()
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        teacher = write_days(args)
    except OSError as exc:  # a read-only or full filesystem: no half dataset a rerun would refuse
        cause = why(exc, args.out)  # before the files go: their space is what says the disk was full
        for path in written(args.out):
            path.unlink(missing_ok=True)
        if made and args.out.is_dir() and not any(args.out.iterdir()):
            args.out.rmdir()
        print(f"make dataset: cannot write {exc.filename or args.out}: {cause}; nothing is left "
              "behind", file=sys.stderr)
        return 1
    print(f"wrote {args.days} days of {args.rows} samples to {args.out}; the teacher's own AUROC on the last day: "
          f"{teacher['teacher_auroc_last_day']:.4f} (no model scores above it)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
