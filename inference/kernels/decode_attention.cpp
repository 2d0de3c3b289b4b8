// Attention for decode rows: each row's one query per head against exactly its own sequence's cached keys.
//
// Why: torch's CPU SDPA takes a batch of decode rows as one padded tensor with a mask, reads every row's
// keys up to the longest row's length, and is tuned for long query blocks: 52 us per layer for 8 rows of
// 150 positions on 2 threads, against 28 us here. Each (row, key/value head) is one task: scores of the
// head's query group against the row's own keys, a softmax, and the weighted sum of values, computed in float32.
// The cache may hold float32 or float16 (`simd::Half`): a decode step reads every row's whole cache in every layer,
// and at 8 rows of 150 positions that read was a quarter of the step; half the bytes, half the read. A float16 key or
// value costs a conversion per load, so each is converted once for all of its group's queries (GQA: 3 per key/value
// head here), not once per query: 30 layers of 8 rows x 150 positions 1.38 -> 1.13 ms, 16 x 200 3.60 -> 2.78 ms on a
// Zen 4 (2 threads), with the same bits.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <type_traits>
#include <vector>

#include "simd.h"

namespace {

// Registers a pass may fill: 32 vector registers with AVX-512, 16 with AVX2.
constexpr int kRegisters = simd::kWidth == 16 ? 32 : 16;

// Scores of J queries of the group (q, hd floats apart) against keys t..t+3, into scores (length floats apart). A key
// is converted from the cache's type once for all J queries: four independent chains of multiply-adds per query and
// one shared reduction (sum4), instead of a chain and a full horizontal sum per key, which left the CPU waiting on
// latencies (about 100 cycles per key on a Zen 3 core, now about a quarter of that).
template <typename T, int V, int J>
inline void score_four(const float* q, const T* k, float scale, float* scores, int64_t length) {
  using namespace simd;
  constexpr int64_t hd = kWidth * V;
  Float d[J][4];
  for (int j = 0; j < J; ++j) d[j][0] = d[j][1] = d[j][2] = d[j][3] = zero();
  for (int c = 0; c < V; ++c) {
    const Float k0 = load(k + kWidth * c), k1 = load(k + hd + kWidth * c), k2 = load(k + 2 * hd + kWidth * c), k3 = load(k + 3 * hd + kWidth * c);
    for (int j = 0; j < J; ++j) {
      const Float qc = load(q + j * hd + kWidth * c);
      d[j][0] = fmadd(k0, qc, d[j][0]);
      d[j][1] = fmadd(k1, qc, d[j][1]);
      d[j][2] = fmadd(k2, qc, d[j][2]);
      d[j][3] = fmadd(k3, qc, d[j][3]);
    }
  }
  for (int j = 0; j < J; ++j) _mm_storeu_ps(scores + j * length, _mm_mul_ps(_mm_set1_ps(scale), sum4(d[j][0], d[j][1], d[j][2], d[j][3])));
}

// out[j] += sum over u of p[j][u] values[u] for J queries (their weights p, length floats apart): a value is converted
// once for all J queries, and each query's sum runs over u in order.
template <typename T, int V, int J>
inline void weigh_values(const float* p, const T* values, int64_t length, simd::Float (&acc)[J][V]) {
  using namespace simd;
  constexpr int64_t hd = kWidth * V;
  for (int64_t u = 0; u < length; ++u) {
    Float v[V];
    for (int c = 0; c < V; ++c) v[c] = load(values + u * hd + kWidth * c);
    for (int j = 0; j < J; ++j) {
      const Float w = set1(p[j * length + u]);
      for (int c = 0; c < V; ++c) acc[j][c] = fmadd(w, v[c], acc[j][c]);
    }
  }
}

// As many queries per pass as registers allow: scores keep 4 keys and 4 sums per query, values V vectors and V sums
// per query.
constexpr int kScoreQueries = (kRegisters - 6) / 4 < 4 ? (kRegisters - 6) / 4 : 4;
template <int V>
constexpr int kValueQueries = (kRegisters - V - 2) / V < 1 ? 1 : ((kRegisters - V - 2) / V > 4 ? 4 : (kRegisters - V - 2) / V);

// The group's queries in passes of Most (and one shorter pass for the rest); Pass<J>::run(j0, ...) does queries j0..j0+J-1.
template <int Most, template <int> class Pass, typename... Args>
inline void in_passes(int64_t group, Args&&... args) {
  int64_t j = 0;
  for (; j + Most <= group; j += Most) Pass<Most>::run(j, args...);
  switch (group - j) {
    case 3: if constexpr (Most > 3) Pass<3>::run(j, args...); break;
    case 2: if constexpr (Most > 2) Pass<2>::run(j, args...); break;
    case 1: if constexpr (Most > 1) Pass<1>::run(j, args...); break;
    default: break;
  }
}

template <typename T, int V>
struct Scores {
  template <int J>
  struct Pass {
    static void run(int64_t j0, const float* q, const T* keys, int64_t length, float scale, float* scores) {
      constexpr int64_t hd = simd::kWidth * V;
      int64_t t = 0;
      for (; t + 4 <= length; t += 4) score_four<T, V, J>(q + j0 * hd, keys + t * hd, scale, scores + j0 * length + t, length);
      for (; t < length; ++t) {
        for (int64_t j = j0; j < j0 + J; ++j) {
          simd::Float dot = simd::zero();
          for (int c = 0; c < V; ++c) dot = simd::fmadd(simd::load(keys + t * hd + simd::kWidth * c), simd::load(q + j * hd + simd::kWidth * c), dot);
          scores[j * length + t] = scale * simd::sum(dot);
        }
      }
    }
  };
};

template <typename T, int V>
struct Values {
  template <int J>
  struct Pass {
    static void run(int64_t j0, const float* scores, const T* values, int64_t length, const float* inverse, float* out) {
      constexpr int64_t hd = simd::kWidth * V;
      simd::Float acc[J][V];
      for (int j = 0; j < J; ++j) for (int c = 0; c < V; ++c) acc[j][c] = simd::zero();
      weigh_values<T, V, J>(scores + j0 * length, values, length, acc);
      for (int j = 0; j < J; ++j) {
        for (int c = 0; c < V; ++c) simd::store(out + (j0 + j) * hd + simd::kWidth * c, simd::mul(acc[j][c], simd::set1(inverse[j0 + j])));
      }
    }
  };
};

// Each score row into softmax weights, left unnormalized: e^(s - max), and 1 / their sum in inverse.
inline void exponentiate(float* s, int64_t length, float* inverse) {
  using namespace simd;
  const int64_t whole = length - length % kWidth;  // full vectors of scores; the rest is read and written masked
  Float best = set1(-INFINITY);
  for (int64_t u = 0; u < whole; u += kWidth) best = max(best, load(s + u));
  if (whole < length) best = max(best, load_first(s + whole, length - whole, -INFINITY));
  const Float top = set1(largest(best));
  Float total = zero();
  for (int64_t u = 0; u < whole; u += kWidth) {
    const Float e = exp_nonpositive(sub(load(s + u), top));
    store(s + u, e);
    total = add(total, e);
  }
  if (whole < length) {
    const Float e = exp_nonpositive(sub(load_first(s + whole, length - whole, -INFINITY), top));  // past the end: e^-87, nothing beside the top score's 1
    store_first(s + whole, e, length - whole);
    total = add(total, e);
  }
  *inverse = 1.0f / sum(total);
}

// One (row, key/value head): out[j] = softmax(scale * q[j] . keys) @ values for the group's queries j, in float32;
// V = hd / kWidth, a compile-time count so that keys, values and the sums stay in registers. Each key and value is
// read and converted once for as many of the group's queries as the registers hold.
template <typename T, int V>
void attend(const float* q, const T* keys, const T* values, int64_t length, int64_t group, float scale, float* out,
            std::vector<float>& scores) {
  scores.resize(static_cast<size_t>(group * length + group));
  float* inverse = scores.data() + group * length;
  in_passes<kScoreQueries, Scores<T, V>::template Pass>(group, q, keys, length, scale, scores.data());
  for (int64_t j = 0; j < group; ++j) exponentiate(scores.data() + j * length, length, inverse + j);
  in_passes<kValueQueries<V>, Values<T, V>::template Pass>(group, scores.data(), values, length, static_cast<const float*>(inverse), out);
}

template <typename T>
using AttendFn = void (*)(const float*, const T*, const T*, int64_t, int64_t, float, float*, std::vector<float>&);

template <typename T>
AttendFn<T> attend_for(int64_t hd) {
  switch (hd) {
    case 32: return attend<T, 32 / simd::kWidth>;
    case 64: return attend<T, 64 / simd::kWidth>;
    case 128: return attend<T, 128 / simd::kWidth>;
    case 256: return attend<T, 256 / simd::kWidth>;
    default: return nullptr;
  }
}

// The cache's elements as the kernels read and write them: float, or float16 bits.
template <typename T>
T* cache_data(const at::Tensor& t) {
  if constexpr (std::is_same_v<T, float>) {
    return t.data_ptr<float>();
  } else {
    return reinterpret_cast<T*>(t.data_ptr<at::Half>());
  }
}

// Every row's heads against its own slot's first lengths[i] positions (with a window above 0, only the last `window`
// of them: a sliding-window layer's): q [n, H, hd] at qp, out [n, H, hd] at op.
template <typename T>
void attend_rows_as(const float* qp, const at::Tensor& keys, const at::Tensor& values, const int64_t* sp, const int64_t* lp, int64_t n,
                 int64_t heads, float scale, int64_t window, float* op) {
  const int64_t kv_heads = keys.size(1), capacity = keys.size(2), hd = keys.size(3), group = heads / kv_heads;
  const AttendFn<T> attend_row = attend_for<T>(hd);
  const T* kp = cache_data<T>(keys);
  const T* vp = cache_data<T>(values);
  at::parallel_for(0, n * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / kv_heads, h = task % kv_heads;
      const int64_t first = window > 0 ? std::max<int64_t>(0, lp[i] - window) : 0;
      const int64_t base = ((sp[i] * kv_heads + h) * capacity + first) * hd;
      attend_row(qp + (i * heads + h * group) * hd, kp + base, vp + base, lp[i] - first, group, scale, op + (i * heads + h * group) * hd,
                 scores);
    }
  });
}

void attend_rows(const float* qp, const at::Tensor& keys, const at::Tensor& values, const int64_t* sp, const int64_t* lp, int64_t n,
                 int64_t heads, float scale, int64_t window, float* op) {
  if (keys.scalar_type() == at::kHalf) {
    attend_rows_as<simd::Half>(qp, keys, values, sp, lp, n, heads, scale, window, op);
  } else {
    attend_rows_as<float>(qp, keys, values, sp, lp, n, heads, scale, window, op);
  }
}

void check_cache(const at::Tensor& keys, const at::Tensor& values, int64_t heads, int64_t hd) {
  TORCH_CHECK((keys.scalar_type() == at::kFloat || keys.scalar_type() == at::kHalf) && values.scalar_type() == keys.scalar_type(),
              "decode_attention: the cache must be float32 or float16, keys and values alike");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.sizes() == values.sizes() && keys.dim() == 4,
              "decode_attention: keys and values must be contiguous [slots, KV, capacity, hd]");
  TORCH_CHECK(keys.size(3) == hd && attend_for<float>(hd) != nullptr, "decode_attention: head_dim must be 32, 64, 128 or 256");
  TORCH_CHECK(keys.size(1) > 0 && heads % keys.size(1) == 0, "decode_attention: query heads must be a multiple of key/value heads");
}

void check_rows(const at::Tensor& keys, const int64_t* sp, const int64_t* lp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(sp[i] >= 0 && sp[i] < keys.size(0) && lp[i] >= 1 && lp[i] <= keys.size(2), "decode_attention: row ", i, " is outside the cache");
  }
}

// q [n, H, hd]; keys and values [slots, KV, capacity, hd] (one layer of the cache); row i reads slot slots[i]'s first
// lengths[i] positions (the last `window` of them when window > 0). Returns [n, H, hd].
at::Tensor decode_attention(const at::Tensor& q_in, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& slots_in,
                            const at::Tensor& lengths_in, double scale, int64_t window) {
  TORCH_CHECK(q_in.scalar_type() == at::kFloat, "decode_attention: float32 only");
  const at::Tensor q = q_in.contiguous();
  const at::Tensor slots = slots_in.to(at::kLong).contiguous();
  const at::Tensor lengths = lengths_in.to(at::kLong).contiguous();
  const int64_t n = q.size(0);
  check_cache(keys, values, q.size(1), q.size(2));
  TORCH_CHECK(slots.numel() == n && lengths.numel() == n, "decode_attention: one slot and one length per row");
  check_rows(keys, slots.data_ptr<int64_t>(), lengths.data_ptr<int64_t>(), n);
  at::Tensor out = at::empty_like(q);
  attend_rows(q.data_ptr<float>(), keys, values, slots.data_ptr<int64_t>(), lengths.data_ptr<int64_t>(), n, q.size(1), static_cast<float>(scale),
              window, out.data_ptr<float>());
  return out;
}

// RoPE on one head: pairs (x[2p], x[2p + 1]) of its first 2 R features turned by (cos, sin) = rotation[2p], rotation[2p + 1],
// the rest copied; 2 R is a multiple of the vector width. Each result is one rounding of two rounded products, as in
// torch's complex multiply (the library is built without contracting products into fused multiply-adds, and written
// with intrinsics so that the compiler does not recognize a complex multiply), so a key stored here has the same bits
// as one rotated by `inference.model.apply_rope` (and, into a float16 cache, rounded as `Tensor.to(float16)` rounds).
template <typename T>
void rotate(const float* x, const float* rotation, int64_t R, int64_t hd, T* out) {
  using namespace simd;
  for (int64_t d = 0; d < 2 * R; d += kWidth) {
    const Float v = load(x + d), r = load(rotation + d);
    const Float ac_bs = mul(v, r), as_bc = mul(v, swap_pairs(r));  // per pair: (a c, b s) and (a s, b c)
    store(out + d, odd_from(sub(ac_bs, swap_pairs(ac_bs)), add(as_bc, swap_pairs(as_bc))));  // (a c - b s, b c + a s)
  }
  for (int64_t d = 2 * R; d < hd; d += kWidth) store(out + d, load(x + d));
}

// hd floats into the cache's type (hd is a multiple of the vector width).
template <typename T>
void put(const float* x, int64_t hd, T* out) {
  for (int64_t d = 0; d < hd; d += simd::kWidth) simd::store(out + d, simd::load(x + d));
}

// Rotate every row's queries into q; rotate and store its keys, and store its values, in the cache.
template <typename T>
void rotate_and_store(const at::Tensor& qkv, const at::Tensor& rotations, const at::Tensor& keys, const at::Tensor& values, const int64_t* sp,
                      const int64_t* lp, int64_t heads, at::Tensor& q) {
  const int64_t n = qkv.size(0), kv_heads = keys.size(1), capacity = keys.size(2), hd = keys.size(3), R = rotations.size(1);
  const int64_t width = (heads + 2 * kv_heads) * hd;
  const float* xp = qkv.data_ptr<float>();
  const float* rp = rotations.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  T* kp = cache_data<T>(keys);
  T* vp = cache_data<T>(values);
  at::parallel_for(0, n, 8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* row = xp + i * width;
      for (int64_t h = 0; h < heads; ++h) rotate(row + h * hd, rp + i * 2 * R, R, hd, qp + (i * heads + h) * hd);
      for (int64_t h = 0; h < kv_heads; ++h) {
        const int64_t at = ((sp[i] * kv_heads + h) * capacity + lp[i] - 1) * hd;
        rotate(row + (heads + h) * hd, rp + i * 2 * R, R, hd, kp + at);
        put(row + (heads + kv_heads + h) * hd, hd, vp + at);
      }
    }
  });
}

// A decode step's attention from the projection's output to the output projection's input, in one call instead of a
// dozen torch operations per layer (their dispatch cost as much as the attention itself): rotate every row's queries
// and keys, store its keys and values at its position, then attend as `decode_attention` does, row i over positions
// 0..lengths[i] - 1 of its slot (rows of one slot at consecutive positions, a short prompt chunk, see each other as a
// causal prefill would).
// qkv [n, (H + 2 KV) hd]: queries, keys, values per row; rotations [n, R, 2]: (cos, sin) per pair at the row's position;
// keys, values: one layer of the cache [slots, KV, capacity, hd], written in place; row i is the token at position
// lengths[i] - 1 of slot slots[i] (the plan's DecodeRows, as `decode_attention` takes them). Returns [n, H hd].
at::Tensor roped_decode_attention(const at::Tensor& qkv_in, const at::Tensor& rotations_in, const at::Tensor& keys, const at::Tensor& values,
                                  const at::Tensor& slots_in, const at::Tensor& lengths_in, int64_t heads, double scale, int64_t window) {
  TORCH_CHECK(qkv_in.scalar_type() == at::kFloat && rotations_in.scalar_type() == at::kFloat, "roped_decode_attention: float32 only");
  const int64_t kv_heads = keys.size(1), hd = keys.size(3), n = qkv_in.size(0);
  check_cache(keys, values, heads, hd);
  const at::Tensor qkv = qkv_in.contiguous(), rotations = rotations_in.contiguous();
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(1) == (heads + 2 * kv_heads) * hd, "roped_decode_attention: qkv must be [n, (H + 2 KV) hd]");
  const int64_t R = rotations.size(1);
  TORCH_CHECK(rotations.dim() == 3 && rotations.size(0) == n && rotations.size(2) == 2 && 2 * R <= hd && (2 * R) % simd::kWidth == 0,
              "roped_decode_attention: rotations must be [n, R, 2], with 2 R a multiple of ", simd::kWidth, " and at most head_dim");
  const at::Tensor slots = slots_in.to(at::kLong).contiguous();
  const at::Tensor lengths = lengths_in.to(at::kLong).contiguous();
  TORCH_CHECK(slots.numel() == n && lengths.numel() == n, "roped_decode_attention: one slot and one length per row");
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t* lp = lengths.data_ptr<int64_t>();
  check_rows(keys, sp, lp, n);
  at::Tensor q = at::empty({n, heads, hd}, qkv.options());
  if (keys.scalar_type() == at::kHalf) {
    rotate_and_store<simd::Half>(qkv, rotations, keys, values, sp, lp, heads, q);
  } else {
    rotate_and_store<float>(qkv, rotations, keys, values, sp, lp, heads, q);
  }
  at::Tensor out = at::empty({n, heads * hd}, qkv.options());
  attend_rows(q.data_ptr<float>(), keys, values, sp, lp, n, heads, static_cast<float>(scale), window, out.data_ptr<float>());
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(roundtrip, m) {
  m.def("decode_attention(Tensor q, Tensor keys, Tensor values, Tensor slots, Tensor lengths, float scale, int window=0) -> Tensor");
  m.def("roped_decode_attention(Tensor qkv, Tensor rotations, Tensor(a!) keys, Tensor(b!) values, Tensor slots, Tensor lengths, int heads, "
        "float scale, int window=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(roundtrip, CPU, m) {
  m.impl("decode_attention", &decode_attention);
  m.impl("roped_decode_attention", &roped_decode_attention);
}
