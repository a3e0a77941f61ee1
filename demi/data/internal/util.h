// Small helpers shared by the data module: seed mixing for counter-based randomness, row views into
// a shared buffer, overflow-checked arithmetic for untrusted file headers, and row descriptions for
// error messages.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "demi/core/tensor.h"

namespace demi::data::internal {

// SplitMix64's finalizer: a bijection on 64 bits that scatters nearby inputs (epoch 0, 1, 2...) far
// apart, so the Philox keys derived from them share no structure.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The generator key for one random decision: the op's seed, a salt naming the op kind (so a shuffle and
// a crop with the same seed draw unrelated numbers), the epoch and the row. Every random draw in the
// pipeline comes from such a key, never from a stream shared across rows, which is what makes results
// independent of thread count and of prefetching.
inline uint64_t mix_seed(uint64_t seed, uint64_t salt, uint64_t epoch, uint64_t row = 0) {
  uint64_t h = splitmix64(seed ^ splitmix64(salt));
  h = splitmix64(h ^ epoch);
  return splitmix64(h ^ (row * 0xD1B54A32D192ED03ull));
}

// Salts for mix_seed, one per kind of random op.
inline constexpr uint64_t kSaltShuffle = 0x5348554646ull;  // "SHUFF"
inline constexpr uint64_t kSaltMap = 0x4D4150ull;          // "MAP"
inline constexpr uint64_t kSaltSynthetic = 0x5345454Dull;  // "SEEM"

// Row `index` of `t` (first dimension), as a view sharing t's storage, reshaped to `row_shape` (which
// must hold exactly the elements of one row). No copy: readers hand out views of their one buffer.
inline Tensor row_view(const Tensor& t, int64_t index, const Shape& row_shape) {
  const TensorImpl& src = t.impl();
  int64_t per_row = t.dim(0) == 0 ? 0 : t.numel() / t.dim(0);
  DEMI_ASSERT(index >= 0 && index < t.dim(0), "row ", index, " of ", t.describe());
  DEMI_ASSERT(row_shape.numel() == per_row, "row shape ", row_shape, " for ", t.describe());
  auto v = std::make_shared<TensorImpl>();
  v->storage = src.storage;
  v->offset = src.offset + index * per_row;
  v->shape = row_shape;
  v->dtype = src.dtype;
  return Tensor(std::move(v));
}

// The shape of one row of `t`: t's shape without its first dimension.
inline Shape row_shape_of(const Tensor& t) {
  Shape s;
  for (int i = 1; i < t.rank(); ++i) s.push_back(t.dim(i));
  return s;
}

// a * b, or nullopt when the product of these untrusted sizes overflows 64 bits.
inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// "float32 (3, 32, 32)", for messages comparing a row's column with the expected one.
inline std::string signature(const Tensor& t) {
  return str_cat(dtype_name(t.dtype()), " ", t.shape().to_string());
}

// "image, label".
inline std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s;
}

}  // namespace demi::data::internal
