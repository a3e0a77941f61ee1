// The tile body of demi's AMX GEMM (gemm_amx.h): packing into the tile layouts, the 2 x 2 tile block over
// the whole K', and the AVX-512 store. Compiled for AMX; reached only at the amx level
// (gemm_amx_select.cc decides).
// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands, which -Wmaybe-uninitialized
// reports inside the intrinsic headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/half.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/amx_tiles.h"
#include "demi/kernels/cpu/internal/workspace.h"
#include "demi/kernels/matmul_params.h"

namespace demi::kernels::cpu::cpu_internal_amx {
namespace {

using cpu_internal::configure_tiles;
using cpu_internal::for_each_part;
using cpu_internal::PartScratch;
using cpu_internal::parts_for;
using cpu_internal::Workspace;

// Tiles 0-3: the C block's sums (rows 0-15 | 16-31 x columns 0-15 | 16-31); 4, 5: a's two row tiles; 6, 7:
// b's two column tiles (configure_tiles: internal/amx_tiles.h).
constexpr int64_t kBlock = 32;  // a C block: 2 x 2 tiles of 16 x 16 f32
constexpr int64_t kKStep = 32;  // bf16 values in a tile row (64 bytes): the K step of one TDPBF16PS
constexpr int64_t kTile = 16;   // rows of a tile; columns of a B or C tile

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

const demi::internal::ConvertKernels& cvt() { return demi::internal::convert_kernels(CpuLevel::kAvx512Bf16); }

// n values of src (dtype t; an f32 one read rounded to `round` where that is bf16|f16) as f32.
void values_of(const void* src, DType t, DType round, int64_t n, float* out) {
  switch (t) {
    case DType::kBF16: cvt().bf16_to_f32(static_cast<const BFloat16*>(src), out, n); break;
    case DType::kF16: cvt().f16_to_f32(static_cast<const Half*>(src), out, n); break;
    default:
      std::memcpy(out, src, static_cast<size_t>(n) * sizeof(float));
      if (round != DType::kF32) round_f32(out, out, n, round);
      break;
  }
}

// An operand's K' layout: `segs` segments of kp values (K padded to 32 with zeros), hi or lo per segment:
// a's [h h l l], b's [h l h l] (f16_split.h's patterns), or one segment of bf16 values.
struct Layout {
  int64_t k = 0, kp = 0, segs = 1;
  unsigned lo_segments = 0;
  int64_t kq() const { return segs * kp; }
};

// v (n f32 values, each exact in bf16 or in f16) -> hi = bf16(v) rounded to nearest even, and with lo set,
// lo = v - hi (exact in bf16: at most 3 significant bits below hi's 8); lo 0 where hi is Inf or NaN, so
// Inf stays Inf through the four products. `wide` holds n floats.
void encode(const float* v, int64_t n, BFloat16* hi, BFloat16* lo, float* wide) {
  cvt().f32_to_bf16(v, hi, n);
  if (lo == nullptr) return;
  cvt().bf16_to_f32(hi, wide, n);
  for (int64_t i = 0; i < n; ++i) wide[i] = std::isfinite(wide[i]) ? v[i] - wide[i] : 0.0f;
  cvt().f32_to_bf16(wide, lo, n);
}

// Row r of op(a)'s K values (f32, in `row`) written as packed a's row: its segments at dst + s * kp.
void put_a_row(const float* row, const Layout& L, BFloat16* dst, BFloat16* hi, BFloat16* lo, float* wide) {
  encode(row, L.k, hi, L.segs > 1 ? lo : nullptr, wide);
  for (int64_t s = 0; s < L.segs; ++s)
    std::memcpy(dst + s * L.kp, (L.lo_segments >> s) & 1 ? lo : hi, static_cast<size_t>(L.k) * sizeof(BFloat16));
}

// a (M x K, or stored K x M with trans_a) -> rows [mp][kq] bf16, zero beyond K in each segment and beyond M.
void pack_a(const MatmulParams& p, const void* a, const Layout& L, int64_t mp, BFloat16* dst) {
  const int64_t M = p.m, K = p.k;
  const size_t es = dtype_size(p.a_dtype);
  std::memset(static_cast<void*>(dst), 0, static_cast<size_t>(mp * L.kq()) * sizeof(BFloat16));
  constexpr int64_t kRows = 64;  // rows of op(a) per step
  // (Every thread's scratch taken here, on the calling thread: workers allocate nothing.)
  const int64_t tasks = (M + kRows - 1) / kRows, parts = parts_for(tasks);
  const PartScratch scratch(parts, static_cast<size_t>(K) * (2 * sizeof(float) + 2 * sizeof(BFloat16)) +
                                       (p.trans_a ? static_cast<size_t>(K * kRows) * sizeof(float) : 0));
  for_each_part(parts, tasks, [&](int64_t part, int64_t t0, int64_t t1) {
    float* row = reinterpret_cast<float*>(scratch.part(part));
    float* wide = row + K;
    BFloat16* hi = reinterpret_cast<BFloat16*>(wide + K);
    BFloat16* lo = hi + K;
    float* block = reinterpret_cast<float*>(lo + K);  // trans_a: [K][rows] f32
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i0 = t * kRows, rows = std::min(kRows, M - i0);
      if (p.trans_a) {
        for (int64_t k = 0; k < K; ++k)
          values_of(static_cast<const char*>(a) + static_cast<size_t>(k * M + i0) * es, p.a_dtype, p.a_round, rows,
                    block + k * kRows);
      }
      for (int64_t i = 0; i < rows; ++i) {
        if (p.trans_a) {
          for (int64_t k = 0; k < K; ++k) row[k] = block[k * kRows + i];
        } else {
          values_of(static_cast<const char*>(a) + static_cast<size_t>((i0 + i) * K) * es, p.a_dtype, p.a_round, K,
                    row);
        }
        put_a_row(row, L, dst + (i0 + i) * L.kq(), hi, lo, wide);
      }
    }
  });
}

// b (K x N, or stored N x K with trans_b) -> column tiles of 16: tile column ct holds kq / 2 rows of 16
// pairs (VNNI-2: the 32-bit word (ct, q, j) is op(b)'s k' = 2q, 2q + 1 at column 16 ct + j), zero beyond
// K in each segment and beyond N. A TDPBF16PS's B tile is 16 of those rows: 1 KiB, 64 bytes apart.
void pack_b(const MatmulParams& p, const void* b, const Layout& L, int64_t np, BFloat16* dst) {
  const int64_t N = p.n, K = p.k, half = L.kq() / 2;
  const size_t es = dtype_size(p.b_dtype);
  std::memset(static_cast<void*>(dst), 0, static_cast<size_t>(np * L.kq()) * sizeof(BFloat16));
  auto word = [&](int64_t n, int64_t kk) {  // the bf16 slot of op(b)'s (k' = kk, n)
    return dst + ((n / kTile) * half + kk / 2) * 2 * kTile + (n % kTile) * 2 + (kk & 1);
  };
  const bool split = L.segs > 1;
  // trans_b: each column of op(b) is a stored row (K values); else each row k of op(b) is a stored row.
  const int64_t lines = p.trans_b ? N : K, len = p.trans_b ? K : N;
  const int64_t parts = parts_for(lines);
  const PartScratch scratch(parts, static_cast<size_t>(len) * (2 * sizeof(float) + 2 * sizeof(BFloat16)));
  for_each_part(parts, lines, [&](int64_t part, int64_t l0, int64_t l1) {
    float* v = reinterpret_cast<float*>(scratch.part(part));
    float* wide = v + len;
    BFloat16* hi = reinterpret_cast<BFloat16*>(wide + len);
    BFloat16* lo = hi + len;
    for (int64_t l = l0; l < l1; ++l) {
      values_of(static_cast<const char*>(b) + static_cast<size_t>(l * len) * es, p.b_dtype, p.b_round, len, v);
      encode(v, len, hi, split ? lo : nullptr, wide);
      for (int64_t s = 0; s < L.segs; ++s) {
        const BFloat16* seg = (L.lo_segments >> s) & 1 ? lo : hi;
        if (p.trans_b) {
          for (int64_t k = 0; k < K; ++k) *word(l, s * L.kp + k) = seg[k];
        } else {
          for (int64_t n = 0; n < N; ++n) *word(n, s * L.kp + l) = seg[n];
        }
      }
    }
  });
}

// mask lanes of an f32|bf16|f16 row at p + i (elements) as f32.
__m512 load_row(const void* base, DType t, int64_t i, __mmask16 mask) {
  switch (t) {
    case DType::kBF16: {
      const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const BFloat16*>(base) + i);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case DType::kF16:
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, static_cast<const Half*>(base) + i));
    default: return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + i);
  }
}

// v rounded once (to nearest even) into t at p + i, mask lanes.
void store_row(void* base, DType t, int64_t i, __m512 v, __mmask16 mask) {
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

// The block's sums (acc, 32 x 32 f32) stored into c's rows i0.., columns j0.. (mv x nv valid) with the
// epilogue: + c (accumulate) or + residual, + bias, ReLU, one rounding into c's dtype.
void store_block(const MatmulParams& p, const float (&acc)[kBlock][kBlock], int64_t i0, int64_t j0, int64_t mv,
                 int64_t nv, void* c, const void* residual, const float* bias) {
  for (int64_t r = 0; r < mv; ++r)
    for (int64_t g = 0; g < 2 && g * kTile < nv; ++g) {
      const int64_t cols = std::min(kTile, nv - g * kTile), j = j0 + g * kTile, at = (i0 + r) * p.n + j;
      const __mmask16 mask = static_cast<__mmask16>(cols == kTile ? 0xffff : (1u << cols) - 1);
      __m512 v = _mm512_loadu_ps(&acc[r][g * kTile]);
      if (p.accumulate) v = _mm512_add_ps(v, load_row(c, p.c_dtype, at, mask));
      if (residual != nullptr) v = _mm512_add_ps(v, load_row(residual, p.c_dtype, at, mask));
      if (bias != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, bias + j));
      if (p.relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
      store_row(c, p.c_dtype, at, v, mask);
    }
}

// C (mp x np, 32 x 32 blocks) = packed a . packed b over kq, stored through the epilogue. The columns go in
// chunks whose packed b stays in a core's L2 (half of it) while every row block of a passes over it; the
// threads share a chunk's row blocks. A row block's K' goes in blocks of kKBlock, whose a (32 x kKBlock, 16
// KiB) stays in L1 across the chunk's column blocks; their f32 sums wait between K blocks in `sums` (the
// chunk's 32 x 32 blocks, 4 KiB each), and the last K block's go through the store.
void multiply(const MatmulParams& p, const Layout& L, const BFloat16* pa, const BFloat16* pb, int64_t mp, int64_t np,
              void* c, const void* residual, const float* bias) {
  constexpr int64_t kKBlock = 256, kChunkBytes = int64_t{1} << 20;
  const int64_t kq = L.kq(), half = kq / 2, mblocks = mp / kBlock, nblocks = np / kBlock;
  const int64_t chunk = std::max<int64_t>(1, kChunkBytes / (kBlock * kq * static_cast<int64_t>(sizeof(BFloat16))));
  const int64_t stride = kq * static_cast<int64_t>(sizeof(BFloat16));  // a's rows, in bytes
  const int64_t parts = parts_for(mblocks);
  const PartScratch scratch(parts, kq > kKBlock ? static_cast<size_t>(chunk * kBlock * kBlock) * sizeof(float) : 0);
  for (int64_t n0 = 0; n0 < nblocks; n0 += chunk) {
    const int64_t n1 = std::min(nblocks, n0 + chunk);
    for_each_part(parts, mblocks, [&](int64_t part, int64_t m0, int64_t m1) {
      configure_tiles();
      float* const held = reinterpret_cast<float*>(scratch.part(part));
      alignas(64) float acc[kBlock][kBlock];
      for (int64_t mb = m0; mb < m1; ++mb)
        for (int64_t k0 = 0; k0 < kq; k0 += kKBlock) {
          const int64_t steps = std::min(kKBlock, kq - k0) / kKStep;
          const bool first = k0 == 0, last = k0 + kKBlock >= kq;
          const BFloat16* a0 = pa + mb * kBlock * kq + k0;
          const BFloat16* a1 = a0 + kTile * kq;
          for (int64_t nb = n0; nb < n1; ++nb) {
            const BFloat16* t0 = pb + (2 * nb) * half * 2 * kTile + k0 * kTile;
            const BFloat16* t1 = t0 + half * 2 * kTile;
            float* sums = held + (nb - n0) * kBlock * kBlock;
            if (first) {
              _tile_zero(0);
              _tile_zero(1);
              _tile_zero(2);
              _tile_zero(3);
            } else {
              _tile_loadd(0, sums, kBlock * sizeof(float));
              _tile_loadd(1, sums + kTile, kBlock * sizeof(float));
              _tile_loadd(2, sums + kTile * kBlock, kBlock * sizeof(float));
              _tile_loadd(3, sums + kTile * kBlock + kTile, kBlock * sizeof(float));
            }
            for (int64_t s = 0; s < steps; ++s) {
              // The next step's b tiles toward L1 while these multiply (2 KiB: 32 lines).
              const char* next0 = reinterpret_cast<const char*>(t0 + (s + 1) * kTile * 2 * kTile);
              const char* next1 = reinterpret_cast<const char*>(t1 + (s + 1) * kTile * 2 * kTile);
              for (int l = 0; l < 16; ++l) {
                _mm_prefetch(next0 + 64 * l, _MM_HINT_T0);
                _mm_prefetch(next1 + 64 * l, _MM_HINT_T0);
              }
              _tile_loadd(4, a0 + s * kKStep, stride);
              _tile_loadd(6, t0 + s * kTile * 2 * kTile, 64);
              _tile_dpbf16ps(0, 4, 6);
              _tile_loadd(7, t1 + s * kTile * 2 * kTile, 64);
              _tile_dpbf16ps(1, 4, 7);
              _tile_loadd(5, a1 + s * kKStep, stride);
              _tile_dpbf16ps(2, 5, 6);
              _tile_dpbf16ps(3, 5, 7);
            }
            float* out = last ? &acc[0][0] : sums;
            _tile_stored(0, out, kBlock * sizeof(float));
            _tile_stored(1, out + kTile, kBlock * sizeof(float));
            _tile_stored(2, out + kTile * kBlock, kBlock * sizeof(float));
            _tile_stored(3, out + kTile * kBlock + kTile, kBlock * sizeof(float));
            if (!last) continue;
            const int64_t i0 = mb * kBlock, j0 = nb * kBlock;
            store_block(p, acc, i0, j0, std::min(kBlock, p.m - i0), std::min(kBlock, p.n - j0), c, residual, bias);
          }
        }
      _tile_release();
    });
  }
}

}  // namespace

void amx_gemm_body(const MatmulParams& p, const void* a, const void* b, void* c, bool split) {
  Layout la, lb;
  la.k = lb.k = p.k;
  la.kp = lb.kp = round_up(p.k, kKStep);
  la.segs = lb.segs = split ? 4 : 1;
  la.lo_segments = split ? 0b1100u : 0;  // [h h l l] . [h l h l]: ah bh + ah bl + al bh + al bl
  lb.lo_segments = split ? 0b1010u : 0;
  const int64_t mp = round_up(p.m, kBlock), np = round_up(p.n, kBlock);
  Workspace pa(static_cast<size_t>(mp * la.kq()) * sizeof(BFloat16));
  Workspace pb(static_cast<size_t>(np * lb.kq()) * sizeof(BFloat16));
  Workspace bias32(p.bias != nullptr && p.bias_dtype != DType::kF32 ? static_cast<size_t>(p.n) * sizeof(float) : 0);
  const float* bias = static_cast<const float*>(p.bias);
  if (p.bias != nullptr && p.bias_dtype != DType::kF32) {
    values_of(p.bias, p.bias_dtype, DType::kF32, p.n, bias32.f32());
    bias = bias32.f32();
  }
  auto* pa16 = reinterpret_cast<BFloat16*>(pa.f32());
  auto* pb16 = reinterpret_cast<BFloat16*>(pb.f32());
  const size_t as = dtype_size(p.a_dtype), bs = dtype_size(p.b_dtype), cs = dtype_size(p.c_dtype);
  for (int64_t i = 0; i < p.batch; ++i) {
    pack_a(p, static_cast<const char*>(a) + static_cast<size_t>(i * p.m * p.k) * as, la, mp, pa16);
    pack_b(p, static_cast<const char*>(b) + static_cast<size_t>(i * p.k * p.n) * bs, lb, np, pb16);
    const size_t at = static_cast<size_t>(i * p.m * p.n) * cs;
    multiply(p, la, pa16, pb16, mp, np, static_cast<char*>(c) + at,
             p.residual != nullptr ? static_cast<const char*>(p.residual) + at : nullptr, bias);
  }
}

}  // namespace demi::kernels::cpu::cpu_internal_amx

#pragma GCC diagnostic pop
