// Passes over rows of logits (a 49k vocabulary) that every engine step makes: each row's log-partition and best token,
// and the tokens within a margin of the best.
//
// Why: torch runs these as several full passes with a fresh 8 x 49k temporary each (logsumexp: max, subtract, exp,
// sum, log; max with indices; compare, nonzero), about 1.1 ms of an 8-row decode step on 2 cores; one or two
// vectorized passes per row cost a tenth of that.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "simd.h"

namespace {

// The largest value of row x [V] and the first index that holds it.
std::pair<float, int64_t> best_of(const float* x, int64_t V) {
  using namespace simd;
  Float top = set1(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < V; i += kWidth) top = max(top, load_first(x + i, V - i, -std::numeric_limits<float>::infinity()));
  const float value = largest(top);
  int64_t index = 0;
  while (index < V - 1 && x[index] != value) ++index;
  return {value, index};
}

// log(sum(exp(x))) of row x [V], given its largest value.
float log_partition(const float* x, int64_t V, float largest_value) {
  using namespace simd;
  if (!std::isfinite(largest_value)) return largest_value;
  const Float shift = set1(largest_value);
  Float total = zero();
  for (int64_t i = 0; i < V; i += kWidth) {
    const Float v = load_first(x + i, V - i, -std::numeric_limits<float>::infinity());
    total = add(total, exp_nonpositive(sub(v, shift)));  // -inf lanes (the tail) become e^-87, about 1e-38: nothing
  }
  return largest_value + std::log(sum(total));
}

// (log_z [n] float32, best [n] int64) of logits [n, V].
std::tuple<at::Tensor, at::Tensor> row_summary(const at::Tensor& logits_in) {
  TORCH_CHECK(logits_in.dim() == 2 && logits_in.scalar_type() == at::kFloat, "row_summary: float32 logits [n, V]");
  const at::Tensor logits = logits_in.contiguous();
  const int64_t n = logits.size(0), V = logits.size(1);
  TORCH_CHECK(V > 0, "row_summary: an empty vocabulary");
  at::Tensor log_z = at::empty({n}, logits.options());
  at::Tensor best = at::empty({n}, logits.options().dtype(at::kLong));
  const float* xp = logits.data_ptr<float>();
  float* zp = log_z.data_ptr<float>();
  int64_t* bp = best.data_ptr<int64_t>();
  at::parallel_for(0, n, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const auto [value, index] = best_of(xp + r * V, V);
      bp[r] = index;
      zp[r] = log_partition(xp + r * V, V, value);
    }
  });
  return {log_z, best};
}

// Every (row, token) of logits [n, V] within `margin` of its row's best, row by row and in token order (as
// nonzero() gives them): [m, 2] int64.
at::Tensor near_best(const at::Tensor& logits_in, double margin) {
  TORCH_CHECK(logits_in.dim() == 2 && logits_in.scalar_type() == at::kFloat, "near_best: float32 logits [n, V]");
  const at::Tensor logits = logits_in.contiguous();
  const int64_t n = logits.size(0), V = logits.size(1);
  const float* xp = logits.data_ptr<float>();
  std::vector<std::vector<int64_t>> found(n);
  at::parallel_for(0, n, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = xp + r * V;
      const float floor = best_of(x, V).first - static_cast<float>(margin);
      for (int64_t i = 0; i < V; i += simd::kWidth) {
        for (unsigned lanes = simd::at_least(simd::load_first(x + i, V - i, -std::numeric_limits<float>::infinity()), floor);
             lanes != 0; lanes &= lanes - 1) {
          found[r].push_back(i + __builtin_ctz(lanes));
        }
      }
    }
  });
  int64_t m = 0;
  for (const auto& row : found) m += static_cast<int64_t>(row.size());
  at::Tensor out = at::empty({m, 2}, logits.options().dtype(at::kLong));
  int64_t* op = out.data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    for (const int64_t token : found[r]) {
      *op++ = r;
      *op++ = token;
    }
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(roundtrip, m) {
  m.def("row_summary(Tensor logits) -> (Tensor, Tensor)");
  m.def("near_best(Tensor logits, float margin) -> Tensor");
}

TORCH_LIBRARY_IMPL(roundtrip, CPU, m) {
  m.impl("row_summary", &row_summary);
  m.impl("near_best", &near_best);
}
