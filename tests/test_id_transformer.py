"""The C++ ID transformer (csrc/id_transformer.cpp) against a plain Python model of each policy:
the same slots, the same admissions and the same evictions in the same order, on random,
power-law and adversarial id streams."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from model.id_transformer import POLICIES, IdTransformer, log_room_per_slot


def cpu_has_avx512() -> bool:
    try:
        IdTransformer(1, "lru").set_vector_scan("always")
    except ValueError:
        return False
    return True


needs_avx512 = pytest.mark.skipif(not cpu_has_avx512(), reason="lru's vector scan needs a CPU with AVX-512")


class DictModel:
    """Each policy as its definition reads, with dicts and a full sort: one clock tick an id
    occurrence; a batch's new ids take never-used slots in order, then the slots of the coldest
    ids the batch did not touch."""

    def __init__(self, capacity: int, policy: str, half_life: int) -> None:
        self.capacity, self.policy, self.half_life = capacity, policy, half_life
        self.slot_of: dict[int, int] = {}
        self.held: dict[int, list[int]] = {}  # slot -> [id, last tick, count]
        self.clock = 0

    def heat(self, count: int, last: int, now: int) -> int:
        if self.policy == "lru":
            return 0
        if self.policy == "lfu":
            return count
        halvings = (now - last) // self.half_life
        return 0 if halvings >= 62 else count >> halvings

    def transform(self, ids: list[int]):
        saved = copy.deepcopy((self.slot_of, self.held, self.clock))
        try:
            return self._transform(ids)
        except ValueError:  # a refused batch changes nothing
            self.slot_of, self.held, self.clock = saved
            raise

    def _transform(self, ids: list[int]):
        start, new = self.clock, {}
        for i in ids:
            now = self.clock
            self.clock += 1
            if i in self.slot_of:
                entry = self.held[self.slot_of[i]]
                if self.policy == "lfu":
                    entry[2] += 1
                elif self.policy == "hybrid":
                    entry[2] = self.heat(entry[2], entry[1], now) + 1
                entry[1] = now
            else:
                new[i] = [now, new.get(i, [0, 0])[1] + 1]
        never_used = list(range(len(self.held), self.capacity))[: len(new)]
        ranked = sorted((self.heat(c, last, start), last, s) for s, (_, last, c) in self.held.items() if last < start)
        victims = [s for *_, s in ranked[: len(new) - len(never_used)]]
        if len(never_used) + len(victims) < len(new):
            raise ValueError("more distinct ids than slots")
        evicted = [(self.held[s][0], s) for s in victims]
        for i, _ in evicted:
            del self.slot_of[i]
        admitted = []
        for (i, (last, count)), s in zip(new.items(), never_used + victims):
            self.held[s] = [i, last, count]
            self.slot_of[i] = s
            admitted.append((i, s))
        return [self.slot_of[i] for i in ids], admitted, evicted


def check_stream(batches, capacity: int, policy: str, half_life: int = 7, fast: IdTransformer | None = None) -> int:
    """Both on the same batches (`fast` a fresh transformer of these settings, made here unless
    given); returns how many evictions they agreed on."""
    model = DictModel(capacity, policy, half_life)
    fast = fast or IdTransformer(capacity, policy, half_life)
    evictions = 0
    for b, batch in enumerate(batches):
        try:
            slots, admitted, evicted = model.transform(batch)
        except ValueError:
            with pytest.raises(ValueError, match="distinct ids|slots at once"):
                fast.transform(torch.tensor(batch, dtype=torch.int64))
            continue
        got = fast.transform(torch.tensor(batch, dtype=torch.int64))
        assert got.slots.tolist() == slots, (policy, b)
        assert list(zip(got.admitted_ids.tolist(), got.admitted_slots.tolist())) == admitted, (policy, b)
        assert list(zip(got.evicted_ids.tolist(), got.evicted_slots.tolist())) == evicted, (policy, b)
        evictions += len(evicted)
    resident = fast.slot_ids().tolist()
    assert sorted(i for i in resident if i >= 0) == sorted(model.slot_of)
    assert fast.lookup(torch.tensor(sorted(model.slot_of))).tolist() == [model.slot_of[i] for i in sorted(model.slot_of)]
    return evictions


def power_law(n_batches: int, batch: int, universe: int, seed: int, alpha: float = 1.2) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    weights = torch.arange(1, universe + 1, dtype=torch.float64) ** -alpha
    ids = torch.multinomial(weights, n_batches * batch, replacement=True, generator=gen)
    scrambled = (ids * 2654435761 + 12345) % (1 << 40)  # spread the hot ids over the id space
    return scrambled.view(n_batches, batch).tolist()


@pytest.mark.parametrize("policy", POLICIES)
def test_uniform_random_streams_match_the_dict_model(policy):
    gen = torch.Generator().manual_seed(0)
    batches = torch.randint(0, 300, (60, 40), generator=gen).tolist()
    assert check_stream(batches, 64, policy) > 500


@pytest.mark.parametrize("policy", POLICIES)
def test_power_law_streams_match_the_dict_model(policy):
    assert check_stream(power_law(80, 64, 5000, seed=1), 200, policy, half_life=300) > 500


@pytest.mark.parametrize("policy", POLICIES)
def test_adversarial_streams_match_the_dict_model(policy):
    cap = 16
    scan = [[i % (cap + 1)] for i in range(200)]  # a cyclic scan one id wider than the table
    hot_and_scan = [[1, 2, 3, 1, 2, 3, 100 + b] for b in range(100)]  # a hot set beside a one-off scan
    full = [list(range(b * 8, b * 8 + cap)) for b in range(30)]  # every batch as wide as the table
    same = [[7] * 50 for _ in range(5)]
    # Now and then a batch of more ids than the lru log has room for (log_room_per_slot() a slot)
    # after ordinary ones: the log grows, keeping its live entries in order.
    wide = log_room_per_slot() * cap
    wide_repeats = [[b % 5] * wide + [100 + b] if b % 10 == 9 else [100 + b, 200 + b, 300 + b] for b in range(40)]
    # A log grown under resident ids that are touched in that batch and after: their entries
    # moved, and their buckets must say where to.
    # Evictions first, so the log's front is not at the ring's start when it grows.
    grown = [list(range(cap)), *([100 + i] for i in range(40)), [124] * (wide + 1) + [999], [130, 135],
             *([200 + i] for i in range(2 * cap))]
    big = [[(1 << 62) + b, (1 << 63) - 1 - b, b << 40] for b in range(40)]  # ids at the top of int64
    stride = [[(b * 7 + j) * 4096 for j in range(5)] for b in range(60)]  # ids sharing low bits
    # Batches one id too wide between ordinary ones: refused, and the table goes on as before.
    too_wide = [list(range(b * 3, b * 3 + cap + 1)) if b % 4 == 3 else [b, b + 1, 2 * b] for b in range(40)]
    # A refused batch that touches the coldest ids and repeats ids, then batches that evict
    # everything in order: the refused batch must leave no trace on recency.
    refused_repeats = [list(range(cap)), [0, 0, 1, 1, 100, 100, *range(101, 100 + cap)], [200], [3, 201],
                       *([300 + i] for i in range(2 * cap))]
    for batches in (scan, hot_and_scan, full, same, wide_repeats, grown, big, stride, too_wide, refused_repeats):
        check_stream(batches, cap, policy, half_life=5)


def wide_batches() -> list[tuple[str, int, list[list[int]]]]:
    """(name, slots, batches) of batches wide enough for lru's vector scan (its steps run on all
    but a batch's last 96 ids, 8 at a time), each no wider than the slots."""
    gen = torch.Generator().manual_seed(11)
    # hits, repeats of resident and of new ids (a new id twice in a step: a scalar step), evictions;
    # the log's ring (8 entries a slot) wraps inside batches every few
    uniform = torch.randint(0, 900, (40, 200), generator=gen).tolist()
    # mostly new ids, consecutive, beside hits on ids of the batch before: steps the vector scan
    # does whole (its slots hold two batches' new ids, so the second batch on evicts)
    fresh = [[*range(1000 + 240 * b, 1240 + 240 * b), *range(940 + 240 * b, 1000 + 240 * b)] for b in range(30)]
    for batch in fresh:
        random_order = torch.randperm(len(batch), generator=gen).tolist()
        batch[:] = [batch[i] for i in random_order]
    return [("uniform", 256, uniform), ("fresh", 512, fresh),
            ("power law", 1024, power_law(30, 600, 20_000, seed=12))]


@pytest.mark.parametrize("vector", ["always", "never"])
def test_lru_wide_batches_match_the_dict_model_with_and_without_the_vector_scan(vector):
    if vector == "always" and not cpu_has_avx512():
        pytest.skip("lru's vector scan needs a CPU with AVX-512")
    for name, slots, batches in wide_batches():
        fast = IdTransformer(slots, "lru")
        fast.set_vector_scan(vector)
        assert check_stream(batches, slots, "lru", fast=fast) > 1000, name
        # the vector steps took more than a quarter of the ids they could where asked, none where not
        eligible = sum(max(0, len(b) - 96) // 8 * 8 for b in batches)
        scanned = fast.vector_scanned_ids()
        assert (scanned > eligible // 4) if vector == "always" else scanned == 0, name


@needs_avx512
def test_lru_vector_scan_on_ids_sharing_home_lines_matches_the_dict_model():
    """Wide batches of ids picked to share a few home lines: lines fill and overflow, so steps
    whose ids are not settled in their home lines, or share one, fall to the scalar steps, between
    steps done by vector."""
    cap = 1024
    t = IdTransformer(cap, "lru")
    buckets = t.table_bytes // 16
    candidates = torch.randint(0, 1 << 62, (400_000,), generator=torch.Generator().manual_seed(13))
    homes = t.homes(candidates)
    crowded = torch.cat([candidates[homes == line * 4][:12] for line in (0, 7, buckets // 4 - 1)])
    assert crowded.numel() == 36
    spread = torch.arange(1 << 40, (1 << 40) + 4000)  # ids on lines of their own, mostly
    gen = torch.Generator().manual_seed(14)
    batches = []
    for b in range(40):
        batch = torch.cat([crowded[torch.randint(0, 36, (40,), generator=gen)], spread[b * 90:b * 90 + 260]])
        batches.append(batch[torch.randperm(batch.numel(), generator=gen)].tolist())
    t.set_vector_scan("always")
    assert check_stream(batches, cap, "lru", fast=t) > 1000
    assert t.vector_scanned_ids() > 800


@needs_avx512
def test_lru_vector_scan_auto_follows_the_share_of_new_ids_in_the_batch_before():
    t = IdTransformer(4096, "lru")
    t.transform(torch.arange(0, 1000))  # all new, but no batch before: scalar
    assert t.vector_scanned_ids() == 0
    t.transform(torch.arange(0, 1000))  # the batch before all new: vector, on all but the last 96
    after_new = t.vector_scanned_ids()
    assert after_new == 904
    t.transform(torch.arange(0, 1000))  # the batch before all hits: scalar
    assert t.vector_scanned_ids() == after_new
    t.set_vector_scan("never")
    t.transform(torch.arange(5000, 6000))
    t.transform(torch.arange(6000, 7000))
    assert t.vector_scanned_ids() == after_new
    with pytest.raises(ValueError, match="not one of auto, always, never"):
        t.set_vector_scan("sometimes")


@pytest.mark.parametrize("policy", POLICIES)
def test_part_seconds_grow_with_each_transform_and_fit_inside_its_calls(policy):
    """The parts' seconds (scan, victims, admit) add up within the wall time of the calls that
    made them (timed around them here), and each part grows with a batch that does its work."""
    import time

    t = IdTransformer(1000, policy)
    assert t.part_seconds() == {"scan": 0.0, "victims": 0.0, "admit": 0.0}
    wall = 0.0
    for start in (0, 700, 1400):  # fills the slots, then evicts 700 and 700
        before = t.part_seconds()
        s = time.perf_counter()
        t.transform(torch.arange(start, start + 700))
        wall += time.perf_counter() - s
        after = t.part_seconds()
        assert after["scan"] > before["scan"] and after["admit"] > before["admit"]
        if start:  # a batch that evicts chooses its victims
            assert after["victims"] > before["victims"]
    assert 0 < sum(t.part_seconds().values()) <= wall


@pytest.mark.parametrize("policy", POLICIES)
def test_ids_sharing_home_lines_match_the_dict_model(policy):
    """Ids picked (through homes()) to share two home lines, the table's last and its first, so
    their probes run long and wrap round its end, and erases shift entries, resident and pending,
    back across it: whatever the hash, the table must behave as the model."""
    cap = 16
    t = IdTransformer(cap, policy)
    buckets = t.table_bytes // 16
    candidates = torch.randint(0, 1 << 62, (200_000,), generator=torch.Generator().manual_seed(5))
    homes = t.homes(candidates)
    assert homes.max().item() < buckets and (homes % 4 == 0).all()  # line starts in the table
    last, first = candidates[homes == buckets - 4][:24], candidates[homes == 0][:12]
    assert last.numel() == 24 and first.numel() == 12
    pool = torch.cat([last, first])
    picks = torch.randint(0, pool.numel(), (150, 9), generator=torch.Generator().manual_seed(6))
    assert check_stream(pool[picks].tolist(), cap, policy, half_life=5) > 300


@pytest.mark.parametrize("policy", POLICIES)
def test_a_batch_refused_after_many_touches_in_a_wrapped_log_leaves_no_trace(policy):
    """lru's log is a ring of log_room_per_slot() x 100 entries rounded up to a power of two (1024
    here), compacted in place when its live span would outgrow it; a touched id's old entry is
    marked dead a few dozen touches later, during the scan (csrc/id_transformer.cpp kKillLag).
    Against the model: batches of new ids carry the log round the ring; hits on half the ids
    then leave the other half's entries at the front until a compaction moves them; a batch
    refused after more touches than the lag, repeating ids, must clear the marks it made and
    leave each id's recency as it was; then every id is evicted, in order."""
    cap = 100
    assert log_room_per_slot() * cap <= 1024
    wrap = [list(range(1000 + 100 * b, 1100 + 100 * b)) for b in range(11)]  # each evicts all
    held = wrap[-1]
    half_hits = [held[:50][:: 1 - 2 * (b % 2)] for b in range(24)]  # a compaction among them
    touched_then_refused = [*held[:60], *held[:60], *range(9000, 9041)]  # 101 distinct: refused
    batches = [list(range(cap)), *wrap, *half_hits, touched_then_refused, [held[5], held[50], held[95]],
               *([20000 + i] for i in range(2 * cap))]
    assert check_stream(batches, cap, policy, half_life=50) == 11 * cap + 2 * cap


def test_the_lru_ring_compacts_only_when_a_batch_would_reach_its_front():
    """16 slots: a ring of 128 entries. One id 50 times a batch: nothing is ever evicted, so the
    front stays put; batch 3 would end at entry 150 (compacted to the one live entry, then 51
    entries), batch 4 at 101, batch 5 at 151 (compacted again). A stream evicting as it goes
    (a new id a batch, the oldest leaving) frees the front as fast as it appends: never."""
    t = IdTransformer(16, "lru")
    counts = []
    for _ in range(5):
        t.transform(torch.tensor([7] * 50))
        counts.append(t.log_compactions())
    assert counts == [0, 0, 1, 1, 2]
    flowing = IdTransformer(16, "lru")
    for b in range(1000):
        flowing.transform(torch.tensor([b, b + 1]))
    assert flowing.log_compactions() == 0 and IdTransformer(16, "hybrid").log_compactions() == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_batches_evicting_many_chunks_of_victims_match_the_dict_model(policy):
    """The admit works through a batch's victims a chunk at a time (csrc/id_transformer.cpp
    kChunk, 256): batches of about 1,300 new ids over 3,000 full slots cross several chunk ends,
    some part-way through a chunk."""
    gen = torch.Generator().manual_seed(8)
    stream = [list(range(3000))] + torch.randint(0, 9000, (5, 2000), generator=gen).tolist()
    assert check_stream(stream, 3000, policy, half_life=2000) > 4000


@pytest.mark.parametrize("policy", ["lfu", "hybrid"])
def test_tables_wide_enough_to_be_sampled_match_the_dict_model(policy):
    """lfu and hybrid find their victims through a threshold from a sample of every
    (slots / 4096)-th slot (csrc/id_transformer.cpp coldest); both ways it can go, against the model."""
    # A random stream over a table of 20,000 slots (every 4th slot sampled), half hits.
    gen = torch.Generator().manual_seed(3)
    cap = 20_000
    stream = [list(range(cap))] + torch.randint(0, 3 * cap, (6, 4000), generator=gen).tolist()
    assert check_stream(stream, cap, policy, half_life=9000) > 5000
    # A sample that misses: 16,384 slots hold ids 0.., slot s id s; every id but the multiples of
    # 4 is used again, so the coldest slots are exactly the sampled ones (slots 0, 4, 8, ...). The
    # threshold from them lists about 320 slots, fewer than the 1,000 a batch of new ids needs,
    # and the transformer must list every slot again.
    cap = 16_384
    missed = [list(range(cap)), [i for i in range(cap) if i % 4], list(range(cap, cap + 1000))]
    assert check_stream(missed, cap, policy, half_life=1 << 20) == 1000


def test_the_policies_evict_differently_where_they_should():
    """An id used 20 times long ago, then one-off ids: LRU evicts it first, LFU never, and
    hybrid once its counter has decayed below the others'. Worked out by hand below."""
    evicted = {}
    for policy in POLICIES:
        t = IdTransformer(3, policy, half_life=1)
        for batch in ([1] * 20, [2], [3]):  # ticks 0-19, 20, 21
            t.transform(torch.tensor(batch))
        evicted[policy] = [t.transform(torch.tensor([i])).evicted_ids.item() for i in (4, 5, 6)]  # ticks 22-24
    # lru: the least recent each time: 1 (tick 19), then 2, then 3.
    # lfu: 1 keeps its 20; the others have 1 each, oldest first: 2, 3, then 4.
    # hybrid, one halving a tick: at tick 22, 1 has 20 >> 3 = 2, 2 has 1 >> 2 = 0, 3 has 0: 2 goes.
    # At 23: 1 has 20 >> 4 = 1, 3 and 4 have 0: 3 goes (older). At 24: 1 has 20 >> 5 = 0, as 4 and
    # 5 do, and 1 is the oldest: 1 goes.
    assert evicted == {"lru": [1, 2, 3], "lfu": [2, 3, 4], "hybrid": [2, 3, 1]}


def test_a_batch_wider_than_the_table_is_refused_and_admits_nothing():
    t = IdTransformer(4, "lru")
    t.transform(torch.tensor([10, 11, 12]))
    before = t.slot_ids().tolist()
    with pytest.raises(ValueError, match="more distinct ids than the table's 4 slots"):
        t.transform(torch.tensor([1, 2, 3, 4, 5]))
    with pytest.raises(ValueError, match="a batch needs 5 slots at once"):
        t.transform(torch.tensor([10, 11, 12, 1, 2]))
    assert t.slot_ids().tolist() == before and t.lookup(torch.tensor([1, 2, 3, 4, 5])).tolist() == [-1] * 5
    with pytest.raises(ValueError, match="non-negative"):
        t.transform(torch.tensor([-3]))
    with pytest.raises(ValueError, match="int64"):
        t.transform(torch.tensor([1], dtype=torch.int32))
    with pytest.raises(ValueError, match="policy 'mru' is not one of"):
        IdTransformer(4, "mru")


@pytest.mark.parametrize("negative", [-1, -3, -(2**63)])
def test_a_negative_id_anywhere_in_a_batch_is_refused_and_touches_nothing(negative):
    # The check is one pass compiled for AVX2 where the CPU has it (hash_memory.h): a negative id
    # in its vector body, not only in its scalar tail (a one-id batch), must be seen, wherever it sits.
    t = IdTransformer(64, "lru")
    t.transform(torch.arange(40))
    before = t.slot_ids().tolist()
    for where in range(37):
        ids = torch.arange(100, 137)
        ids[where] = negative
        with pytest.raises(ValueError, match="non-negative"):
            t.transform(ids)
    big = torch.arange(1000, 1000 + 5000)
    big[4321] = negative
    with pytest.raises(ValueError, match="non-negative"):
        IdTransformer(8192, "lru").transform(big)
    assert t.slot_ids().tolist() == before and t.resident() == 40


def test_two_threads_transforming_at_once_keep_the_table_whole():
    """The input-dist thread and another caller: every batch's ids end resident with one slot
    each, and no slot holds two ids."""
    t = IdTransformer(512, "hybrid", half_life=100)
    errors = []

    def work(seed: int) -> None:
        try:
            for batch in power_law(200, 64, 4000, seed=seed):
                ids = torch.tensor(batch)
                slots = t.transform(ids).slots
                seen = {}
                for i, s in zip(batch, slots.tolist()):
                    assert seen.setdefault(i, s) == s
        except Exception as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in (3, 4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    held = [i for i in t.slot_ids().tolist() if i >= 0]
    assert len(held) == len(set(held)) == t.resident() == 512
    assert t.lookup(torch.tensor(held)).tolist() == [s for s, i in enumerate(t.slot_ids().tolist()) if i >= 0]


def test_perf_dynamic_batches_hit_their_share_and_the_dict_baseline_is_an_lru():
    """The benchmark's batches hit resident ids at exactly the asked share, and its Python
    baseline evicts as the transformer's lru does where a batch has one id (no batch to protect)."""
    from collections import OrderedDict

    from harness.tools.perf_dynamic import dict_lru, mixed_batch

    t = IdTransformer(100, "lru")
    t.transform(torch.arange(100))
    ids, next_new = mixed_batch(t.slot_ids(), 1000, 0.9, 100, torch.Generator().manual_seed(0))
    assert next_new == 200 and int((ids >= 100).sum()) == 100 and len(set(ids[ids >= 100].tolist())) == 100
    # In random order: the new ids are id_of at the next places (here the id space reversed).
    id_of = torch.arange(1000).flip(0)
    ids, next_new = mixed_batch(t.slot_ids(), 1000, 0.9, 100, torch.Generator().manual_seed(0), id_of)
    assert next_new == 200 and sorted(ids[ids >= 100].tolist()) == list(range(800, 900))
    with pytest.raises(ValueError, match="id_of maps 150 ids, the batch needs 200"):
        mixed_batch(t.slot_ids(), 1000, 0.9, 100, torch.Generator().manual_seed(0), id_of[:150])
    table = OrderedDict((i, i) for i in range(100))
    stream = power_law(300, 1, 500, seed=5)
    assert dict_lru(table, [b[0] for b in stream]) == [t.transform(torch.tensor(b)).slots.item() for b in stream]


def test_host_bytes_by_hand():
    """What a transformer says it holds, counted by hand from its layout: 16-byte buckets, 4x the
    slots rounded up to a power of two; lru's log, 8 entries of 8 bytes a slot (a power of two),
    and a bit an entry; lfu's slot ids (8 bytes) and uses (16), its sample's room (24 bytes a slot,
    at most 8,192 of them) and, once a batch may evict, coldest()'s (24 bytes a slot); the deferred
    erases' room (256 ids). A batch adds its lists' room: 32 bytes a pending id and 8 a victim, for
    as many ids as it has (at most the slots), and 8 spare pending ids (lru's vector scan writes
    them 8 at a time)."""
    lru = IdTransformer(1000, "lru")
    fresh = 4096 * 16 + 8192 * 8 + 8192 // 8 + 256 * 8
    assert lru.host_bytes == fresh
    lru.transform(torch.arange(500))
    assert lru.host_bytes == fresh + 500 * (32 + 8) + 8 * 32
    lfu = IdTransformer(1000, "lfu")
    fresh = 4096 * 16 + 1000 * (8 + 16) + 256 * 8 + 1000 * 24  # the sample's room: min(slots, 8192)
    assert lfu.host_bytes == fresh
    lfu.transform(torch.arange(1000))
    lfu.transform(torch.arange(1000, 1200))  # may evict: coldest()'s room for every slot
    assert lfu.host_bytes == fresh + 1000 * (32 + 8) + 8 * 32 + 1000 * 24


def test_perf_dynamic_goal_verdict_by_hand():
    """The verdict is the median's, and says how many repeats fell short."""
    from harness.tools.perf_dynamic import goal_verdict

    assert goal_verdict([51.0, 55.0, 60.0], 50) == "met in every repeat"
    assert goal_verdict([49.0, 52.0, 53.0], 50) == "met at the median, missed in 1 of 3 repeats"
    assert goal_verdict([45.0, 49.9, 60.0], 50) == "MISSED at the median (2 of 3 below x50)"
    assert goal_verdict([50.0], 50) == "met in every repeat"  # the goal is ">= 50x"
    assert goal_verdict([40.0, 60.0], 50) == "met at the median, missed in 1 of 2 repeats"  # median 50


def test_perf_dynamic_batch_spread_by_hand():
    """A run's batch times: the median batch, the 90th percentile (interpolated between the batches
    around it) and the mean, each of the last two over the median."""
    from harness.tools.perf_dynamic import batch_spread

    assert batch_spread([1.0] * 9 + [2.0]) == pytest.approx((1.0, 1.1, 1.1))  # p90 at 8.1 of 0..9
    assert batch_spread([4.0, 1.0, 3.0, 2.0]) == pytest.approx((2.5, 3.7 / 2.5, 1.0))  # p90 at 2.7 of 0..3
    assert batch_spread([3.0]) == (3.0, 1.0, 1.0)


def test_perf_dynamic_part_spread_by_hand():
    """Each part's share of all parts' time, and its mean in the slowest tenth of batches (at
    least one) over its mean in the batches at or below the median batch."""
    from harness.tools.perf_dynamic import part_spread

    seconds = [1.0, 1.0, 1.0, 3.0]  # median 1.0: three typical batches, one slowest
    parts = [{"scan": 0.6, "victims": 0.1, "admit": 0.3}] * 3 + [{"scan": 2.4, "victims": 0.1, "admit": 0.45}]
    shares, over = part_spread(seconds, parts)
    assert shares == pytest.approx({"scan": 4.2 / 5.95, "victims": 0.4 / 5.95, "admit": 1.35 / 5.95})
    assert over == pytest.approx({"scan": 4.0, "victims": 1.0, "admit": 1.5})
    twenty = [1.0] * 18 + [5.0, 4.0]  # the slowest tenth of 20: the two slowest
    parts = [{"scan": 1.0, "victims": 0.0, "admit": 0.5}] * 18 + [{"scan": 4.0, "victims": 0.0, "admit": 1.0},
                                                                 {"scan": 2.0, "victims": 0.0, "admit": 2.0}]
    shares, over = part_spread(twenty, parts)
    assert over["scan"] == pytest.approx(3.0) and over["admit"] == pytest.approx(3.0)
    assert over["victims"] != over["victims"]  # no time in it: not a number, not a ratio
    assert shares["victims"] == 0.0


def test_perf_dynamic_throughput_repeats_every_case(capsys):
    """Each case runs once a repeat with its own ids, and the summary's median and range are the
    repeats' own ratios."""
    import statistics

    from harness.tools.perf_dynamic import HIT_RATES, ID_ORDERS, throughput

    rows = throughput(256, 64, 3, seed=0, repeats=2)
    assert len(rows) == 2 * len(HIT_RATES) * len(ID_ORDERS)
    assert sorted({(r["repeat"], r["hit_rate"], r["id_order"]) for r in rows}) == sorted(
        (k, h, o) for k in range(2) for h in HIT_RATES for o in ID_ORDERS)
    for r in rows:
        assert r["measured_hit_rate"] == pytest.approx(r["hit_rate"], abs=0.02)
    out = capsys.readouterr().out
    for h in HIT_RATES:
        for o in ID_ORDERS:
            case = [r for r in rows if r["hit_rate"] == h and r["id_order"] == o]
            ratios = [r["vs_dict"] for r in case]
            slow = [r["transformer_run_over_median"] for r in case]
            assert f"hit rate {h:.0%}, ids {o:11s}: x{statistics.median(ratios):.1f} median " \
                   f"(x{min(ratios):.1f}-{max(ratios):.1f})" in out
            assert len(slow) == 2
            for r in case:  # p90 at or above the median; of 3 batches, 2 at or above it, so the mean >= 2/3 of it
                assert r["transformer_p90_batch"] >= 1.0 and r["transformer_run_over_median"] >= 2 / 3
                assert sum(r["part_shares"].values()) == pytest.approx(1.0)
                key = f"{r['repeat'] + 1:>3} {h:>4.0%} {o:<11} "
                rates = [line for line in out.splitlines() if line.startswith(key) and "|" not in line]
                assert len(rates) == 1 and rates[0].endswith(f"{r['transformer_run_over_median']:>6.3f}")
                parts = [line for line in out.splitlines() if line.startswith(key) and "|" in line]
                assert len(parts) == 1 and parts[0].startswith(key + f"{r['part_shares']['scan']:>8.0%}")


def test_perf_dynamic_sums_a_ranks_transformer_memory(tmp_path):
    """The training part's "of which its ID transformers hold": the rank's tables summed, in GiB."""
    import json

    from harness.tools.perf_dynamic import transformer_host_gib

    (tmp_path / "rank00001").mkdir()
    (tmp_path / "rank00001" / "dynamic.json").write_text(json.dumps(
        {"3": {"transformed": 9, "transformer_host_bytes": 3 << 29}, "7": {"transformer_host_bytes": 1 << 29}}))
    assert transformer_host_gib(tmp_path, 1) == 2.0
    assert transformer_host_gib(tmp_path, 0) == 0.0  # a rank with no dynamic table writes none


def test_perf_dynamic_memory_bound_by_hand():
    """The bound perf-dynamic prints: the read rate over the reads an id needs (1 a hit, 2 a miss),
    and the table size it is measured at is the transformer's own (a power of two >= 4x slots, 16
    bytes a bucket)."""
    from harness.tools.perf_dynamic import memory_bound
    from model.id_transformer import random_read_rate

    assert memory_bound(90e6, 0.5) == pytest.approx(90e6 / 1.5)
    assert memory_bound(90e6, 1.0) == pytest.approx(90e6)
    assert memory_bound(90e6, 0.9) == pytest.approx(90e6 / 1.1)
    assert IdTransformer(1000, "lru").table_bytes == 4096 * 16
    assert IdTransformer(1024, "lru").table_bytes == 4096 * 16
    assert random_read_rate(1 << 20, 4096) > 0
    with pytest.raises(ValueError, match="bytes >= 16"):
        random_read_rate(8, 10)
