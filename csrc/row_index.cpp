// The embedded parameter store's index (harness/param_store.py): each id a table holds -> the
// position of its row, for whole batches of ids at a time.
//
// A Python dict did this job first, a lookup an id from Python: at a million ids held, 450 ns an
// id, two thirds of a put or get of 30,000 evicted rows (the rest is numpy copying the rows).
// Here a batch is one call: an open-addressing table (linear probing, 16-byte buckets, grown by
// doubling at a load of 1/2; the store never forgets an id, so nothing is ever erased), each
// loop prefetching the bucket of the id kAhead places on so the misses of many ids overlap.
//
// Thread-safe: one mutex serialises every call; the GIL is released while a call runs.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include "hash_memory.h"

#include <cstdint>
#include <limits>
#include <mutex>
#include <stdexcept>

namespace {

using dlrm_csrc::HugeArray;
using dlrm_csrc::mix;

constexpr int64_t kEmpty = -1;  // ids are non-negative; -1 marks an empty bucket
constexpr int64_t kAbsent = std::numeric_limits<int64_t>::min();  // find(): the id is not held
constexpr int64_t kAhead = 16;  // prefetch distance (ids); a bucket's work here is a few ns
constexpr uint64_t kMinBuckets = 1024;

struct Bucket {
  int64_t key = kEmpty;
  int64_t val = 0;
};

class RowIndex {
 public:
  RowIndex() : table_(kMinBuckets, Bucket{}), mask_(kMinBuckets - 1) {}

  // The position of each id, kAbsent for an id not held.
  at::Tensor find(const at::Tensor& ids_in) {
    const at::Tensor ids = check_ids(ids_in);
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t n = ids.numel();
    const int64_t* id = ids.data_ptr<int64_t>();
    at::Tensor out = at::empty({n}, at::kLong);
    int64_t* o = out.data_ptr<int64_t>();
    const Bucket* table = &table_[0];
    for (int64_t p = 0; p < n; ++p) {
      if (p + kAhead < n) __builtin_prefetch(&table[mix(uint64_t(id[p + kAhead])) & mask_]);
      const Bucket& b = table[probe(table, mask_, id[p])];
      o[p] = b.key == id[p] ? b.val : kAbsent;
    }
    return out;
  }

  // Each id's position becomes positions[i] (held ids are overwritten, new ones added).
  void insert(const at::Tensor& ids_in, const at::Tensor& positions_in) {
    const at::Tensor ids = check_ids(ids_in);
    if (positions_in.scalar_type() != at::kLong || !positions_in.device().is_cpu() ||
        positions_in.numel() != ids.numel()) {
      throw std::invalid_argument("row index: positions must be an int64 CPU tensor, one an id");
    }
    const at::Tensor positions = positions_in.contiguous().view(-1);
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t n = ids.numel();
    reserve(held_ + uint64_t(n));  // before any write: a failed growth leaves the index as it was
    const int64_t* id = ids.data_ptr<int64_t>();
    const int64_t* pos = positions.data_ptr<int64_t>();
    Bucket* table = &table_[0];
    for (int64_t p = 0; p < n; ++p) {
      if (p + kAhead < n) __builtin_prefetch(&table[mix(uint64_t(id[p + kAhead])) & mask_], 1);
      Bucket& b = table[probe(table, mask_, id[p])];
      held_ += b.key == kEmpty;
      b.key = id[p];
      b.val = pos[p];
    }
  }

  int64_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return int64_t(held_);
  }

  int64_t table_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return int64_t(table_.size() * sizeof(Bucket));
  }

 private:
  static at::Tensor check_ids(const at::Tensor& ids) {
    if (ids.scalar_type() != at::kLong || !ids.device().is_cpu()) {
      throw std::invalid_argument("row index: ids must be an int64 CPU tensor");
    }
    at::Tensor flat = ids.contiguous().view(-1);
    if (dlrm_csrc::any_negative(flat.data_ptr<int64_t>(), flat.numel())) {
      throw std::invalid_argument("row index: ids must be non-negative");
    }
    return flat;
  }

  // The bucket holding `key`, or the empty one where it would go.
  static uint64_t probe(const Bucket* table, uint64_t mask, int64_t key) {
    uint64_t b = mix(uint64_t(key)) & mask;
    while (table[b].key != kEmpty && table[b].key != key) b = (b + 1) & mask;
    return b;
  }

  // Room for `ids` held at a load of at most 1/2 (an upper bound: some may be held already).
  void reserve(uint64_t ids) {
    uint64_t size = table_.size();
    while (size < 2 * ids) size <<= 1;
    if (size == table_.size()) return;
    HugeArray<Bucket> grown(size, Bucket{});
    const uint64_t mask = size - 1;
    for (uint64_t b = 0; b < table_.size(); ++b) {
      if (table_[b].key != kEmpty) grown[probe(&grown[0], mask, table_[b].key)] = table_[b];
    }
    table_ = std::move(grown);
    mask_ = mask;
  }

  HugeArray<Bucket> table_;
  uint64_t mask_;
  uint64_t held_ = 0;
  std::mutex mu_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "The embedded parameter store's id -> row position index (csrc/row_index.cpp)";
  namespace py = pybind11;
  py::class_<RowIndex>(m, "RowIndex")
      .def(py::init<>())
      .def("find", &RowIndex::find, py::arg("ids"), py::call_guard<py::gil_scoped_release>())
      .def("insert", &RowIndex::insert, py::arg("ids"), py::arg("positions"), py::call_guard<py::gil_scoped_release>())
      .def("__len__", &RowIndex::size)
      .def_property_readonly("table_bytes", &RowIndex::table_bytes);
  m.attr("ABSENT") = kAbsent;
}
