// Attention for decode rows: each row's one query per head against exactly its own sequence's cached keys.
//
// Why: torch's CPU SDPA takes a batch of decode rows as one padded tensor with a mask, reads every row's
// keys up to the longest row's length, and is tuned for long query blocks: 52 us per layer for 8 rows of
// 150 positions on 2 threads, against 28 us here. Each (row, key/value head) is one task: scores of the
// head's query group against the row's own keys, a softmax, and the weighted sum of values, all in float32.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cmath>
#include <vector>

namespace {

// e^x for x <= 0 (Cephes' polynomial on [-ln2/2, ln2/2], scaled by 2^n); about 1e-7 relative error.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  f = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), f);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(f, f), _mm512_add_ps(f, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 tail_mask(int64_t remaining) { return remaining >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << remaining) - 1); }

// One (row, key/value head): out[j] = softmax(scale * q[j] . keys) @ values for the group's queries j; V = hd / 16,
// a compile-time count so that a key, a value and the accumulators stay in registers.
template <int V>
void attend(const float* q, const float* keys, const float* values, int64_t length, int64_t group, float scale, float* out,
            std::vector<float>& scores) {
  constexpr int64_t hd = 16 * V;
  scores.resize(static_cast<size_t>(group * length));
  for (int64_t t = 0; t < length; ++t) {
    __m512 key[V];
    for (int c = 0; c < V; ++c) key[c] = _mm512_loadu_ps(keys + t * hd + 16 * c);
    for (int64_t j = 0; j < group; ++j) {
      __m512 dot = _mm512_mul_ps(key[0], _mm512_loadu_ps(q + j * hd));
      for (int c = 1; c < V; ++c) dot = _mm512_fmadd_ps(key[c], _mm512_loadu_ps(q + j * hd + 16 * c), dot);
      scores[j * length + t] = scale * _mm512_reduce_add_ps(dot);
    }
  }
  for (int64_t j = 0; j < group; ++j) {
    float* s = scores.data() + j * length;
    __m512 best = _mm512_set1_ps(-INFINITY);
    for (int64_t t = 0; t < length; t += 16) best = _mm512_max_ps(best, _mm512_mask_loadu_ps(best, tail_mask(length - t), s + t));
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(best));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < length; t += 16) {
      const __mmask16 m = tail_mask(length - t);
      const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + t), top));
      _mm512_mask_storeu_ps(s + t, m, e);
      sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
    }
    const __m512 inverse = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    __m512 acc[V];
    for (int c = 0; c < V; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < length; ++t) {
      const __m512 p = _mm512_set1_ps(s[t]);
      for (int c = 0; c < V; ++c) acc[c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(values + t * hd + 16 * c), acc[c]);
    }
    for (int c = 0; c < V; ++c) _mm512_storeu_ps(out + j * hd + 16 * c, _mm512_mul_ps(acc[c], inverse));
  }
}

using AttendFn = void (*)(const float*, const float*, const float*, int64_t, int64_t, float, float*, std::vector<float>&);

AttendFn attend_for(int64_t hd) {
  switch (hd) {
    case 32: return attend<2>;
    case 64: return attend<4>;
    case 128: return attend<8>;
    case 256: return attend<16>;
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
