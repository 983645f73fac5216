// The ID transformer of a dynamic embedding table: maps global ids to a fixed number of slots
// (its Python face: model/id_transformer.py). What was measured to get here, and the variants
// measured and not taken, with their figures: docs/id-transformer.md.
//
// A table keeps `capacity` device-resident rows (slots). transform(ids) maps each id of a batch to
// its slot; ids not resident are admitted, first into slots never used, then into the slots of the
// coldest resident ids, which are evicted (their rows go to the parameter server before the slot
// is reused; the caller does that with what this returns). Ids of the current batch are never
// evicted by that batch, so after a transform every id of the batch is resident.
//
// Coldness, by policy (the clock ticks once an id occurrence, so no two accesses share a time):
//   lru:    the least recent access first;
//   lfu:    the fewest accesses first, the least recent among equals;
//   hybrid: LFU with decayed counters (Redis's approximated LFU is the model): a counter is halved
//           once for every `half_life` ticks since its id's last access, and an access adds one to
//           the decayed value; the least recent breaks ties.
// Evictions are exact, reported coldest first. lru keeps a log of accesses in time order (the id
// accessed, appended as ids occur) and, in each resident id's hash bucket, where its last access's
// entry is. An access marks its id's previous entry dead (a bit an entry, beside the log), so the
// live entries from the front are the resident ids from least to most recent: evicting reads them
// off the front, a word of dead bits at a time, and never visits a bucket to skip an entry. The
// log is a ring (room for eight entries a slot, a power of two): evicting frees its front, a batch
// appends behind its back, and it is compacted to its live entries only when a batch's entries
// would reach its front (its live span, from the least recent resident id's access to now, longer
// than the ring); only the live ones (at most the slots) then tell their buckets where they went.
// At a steady rate of new ids the span stays a few entries a slot and the ring never fills.
// lfu and hybrid keep each slot's time and count, and a batch that evicts passes over every slot
// (a decayed counter's order moves with time, so no order kept between batches would hold): a
// threshold from a sample of the slots keeps that pass to a compare a slot (coldest), and the
// selection and sort run on the few slots no warmer than it.
//
// Speed: a resident id costs one hash bucket (key, slot and lru's recency in 16 bytes, in one
// cache line) and a bit of the dead set (its word prefetched well before the bit is set); a new id
// costs its bucket, then its victim's bucket (erased) and its own again (its slot), both in one
// step of one loop (admit). Every loop waits on hashes, so the hash is one multiply (home_in). lru
// keeps no array indexed by slot: a second random place an id would wait on. Every loop over
// random places prefetches them a few dozen entries ahead, so the misses of many ids overlap; the
// arrays live on 2 MiB pages, and a batch large enough starts by warming the table's address
// translations (HugeArray::prefetch_translations). Where the CPU has AVX-512 and a batch brings
// many new ids, lru's scan takes 8 ids a step (lru_groups_avx512). random_read_rate() measures
// what random reads cost on the machine at hand: the ceiling `make perf-dynamic` prints.
//
// The id -> slot map is an open-addressing hash table with linear probing and backward-shift
// deletion (no tombstones), sized to a power of two at least 4x the slots: at most `capacity`
// resident ids plus up to `capacity` ids pending admission during one batch keep its load <= 1/2.
// Homes are the first buckets of cache lines (home_in), so a probe reads one line, not two.
//
// Thread-safe: one mutex serialises every call (the input-dist thread transforms while the main
// thread may read); the GIL is released while a call runs.

// Only the headers used (not torch/extension.h, which includes all of torch): a third of the
// build time.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <torch/csrc/utils/pybind.h>

#include "hash_memory.h"

#if defined(__SSE2__)
#include <emmintrin.h>  // take_out's blend of a line's buckets (SSE2: every x86-64)
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>  // lru's scan, 8 ids at a time, where the CPU has AVX-512 (lru_groups_avx512)
#define DLRM_VECTOR_SCAN 1
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

using dlrm_csrc::HugeArray;
using dlrm_csrc::mix;
using dlrm_csrc::prefetch_l2;
using dlrm_csrc::prefetch_l1;

constexpr int64_t kEmpty = -1;  // ids are non-negative; -1 marks an empty bucket
constexpr int64_t kMaxCount = int64_t(1) << 40;  // counters saturate here

enum class Policy { kLru, kLfu, kHybrid };

Policy parse_policy(const std::string& name) {
  if (name == "lru") return Policy::kLru;
  if (name == "lfu") return Policy::kLfu;
  if (name == "hybrid") return Policy::kHybrid;
  throw std::invalid_argument("id transformer: policy '" + name + "' is not one of lru, lfu, hybrid");
}

struct Bucket {
  int64_t key = kEmpty;  // an id, or kEmpty
  int32_t val = 0;       // its slot, or -(k + 2) for the k-th pending id of a batch
  uint32_t pos = 0;      // lru: where in the log its id's last access is (its recency)
};
constexpr int64_t kMaxSlots = (int64_t(1) << 31) - 2;  // a slot and a pending place fit `val`

using LogEntry = int64_t;  // lru: the id accessed (a position in the log is its time)

// How far ahead the loops over random places prefetch (into L2: dlrm_csrc::prefetch_l2): far
// enough that a line has arrived when its turn comes (a DRAM miss is a few hundred ns, an id's
// work a few ns), few enough that the lines in flight fit the L2's miss buffers.
// Measured alternatives: docs/id-transformer.md, "Prefetching into L2, 96 ahead, not into L1".
constexpr int64_t kAhead = 96;
// On top of that, the scan and the erase loop pull the line of the id kNear on into L1: a line in
// L2 still costs a dozen-odd cycles the loop would wait on, and 8 on is near enough that the L2
// line is there.
constexpr int64_t kNear = 8;
constexpr int64_t kChunk = 256;  // admit: the deferred erases (take_out_of_full) run every kChunk victims
// coldest(): about this many slots sampled for its threshold; every stride-th of used_ slots, with
// stride floor(used_ / kColdSample) (at least 1), is fewer than 2 x kColdSample.
constexpr int64_t kColdSample = 4096;
constexpr int64_t kPendingAhead = 32;  // admit: how far ahead of its victim a pending id's bucket is prefetched
// The scan's ring of the ids ahead (their buckets) and of lru's kills not yet marked; a kill's
// dead bit is set kKillLag kills after its word is prefetched.
constexpr int64_t kRing = 128;
constexpr size_t kKillLag = 40;
static_assert(kAhead < kRing && kKillLag < size_t(kRing), "the ring holds what is ahead");
static_assert(kNear < kAhead, "the scan's body (all but the last kAhead ids) reads the ids up to kAhead on without testing that they exist");
constexpr uint64_t kBucketsPerLine = 64 / sizeof(Bucket);
// Homes are line starts (home_in): a line must hold whole buckets (the table is page-aligned).
static_assert(64 % sizeof(Bucket) == 0, "a cache line holds whole buckets");
constexpr size_t kLogRoomPerSlot = 8;  // lru log entries held, a slot at least (a power of two in all; make_log_room)
constexpr uint64_t kMaxLogRoom = uint64_t(1) << 32;  // lru positions in the ring and slots are 32-bit

struct Touched {  // a resident id's state before this batch first touched it (restored if the batch fails)
  int64_t where;  // lru: its bucket (the scan only inserts, so no bucket moves before undo); else its slot
  int64_t time;   // lru: where in the ring its live entry is
  int64_t count;
};

struct SlotUse {  // lfu, hybrid: a slot's use, in one 16-byte place (one cache line, not two, a hit)
  int64_t time = -1;  // clock tick of the last access
  int64_t count = 0;  // accesses (lfu) or the decayed counter as of that tick (hybrid)
};

struct ColdKey {  // lfu, hybrid: a slot as coldest() ranks it, coldest first
  int64_t heat, time, slot;
  bool operator<(const ColdKey& o) const { return heat != o.heat ? heat < o.heat : time < o.time; }
};

// The hash's multiplier, 2^64 / phi (IdTransformer::home_in; lru_groups_avx512 hashes as it does).
constexpr uint64_t kFibonacci = 0x9e3779b97f4a7c15ULL;
constexpr double kVectorScanNewShare = 0.25;  // IdTransformer::vector_scan_for
constexpr int64_t kGroup = 8;  // ids a step of lru's vector scan (lru_groups_avx512); spare room past lists it writes whole

struct Pending {  // an id of this batch that is not resident yet
  int64_t id;
  int64_t time;     // its last occurrence in the batch (each earlier one is chained: scan)
  int64_t count;    // its occurrences in the batch
  uint64_t bucket;  // its bucket (inserts move nothing; an erase that shifts it back says where to)
};

// A batch's pending ids. Their room is taken before the scan (start: the batch's ids or the slots,
// whichever are fewer, the most it can add), so the scan appends through a local pointer and
// count: no test of room, and no reload of a vector's ends (an int64 store may alias them) an id.
class PendingList {
 public:
  // Empty, with room for n: a batch starts from none, so what the last one left is not kept.
  void start(size_t n) {
    n_ = 0;
    if (n <= room_) return;
    data_.reset(new Pending[n + kGroup]);  // not filled: each is written before it is read
    room_ = n;
  }
  size_t size() const { return n_; }
  size_t room() const { return room_; }
  size_t bytes() const { return room_ ? (room_ + kGroup) * sizeof(Pending) : 0; }  // its spare too
  void set_size(size_t n) { n_ = n; }  // the scan's count, once it is done (or before undo)
  Pending* data() { return data_.get(); }
  Pending& operator[](size_t i) { return data_[i]; }
  const Pending* begin() const { return data_.get(); }
  const Pending* end() const { return data_.get() + n_; }
 private:
  std::unique_ptr<Pending[]> data_;
  size_t n_ = 0, room_ = 0;
};

// lru's scan, 8 ids at a time (AVX-512), where a batch has many new ids (IdTransformer::
// vector_scan_for). At 50% hits the scalar scan's branch on hit or new is a coin toss an id; this
// one has none: each step reads its 8 ids' home lines by gathers (their 4 keys, so an id is found
// or its empty bucket is, in its line), writes the hits' recency by a store a lane (the lanes of
// new ids to a spare place) and the new ids' buckets by scatters, and its pending ids by
// compressing them (their order kept). A step that cannot be done so (an id not settled in its
// home line, a line full; a pending id's later occurrence; two of its ids on one line, as one's
// write would change what the other read) writes nothing and is left to the scalar steps, which
// the scan runs for it. Prefetching is the scalar scan's L2 prefetch (the same ids kAhead on), so
// the two kinds of step mix freely; it has no L1 prefetch kNear on (it ran faster without).
// Measurements and variants not taken: docs/id-transformer.md, "lru's scan 8 ids a step with AVX-512".
struct LruGroups {  // the scan's state that the vector steps read and advance
  Bucket* table;
  unsigned shift;
  LogEntry* log;
  uint64_t* dead;
  uint64_t* where;  // the scan's ring of homes (kRing)
  uint32_t* kills;  // the scan's ring of kills, kGroup spare past its end
  size_t n_killed;
  Pending* pend;  // room for kGroup past the batch's most
  int64_t n_pending;
  int64_t* slot_of;
  const int64_t* id;
  int64_t batch_start;
  int64_t groups;  // steps done by vector
};

#if defined(DLRM_VECTOR_SCAN)
// gcc 12's AVX-512 headers start some intrinsics from a deliberately undefined register, which
// -Wmaybe-uninitialized reports once a call.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define DLRM_AVX512 __attribute__((target("avx512f,avx512dq,avx512cd,avx512vl,avx512bw")))

bool cpu_has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw");
  return yes;
}

// Lane i of v, from the register (a scalar read of part of a vector just stored waits on it).
template <int i>
DLRM_AVX512 __attribute__((always_inline)) inline int64_t lane(__m512i v) {
  const __m128i q = _mm512_extracti64x2_epi64(v, i / 2);
  return i % 2 ? _mm_extract_epi64(q, 1) : _mm_cvtsi128_si64(q);
}

DLRM_AVX512 __attribute__((always_inline)) inline void prefetch_lanes(__m512i addr) {
  prefetch_l2(reinterpret_cast<const void*>(lane<0>(addr)));
  prefetch_l2(reinterpret_cast<const void*>(lane<1>(addr)));
  prefetch_l2(reinterpret_cast<const void*>(lane<2>(addr)));
  prefetch_l2(reinterpret_cast<const void*>(lane<3>(addr)));
  prefetch_l2(reinterpret_cast<const void*>(lane<4>(addr)));
  prefetch_l2(reinterpret_cast<const void*>(lane<5>(addr)));
  prefetch_l2(reinterpret_cast<const void*>(lane<6>(addr)));
  prefetch_l2(reinterpret_cast<const void*>(lane<7>(addr)));
}

// Steps of kGroup ids from p (a multiple of kGroup) while a whole step fits before `to` (all of
// them ids whose kAhead-th successor exists: the scan's body); the log entries at log_off + p.
// Returns where it stopped: `to`'s last whole step, or a step it left to the scalar steps.
DLRM_AVX512 __attribute__((noinline)) int64_t lru_groups_avx512(LruGroups& s, int64_t p, int64_t to, int64_t log_off) {
  static_assert(sizeof(Bucket) == 16 && offsetof(Bucket, val) == 8 && offsetof(Bucket, pos) == 12,
                "the gathers read a bucket as its key's and its val-and-pos's 8-byte words");
  static_assert(sizeof(Pending) == 32, "new ids' Pendings are written four 8-byte fields at a time");
  static_assert(kRing % kGroup == 0 && kAhead % kGroup == 0, "a step's ring places are contiguous");
  Bucket* const table = s.table;
  long long* const q64 = reinterpret_cast<long long*>(table);
  int* const q32 = reinterpret_cast<int*>(table);
  uint64_t* const where = s.where;
  uint32_t* const kills = s.kills;
  uint64_t* const dead = s.dead;
  size_t n_killed = s.n_killed;
  int64_t n_pending = s.n_pending;
  const __m512i fib = _mm512_set1_epi64(int64_t(kFibonacci));
  const __m128i shift = _mm_cvtsi32_si128(int(s.shift));
  const __m512i line_start = _mm512_set1_epi64(~int64_t(kBucketsPerLine - 1));
  const __m512i empty = _mm512_set1_epi64(kEmpty);
  const __m512i iota = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i zero = _mm512_setzero_si512(), one = _mm512_set1_epi64(1), two = _mm512_set1_epi64(2);
  const __m512i three = _mm512_set1_epi64(3), four = _mm512_set1_epi64(4), six = _mm512_set1_epi64(6);
  const __m512i table_at = _mm512_set1_epi64(int64_t(reinterpret_cast<uintptr_t>(table)));
  uint32_t spare;  // where a lane that is no hit writes its recency
  const __m512i spare_at = _mm512_set1_epi64(int64_t(reinterpret_cast<uintptr_t>(&spare)));
  for (; p + kGroup <= to; p += kGroup) {
    const __m512i keys = _mm512_loadu_si512(s.id + p);
    const __m512i home = _mm512_loadu_si512(where + p % kRing);
    const __m512i shared = _mm512_conflict_epi64(home);  // a lane's line also an earlier lane's
    __mmask8 scalar = _mm512_test_epi64_mask(shared, shared);
    const __m512i k_at = _mm512_slli_epi64(home, 1);  // the home bucket's key, in 8-byte words
    const __m512i k0 = _mm512_i64gather_epi64(k_at, q64, 8);
    __m512i val_pos = _mm512_i64gather_epi64(_mm512_add_epi64(k_at, one), q64, 8);
    const __mmask8 m0 = _mm512_cmpeq_epi64_mask(k0, keys), e0 = _mm512_cmpeq_epi64_mask(k0, empty);
    __mmask8 found = m0;
    __m512i bucket = home;
    if (__mmask8(m0 | e0) != 0xff) {  // some ids read on in their lines
      const __m512i k1 = _mm512_i64gather_epi64(_mm512_add_epi64(k_at, two), q64, 8);
      const __m512i k2 = _mm512_i64gather_epi64(_mm512_add_epi64(k_at, four), q64, 8);
      const __m512i k3 = _mm512_i64gather_epi64(_mm512_add_epi64(k_at, six), q64, 8);
      const __mmask8 m1 = _mm512_cmpeq_epi64_mask(k1, keys), e1 = _mm512_cmpeq_epi64_mask(k1, empty);
      const __mmask8 m2 = _mm512_cmpeq_epi64_mask(k2, keys), e2 = _mm512_cmpeq_epi64_mask(k2, empty);
      const __mmask8 m3 = _mm512_cmpeq_epi64_mask(k3, keys), e3 = _mm512_cmpeq_epi64_mask(k3, empty);
      found = m0 | m1 | m2 | m3;
      scalar |= __mmask8(~(found | e0 | e1 | e2 | e3));  // neither the id nor an empty bucket in its line
      // Its bucket: the first holding it or empty (a probe meets no empty bucket before its key).
      __m512i at = three;
      at = _mm512_mask_mov_epi64(at, m2 | e2, two);
      at = _mm512_mask_mov_epi64(at, m1 | e1, one);
      at = _mm512_mask_mov_epi64(at, m0 | e0, zero);
      bucket = _mm512_add_epi64(home, at);
      val_pos = _mm512_mask_i64gather_epi64(val_pos, found & __mmask8(~m0), _mm512_add_epi64(_mm512_slli_epi64(bucket, 1), one), q64, 8);
    }
    const __m512i val = _mm512_srai_epi64(_mm512_slli_epi64(val_pos, 32), 32);
    const __mmask8 hit = _mm512_mask_cmpge_epi64_mask(found, val, zero);
    scalar |= found & __mmask8(~hit);  // a pending id again
    if (scalar) break;
    const __mmask8 fresh = __mmask8(~found);
    _mm512_storeu_si512(s.log + log_off + p, keys);
    _mm512_storeu_si512(s.slot_of + p, _mm512_mask_mov_epi64(_mm512_set1_epi64(-1), hit, val));  // a new id: its chain's end
    // Hits: the recency is this access, the entry it had dead (its bit set kKillLag kills on).
    const __m512i pos_at = _mm512_mask_mov_epi64(spare_at, hit, _mm512_add_epi64(table_at, _mm512_add_epi64(_mm512_slli_epi64(bucket, 4), _mm512_set1_epi64(12))));
    const uint32_t pos = uint32_t(log_off + p);
    *reinterpret_cast<uint32_t*>(lane<0>(pos_at)) = pos;
    *reinterpret_cast<uint32_t*>(lane<1>(pos_at)) = pos + 1;
    *reinterpret_cast<uint32_t*>(lane<2>(pos_at)) = pos + 2;
    *reinterpret_cast<uint32_t*>(lane<3>(pos_at)) = pos + 3;
    *reinterpret_cast<uint32_t*>(lane<4>(pos_at)) = pos + 4;
    *reinterpret_cast<uint32_t*>(lane<5>(pos_at)) = pos + 5;
    *reinterpret_cast<uint32_t*>(lane<6>(pos_at)) = pos + 6;
    *reinterpret_cast<uint32_t*>(lane<7>(pos_at)) = pos + 7;
    const __m512i killed = _mm512_srli_epi64(val_pos, 32);
    const unsigned k = unsigned(__builtin_popcount(hit));
    const size_t r = n_killed % kRing;
    _mm256_mask_compressstoreu_epi32(kills + r, hit, _mm512_cvtepi64_epi32(killed));
    for (size_t i = kRing; i < r + k; ++i) kills[i - kRing] = kills[i];  // past the ring's end: to its start
    prefetch_lanes(_mm512_add_epi64(_mm512_set1_epi64(int64_t(reinterpret_cast<uintptr_t>(dead))),
                                    _mm512_slli_epi64(_mm512_maskz_srli_epi64(hit, killed, 6), 3)));
    for (size_t j = std::max(n_killed, kKillLag); j < n_killed + k; ++j) {
      const uint32_t e = kills[(j - kKillLag) % kRing];
      dead[e / 64] |= uint64_t(1) << (e % 64);
    }
    n_killed += k;
    // New ids: their buckets say -(k + 2) for the k-th pending id, in the order they occur.
    const __m512i rank = _mm512_maskz_expand_epi64(fresh, iota);
    const __m512i pending_val = _mm512_sub_epi64(_mm512_set1_epi64(-n_pending - 2), rank);
    _mm512_mask_i64scatter_epi64(q64, fresh, _mm512_slli_epi64(bucket, 1), keys, 8);
    _mm512_mask_i64scatter_epi32(q32, fresh, _mm512_add_epi64(_mm512_slli_epi64(bucket, 2), two), _mm512_cvtepi64_epi32(pending_val), 4);
    // Their Pendings {id, time, count 1, bucket}: the fields compressed, then interleaved so that
    // each 64-byte store writes two whole Pendings (kGroup in all; those past the count are spare).
    const __m512i ck = _mm512_maskz_compress_epi64(fresh, keys);
    const __m512i ct = _mm512_maskz_compress_epi64(fresh, _mm512_add_epi64(_mm512_set1_epi64(s.batch_start + p), iota));
    const __m512i cb = _mm512_maskz_compress_epi64(fresh, bucket);
    const __m512i kt_even = _mm512_unpacklo_epi64(ck, ct), kt_odd = _mm512_unpackhi_epi64(ck, ct);  // (id, time) of 0 2 4 6, 1 3 5 7
    const __m512i cb_even = _mm512_unpacklo_epi64(one, cb), cb_odd = _mm512_unpackhi_epi64(one, cb);  // (1, bucket) likewise
    const __m512i first = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), second = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
    const __m512i p02 = _mm512_permutex2var_epi64(kt_even, first, cb_even), p46 = _mm512_permutex2var_epi64(kt_even, second, cb_even);
    const __m512i p13 = _mm512_permutex2var_epi64(kt_odd, first, cb_odd), p57 = _mm512_permutex2var_epi64(kt_odd, second, cb_odd);
    __m512i* const out = reinterpret_cast<__m512i*>(s.pend + n_pending);
    _mm512_storeu_si512(out + 0, _mm512_inserti64x4(p02, _mm512_castsi512_si256(p13), 1));
    _mm512_storeu_si512(out + 1, _mm512_inserti64x4(p13, _mm512_extracti64x4_epi64(p02, 1), 0));
    _mm512_storeu_si512(out + 2, _mm512_inserti64x4(p46, _mm512_castsi512_si256(p57), 1));
    _mm512_storeu_si512(out + 3, _mm512_inserti64x4(p57, _mm512_extracti64x4_epi64(p46, 1), 0));
    n_pending += __builtin_popcount(fresh);
    ++s.groups;
    // The ids kAhead on: hashed and their lines prefetched, after this step's work (as the scalar
    // step's hash_ahead, from the register).
    const __m512i ahead = _mm512_and_si512(_mm512_srl_epi64(_mm512_mullo_epi64(_mm512_loadu_si512(s.id + p + kAhead), fib), shift), line_start);
    _mm512_storeu_si512(where + (p + kAhead) % kRing, ahead);
    prefetch_lanes(_mm512_add_epi64(table_at, _mm512_slli_epi64(ahead, 4)));
  }
  s.n_killed = n_killed;
  s.n_pending = n_pending;
  return p;
}
#undef DLRM_AVX512
#pragma GCC diagnostic pop
#else
bool cpu_has_avx512() { return false; }
int64_t lru_groups_avx512(LruGroups&, int64_t p, int64_t, int64_t) { return p; }
#endif

using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Clock = std::chrono::steady_clock;

class IdTransformer {
 public:
  IdTransformer(int64_t capacity, const std::string& policy, int64_t half_life)
      : policy_(parse_policy(policy)), capacity_(capacity), half_life_(half_life) {
    if (capacity < 1) throw std::invalid_argument("id transformer: capacity must be >= 1 slot");
    if (capacity > kMaxSlots) {
      throw std::invalid_argument("id transformer: at most " + std::to_string(kMaxSlots) + " slots (32-bit slots)");
    }
    if (half_life < 1) throw std::invalid_argument("id transformer: half_life must be >= 1 tick");
    uint64_t size = 1;
    while (size < uint64_t(4) * uint64_t(capacity)) size <<= 1;
    mask_ = size - 1;
    shift_ = unsigned(__builtin_clzll(mask_));  // the product's top log2(size) bits pick a bucket
    table_ = HugeArray<Bucket>(size, Bucket{});
    const bool lru = policy_ == Policy::kLru;
    // lru finds a victim's id in the log and its recency in its bucket: it keeps no slot state.
    slot_id_ = HugeArray<int64_t>(lru ? 0 : capacity, kEmpty);
    slot_use_ = HugeArray<SlotUse>(lru ? 0 : capacity, SlotUse{});
    // Lists that grow inside a batch, made their largest here (make_room does the ones whose
    // largest depends on the batch).
    deferred_.reserve(kChunk);  // erase_deferred empties it every kChunk victims
    if (!lru) cold_sample_.reserve(size_t(std::min<int64_t>(capacity, 2 * kColdSample)));
    if (lru) {
      if (kLogRoomPerSlot * uint64_t(capacity) > kMaxLogRoom) {
        throw std::invalid_argument("id transformer: lru keeps at most " + std::to_string(kMaxLogRoom / kLogRoomPerSlot) +
                                    " slots (32-bit log positions)");
      }
      // The log's room is taken (and faulted in) here, not while batches run: a first touch of
      // fresh pages costs a fault each 4 KiB, a regrown vector copies the whole log.
      make_log(ring_room(kLogRoomPerSlot * uint64_t(capacity)));
    }
  }

  // (slot of each id, admitted ids, their slots, evicted ids, their slots): admitted in the order
  // of their first occurrence in the batch, evicted coldest first.
  Result transform(const at::Tensor& ids_in) {
    auto ids = check_ids(ids_in);
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t n = ids.numel();
    const int64_t* id = ids.data_ptr<int64_t>();
    auto out = at::empty({n}, at::kLong);
    int64_t* slot_of = out.data_ptr<int64_t>();
    const bool lru = policy_ == Policy::kLru;
    const int64_t most = std::min(n, capacity_);  // the batch's distinct ids can be no more
    make_room(most, n > capacity_, lru);
    if (lru) make_log_room(n);
    const int64_t batch_start = clock_;
    const size_t log_start = log_end_;
    if (lru) log_end_ += n;  // every entry is written by the scan before anything reads it
    touched_.clear();
    const auto scan_start = Clock::now();
    // The table's translations, warmed before the scan's random reads need them (the prefetches
    // are all in flight at once; the scan's would each wait on a walk of the host's page table).
    // A batch of twice the table's spans in ids neither gained nor lost: a smaller one goes without.
    // Measured: docs/id-transformer.md, "Warming the table's address translations".
    if (n >= 2 * int64_t(table_.translation_spans())) table_.prefetch_translations();
    scan(id, n, slot_of, batch_start, log_start, vector_scan_for(lru));
    const auto scan_end = Clock::now();
    const int64_t k = int64_t(pending_.size());
    const int64_t fresh = std::min(k, capacity_ - used_);
    victims_.clear();  // coldest first: lru their ids, lfu and hybrid their slots
    size_t log_head = log_head_;
    if (k > fresh) {
      if (lru) {
        least_recent(k - fresh, log_start, &log_head);
      } else {
        coldest(k - fresh, batch_start);
      }
      if (int64_t(victims_.size()) < k - fresh) {
        undo(batch_start, log_start);
        throw std::invalid_argument(
            "id transformer: a batch needs " + std::to_string(used_ - int64_t(victims_.size()) + k) +
            " slots at once (its distinct ids), more than the table's " + std::to_string(capacity_));
      }
    }
    log_head_ = log_head;
    const auto victims_end = Clock::now();
    const int64_t m = int64_t(victims_.size());
    auto admitted_ids = at::empty({k}, at::kLong);
    auto admitted_slots = at::empty({k}, at::kLong);
    auto evicted_ids = at::empty({m}, at::kLong);
    auto evicted_slots = at::empty({m}, at::kLong);
    const auto admit_start = Clock::now();
    admit(fresh, admitted_ids.data_ptr<int64_t>(), admitted_slots.data_ptr<int64_t>(),
          evicted_ids.data_ptr<int64_t>(), evicted_slots.data_ptr<int64_t>(), slot_of, batch_start,
          int64_t(log_start) - batch_start);
    const auto admit_end = Clock::now();
    part_seconds_[0] += std::chrono::duration<double>(scan_end - scan_start).count();
    part_seconds_[1] += std::chrono::duration<double>(victims_end - scan_end).count();
    part_seconds_[2] += std::chrono::duration<double>(admit_end - admit_start).count();
    used_ += fresh;
    last_new_share_ = n ? double(k) / double(n) : 0.0;
    return {out.view(ids_in.sizes()), admitted_ids, admitted_slots, evicted_ids, evicted_slots};
  }

  // The slot of each id, -1 where it is not resident; nothing is touched.
  at::Tensor lookup(const at::Tensor& ids_in) {
    auto ids = check_ids(ids_in);
    std::lock_guard<std::mutex> lock(mu_);
    auto out = at::empty({ids.numel()}, at::kLong);
    const int64_t* id = ids.data_ptr<int64_t>();
    int64_t* o = out.data_ptr<int64_t>();
    for (int64_t p = 0; p < ids.numel(); ++p) {
      const Bucket& b = table_[bucket_of(id[p])];
      o[p] = b.key == id[p] ? b.val : -1;
    }
    return out.view(ids_in.sizes());
  }

  // Each id's home bucket, where its probe starts (tests build ids that share one from it).
  at::Tensor homes(const at::Tensor& ids_in) {
    auto ids = check_ids(ids_in);
    auto out = at::empty({ids.numel()}, at::kLong);
    const int64_t* id = ids.data_ptr<int64_t>();
    int64_t* o = out.data_ptr<int64_t>();
    for (int64_t p = 0; p < ids.numel(); ++p) o[p] = int64_t(home(id[p]));
    return out.view(ids_in.sizes());
  }

  // The id in each slot, -1 for a slot never used (lru keeps no slot -> id array: read off the table).
  at::Tensor slot_ids() {
    std::lock_guard<std::mutex> lock(mu_);
    auto out = at::full({capacity_}, kEmpty, at::kLong);
    int64_t* o = out.data_ptr<int64_t>();
    if (policy_ == Policy::kLru) {
      for (uint64_t b = 0; b <= mask_; ++b) {
        if (table_[b].key != kEmpty) o[table_[b].val] = table_[b].key;
      }
    } else {
      for (int64_t s = 0; s < capacity_; ++s) o[s] = slot_id_[s];
    }
    return out;
  }

  int64_t capacity() const { return capacity_; }
  int64_t table_bytes() const { return int64_t(table_.size() * sizeof(Bucket)); }
  // Host memory held now: the arrays (hash table; lru's log and dead bits; lfu's and hybrid's slot
  // state and, once a batch may evict, coldest()'s room) and the working lists kept between
  // batches, which grow to the largest batch seen (make_room).
  int64_t host_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    size_t bytes = table_.size() * sizeof(Bucket) + slot_id_.size() * sizeof(int64_t) +
                   slot_use_.size() * sizeof(SlotUse) + log_.size() * sizeof(LogEntry) +
                   dead_.size() * sizeof(uint64_t) + cold_keys_.size() * sizeof(ColdKey);
    bytes += pending_.bytes() + deferred_.capacity() * sizeof(int64_t) +
             touched_.capacity() * sizeof(Touched) + victims_.capacity() * sizeof(int64_t) +
             cold_sample_.capacity() * sizeof(ColdKey);
    return int64_t(bytes);
  }
  int64_t resident() {
    std::lock_guard<std::mutex> lock(mu_);
    return used_;
  }
  int64_t log_compactions() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_compactions_;
  }
  // lru's vector scan: "auto" (where the CPU has AVX-512 and the batch before had many new ids),
  // "always" (where the CPU has it: the tests' way to run it on any batch) or "never".
  void set_vector_scan(const std::string& mode) {
    std::lock_guard<std::mutex> lock(mu_);
    if (mode == "auto") {
      vector_scan_ = VectorScan::kAuto;
    } else if (mode == "always") {
      if (!cpu_has_avx512()) throw std::invalid_argument("id transformer: the vector scan needs AVX-512, which this CPU lacks");
      vector_scan_ = VectorScan::kAlways;
    } else if (mode == "never") {
      vector_scan_ = VectorScan::kNever;
    } else {
      throw std::invalid_argument("id transformer: vector scan mode '" + mode + "' is not one of auto, always, never");
    }
  }
  // Seconds spent so far in transform's parts: the scan (each id to its slot or to the pending
  // list), the victims' choice (least_recent, coldest) and admit. Four clock reads a batch (tens of
  // ns; a batch of 65,536 ids takes about a millisecond), so perf-dynamic can say where a slow
  // batch's time went.
  std::tuple<double, double, double> part_seconds() {
    std::lock_guard<std::mutex> lock(mu_);
    return {part_seconds_[0], part_seconds_[1], part_seconds_[2]};
  }
  int64_t vector_scanned_ids() {  // ids lru's vector scan took (the rest: scalar steps)
    std::lock_guard<std::mutex> lock(mu_);
    return vector_scanned_ids_;
  }

 private:
  // Whether lru's scan runs by lru_groups_avx512 this batch. In "auto", where the batch before had
  // a quarter or more new ids: it paid at 50% hits (new ids in either order) and lost at 90% with
  // consecutive new ids; a quarter is between the two (docs/id-transformer.md).
  bool vector_scan_for(bool lru) const {
    if (!lru || vector_scan_ == VectorScan::kNever || !cpu_has_avx512()) return false;
    return vector_scan_ == VectorScan::kAlways || last_new_share_ >= kVectorScanNewShare;
  }

  // Every list a batch of n ids (at most `most` distinct) may grow gets its room before anything
  // changes, so an allocation that fails (bad_alloc) leaves the table as it was: no list grows
  // from the scan's start to admit's end (a list that grew there, the batch half done, would leave
  // pending ids in the table). `may_fail`: undo's record of touched ids is kept (scan). The four
  // outputs of admitted and evicted ids are still made after the scan, at their counts (made
  // before it at their bound and cut, it ran slower: docs/id-transformer.md).
  void make_room(int64_t most, bool may_fail, bool lru) {
    pending_.start(size_t(most));
    victims_.reserve(size_t(most));  // least_recent, coldest: one for each new id at most
    if (may_fail) touched_.reserve(size_t(most));  // a resident id's first touch in the batch
    if (!lru && used_ + most > capacity_ && cold_keys_.size() < size_t(capacity_)) {
      cold_keys_ = HugeArray<ColdKey>(size_t(capacity_), ColdKey{});  // coldest(): room for every slot
    }
  }

  static at::Tensor check_ids(const at::Tensor& ids) {
    if (ids.scalar_type() != at::kLong || !ids.device().is_cpu()) {
      throw std::invalid_argument("id transformer: ids must be an int64 tensor on the CPU");
    }
    auto flat = ids.contiguous().view(-1);
    if (dlrm_csrc::any_negative(flat.data_ptr<int64_t>(), flat.numel())) {
      throw std::invalid_argument("id transformer: ids must be non-negative");
    }
    return flat;
  }

  // An id's home is the first bucket of a cache line: its probe reads that one line unless the
  // line is full (rare at a load <= 1/4 in steady state). With a home anywhere in a line, a probe
  // from its last bucket that finds it taken reads on in the next line: a miss nothing prefetched.
  // Static forms take the table and mask as locals: through a member, every store to an int64
  // array in a loop (which may alias the member) would reload them.
  // The hash is Fibonacci (multiplicative) hashing: the top bits of the id times 2^64 / phi, one
  // multiply whose result the probe waits on (splitmix64's finaliser, dlrm_csrc::mix, chains two
  // multiplies and three shifts), and every loop waits on a hash: the scan, each victim's erase,
  // each neighbour a backward shift considers. Bit i of an id moves bits i and up of the product,
  // so ids that differ only high (near 2^63) or share their low bits (multiples of 4096, of 2^40)
  // still differ in its top bits; tests/test_id_transformer.py runs such streams, and streams of
  // ids built to share one home line (homes()). Measured, with consecutive ids sharing a line:
  // docs/id-transformer.md, "Fibonacci hashing" and "Consecutive ids sharing a home line".
  static uint64_t home_in(unsigned shift, int64_t key) {
    return ((uint64_t(key) * kFibonacci) >> shift) & ~(kBucketsPerLine - 1);
  }
  uint64_t home(int64_t key) const { return home_in(shift_, key); }

  // The bucket holding `key`, or the empty bucket where it would go, probing from bucket `b` (its
  // home, or a bucket its probe from there has reached).
  static uint64_t probe_in(const Bucket* table, uint64_t mask, uint64_t b, int64_t key) {
    while (table[b].key != kEmpty && table[b].key != key) b = (b + 1) & mask;
    return b;
  }
  uint64_t probe(uint64_t b, int64_t key) const { return probe_in(&table_[0], mask_, b, key); }
  uint64_t bucket_of(int64_t key) const { return probe(home(key), key); }

  // Each id to its slot: the resident are touched, the new go to pending_ and into the table
  // (their buckets say -(k + 2) for the k-th), and get their slots in admit. Until then a new id's
  // occurrences are a chain in slot_of: the first says -1, each later one -(the one before + 2),
  // and pending_ keeps the last and their count, so admit_one writes the slot along the chain (no
  // list of where pending ids occur, no pass reading it back).
  // The bucket of the id kAhead places on is hashed and prefetched as the loop goes, so the misses
  // of many ids overlap; its home waits in a ring of the last few. lfu and hybrid also find, at
  // half the prefetch distance, each id's bucket (arrived by then) and prefetch its slot's state;
  // the id's own probe resumes there: the scan only inserts, which moves no key, so the key is
  // still there, or, if it was absent, every bucket before that one still holds another key.
  // lru: every occurrence's entry goes into the log as it comes, and the entry it makes dead (its
  // id's last one) gets its dead bit kKillLag kills later, its word prefetched now: the dead set
  // (1 MiB at a million slots) is then a place no id waits on. A batch undone (undo) clears the
  // bits it marked. Each entry goes to log_off + p, one offset before the ring's wrap and one after
  // (run splits the loop there), not through a mask: the loop's values outnumber the registers.
  // The touched ids' old state is kept only when the batch could fail (more ids than slots):
  // a batch with at most `capacity` ids has at most that many distinct ones, so it always fits.
  // The loop's body is compiled twice, with and without the tests of whether the ids ahead exist
  // (all but the last kAhead ids need none), and new ids go to pending_ through a local pointer
  // and count (PendingList). On the Zen 5 VM it is bound by its instructions more than by memory.
  // Measurements, and the many variants not taken: docs/id-transformer.md, the sections from
  // "Scan and admit variants not taken" on.
  void scan(const int64_t* id, int64_t n, int64_t* slot_of, int64_t batch_start, size_t log_start, bool vector) {
    const bool may_fail = n > capacity_;
    switch (policy_) {
      case Policy::kLru:
        if (may_fail) return scan_as<Policy::kLru, true>(id, n, slot_of, batch_start, log_start);
        return vector ? scan_as<Policy::kLru, false, true>(id, n, slot_of, batch_start, log_start)
                      : scan_as<Policy::kLru, false>(id, n, slot_of, batch_start, log_start);
      case Policy::kLfu:
        return may_fail ? scan_as<Policy::kLfu, true>(id, n, slot_of, batch_start, log_start)
                        : scan_as<Policy::kLfu, false>(id, n, slot_of, batch_start, log_start);
      case Policy::kHybrid:
        return may_fail ? scan_as<Policy::kHybrid, true>(id, n, slot_of, batch_start, log_start)
                        : scan_as<Policy::kHybrid, false>(id, n, slot_of, batch_start, log_start);
    }
  }

  // `vector`: lru's steps by lru_groups_avx512 where they can be (steps). A compilation of its own:
  // a run-time test for the vector path in the scalar scan slowed the batches that do not use it.
  template <Policy P, bool may_fail, bool vector = false>
  void scan_as(const int64_t* id, int64_t n, int64_t* slot_of, int64_t batch_start, size_t log_start) {
    constexpr bool lru = P == Policy::kLru;
    Bucket* const table = &table_[0];
    const uint64_t mask = mask_;
    const unsigned shift = shift_;
    LogEntry* const log = lru ? &log_[0] : nullptr;
    const size_t ring = log_mask_;  // a position in the log to its place in the ring
    uint64_t* const dead = lru ? &dead_[0] : nullptr;
    uint64_t where[kRing];  // where[p % kRing]: id p's home, then (lfu, hybrid) where its probe resumes
    Pending* const pend = pending_.data();
    int64_t n_pending = 0;
    uint32_t kills[kRing + kGroup];  // lru: kills[j % kRing], the j-th entry made dead, marked kKillLag kills on
    size_t n_killed = 0;
    auto kill = [&](uint32_t e) {
      prefetch_l2(&dead[e / 64]);
      kills[n_killed % kRing] = e;
      if (n_killed >= kKillLag) {
        set_bit(dead, kills[(n_killed - kKillLag) % kRing]);
      }
      ++n_killed;
    };
    auto hash_ahead = [&](int64_t q) {
      where[q % kRing] = home_in(shift, id[q]);
      prefetch_l2(&table[where[q % kRing]]);
    };
    for (int64_t q = 0; q < std::min(n, kAhead); ++q) hash_ahead(q);
    // tail: one of the last kAhead ids, which tests whether the ids ahead exist. Always inlined
    // (as a call it ran much slower).
    auto step = [&](int64_t p, auto tail_tag, int64_t log_off) __attribute__((always_inline)) {
      constexpr bool tail = decltype(tail_tag)::value;
      if (!tail || p + kAhead < n) hash_ahead(p + kAhead);
      if constexpr (!lru) {
        if (!tail || p + kAhead / 2 < n) {
          const int64_t q = p + kAhead / 2;
          where[q % kRing] = probe_in(table, mask, where[q % kRing], id[q]);
          const Bucket& ahead = table[where[q % kRing]];
          if (ahead.key == id[q] && ahead.val >= 0) {
            prefetch_l2(&slot_use_[ahead.val]);
          }
        }
      }
      if (!tail || p + kNear < n) prefetch_l1(&table[where[(p + kNear) % kRing]]);
      const int64_t key = id[p];
      const int64_t t = batch_start + p;
      const uint64_t bi = probe_in(table, mask, where[p % kRing], key);
      Bucket& b = table[bi];
      if constexpr (lru) log[log_off + p] = key;
      if (b.key == key) {
        const int64_t v = b.val;
        if (v >= 0) {
          if constexpr (lru) {  // this access's entry is its live one now, its last one dead
            const bool before_batch = ((b.pos - log_start) & ring) >= size_t(n);
            if (may_fail && before_batch) touched_.push_back({int64_t(bi), int64_t(b.pos), 0});
            kill(b.pos);
            b.pos = uint32_t(log_off + p);
          } else {
            if (may_fail && slot_use_[v].time < batch_start) touched_.push_back({v, slot_use_[v].time, slot_use_[v].count});
            touch<P>(v, t);
          }
        } else {
          Pending& q = pend[-v - 2];
          if constexpr (lru) kill(uint32_t((size_t(q.time - batch_start) + log_start) & ring));
          slot_of[p] = -(q.time - batch_start) - 2;  // its previous occurrence, chained (admit_one)
          q.time = t;
          q.count += 1;
          return;
        }
        slot_of[p] = v;
      } else {
        if (n_pending == capacity_) {  // one more distinct id than slots: never fits
          pending_.set_size(size_t(n_pending));
          undo(batch_start, log_start);
          throw std::invalid_argument("id transformer: a batch has more distinct ids than the table's " +
                                      std::to_string(capacity_) + " slots");
        }
        b.key = key;
        b.val = int32_t(-n_pending - 2);
        slot_of[p] = -1;  // its first occurrence: the chain's end
        pend[n_pending++] = {key, t, 1, bi};
      }
    };
    const int64_t body_end = std::max<int64_t>(0, n - kAhead);
    // Ids from..to, their log entries at log_off + p: by scalar steps, or (lru, a batch that
    // cannot fail, the body, `vector`) by lru_groups_avx512's steps of kGroup from each multiple
    // of kGroup, a step it leaves done by the scalar steps.
    auto steps = [&](int64_t from, int64_t to, auto tail_tag, int64_t log_off) __attribute__((always_inline)) {
      int64_t p = from;
      if constexpr (vector && !decltype(tail_tag)::value) {
        static_assert(lru && !may_fail, "the vector steps are lru's, for a batch that cannot fail");
        while (true) {
          for (; p < to && p % kGroup != 0; ++p) step(p, tail_tag, log_off);
          if (p + kGroup > to) break;
          LruGroups g{table, shift, log, dead, where, kills, n_killed, pend, n_pending, slot_of, id, batch_start, 0};
          p = lru_groups_avx512(g, p, to, log_off);
          n_killed = g.n_killed;
          n_pending = g.n_pending;
          vector_scanned_ids_ += g.groups * kGroup;
          if (p + kGroup > to) break;
          for (const int64_t end = p + kGroup; p < end; ++p) step(p, tail_tag, log_off);
        }
      }
      for (; p < to; ++p) step(p, tail_tag, log_off);
    };
    // lru: id p's entry is at log_off + p in the ring, log_off one offset for the entries before
    // its wrap and one for those after (the batch fits the ring: make_log_room), so no entry's
    // place is masked.
    const int64_t first_off = lru ? int64_t(log_start & ring) : 0;
    const int64_t wrap = lru ? int64_t(ring + 1) - first_off : n;  // entries before the wrap
    auto run = [&](int64_t from, int64_t to, auto tail_tag) __attribute__((always_inline)) {
      const int64_t mid = std::min(std::max(wrap, from), to);
      steps(from, mid, tail_tag, first_off);
      steps(mid, to, tail_tag, first_off - int64_t(ring + 1));
    };
    run(0, body_end, std::false_type{});
    run(body_end, n, std::true_type{});
    pending_.set_size(size_t(n_pending));
    clock_ = batch_start + n;
    if constexpr (lru) {  // the last kills, not yet due
      for (size_t j = n_killed - std::min(n_killed, kKillLag); j < n_killed; ++j) set_bit(dead, kills[j % kRing]);
    }
  }

  // The pending ids take the fresh slots, then the victims' slots: the j-th victim leaves the
  // table and pending id fresh + j takes its slot in one step of one loop (faster than all erases,
  // then all admissions). A victim is found by its id (lru: from the log; lfu, hybrid: the id its
  // chosen slot holds) and its slot read off its bucket as it is erased. A pending id's bucket is
  // where the scan put it, or where an erase shifted it back to (erase_at and take_out keep that
  // note), so it is read only when its turn comes. Both loops, the fresh slots' and the victims',
  // prefetch the places of the entry kAhead on (the victims' loop: below).
  // lru: log_from_tick turns a tick of this batch into its entry's position in the log.
  // Compiled once for lru and once for the others: a run-time policy test in its loops slowed
  // lru's. It reads table_, pending_ and victims_ as members (unlike the scan): local copies of
  // them did not pay. Measured: docs/id-transformer.md, "admit's victims: chunks, then one loop".
  void admit(int64_t fresh, int64_t* admitted_ids, int64_t* admitted_slots, int64_t* evicted_ids,
             int64_t* evicted_slots, int64_t* slot_of, int64_t batch_start, int64_t log_from_tick) {
    if (fresh + int64_t(victims_.size()) != int64_t(pending_.size())) {
      throw std::logic_error("id transformer: victims and fresh slots do not match the new ids");
    }
    if (policy_ == Policy::kLru) {
      admit_as<true>(fresh, admitted_ids, admitted_slots, evicted_ids, evicted_slots, slot_of, batch_start, log_from_tick);
    } else {
      admit_as<false>(fresh, admitted_ids, admitted_slots, evicted_ids, evicted_slots, slot_of, batch_start, log_from_tick);
    }
  }

  template <bool lru>
  void admit_as(int64_t fresh, int64_t* admitted_ids, int64_t* admitted_slots, int64_t* evicted_ids,
                int64_t* evicted_slots, int64_t* slot_of, int64_t batch_start, int64_t log_from_tick) {
    const int64_t m = int64_t(victims_.size());
    auto victim_id = [&](int64_t j) {
      if constexpr (lru) {
        return victims_[j];
      } else {
        return slot_id_[victims_[j]];
      }
    };
    auto admit_ahead = [&](int64_t j, int64_t s) {  // pending id j will take slot s
      prefetch_l2(&table_[pending_[j].bucket]);
      if constexpr (!lru) {
        prefetch_l2(&slot_id_[s]);
        prefetch_l2(&slot_use_[s]);
      }
    };
    auto admit_one = [&](int64_t j, int64_t s) {
      const Pending& q = pending_[j];
      Bucket& b = table_[q.bucket];
      b.val = int32_t(s);
      if constexpr (lru) {
        b.pos = uint32_t(size_t(q.time + log_from_tick) & log_mask_);
      } else {
        slot_id_[s] = q.id;
        slot_use_[s] = {q.time, q.count};
      }
      admitted_ids[j] = q.id;
      admitted_slots[j] = s;
      int64_t p = q.time - batch_start;  // its last occurrence; each earlier one is chained from the next (scan)
      for (int64_t c = q.count; c > 1; --c) {
        const int64_t before = -slot_of[p] - 2;
        slot_of[p] = s;
        p = before;
      }
      slot_of[p] = s;
    };
    for (int64_t j = 0; j < std::min(fresh, kAhead); ++j) admit_ahead(j, used_ + j);
    for (int64_t j = 0; j < fresh; ++j) {
      if (j + kAhead < fresh) admit_ahead(j + kAhead, used_ + j + kAhead);
      admit_one(j, used_ + j);
    }
    // The victims: victim j + kAhead is hashed and its home line prefetched as victim j is erased
    // and its slot given to pending id fresh + j, so the misses of many victims overlap, as in the
    // scan (not in chunks, a pass hashing and prefetching kChunk victims then one working on them:
    // no victim's line was in flight while a chunk was worked on). Only the home line: take_out
    // reads on past it only from a full one. The pending ids' buckets are prefetched kPendingAhead
    // victims ahead, apart from the victims' lines: the scan wrote them, so they come from L3, and
    // prefetched beside the victims' lines they took miss buffers from those (from DRAM). The
    // erases of victims in full lines wait for the next kChunk-th victim (take_out_of_full).
    // Measured, and variants not taken (AVX-512 victims included): docs/id-transformer.md,
    // "admit's victims: chunks, then one loop" and the sections on admit after it.
    uint64_t homes[kRing];  // homes[q % kRing]: victim q's home
    auto hash_victim = [&](int64_t q) {
      homes[q % kRing] = home(victim_id(q));
      prefetch_l2(&table_[homes[q % kRing]]);
    };
    if constexpr (!lru) {  // lfu, hybrid: a victim's slot_id_ (its id) and slot_use_ (rewritten as its slot is given)
      for (int64_t q = 0; q < std::min(m, 3 * kAhead); ++q) prefetch_l2(&slot_id_[victims_[q]]);
      for (int64_t q = 0; q < std::min(m, 2 * kAhead); ++q) prefetch_l2(&slot_use_[victims_[q]]);
    }
    for (int64_t q = 0; q < std::min(m, kAhead); ++q) hash_victim(q);
    for (int64_t q = 0; q < std::min(m, kPendingAhead); ++q) prefetch_l2(&table_[pending_[fresh + q].bucket]);
    for (int64_t j = 0; j < m; ++j) {
      if constexpr (!lru) {
        if (j + 3 * kAhead < m) prefetch_l2(&slot_id_[victims_[j + 3 * kAhead]]);
        if (j + 2 * kAhead < m) prefetch_l2(&slot_use_[victims_[j + 2 * kAhead]]);
      }
      if (j + kAhead < m) hash_victim(j + kAhead);
      if (j + kNear < m) prefetch_l1(&table_[homes[(j + kNear) % kRing]]);
      if (j + kPendingAhead < m) prefetch_l2(&table_[pending_[fresh + j + kPendingAhead].bucket]);
      const int64_t key = victim_id(j);
      const int64_t s = take_out(homes[j % kRing], key);
      evicted_ids[j] = key;
      evicted_slots[j] = s;
      admit_one(fresh + j, s);
      if ((j + 1) % kChunk == 0) erase_deferred();
    }
    erase_deferred();
  }

  // A batch that cannot be admitted leaves the table as it found it: the ids it touched as they
  // were (before any erase moves their buckets), its pending ids out of the table, its log
  // entries and clock ticks taken back.
  void undo(int64_t batch_start, size_t log_start) {
    const bool lru = policy_ == Policy::kLru;
    for (const Touched& u : touched_) {
      if (lru) {  // its old entry lives again
        table_[u.where].pos = uint32_t(u.time);
        clear_dead(size_t(u.time));
      } else {
        slot_use_[u.where] = {u.time, u.count};
      }
    }
    for (const Pending& q : pending_) erase(q.id);
    if (lru) {  // this batch's entries, some marked dead by a later occurrence of their id
      for (size_t e = log_start; e < log_end_; ++e) clear_dead(e & log_mask_);
    }
    log_end_ = std::min(log_end_, log_start);
    clock_ = batch_start;
  }

  // lru: the ids of up to `need` slots into victims_, least recent first, from the log's live
  // entries before `end` (this batch's begin there); `head` advances past what was read. The
  // dead bits make this a sequential read: no bucket is visited for an entry skipped.
  void least_recent(int64_t need, size_t end, size_t* head) {
    // A word of dead bits at a time, visiting its live entries only (no branch an entry). A word
    // never straddles the ring's wrap (its room is a multiple of 64).
    size_t e = *head;
    while (e < end && int64_t(victims_.size()) < need) {
      const size_t word = e / 64;
      uint64_t live = ~dead_[(e & log_mask_) / 64] & (~uint64_t(0) << (e % 64));  // live entries at e and on
      const size_t word_end = std::min(end, (word + 1) * 64);
      if (word_end % 64) live &= (uint64_t(1) << (word_end % 64)) - 1;
      size_t after = word_end;
      while (live && int64_t(victims_.size()) < need) {
        const size_t at = word * 64 + __builtin_ctzll(live);
        victims_.push_back(log_[at & log_mask_]);
        live &= live - 1;
        after = at + 1;
      }
      e = live ? after : word_end;  // live entries left: the victims are all found, read on from there
    }
    *head = e;
  }

  // lru: room in the ring for a batch of n entries behind its live ones, their dead bits cleared.
  // When the batch would reach the front, the log is compacted in place to its live entries (at
  // most one a slot; a kept entry moves only towards the front, so it never overwrites one not yet
  // read), and grown where even that leaves too little room (a batch of more than a few times the
  // slots; rare, so the kept entries then tell their buckets twice). The compaction's read of the
  // log and its dead bits is sequential; only a live entry visits its bucket (to say where the
  // entry went). A batch the log cannot take is refused with the log whole and compacted.
  void make_log_room(int64_t n) {
    if (log_end_ - log_head_ + size_t(n) <= log_.size()) {
      clear_dead_range(log_end_, size_t(n));
      return;
    }
    ++log_compactions_;
    size_t kept = 0;
    for (size_t e = log_head_; e < log_end_; ++e) {  // no branch: a live entry is kept, a dead one overwritten
      log_[(log_head_ + kept) & log_mask_] = log_[e & log_mask_];
      kept += !is_dead(e & log_mask_);
    }
    clear_dead_range(log_head_, kept);
    log_end_ = log_head_ + kept;
    tell_buckets();
    if (kept + size_t(n) > log_.size()) {
      const uint64_t room = ring_room(2 * (kept + uint64_t(n)));
      if (room > kMaxLogRoom) {
        throw std::invalid_argument("id transformer: a batch of " + std::to_string(n) +
                                    " ids outgrows lru's log (32-bit positions)");
      }
      HugeArray<LogEntry> kept_log = std::move(log_);
      const size_t old_mask = log_mask_;
      make_log(room);
      for (size_t e = 0; e < kept; ++e) log_[e] = kept_log[(log_head_ + e) & old_mask];
      log_head_ = 0;
      log_end_ = kept;
      tell_buckets();
    }
    clear_dead_range(log_end_, size_t(n));
  }

  // lru: each entry of the log (all of them live, after a compaction) to its id's bucket.
  void tell_buckets() {
    for (size_t e = log_head_; e < log_end_; ++e) {  // apart, so the lookahead counts live entries only
      if (e + kAhead < log_end_) prefetch_l2(&table_[home(log_[(e + kAhead) & log_mask_])]);
      table_[bucket_of(log_[e & log_mask_])].pos = uint32_t(e & log_mask_);
    }
  }

  // A ring's room for at least `entries`: a power of two (a position's place is a mask away) and a
  // multiple of 64 (a word of dead bits never wraps).
  static uint64_t ring_room(uint64_t entries) {
    uint64_t room = 64;
    while (room < entries) room <<= 1;
    return room;
  }

  // lru: an empty ring of `room` entries (ring_room's), no dead bit set.
  void make_log(size_t room) {
    log_ = HugeArray<LogEntry>(room, 0);
    log_mask_ = room - 1;
    dead_ = HugeArray<uint64_t>(room / 64, 0);
  }
  // Dead bits by place in the ring; clear_dead_range takes log positions, wrapping as they do.
  bool is_dead(size_t e) const { return (dead_[e / 64] >> (e % 64)) & 1; }
  // Static, for the scan's local copy of dead_'s address (through the member, every store in the
  // loop would reload it).
  static void set_bit(uint64_t* words, size_t e) { words[e / 64] |= uint64_t(1) << (e % 64); }
  void clear_dead(size_t e) { dead_[e / 64] &= ~(uint64_t(1) << (e % 64)); }
  void clear_dead_range(size_t from, size_t count) {
    for (size_t e = from; e < from + count;) {
      const size_t bits = std::min<size_t>(64 - e % 64, from + count - e);
      const uint64_t mask = bits == 64 ? ~uint64_t(0) : ((uint64_t(1) << bits) - 1) << (e % 64);
      dead_[(e & log_mask_) / 64] &= ~mask;
      e += bits;
    }
  }

  // A victim out of the table (its home `h`), returning its slot. The general way (probe, then
  // erase_at) loops on data: over the buckets before the victim, then over those after it until
  // an empty one, each time asking whether the next may move back; both loops' exits are as random
  // as the table, so they mispredicted an erase or two each. In a line that is not full (its last bucket
  // empty, nearly every line at a load of 1/4) the occupied buckets are a prefix of the line: no
  // key has an empty bucket between its home and itself, and homes are line starts. So the victim
  // is among the first three, and every bucket after it, up to the empty last one, may move back
  // one (each key's home is this line's start or an earlier line's): one fixed sequence of loads,
  // masks and stores, with no branch on where the victim sits. A full line: take_out_of_full.
  // Measured: docs/id-transformer.md, "Taking a victim out".
  int64_t take_out(uint64_t h, int64_t key) {
    Bucket* const line = &table_[h];
    if (__builtin_expect(line[kBucketsPerLine - 1].key == kEmpty, 1)) {
#if defined(__SSE2__)
      static_assert(kBucketsPerLine == 4, "the blend below moves the buckets of a four-bucket line");
      const bool not0 = line[0].key != key;
      const bool not1 = line[1].key != key;
      const unsigned at = unsigned(not0) + unsigned(not0 & not1);  // 2 when neither: the third
      const int64_t slot = line[at].val;
      __m128i* const q = reinterpret_cast<__m128i*>(line);
      const __m128i b0 = _mm_loadu_si128(q), b1 = _mm_loadu_si128(q + 1), b2 = _mm_loadu_si128(q + 2);
      const __m128i b3 = _mm_loadu_si128(q + 3);  // empty
      const __m128i move0 = _mm_set1_epi64x(-int64_t(at == 0)), move1 = _mm_set1_epi64x(-int64_t(at <= 1));
      _mm_storeu_si128(q, _mm_or_si128(_mm_and_si128(move0, b1), _mm_andnot_si128(move0, b0)));
      _mm_storeu_si128(q + 1, _mm_or_si128(_mm_and_si128(move1, b2), _mm_andnot_si128(move1, b1)));
      _mm_storeu_si128(q + 2, b3);
      // A pending id that moved back says where it went. An empty bucket's val is stale and may
      // be negative too: note_moved checks the key.
      if (__builtin_expect((line[0].val | line[1].val) < 0, 0)) {
        for (unsigned p = at; p < 2; ++p) note_moved(h + p);
      }
      return slot;
#else
      return take_out_at_once(h, key);
#endif
    }
    return take_out_of_full(h, key);
  }
  int64_t take_out_at_once(uint64_t h, int64_t key) {  // the general way: probe, then erase_at
    const uint64_t b = probe(h, key);
    const int64_t slot = table_[b].val;
    erase_at(b);
    return slot;
  }

  // A victim whose home line is full (about one in twenty at a million slots, 50% hits, ids in
  // random order): its erase reads on into the next line, which nothing prefetched, so erase_at
  // waited on DRAM there. The victim's slot is read off its line now, and its erase waits in
  // deferred_ until the next kChunk-th victim (erase_deferred), its next line prefetched now.
  // Meanwhile every key stays reachable: the erases that run first (blends of other lines, erases
  // at once) move keys only back towards their homes, a later victim of the same line is read
  // off the line as it is then, and a deferred erase probes for its victim afresh. A pending id
  // an erase moves still says where it went (erase_at); one already given its slot moves with it.
  // A victim not in its home line (it overflowed) is erased at once.
  __attribute__((noinline)) int64_t take_out_of_full(uint64_t h, int64_t key) {
    const Bucket* const line = &table_[h];
    for (unsigned i = 0; i < kBucketsPerLine; ++i) {
      if (line[i].key == key) {
        deferred_.push_back(key);
        prefetch_l2(&table_[(h + kBucketsPerLine) & mask_]);
        return line[i].val;
      }
    }
    return take_out_at_once(h, key);
  }
  void erase_deferred() {
    for (const int64_t key : deferred_) erase(key);
    deferred_.clear();
  }

  // A key just moved into bucket b: a pending id's note of its bucket follows it (admit reads the
  // bucket from there).
  void note_moved(uint64_t b) {
    const Bucket& moved = table_[b];
    if (moved.key != kEmpty && moved.val < 0) pending_[-moved.val - 2].bucket = b;
  }

  // Backward-shift deletion: entries after the hole that may move into it do, so every key
  // stays reachable from its home bucket without tombstones.
  void erase(int64_t key) {
    const uint64_t b = bucket_of(key);
    if (table_[b].key == key) erase_at(b);
  }
  void erase_at(uint64_t hole) {
    uint64_t j = hole;
    while (true) {
      j = (j + 1) & mask_;
      if (table_[j].key == kEmpty) break;
      const uint64_t h = home(table_[j].key);
      const bool stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
      if (stays) continue;
      table_[hole] = table_[j];
      note_moved(hole);
      hole = j;
    }
    table_[hole].key = kEmpty;
  }

  int64_t decayed(int64_t slot, int64_t now) const {
    const uint64_t halvings = halvings_in(uint64_t(now - slot_use_[slot].time));
    return halvings >= 62 ? 0 : slot_use_[slot].count >> halvings;
  }

  // min(floor(ticks / half_life_), 62) for ticks < 2^63, exact, with no division and no branch:
  // coldest() takes one a slot, and an idiv a slot weighed on it (docs/id-transformer.md).
  // The high half of ticks x floor((2^64 - 1) / half_life_) is the quotient or one less (its
  // error is under 2 x ticks / 2^64 < 1), and one compare of the remainder settles which.
  uint64_t halvings_in(uint64_t ticks) const {
    const uint64_t h = uint64_t(half_life_);
    uint64_t q = uint64_t((__uint128_t(ticks) * half_life_reciprocal_) >> 64);
    q += ticks - q * h >= h;
    return std::min<uint64_t>(q, 62);
  }

  template <Policy P>
  void touch(int64_t slot, int64_t t) {
    if constexpr (P == Policy::kLfu) slot_use_[slot].count = std::min(slot_use_[slot].count + 1, kMaxCount);
    if constexpr (P == Policy::kHybrid) slot_use_[slot].count = std::min(decayed(slot, t) + 1, kMaxCount);
    slot_use_[slot].time = t;
  }

  // lfu, hybrid: up to `need` slots into victims_, not accessed since `since`, coldest first.
  // Ranking every evictable slot in a list and selecting from it wrote and re-read 24 bytes a
  // slot (docs/id-transformer.md, "coldest()"). Instead a sample of the slots (every
  // stride-th) gives a threshold a little past the `need`-th coldest, one pass lists only the
  // slots no warmer than it, and the selection runs on those. Exact: when at least `need` slots
  // are listed, every slot left out is warmer than `need` listed ones; when fewer are (a sample
  // that missed), the pass runs again listing every evictable slot. Times are distinct (a tick
  // an access), so the order is total. The pass has no branch a slot: whether a slot is kept is
  // as unpredictable as its heat, and a mispredicted branch a slot cost more than the rest of it.
  void coldest(int64_t need, int64_t since) {
    if (need <= 0) return;
    const int64_t stride = std::max<int64_t>(1, used_ / kColdSample);
    cold_sample_.clear();
    for (int64_t s = 0; s < used_; s += stride) {
      if (slot_use_[s].time < since) cold_sample_.push_back(cold_key(s, since));
    }
    // The sample rank that stands for `need` slots, a quarter and 8 more for the sample's error.
    const size_t rank = size_t(need / stride + need / stride / 4 + 8);
    bool all = rank >= cold_sample_.size();
    ColdKey threshold{};
    if (!all) {
      std::nth_element(cold_sample_.begin(), cold_sample_.begin() + rank, cold_sample_.end());
      threshold = cold_sample_[rank];
    }
    if (cold_keys_.size() < size_t(used_)) throw std::logic_error("id transformer: coldest() without its room (make_room)");
    ColdKey* const keys = &cold_keys_[0];
    int64_t n = 0;
    while (true) {
      n = 0;
      for (int64_t s = 0; s < used_; ++s) {
        const ColdKey key = cold_key(s, since);  // meaningless for a slot this batch accessed: never kept
        const bool colder = (key.heat < threshold.heat) | ((key.heat == threshold.heat) & (key.time <= threshold.time));
        keys[n] = key;  // kept only if n moves on
        n += (key.time < since) & (all | colder);  // not accessed by this batch, and no warmer
      }
      if (all || n >= need) break;
      all = true;  // the threshold fell short of `need` slots: list them all
    }
    const int64_t m = std::min(need, n);
    if (m < n) std::nth_element(keys, keys + m, keys + n);
    std::sort(keys, keys + m);
    for (int64_t j = 0; j < m; ++j) victims_.push_back(keys[j].slot);
  }

  ColdKey cold_key(int64_t slot, int64_t now) const {
    return {policy_ == Policy::kLfu ? slot_use_[slot].count : decayed(slot, now), slot_use_[slot].time, slot};
  }

  const Policy policy_;
  const int64_t capacity_;
  const int64_t half_life_;
  // halvings_in's; 0 for a half_life the constructor is about to refuse (no division by 0 first)
  const uint64_t half_life_reciprocal_ = half_life_ >= 1 ? ~uint64_t(0) / uint64_t(half_life_) : 0;
  uint64_t mask_ = 0;
  unsigned shift_ = 64;  // 64 - log2(table size): home_in's shift
  HugeArray<Bucket> table_;  // the id -> slot hash table
  // A slot's state, allocated only for the policies that read it (lfu, hybrid; lru keeps none).
  HugeArray<int64_t> slot_id_;    // the id it holds, kEmpty if never used (read when it is evicted)
  HugeArray<SlotUse> slot_use_;   // its last access and count, together: a hit reads and writes both
  // lru: accesses in time order, a ring: the entries at log positions log_head_ .. log_end_ are
  // unread, position e at log_[e & log_mask_] (positions count on, places wrap).
  HugeArray<LogEntry> log_;
  HugeArray<uint64_t> dead_;  // lru: a bit a place of log_, set once a later access of its id came
  size_t log_mask_ = 0;
  size_t log_head_ = 0;
  size_t log_end_ = 0;
  int64_t log_compactions_ = 0;  // lru: how many times make_log_room compacted (perf-dynamic prints it)
  enum class VectorScan { kAuto, kAlways, kNever };
  VectorScan vector_scan_ = VectorScan::kAuto;
  double last_new_share_ = 0;  // the share of the last batch's ids that were new (vector_scan_for)
  int64_t vector_scanned_ids_ = 0;
  double part_seconds_[3] = {0, 0, 0};  // part_seconds()
  // A batch's working lists, kept between calls so a batch allocates (and faults in) nothing.
  PendingList pending_;
  std::vector<int64_t> deferred_;  // victims of full lines, their erases deferred (take_out_of_full)
  std::vector<Touched> touched_;
  std::vector<int64_t> victims_;  // lru: ids; lfu, hybrid: slots
  std::vector<ColdKey> cold_sample_;  // coldest(): a sample of the evictable slots, for its threshold
  // coldest(): the slots no warmer than the threshold (room for all, made before the first batch
  // that may evict: make_room)
  HugeArray<ColdKey> cold_keys_;
  int64_t used_ = 0;   // slots 0 .. used_-1 have held an id; the rest were never used
  int64_t clock_ = 0;  // ticks once an id occurrence
  std::mutex mu_;
};

// Random 16-byte reads a second from a table of `bytes` (2 MiB pages, filled first), `reads` of
// them at uniformly random places, each prefetched kAhead reads before it is used, as the
// transformer's loops do: the most a loop with one such read an item can reach on this machine.
double random_read_rate(int64_t bytes, int64_t reads) {
  if (bytes < 16 || reads < 1) throw std::invalid_argument("random_read_rate: bytes >= 16 and reads >= 1");
  const uint64_t n = uint64_t(bytes) / sizeof(Bucket);
  HugeArray<Bucket> table(n, Bucket{1, 1});
  std::vector<uint64_t> where(reads);
  uint64_t x = 12345;
  for (auto& w : where) w = mix(x++) % n;
  int64_t sum = 0;
  const auto start = Clock::now();
  for (int64_t p = 0; p < reads; ++p) {
    if (p + kAhead < reads) prefetch_l2(&table[where[p + kAhead]]);
    sum += table[where[p]].val;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (sum != reads) throw std::logic_error("random_read_rate: a read went astray");
  return double(reads) / seconds;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "The ID transformer of dynamic embedding tables (csrc/id_transformer.cpp)";
  namespace py = pybind11;
  py::class_<IdTransformer>(m, "IdTransformer")
      .def(py::init<int64_t, const std::string&, int64_t>(), py::arg("capacity"), py::arg("policy"),
           py::arg("half_life"))
      .def("transform", &IdTransformer::transform, py::arg("ids"), py::call_guard<py::gil_scoped_release>())
      .def("lookup", &IdTransformer::lookup, py::arg("ids"), py::call_guard<py::gil_scoped_release>())
      .def("homes", &IdTransformer::homes, py::arg("ids"))
      .def("slot_ids", &IdTransformer::slot_ids, py::call_guard<py::gil_scoped_release>())
      .def("resident", &IdTransformer::resident)
      .def("log_compactions", &IdTransformer::log_compactions)
      .def("set_vector_scan", &IdTransformer::set_vector_scan, py::arg("mode"))
      .def("vector_scanned_ids", &IdTransformer::vector_scanned_ids)
      .def("part_seconds", &IdTransformer::part_seconds)
      .def_property_readonly("capacity", &IdTransformer::capacity)
      .def_property_readonly("table_bytes", &IdTransformer::table_bytes)
      .def_property_readonly("host_bytes", &IdTransformer::host_bytes);
  m.attr("log_room_per_slot") = kLogRoomPerSlot;
  m.def("random_read_rate", &random_read_rate, py::arg("bytes"), py::arg("reads"),
        py::call_guard<py::gil_scoped_release>());
}
