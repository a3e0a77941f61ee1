#include "demi/kernels/cpu/amp_kernels.h"

#include <vector>

#include "demi/core/cpu.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/amp_kernels_impl.h"
#include "demi/kernels/cpu/internal/vec_scalar.h"
#include "demi/kernels/cpu/internal/workspace.h"

namespace demi::kernels {
namespace cpu_internal {

const AmpKernels& amp_kernels_scalar() {
  static const AmpKernels k = make_amp_kernels<VecScalar>();
  return k;
}

}  // namespace cpu_internal

namespace {

using cpu_internal::AmpBlock;
using cpu_internal::Workspace;

const cpu_internal::AmpKernels& kernels() {
  using namespace cpu_internal;  // the registry names the getters unqualified
  static const KernelTable<AmpKernels> table{DEMI_KERNEL_TABLE_ENTRIES(amp)};
  return table.get();
}

int64_t count_blocks(std::span<const GradBuffer> bufs) {
  int64_t count = 0;
  for (const auto& b : bufs) count += (b.n + kAmpBlock - 1) / kAmpBlock;
  return count;
}

// Cuts the buffers into blocks of at most kAmpBlock elements; owner[k] is block k's buffer.
void make_blocks(std::span<const GradBuffer> bufs, AmpBlock* blocks, int64_t* owner) {
  int64_t k = 0;
  for (size_t b = 0; b < bufs.size(); ++b) {
    char* data = static_cast<char*>(bufs[b].data);
    const size_t size = dtype_size(bufs[b].dtype);
    const int64_t n = bufs[b].n;
    for (int64_t i = 0; i < n; i += kAmpBlock, ++k) {
      blocks[k] = {data + static_cast<size_t>(i) * size, n - i < kAmpBlock ? n - i : kAmpBlock, bufs[b].dtype};
      owner[k] = static_cast<int64_t>(b);
    }
  }
}

// The block list (tracked scratch memory): blocks, their owners, and a result slot per block.
template <typename Result>
struct BlockList {
  explicit BlockList(std::span<const GradBuffer> bufs)
      : count(count_blocks(bufs)),
        ws(static_cast<size_t>(count) * (sizeof(AmpBlock) + sizeof(int64_t) + sizeof(Result))) {
    blocks = reinterpret_cast<AmpBlock*>(ws.f32());
    owner = reinterpret_cast<int64_t*>(blocks + count);
    result = reinterpret_cast<Result*>(owner + count);
    make_blocks(bufs, blocks, owner);
  }
  int64_t count;
  Workspace ws;
  AmpBlock* blocks = nullptr;
  int64_t* owner = nullptr;
  Result* result = nullptr;
};

}  // namespace

UnscaleResult unscale_and_check_finite(std::span<const GradBuffer> grads, float inv_scale) {
  BlockList<uint8_t> list(grads);
  kernels().unscale(list.blocks, list.count, inv_scale, inv_scale != 1.0f, list.result);
  UnscaleResult r;
  for (int64_t k = 0; k < list.count; ++k)
    if (list.result[k]) {
      r.all_finite = false;
      r.first_nonfinite = list.owner[k];
      break;
    }
  return r;
}

float sum_of_squares_then_scale(std::span<const GradBuffer> bufs,
                                const std::function<float(const double* per_buffer)>& coef) {
  BlockList<float> list(bufs);  // a float result slot per block: room for unscale's byte flags too
  kernels().sum_squares(list.blocks, list.count, list.result);
  std::vector<double> per(bufs.size(), 0.0);
  for (int64_t k = 0; k < list.count; ++k) per[static_cast<size_t>(list.owner[k])] += list.result[k];
  const float c = coef(per.data());
  if (c != 1.0f) kernels().unscale(list.blocks, list.count, c, true, reinterpret_cast<uint8_t*>(list.result));
  return c;
}

double sum_of_squares(std::span<const GradBuffer> bufs, double* per_buffer) {
  BlockList<float> list(bufs);
  kernels().sum_squares(list.blocks, list.count, list.result);
  if (per_buffer)
    for (size_t b = 0; b < bufs.size(); ++b) per_buffer[b] = 0.0;
  double total = 0.0;
  for (int64_t k = 0; k < list.count; ++k) {
    total += list.result[k];
    if (per_buffer) per_buffer[list.owner[k]] += list.result[k];
  }
  return total;
}

}  // namespace demi::kernels
