#include "demi/kernels/onednn/dense.h"

#include <algorithm>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/parallel.h"
#include "demi/kernels/matmul_params.h"
#include "demi/kernels/onednn/matmul.h"
#include "demi/kernels/reference/matmul.h"

namespace demi::kernels::onednn {

void dense_forward(const DenseParams& p, const void* x, const void* w, const void* bias, void* y) {
  MatmulParams mp;
  mp.m = p.m;
  mp.n = p.n;
  mp.k = p.k;
  mp.trans_b = true;
  mp.a_dtype = p.x_dtype;
  mp.b_dtype = p.w_dtype;
  mp.c_dtype = p.y_dtype;
  mp.bias = bias;
  mp.bias_dtype = p.bias_dtype;
  mp.relu = p.relu;
  matmul(mp, x, w, y);
}

void dense_backward_data(const DenseParams& p, const void* dy, const void* w, void* dx) {
  MatmulParams mp;
  mp.m = p.m;
  mp.n = p.k;
  mp.k = p.n;
  mp.a_dtype = p.y_dtype;
  mp.b_dtype = p.w_dtype;
  mp.c_dtype = p.x_dtype;
  mp.accumulate = p.accumulate;
  matmul(mp, dy, w, dx);
}

void dense_backward_weights(const DenseParams& p, const void* x, const void* dy, void* dw, void* db) {
  MatmulParams mp;
  mp.m = p.n;
  mp.n = p.k;
  mp.k = p.m;
  mp.trans_a = true;  // dy stored (M, N), read as dy^T (N, M)
  mp.a_dtype = p.y_dtype;
  mp.b_dtype = p.x_dtype;
  mp.c_dtype = p.w_dtype;
  mp.accumulate = p.accumulate;
  matmul(mp, dy, x, dw);
  if (db) bias_grad(dy, p.y_dtype, p.m, p.n, db, p.bias_dtype, p.accumulate);
}

namespace {

constexpr int64_t kColBlock = 256;  // columns per task: a 1 KiB f32 accumulator, whole cache lines of dy

template <typename T>
void store(const float* acc, T* dst, int64_t n, bool accumulate) {
  for (int64_t j = 0; j < n; ++j) {
    float v = acc[j];
    if (accumulate) v += static_cast<float>(dst[j]);
    dst[j] = T(v);
  }
}

}  // namespace

void bias_grad(const void* dy, DType dy_dtype, int64_t rows, int64_t cols, void* db, DType db_dtype,
               bool accumulate) {
  DEMI_CHECK(rows >= 1 && cols >= 1, "bias_grad: sizes must be positive, got dy(", rows, ", ", cols, ")");
  auto low_or_f32 = [](DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; };
  if (dy_dtype == DType::kF64 || db_dtype == DType::kF64) {
    return ref::bias_grad(dy, dy_dtype, rows, cols, db, db_dtype, accumulate);
  }
  DEMI_CHECK(low_or_f32(dy_dtype) && low_or_f32(db_dtype),
             "bias_grad: expected float32, bfloat16 or float16 ", "for dy and db, got dy ",
             dtype_name(dy_dtype), ", db ", dtype_name(db_dtype));
  const int64_t blocks = (cols + kColBlock - 1) / kColBlock;
  const size_t esize = dtype_size(dy_dtype);
  const demi::internal::ConvertKernels& cvt = demi::internal::convert_kernels(cpu_level());
  // A block is worth a thread when it covers enough elements; grain counts blocks.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / (rows * kColBlock));
  parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    alignas(64) float acc[kColBlock];
    alignas(64) float row[kColBlock];
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t j0 = blk * kColBlock, width = std::min(kColBlock, cols - j0);
      std::fill(acc, acc + width, 0.0f);
      for (int64_t i = 0; i < rows; ++i) {
        const void* src = static_cast<const char*>(dy) + (i * cols + j0) * static_cast<int64_t>(esize);
        const float* r = static_cast<const float*>(src);
        if (dy_dtype == DType::kBF16) {
          cvt.bf16_to_f32(static_cast<const BFloat16*>(src), row, width);
          r = row;
        } else if (dy_dtype == DType::kF16) {
          cvt.f16_to_f32(static_cast<const Half*>(src), row, width);
          r = row;
        }
        for (int64_t j = 0; j < width; ++j) acc[j] += r[j];
      }
      switch (db_dtype) {
        case DType::kF32: store(acc, static_cast<float*>(db) + j0, width, accumulate); break;
        case DType::kBF16: store(acc, static_cast<BFloat16*>(db) + j0, width, accumulate); break;
        default: store(acc, static_cast<Half*>(db) + j0, width, accumulate); break;
      }
    }
  });
}

}  // namespace demi::kernels::onednn
