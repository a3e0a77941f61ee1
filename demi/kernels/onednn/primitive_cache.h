// The cache of oneDNN primitives. Creating a primitive (and its primitive_desc) JIT-compiles code and
// costs from tens of microseconds to milliseconds, so every kernel in this folder creates each one once
// per (shape, dtypes, flags) and finds it again by a small POD key: a fixed array of int64 fields.
// Lookups are thread-safe; entries are immutable once made, and oneDNN primitives may execute from
// several threads at once because every call brings its own (user-managed) scratchpad.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace demi::kernels::onednn {

// Counters over every primitive cache, for tests and benchmarks ("was anything re-created per call?").
struct PrimitiveCacheStats {
  int64_t entries = 0;  // cache entries created so far (each holds a primitive and its reorders)
  int64_t hits = 0;     // lookups that found an entry
};
PrimitiveCacheStats primitive_cache_stats();

namespace internal {

void count_cache_entry();
void count_cache_hit();

template <size_t N>
struct PrimitiveKey {
  std::array<int64_t, N> v{};
  bool operator==(const PrimitiveKey&) const = default;
};

template <size_t N>
struct PrimitiveKeyHash {
  size_t operator()(const PrimitiveKey<N>& k) const {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int64_t x : k.v) {  // splitmix64 finaliser over a running combination
      uint64_t z = h ^ (static_cast<uint64_t>(x) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      h = z ^ (z >> 31);
    }
    return static_cast<size_t>(h);
  }
};

template <size_t N, typename Entry>
class PrimitiveCache {
 public:
  using Key = PrimitiveKey<N>;

  // The entry for `key`, made by make() (which returns an Entry) the first time. make() runs outside the
  // lock, so a slow JIT does not block lookups of other shapes; if two threads race on one key, one entry
  // wins and the other is dropped.
  template <typename Make>
  std::shared_ptr<const Entry> get(const Key& key, Make&& make) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(key);
      if (it != map_.end()) {
        count_cache_hit();
        return it->second;
      }
    }
    auto made = std::make_shared<const Entry>(make());
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, inserted] = map_.emplace(key, std::move(made));
    if (inserted) count_cache_entry();
    return it->second;
  }

 private:
  std::mutex mu_;
  std::unordered_map<Key, std::shared_ptr<const Entry>, PrimitiveKeyHash<N>> map_;
};

}  // namespace internal
}  // namespace demi::kernels::onednn
