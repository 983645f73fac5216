// What the extensions' hash tables share (id_transformer.cpp, row_index.cpp): the mix that spreads
// ids over a table (row_index's homes; the ID transformer hashes with one multiply, see its home_in),
// the check that ids are non-negative, prefetches, and arrays on 2 MiB pages (with a pass that warms
// their address translations).
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

namespace dlrm_csrc {

inline uint64_t mix(uint64_t x) {  // splitmix64's finaliser: consecutive ids spread over the table
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// A prefetch of a line that a loop reads a few dozen items later, into L2, not L1. A prefetch into
// L1 holds one of the core's few L1 miss buffers until its line comes from DRAM, so a loop keeping
// dozens in flight stalls at the prefetch itself; L2 keeps many more misses in flight, and the
// read a few dozen items later finds the line there (measured: docs/id-transformer.md).
inline void prefetch_l2(const void* p) { __builtin_prefetch(p, 0, 1); }
// The second step for such a line, a few items before its use: from L2 (where prefetch_l2 put
// it, so the L1 miss buffer is held briefly) into L1.
inline void prefetch_l1(const void* p) { __builtin_prefetch(p, 0, 3); }

// Whether any of n ids is negative (the tables' empty mark is -1): one plain pass, an OR of them
// all, which vectorises (a torch reduction costs more at a batch's sizes). On x86-64 it is also
// compiled for AVX2, picked at load time where the CPU has it: the baseline (SSE2) loop ORs 16
// bytes a cycle, which held lru's transform back (measured: docs/id-transformer.md).
// Static (each extension its own copy, resolved in it); maybe unused: row_init.cpp needs none.
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define DLRM_CSRC_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DLRM_CSRC_SIMD_CLONES
#endif
[[maybe_unused]] DLRM_CSRC_SIMD_CLONES static bool any_negative(const int64_t* id, int64_t n) {
  uint64_t bits = 0;
  for (int64_t p = 0; p < n; ++p) bits |= uint64_t(id[p]);
  return int64_t(bits) < 0;
}
#undef DLRM_CSRC_SIMD_CLONES  // this header's own: not left for the files that include it

// A fixed-size array on its own anonymous mapping, asking the kernel for 2 MiB pages: the hash
// table and slot states are read at random, and with 4 KiB pages nearly every such read also
// misses the TLB (a page walk of its own). Where huge pages are not granted it works as is.
template <typename T>
class HugeArray {
 public:
  HugeArray() = default;
  HugeArray(size_t n, const T& fill) : n_(n) {
    bytes_ = std::max<size_t>(1, n * sizeof(T));
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    madvise(p, bytes_, MADV_HUGEPAGE);
#endif
    data_ = static_cast<T*>(p);
    std::fill(data_, data_ + n, fill);
  }
  HugeArray(const HugeArray&) = delete;
  HugeArray& operator=(const HugeArray&) = delete;
  HugeArray(HugeArray&& o) noexcept { *this = std::move(o); }
  HugeArray& operator=(HugeArray&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(n_, o.n_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~HugeArray() {
    if (data_) munmap(data_, bytes_);
  }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  size_t size() const { return n_; }

  // Address translations, warmed for a burst of random reads: a prefetch every kTranslationSpan
  // bytes, all in flight at once. In a VM whose host maps the guest's memory by 4 KiB pages, a
  // 2 MiB page of the guest is 512 translations in the TLB all the same, and a miss walks the
  // host's page table too, whose entries (8 bytes a 4 KiB page, so a cache line a 32 KiB span) go
  // cold between batches: 2,048 lines for 64 MiB. One read a span brings each line back, and the
  // reads of the other 4 KiB pages of its span find it. Where translations are 2 MiB, it reads
  // 2,048 lines for nothing. Measured (spans, loads): docs/id-transformer.md, "Warming the
  // table's address translations".
  static constexpr size_t kTranslationSpan = 32768;
  size_t translation_spans() const { return (bytes_ + kTranslationSpan - 1) / kTranslationSpan; }
  void prefetch_translations() const {
    const char* p = reinterpret_cast<const char*>(data_);
    for (size_t off = 0; off < bytes_; off += kTranslationSpan) prefetch_l2(p + off);
  }

 private:
  T* data_ = nullptr;
  size_t n_ = 0;
  size_t bytes_ = 0;
};

}  // namespace dlrm_csrc
