#include "demi/kernels/cpu/transpose.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "demi/core/error.h"
#include "demi/core/parallel.h"

namespace demi::kernels {
namespace {

// Bytes per parallel chunk: enough that a chunk outlasts the fork.
constexpr int64_t kGrainBytes = 1 << 17;

struct Collapsed {
  std::vector<int64_t> shape;  // the input's merged axes
  std::vector<int> perm;       // output axis j is merged input axis perm[j]
};

// Drops size-1 axes and merges input axes a, a+1 that appear consecutively in perm.
Collapsed collapse(std::span<const int64_t> shape, std::span<const int> perm) {
  const int r = static_cast<int>(shape.size());
  std::vector<int> kept;  // output order, input axis ids, size-1 axes removed
  for (int j = 0; j < r; ++j)
    if (shape[static_cast<size_t>(perm[static_cast<size_t>(j)])] != 1) kept.push_back(perm[static_cast<size_t>(j)]);
  // groups: runs of kept axes (in output order) that are consecutive input axes
  std::vector<std::vector<int>> groups;
  for (int a : kept) {
    if (!groups.empty()) {
      int last = groups.back().back();
      // consecutive in the input, skipping size-1 axes between them
      bool adjacent = a > last;
      for (int b = last + 1; adjacent && b < a; ++b) adjacent = shape[static_cast<size_t>(b)] == 1;
      if (adjacent) {
        groups.back().push_back(a);
        continue;
      }
    }
    groups.push_back({a});
  }
  // The merged input axes are the groups sorted by their first input axis.
  std::vector<size_t> order(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) order[g] = g;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return groups[a][0] < groups[b][0]; });
  std::vector<int> rank_of(groups.size());
  for (size_t i = 0; i < order.size(); ++i) rank_of[order[i]] = static_cast<int>(i);
  Collapsed c;
  c.shape.resize(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    int64_t n = 1;
    for (int a : groups[g]) n *= shape[static_cast<size_t>(a)];
    c.shape[static_cast<size_t>(rank_of[g])] = n;
    c.perm.push_back(rank_of[g]);
  }
  return c;
}

// `count` runs of kBytes from src to dst, src_step and dst_step bytes apart: a copy of a size known at
// compile time is a few vector moves, not a call (attention's head split: runs of 64 bf16 or f32).
template <size_t kBytes>
void copy_runs(unsigned char* dst, int64_t dst_step, const unsigned char* src, int64_t src_step, int64_t count) {
  for (int64_t i = 0; i < count; ++i, dst += dst_step, src += src_step) std::memcpy(dst, src, kBytes);
}
void copy_runs(unsigned char* dst, int64_t dst_step, const unsigned char* src, int64_t src_step, int64_t count,
               size_t bytes) {
  switch (bytes) {
    case 1: return copy_runs<1>(dst, dst_step, src, src_step, count);
    case 2: return copy_runs<2>(dst, dst_step, src, src_step, count);
    case 4: return copy_runs<4>(dst, dst_step, src, src_step, count);
    case 8: return copy_runs<8>(dst, dst_step, src, src_step, count);
    case 64: return copy_runs<64>(dst, dst_step, src, src_step, count);
    case 128: return copy_runs<128>(dst, dst_step, src, src_step, count);
    case 256: return copy_runs<256>(dst, dst_step, src, src_step, count);
    default:
      for (int64_t i = 0; i < count; ++i, dst += dst_step, src += src_step) std::memcpy(dst, src, bytes);
  }
}

}  // namespace

void permute(const void* x, size_t elem_size, std::span<const int64_t> shape, std::span<const int> perm, void* y) {
  DEMI_CHECK(shape.size() == perm.size(), "permute: ", perm.size(), " axes in the permutation for a rank-",
             shape.size(), " tensor");
  std::vector<bool> seen(shape.size(), false);
  for (int a : perm) {
    DEMI_CHECK(a >= 0 && static_cast<size_t>(a) < shape.size() && !seen[static_cast<size_t>(a)],
               "permute: the permutation must list every axis 0..", shape.size() - 1, " once, got axis ", a);
    seen[static_cast<size_t>(a)] = true;
  }
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (n == 0) return;
  const Collapsed c = collapse(shape, perm);
  const size_t r = c.shape.size();
  if (r <= 1) {  // the identity after merging: one copy
    std::memcpy(y, x, static_cast<size_t>(n) * elem_size);
    return;
  }
  std::vector<int64_t> in_stride(r, 1);
  for (size_t a = r; a-- > 1;) in_stride[a - 1] = in_stride[a] * c.shape[a];
  // Output axes and the input stride each walks.
  std::vector<int64_t> out_dim(r), stride(r);
  for (size_t j = 0; j < r; ++j) {
    out_dim[j] = c.shape[static_cast<size_t>(c.perm[j])];
    stride[j] = in_stride[static_cast<size_t>(c.perm[j])];
  }
  // With the innermost axis in place, each output run of out_dim[r-1] elements is contiguous in x.
  const bool runs = c.perm[r - 1] == static_cast<int>(r - 1);
  const int64_t run = runs ? out_dim[r - 1] : 1;
  const size_t axes = runs ? r - 1 : r;  // the axes the odometer walks
  const int64_t units = n / run;
  const size_t run_bytes = static_cast<size_t>(run) * elem_size;
  auto src = static_cast<const unsigned char*>(x);
  auto dst = static_cast<unsigned char*>(y);
  const int64_t grain = std::max<int64_t>(1, kGrainBytes / static_cast<int64_t>(run_bytes));
  // Each thread walks its output units along the innermost walked axis in one loop (a run, or an element,
  // per unit, `stride` input elements apart), then carries into the outer axes. A memcpy call per unit, of
  // a size known only at run time, and the carry after every unit made model D's bf16 head split (runs of
  // 128 bytes), and the merge, clearly slower than this (pointwise_bench's permute_* rows measure both).
  const size_t last = axes - 1;  // (r >= 2 here, so at least one axis is walked)
  parallel_for(0, units, grain, [&](int64_t u0, int64_t u1) {
    std::vector<int64_t> idx(axes);
    int64_t rest = u0, off = 0;
    for (size_t j = axes; j-- > 0;) {
      idx[j] = rest % out_dim[j];
      rest /= out_dim[j];
      off += idx[j] * stride[j];
    }
    const int64_t step = stride[last];
    for (int64_t u = u0; u < u1;) {
      const int64_t count = std::min(out_dim[last] - idx[last], u1 - u);
      copy_runs(dst + static_cast<size_t>(u) * run_bytes, static_cast<int64_t>(run_bytes),
                src + static_cast<size_t>(off) * elem_size, step * static_cast<int64_t>(elem_size), count, run_bytes);
      u += count;
      off += count * step;
      idx[last] += count;
      if (idx[last] < out_dim[last]) continue;
      off -= idx[last] * step;
      idx[last] = 0;
      for (size_t j = last; j-- > 0;) {
        off += stride[j];
        if (++idx[j] < out_dim[j]) break;
        off -= idx[j] * stride[j];
        idx[j] = 0;
      }
    }
  });
}

void copy_strided(const void* src, int64_t src_stride, void* dst, int64_t dst_stride, int64_t rows, int64_t run,
                  size_t elem_size) {
  DEMI_CHECK(rows >= 0 && run >= 0, "copy_strided: negative size (", rows, " rows of ", run, ")");
  if (rows == 0 || run == 0) return;
  auto s = static_cast<const unsigned char*>(src);
  auto d = static_cast<unsigned char*>(dst);
  const size_t run_bytes = static_cast<size_t>(run) * elem_size;
  const int64_t grain = std::max<int64_t>(1, kGrainBytes / static_cast<int64_t>(run_bytes));
  const int64_t es = static_cast<int64_t>(elem_size);
  // Fewer rows than threads, each long (attention's q, k and v gradients joined: one row of 2 MiB per
  // part): the rows' bytes are split into chunks across the threads.
  const int64_t chunks = (static_cast<int64_t>(run_bytes) + kGrainBytes - 1) / kGrainBytes;
  if (rows < num_threads() && chunks > 1) {
    parallel_for(0, rows * chunks, 1, [&](int64_t u0, int64_t u1) {
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t r = u / chunks, at = u % chunks * kGrainBytes;
        const size_t n = static_cast<size_t>(std::min(kGrainBytes, static_cast<int64_t>(run_bytes) - at));
        std::memcpy(d + static_cast<size_t>(r * dst_stride * es + at),
                    s + static_cast<size_t>(r * src_stride * es + at), n);
      }
    });
    return;
  }
  parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    copy_runs(d + static_cast<size_t>(r0 * dst_stride * es), dst_stride * es,
              s + static_cast<size_t>(r0 * src_stride * es), src_stride * es, r1 - r0, run_bytes);
  });
}

}  // namespace demi::kernels
