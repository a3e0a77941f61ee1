#include "demi/kernels/reference/transpose.h"

#include <cstring>
#include <vector>

namespace demi::kernels::ref {

void permute(const void* x, size_t elem_size, std::span<const int64_t> shape, std::span<const int> perm, void* y) {
  const size_t r = shape.size();
  std::vector<int64_t> in_stride(r, 1);
  for (size_t a = r; a-- > 1;) in_stride[a - 1] = in_stride[a] * shape[a];
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<int64_t> idx(r, 0);  // y's multi-index, odometer order (row-major over y)
  auto src = static_cast<const unsigned char*>(x);
  auto dst = static_cast<unsigned char*>(y);
  for (int64_t k = 0; k < n; ++k) {
    int64_t off = 0;
    for (size_t j = 0; j < r; ++j) off += idx[j] * in_stride[static_cast<size_t>(perm[j])];
    std::memcpy(dst + static_cast<size_t>(k) * elem_size, src + static_cast<size_t>(off) * elem_size, elem_size);
    for (size_t j = r; j-- > 0;) {
      if (++idx[j] < shape[static_cast<size_t>(perm[j])]) break;
      idx[j] = 0;
    }
  }
}

void copy_strided(const void* src, int64_t src_stride, void* dst, int64_t dst_stride, int64_t rows, int64_t run,
                  size_t elem_size) {
  auto s = static_cast<const unsigned char*>(src);
  auto d = static_cast<unsigned char*>(dst);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < run; ++i)
      std::memcpy(d + static_cast<size_t>(r * dst_stride + i) * elem_size,
                  s + static_cast<size_t>(r * src_stride + i) * elem_size, elem_size);
}

}  // namespace demi::kernels::ref
