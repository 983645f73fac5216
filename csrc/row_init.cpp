// The embedding tables' init on the host, one pass (model/embeddings.py init_values): element
// (r, c) of table rows is splitmix64's finaliser of key + (r * table_dim + c) * golden gamma, its
// top 24 bits u / 2^24 mapped to -b + 2b * u in double, then rounded to float.
//
// model/embeddings.py computes the same with torch's element-wise ops, a dozen passes over an
// int64 scratch the size of the block; a dynamic table initialises every id it admits that was
// never seen, some 17,000 rows of 128 floats a batch for mlperf-ids's hottest table, and there
// those passes took 40-60 ms. This is the loop they stand for. It must give the same bits as
// they do: the arithmetic is unsigned 64-bit (the torch form's masks make its shifts logical),
// and -ffp-contract=off (setup.py) keeps u * 2b - b two roundings, as torch's two ops are: a
// fused multiply-add (where -march allows one) could move the double's last bit, and so,
// rarely, the float's.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include "hash_memory.h"

#include <cstdint>
#include <stdexcept>

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

// (len(rows), cols) float32: the init of `rows` (int64) x columns col_start .. col_start + cols.
at::Tensor init_values(const at::Tensor& rows_in, int64_t col_start, int64_t cols, int64_t table_dim, int64_t key,
                       double b) {
  if (rows_in.scalar_type() != at::kLong || !rows_in.device().is_cpu()) {
    throw std::invalid_argument("row init: rows must be an int64 CPU tensor");
  }
  if (cols < 0 || col_start < 0 || table_dim < 1) {
    throw std::invalid_argument("row init: needs cols >= 0, col_start >= 0, table_dim >= 1");
  }
  const at::Tensor rows = rows_in.contiguous().view(-1);
  const int64_t n = rows.numel();
  at::Tensor out = at::empty({n, cols}, at::kFloat);
  const int64_t* r = rows.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  const double two_b = 2 * b;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t first = uint64_t(r[i]) * uint64_t(table_dim) + uint64_t(col_start);
    for (int64_t c = 0; c < cols; ++c) {
      const uint64_t z = dlrm_csrc::mix((first + uint64_t(c)) * kGolden + uint64_t(key));
      const double u = double((z >> 40) & 0xFFFFFF) / double(1 << 24);
      o[i * cols + c] = float(u * two_b - b);
    }
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "The embedding tables' init on the host (csrc/row_init.cpp)";
  namespace py = pybind11;
  m.def("init_values", &init_values, py::arg("rows"), py::arg("col_start"), py::arg("cols"), py::arg("table_dim"),
        py::arg("key"), py::arg("b"), py::call_guard<py::gil_scoped_release>());
}
