// int4 weights x int8 activations: one kernel whose cost grows slowly from 1 row to a decode batch.
//
// Why: torch's eager int4 kernel decodes every weight again for each block of 4 rows, so a batched
// decode step of 8 rows costs twice one row's. Here each weight vector is unpacked once and multiplied
// into every row of a tile of rows of codes: with AVX512-VNNI (VPDPBUSD: unsigned 4-bit codes x signed 8-bit
// activations, summed in 32 bits) 8 rows at a time; with AVX2 (VPMADDUBSW into 16-bit sums, widened once per
// group by VPMADDWD) 4 rows at a time. Activations are rounded to int8 per group of 32, as llama.cpp does, or,
// asked for, to two int8 parts each (see quantize_rows): twice the multiplies, float32's results within about 1e-4.
// Built for a CPU with AMX, batches from a row count measured at load time (q4_mm_amx_from) go through the tile unit
// instead (amx_panel): one TDPBSUD multiplies a group of 32 inputs for up to 16 rows and 16 outputs, so a row costs
// little more than its share of the scaling. Its 32-bit sums are the very integers VPDPBUSD makes, scaled in the same
// order, so both paths give the same bits.
//
// Weight layout (built by inference/cpu_kernels.py), one byte stream per block of 16 outputs:
//   [N/16, K/32, 320] bytes; for each group of 32 inputs:
//     4 x 64 bytes of codes: for quad qd, output n, byte j: code[k = 8 qd + j] | code[k = 8 qd + 4 + j] << 4
//     16 fp16 scales, then 16 fp16 minimums (w = code * scale + minimum, GGUF's Q4_1)
// Every output row of x is computed the same way whatever the other rows are: a row's result does not
// depend on the batch it was multiplied in.
//
// q8_mm is the same multiply for weights of up to 8 bits (GGUF's Q5_0, Q5_1, Q8_0 and the 5- and 6-bit K-quants),
// one unsigned byte per code, laid out [N/16, K/32, 576]: for each group of 32 inputs, 8 x 64 bytes of codes (for
// input quad j, output n, byte b: code[k = 4 j + b]), then the 16 fp16 scales and 16 fp16 minimums. Its codes are
// VPDPBUSD's bytes as they are (no nibbles to spread). With AVX2, VPMADDUBSW's 16-bit sums would saturate on 8-bit
// codes: each byte is split into its nibbles, multiplied as q4's are, and the two sums joined in 32 bits (byte_tile).
//
// q6_mm runs GGUF's Q6_K exactly: a scale per 16 weights, w = scale * c with signed codes c = q - 32. Its layout per
// group of 32 inputs: the 8 x 64 bytes of codes (int8, as q8_mm's), 16 float32 scales of the first 16 inputs, 16 of
// the last 16 (d * sc: exact in float32), and per output the sums of its codes over each half (int16). VPDPBUSD wants
// its unsigned operand from a register: each row's 4 activations are broadcast and offset by 128 into unsigned bytes,
// and 128 x the code sums taken back, so each half's sum is the exact integer sum of code x activation.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <utility>

#if defined(__AMX_INT8__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "simd.h"

namespace {

constexpr int64_t kBlockN = 16;
constexpr int64_t kGroup = 32;
constexpr int64_t kBlockBytes = 4 * 64 + 2 * 32;
// bytes of one group of a block of 16 outputs, and where its scales start, by code width
template <int Bits>
constexpr int64_t kGroupBytes = Bits == 4 ? kBlockBytes : Bits == 6 ? 8 * 64 + 2 * 64 + 2 * 32 : 8 * 64 + 2 * 32;
template <int Bits>
constexpr int64_t kCodeBytes = Bits == 4 ? 4 * 64 : 8 * 64;
constexpr int64_t kVectors = kGroup / simd::kWidth;  // float vectors per group

// Stores `rounded` (whole numbers in [-127, 127]) as int8 at q.
inline void store_int8(int8_t* q, simd::Float rounded) {
#if defined(__AVX512F__)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(rounded)));
#else
  const __m256i i = _mm256_cvtps_epi32(rounded);
  const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));  // 8 x int16, in order
  _mm_storel_epi64(reinterpret_cast<__m128i*>(q), _mm_packs_epi16(words, words));
#endif
}

// Rows of x [M, K] to int8 codes in P = `parts` parts each, x ~ q0 * d0 + q1 * d1 per group of 32: part 0 rounds x to
// steps of d0 = max|x| / 127 (llama.cpp's Q8 activations), part 1 rounds what that left (at most d0 / 2) to
// steps of d1 = d0 / 254, about 15 bits in all. Row m's parts are rows P m + p of q [P M, K], scales d [P M, G]
// and d * sum(q) in s [P M, G].
void quantize_rows(const float* x, int64_t rows, int64_t K, int64_t parts, int8_t* q, float* d, float* s) {
  using namespace simd;
  const int64_t G = K / kGroup;
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t g = 0; g < G; ++g) {
      Float v[kVectors];
      Float largest_abs = zero();
      for (int64_t c = 0; c < kVectors; ++c) {
        v[c] = load(x + m * K + g * kGroup + kWidth * c);
        largest_abs = max(largest_abs, max(v[c], sub(zero(), v[c])));
      }
      float scale = largest(largest_abs) / 127.0f;
      for (int64_t part = 0; part < parts; ++part) {
        const int64_t row = parts * m + part;
        const Float inverse = set1(scale > 0.0f ? 1.0f / scale : 0.0f);
        Float codes = zero();
        for (int64_t c = 0; c < kVectors; ++c) {
          const Float rounded = round(mul(v[c], inverse));  // to nearest even
          store_int8(q + row * K + g * kGroup + kWidth * c, rounded);
          codes = add(codes, rounded);
          v[c] = fnmadd(rounded, set1(scale), v[c]);  // what this part left
        }
        d[row * G + g] = scale;
        s[row * G + g] = scale * simd::sum(codes);  // a sum of at most 32 x 127: exact in float
        scale /= 254.0f;
      }
    }
  }
}

#if defined(__AVX512VNNI__)

constexpr int kMaxTile = 8;  // rows of codes per pass over a block of weights

// MT rows of x times one block of 16 outputs of Q6_K (q6_mm's layout): out[m, 0..15] for m < MT.
template <int MT>
inline void six_tile(const uint8_t* w, int64_t G, const int8_t* q, const float* d, int64_t K, float* out, int64_t ldo) {
  __m512 acc[MT];
  for (int m = 0; m < MT; ++m) acc[m] = _mm512_setzero_ps();
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* wg = w + g * kGroupBytes<6>;
    const int8_t* qg = q + g * kGroup;
    __m512i half[2][MT];
    for (int h = 0; h < 2; ++h)
      for (int m = 0; m < MT; ++m) half[h][m] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      const __m512i codes = _mm512_loadu_si512(wg + 64 * j);
      for (int m = 0; m < MT; ++m) {
        int32_t four;
        std::memcpy(&four, qg + m * K + 4 * j, 4);
        const __m512i x = _mm512_xor_si512(_mm512_set1_epi32(four), offset);  // x + 128, unsigned
        half[j / 4][m] = _mm512_dpbusd_epi32(half[j / 4][m], x, codes);
      }
    }
    const __m512 scale_lo = _mm512_loadu_ps(reinterpret_cast<const float*>(wg + 512));
    const __m512 scale_hi = _mm512_loadu_ps(reinterpret_cast<const float*>(wg + 576));
    const __m512i sum_lo = _mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + 640))), 7);
    const __m512i sum_hi = _mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + 672))), 7);
    for (int m = 0; m < MT; ++m) {
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(half[0][m], sum_lo));
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(half[1][m], sum_hi));
      acc[m] = _mm512_fmadd_ps(_mm512_fmadd_ps(lo, scale_lo, _mm512_mul_ps(hi, scale_hi)), _mm512_set1_ps(d[m * G + g]), acc[m]);
    }
  }
  for (int m = 0; m < MT; ++m) _mm512_storeu_ps(out + m * ldo, acc[m]);
}

// MT rows of x times one block of 16 outputs: out[m, 0..15] for m < MT; codes of `Bits` bits (4: nibbles, 8: bytes,
// 6: Q6_K's signed codes with two scales per 32).
template <int MT, int Bits>
inline void tile(const uint8_t* w, int64_t G, const int8_t* q, const float* d, const float* s, int64_t K, float* out,
                 int64_t ldo) {
  if constexpr (Bits == 6) {
    six_tile<MT>(w, G, q, d, K, out, ldo);
    return;
  }
  __m512 acc[MT];
  for (int m = 0; m < MT; ++m) acc[m] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* wg = w + g * kGroupBytes<Bits>;
    const int8_t* qg = q + g * kGroup;
    __m512i dot[MT];
    for (int m = 0; m < MT; ++m) dot[m] = _mm512_setzero_si512();
    if constexpr (Bits == 4) {
      for (int qd = 0; qd < 4; ++qd) {
        const __m512i bytes = _mm512_loadu_si512(wg + 64 * qd);
        const __m512i lo = _mm512_and_si512(bytes, low);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low);
        for (int m = 0; m < MT; ++m) {  // each row's 4 codes broadcast from memory within the multiply ({1to16})
          const int8_t* codes = qg + m * K + 8 * qd;
          asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(dot[m]) : "v"(lo), "m"(*reinterpret_cast<const int32_t*>(codes)));
          asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(dot[m]) : "v"(hi), "m"(*reinterpret_cast<const int32_t*>(codes + 4)));
        }
      }
    } else {
      for (int j = 0; j < 8; ++j) {
        const __m512i bytes = _mm512_loadu_si512(wg + 64 * j);
        for (int m = 0; m < MT; ++m) {
          const int8_t* codes = qg + m * K + 4 * j;
          asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(dot[m]) : "v"(bytes), "m"(*reinterpret_cast<const int32_t*>(codes)));
        }
      }
    }
    const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + kCodeBytes<Bits>)));
    const __m512 minimum = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + kCodeBytes<Bits> + 32)));
    for (int m = 0; m < MT; ++m) {
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[m]), _mm512_mul_ps(scale, _mm512_set1_ps(d[m * G + g])), acc[m]);
      acc[m] = _mm512_fmadd_ps(minimum, _mm512_set1_ps(s[m * G + g]), acc[m]);
    }
  }
  for (int m = 0; m < MT; ++m) _mm512_storeu_ps(out + m * ldo, acc[m]);
}

#else

constexpr int kMaxTile = 4;  // AVX2 has 16 vector registers: 4 rows' sums and accumulators, and a half block of codes

// The codes of 4 inputs of row m (int8) as 16-bit values, repeated across the register: VPMADDWD's other operand.
inline __m256i four_activations(const int8_t* codes) {
  int32_t four;
  std::memcpy(&four, codes, 4);
  return _mm256_broadcastq_epi64(_mm_cvtepi8_epi16(_mm_cvtsi32_si128(four)));
}

// Per-output sums of two registers of pair sums (outputs 0-3 and 4-7, two 32-bit halves each), in output order.
inline __m256i pair_sums(__m256i first, __m256i second) {
  return _mm256_permute4x64_epi64(_mm256_hadd_epi32(first, second), 0xD8);  // [o0 o1 o4 o5 | o2 o3 o6 o7] -> in order
}

// MT rows of x times one block of 16 outputs of byte codes (q8_mm: w = code * scale + minimum), a half block (8 outputs)
// at a time. VPMADDUBSW's 16-bit pair sums would saturate on 8-bit codes (2 x 255 x 127), so each byte is split into
// its two nibbles, code = 16 hi + lo, multiplied as q4's nibbles are (a group's 8 pair sums stay below 30480 in 16
// bits), and the two sums joined exactly in 32 bits: 16 x hi + lo.
template <int MT>
inline void byte_tile(const uint8_t* w, int64_t G, const int8_t* q, const float* d, const float* s, int64_t K, float* out,
                      int64_t ldo) {
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int h = 0; h < 2; ++h) {
    __m256 acc[MT];
    for (int m = 0; m < MT; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* wg = w + g * kGroupBytes<8>;
      const int8_t* qg = q + g * kGroup;
      __m256i lo_dot[MT], hi_dot[MT];
      for (int m = 0; m < MT; ++m) lo_dot[m] = hi_dot[m] = _mm256_setzero_si256();
#pragma GCC unroll 1
      for (int j = 0; j < 8; ++j) {
        const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + 64 * j + 32 * h));
        const __m256i lo = _mm256_and_si256(bytes, low);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
        for (int m = 0; m < MT; ++m) {
          int32_t four;
          std::memcpy(&four, qg + m * K + 4 * j, 4);
          const __m256i x = _mm256_set1_epi32(four);
          lo_dot[m] = _mm256_add_epi16(lo_dot[m], _mm256_maddubs_epi16(lo, x));
          hi_dot[m] = _mm256_add_epi16(hi_dot[m], _mm256_maddubs_epi16(hi, x));
        }
      }
      const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wg + kCodeBytes<8> + 16 * h)));
      const __m256 minimum = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wg + kCodeBytes<8> + 32 + 16 * h)));
      for (int m = 0; m < MT; ++m) {
        const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(lo_dot[m], ones), _mm256_slli_epi32(_mm256_madd_epi16(hi_dot[m], ones), 4));
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scale, _mm256_set1_ps(d[m * G + g])), acc[m]);
        acc[m] = _mm256_fmadd_ps(minimum, _mm256_set1_ps(s[m * G + g]), acc[m]);
      }
    }
    for (int m = 0; m < MT; ++m) _mm256_storeu_ps(out + m * ldo + 8 * h, acc[m]);
  }
}

// MT rows of x times one block of 16 outputs of Q6_K (q6_mm: w = scale * code, signed codes, a float32 scale for each
// half of the group's 32 inputs), a half block at a time: codes and activations widened to 16 bits for VPMADDWD,
// exact in 32 bits.
template <int MT>
inline void six_tile(const uint8_t* w, int64_t G, const int8_t* q, const float* d, int64_t K, float* out, int64_t ldo) {
  for (int h = 0; h < 2; ++h) {
    __m256 acc[MT];
    for (int m = 0; m < MT; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* wg = w + g * kGroupBytes<6>;
      const int8_t* qg = q + g * kGroup;
      __m256i first_four[2][MT], second_four[2][MT];  // per half of the inputs: pair sums of outputs 0-3, of 4-7
      for (int m = 0; m < MT; ++m) {
        first_four[0][m] = first_four[1][m] = second_four[0][m] = second_four[1][m] = _mm256_setzero_si256();
      }
      for (int j = 0; j < 8; ++j) {
        const __m256i first = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wg + 64 * j + 32 * h)));
        const __m256i second = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wg + 64 * j + 32 * h + 16)));
        const int half = j / 4;
        for (int m = 0; m < MT; ++m) {
          const __m256i x = four_activations(qg + m * K + 4 * j);
          first_four[half][m] = _mm256_add_epi32(first_four[half][m], _mm256_madd_epi16(first, x));
          second_four[half][m] = _mm256_add_epi32(second_four[half][m], _mm256_madd_epi16(second, x));
        }
      }
      const __m256 scale_lo = _mm256_loadu_ps(reinterpret_cast<const float*>(wg + 512) + 8 * h);
      const __m256 scale_hi = _mm256_loadu_ps(reinterpret_cast<const float*>(wg + 576) + 8 * h);
      for (int m = 0; m < MT; ++m) {
        const __m256 lo = _mm256_cvtepi32_ps(pair_sums(first_four[0][m], second_four[0][m]));
        const __m256 hi = _mm256_cvtepi32_ps(pair_sums(first_four[1][m], second_four[1][m]));
        acc[m] = _mm256_fmadd_ps(_mm256_fmadd_ps(lo, scale_lo, _mm256_mul_ps(hi, scale_hi)), _mm256_set1_ps(d[m * G + g]), acc[m]);
      }
    }
    for (int m = 0; m < MT; ++m) _mm256_storeu_ps(out + m * ldo + 8 * h, acc[m]);
  }
}

// MT rows of x times one block of 16 outputs, a half block (8 outputs) at a time. VPMADDUBSW sums pairs of code x
// activation products into 16 bits; a group's 8 of them stay below 8 x 2 x 15 x 127 = 30480, so they are added in 16
// bits and widened once per group.
template <int MT, int Bits>
inline void tile(const uint8_t* w, int64_t G, const int8_t* q, const float* d, const float* s, int64_t K, float* out,
                 int64_t ldo) {
  if constexpr (Bits == 8) {
    byte_tile<MT>(w, G, q, d, s, K, out, ldo);
    return;
  }
  if constexpr (Bits == 6) {
    six_tile<MT>(w, G, q, d, K, out, ldo);
    return;
  }
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int h = 0; h < 2; ++h) {
    __m256 acc[MT];
    for (int m = 0; m < MT; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* wg = w + g * kBlockBytes;
      const int8_t* qg = q + g * kGroup;
      __m256i dot[MT];
      for (int m = 0; m < MT; ++m) dot[m] = _mm256_setzero_si256();
#pragma GCC unroll 1
      for (int qd = 0; qd < 4; ++qd) {
        const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + 64 * qd + 32 * h));
        const __m256i lo = _mm256_and_si256(bytes, low);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
        for (int m = 0; m < MT; ++m) {
          int32_t first, second;
          std::memcpy(&first, qg + m * K + 8 * qd, 4);
          std::memcpy(&second, qg + m * K + 8 * qd + 4, 4);
          dot[m] = _mm256_add_epi16(dot[m], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(first)));
          dot[m] = _mm256_add_epi16(dot[m], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(second)));
        }
      }
      const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wg + 256 + 16 * h)));
      const __m256 minimum = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wg + 288 + 16 * h)));
      for (int m = 0; m < MT; ++m) {
        const __m256 products = _mm256_cvtepi32_ps(_mm256_madd_epi16(dot[m], ones));
        acc[m] = _mm256_fmadd_ps(products, _mm256_mul_ps(scale, _mm256_set1_ps(d[m * G + g])), acc[m]);
        acc[m] = _mm256_fmadd_ps(minimum, _mm256_set1_ps(s[m * G + g]), acc[m]);
      }
    }
    for (int m = 0; m < MT; ++m) _mm256_storeu_ps(out + m * ldo + 8 * h, acc[m]);
  }
}

#endif

using TileFn = void (*)(const uint8_t*, int64_t, const int8_t*, const float*, const float*, int64_t, float*, int64_t);

template <int Bits, int... Rows>
constexpr std::array<TileFn, sizeof...(Rows) + 1> tiles(std::integer_sequence<int, Rows...>) {
  return {nullptr, tile<Rows + 1, Bits>...};
}
template <int Bits>  // kTiles<Bits>[rows]: a tile of that many rows
constexpr auto kTiles = tiles<Bits>(std::make_integer_sequence<int, kMaxTile>{});

// Batches of at least this many rows of codes go through the tile unit (0: never). Set by q4_mm_amx_from.
std::atomic<int64_t> amx_from_rows{0};

#if defined(__AMX_INT8__)

constexpr int kAmxRows = 16;  // rows of codes per tile

// Linux lends the tile registers only to a process that asks for them (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA).
bool amx_permitted() {
  static const bool permitted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return permitted;
}

// Tile loads, stores and configuration in inline assembly that tells the compiler they touch memory: GCC 12's
// intrinsics do not, and it dropped the stores they read (a configuration of garbage faults).
template <int Tile>
inline void tile_load(const void* base, int64_t stride) {
  asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "i"(Tile) : "memory");
}
template <int Tile>
inline void tile_store(void* base, int64_t stride) {
  asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride), "i"(Tile) : "memory");
}

// One block of outputs for one group: sums tile `Sums` = codes of x (tmm0, already loaded) x weights tile `Weights`.
template <int Sums, int Weights>
inline void multiply_block(const uint8_t* weights, int32_t* sums) {
  asm volatile("tilezero %%tmm%c0" ::"i"(Sums));
  tile_load<Weights>(weights, 64);
  asm volatile("tdpbsud %%tmm%c0, %%tmm0, %%tmm%c1" ::"i"(Weights), "i"(Sums));  // sums += codes of x (tmm0) . weights
  tile_store<Sums>(sums, 64);
}

struct TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// The tiles amx_panel uses for `rows` rows of codes: tmm0, the codes of x for a group [rows, 32] int8; tmm1..3, sums
// [rows, 16 outputs] int32 for up to 3 blocks of outputs; tmm4..6, those blocks' weights [8 quads, 16 outputs x 4 codes]
// uint8 (TDPBSUD's layout, which the low and high nibbles of each 64 bytes of a block already are). The configuration
// belongs to the thread and other kernels may change it, so each call sets its own.
void configure_tiles(int rows) {
  TileConfig config;
  config.rows[0] = rows, config.bytes_per_row[0] = kGroup;
  for (int t = 1; t < 4; ++t) config.rows[t] = rows, config.bytes_per_row[t] = 64;
  for (int t = 4; t < 7; ++t) config.rows[t] = 8, config.bytes_per_row[t] = 64;
  asm volatile("ldtilecfg %0" ::"m"(config));
}

// MT rows of x times P consecutive blocks of 16 outputs (w: the first block's bytes), like P calls of tile<MT>. A tile
// loads only from memory, so each group's nibbles are spread to bytes in a buffer one group ahead of their multiply,
// and each group's sums are scaled one group behind it: the three stages of different groups overlap instead of each
// waiting for the last's store. P blocks share one load of x's codes and keep more multiplies in flight.
template <int MT, int P>
void amx_panel(const uint8_t* w, int64_t G, const int8_t* q, const float* d, const float* s, int64_t K, float* out,
               int64_t ldo) {
  alignas(64) uint8_t weights[2][P][8 * 64];
  alignas(64) int32_t sums[2][P][kAmxRows * 16];
  __m512 acc[P][MT];
  for (int p = 0; p < P; ++p)
    for (int m = 0; m < MT; ++m) acc[p][m] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t block = G * kBlockBytes;
  auto spread = [&](int64_t g) {
    for (int p = 0; p < P; ++p) {
      const uint8_t* wg = w + p * block + g * kBlockBytes;
      uint8_t* bytes_out = weights[g & 1][p];
      for (int qd = 0; qd < 4; ++qd) {
        const __m512i bytes = _mm512_loadu_si512(wg + 64 * qd);
        _mm512_store_si512(bytes_out + 128 * qd, _mm512_and_si512(bytes, low));
        _mm512_store_si512(bytes_out + 128 * qd + 64, _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low));
      }
    }
  };
  auto multiply = [&](int64_t g) {
    tile_load<0>(q + g * kGroup, K);
    multiply_block<1, 4>(weights[g & 1][0], sums[g & 1][0]);
    if constexpr (P > 1) multiply_block<2, 5>(weights[g & 1][1], sums[g & 1][1]);
    if constexpr (P > 2) multiply_block<3, 6>(weights[g & 1][2], sums[g & 1][2]);
  };
  auto scale = [&](int64_t g) {
    for (int p = 0; p < P; ++p) {
      const uint8_t* wg = w + p * block + g * kBlockBytes;
      const __m512 scales = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + 256)));
      const __m512 minimum = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + 288)));
      for (int m = 0; m < MT; ++m) {
        const __m512i dot = _mm512_load_si512(sums[g & 1][p] + 16 * m);
        acc[p][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scales, _mm512_set1_ps(d[m * G + g])), acc[p][m]);
        acc[p][m] = _mm512_fmadd_ps(minimum, _mm512_set1_ps(s[m * G + g]), acc[p][m]);
      }
    }
  };
  spread(0);
  for (int64_t g = 0; g <= G; ++g) {
    if (g + 1 < G) spread(g + 1);
    if (g < G) multiply(g);
    if (g > 0) scale(g - 1);
  }
  for (int p = 0; p < P; ++p)
    for (int m = 0; m < MT; ++m) _mm512_storeu_ps(out + m * ldo + kBlockN * p, acc[p][m]);
}

using PanelFn = void (*)(const uint8_t*, int64_t, const int8_t*, const float*, const float*, int64_t, float*, int64_t);

// Blocks per panel for a tile of `rows` rows: as many as keep the accumulators (rows x blocks) within 24 of the 32
// vector registers.
constexpr int panel_blocks(int rows) { return rows <= 8 ? 3 : rows <= 12 ? 2 : 1; }
template <int MT>
constexpr int kPanel = panel_blocks(MT);

template <int... Rows>
constexpr std::array<PanelFn, sizeof...(Rows) + 1> panels(std::integer_sequence<int, Rows...>) {
  return {nullptr, amx_panel<Rows + 1, kPanel<Rows + 1>>...};
}
template <int... Rows>
constexpr std::array<PanelFn, sizeof...(Rows) + 1> singles(std::integer_sequence<int, Rows...>) {
  return {nullptr, amx_panel<Rows + 1, 1>...};
}
constexpr auto kPanels = panels(std::make_integer_sequence<int, kAmxRows>{});  // kPanels[rows]
constexpr auto kSingles = singles(std::make_integer_sequence<int, kAmxRows>{});  // kSingles[rows]: one block

// Blocks b0..b1 of outputs for all R rows of codes, a tile of up to 16 rows at a time.
void amx_blocks(int64_t b0, int64_t b1, const uint8_t* wp, int64_t G, const int8_t* qp, const float* dp, const float* sp,
                int64_t K, int64_t R, float* pp, int64_t N) {
  for (int64_t r0 = 0; r0 < R; r0 += kAmxRows) {
    const int rt = static_cast<int>(std::min<int64_t>(kAmxRows, R - r0));
    const int panel = panel_blocks(rt);
    configure_tiles(rt);
    for (int64_t nb = b0; nb < b1;) {
      const bool whole = nb + panel <= b1;
      (whole ? kPanels : kSingles)[rt](wp + nb * G * kBlockBytes, G, qp + r0 * K, dp + r0 * G, sp + r0 * G, K,
                                       pp + r0 * N + nb * kBlockN, N);
      nb += whole ? panel : 1;
    }
  }
  _tile_release();
}

#endif

// Batches of `rows` rows of codes and more go through the tile unit from now on (0: none; negative: leave it as it is);
// what is set, which is 0 where this build or this CPU has no AMX, or the process may not use it.
int64_t q4_mm_amx_from(int64_t rows) {
  if (rows < 0) return amx_from_rows.load();
#if defined(__AMX_INT8__)
  if (!amx_permitted()) rows = 0;
#else
  rows = 0;
#endif
  amx_from_rows.store(rows);
  return rows;
}

// y [M, N] (float32) = x [M, K] @ W.T for W packed as above, with codes of `Bits` bits.
template <int Bits>
at::Tensor quantized_mm(const at::Tensor& x_in, const at::Tensor& packed, int64_t N, int64_t parts) {
  TORCH_CHECK(x_in.dim() == 2, "q4_mm: x must be [rows, in_features]");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous(), "q4_mm: packed weights must be contiguous uint8");
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1), G = K / kGroup, NB = N / kBlockN;
  TORCH_CHECK(K % kGroup == 0 && N % kBlockN == 0, "q4_mm: in_features must be a multiple of 32, out_features of 16");
  TORCH_CHECK(packed.numel() == NB * G * kGroupBytes<Bits>, "q4_mm: packed weights do not match [", N, ", ", K, "]");
  TORCH_CHECK(parts == 1 || parts == 2, "q4_mm: activations in 1 or 2 int8 parts");
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0) return out;
  const int64_t R = parts * M;  // rows of codes
  at::Tensor q = at::empty({R, K}, x.options().dtype(at::kChar));
  at::Tensor d = at::empty({R, G}, x.options());
  at::Tensor s = at::empty({R, G}, x.options());
  at::Tensor partial = parts == 1 ? out : at::empty({R, N}, x.options());  // one part: the tiles write the result
  const float* xp = x.data_ptr<float>();
  int8_t* qp = q.data_ptr<int8_t>();
  float* dp = d.data_ptr<float>();
  float* sp = s.data_ptr<float>();
  at::parallel_for(0, M, 64, [&](int64_t m0, int64_t m1) {
    quantize_rows(xp + m0 * K, m1 - m0, K, parts, qp + parts * m0 * K, dp + parts * m0 * G, sp + parts * m0 * G);
  });
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  float* pp = partial.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t amx_from = amx_from_rows.load();
  const bool amx = Bits == 4 && amx_from > 0 && R >= amx_from;
  at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) {
#if defined(__AMX_INT8__)
    if (amx) amx_blocks(b0, b1, wp, G, qp, dp, sp, K, R, pp, N);
#endif
    for (int64_t nb = b0; nb < b1; ++nb) {
      const uint8_t* w = wp + nb * G * kGroupBytes<Bits>;
      for (int64_t r0 = 0; !amx && r0 < R; r0 += kMaxTile) {
        const int rt = static_cast<int>(std::min<int64_t>(kMaxTile, R - r0));
        kTiles<Bits>[rt](w, G, qp + r0 * K, dp + r0 * G, sp + r0 * G, K, pp + r0 * N + nb * kBlockN, N);
      }
      for (int64_t m = 0; parts == 2 && m < M; ++m) {  // a row's two parts
        const float* first = pp + parts * m * N + nb * kBlockN;
        for (int64_t c = 0; c < kBlockN; c += simd::kWidth) {
          simd::store(op + m * N + nb * kBlockN + c, simd::add(simd::load(first + c), simd::load(first + N + c)));
        }
      }
    }
  });
  return out;
}


// silu(x) = x / (1 + e^-x), from e^-|x| so that the exponential never overflows: 1 / (1 + t) for x >= 0, t / (1 + t) below.
inline simd::Float silu(simd::Float x) {
  using namespace simd;
  const Float t = exp_nonpositive(min(x, sub(zero(), x)));  // e^-|x|
  const Float sigmoid_abs = div(set1(1.0f), add(set1(1.0f), t));  // sigmoid(|x|)
  return mul(x, where_negative(x, mul(t, sigmoid_abs), sigmoid_abs));
}

// The SwiGLU feed-forward's down projection, y [M, N] = (silu(gate) * up) @ W.T, from the gate and up projections' one
// output gate_up [M, 2 F] (gate first). Fused, the 2 x 30 elementwise passes of a step and their dispatch cost about a
// fifth of what they did as torch operations; each row is computed alone, so batching still changes nothing.
template <int Bits>
at::Tensor quantized_mm_swiglu(const at::Tensor& gate_up_in, const at::Tensor& packed, int64_t N, int64_t parts) {
  TORCH_CHECK(gate_up_in.dim() == 2 && gate_up_in.size(1) % (2 * simd::kWidth) == 0,
              "q4_mm_swiglu: gate_up must be [rows, 2 x in_features], in_features a multiple of ", simd::kWidth);
  const at::Tensor gate_up = gate_up_in.to(at::kFloat).contiguous();
  const int64_t M = gate_up.size(0), F = gate_up.size(1) / 2;
  at::Tensor x = at::empty({M, F}, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* xp = x.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {  // a prompt chunk's rows on every thread
    for (int64_t m = m0; m < m1; ++m) {
      const float* row = gp + m * 2 * F;
      for (int64_t c = 0; c < F; c += simd::kWidth) simd::store(xp + m * F + c, simd::mul(silu(simd::load(row + c)), simd::load(row + F + c)));
    }
  });
  return quantized_mm<Bits>(x, packed, N, parts);
}

at::Tensor q4_mm(const at::Tensor& x, const at::Tensor& packed, int64_t N, int64_t parts) { return quantized_mm<4>(x, packed, N, parts); }
at::Tensor q8_mm(const at::Tensor& x, const at::Tensor& packed, int64_t N, int64_t parts) { return quantized_mm<8>(x, packed, N, parts); }
at::Tensor q4_mm_swiglu(const at::Tensor& gate_up, const at::Tensor& packed, int64_t N, int64_t parts) {
  return quantized_mm_swiglu<4>(gate_up, packed, N, parts);
}
at::Tensor q8_mm_swiglu(const at::Tensor& gate_up, const at::Tensor& packed, int64_t N, int64_t parts) {
  return quantized_mm_swiglu<8>(gate_up, packed, N, parts);
}
at::Tensor q6_mm(const at::Tensor& x, const at::Tensor& packed, int64_t N, int64_t parts) { return quantized_mm<6>(x, packed, N, parts); }
at::Tensor q6_mm_swiglu(const at::Tensor& gate_up, const at::Tensor& packed, int64_t N, int64_t parts) {
  return quantized_mm_swiglu<6>(gate_up, packed, N, parts);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(roundtrip, m) {
  m.def("q4_mm(Tensor x, Tensor packed, int out_features, int parts) -> Tensor");
  m.def("q4_mm_swiglu(Tensor gate_up, Tensor packed, int out_features, int parts) -> Tensor");
  m.def("q4_mm_amx_from(int rows) -> int", &q4_mm_amx_from);
  m.def("q8_mm(Tensor x, Tensor packed, int out_features, int parts) -> Tensor");
  m.def("q8_mm_swiglu(Tensor gate_up, Tensor packed, int out_features, int parts) -> Tensor");
  m.def("q6_mm(Tensor x, Tensor packed, int out_features, int parts) -> Tensor");
  m.def("q6_mm_swiglu(Tensor gate_up, Tensor packed, int out_features, int parts) -> Tensor");
}

TORCH_LIBRARY_IMPL(roundtrip, CPU, m) {
  m.impl("q4_mm", &q4_mm);
  m.impl("q4_mm_swiglu", &q4_mm_swiglu);
  m.impl("q8_mm", &q8_mm);
  m.impl("q8_mm_swiglu", &q8_mm_swiglu);
  m.impl("q6_mm", &q6_mm);
  m.impl("q6_mm_swiglu", &q6_mm_swiglu);
}
