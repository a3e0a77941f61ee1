// AVX-512 kernels for the 2x2 / stride-2 pooling window (models A and B), forward and backward, max
// (optionally fused with a preceding ReLU) and average, for f32, bf16 and f16 planes. Compiled with
// AVX-512 flags only (cmake/demi_module.cmake); dispatched from pool.cc for geometries where no window
// reaches padding (pool.cc zeroes the dx of a last odd row or column).
//
// Forward: 16 outputs at a time. Each input row pair is split into its even and odd columns: for bf16 and
// f16 a 32-bit load holds one horizontal pair, so the split is a shift and a mask (bf16) or two narrowing
// moves (f16); f32 uses two permutes. Planes of at most 8 outputs per row put several rows in one vector.
// The window's maximum is taken as max(max(row 0 pair), max(row 1 pair)) with "take the later one only
// if strictly greater, or NaN over a number", which picks exactly what the reference's row-major scan
// picks, ties and NaN included.
// Backward: no arithmetic for max pooling: each dy is copied, as raw bits, into the one lane of its
// window that argmax names (zero elsewhere), writing both rows of every window in one pass.
#include <type_traits>

#include "demi/kernels/cpu/internal/pool_kernels.h"
#include "demi/kernels/cpu/internal/vec_avx512.h"

namespace demi::kernels::cpu_internal {
namespace {

using V = VecAvx512;
using G = Pool2x2Geometry;
constexpr uint8_t kNone = 255;  // kArgmaxNone (reference/pool.h), spelled here to keep this file's includes minimal

inline __mmask16 tail16(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }  // 0 <= n <= 16
inline __mmask8 tail8(int64_t n) { return static_cast<__mmask8>((1u << n) - 1u); }     // 0 <= n <= 8
inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// The n (<= 16) horizontal pairs at p, as their first (even) and second (odd) elements in f32.
inline void load_pairs(const float* p, int64_t n, __m512& even, __m512& odd) {
  const __m512i even_idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd_idx = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  __m512 a, b;
  if (n == 16) {
    a = _mm512_loadu_ps(p);
    b = _mm512_loadu_ps(p + 16);
  } else {
    a = _mm512_maskz_loadu_ps(tail16(min64(2 * n, 16)), p);
    b = _mm512_maskz_loadu_ps(tail16(2 * n > 16 ? 2 * n - 16 : 0), p + 16);
  }
  even = _mm512_permutex2var_ps(a, even_idx, b);
  odd = _mm512_permutex2var_ps(a, odd_idx, b);
}

// 16-bit elements: one 32-bit lane per pair, the even element in its low half.
inline __m512i load_pair_lanes(const void* p, int64_t n) {
  return n == 16 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi32(tail16(n), p);
}

inline void load_pairs(const BFloat16* p, int64_t n, __m512& even, __m512& odd) {
  __m512i lanes = load_pair_lanes(p, n);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(lanes, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(lanes, _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u))));
}

inline void load_pairs(const Half* p, int64_t n, __m512& even, __m512& odd) {
  __m512i lanes = load_pair_lanes(p, n);
  even = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(lanes));
  odd = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(lanes, 16)));
}

template <typename T>
inline void store_out(T* p, __m512 v, int64_t n) {
  if (n == 16)
    V::store(p, v);
  else
    V::store_n(p, v, n);
}

// Narrow planes (OW <= 8, such as model B's 7x7 outputs) put k = 16 / OW output rows in one vector: the
// pairs of row j land in lanes [j OW, (j + 1) OW), so the k rows' outputs come out adjacent, as they are
// in y. Each row is one masked load at a pointer shifted back by the lanes before it (masked-off lanes
// are never touched).
struct MultiRow {
  int64_t n = 0;                       // outputs per row
  int64_t k = 0;                       // rows per vector
  __mmask16 lanes[16] = {};            // 16-bit types: one 32-bit lane per pair
  __mmask16 lo[16] = {}, hi[16] = {};  // f32: the row's 2n floats within [a | b] (32 floats)
  explicit MultiRow(int64_t outputs) : n(outputs), k(16 / outputs) {
    for (int64_t j = 0; j < k; ++j) {
      lanes[j] = static_cast<__mmask16>(tail16(n) << (j * n));
      uint32_t span = ((1u << (2 * n)) - 1u);                      // 2n <= 16 bits
      uint64_t bits = static_cast<uint64_t>(span) << (2 * j * n);  // within 32 positions
      lo[j] = static_cast<__mmask16>(bits & 0xffffu);
      hi[j] = static_cast<__mmask16>((bits >> 16) & 0xffffu);
    }
  }
};

// Rows j < count, the pairs of row j at p + j * stride (elements).
inline void load_rows(const float* p, int64_t stride, const MultiRow& mr, int64_t count, __m512& even, __m512& odd) {
  const __m512i even_idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd_idx = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
  for (int64_t j = 0; j < count; ++j) {
    const float* q = p + j * stride - 2 * j * mr.n;  // float position 2 j n of [a | b] reads p + j * stride
    a = _mm512_mask_loadu_ps(a, mr.lo[j], q);
    b = _mm512_mask_loadu_ps(b, mr.hi[j], q + 16);
  }
  even = _mm512_permutex2var_ps(a, even_idx, b);
  odd = _mm512_permutex2var_ps(a, odd_idx, b);
}

inline __m512i load_row_lanes(const uint16_t* p, int64_t stride, const MultiRow& mr, int64_t count) {
  __m512i lanes = _mm512_setzero_si512();
  for (int64_t j = 0; j < count; ++j)  // lane j n of the vector reads p + j * stride
    lanes = _mm512_mask_loadu_epi32(lanes, mr.lanes[j], p + j * stride - 2 * j * mr.n);
  return lanes;
}

inline void load_rows(const BFloat16* p, int64_t stride, const MultiRow& mr, int64_t count, __m512& even, __m512& odd) {
  __m512i lanes = load_row_lanes(reinterpret_cast<const uint16_t*>(p), stride, mr, count);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(lanes, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(lanes, _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u))));
}

inline void load_rows(const Half* p, int64_t stride, const MultiRow& mr, int64_t count, __m512& even, __m512& odd) {
  __m512i lanes = load_row_lanes(reinterpret_cast<const uint16_t*>(p), stride, mr, count);
  even = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(lanes));
  odd = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(lanes, 16)));
}

// Lanes where `later` replaces `kept` in a row-major scan: strictly greater, or NaN where kept is a number.
inline __mmask16 takes(__m512 kept, __m512 later) {
  return _mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(kept, kept, _CMP_ORD_Q), later, kept, _CMP_NLE_UQ);
}

// The maximum of each lane's window (a b / c d, row-major) and its position 0..3 (kNone after a ReLU
// that blocks the gradient).
template <bool kRelu>
inline __m512 window_max(__m512 a, __m512 b, __m512 c, __m512 d, __m128i& idx) {
  __mmask16 m01 = takes(a, b);
  __mmask16 m23 = takes(c, d);
  __m512 p0 = _mm512_mask_blend_ps(m01, a, b);
  __m512 p1 = _mm512_mask_blend_ps(m23, c, d);
  __mmask16 mf = takes(p0, p1);
  __m512 r = _mm512_mask_blend_ps(mf, p0, p1);
  if constexpr (kRelu) r = _mm512_max_ps(_mm512_setzero_ps(), r);  // 0 > r ? 0 : r (NaN, -0 kept)
  __m128i i0 = _mm_maskz_mov_epi8(m01, _mm_set1_epi8(1));
  __m128i i1 = _mm_mask_mov_epi8(_mm_set1_epi8(2), m23, _mm_set1_epi8(3));
  idx = _mm_mask_mov_epi8(i0, mf, i1);
  if constexpr (kRelu)
    idx = _mm_mask_mov_epi8(_mm_set1_epi8(static_cast<char>(kNone)),
                            _mm512_cmp_ps_mask(r, _mm512_setzero_ps(), _CMP_GT_OQ), idx);
  return r;
}

template <typename T, bool kRelu, bool kArgmax>
void max_forward_impl(const G& g, const T* x, T* y, uint8_t* argmax) {
  const int64_t w = g.w, ow = g.ow;
  // `rows` consecutive row pairs: the top row of pair r at x0 + 2 r w, its outputs at y0 + r ow.
  auto run = [&](const T* x0, T* y0, uint8_t* a0, int64_t rows) {
    int64_t r = 0;
    if (ow <= 8) {
      const MultiRow mr(ow);
      for (; r < rows; r += mr.k) {
        int64_t count = min64(mr.k, rows - r);
        const T* top = x0 + 2 * r * w;
        __m512 a, b, c, d;
        __m128i idx;
        load_rows(top, 2 * w, mr, count, a, b);
        load_rows(top + w, 2 * w, mr, count, c, d);
        __m512 m = window_max<kRelu>(a, b, c, d, idx);
        store_out(y0 + r * ow, m, count * ow);
        if constexpr (kArgmax) _mm_mask_storeu_epi8(a0 + r * ow, tail16(count * ow), idx);
      }
    }
    for (; r < rows; ++r) {
      const T* r0 = x0 + 2 * r * w;
      const T* r1 = r0 + w;
      for (int64_t ox = 0; ox < ow; ox += 16) {
        int64_t n = min64(16, ow - ox);
        __m512 a, b, c, d;
        __m128i idx;
        load_pairs(r0 + 2 * ox, n, a, b);
        load_pairs(r1 + 2 * ox, n, c, d);
        __m512 m = window_max<kRelu>(a, b, c, d, idx);
        store_out(y0 + r * ow + ox, m, n);
        if constexpr (kArgmax) {
          if (n == 16)
            _mm_storeu_si128(reinterpret_cast<__m128i*>(a0 + r * ow + ox), idx);
          else
            _mm_mask_storeu_epi8(a0 + r * ow + ox, tail16(n), idx);
        }
      }
    }
  };
  if (g.h == 2 * g.oh) {
    // No row left over at the bottom of a plane: the row pairs of all planes are one uniform sequence.
    run(x, y, argmax, g.planes * g.oh);
  } else {
    for (int64_t plane = 0; plane < g.planes; ++plane)
      run(x + plane * g.h * w, y + plane * g.oh * ow, kArgmax ? argmax + plane * g.oh * ow : nullptr, g.oh);
  }
}

template <typename T>
void max_forward(const G& g, const void* x, void* y, uint8_t* argmax, bool relu) {
  const T* xt = static_cast<const T*>(x);
  T* yt = static_cast<T*>(y);
  if (relu) {
    if (argmax)
      max_forward_impl<T, true, true>(g, xt, yt, argmax);
    else
      max_forward_impl<T, true, false>(g, xt, yt, argmax);
  } else {
    if (argmax)
      max_forward_impl<T, false, true>(g, xt, yt, argmax);
    else
      max_forward_impl<T, false, false>(g, xt, yt, argmax);
  }
}

// 16-bit elements (bf16 and f16 alike: raw bits): 16 outputs -> 16 32-bit lanes per dx row.
void max_backward_16(const G& g, const void* dyv, const uint8_t* argmax, void* dxv) {
  const uint16_t* dy = static_cast<const uint16_t*>(dyv);
  uint16_t* dx = static_cast<uint16_t*>(dxv);
  const __m512i k0 = _mm512_set1_epi32(0), k1 = _mm512_set1_epi32(1), k2 = _mm512_set1_epi32(2),
                k3 = _mm512_set1_epi32(3);
  for (int64_t plane = 0; plane < g.planes; ++plane) {
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      int64_t o = (plane * g.oh + oy) * g.ow;
      uint16_t* d0 = dx + (plane * g.h + 2 * oy) * g.w;
      uint16_t* d1 = d0 + g.w;
      for (int64_t ox = 0; ox < g.ow; ox += 16) {
        int64_t n = min64(16, g.ow - ox);
        __m256i dv;
        __m128i iv;
        if (n == 16) {
          dv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(dy + o + ox));
          iv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(argmax + o + ox));
        } else {
          dv = _mm256_maskz_loadu_epi16(tail16(n), dy + o + ox);
          iv = _mm_maskz_loadu_epi8(tail16(n), argmax + o + ox);
        }
        __m512i d = _mm512_cvtepu16_epi32(dv);
        __m512i i = _mm512_cvtepu8_epi32(iv);
        __m512i row0 = _mm512_or_si512(_mm512_maskz_mov_epi32(_mm512_cmpeq_epi32_mask(i, k0), d),
                                       _mm512_maskz_slli_epi32(_mm512_cmpeq_epi32_mask(i, k1), d, 16));
        __m512i row1 = _mm512_or_si512(_mm512_maskz_mov_epi32(_mm512_cmpeq_epi32_mask(i, k2), d),
                                       _mm512_maskz_slli_epi32(_mm512_cmpeq_epi32_mask(i, k3), d, 16));
        if (n == 16) {
          _mm512_storeu_si512(d0 + 2 * ox, row0);
          _mm512_storeu_si512(d1 + 2 * ox, row1);
        } else {
          _mm512_mask_storeu_epi32(d0 + 2 * ox, tail16(n), row0);
          _mm512_mask_storeu_epi32(d1 + 2 * ox, tail16(n), row1);
        }
      }
    }
  }
}

// f32 (raw bits): 8 outputs -> 8 64-bit lanes per dx row.
void max_backward_32(const G& g, const void* dyv, const uint8_t* argmax, void* dxv) {
  const uint32_t* dy = static_cast<const uint32_t*>(dyv);
  uint32_t* dx = static_cast<uint32_t*>(dxv);
  const __m512i k0 = _mm512_set1_epi64(0), k1 = _mm512_set1_epi64(1), k2 = _mm512_set1_epi64(2),
                k3 = _mm512_set1_epi64(3);
  for (int64_t plane = 0; plane < g.planes; ++plane) {
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      int64_t o = (plane * g.oh + oy) * g.ow;
      uint32_t* d0 = dx + (plane * g.h + 2 * oy) * g.w;
      uint32_t* d1 = d0 + g.w;
      for (int64_t ox = 0; ox < g.ow; ox += 8) {
        int64_t n = min64(8, g.ow - ox);
        __m256i dv;
        __m128i iv;
        if (n == 8) {
          dv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(dy + o + ox));
          iv = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(argmax + o + ox));
        } else {
          dv = _mm256_maskz_loadu_epi32(tail8(n), dy + o + ox);
          iv = _mm_maskz_loadu_epi8(tail16(n), argmax + o + ox);
        }
        __m512i d = _mm512_cvtepu32_epi64(dv);
        __m512i i = _mm512_cvtepu8_epi64(iv);
        __m512i row0 = _mm512_or_si512(_mm512_maskz_mov_epi64(_mm512_cmpeq_epi64_mask(i, k0), d),
                                       _mm512_maskz_slli_epi64(_mm512_cmpeq_epi64_mask(i, k1), d, 32));
        __m512i row1 = _mm512_or_si512(_mm512_maskz_mov_epi64(_mm512_cmpeq_epi64_mask(i, k2), d),
                                       _mm512_maskz_slli_epi64(_mm512_cmpeq_epi64_mask(i, k3), d, 32));
        if (n == 8) {
          _mm512_storeu_si512(d0 + 2 * ox, row0);
          _mm512_storeu_si512(d1 + 2 * ox, row1);
        } else {
          _mm512_mask_storeu_epi64(d0 + 2 * ox, tail8(n), row0);
          _mm512_mask_storeu_epi64(d1 + 2 * ox, tail8(n), row1);
        }
      }
    }
  }
}

// ((a + b) + c) + d, then / 4 (exact as * 0.25): the reference's order, so results are bit-identical.
template <typename T>
void avg_forward(const G& g, const void* xv, void* yv) {
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  const __m512 quarter = _mm512_set1_ps(0.25f);
  for (int64_t plane = 0; plane < g.planes; ++plane) {
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      const T* r0 = x + (plane * g.h + 2 * oy) * g.w;
      const T* r1 = r0 + g.w;
      int64_t o = (plane * g.oh + oy) * g.ow;
      for (int64_t ox = 0; ox < g.ow; ox += 16) {
        int64_t n = min64(16, g.ow - ox);
        __m512 a, b, c, d;
        load_pairs(r0 + 2 * ox, n, a, b);
        load_pairs(r1 + 2 * ox, n, c, d);
        __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), c), d);
        store_out(y + o + ox, _mm512_mul_ps(s, quarter), n);
      }
    }
  }
}

// Each window's dy / 4, rounded to T, on its 4 elements.
template <typename T>
void avg_backward(const G& g, const void* dyv, void* dxv) {
  const T* dy = static_cast<const T*>(dyv);
  T* dx = static_cast<T*>(dxv);
  const __m512 quarter = _mm512_set1_ps(0.25f);
  const __m512i dup_lo = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512i dup_hi = _mm512_setr_epi32(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
  for (int64_t plane = 0; plane < g.planes; ++plane) {
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      int64_t o = (plane * g.oh + oy) * g.ow;
      T* d0 = dx + (plane * g.h + 2 * oy) * g.w;
      T* d1 = d0 + g.w;
      for (int64_t ox = 0; ox < g.ow; ox += 16) {
        int64_t n = min64(16, g.ow - ox);
        __m512 v = _mm512_mul_ps(n == 16 ? V::load(dy + o + ox) : V::load_n(dy + o + ox, n), quarter);
        if constexpr (sizeof(T) == 4) {
          __m512 lo = _mm512_permutexvar_ps(dup_lo, v);
          __m512 hi = _mm512_permutexvar_ps(dup_hi, v);
          __mmask16 mlo = tail16(min64(2 * n, 16)), mhi = tail16(2 * n > 16 ? 2 * n - 16 : 0);
          float* f0 = reinterpret_cast<float*>(d0 + 2 * ox);
          float* f1 = reinterpret_cast<float*>(d1 + 2 * ox);
          _mm512_mask_storeu_ps(f0, mlo, lo);
          _mm512_mask_storeu_ps(f0 + 16, mhi, hi);
          _mm512_mask_storeu_ps(f1, mlo, lo);
          _mm512_mask_storeu_ps(f1 + 16, mhi, hi);
        } else {
          __m512i bits;
          if constexpr (std::is_same_v<T, BFloat16>)
            bits = V::round_bf16(v);
          else
            bits = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(v, V::kRoundNearest));
          __m512i lanes = _mm512_or_si512(bits, _mm512_slli_epi32(bits, 16));
          _mm512_mask_storeu_epi32(d0 + 2 * ox, tail16(n), lanes);
          _mm512_mask_storeu_epi32(d1 + 2 * ox, tail16(n), lanes);
        }
      }
    }
  }
}

template <typename T>
Pool2x2Kernels make_kernels() {
  Pool2x2Kernels k{};
  k.max_forward = &max_forward<T>;
  k.max_backward = sizeof(T) == 4 ? &max_backward_32 : &max_backward_16;
  k.avg_forward = &avg_forward<T>;
  k.avg_backward = &avg_backward<T>;
  return k;
}

}  // namespace

const Pool2x2Kernels& pool2x2_kernels_avx512(int slot) {
  static const Pool2x2Kernels kernels[3] = {make_kernels<float>(), make_kernels<BFloat16>(), make_kernels<Half>()};
  return kernels[slot];
}

}  // namespace demi::kernels::cpu_internal
