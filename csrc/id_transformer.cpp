// The ID transformer of a dynamic embedding table: maps global ids to a fixed number of slots.
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
// Evictions are exact, reported coldest first. lru keeps a log of accesses in time order (an entry
// a slot and tick, appended as ids occur); an entry is live while its slot's last access is that
// tick, so the live entries from the front are the slots from least to most recent. Evicting pops
// from the front, skipping the dead; the log is compacted to its live entries when it grows past
// twice the slots. lfu and hybrid rank every evictable slot (a linear-time selection, then a sort
// of the chosen), since a decayed counter's order moves with time.
//
// Speed: an id costs one hash bucket (key and slot side by side in one cache line) and one slot
// state; the buckets of ids a few places ahead are prefetched, and the slot states of ids half as
// far ahead (their buckets have arrived), so the cache misses of several ids overlap.
//
// The id -> slot map is an open-addressing hash table with linear probing and backward-shift
// deletion (no tombstones), sized to a power of two at least 4x the slots: at most `capacity`
// resident ids plus up to `capacity` ids pending admission during one batch keep its load <= 1/2.
//
// Thread-safe: one mutex serialises every call (the input-dist thread transforms while the main
// thread may read); the GIL is released while a call runs.

// Only the headers used (not torch/extension.h, which includes all of torch): a third of the
// build time.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace {

constexpr int64_t kEmpty = -1;  // ids are non-negative; -1 marks an empty bucket
constexpr int64_t kMaxCount = int64_t(1) << 40;  // counters saturate here

enum class Policy { kLru, kLfu, kHybrid };

Policy parse_policy(const std::string& name) {
  if (name == "lru") return Policy::kLru;
  if (name == "lfu") return Policy::kLfu;
  if (name == "hybrid") return Policy::kHybrid;
  throw std::invalid_argument("id transformer: policy '" + name + "' is not one of lru, lfu, hybrid");
}

inline uint64_t mix(uint64_t x) {  // splitmix64's finaliser: consecutive ids spread over the table
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

struct SlotState {
  int64_t id = kEmpty;
  int64_t time = -1;  // clock tick of the last access
  int64_t count = 0;  // accesses (lfu) or the decayed counter as of `time` (hybrid)
};

struct Bucket {
  int64_t key = kEmpty;  // an id, or kEmpty
  int64_t val = 0;       // its slot, or -(k + 2) for the k-th pending id of a batch
};

struct LogEntry {  // lru: slot `slot` was accessed at tick `time` (slot < 0: pending, resolved later)
  int64_t time;
  int64_t slot;
};

constexpr int64_t kPrefetch = 16;  // ids ahead whose buckets are prefetched

struct Touched {  // a slot's state before this batch first touched it (restored if the batch fails)
  int64_t slot;
  int64_t time;
  int64_t count;
};

struct Pending {  // an id of this batch that is not resident yet
  int64_t id;
  int64_t time;   // its last occurrence in the batch
  int64_t count;  // its occurrences in the batch
};

using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

class IdTransformer {
 public:
  IdTransformer(int64_t capacity, const std::string& policy, int64_t half_life)
      : policy_(parse_policy(policy)), capacity_(capacity), half_life_(half_life) {
    if (capacity < 1) throw std::invalid_argument("id transformer: capacity must be >= 1 slot");
    if (half_life < 1) throw std::invalid_argument("id transformer: half_life must be >= 1 tick");
    uint64_t size = 1;
    while (size < uint64_t(4) * uint64_t(capacity)) size <<= 1;
    mask_ = size - 1;
    table_.assign(size, Bucket{});
    slots_.resize(capacity);
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
    if (lru) compact_log(n);
    const int64_t batch_start = clock_;
    const size_t log_start = log_.size();
    std::vector<Pending> pending;
    std::vector<Touched> touched;
    for (int64_t p = 0; p < std::min(n, kPrefetch); ++p) __builtin_prefetch(&table_[home(id[p])]);
    for (int64_t p = 0; p < n; ++p) {
      if (p + kPrefetch < n) __builtin_prefetch(&table_[home(id[p + kPrefetch])]);
      if (p + kPrefetch / 2 < n) {  // that id's bucket has arrived by now: fetch its slot's state
        const Bucket& ahead = table_[bucket_of(id[p + kPrefetch / 2])];
        if (ahead.val >= 0 && ahead.key == id[p + kPrefetch / 2]) __builtin_prefetch(&slots_[ahead.val]);
      }
      const int64_t t = clock_++;
      Bucket& b = table_[bucket_of(id[p])];
      if (b.key == id[p]) {
        const int64_t v = b.val;
        if (v >= 0) {
          SlotState& st = slots_[v];
          if (st.time < batch_start) touched.push_back({v, st.time, st.count});
          touch(st, t);
        } else {
          Pending& q = pending[-v - 2];
          q.time = t;
          q.count += 1;
        }
        slot_of[p] = v;
      } else {
        if (int64_t(pending.size()) == capacity_) {  // one more distinct id than slots: never fits
          undo(pending, touched, batch_start, log_start);
          throw std::invalid_argument("id transformer: a batch has more distinct ids than the table's " +
                                      std::to_string(capacity_) + " slots");
        }
        b.key = id[p];
        b.val = -int64_t(pending.size()) - 2;
        slot_of[p] = b.val;
        pending.push_back({id[p], t, 1});
      }
      if (lru) log_.push_back({t, slot_of[p]});
    }
    const int64_t k = int64_t(pending.size());
    const int64_t fresh = std::min(k, capacity_ - used_);
    std::vector<int64_t> victims;  // slots, coldest first
    size_t log_head = log_head_;
    if (k > fresh) {
      victims = lru ? least_recent(k - fresh, log_start, &log_head) : coldest(k - fresh, batch_start);
      if (int64_t(victims.size()) < k - fresh) {
        undo(pending, touched, batch_start, log_start);
        throw std::invalid_argument(
            "id transformer: a batch needs " + std::to_string(used_ - int64_t(victims.size()) + k) +
            " slots at once (its distinct ids), more than the table's " + std::to_string(capacity_));
      }
    }
    log_head_ = log_head;
    auto admitted_ids = at::empty({k}, at::kLong);
    auto admitted_slots = at::empty({k}, at::kLong);
    auto evicted_ids = at::empty({int64_t(victims.size())}, at::kLong);
    auto evicted_slots = at::empty({int64_t(victims.size())}, at::kLong);
    std::vector<int64_t> slot_of_pending(k);
    for (int64_t j = 0; j < int64_t(victims.size()); ++j) {
      const int64_t s = victims[j];
      evicted_ids.data_ptr<int64_t>()[j] = slots_[s].id;
      evicted_slots.data_ptr<int64_t>()[j] = s;
      erase(slots_[s].id);
    }
    for (int64_t j = 0; j < k; ++j) {
      const int64_t s = j < fresh ? used_ + j : victims[j - fresh];
      const Pending& q = pending[j];
      slots_[s] = SlotState{q.id, q.time, q.count};
      table_[bucket_of(q.id)].val = s;
      slot_of_pending[j] = s;
      admitted_ids.data_ptr<int64_t>()[j] = q.id;
      admitted_slots.data_ptr<int64_t>()[j] = s;
    }
    used_ += fresh;
    for (int64_t p = 0; p < n; ++p) {
      if (slot_of[p] < 0) slot_of[p] = slot_of_pending[-slot_of[p] - 2];
    }
    if (lru) {
      for (size_t e = log_start; e < log_.size(); ++e) {
        if (log_[e].slot < 0) log_[e].slot = slot_of_pending[-log_[e].slot - 2];
      }
    }
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

  // The id in each slot, -1 for a slot never used.
  at::Tensor slot_ids() {
    std::lock_guard<std::mutex> lock(mu_);
    auto out = at::full({capacity_}, kEmpty, at::kLong);
    for (int64_t s = 0; s < used_; ++s) out.data_ptr<int64_t>()[s] = slots_[s].id;
    return out;
  }

  int64_t capacity() const { return capacity_; }
  int64_t resident() {
    std::lock_guard<std::mutex> lock(mu_);
    return used_;
  }

 private:
  static at::Tensor check_ids(const at::Tensor& ids) {
    if (ids.scalar_type() != at::kLong || !ids.device().is_cpu()) {
      throw std::invalid_argument("id transformer: ids must be an int64 tensor on the CPU");
    }
    auto flat = ids.contiguous().view(-1);
    if (flat.numel() && flat.min().item<int64_t>() < 0) {
      throw std::invalid_argument("id transformer: ids must be non-negative");
    }
    return flat;
  }

  uint64_t home(int64_t key) const { return mix(uint64_t(key)) & mask_; }

  // The bucket holding `key`, or the empty bucket where it would go.
  uint64_t bucket_of(int64_t key) const {
    uint64_t b = home(key);
    while (table_[b].key != kEmpty && table_[b].key != key) b = (b + 1) & mask_;
    return b;
  }

  // A batch that cannot be admitted leaves the table as it found it: its pending ids out of the
  // table, the slots it touched as they were, its log entries and clock ticks taken back.
  void undo(const std::vector<Pending>& pending, const std::vector<Touched>& touched, int64_t batch_start,
            size_t log_start) {
    for (const Pending& q : pending) erase(q.id);
    for (const Touched& u : touched) {
      slots_[u.slot].time = u.time;
      slots_[u.slot].count = u.count;
    }
    log_.resize(std::min(log_.size(), log_start));
    clock_ = batch_start;
  }

  // lru: up to `need` slots, least recent first, from the log's live entries before `end` (this
  // batch's begin there); `head` advances past what was read.
  std::vector<int64_t> least_recent(int64_t need, size_t end, size_t* head) const {
    std::vector<int64_t> out;
    size_t e = *head;
    for (; e < end && int64_t(out.size()) < need; ++e) {
      const LogEntry& entry = log_[e];
      if (slots_[entry.slot].time == entry.time) out.push_back(entry.slot);
    }
    *head = e;
    return out;
  }

  // lru: drop the read front and the dead entries once the log holds more than twice the slots
  // (and the batch to come), so it stays within a few times the slots.
  void compact_log(int64_t batch) {
    if (log_.size() - log_head_ <= size_t(2 * capacity_ + batch) && log_head_ <= log_.size() / 2) return;
    size_t kept = 0;
    for (size_t e = log_head_; e < log_.size(); ++e) {
      if (slots_[log_[e].slot].time == log_[e].time) log_[kept++] = log_[e];
    }
    log_.resize(kept);
    log_head_ = 0;
  }

  // Backward-shift deletion: entries after the hole that may move into it do, so every key
  // stays reachable from its home bucket without tombstones.
  void erase(int64_t key) {
    uint64_t hole = bucket_of(key);
    if (table_[hole].key != key) return;
    uint64_t j = hole;
    while (true) {
      j = (j + 1) & mask_;
      if (table_[j].key == kEmpty) break;
      const uint64_t h = home(table_[j].key);
      const bool stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
      if (stays) continue;
      table_[hole] = table_[j];
      hole = j;
    }
    table_[hole].key = kEmpty;
  }

  int64_t decayed(const SlotState& s, int64_t now) const {
    const int64_t halvings = (now - s.time) / half_life_;
    return halvings >= 62 ? 0 : s.count >> halvings;
  }

  void touch(SlotState& s, int64_t t) {
    switch (policy_) {
      case Policy::kLru:
        break;
      case Policy::kLfu:
        s.count = std::min(s.count + 1, kMaxCount);
        break;
      case Policy::kHybrid:
        s.count = std::min(decayed(s, t) + 1, kMaxCount);
        break;
    }
    s.time = t;
  }

  // lfu, hybrid: up to `need` slots not accessed since `since`, coldest first.
  std::vector<int64_t> coldest(int64_t need, int64_t since) const {
    struct Key {
      int64_t heat, time, slot;
      bool operator<(const Key& o) const { return heat != o.heat ? heat < o.heat : time < o.time; }
    };
    std::vector<Key> keys;
    keys.reserve(used_);
    for (int64_t s = 0; s < used_; ++s) {
      const SlotState& st = slots_[s];
      if (st.time >= since) continue;  // accessed by this batch
      const int64_t heat = policy_ == Policy::kLru ? 0 : policy_ == Policy::kLfu ? st.count : decayed(st, since);
      keys.push_back({heat, st.time, s});
    }
    const int64_t m = std::min<int64_t>(need, keys.size());
    if (m < int64_t(keys.size())) std::nth_element(keys.begin(), keys.begin() + m, keys.end());
    std::sort(keys.begin(), keys.begin() + m);
    std::vector<int64_t> out(m);
    for (int64_t j = 0; j < m; ++j) out[j] = keys[j].slot;
    return out;
  }

  const Policy policy_;
  const int64_t capacity_;
  const int64_t half_life_;
  uint64_t mask_ = 0;
  std::vector<Bucket> table_;  // the id -> slot hash table
  std::vector<SlotState> slots_;
  std::vector<LogEntry> log_;  // lru: accesses in time order, read from log_head_ on
  size_t log_head_ = 0;
  int64_t used_ = 0;   // slots 0 .. used_-1 have held an id; the rest were never used
  int64_t clock_ = 0;  // ticks once an id occurrence
  std::mutex mu_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "The ID transformer of dynamic embedding tables (csrc/id_transformer.cpp)";
  namespace py = pybind11;
  py::class_<IdTransformer>(m, "IdTransformer")
      .def(py::init<int64_t, const std::string&, int64_t>(), py::arg("capacity"), py::arg("policy"),
           py::arg("half_life"))
      .def("transform", &IdTransformer::transform, py::arg("ids"), py::call_guard<py::gil_scoped_release>())
      .def("lookup", &IdTransformer::lookup, py::arg("ids"), py::call_guard<py::gil_scoped_release>())
      .def("slot_ids", &IdTransformer::slot_ids, py::call_guard<py::gil_scoped_release>())
      .def("resident", &IdTransformer::resident)
      .def_property_readonly("capacity", &IdTransformer::capacity);
}
