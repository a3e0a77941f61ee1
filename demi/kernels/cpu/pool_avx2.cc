// AVX2 kernels for the 2x2 / stride-2 pooling window (models A and B), forward and backward, max
// (optionally fused with a preceding ReLU) and average, for f32, bf16 and f16 planes: 8 outputs at a time.
// Compiled with AVX2 flags only (cmake/demi_module.cmake); dispatched from pool.cc for the geometries the
// AVX-512 twin (pool_avx512.cc, which explains the window order and the tie / NaN rule) takes. Results
// are bit-identical to the portable kernels and the reference; pool_test.cc runs every level.
//
// Forward: a row's 8 horizontal pairs are split into even and odd columns (f32: two shuffles and a
// lane permute; bf16 and f16: one 32-bit lane per pair, split by a shift and a mask or two packs).
// Backward: each dy is copied, as raw bits, into the one element of its window that argmax names.
// Tails (fewer than 8 outputs) go through small stack buffers, so nothing outside the row is touched.
#include <cstring>
#include <type_traits>

#include "demi/kernels/cpu/internal/pool_kernels.h"
#include "demi/kernels/cpu/internal/vec_avx2.h"

namespace demi::kernels::cpu_internal {
namespace {

using V = VecAvx2;
using G = Pool2x2Geometry;
constexpr int32_t kNone = 255;  // kArgmaxNone (reference/pool.h)

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// The walk every kernel here takes: each output row in groups of up to 8 outputs, f(o, at, n) per group, with
// o its first output (in y, dy and argmax), at the first element of its windows in the input's top row (the
// bottom row is at + g.w), n its width (1..8).
template <typename F>
inline void for_each_group(const G& g, F&& f) {
  for (int64_t plane = 0; plane < g.planes; ++plane) {
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      const int64_t o = (plane * g.oh + oy) * g.ow, at = (plane * g.h + 2 * oy) * g.w;
      for (int64_t ox = 0; ox < g.ow; ox += 8) f(o + ox, at + 2 * ox, min64(8, g.ow - ox));
    }
  }
}

// The n (<= 8) horizontal pairs at p, as their first (even) and second (odd) elements in f32.
inline void load_pairs(const float* p, int64_t n, __m256& even, __m256& odd) {
  __m256 a, b;
  if (n == 8) {
    a = _mm256_loadu_ps(p);
    b = _mm256_loadu_ps(p + 8);
  } else {
    alignas(32) float buf[16] = {};
    std::memcpy(buf, p, static_cast<size_t>(2 * n) * sizeof(float));
    a = _mm256_load_ps(buf);
    b = _mm256_load_ps(buf + 8);
  }
  // shuffle: [a0 a2 b0 b2 | a4 a6 b4 b6]; the 64-bit permute puts a's pairs before b's.
  even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
  odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}

// 16-bit elements: one 32-bit lane per pair, the even element in its low half.
inline __m256i load_pair_lanes(const void* p, int64_t n) {
  if (n == 8) return _mm256_loadu_si256(static_cast<const __m256i*>(p));
  alignas(32) uint32_t buf[8] = {};
  std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(uint32_t));
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
}

inline void load_pairs(const BFloat16* p, int64_t n, __m256& even, __m256& odd) {
  __m256i lanes = load_pair_lanes(p, n);
  even = _mm256_castsi256_ps(_mm256_slli_epi32(lanes, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(lanes, _mm256_set1_epi32(static_cast<int32_t>(0xffff0000u))));
}

// 8 lanes of 16-bit values (< 2^16) -> 8 packed u16.
inline __m128i pack16(__m256i v) {
  return _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

inline void load_pairs(const Half* p, int64_t n, __m256& even, __m256& odd) {
  __m256i lanes = load_pair_lanes(p, n);
  even = _mm256_cvtph_ps(pack16(_mm256_and_si256(lanes, _mm256_set1_epi32(0xffff))));
  odd = _mm256_cvtph_ps(pack16(_mm256_srli_epi32(lanes, 16)));
}

template <typename T>
inline void store_out(T* p, __m256 v, int64_t n) {
  if (n == 8)
    V::store(p, v);
  else
    V::store_n(p, v, n);
}

// Lanes where `later` replaces `kept` in a row-major scan: strictly greater, or NaN where kept is a number.
inline __m256 takes(__m256 kept, __m256 later) {
  return _mm256_and_ps(_mm256_cmp_ps(kept, kept, _CMP_ORD_Q), _mm256_cmp_ps(later, kept, _CMP_NLE_UQ));
}

inline __m256i as_int(__m256 m) { return _mm256_castps_si256(m); }

// The maximum of each lane's window (a b / c d, row-major) and its position 0..3 (kNone after a ReLU
// that blocks the gradient), as 32-bit lanes.
template <bool kRelu>
inline __m256 window_max(__m256 a, __m256 b, __m256 c, __m256 d, __m256i& idx) {
  __m256 m01 = takes(a, b);
  __m256 m23 = takes(c, d);
  __m256 p0 = _mm256_blendv_ps(a, b, m01);
  __m256 p1 = _mm256_blendv_ps(c, d, m23);
  __m256 mf = takes(p0, p1);
  __m256 r = _mm256_blendv_ps(p0, p1, mf);
  if constexpr (kRelu) r = _mm256_max_ps(_mm256_setzero_ps(), r);  // 0 > r ? 0 : r (NaN, -0 kept)
  const __m256i one = _mm256_set1_epi32(1);
  __m256i i01 = _mm256_and_si256(as_int(m01), one);
  __m256i i23 = _mm256_or_si256(_mm256_set1_epi32(2), _mm256_and_si256(as_int(m23), one));
  idx = _mm256_blendv_epi8(i01, i23, as_int(mf));
  if constexpr (kRelu)
    idx = _mm256_blendv_epi8(_mm256_set1_epi32(kNone), idx, as_int(_mm256_cmp_ps(r, _mm256_setzero_ps(), _CMP_GT_OQ)));
  return r;
}

// 8 32-bit lanes of 0..255 -> 8 bytes at p (n of them).
inline void store_idx(uint8_t* p, __m256i idx, int64_t n) {
  __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(idx), _mm256_extracti128_si256(idx, 1));
  __m128i b = _mm_packus_epi16(w, w);
  if (n == 8) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), b);
  } else {
    alignas(16) uint8_t buf[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(buf), b);
    std::memcpy(p, buf, static_cast<size_t>(n));
  }
}

template <typename T, bool kRelu, bool kArgmax>
void max_forward_impl(const G& g, const T* x, T* y, uint8_t* argmax) {
  for_each_group(g, [&](int64_t o, int64_t at, int64_t n) {
    __m256 a, b, c, d;
    __m256i idx;
    load_pairs(x + at, n, a, b);
    load_pairs(x + at + g.w, n, c, d);
    __m256 m = window_max<kRelu>(a, b, c, d, idx);
    store_out(y + o, m, n);
    if constexpr (kArgmax) store_idx(argmax + o, idx, n);
  });
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

// n (<= 8) argmax bytes as 32-bit lanes.
inline __m256i load_idx(const uint8_t* p, int64_t n) {
  alignas(16) uint8_t buf[16] = {};
  std::memcpy(buf, p, static_cast<size_t>(n));
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(buf)));
}

// The 2n elements of one dx row: full vectors, or through a buffer.
template <typename E>
inline void store_row(E* p, __m256i lo, __m256i hi, int64_t bytes) {
  if (bytes == 64) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p) + 1, hi);
  } else {
    alignas(32) uint8_t buf[64];
    _mm256_store_si256(reinterpret_cast<__m256i*>(buf), lo);
    _mm256_store_si256(reinterpret_cast<__m256i*>(buf) + 1, hi);
    std::memcpy(p, buf, static_cast<size_t>(bytes));
  }
}

// 16-bit elements: n (<= 8) 32-bit lanes (one window's column pair each) into both rows of the windows.
inline void store_pair_lanes(uint16_t* d0, uint16_t* d1, __m256i row0, __m256i row1, int64_t n) {
  if (n == 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d0), row0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d1), row1);
    return;
  }
  alignas(32) uint32_t out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), row0);
  std::memcpy(d0, out, static_cast<size_t>(n) * sizeof(uint32_t));
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), row1);
  std::memcpy(d1, out, static_cast<size_t>(n) * sizeof(uint32_t));
}

// f32 (raw bits): row 0 of the windows gets (idx == 0 ? d : 0, idx == 1 ? d : 0) per output, row 1 the same
// with 2 and 3; even and odd columns are interleaved into element order.
inline void interleave(__m256i even, __m256i odd, __m256i& lo, __m256i& hi) {
  __m256i l = _mm256_unpacklo_epi32(even, odd), h = _mm256_unpackhi_epi32(even, odd);
  lo = _mm256_permute2x128_si256(l, h, 0x20);
  hi = _mm256_permute2x128_si256(l, h, 0x31);
}

void max_backward_32(const G& g, const void* dyv, const uint8_t* argmax, void* dxv) {
  const uint32_t* dy = static_cast<const uint32_t*>(dyv);
  uint32_t* dx = static_cast<uint32_t*>(dxv);
  for_each_group(g, [&](int64_t o, int64_t at, int64_t n) {
    __m256i d;
    if (n == 8) {
      d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(dy + o));
    } else {
      alignas(32) uint32_t buf[8] = {};
      std::memcpy(buf, dy + o, static_cast<size_t>(n) * sizeof(uint32_t));
      d = _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
    }
    __m256i i = load_idx(argmax + o, n);
    auto pick = [&](int k) { return _mm256_and_si256(d, _mm256_cmpeq_epi32(i, _mm256_set1_epi32(k))); };
    __m256i lo, hi;
    interleave(pick(0), pick(1), lo, hi);
    store_row(dx + at, lo, hi, 8 * n);
    interleave(pick(2), pick(3), lo, hi);
    store_row(dx + at + g.w, lo, hi, 8 * n);
  });
}

// 16-bit elements (bf16 and f16 alike: raw bits): one 32-bit lane per window column pair.
void max_backward_16(const G& g, const void* dyv, const uint8_t* argmax, void* dxv) {
  const uint16_t* dy = static_cast<const uint16_t*>(dyv);
  uint16_t* dx = static_cast<uint16_t*>(dxv);
  for_each_group(g, [&](int64_t o, int64_t at, int64_t n) {
    alignas(16) uint16_t buf[8] = {};
    std::memcpy(buf, dy + o, static_cast<size_t>(n) * sizeof(uint16_t));
    __m256i d = _mm256_cvtepu16_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(buf)));
    __m256i i = load_idx(argmax + o, n);
    auto is = [&](int k) { return _mm256_cmpeq_epi32(i, _mm256_set1_epi32(k)); };
    __m256i row0 = _mm256_or_si256(_mm256_and_si256(d, is(0)), _mm256_and_si256(_mm256_slli_epi32(d, 16), is(1)));
    __m256i row1 = _mm256_or_si256(_mm256_and_si256(d, is(2)), _mm256_and_si256(_mm256_slli_epi32(d, 16), is(3)));
    store_pair_lanes(dx + at, dx + at + g.w, row0, row1, n);
  });
}

// ((a + b) + c) + d, then / 4 (exact as * 0.25): the reference's order, so results are bit-identical.
template <typename T>
void avg_forward(const G& g, const void* xv, void* yv) {
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  const __m256 quarter = _mm256_set1_ps(0.25f);
  for_each_group(g, [&](int64_t o, int64_t at, int64_t n) {
    __m256 a, b, c, d;
    load_pairs(x + at, n, a, b);
    load_pairs(x + at + g.w, n, c, d);
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a, b), c), d);
    store_out(y + o, _mm256_mul_ps(s, quarter), n);
  });
}

// Each window's dy / 4, rounded to T, on its 4 elements.
template <typename T>
void avg_backward(const G& g, const void* dyv, void* dxv) {
  const T* dy = static_cast<const T*>(dyv);
  T* dx = static_cast<T*>(dxv);
  const __m256 quarter = _mm256_set1_ps(0.25f);
  for_each_group(g, [&](int64_t o, int64_t at, int64_t n) {
    __m256 v = _mm256_mul_ps(n == 8 ? V::load(dy + o) : V::load_n(dy + o, n), quarter);
    if constexpr (sizeof(T) == 4) {
      __m256i lo, hi;
      interleave(_mm256_castps_si256(v), _mm256_castps_si256(v), lo, hi);
      store_row(dx + at, lo, hi, 8 * n);
      store_row(dx + at + g.w, lo, hi, 8 * n);
    } else {
      __m128i bits;
      if constexpr (std::is_same_v<T, BFloat16>)
        bits = V::narrow_bf16(v);
      else
        bits = _mm256_cvtps_ph(v, V::kRoundNearest);
      __m256i w = _mm256_cvtepu16_epi32(bits);
      __m256i lanes = _mm256_or_si256(w, _mm256_slli_epi32(w, 16));
      store_pair_lanes(reinterpret_cast<uint16_t*>(dx + at), reinterpret_cast<uint16_t*>(dx + at + g.w), lanes, lanes,
                       n);
    }
  });
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

const Pool2x2Kernels& pool2x2_kernels_avx2(int slot) {
  static const Pool2x2Kernels kernels[3] = {make_kernels<float>(), make_kernels<BFloat16>(), make_kernels<Half>()};
  return kernels[slot];
}

}  // namespace demi::kernels::cpu_internal
