// The tile body of demi's AMX GEMM (gemm_amx.h): packing into the tile layouts, the 2 x 2 tile block over
// the whole K', and the AVX-512 store. Compiled for AMX; reached only at the amx level
// (gemm_amx_select.cc decides).
// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands, which -Wmaybe-uninitialized
// (and -Wuninitialized) report inside the intrinsic headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/half.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/amx_gemm.h"
#include "demi/kernels/cpu/internal/amx_tiles.h"
#include "demi/kernels/cpu/internal/f16_split_avx512.h"
#include "demi/kernels/cpu/internal/workspace.h"
#include "demi/kernels/matmul_params.h"

// The packing's and the store's vector helpers: inlined into their loops (a call per 16 values is what
// the compiler would otherwise leave).
#define DEMI_AMX_INLINE inline __attribute__((always_inline))

namespace demi::kernels::cpu::cpu_internal_amx {
namespace {

using cpu_internal::bytes64;
using cpu_internal::configure_tiles;
using cpu_internal::lanes;
using cpu_internal::load_c_tiles;
using cpu_internal::multiply_c_column;
using cpu_internal::multiply_c_tiles;
using cpu_internal::store_c_tiles;
using cpu_internal::zero_c_tiles;
using cpu_internal::for_each_part;
using cpu_internal::PartScratch;
using cpu_internal::parts_for;
using cpu_internal::split_f16x32;
using cpu_internal::split_f32_parts;
using cpu_internal::transpose16;
using cpu_internal::Workspace;

// Tiles 0-3: the C block's sums (rows 0-15 | 16-31 x columns 0-15 | 16-31); 4, 5: a's two row tiles; 6, 7:
// b's two column tiles (configure_tiles: internal/amx_tiles.h).
constexpr int64_t kBlock = 32;  // a C block: 2 x 2 tiles of 16 x 16 f32
constexpr int64_t kKStep = 32;  // bf16 values in a tile row (64 bytes): the K step of one TDPBF16PS
constexpr int64_t kTile = 16;   // rows of a tile; columns of a B or C tile
// K' values per block of a row block's a held in L1 (blocks(), where k_blocked); bytes of the larger operand
// a thread packs and multiplies at a time, and of b's column blocks multiplied at a time (a quarter of a
// core's L2 on the Xeons with AMX: 2 MiB) where the threads split a's rows: each chunk of a's rows reads all
// of b, so the more rows a chunk has, the fewer passes over b (1024^3 at a chunk of 128 KiB: 0.76x). Where they split
// b's columns, each chunk of columns reads all of the shared a from L2 at 2 / columns bytes per product,
// nothing beside the tile loads' 1 KiB per 16 x 16 x 32: 128 KiB (at least one column block) is as fast,
// and a fourth of the workspace (model C's 256 x 1024 x 1024 and B's 128 x 3136 x 128 products measured
// the same or faster: 0.96-1.0x the time).
constexpr int64_t kPanel = 512;  // values of K per panel of a split a's rows where its K is longer (Shares)
constexpr int64_t kKBlock = 256, kChunkBytes = int64_t{1} << 19, kColumnChunkBytes = int64_t{1} << 17;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// An operand's K' layout: one segment of kp bf16 values (K padded to 32 with zeros), or split, two: the
// values' hi parts, then their lo parts.
struct Layout {
  int64_t k = 0, kp = 0, segs = 1;
  int64_t stored_ld = 0;  // elements between the operand's stored rows
  int64_t kq() const { return segs * kp; }
  bool split() const { return segs > 1; }
};

DEMI_AMX_INLINE __m512 widen_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// mask lanes of an f32|bf16|f16 row at base + i (elements) as f32; the other lanes 0.
DEMI_AMX_INLINE __m512 load_row(const void* base, DType t, int64_t i, __mmask16 mask) {
  switch (t) {
    case DType::kBF16: return widen_bf16(_mm256_maskz_loadu_epi16(mask, static_cast<const BFloat16*>(base) + i));
    case DType::kF16:
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, static_cast<const Half*>(base) + i));
    default: return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + i);
  }
}

DEMI_AMX_INLINE __m256i to_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }  // to nearest even

// 16 of an operand's values at base + i (mask lanes; the others 0) as f32: an f32 one read rounded to
// `round` where that is bf16|f16 (MatmulParams::a_round), once, to nearest even.
DEMI_AMX_INLINE __m512 values16(const void* base, DType t, DType round, int64_t i, __mmask16 mask) {
  const __m512 v = load_row(base, t, i, mask);
  if (t != DType::kF32 || round == DType::kF32) return v;
  if (round == DType::kF16) return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return widen_bf16(to_bf16(v));
}

// 16 values as bf16: where the layout does not split, v rounded to nearest even; where it does (each v exact
// in bf16 or in f16), the exact split of f16_split.h: hi = v's top 16 bits (its top 8 significant bits), lo =
// v - hi (the other 3 at most, exact in bf16), lo 0 where hi is Inf or NaN, so Inf stays Inf through the
// four products.
struct Encoded {
  __m256i hi, lo;
  __m256i segment(int64_t s) const { return s == 1 ? lo : hi; }
};
DEMI_AMX_INLINE Encoded encode(__m512 v, const Layout& L) {
  if (!L.split()) {
    const __m256i rounded = to_bf16(v);
    return {rounded, rounded};
  }
  __m512i hi, lo;
  split_f32_parts(v, &hi, &lo);
  return {_mm512_cvtepi32_epi16(_mm512_srli_epi32(hi, 16)), _mm512_cvtepi32_epi16(_mm512_srli_epi32(lo, 16))};
}

DEMI_AMX_INLINE __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

// Two rows of 16 bf16 (k even, k odd) as 16 VNNI-2 words: word j = (even[j], odd[j]).
DEMI_AMX_INLINE __m512i pairs(__m256i even, __m256i odd) {
  return _mm512_or_si512(_mm512_cvtepu16_epi32(even), _mm512_slli_epi32(_mm512_cvtepu16_epi32(odd), 16));
}

// Whether an operand's values reach the tiles unsplit as bf16 to copy (stored bf16) or as f32 to round once
// to bf16: the packing's fast paths, which skip the f32 round trip of values16 and encode.
DEMI_AMX_INLINE bool plain_bf16(DType t, DType round, const Layout& L) {
  return !L.split() && (t == DType::kBF16 || (t == DType::kF32 && round == DType::kBF16));
}

// Whether an operand's values are f16 values (stored f16, or f32 read rounded to f16) reaching a split
// layout: the packing's split fast paths, which round to f16 (where stored f32), move and transpose f16
// values, and split 32 of them at a time at the end (split_f16x32: f16_split.h's split, as encode()'s).
DEMI_AMX_INLINE bool split_f16(DType t, DType round, const Layout& L) {
  return L.split() && (t == DType::kF16 || (t == DType::kF32 && round == DType::kF16));
}

DEMI_AMX_INLINE __m256i to_f16(const float* f) {
  return _mm512_cvtps_ph(_mm512_loadu_ps(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

DEMI_AMX_INLINE __m256i load16(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

DEMI_AMX_INLINE const uint16_t* words16(const void* base) { return static_cast<const uint16_t*>(base); }

// 32 consecutive values of a row from base + i as 16-bit values, f16 where `f16` (split_f16 holds), else
// bf16 (plain_bf16 holds): copied where stored so, else rounded once to nearest even (to_bf16's and
// values16's rounding).
DEMI_AMX_INLINE __m512i row32(const void* base, DType t, int64_t i, bool f16) {
  if (t != DType::kF32) return _mm512_loadu_si512(words16(base) + i);
  const float* f = static_cast<const float*>(base) + i;
  if (f16) return join(to_f16(f), to_f16(f + 16));
  return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(f + 16), _mm512_loadu_ps(f));
}

// 32 16-bit values, even's 16 then odd's, as 16 words: word j = (even[j], odd[j]).
DEMI_AMX_INLINE __m512i interleave_pairs(__m512i both) {
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                              22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(interleave, both);
}

// 16 of two rows' 32 16-bit values from `from` (0 or 16) as 16 words: word j = (even[from + j], odd[from + j]).
DEMI_AMX_INLINE __m512i interleave_pairs(__m512i even, __m512i odd, int from) {
  const __m512i interleave = _mm512_add_epi16(
      _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3,
                       34, 2, 33, 1, 32, 0),
      _mm512_set1_epi16(static_cast<int16_t>(from)));
  return _mm512_permutex2var_epi16(even, interleave, odd);
}

// 16 values from column i of two stored rows (k even, k odd) as 16 VNNI-2 words, word j = (even[j],
// odd[j]), 16-bit values as row32 gives them: what pairs(encode(...)) gives where plain_bf16 holds and all
// 16 lanes are in; where f16, the f16 values not yet split.
DEMI_AMX_INLINE __m512i row_pair16(const void* even, const void* odd, DType t, int64_t i, bool f16) {
  if (t != DType::kF32) return interleave_pairs(join(load16(words16(even) + i), load16(words16(odd) + i)));
  const float *e = static_cast<const float*>(even) + i, *o = static_cast<const float*>(odd) + i;
  if (f16) return interleave_pairs(join(to_f16(e), to_f16(o)));
  return interleave_pairs((__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(o), _mm512_loadu_ps(e)));
}

// Stored rows k0 + 2q and k0 + 2q + 1 (q < 16; `row(r)` gives stored row r, rows from K on read as 0) at
// the 16 columns from `col` (mask lanes), encoded, as 16 VNNI-2 words each: hi[q] (and lo[q] where L splits)
// word j = (row k0 + 2q's value, row k0 + 2q + 1's value) at column col + j.
template <class Row>
DEMI_AMX_INLINE void stored_row_pairs(Row&& row, DType t, DType round, int64_t col, __mmask16 mask, int64_t K,
                                      int64_t k0, const Layout& L, __m512i (&hi)[16], __m512i (&lo)[16]) {
  if (mask == 0xffff && k0 + kKStep <= K && plain_bf16(t, round, L)) {  // (all 32 rows and 16 columns in)
    for (int q = 0; q < 16; ++q) hi[q] = row_pair16(row(k0 + 2 * q), row(k0 + 2 * q + 1), t, col, false);
    return;
  }
  for (int q = 0; q < 16; ++q) {
    const int64_t k = k0 + 2 * q;
    const Encoded e0 = encode(values16(row(k), t, round, col, k < K ? mask : 0), L);
    const Encoded e1 = encode(values16(row(k + 1), t, round, col, k + 1 < K ? mask : 0), L);
    hi[q] = pairs(e0.hi, e1.hi);
    if (L.split()) lo[q] = pairs(e0.lo, e1.lo);
  }
}

// The K' values of a's packed rows: each segment's values [begin, end) (multiples of kKStep), the segments
// `lo` elements apart in a row (the whole K' by default: [0, kp), kp apart).
struct KRange {
  int64_t begin, end, lo;
  static KRange all(const Layout& L) { return {0, L.kp, L.kp}; }
};

// a (M x K, or stored K x M with trans_a) -> rows of bf16: row i's segment s's values [r.begin, r.end) at
// s * r.lo, zero beyond K in each segment and in the rows beyond M. This writes the row groups of 16 [g0,
// g1), row i at dst + (i - row0) ld.
void pack_a(const MatmulParams& p, const void* a, const Layout& L, int64_t g0, int64_t g1, int64_t row0,
            int64_t ld, BFloat16* dst, const KRange& r) {
  const int64_t M = p.m, K = p.k;
  const size_t es = dtype_size(p.a_dtype);
  const char* base = static_cast<const char*>(a);
  auto row = [&](int64_t k) {  // stored row k (clamped: a row past the end is read with no lanes)
    return base + static_cast<size_t>(std::min(k, (p.trans_a ? K : M) - 1) * L.stored_ld) * es;
  };
  // (whole steps of 32 values copied or rounded at once where plain_bf16 holds, or split at once where
  // split_f16 does; the rest encoded)
  const bool halves = split_f16(p.a_dtype, p.a_round, L), at_once = halves || plain_bf16(p.a_dtype, p.a_round, L);
  // [r.begin, whole): whole steps; [whole, r.end): the rest
  const int64_t whole = std::clamp(at_once ? K / kKStep * kKStep : 0, r.begin, r.end);
  if (!p.trans_a) {
    for (int64_t i = g0 * kTile; i < g1 * kTile; ++i) {
      BFloat16* out = dst + (i - row0) * ld - r.begin;  // (value k of a segment at out + k)
      if (i >= M) {
        for (int64_t s = 0; s < L.segs; ++s)
          std::memset(static_cast<void*>(out + s * r.lo + r.begin), 0,
                      static_cast<size_t>(r.end - r.begin) * sizeof(BFloat16));
        continue;
      }
      const char* src = row(i);
      for (int64_t k0 = r.begin; k0 < whole; k0 += kKStep) {
        if (!halves) {
          _mm512_storeu_si512(out + k0, row32(src, p.a_dtype, k0, false));
          continue;
        }
        __m512i hi, lo;
        split_f16x32(row32(src, p.a_dtype, k0, true), &hi, &lo);
        _mm512_storeu_si512(out + k0, hi);
        _mm512_storeu_si512(out + r.lo + k0, lo);
      }
      for (int64_t k0 = whole; k0 < r.end; k0 += kKStep) {
        const Encoded e0 = encode(values16(src, p.a_dtype, p.a_round, k0, lanes(K - k0)), L);
        const Encoded e1 = encode(values16(src, p.a_dtype, p.a_round, k0 + 16, lanes(K - k0 - 16)), L);
        for (int64_t s = 0; s < L.segs; ++s)
          _mm512_storeu_si512(out + s * r.lo + k0, join(e0.segment(s), e1.segment(s)));
      }
    }
    return;
  }
  // trans_a: op(a)'s rows i0.. are 16 columns of the stored rows k. Pairs of stored rows make 16 VNNI
  // words (k pair q, column i), which transposed are the rows' words for 32 k. The whole steps of the
  // whole pairs of groups [g0, paired) first, in one pass over the stored rows that reads each row's
  // columns for all of them at once (32 bf16|f16 are a line: model D's weight gradients read a's 4096 rows
  // 1.5 KiB apart, and a pass per group read each line twice, a few rows per page).
  int64_t paired = g0;
  if (at_once)
    while (paired + 1 < g1 && (paired + 2) * kTile <= M) paired += 2;
  for (int64_t k0 = r.begin; k0 < (paired > g0 ? whole : r.begin); k0 += kKStep)
    for (int64_t g = g0; g < paired; g += 2) {
      const int64_t i0 = g * kTile;
      __m512i w[2][16];
      for (int q = 0; q < 16; ++q) {
        const char *even = row(k0 + 2 * q), *odd = row(k0 + 2 * q + 1);
        const __m512i e = row32(even, p.a_dtype, i0, halves), o = row32(odd, p.a_dtype, i0, halves);
        w[0][q] = interleave_pairs(e, o, 0);
        w[1][q] = interleave_pairs(e, o, kTile);
      }
      for (int h = 0; h < 2; ++h) {
        transpose16(w[h]);
        for (int j = 0; j < 16; ++j) {
          BFloat16* out = dst + (i0 + h * kTile + j - row0) * ld + (k0 - r.begin);
          if (!halves) {
            _mm512_storeu_si512(out, w[h][j]);
            continue;
          }
          __m512i hi, lo;
          split_f16x32(w[h][j], &hi, &lo);
          _mm512_storeu_si512(out, hi);
          _mm512_storeu_si512(out + r.lo, lo);
        }
      }
    }
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t i0 = g * kTile;
    const __mmask16 mi = lanes(M - i0);
    for (int64_t k0 = g < paired ? whole : r.begin; k0 < r.end; k0 += kKStep) {
      __m512i hi[16], lo[16];
      stored_row_pairs(row, p.a_dtype, p.a_round, i0, mi, K, k0, L, hi, lo);
      transpose16(hi);
      if (L.split()) transpose16(lo);
      for (int64_t s = 0; s < L.segs; ++s) {
        const __m512i* w = s == 1 ? lo : hi;
        for (int j = 0; j < 16; ++j)
          _mm512_storeu_si512(dst + (i0 + j - row0) * ld + s * r.lo + (k0 - r.begin), w[j]);
      }
    }
  }
}

// b (K x N, or stored N x K with trans_b) -> column tiles of 16: tile column ct holds kq / 2 rows of 16
// pairs (VNNI-2: the 32-bit word (ct, q, j) is op(b)'s k' = 2q, 2q + 1 at column 16 ct + j), zero beyond
// K in each segment and beyond N. A TDPBF16PS's B tile is 16 of those rows: 1 KiB, 64 bytes apart. This
// writes pieces [t0, t1) of (tile column, 32 k): piece t is tile column t / (kp / 32)'s t % (kp / 32)-th;
// tile column ct at dst + (ct - ct0) kq 16.
void pack_b(const MatmulParams& p, const void* b, const Layout& L, int64_t t0, int64_t t1, int64_t ct0,
            BFloat16* dst) {
  const int64_t N = p.n, K = p.k, half = L.kq() / 2, steps = L.kp / kKStep;
  const size_t es = dtype_size(p.b_dtype);
  const char* base = static_cast<const char*>(b);
  auto row = [&](int64_t r) {  // stored row r (clamped: a row past the end is read with no lanes)
    return base + static_cast<size_t>(std::min(r, (p.trans_b ? N : K) - 1) * L.stored_ld) * es;
  };
  auto words = [&](int64_t ct, int64_t s, int64_t q) {  // tile column ct's row of k' pair (s * kp) / 2 + q
    return dst + (((ct - ct0) * half + s * L.kp / 2 + q) * kTile) * 2;
  };
  // Stored rows k whose values copy or round plainly: the whole pieces (whole steps of 32 k, tile columns of
  // 16) a pair of rows at a time across the tile columns, so that each row is read in order. (A piece at a
  // time reads 32 rows, each a line on another page: more streams than the prefetchers follow, and model
  // B's 128 x 3136 f32 weight packed at ~3 GB/s.) Where the threads split b's columns, a chunk's columns are
  // a line or two of each stored row, each row on a page of its own that the prefetchers do not follow: the
  // f16 split's rows kRowsAhead on are prefetched (2 threads: C's 256 x 1024 x 1024 f16 input gradient
  // 1.10-1.11x, on the f32 master weight or an f16 one; bf16 values, half the packing's work, 0.93-0.96x).
  constexpr int64_t kRowsAhead = 16;
  const bool halves = split_f16(p.b_dtype, p.b_round, L);
  const bool streamed = !p.trans_b && (plain_bf16(p.b_dtype, p.b_round, L) || halves);
  const int64_t whole_steps = K / kKStep, whole_columns = N / kTile;
  if (streamed)
    for (int64_t ks = 0; ks < whole_steps; ++ks) {
      // the pieces (ct, ks) in [t0, t1): ct in [c0, c1)
      const int64_t c0 = t0 <= ks ? 0 : (t0 - ks + steps - 1) / steps;
      const int64_t c1 = t1 - 1 < ks ? 0 : std::min(whole_columns, (t1 - 1 - ks) / steps + 1);
      for (int q = 0; q < 16; ++q) {
        const int64_t k = ks * kKStep + 2 * q;
        const char *even = row(k), *odd = row(k + 1);
        if (halves && k + kRowsAhead + 1 < K) {
          const char *ahead_even = row(k + kRowsAhead), *ahead_odd = row(k + kRowsAhead + 1);
          for (int64_t ct = c0; ct < c1; ++ct) {
            _mm_prefetch(ahead_even + ct * kTile * static_cast<int64_t>(es), _MM_HINT_T0);
            _mm_prefetch(ahead_odd + ct * kTile * static_cast<int64_t>(es), _MM_HINT_T0);
          }
        }
        for (int64_t ct = c0; ct < c1; ++ct) {
          const __m512i w = row_pair16(even, odd, p.b_dtype, ct * kTile, halves);
          if (!halves) {
            _mm512_storeu_si512(words(ct, 0, k / 2), w);
            continue;
          }
          __m512i hi, lo;
          split_f16x32(w, &hi, &lo);
          _mm512_storeu_si512(words(ct, 0, k / 2), hi);
          _mm512_storeu_si512(words(ct, 1, k / 2), lo);
        }
      }
    }
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t ct = t / steps, k0 = (t % steps) * kKStep, n0 = ct * kTile;
    if (streamed && ct < whole_columns && k0 / kKStep < whole_steps) continue;  // (done above)
    __m512i hi[16], lo[16];
    if (!p.trans_b) {  // stored rows k: 16 columns of two of them are 16 words
      stored_row_pairs(row, p.b_dtype, p.b_round, n0, lanes(N - n0), K, k0, L, hi, lo);
    } else if (n0 + kTile <= N && k0 + kKStep <= K && (halves || plain_bf16(p.b_dtype, p.b_round, L))) {
      // (as below, at once; f16 words transposed, then split)
      for (int r = 0; r < 16; ++r) hi[r] = row32(row(n0 + r), p.b_dtype, k0, halves);
      transpose16(hi);
      if (halves)
        for (int q = 0; q < 16; ++q) split_f16x32(hi[q], &hi[q], &lo[q]);
    } else {  // stored rows n: 32 k of one are its 16 words; transposed, the 16 columns' rows
      for (int r = 0; r < 16; ++r) {
        const int64_t n = n0 + r;
        const char* src = row(n);
        const bool in = n < N;
        const Encoded e0 = encode(values16(src, p.b_dtype, p.b_round, k0, in ? lanes(K - k0) : 0), L);
        const Encoded e1 = encode(values16(src, p.b_dtype, p.b_round, k0 + 16, in ? lanes(K - k0 - 16) : 0), L);
        hi[r] = join(e0.hi, e1.hi);
        if (L.split()) lo[r] = join(e0.lo, e1.lo);
      }
      transpose16(hi);
      if (L.split()) transpose16(lo);
    }
    for (int64_t s = 0; s < L.segs; ++s) {
      const __m512i* w = s == 1 ? lo : hi;
      for (int q = 0; q < 16; ++q) _mm512_storeu_si512(words(ct, s, k0 / 2 + q), w[q]);
    }
  }
}

// v rounded once (to nearest even) into t at p + i, mask lanes.
DEMI_AMX_INLINE void store_row(void* base, DType t, int64_t i, __m512 v, __mmask16 mask) {
  switch (t) {
    case DType::kBF16:
      _mm256_mask_storeu_epi16(static_cast<BFloat16*>(base) + i, mask, (__m256i)_mm512_cvtneps_pbh(v));
      break;
    case DType::kF16:
      _mm256_mask_storeu_epi16(static_cast<Half*>(base) + i, mask,
                               _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      break;
    default: _mm512_mask_storeu_ps(static_cast<float*>(base) + i, mask, v); break;
  }
}

// The block's sums (acc, 32 x 32 f32) stored into c's rows i0.. (ldc apart; the residual's alike), columns
// j0.. (mv x nv valid) with the epilogue: + c (accumulate) or + residual, + bias, ReLU, one rounding into c's
// dtype. A bf16 row of the
// block is one store of 64 bytes (two of 32, masked, measured 27% of model B's 128 x 3136 x 128 data
// gradient: the output's lines written in halves).
void store_block(const MatmulParams& p, const float (&acc)[kBlock][kBlock], int64_t i0, int64_t j0, int64_t mv,
                 int64_t nv, void* c, int64_t ldc, const void* residual, const float* bias) {
  const __mmask32 mask = nv >= kBlock ? ~__mmask32{0} : static_cast<__mmask32>((1u << nv) - 1);
  const __mmask16 half_mask[2] = {static_cast<__mmask16>(mask), static_cast<__mmask16>(mask >> 16)};
  for (int64_t r = 0; r < mv; ++r) {
    const int64_t at = (i0 + r) * ldc + j0;
    __m512 v[2];
    for (int64_t g = 0; g < 2; ++g) {  // (a half past nv: all lanes masked, its values never stored)
      const __mmask16 m = half_mask[g];
      v[g] = _mm512_loadu_ps(&acc[r][g * kTile]);
      if (p.accumulate) v[g] = _mm512_add_ps(v[g], load_row(c, p.c_dtype, at + g * kTile, m));
      if (residual != nullptr) v[g] = _mm512_add_ps(v[g], load_row(residual, p.c_dtype, at + g * kTile, m));
      if (bias != nullptr) v[g] = _mm512_add_ps(v[g], _mm512_maskz_loadu_ps(m, bias + j0 + g * kTile));
      if (p.relu) v[g] = _mm512_max_ps(v[g], _mm512_setzero_ps());
    }
    if (p.c_dtype == DType::kBF16) {
      _mm512_mask_storeu_epi16(static_cast<BFloat16*>(c) + at, mask, (__m512i)_mm512_cvtne2ps_pbh(v[1], v[0]));
      continue;
    }
    for (int64_t g = 0; g < 2; ++g)
      if (half_mask[g] != 0) store_row(c, p.c_dtype, at + g * kTile, v[g], half_mask[g]);
  }
}

// Where a row block of a's rows is (32 rows of kq bf16, ld(mb) apart): in a itself (`direct`: bf16
// values stored by rows, K a multiple of 32) for the row blocks before `packed_from`, packed from there on
// (all of them where a is not direct; only the last, partial one where it is, which must not be read past
// M). Packed rows are kq + 32 apart: 2^n bytes apart, a block's rows would share a few L1 sets.
// Packed rows may hold a range of K' (KRange): `k_from` is their first value, `lo` the distance from a
// row's hi part to its lo part where split.
struct RowsOfA {
  const BFloat16* direct = nullptr;
  const BFloat16* packed = nullptr;
  int64_t packed_from = 0, direct_ld = 0, packed_ld = 0, k_from = 0, lo = 0;
  const BFloat16* block(int64_t mb) const {
    return mb < packed_from ? direct + mb * kBlock * direct_ld : packed + (mb - packed_from) * kBlock * packed_ld;
  }
  int64_t ld(int64_t mb) const { return mb < packed_from ? direct_ld : packed_ld; }
};

// One K block of a row block of a (kKBlock of its K' values, or what is left): its steps of kKStep, whether
// it is the first and the last, and the row block's two tile rows from k0 on, `stride` bytes apart.
struct KBlock {
  int64_t mb, k0, steps;
  bool first, last;
  const BFloat16 *a0, *a1;
  int64_t stride;
};

// body(KBlock) for each row block [m0, m1) of pa and each K block (`block` values, a multiple of kKStep) of
// its kq values, in that order (blocks(), where k_blocked: a's rows hold the whole K').
template <class Body>
DEMI_AMX_INLINE void for_each_k_block(const RowsOfA& pa, int64_t m0, int64_t m1, int64_t kq, int64_t block,
                                      Body&& body) {
  for (int64_t mb = m0; mb < m1; ++mb)
    for (int64_t k0 = 0; k0 < kq; k0 += block) {
      const BFloat16* a0 = pa.block(mb) + k0;
      body(KBlock{mb, k0, std::min(block, kq - k0) / kKStep, k0 == 0, k0 + block >= kq, a0,
                  a0 + kTile * pa.ld(mb), pa.ld(mb) * static_cast<int64_t>(sizeof(BFloat16))});
    }
}

// Whether a call of blocks() over `column_blocks` column blocks runs K blocks (blocks(), held): K' longer
// than one K block and at most kMaxKBlocks of them, and more than one column block to reuse a's block on
// (with one, only the spills would be paid). Measured in paired rounds, 2 threads (Xeon, AMX), against one
// pass over the whole K': K' of 800-1024 1.04-1.20x (1024^3, 512 x 512 x 1024, C's 256 x 1024 x 784 and x
// 1024, D's 4096 x 256 x 1024; 128 x 1024 x 1024 and 256 x 256 x 1024 within noise), K' of 3136
// 0.82-0.95x (model B's first Dense 128 x 128 x 3136, 256 x 256, 1024 x 1024 and 4096 x 256 x 3136).
constexpr int64_t kMaxKBlocks = 4;
bool k_blocked(const Layout& L, int64_t column_blocks) {
  return !L.split() && L.kq() > kKBlock && L.kq() <= kMaxKBlocks * kKBlock && column_blocks > 1;
}

// The C blocks (row blocks [m0, m1) x column blocks [n0, n1), 32 x 32 each) = a . packed b over K',
// stored through the epilogue. pb holds packed b's column blocks from pb_nb0 on (column block nb's two tile
// columns at pb + 2 (nb - pb_nb0) kq 16).
// Where k_blocked(L, n1 - n0): per row block, K blocks of kKBlock, each multiplied into every column block in
// turn, so that a's block (32 rows of kKBlock bf16: 16 KiB) stays in L1 across the column blocks while b's
// stream from L2; each C block's sums wait in `held` ((n1 - n0) 32 x 32 f32 blocks) between K blocks, stored
// from the tiles and loaded back exactly: the same sums in the same order as one pass over the whole K'. No
// prefetch instruction: the hardware's prefetchers follow b's blocks (K blocks with a's rows prefetched
// had measured slower than one pass; a microbenchmark of the 2 x 2 loop lost ~10% to 64 prefetches a step).
// Otherwise each C block stays in the tiles over the whole K' and goes through the store once; its b columns
// (and a's rows, where a row block is too large to stay in L1 across the column blocks) stream from L2, each
// step's tiles prefetched into L1 kAhead steps before it (a's 32 rows of 64 bytes, b's 32 lines; near the end
// of K, the next column block's first steps); 3 or 4 steps ahead were slower.
void blocks(const MatmulParams& p, const Layout& L, const RowsOfA& pa, const BFloat16* pb, int64_t pb_nb0, int64_t m0,
            int64_t m1, int64_t n0, int64_t n1, float* held, void* c, int64_t ldc, const void* residual,
            const float* bias) {
  constexpr int64_t kAhead = 2;
  const int64_t kq = L.kq(), half = kq / 2, steps = kq / kKStep;
  // An f32 C with nothing to add or apply takes a whole block's sums straight from the tiles, not through
  // `acc` and the epilogue (which wrote every value twice): 2 threads, paired rounds, attention's f32 scores
  // (128 products of 128 x 128 x 64) 1.29x, model B's f32 weight gradient 1.5x, C's 1.16x, 1024^3 1.11x.
  const bool plain_f32 = p.c_dtype == DType::kF32 && !p.accumulate && residual == nullptr && bias == nullptr && !p.relu;
  alignas(64) float acc[kBlock][kBlock];
  // The tiles' sums of C block (mb, nb) through the store.
  const auto store = [&](int64_t mb, int64_t nb) {
    const int64_t i0 = mb * kBlock, j0 = nb * kBlock;
    if (plain_f32 && i0 + kBlock <= p.m && j0 + kBlock <= p.n) {  // (the tiles' rows are C's rows)
      store_c_tiles(static_cast<float*>(c) + i0 * ldc + j0, ldc);
      return;
    }
    store_c_tiles(&acc[0][0], kBlock);
    store_block(p, acc, i0, j0, std::min(kBlock, p.m - i0), std::min(kBlock, p.n - j0), c, ldc, residual, bias);
  };
  if (k_blocked(L, n1 - n0)) {
    // K blocks of even length (at most kKBlock): K' = 288 as 160 + 128, not 256 + 32 (a last block of one
    // step spilled and reloaded every C block for one step's products: 1024 x 1024 x 288 1.04-1.06x even,
    // 1024^2 x 800 1.07-1.08x, against blocks of 256)
    const int64_t count = (kq + kKBlock - 1) / kKBlock, even = (kq / kKStep + count - 1) / count * kKStep;
    for_each_k_block(pa, m0, m1, kq, even, [&](const KBlock& kb) {
      for (int64_t nb = n0; nb < n1; ++nb) {
        const BFloat16* t0 = pb + (2 * (nb - pb_nb0) * half + kb.k0 / 2) * 2 * kTile;
        const BFloat16* t1 = t0 + half * 2 * kTile;
        const bool second = nb * kBlock + kTile < p.n;  // (as below)
        float* sums = held + (nb - n0) * kBlock * kBlock;
        if (kb.first)
          zero_c_tiles();
        else
          load_c_tiles(sums, kBlock);
        for (int64_t s = 0; s < kb.steps; ++s) {
          const int64_t t = s * kTile * 2 * kTile;  // a step's offset in b's tile columns
          if (second)
            multiply_c_tiles(kb.a0 + s * kKStep, kb.a1 + s * kKStep, kb.stride, t0 + t, t1 + t, 64);
          else
            multiply_c_column(kb.a0 + s * kKStep, kb.a1 + s * kKStep, kb.stride, t0 + t, 64);
        }
        if (kb.last)
          store(kb.mb, nb);
        else
          store_c_tiles(sums, kBlock);
      }
    });
    return;
  }
  for (int64_t mb = m0; mb < m1; ++mb) {
    const int64_t lda = pa.ld(mb), stride = lda * static_cast<int64_t>(sizeof(BFloat16));
    const BFloat16* a0 = pa.block(mb);
    const BFloat16* a1 = a0 + kTile * lda;
    const bool stream_a = kBlock * stride > (int64_t{24} << 10);  // (else it stays in L1 across the columns)
    for (int64_t nb = n0; nb < n1; ++nb) {
      const BFloat16* t0 = pb + 2 * (nb - pb_nb0) * half * 2 * kTile;
      const BFloat16* t1 = t0 + half * 2 * kTile;
      // (a last block of at most 16 columns: its second tile column is not multiplied, nor packed where b
      // is packed whole: a Dense of 10 outputs packs and multiplies 16 columns, not 32)
      const bool second = nb * kBlock + kTile < p.n;
      zero_c_tiles();
      for (int64_t s = 0; s < steps; ++s) {
        if (s + kAhead < steps) {
          const char* na0 = reinterpret_cast<const char*>(a0 + (s + kAhead) * kKStep);
          const char* na1 = reinterpret_cast<const char*>(a1 + (s + kAhead) * kKStep);
          const char* nb0 = reinterpret_cast<const char*>(t0 + (s + kAhead) * kTile * 2 * kTile);
          const char* nb1 = reinterpret_cast<const char*>(t1 + (s + kAhead) * kTile * 2 * kTile);
          for (int l = 0; l < 16; ++l) {
            if (stream_a) {
              _mm_prefetch(na0 + l * stride, _MM_HINT_T0);
              _mm_prefetch(na1 + l * stride, _MM_HINT_T0);
            }
            _mm_prefetch(nb0 + 64 * l, _MM_HINT_T0);
            if (second) _mm_prefetch(nb1 + 64 * l, _MM_HINT_T0);
          }
        } else if (nb + 1 < n1) {  // the next column block's first steps (the row block's a is in cache)
          const BFloat16* u0 = t0 + 2 * half * 2 * kTile;
          const char* nb0 = reinterpret_cast<const char*>(u0 + (s + kAhead - steps) * kTile * 2 * kTile);
          const char* nb1 = nb0 + half * 2 * kTile * static_cast<int64_t>(sizeof(BFloat16));
          const bool next_second = (nb + 1) * kBlock + kTile < p.n;
          for (int l = 0; l < 16; ++l) {
            _mm_prefetch(nb0 + 64 * l, _MM_HINT_T0);
            if (next_second) _mm_prefetch(nb1 + 64 * l, _MM_HINT_T0);
          }
        }
        if (second)
          multiply_c_tiles(a0 + s * kKStep, a1 + s * kKStep, stride, t0 + s * kTile * 2 * kTile,
                           t1 + s * kTile * 2 * kTile, 64);
        else
          multiply_c_column(a0 + s * kKStep, a1 + s * kKStep, stride, t0 + s * kTile * 2 * kTile, 64);
      }
      store(mb, nb);
    }
  }
}

// blocks() for split operands: a's rows and b's tile columns hold K' = [hi | lo], kp values each, and each
// step of 32 k multiplies the four products ah bh, al bh, al bl, ah bl of the 2 x 2 C tiles in turn, one
// chain per C tile: ten tile loads (a's hi and lo rows twice, b's once) for sixteen products, each C tile
// multiplied every fourth product. Each C block stays in the tiles over the whole K (or the whole `panel`
// a's rows and b hold, its chains then waiting in `held` between the calls over the panels: a 32 x 32 f32 block
// per row block and column block) and goes through the store once; a's and b's tiles load from L2.
// Measured (`gemm_bench`, 2 threads, Xeon with AMX, against K blocks of 256 with the sums stored and
// reloaded between them, each store waiting for the tile unit to finish the block's products): C's f16
// products 1.13-1.29x, D's input and weight gradients 1.18-1.29x, 1024^3 1.22x. (No prefetch: a's next
// steps, b's, or both measured within noise of none.)
void blocks_split(const MatmulParams& p, const Layout& L, const RowsOfA& pa, const BFloat16* pb, int64_t pb_nb0,
                  int64_t m0, int64_t m1, int64_t n0, int64_t n1, float* held, void* c, int64_t ldc,
                  const void* residual, const float* bias, const KRange* panel) {
  const KRange k = panel != nullptr ? *panel : KRange::all(L);
  // b's tile columns: its whole K' (hi | lo), or where a panel, the panel's alone (packed as the b of a product
  // of the panel's K: panel_b)
  const int64_t kp = L.kp, half = k.end - k.begin, alo = pa.lo, blo = half / 2 * 2 * kTile;
  const bool first = k.begin == 0, last = k.end == kp;
  const int64_t steps = (k.end - k.begin) / kKStep;
  alignas(64) float acc[kBlock][kBlock];
  for (int64_t mb = m0; mb < m1; ++mb) {
    const BFloat16* a0 = pa.block(mb) + (k.begin - pa.k_from);
    const BFloat16* a1 = a0 + kTile * pa.ld(mb);
    const int64_t stride = pa.ld(mb) * static_cast<int64_t>(sizeof(BFloat16));
    for (int64_t nb = n0; nb < n1; ++nb) {
      float* const sums = panel != nullptr ? held + ((mb - m0) * (n1 - n0) + nb - n0) * kBlock * kBlock : nullptr;
      const BFloat16* b0 = pb + 2 * (nb - pb_nb0) * half * 2 * kTile;  // b's hi, columns 0-15
      const BFloat16* b1 = b0 + half * 2 * kTile;                       // columns 16-31
      if (first)
        zero_c_tiles();
      else
        load_c_tiles(sums, kBlock);
      // (written out: the tile registers are immediates the intrinsics paste into the instruction; tiles 0-3
      // C rows 0-15 | 16-31 x columns 0-15 | 16-31, 4 and 5 a's rows 0-15 and 16-31, 6 and 7 b's columns)
      for (int64_t s = 0; s < steps; ++s) {
        const int64_t t = s * kTile * 2 * kTile, o = s * kKStep;
        _tile_loadd(4, a0 + o, stride);  // ah bh
        _tile_loadd(6, b0 + t, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b1 + t, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a1 + o, stride);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        _tile_loadd(4, a0 + alo + o, stride);  // al bh
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a1 + alo + o, stride);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        _tile_loadd(6, b0 + blo + t, 64);  // al bl
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b1 + blo + t, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        _tile_loadd(4, a0 + o, stride);  // ah bl
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a1 + o, stride);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      if (!last) {
        store_c_tiles(sums, kBlock);
        continue;
      }
      store_c_tiles(&acc[0][0], kBlock);
      const int64_t i0 = mb * kBlock, j0 = nb * kBlock;
      store_block(p, acc, i0, j0, std::min(kBlock, p.m - i0), std::min(kBlock, p.n - j0), c, ldc, residual, bias);
    }
  }
}

// Whether a batch of products, each packing `item_bytes` (a, b and the split's held sums), runs a whole
// product per thread: enough of them to share evenly (four per thread), each small enough to stay in a
// core's L2 beside its output.
bool batch_parallel(int64_t batch, size_t item_bytes) {
  return batch >= 4 * num_threads() && item_bytes <= (size_t{256} << 10);
}

// A product's packing and blocking: the operands' K' layout, the blocks, what one product packs.
struct Geometry {
  Layout la, lb;
  int64_t mp, np, kq, pn, mblocks, nblocks, steps, ld, packed_from, ldc;
  bool split, direct;
  size_t item_a, item_b, item_held;  // one product's packed a (from packed_from on), packed b, held chains

  // (the stored rows of a, b and c `strides` apart, in elements)
  Geometry(const MatmulParams& p, bool split_values, const AmxStrides& strides) : ldc(strides.c), split(split_values) {
    la.k = lb.k = p.k;
    la.stored_ld = strides.a;
    lb.stored_ld = strides.b;
    la.kp = lb.kp = round_up(p.k, kKStep);
    la.segs = lb.segs = split ? 2 : 1;  // [h | l], multiplied four ways by blocks_split
    mp = round_up(p.m, kBlock);
    np = round_up(p.n, kBlock);
    kq = la.kq();
    // b's columns packed where it is packed whole: its tile columns up to N (blocks() multiplies a last
    // block of at most 16 columns as one tile column), all of the last block's where split (blocks_split)
    pn = split ? np : round_up(p.n, kTile);
    mblocks = mp / kBlock;
    nblocks = np / kBlock;
    steps = la.kp / kKStep;
    ld = kq + kKStep;  // packed a's rows (RowsOfA)
    // a's tiles load from a itself where its rows already are the packed rows (bf16 by rows, K a multiple
    // of 32, not split): only a partial last row block is packed. Not where the rows are a multiple of
    // 2 KiB apart: a block's 32 rows would crowd 16 of L1's sets (1024^3 measured 0.7x packing them).
    direct = !split && !p.trans_a && p.a_dtype == DType::kBF16 && p.k % kKStep == 0 && la.stored_ld % 1024 != 0;
    packed_from = direct ? p.m / kBlock : 0;
    item_a = static_cast<size_t>((mblocks - packed_from) * kBlock * ld) * sizeof(BFloat16);
    item_b = static_cast<size_t>(pn * kq) * sizeof(BFloat16);
    item_held = held_bytes(nblocks, false);
  }
  // The sums that wait between K blocks (bf16 values, where k_blocked) or K panels (split values, where
  // `panels`) for a row block's `column_blocks` column blocks (else they stay in the tiles over the whole K').
  size_t held_bytes(int64_t column_blocks, bool panels) const {
    const int64_t chains = (split ? panels : k_blocked(la, column_blocks)) ? 1 : 0;
    return static_cast<size_t>(chains * column_blocks * kBlock * kBlock) * sizeof(float);
  }
  // A product's rows of a: in a itself (a) before packed_from, packed at `packed` from there on.
  RowsOfA rows_of(const MatmulParams& p, const void* a, const BFloat16* packed) const {
    RowsOfA r;
    r.direct = static_cast<const BFloat16*>(a);
    r.packed = packed;
    r.packed_from = packed_from;
    r.direct_ld = la.stored_ld;
    r.packed_ld = ld;
    r.lo = la.kp;
    return r;
  }
  // The C blocks (row blocks [r0, r1) x column blocks [c0, c1)) from a's rows and packed b (its column blocks
  // from b_from on); the split's chains wait between K blocks in `held`. The split's rows may hold a `panel`
  // of K (its chains then wait in `held` per row block and column block between the calls over the panels).
  void product(const MatmulParams& p, const RowsOfA& rows, const BFloat16* packed_b, int64_t b_from, int64_t r0,
               int64_t r1, int64_t c0, int64_t c1, float* held, void* c, const void* residual, const float* bias,
               const KRange* panel = nullptr) const {
    if (split)
      return blocks_split(p, la, rows, packed_b, b_from, r0, r1, c0, c1, held, c, ldc, residual, bias, panel);
    blocks(p, la, rows, packed_b, b_from, r0, r1, c0, c1, held, c, ldc, residual, bias);
  }
  // One whole product on the calling thread (tiles configured): a and b packed into `own` (item_a +
  // item_b + item_held bytes), then multiplied.
  void whole(const MatmulParams& p, const void* a, const void* b, void* c, const void* residual, const float* bias,
             char* own) const {
    auto* own_a = reinterpret_cast<BFloat16*>(own);
    auto* own_b = reinterpret_cast<BFloat16*>(own + item_a);
    float* const held = reinterpret_cast<float*>(own + item_a + item_b);
    pack_a(p, a, la, 2 * packed_from, mp / kTile, packed_from * kBlock, ld, own_a, KRange::all(la));
    pack_b(p, b, lb, 0, pn / kTile * steps, 0, own_b);
    product(p, rows_of(p, a, own_a), own_b, 0, 0, mblocks, 0, nblocks, held, c, residual, bias);
  }
  size_t whole_bytes() const { return item_a + item_b + item_held; }
  // A row block of a's rows packed kPanel values of K at a time (split: hi and lo), in bf16 values.
  int64_t panel_ld() const { return 2 * kPanel + kKStep; }
  int64_t panel_block() const { return kBlock * panel_ld(); }
  // Packed b of one panel r of K (as the b of the product of r's K values: hi | lo, r's length each), in bf16
  // values; its pieces (tile column, 32 k), and pieces [t0, t1) of it packed from b into dst.
  int64_t panel_b() const { return pn * 2 * kPanel; }
  int64_t panel_pieces(const KRange& r) const { return pn / kTile * ((r.end - r.begin) / kKStep); }
  void pack_panel_b(const MatmulParams& p, const void* b, const KRange& r, int64_t t0, int64_t t1,
                    BFloat16* dst) const {
    MatmulParams q = p;
    q.k = std::min(p.k, r.end) - r.begin;
    Layout l = lb;
    l.k = q.k;
    l.kp = r.end - r.begin;
    const size_t row = p.trans_b ? 1 : static_cast<size_t>(lb.stored_ld);  // elements from b's value k to k + 1
    pack_b(q, static_cast<const char*>(b) + r.begin * row * dtype_size(p.b_dtype), l, t0, t1, 0, dst);
  }
};

// p's bias as f32: itself, or converted into `room` (n floats) where it is stored in c's dtype (exact).
const float* bias_f32(const MatmulParams& p, float* room) {
  if (p.bias == nullptr || p.bias_dtype == DType::kF32) return static_cast<const float*>(p.bias);
  convert(p.bias, p.bias_dtype, room, DType::kF32, p.n);
  return room;
}

size_t bias_room(const MatmulParams& p) {
  return p.bias != nullptr && p.bias_dtype != DType::kF32 ? bytes64(static_cast<size_t>(p.n) * sizeof(float)) : 0;
}

// How a call's C blocks are shared (amx_gemm_body): whole products per thread (`items`), or the threads
// splitting b's columns (by_columns) or a's rows into `parts`, each packing `chunk` of its blocks at a time
// and multiplying them with b's column blocks `b_chunk` at a time — where `panel` is not 0 (split values,
// a's rows, a long K), `panel` values of K at a time (kp's panels) for a and b, its rows' chains held between
// panels.
struct Shares {
  bool items, by_columns;
  int64_t parts, chunk, b_chunk, panel;
  int64_t per_part;  // the most blocks (row or column) of a part
  // The most column blocks one blocks() call multiplies.
  int64_t column_blocks(const Geometry& g) const { return items ? g.nblocks : b_chunk; }
};

Shares shares(const MatmulParams& p, const Geometry& g) {
  const int64_t mblocks = g.mblocks, nblocks = g.nblocks;
  const bool by_columns = nblocks > mblocks;
  const int64_t a_block = kBlock * g.ld, b_block = kBlock * g.kq;  // a row block's, a column block's bf16
  const int64_t parts = parts_for(by_columns ? nblocks : mblocks);
  // (no more than a part's blocks: a thread's buffer is never larger than what it packs)
  const int64_t per_part = ((by_columns ? nblocks : mblocks) + parts - 1) / parts;
  const bool items = batch_parallel(p.batch, g.whole_bytes());
  // (where a panel of packed b, hi and lo, fits the chunk's bytes: 1024^3 at f16, a 2 MiB panel, measured 0.7x)
  // (and a part's chains, held between panels, fit one too)
  const int64_t b_panel = g.panel_b() * static_cast<int64_t>(sizeof(BFloat16));
  const int64_t part_held = per_part * static_cast<int64_t>(g.held_bytes(nblocks, true));
  if (g.split && !by_columns && !items && g.la.kp > kPanel && b_panel <= kChunkBytes && part_held <= kChunkBytes) {
    const int64_t chunk = std::clamp<int64_t>(kChunkBytes / g.panel_block() / 2, 1, per_part);
    return {false, false, parts, chunk, nblocks, kPanel, per_part};
  }
  const int64_t chunk =
      std::clamp<int64_t>((by_columns ? kColumnChunkBytes / b_block : kChunkBytes / a_block) / 2, 1, per_part);
  // column blocks per blocks() call
  const int64_t b_chunk = by_columns ? chunk : std::clamp<int64_t>(kChunkBytes / (b_block * 2), 1, nblocks);
  return {items, by_columns, parts, chunk, b_chunk, 0, per_part};
}

// amx_gemm_body's product where sh.panel: K a panel at a time, outermost. One parallel region per panel: each
// thread packs its share of the next panel of b (into the other of pb's two) and multiplies its row blocks by
// this one, a chunk of them at a time, packing the chunk's rows of the panel of a into its own buffer first;
// each C block's chains wait between panels in the thread's `held` (a 32 x 32 f32 block per row block and
// column block of its part). A panel of b stays in L2 across a thread's row blocks (one pass per row block
// streamed all of packed b from L3), and it is the only packed b there is: two panels, not the whole of it
// (model B's 128 x 128 x 3136 f16 forward: 0.5 MiB instead of 1.6).
void panels(const MatmulParams& p, const Geometry& g, const Shares& sh, const void* a, const void* b, void* c,
            const void* residual, const float* bias, const RowsOfA& shared_a, BFloat16* pb,
            const PartScratch& scratch, size_t own_bytes) {
  const int64_t kp = g.la.kp, count = (kp + sh.panel - 1) / sh.panel, parts = sh.parts, mblocks = g.mblocks;
  const auto range = [&](int64_t i) { return KRange{i * sh.panel, std::min(kp, (i + 1) * sh.panel), sh.panel}; };
  const auto buffer = [&](int64_t i) { return pb + (i % 2) * g.panel_b(); };
  // part t's share of panel i's pieces of b
  const auto pack_share = [&](int64_t i, int64_t t) {
    const KRange r = range(i);
    const int64_t pieces = g.panel_pieces(r);
    g.pack_panel_b(p, b, r, t * pieces / parts, (t + 1) * pieces / parts, buffer(i));
  };
  for_each_part(parts, parts, [&](int64_t t, int64_t, int64_t) { pack_share(0, t); });
  for (int64_t i = 0; i < count; ++i) {
    const KRange r = range(i);
    for_each_part(parts, mblocks, [&](int64_t part, int64_t m0, int64_t m1) {
      if (i + 1 < count) pack_share(i + 1, part);
      configure_tiles();
      auto* own = reinterpret_cast<BFloat16*>(scratch.part(part));
      float* const held = reinterpret_cast<float*>(scratch.part(part) + own_bytes);
      RowsOfA own_a = shared_a;
      own_a.packed = own;
      own_a.packed_ld = g.panel_ld();
      own_a.lo = sh.panel;
      own_a.k_from = r.begin;
      for (int64_t c0 = m0; c0 < m1; c0 += sh.chunk) {
        const int64_t c1 = std::min(m1, c0 + sh.chunk);
        own_a.packed_from = c0;
        pack_a(p, a, g.la, 2 * c0, 2 * c1, c0 * kBlock, g.panel_ld(), own, r);
        g.product(p, own_a, buffer(i), 0, c0, c1, 0, g.nblocks, held + (c0 - m0) * g.nblocks * kBlock * kBlock, c,
                  residual, bias, &r);
      }
      _tile_release();
    });
  }
}

}  // namespace

// The threads split C along the operand that is larger (a's rows where M >= N, else b's columns): the
// smaller one is packed first, whole, by all of them, and read by all; each thread packs its part of the
// larger one itself, a chunk at a time into a buffer of its own (what fits a quarter of a core's L2), just
// before multiplying it, so that what it packs is still in its cache when its tiles load it, and the
// larger operand is never held packed whole. A batch of many small products goes a product per thread
// (batch_parallel).
void amx_gemm_body(const MatmulParams& p, const void* a, const void* b, void* c, bool split) {
  const Geometry g(p, split, AmxStrides::contiguous(p));
  const int64_t mblocks = g.mblocks, nblocks = g.nblocks, steps = g.steps, mp = g.mp, pn = g.pn;
  const Shares sh = shares(p, g);
  const bool by_columns = sh.by_columns;
  const int64_t parts = sh.parts, chunk = sh.chunk, b_chunk = sh.b_chunk;
  const int64_t a_block = kBlock * g.ld, b_block = kBlock * g.kq;  // a row block's, a column block's bf16
  Workspace bias32(bias_room(p));
  const float* bias = bias_f32(p, bias32.f32());
  const size_t as = dtype_size(p.a_dtype), bs = dtype_size(p.b_dtype), cs = dtype_size(p.c_dtype);
  // Product i's operands, output and residual.
  struct Item {
    const void *a, *b;
    void* c;
    const void* residual;
  };
  const auto item = [&](int64_t i) {
    const size_t at = static_cast<size_t>(i * p.m * p.n) * cs;
    return Item{static_cast<const char*>(a) + static_cast<size_t>(i * p.m * p.k) * as,
                static_cast<const char*>(b) + static_cast<size_t>(i * p.k * p.n) * bs, static_cast<char*>(c) + at,
                p.residual != nullptr ? static_cast<const char*>(p.residual) + at : nullptr};
  };
  // Many small products (attention's, one per sequence and head): the threads take whole products, each
  // packing its a and b whole into buffers of its own and multiplying all of it — one parallel region for
  // the batch instead of three per product, whose packing and waiting took most of the time (model D's 128
  // products of 128 x 128 x 64 and 128 x 64 x 128, 2 threads: 1.6-3.6x as fast; with the f32 store from
  // the tiles (blocks()), 0.85-1.1x oneDNN's batched matmul). The same sums as product by product.
  if (sh.items) {
    const int64_t items = parts_for(p.batch);
    const PartScratch own(items, g.whole_bytes());
    for_each_part(items, p.batch, [&](int64_t part, int64_t i0, int64_t i1) {
      configure_tiles();
      for (int64_t i = i0; i < i1; ++i) {
        const Item it = item(i);
        g.whole(p, it.a, it.b, it.c, it.residual, bias, own.part(part));
      }
      _tile_release();
    });
    return;
  }
  // Shared: a (the row blocks from packed_from on) where the threads split b, else b, whole; each thread's
  // own: its chunk of the larger one, and its C sums between K blocks. (All taken here, on the calling
  // thread: workers allocate nothing.)
  const bool a_shared = by_columns || g.direct;
  Workspace pa(a_shared ? g.item_a : 0);
  // (where panels, two panels of b: the next one packed while the threads multiply this one)
  Workspace pb(by_columns ? 0 : sh.panel > 0 ? 2 * static_cast<size_t>(g.panel_b()) * sizeof(BFloat16) : g.item_b);
  const size_t sums_bytes = g.held_bytes(b_chunk, sh.panel > 0) * static_cast<size_t>(sh.panel > 0 ? sh.per_part : 1);
  const size_t own_bytes = by_columns   ? static_cast<size_t>(chunk * b_block) * sizeof(BFloat16)
                           : g.direct   ? 0
                           : sh.panel   ? static_cast<size_t>(chunk * g.panel_block()) * sizeof(BFloat16)
                                        : static_cast<size_t>(chunk * a_block) * sizeof(BFloat16);
  const PartScratch scratch(parts, own_bytes + sums_bytes);
  auto* pa16 = reinterpret_cast<BFloat16*>(pa.f32());
  auto* pb16 = reinterpret_cast<BFloat16*>(pb.f32());
  for (int64_t i = 0; i < p.batch; ++i) {
    const auto [ai, bi, ci, ri] = item(i);
    const RowsOfA shared_a = g.rows_of(p, ai, pa16);
    if (a_shared) {  // a's packed row blocks, by all the threads
      const int64_t g0 = 2 * g.packed_from, groups = mp / kTile - g0;
      for_each_part(parts_for(groups), groups, [&](int64_t, int64_t t0, int64_t t1) {
        pack_a(p, ai, g.la, g0 + t0, g0 + t1, g.packed_from * kBlock, g.ld, pa16, KRange::all(g.la));
      });
    }
    if (sh.panel > 0) {
      panels(p, g, sh, ai, bi, ci, ri, bias, shared_a, pb16, scratch, own_bytes);
      continue;
    }
    if (!by_columns) {
      const int64_t pieces = pn / kTile * steps;
      for_each_part(parts_for(pieces), pieces,
                    [&](int64_t, int64_t t0, int64_t t1) { pack_b(p, bi, g.lb, t0, t1, 0, pb16); });
    }
    for_each_part(parts, by_columns ? nblocks : mblocks, [&](int64_t part, int64_t b0, int64_t b1) {
      configure_tiles();
      auto* own = reinterpret_cast<BFloat16*>(scratch.part(part));
      float* const held = reinterpret_cast<float*>(scratch.part(part) + own_bytes);
      for (int64_t c0 = b0; c0 < b1; c0 += chunk) {
        const int64_t c1 = std::min(b1, c0 + chunk);
        if (by_columns) {  // column blocks [c0, c1): their 2 (c1 - c0) tile columns, packed into `own`
          pack_b(p, bi, g.lb, 2 * c0 * steps, 2 * c1 * steps, 2 * c0, own);
          g.product(p, shared_a, own, c0, 0, mblocks, c0, c1, held, ci, ri, bias);
          continue;
        }
        // row blocks [c0, c1) against all of b, its column blocks a chunk's worth at a time
        RowsOfA own_a = shared_a;
        if (!g.direct) {
          own_a.packed = own;
          own_a.packed_from = c0;
          pack_a(p, ai, g.la, 2 * c0, 2 * c1, c0 * kBlock, g.ld, own, KRange::all(g.la));
        }
        for (int64_t n0 = 0; n0 < nblocks; n0 += b_chunk)
          g.product(p, own_a, pb16, 0, c0, c1, n0, std::min(nblocks, n0 + b_chunk), held, ci, ri, bias);
      }
      _tile_release();
    });
  }
}

bool amx_gemm_k_blocks(const MatmulParams& p, bool split) {
  const Geometry g(p, split, AmxStrides::contiguous(p));
  return k_blocked(g.la, shares(p, g).column_blocks(g));
}

bool amx_gemm_k_panels(const MatmulParams& p, bool split) {
  const Geometry g(p, split, AmxStrides::contiguous(p));
  return shares(p, g).panel > 0;
}

size_t amx_gemm_one_bytes(const MatmulParams& p, bool split, const AmxStrides& strides) {
  return bytes64(Geometry(p, split, strides).whole_bytes()) + bias_room(p);
}

void amx_gemm_one(const MatmulParams& p, const void* a, const void* b, void* c, bool split, void* scratch,
                  const AmxStrides& strides) {
  const Geometry g(p, split, strides);
  char* own = static_cast<char*>(scratch);
  const float* bias = bias_f32(p, reinterpret_cast<float*>(own + bytes64(g.whole_bytes())));
  g.whole(p, a, b, c, p.residual, bias, own);
}

}  // namespace demi::kernels::cpu::cpu_internal_amx

#undef DEMI_AMX_INLINE
#pragma GCC diagnostic pop
