#include "demi/kernels/onednn/primitive_cache.h"

namespace demi::kernels::onednn {
namespace {
std::atomic<int64_t> g_entries{0};
std::atomic<int64_t> g_hits{0};
}  // namespace

PrimitiveCacheStats primitive_cache_stats() {
  return {g_entries.load(std::memory_order_relaxed), g_hits.load(std::memory_order_relaxed)};
}

namespace internal {
void count_cache_entry() { g_entries.fetch_add(1, std::memory_order_relaxed); }
void count_cache_hit() { g_hits.fetch_add(1, std::memory_order_relaxed); }
}  // namespace internal

}  // namespace demi::kernels::onednn
