#include "demi/kernels/cpu/f16_split.h"
#include "demi/kernels/cpu/internal/dispatch.h"

#include <algorithm>
#include <bit>

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/parallel.h"

namespace demi::kernels {
namespace {

// hi: the f32 value truncated to its top 16 bits; lo = x - hi (exact: at most 3 significant bits), 0 when
// hi is Inf or NaN (an f16 NaN widens to a quiet f32 NaN, whose truncation stays NaN).
inline void split_one(Half h, uint16_t* hi, uint16_t* lo) {
  const float x = static_cast<float>(h);
  const uint32_t hb = std::bit_cast<uint32_t>(x) & 0xffff0000u;
  const bool finite = (hb & 0x7f800000u) != 0x7f800000u;
  const float l = finite ? x - std::bit_cast<float>(hb) : 0.0f;
  *hi = static_cast<uint16_t>(hb >> 16);
  *lo = static_cast<uint16_t>(std::bit_cast<uint32_t>(l) >> 16);
}

void split_rows_scalar(const Half* src, int64_t r0, int64_t r1, int64_t cols, BFloat16* dst, int64_t row_stride,
                       int64_t seg_stride, unsigned lo_segments) {
  for (int64_t i = r0; i < r1; ++i) {
    const Half* s = src + i * cols;
    BFloat16* d = dst + i * row_stride;
    for (int64_t j = 0; j < cols; ++j) {
      uint16_t hi = 0, lo = 0;
      split_one(s[j], &hi, &lo);
      for (int seg = 0; seg < kSplitSegments; ++seg)
        d[seg * seg_stride + j] = BFloat16::from_bits((lo_segments >> seg) & 1u ? lo : hi);
    }
  }
}

const cpu_internal::F16SplitKernels& split_kernels() {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<F16SplitKernels> table{DEMI_KERNEL_TABLE_ENTRIES(f16_split)};
  return table.get();
}

}  // namespace

const cpu_internal::F16SplitKernels& cpu_internal::f16_split_kernels_scalar() {
  static const F16SplitKernels k{split_rows_scalar};
  return k;
}

void split_f16_bf16_reference(const Half* src, int64_t rows, int64_t cols, BFloat16* dst, int64_t row_stride,
                              int64_t seg_stride, unsigned lo_segments) {
  split_rows_scalar(src, 0, rows, cols, dst, row_stride, seg_stride, lo_segments);
}

void split_f16_bf16(const Half* src, int64_t rows, int64_t cols, BFloat16* dst, int64_t row_stride,
                    int64_t seg_stride, unsigned lo_segments) {
  DEMI_CHECK(rows >= 0 && cols >= 0 && row_stride >= 0 && seg_stride >= 0,
             "split_f16_bf16: negative size or stride (rows ", rows, ", cols ", cols, ", row stride ", row_stride,
             ", segment stride ", seg_stride, ")");
  if (rows == 0 || cols == 0) return;
  const auto rows_of = split_kernels().rows;
  // A task covers at least ~16K source values: below that a thread costs more than it saves.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / cols);
  parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    rows_of(src, r0, r1, cols, dst, row_stride, seg_stride, lo_segments);
  });
}

}  // namespace demi::kernels
