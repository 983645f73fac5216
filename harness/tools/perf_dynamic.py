"""`make perf-dynamic`: the ID transformer (csrc/id_transformer.cpp) on its own, one thread.

1. Throughput: a table of --slots slots filled, then batches of --batch ids in which a set share
   hits resident ids and the rest are ids never seen (each admitted, evicting the coldest), new
   ids consecutive and, a second time, in random order (ID_ORDERS);
   M ids/s of the transformer at hit rates of 50, 90 and 99%, against a Python dict transformer
   (an OrderedDict LRU in plain Python returning the slots only, dict_lru, timed on every batch
   the transformer is) and against raw torch.unique of the same ids (deduplication alone, no
   table). Only the calls are timed; batches are made outside. A few warm-up batches go untimed
   first; over the timed batches the lru log's ring fills once over (timed_batches), so a
   compaction, where the ids call for one, is in the figure as in a long run; how many there were
   is printed, and the share of ids lru's scan took 8 at a time (AVX-512, where the CPU has it and
   the batch before brought a quarter or more new ids; IdTransformer.set_vector_scan).
   Beside them, the machine's memory bound: random reads a second from a table of the hash
   table's size, over the reads an id needs at the least (memory_bound), so a figure says both
   how far it is from the goal and how far from what this machine allows.
   Every case runs --throughput-repeats times (fresh tables and ids each, the repeats of all cases
   interleaved); the ratio to the dict is summed up as its median and range, and the goal's
   verdict is the median's (goal_verdict), saying in how many repeats it was missed. Each run also
   says how its transformer's batch times spread (batch_spread), so a ratio pulled down by a tail
   of slow batches can be told from one whose median batch is slow (THROUGHPUT_REPEATS), and how
   its time divides among the transform's parts, in all batches and in the slowest ones
   (part_spread: scan, victims, admit).
2. Hit rate against slots for power-law ids (Zipf, --alpha) under each policy, after a warm-up
   half of the stream: printed, and plotted in reports/perf-dynamic/hit_rate.png.
3. Training: `mlperf-ids` (MLPerf's full id spaces, every table over 65536 rows dynamic) against
   the static `small` preset at the same global batch, --repeats interleaved pairs of bench runs
   (the order flips every pair): iteration time p50s and their ratio, the dynamic sub-spans, and
   each rank's peak resident memory against mlperf-ids's budget.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import textwrap
import time
from collections import OrderedDict
from pathlib import Path

import torch

from harness.tools.quiet_bench import run_bench
from model.id_transformer import POLICIES, TRANSFORM_PARTS, IdTransformer, log_room_per_slot, random_read_rate

HIT_RATES = (0.5, 0.9, 0.99)
GOAL_VS_DICT = 50.0
"""The transformer's throughput over the Python dict's that issue 15 asks for."""


def dict_lru(table: OrderedDict, ids: list[int]) -> list[int]:
    """The Python baseline: each id's slot, admitting misses into the least recent id's slot.

    It returns the slots only, from a list: less than the transformer's whole job, which in Python
    takes longer (tensors in and out with the admitted and evicted ids took x1.06-1.13 its time;
    docs/perf-dynamic-notes.md). The ratio printed is against this loop."""
    out = []
    for i in ids:
        s = table.get(i)
        if s is None:
            _, s = table.popitem(last=False)
            table[i] = s
        else:
            table.move_to_end(i)
        out.append(s)
    return out


def mixed_batch(resident: torch.Tensor, n: int, hit_rate: float, next_new: int, gen,
                id_of: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """n ids: round(n * hit_rate) drawn from the resident ids, the rest new, shuffled. The new ids
    are the next in line (next_new, next_new + 1, ...), or, given id_of, id_of at those places."""
    hits = round(n * hit_rate)
    drawn = resident[torch.randint(0, resident.numel(), (hits,), generator=gen)]
    new = torch.arange(next_new, next_new + n - hits)
    if id_of is not None:
        if next_new + n - hits > id_of.numel():
            raise ValueError(f"mixed_batch: id_of maps {id_of.numel():,} ids, the batch needs {next_new + n - hits:,}")
        new = id_of[new]
    return torch.cat([drawn, new])[torch.randperm(n, generator=gen)], next_new + n - hits


READS_PER_HIT = 1
READS_PER_MISS = 2
"""Random reads of the hash table an id needs at the least: a resident id its bucket; a new one its
bucket and, once the slots are full, its victim's (erased). The lru transformer keeps an id's
recency in its bucket; its log entry (sequential) and dead bit (a 1 MiB set at a million slots)
come on top of these."""


def memory_bound(ceiling: float, hit_rate: float) -> float:
    """The ids/s no transformer of this table size can pass on this machine at this hit rate:
    the random-read ceiling over the reads an id needs on average."""
    return ceiling / (hit_rate * READS_PER_HIT + (1 - hit_rate) * READS_PER_MISS)


def timed_dict_lru(table: OrderedDict, ids: list[int]) -> float:
    """Seconds dict_lru takes on ids, with Python's cyclic garbage collector paused: its passes
    over the million-entry table would land in the baseline's time and make the ratio look better
    than plain Python allows."""
    gc.disable()
    try:
        start = time.perf_counter()
        dict_lru(table, ids)
        return time.perf_counter() - start
    finally:
        gc.enable()


WARMUP_BATCHES = 3
"""Untimed batches at each hit rate before the timed ones (the first calls after the fill touch
outputs and working lists for the first time)."""


def timed_batches(slots: int, batch: int) -> int:
    """Batches in which the lru log's ring fills once over: it holds log_room_per_slot() entries a
    slot, and a compaction keeps one entry a slot, so one that the ids call for (the least recent
    resident id's access falling that far behind) comes at most (log_room_per_slot() - 1) x slots
    ids after the last, and a window of that many ids holds it wherever its phase falls."""
    return -(-(log_room_per_slot() - 1) * slots // batch)


ID_ORDERS = ("consecutive", "random")
"""How the benchmark's ids run: new ids consecutive (the next in line, as a dense id space hands them
out), or the same ids through a fixed random permutation of the id space (the transformer's
multiplicative hash spreads consecutive ids evenly over the table, so this is its harder case; the
dict sees the same ids either way)."""


THROUGHPUT_REPEATS = 3
"""How many times each throughput case runs, each time with fresh tables and ids (its own seed),
the repeats of all cases interleaved. One run's ratio to the dict moves by several per cent with
the machine, mostly through the transformer's rate, partly through a tail of slow batches that
come with the dict's pass in the loop (at the scan's start; from outside the process, as far as
can be told). So the verdict is the median's, and each run's spread (batch_spread) and time by
part (part_spread) are printed beside it. The measurements: docs/perf-dynamic-notes.md."""


def goal_verdict(ratios: list[float], goal: float = GOAL_VS_DICT) -> str:
    """The goal's verdict over repeated ratios: met in every repeat, met at the median only (and in
    how many it was missed), or missed at the median."""
    misses = sum(r < goal for r in ratios)
    if statistics.median(ratios) < goal:
        return f"MISSED at the median ({misses} of {len(ratios)} below x{goal:g})"
    if misses:
        return f"met at the median, missed in {misses} of {len(ratios)} repeats"
    return "met in every repeat"


def batch_spread(seconds: list[float]) -> tuple[float, float, float]:
    """A run's batch times: its median batch, and its 90th-percentile batch and whole run (the
    mean batch) each over that median. The ratio to the dict is the whole run's; these say how much
    of it went to slow batches (THROUGHPUT_REPEATS)."""
    median = statistics.median(seconds)
    p90 = statistics.quantiles(seconds, n=10, method="inclusive")[-1] if len(seconds) > 1 else seconds[0]
    return median, p90 / median, statistics.fmean(seconds) / median


def part_spread(seconds: list[float], parts: list[dict[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """Where a run's transformer time went, by the transform's parts (TRANSFORM_PARTS), from each
    batch's time and part seconds: each part's share of all the parts' time, and each part's mean
    in the run's slowest tenth of batches (at least one) over its mean in the batches at or below
    the median batch, so a tail of slow batches can be pinned on a part."""
    total = sum(sum(p.values()) for p in parts)
    shares = {name: sum(p[name] for p in parts) / total if total else 0.0 for name in TRANSFORM_PARTS}
    order = sorted(range(len(seconds)), key=lambda i: seconds[i])
    median = statistics.median(seconds)
    typical = [parts[i] for i in order if seconds[i] <= median]
    slow = [parts[i] for i in order[-max(1, len(seconds) // 10):]]
    over = {}
    for name in TRANSFORM_PARTS:
        base = statistics.fmean(p[name] for p in typical)
        over[name] = statistics.fmean(p[name] for p in slow) / base if base else float("nan")
    return shares, over


def throughput(slots: int, batch: int, batches: int, seed: int, repeats: int = THROUGHPUT_REPEATS) -> list[dict]:
    """Every (hit rate, id order) case `repeats` times (THROUGHPUT_REPEATS), then the median and
    range of each case's ratio to the dict and the goal's verdict (goal_verdict)."""
    table_bytes = IdTransformer(slots, "lru").table_bytes
    ceiling = statistics.median(random_read_rate(table_bytes) for _ in range(5))
    print(textwrap.fill(f"memory ceiling: {ceiling / 1e6:.1f} M random reads/s from a table of "
                        f"{table_bytes / 2**20:,.0f} MiB (the hash table's size; median of 5); an id needs "
                        f"{READS_PER_HIT} (resident) or {READS_PER_MISS} (new, slots full)", WIDTH), flush=True)
    cases = [(h, o) for h in HIT_RATES for o in ID_ORDERS]
    rows = []
    for r in range(repeats):
        permutation = torch.randperm(slots + (WARMUP_BATCHES + batches) * batch,
                                     generator=torch.Generator().manual_seed(seed + 2 * r + 1))
        for rate, order in cases:
            row = throughput_case(slots, batch, batches, rate, order, seed + 2 * r, permutation, ceiling)
            row["repeat"] = r
            print(f"repeat {r + 1}/{repeats}, hit rate {rate:.0%}, ids {order}: transformer "
                  f"{row['transformer']:.2f} M ids/s, x{row['vs_dict']:.1f} the Python dict", flush=True)
            rows.append(row)
    print(format_throughput(rows, repeats), flush=True)
    return rows


WIDTH = 100
"""Columns every line fits in: what a repeat measured goes into the tables below, not one line."""


def format_throughput(rows: list[dict], repeats: int) -> str:
    """Three small tables of the repeats' rows: rates, the transformer's time by part, the goal."""
    parts = "  ".join(f"{n[:8]:>8}" for n in TRANSFORM_PARTS)
    out = ["a row a repeat and case, in M ids/s; bound: the memory ceiling's, reach: the share of it;",
           "AVX: ids scanned 8 at a time (AVX-512); p90, run: a batch's 90th percentile and the whole run",
           "over the median batch; compact: lru log compactions in the timed batches",
           f"{'rep':>3} {'hit':>4} {'ids':<11} {'meas':>6} {'transf':>7} {'dict':>6} {'x dict':>6} {'unique':>7} "
           f"{'bound':>6} {'reach':>5} {'compact':>7} {'AVX':>4} {'p90':>5} {'run':>6}"]
    for w in rows:
        out.append(f"{w['repeat'] + 1:>3} {w['hit_rate']:>4.0%} {w['id_order']:<11} {w['measured_hit_rate']:>6.1%} "
                   f"{w['transformer']:>7.2f} {w['python_dict']:>6.3f} {w['vs_dict']:>6.1f} {w['torch_unique']:>7.2f} "
                   f"{w['memory_bound']:>6.1f} {w['transformer'] / w['memory_bound']:>5.0%} {w['log_compactions']:>7} "
                   f"{w['vector_scan_share']:>4.0%} {w['transformer_p90_batch']:>5.2f} "
                   f"{w['transformer_run_over_median']:>6.3f}")
    out += ["the transformer's time by part, and its slowest tenth of batches over its typical ones (x):",
            f"{'rep':>3} {'hit':>4} {'ids':<11} {parts}  |  {parts}"]
    for w in rows:
        shares = "  ".join(f"{w['part_shares'][n]:>8.0%}" for n in TRANSFORM_PARTS)
        slow = "  ".join(f"{w['slow_part_over_typical'][n]:>8.2f}" for n in TRANSFORM_PARTS)
        out.append(f"{w['repeat'] + 1:>3} {w['hit_rate']:>4.0%} {w['id_order']:<11} {shares}  |  {slow}")
    out.append(f"against the Python dict, {repeats} repeat(s) a case (goal x{GOAL_VS_DICT:g}):")
    for rate, order in dict.fromkeys((w["hit_rate"], w["id_order"]) for w in rows):
        ratios = [w["vs_dict"] for w in rows if (w["hit_rate"], w["id_order"]) == (rate, order)]
        # Wrapped: a wide range with a long verdict passed 100 columns (x12.0-132.9, missed in 1 of 2).
        out.append(textwrap.fill(f"hit rate {rate:.0%}, ids {order:11s}: x{statistics.median(ratios):.1f} median "
                                 f"(x{min(ratios):.1f}-{max(ratios):.1f}): {goal_verdict(ratios)}", WIDTH,
                                 initial_indent="  ", subsequent_indent="    "))
    return "\n".join(out)


def throughput_case(slots: int, batch: int, batches: int, rate: float, order: str, seed: int,
                    permutation: torch.Tensor, ceiling: float) -> dict:
    """One case: a fresh transformer and dict, filled, then warm-up and timed batches."""
    gen = torch.Generator().manual_seed(seed)
    id_of = permutation if order == "random" else None
    first = torch.arange(slots) if id_of is None else id_of[:slots]
    fast = IdTransformer(slots, "lru")
    fast.transform(first)
    table = OrderedDict((i, s) for s, i in enumerate(first.tolist()))
    next_new, uniq_seconds, misses = slots, 0.0, 0
    seconds: list[float] = []  # a batch each, the transformer's and the dict's
    py_seconds: list[float] = []
    parts: list[dict[str, float]] = []  # a batch each, the transformer's part seconds (read outside the timed call)
    for b in range(-WARMUP_BATCHES, batches):
        held = fast.slot_ids()
        ids, next_new = mixed_batch(held[held >= 0], batch, rate, next_new, gen, id_of)
        # The dict takes every batch, warm-up ones too, so both hold the same ids, and it is
        # timed on the same batches as the transformer, side by side: timed on the first few
        # alone, its rate (and so the ratio) moved by 2x between runs as the machine did.
        if b < 0:
            fast.transform(ids)
            dict_lru(table, ids.tolist())
            continue
        if b == 0:
            compactions_before, vector_before = fast.log_compactions(), fast.vector_scanned_ids()
            parts_before = fast.part_seconds()
        start = time.perf_counter()
        got = fast.transform(ids)
        seconds.append(time.perf_counter() - start)
        parts_now = fast.part_seconds()
        parts.append({name: parts_now[name] - parts_before[name] for name in TRANSFORM_PARTS})
        parts_before = parts_now
        misses += got.admitted_ids.numel()
        start = time.perf_counter()
        torch.unique(ids, return_inverse=True)
        uniq_seconds += time.perf_counter() - start
        py_seconds.append(timed_dict_lru(table, ids.tolist()))
    n = batch * batches
    median, p90, whole = batch_spread(seconds)
    row = {"hit_rate": rate, "id_order": order, "measured_hit_rate": 1 - misses / n,
           "transformer": n / sum(seconds) / 1e6, "python_dict": n / sum(py_seconds) / 1e6,
           "torch_unique": n / uniq_seconds / 1e6,
           "vs_dict_median_batch": statistics.median(py_seconds) / median,
           "transformer_p90_batch": p90, "transformer_run_over_median": whole,
           "memory_bound": memory_bound(ceiling, rate) / 1e6,
           "log_compactions": fast.log_compactions() - compactions_before,
           "vector_scan_share": (fast.vector_scanned_ids() - vector_before) / n}
    row["part_shares"], row["slow_part_over_typical"] = part_spread(seconds, parts)
    row["vs_dict"] = row["transformer"] / row["python_dict"]
    row["bound_vs_dict"] = row["memory_bound"] / row["python_dict"]
    return row


def power_law_ids(n: int, universe: int, alpha: float, gen) -> torch.Tensor:
    """Zipf-like ids: rank r drawn with weight r^-alpha, ranks scattered over the id space."""
    weights = torch.arange(1, universe + 1, dtype=torch.float64) ** -alpha
    ranks = torch.multinomial(weights, n, replacement=True, generator=gen)
    return (ranks * 2654435761) % (1 << 40)


def hit_rates(slot_counts: list[int], batch: int, batches: int, universe: int, alpha: float, seed: int):
    stream = power_law_ids(batch * batches, universe, alpha, torch.Generator().manual_seed(seed)).view(batches, batch)
    # The ceiling: an id seen for the first time misses whatever the slots (no eviction at all).
    half = batch * (batches - batches // 2)
    seen_before = set(stream[: batches // 2].reshape(-1).tolist())
    first = 0
    for i in stream[batches // 2 :].reshape(-1).tolist():
        if i not in seen_before:
            first += 1
            seen_before.add(i)
    ceiling = 1 - first / half
    print(f"ceiling (every id ever seen kept): {ceiling:.1%}", flush=True)
    curves = {}
    print("slots:  " + " ".join(f"{n:>9,}" for n in slot_counts), flush=True)
    for policy in POLICIES:
        curves[policy] = []
        for slots in slot_counts:
            t = IdTransformer(slots, policy, half_life=10 * batch)
            misses = 0
            for b in range(batches):
                got = t.transform(stream[b])
                if b >= batches // 2:
                    misses += got.admitted_ids.numel()
            curves[policy].append(1 - misses / half)
        print(f"{policy:6s}: " + " ".join(f"{h:>9.1%}" for h in curves[policy]), flush=True)
    return curves, ceiling


def plot(slot_counts: list[int], curves: dict, ceiling: float, out: Path, alpha: float, universe: int) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for policy, rates in curves.items():
        ax.plot(slot_counts, [100 * r for r in rates], marker="o", label=policy)
    ax.axhline(100 * ceiling, color="grey", linestyle="--", label="ceiling: no eviction")
    ax.set_xscale("log")
    ax.set_xlabel("slots")
    ax.set_ylabel("hit rate, % (second half of the stream)")
    ax.set_title(f"ID transformer hit rate, power-law ids (alpha {alpha}, {universe:,} ids)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "hit_rate.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def training(repeats: int, iters: int, runs_root: Path) -> None:
    """mlperf-ids against static small at mlperf-ids's batch, interleaved (module docstring, 3)."""
    from harness.presets import MLPERF_IDS_RSS_BUDGET_GIB, mlperf_ids
    from harness.report.api import iteration_summary, subspan_table

    batch = mlperf_ids().data.global_batch_size
    common = ["--iters", str(iters), "--warmup", "3"]
    configs = {"mlperf-ids": ["--preset", "mlperf-ids", *common],
               "small": ["--preset", "small", "--global-batch", str(batch), *common]}
    print(f"training: mlperf-ids against static small, global batch {batch}, {iters} timed iterations a run, "
          f"{repeats} interleaved pairs", flush=True)
    p50: dict[str, list[float]] = {name: [] for name in configs}
    names = list(configs)
    last = None
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            run = run_bench(configs[name], runs_root, tool="perf-dynamic")
            p50[name].append(iteration_summary(run)["iter_ms_p50"])
            print(f"  pair {r + 1}/{repeats} {name:10s}: iter_ms p50 {p50[name][-1]:8.1f}  ({run.run_id})", flush=True)
            if name == "mlperf-ids":
                last = run
    ratios = [d / s for d, s in zip(p50["mlperf-ids"], p50["small"])]
    print(textwrap.fill(f"  mlperf-ids / small iteration time: x{statistics.median(ratios):.3f} "
                        f"(pairs {', '.join(f'{x:.3f}' for x in ratios)})", WIDTH, subsequent_indent="    "))
    subs = subspan_table(last)
    for row in subs.itertuples():
        print(f"  {row.stage}/{row.name}: {row.mean_ms:.2f} ms mean ({row.count} records, "
              f"{row.share_of_stage:.1%} of {row.stage})")
    for info in last.manifest.ranks:
        verdict = "under" if info.peak_rss_gib is not None and info.peak_rss_gib < MLPERF_IDS_RSS_BUDGET_GIB else "OVER"
        print(f"  rank {info.rank}: peak RSS {info.peak_rss_gib:.2f} GiB, {verdict} the budget of "
              f"{MLPERF_IDS_RSS_BUDGET_GIB:g} GiB; its ID transformers: "
              f"{transformer_host_gib(runs_root / last.run_id, info.rank):.2f} GiB")
    print(f"  (the last mlperf-ids run: {last.run_id})")


def transformer_host_gib(run_dir: Path, rank: int) -> float:
    """The host memory a rank's ID transformers held at the end of a run (its dynamic.json)."""
    path = run_dir / f"rank{rank:05d}" / "dynamic.json"
    tables = json.loads(path.read_text()) if path.exists() else {}
    return sum(t["transformer_host_bytes"] for t in tables.values()) / 2**30


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="harness.tools.perf_dynamic", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--slots", type=int, default=1 << 20, help="slots of the throughput table (default %(default)s)")
    p.add_argument("--batch", type=int, default=1 << 16, help="ids a batch (default %(default)s)")
    p.add_argument("--batches", type=int, default=None,
                   help="batches timed a hit rate (default: the lru log's ring filled once over)")
    p.add_argument("--throughput-repeats", type=int, default=THROUGHPUT_REPEATS,
                   help="runs of each throughput case, fresh tables and ids each (default %(default)s)")
    p.add_argument("--alpha", type=float, default=1.05, help="power-law exponent of the hit-rate ids")
    p.add_argument("--universe", type=int, default=4_000_000, help="distinct ids the power law draws from")
    p.add_argument("--out", type=Path, default=Path("reports/perf-dynamic"), help="where the plot goes")
    p.add_argument("--repeats", type=int, default=2, help="interleaved training pairs (default %(default)s; 0: none)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations a training run (default %(default)s)")
    p.add_argument("--runs-root", type=Path, default=Path("runs"), help="where the training runs go")
    args = p.parse_args(argv)
    if args.repeats < 0:
        p.error("--repeats must be >= 0")
    for name in ("slots", "batch", "batches", "universe", "iters", "throughput_repeats"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive integer")
    torch.set_num_threads(1)  # one thread, as the goal is stated
    batches = args.batches or timed_batches(args.slots, args.batch)
    print(textwrap.fill(f"throughput: {args.slots:,} slots, batches of {args.batch:,} ids, {WARMUP_BATCHES} warm-up "
                        f"and {batches} timed a case, {args.throughput_repeats} repeat(s) of every case, one thread",
                        WIDTH), flush=True)
    throughput(args.slots, args.batch, batches, seed=0, repeats=args.throughput_repeats)
    slot_counts = [1 << k for k in range(13, 22, 2)]  # from twice the distinct ids a batch can hold
    print(f"hit rate against slots: power-law ids (alpha {args.alpha}) over {args.universe:,}", flush=True)
    curves, ceiling = hit_rates(slot_counts, batch=4096, batches=120, universe=args.universe, alpha=args.alpha, seed=1)
    print(f"wrote {plot(slot_counts, curves, ceiling, args.out, args.alpha, args.universe)}")
    if args.repeats:
        training(args.repeats, args.iters, args.runs_root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
