// Attention for decode rows: each row's one query per head against exactly its own sequence's cached keys.
//
// Why: torch's CPU SDPA takes a batch of decode rows as one padded tensor with a mask, reads every row's
// keys up to the longest row's length, and is tuned for long query blocks: 52 us per layer for 8 rows of
// 150 positions on 2 threads, against 28 us here. Each (row, key/value head) is one task: scores of the
// head's query group against the row's own keys, a softmax, and the weighted sum of values, all in float32.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "simd.h"

namespace {

// One (row, key/value head): out[j] = softmax(scale * q[j] . keys) @ values for the group's queries j; V = hd / kWidth,
// a compile-time count so that a key, a value and the accumulators stay in registers.
template <int V>
void attend(const float* q, const float* keys, const float* values, int64_t length, int64_t group, float scale, float* out,
            std::vector<float>& scores) {
  using namespace simd;
  constexpr int64_t hd = kWidth * V;
  scores.resize(static_cast<size_t>(group * length));
  for (int64_t t = 0; t < length; ++t) {
    Float key[V];
    for (int c = 0; c < V; ++c) key[c] = load(keys + t * hd + kWidth * c);
    for (int64_t j = 0; j < group; ++j) {
      Float dot = mul(key[0], load(q + j * hd));
      for (int c = 1; c < V; ++c) dot = fmadd(key[c], load(q + j * hd + kWidth * c), dot);
      scores[j * length + t] = scale * sum(dot);
    }
  }
  for (int64_t j = 0; j < group; ++j) {
    float* s = scores.data() + j * length;
    Float best = set1(-INFINITY);
    for (int64_t t = 0; t < length; t += kWidth) best = max(best, load_first(s + t, length - t, -INFINITY));
    const Float top = set1(largest(best));
    Float total = zero();
    for (int64_t t = 0; t < length; t += kWidth) {
      const Float e = exp_nonpositive(sub(load_first(s + t, length - t, -INFINITY), top));  // past the end: e^-87, nothing beside the top score's 1
      store_first(s + t, e, length - t);
      total = add(total, e);
    }
    const Float inverse = set1(1.0f / sum(total));
    Float acc[V];
    for (int c = 0; c < V; ++c) acc[c] = zero();
    for (int64_t t = 0; t < length; ++t) {
      const Float p = set1(s[t]);
      for (int c = 0; c < V; ++c) acc[c] = fmadd(p, load(values + t * hd + kWidth * c), acc[c]);
    }
    for (int c = 0; c < V; ++c) store(out + j * hd + kWidth * c, mul(acc[c], inverse));
  }
}

using AttendFn = void (*)(const float*, const float*, const float*, int64_t, int64_t, float, float*, std::vector<float>&);

AttendFn attend_for(int64_t hd) {
  switch (hd) {
    case 32: return attend<32 / simd::kWidth>;
    case 64: return attend<64 / simd::kWidth>;
    case 128: return attend<128 / simd::kWidth>;
    case 256: return attend<256 / simd::kWidth>;
    default: return nullptr;
  }
}

// q [n, H, hd]; keys and values [slots, KV, capacity, hd] (one layer of the cache); row i reads slot slots[i]'s first
// lengths[i] positions. Returns [n, H, hd].
at::Tensor decode_attention(const at::Tensor& q_in, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& slots_in,
                            const at::Tensor& lengths_in, double scale) {
  TORCH_CHECK(q_in.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat && values.scalar_type() == at::kFloat,
              "decode_attention: float32 only");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.sizes() == values.sizes() && keys.dim() == 4,
              "decode_attention: keys and values must be contiguous [slots, KV, capacity, hd]");
  const at::Tensor q = q_in.contiguous();
  const at::Tensor slots = slots_in.to(at::kLong).contiguous();
  const at::Tensor lengths = lengths_in.to(at::kLong).contiguous();
  const int64_t n = q.size(0), heads = q.size(1), hd = q.size(2);
  const int64_t kv_heads = keys.size(1), capacity = keys.size(2);
  const AttendFn attend_row = attend_for(hd);
  TORCH_CHECK(keys.size(3) == hd && attend_row != nullptr, "decode_attention: head_dim must be 32, 64, 128 or 256");
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "decode_attention: query heads must be a multiple of key/value heads");
  TORCH_CHECK(slots.numel() == n && lengths.numel() == n, "decode_attention: one slot and one length per row");
  const int64_t group = heads / kv_heads;
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t* lp = lengths.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(sp[i] >= 0 && sp[i] < keys.size(0) && lp[i] >= 1 && lp[i] <= capacity, "decode_attention: row ", i, " is outside the cache");
  }
  at::Tensor out = at::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = keys.data_ptr<float>();
  const float* vp = values.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / kv_heads, h = task % kv_heads;
      const int64_t base = (sp[i] * kv_heads + h) * capacity * hd;
      attend_row(qp + (i * heads + h * group) * hd, kp + base, vp + base, lp[i], group, static_cast<float>(scale),
                 op + (i * heads + h * group) * hd, scores);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(roundtrip, m) {
  m.def("decode_attention(Tensor q, Tensor keys, Tensor values, Tensor slots, Tensor lengths, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(roundtrip, CPU, m) { m.impl("decode_attention", &decode_attention); }
