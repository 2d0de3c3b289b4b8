// One float vector type for the kernels, so that each is written once and compiled for the CPU at hand.
//
// Why: the machines this runs on differ (an Intel with AVX512 and AMX one day, an AMD EPYC with only AVX2 the next).
// The library is compiled for one instruction set (`inference.cpu_kernels.ISAS` picks the best this CPU has), and this
// header maps the operations the kernels need onto it: 16 lanes with AVX512, 8 with AVX2.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace simd {

// IEEE half-precision bits (a KV cache in float16): loaded into float lanes and stored back rounded to nearest even,
// as torch's own float32 -> float16 conversion rounds, so a value stored here has the bits `Tensor.to(float16)` gives.
using Half = uint16_t;

#if defined(__AVX512F__)

constexpr int64_t kWidth = 16;
using Float = __m512;

inline Float zero() { return _mm512_setzero_ps(); }
inline Float set1(float v) { return _mm512_set1_ps(v); }
inline Float load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, Float v) { _mm512_storeu_ps(p, v); }
inline Float load(const Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline void store(Half* p, Float v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }
inline __mmask16 lanes(int64_t n) { return n >= kWidth ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1); }
// The first min(n, kWidth) floats at p; `fill` in the other lanes.
inline Float load_first(const float* p, int64_t n, float fill) { return _mm512_mask_loadu_ps(set1(fill), lanes(n), p); }
inline void store_first(float* p, Float v, int64_t n) { _mm512_mask_storeu_ps(p, lanes(n), v); }
inline Float add(Float a, Float b) { return _mm512_add_ps(a, b); }
inline Float sub(Float a, Float b) { return _mm512_sub_ps(a, b); }
inline Float mul(Float a, Float b) { return _mm512_mul_ps(a, b); }
inline Float max(Float a, Float b) { return _mm512_max_ps(a, b); }
inline Float min(Float a, Float b) { return _mm512_min_ps(a, b); }
inline Float div(Float a, Float b) { return _mm512_div_ps(a, b); }
inline Float where_negative(Float x, Float yes, Float no) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, zero(), _CMP_LT_OQ), no, yes); }
// Lanes 2i and 2i + 1 swapped.
inline Float swap_pairs(Float v) { return _mm512_permute_ps(v, 0xB1); }
// Even lanes from a, odd lanes from b.
inline Float odd_from(Float a, Float b) { return _mm512_mask_blend_ps(0xAAAA, a, b); }
inline Float fmadd(Float a, Float b, Float c) { return _mm512_fmadd_ps(a, b, c); }     // a b + c
inline Float fnmadd(Float a, Float b, Float c) { return _mm512_fnmadd_ps(a, b, c); }   // c - a b
inline Float round(Float v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline float sum(Float v) { return _mm512_reduce_add_ps(v); }
inline float largest(Float v) { return _mm512_reduce_max_ps(v); }
// The sums of a, b, c and d, in that order.
inline __m128 sum4(Float a, Float b, Float c, Float d) {
  const auto half = [](Float v) { return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))); };
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(half(a), half(b)), _mm256_hadd_ps(half(c), half(d)));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}
// Bit i set where lane i of v is at least `floor`.
inline unsigned at_least(Float v, float floor) { return _mm512_cmp_ps_mask(v, set1(floor), _CMP_GE_OQ); }
// 2^n for whole n in [-126, 127], built in the exponent bits.
inline Float pow2(Float n) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23)); }

#elif defined(__AVX2__)

constexpr int64_t kWidth = 8;
using Float = __m256;

inline Float zero() { return _mm256_setzero_ps(); }
inline Float set1(float v) { return _mm256_set1_ps(v); }
inline Float load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, Float v) { _mm256_storeu_ps(p, v); }
inline Float load(const Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline void store(Half* p, Float v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }
inline __m256i lanes(int64_t n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n < kWidth ? n : kWidth)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
inline Float load_first(const float* p, int64_t n, float fill) {
  const __m256i m = lanes(n);
  return _mm256_blendv_ps(set1(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
}
inline void store_first(float* p, Float v, int64_t n) { _mm256_maskstore_ps(p, lanes(n), v); }
inline Float add(Float a, Float b) { return _mm256_add_ps(a, b); }
inline Float sub(Float a, Float b) { return _mm256_sub_ps(a, b); }
inline Float mul(Float a, Float b) { return _mm256_mul_ps(a, b); }
inline Float max(Float a, Float b) { return _mm256_max_ps(a, b); }
inline Float min(Float a, Float b) { return _mm256_min_ps(a, b); }
inline Float div(Float a, Float b) { return _mm256_div_ps(a, b); }
inline Float where_negative(Float x, Float yes, Float no) { return _mm256_blendv_ps(no, yes, _mm256_cmp_ps(x, zero(), _CMP_LT_OQ)); }
inline Float swap_pairs(Float v) { return _mm256_permute_ps(v, 0xB1); }
inline Float odd_from(Float a, Float b) { return _mm256_blend_ps(a, b, 0xAA); }
inline Float fmadd(Float a, Float b, Float c) { return _mm256_fmadd_ps(a, b, c); }
inline Float fnmadd(Float a, Float b, Float c) { return _mm256_fnmadd_ps(a, b, c); }
inline Float round(Float v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline float sum(Float v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
// The sums of a, b, c and d, in that order: three horizontal adds leave [a b c d] in each half, partly summed.
inline __m128 sum4(Float a, Float b, Float c, Float d) {
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}
inline float largest(Float v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
inline unsigned at_least(Float v, float floor) { return static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(v, set1(floor), _CMP_GE_OQ))); }
inline Float pow2(Float n) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23)); }

#else
#error "Roundtrip's CPU kernels need AVX2 or AVX512"
#endif

// e^x for x <= 0 (Cephes' polynomial on [-ln2/2, ln2/2], scaled by 2^n); about 1e-7 relative error.
inline Float exp_nonpositive(Float x) {
  x = max(x, set1(-87.0f));
  const Float n = round(mul(x, set1(1.44269504088896341f)));
  Float f = fnmadd(n, set1(0.693359375f), x);
  f = fnmadd(n, set1(-2.12194440e-4f), f);
  Float p = set1(1.9875691500e-4f);
  p = fmadd(p, f, set1(1.3981999507e-3f));
  p = fmadd(p, f, set1(8.3334519073e-3f));
  p = fmadd(p, f, set1(4.1665795894e-2f));
  p = fmadd(p, f, set1(1.6666665459e-1f));
  p = fmadd(p, f, set1(5.0000001201e-1f));
  p = fmadd(p, mul(f, f), add(f, set1(1.0f)));
  return mul(p, pow2(n));
}

}  // namespace simd
