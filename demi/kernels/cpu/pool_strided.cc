// Pooling straight from a convolution's layout (pool.h): the portable loops, and the dispatch to the
// AVX-512 bodies (pool_strided_avx512.cc) for channel-contiguous layouts.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/half.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/checks.h"
#include "demi/kernels/cpu/internal/common_impl.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/pool_strided_kernels.h"
#include "demi/kernels/cpu/internal/vec_scalar.h"
#include "demi/kernels/cpu/pool.h"

namespace demi::kernels::cpu_internal {

const PoolStridedKernels& pool_strided_kernels_scalar() {
  static const PoolStridedKernels k;  // no body of its own: the portable loops
  return k;
}

}  // namespace demi::kernels::cpu_internal

namespace demi::kernels {
namespace {

using cpu_internal::VecScalar;
using cpu_internal::is_fast_float;
using cpu_internal::visit_float;

// The reference's window rule (reference/pool.cc): the first maximum wins a tie, a NaN wins over numbers;
// then ReLU: kArgmaxNone where the maximum is not > 0, the value clamped at 0 from below.
template <typename TX, typename TY>
void forward_rows_scalar(const Pool2dParams& p, const TX* x, const StridedLayout4& xl, TY* y, uint8_t* argmax,
                         int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / p.oh, oy = r % p.oh;
    for (int64_t c = 0; c < p.c; ++c) {
      for (int64_t ox = 0; ox < p.ow; ++ox) {
        float best = 0;
        int64_t best_at = -1;
        for (int64_t dh = 0; dh < p.kh; ++dh)
          for (int64_t dw = 0; dw < p.kw; ++dw) {
            const float v = static_cast<float>(x[xl.offset(n, c, oy * p.sh + dh, ox * p.sw + dw)]);
            if (best_at < 0 || v > best || (std::isnan(v) && !std::isnan(best))) {
              best = v;
              best_at = dh * p.kw + dw;
            }
          }
        uint8_t idx = static_cast<uint8_t>(best_at);
        if (!(best > 0)) {
          if (best < 0) best = 0;
          idx = kArgmaxNone;
        }
        const int64_t o = ((n * p.c + c) * p.oh + oy) * p.ow + ox;
        y[o] = TY(best);
        if (argmax) argmax[o] = idx;
      }
    }
  }
}

template <typename TDY, typename TDX>
void backward_rows_scalar(const Pool2dParams& p, const TDY* dy, const uint8_t* argmax, TDX* dx,
                          const StridedLayout4& dxl, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / p.oh, oy = r % p.oh;
    for (int64_t c = 0; c < p.c; ++c)
      for (int64_t ox = 0; ox < p.ow; ++ox) {
        const int64_t o = ((n * p.c + c) * p.oh + oy) * p.ow + ox;
        const uint8_t a = argmax[o];
        if (a == kArgmaxNone) continue;
        dx[dxl.offset(n, c, oy * p.sh + a / p.kw, ox * p.sw + a % p.kw)] = TDX(static_cast<float>(dy[o]));
      }
  }
}

const cpu_internal::PoolStridedKernels& strided_kernels() {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<PoolStridedKernels> table{DEMI_KERNEL_TABLE_ENTRIES(pool_strided)};
  return table.get();
}

// Channels contiguous in blocks of 16 (NHWC, nChw16c), and a level with bodies for them.
bool vector_layout(const StridedLayout4& l, int64_t channels) {
  return l.sc == 1 && l.cb % 16 == 0 && channels % 16 == 0 && strided_kernels().relu_max_pool_rows != nullptr;
}

// A task covers at least ~4K outputs.
int64_t row_grain(const Pool2dParams& p) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(1, p.c * p.ow)); }

}  // namespace

bool strided_pool_supported(const Pool2dParams& p) {
  return p.non_overlapping() && p.pad_top == 0 && p.pad_left == 0 && p.pad_bottom == 0 && p.pad_right == 0 &&
         p.oh >= 1 && p.ow >= 1 && p.kh * p.kw <= kMaxPoolWindowMax && (p.oh - 1) * p.sh + p.kh <= p.h &&
         (p.ow - 1) * p.sw + p.kw <= p.w;
}

void relu_max_pool2d_forward_strided(const Pool2dParams& p, DType x_dtype, const void* x, const StridedLayout4& xl,
                                     DType y_dtype, void* y, uint8_t* argmax) {
  DEMI_CHECK(strided_pool_supported(p), "relu_max_pool2d (strided): windows must not overlap nor reach padding, got ",
             describe(p));
  DEMI_CHECK(x_dtype == DType::kF32 || x_dtype == DType::kBF16, "relu_max_pool2d (strided): x must be float32 or ",
             "bfloat16, got ", dtype_name(x_dtype));
  DEMI_CHECK(is_fast_float(y_dtype), "relu_max_pool2d (strided): y must be float32, bfloat16 or float16, got ",
             dtype_name(y_dtype));
  const int64_t rows = p.n * p.oh;
  if (vector_layout(xl, p.c)) {
    parallel_for(0, rows, row_grain(p), [&](int64_t r0, int64_t r1) {
      strided_kernels().relu_max_pool_rows(p, x_dtype, x, xl, y_dtype, y, argmax, r0, r1);
    });
    return;
  }
  visit_float<VecScalar>(x_dtype, [&](auto tx) {
    visit_float<VecScalar>(y_dtype, [&](auto ty) {
      using TX = decltype(tx);
      using TY = decltype(ty);
      parallel_for(0, rows, row_grain(p), [&](int64_t r0, int64_t r1) {
        forward_rows_scalar(p, static_cast<const TX*>(x), xl, static_cast<TY*>(y), argmax, r0, r1);
      });
    });
  });
}

void max_pool2d_backward_strided(const Pool2dParams& p, DType dy_dtype, const void* dy, const uint8_t* argmax,
                                 DType dx_dtype, void* dx, const StridedLayout4& dxl, int64_t dx_bytes) {
  DEMI_CHECK(strided_pool_supported(p), "max_pool2d backward (strided): windows must not overlap nor reach ",
             "padding, got ", describe(p));
  DEMI_CHECK(dx_dtype == DType::kF32 || dx_dtype == DType::kBF16, "max_pool2d backward (strided): dx must be ",
             "float32 or bfloat16, got ", dtype_name(dx_dtype));
  DEMI_CHECK(is_fast_float(dy_dtype), "max_pool2d backward (strided): dy must be float32, bfloat16 or float16, got ",
             dtype_name(dy_dtype));
  const int64_t rows = p.n * p.oh;
  const bool vec = vector_layout(dxl, p.c);
  // The windows tile dx exactly: no stride gaps, no uncovered tail rows or columns, no padding in the buffer.
  const bool tiles = vec && p.sh == p.kh && p.sw == p.kw && p.oh * p.kh == p.h && p.ow * p.kw == p.w &&
                     dx_bytes == p.x_numel() * static_cast<int64_t>(dtype_size(dx_dtype));
  if (!tiles) std::memset(dx, 0, static_cast<size_t>(dx_bytes));
  parallel_for(0, rows, row_grain(p), [&](int64_t r0, int64_t r1) {
    if (vec) return strided_kernels().max_pool_backward_rows(p, dy_dtype, dy, argmax, dx_dtype, dx, dxl, tiles, r0, r1);
    visit_float<VecScalar>(dy_dtype, [&](auto tdy) {
      visit_float<VecScalar>(dx_dtype, [&](auto tdx) {
        using TDY = decltype(tdy);
        using TDX = decltype(tdx);
        backward_rows_scalar(p, static_cast<const TDY*>(dy), argmax, static_cast<TDX*>(dx), dxl, r0, r1);
      });
    });
  });
}

}  // namespace demi::kernels
